//! The build as separate steps, for engines that run them on other machines (the Ray engine):
//! `begin` (driver) -> `stage1` per group of input files (any node) -> `plan_chunks` (driver)
//! -> `stage2` per range of chunks (any node) -> `finish` (driver).
//!
//! Each step is the one-machine builder's own code (`build.rs`, `stage1.rs`) cut at the points
//! where its output is on storage: a file's spill and summary, the chunk plan (`chunks.json` in
//! the work folder), a shard. Every step writes through a temporary name and a rename and is a
//! pure function of the recipe, so a step run twice, or on another machine, writes the same
//! bytes, and a cache built this way is byte-identical to `build::build`'s.
//!
//! Interim: the architecture refactor (issue 11) provides these steps in `build/`; this module
//! is to be replaced by them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::build::{self, Manifest, ShardSpec, Spills, DEFAULT_CELL_CONTEXTS, FILE_BITS, POS_BITS};
use crate::error::{Error, Result};
use crate::lock::BuildLock;
use crate::meta::{self, BuildOptions, FileSummary, ManifestLine, Recipe, Tail};
use crate::resume::{self, Start, META_NAME};
use crate::stage1::{self, Schedule, Stage1Config};
use crate::stream;
use crate::testhook;
use crate::tokenizer::Tokenizer;

const CHUNK_PLAN: &str = "chunks.json";

/// What every step of one build needs: the recipe and the loaded tokenizer. Loading it has no
/// side effect, so each process (driver or task worker) makes its own.
pub struct Steps {
    opts: BuildOptions,
    recipe: Recipe,
    work: PathBuf,
    cfg: Arc<Stage1Config>,
}

/// The chunk plan: everything stage 2 needs, written once by the driver.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChunkPlan {
    /// Contexts per file (the stitched tails last, when stitched).
    pub counts: Vec<u64>,
    /// Stitched tails' contexts (streaming order puts them after the round robin).
    pub stitched: Option<u64>,
    pub cells: u64,
    /// Contexts per cell (shuffled builds only).
    pub cell_sizes: Vec<u64>,
    pub chunk_sizes: Vec<u64>,
    /// (file, position, padding ids) of padded contexts.
    pub padded: Vec<(usize, u64, u32)>,
    /// tokshuf.json's figures, for `finish`.
    pub stats: Value,
}

/// The driver's state between `begin` and `finish`.
pub struct Driver {
    lock: Option<BuildLock>,
    manifest: Manifest,
    /// Chunks a killed run listed (their shards are in place): no task needs to touch them.
    pub listed: u64,
}

pub enum Begun {
    Complete(Value),
    Started(Driver),
}

/// The tokenizer of `opts`, loaded once per process: a worker runs many tasks of one build
/// (and of the next), and loading takes 0.1-0.3 s. Keyed by the spec's file size and mtime too,
/// so a tokenizer file replaced in place is loaded again.
fn load_tokenizer(opts: &BuildOptions) -> Result<Tokenizer> {
    static LOADED: Mutex<Vec<(String, Tokenizer)>> = Mutex::new(Vec::new());
    let stamp = std::fs::metadata(&opts.tokenizer).ok().map(|m| (m.len(), m.modified().ok()));
    let key = format!("{}\0{}\0{:?}\0{:?}", opts.tokenizer, opts.allow_special_tokens, opts.tokenizer_backend, stamp);
    if let Some(tok) = LOADED.lock().ok().and_then(|l| l.iter().find(|(k, _)| *k == key).map(|(_, t)| t.clone())) {
        return Ok(tok);
    }
    let tok = Tokenizer::load(&opts.tokenizer, opts.allow_special_tokens, opts.tokenizer_backend)?;
    if let Ok(mut loaded) = LOADED.lock() {
        if loaded.len() >= 4 {
            loaded.remove(0);
        }
        loaded.push((key, tok.clone()));
    }
    Ok(tok)
}

impl Steps {
    pub fn open(opts: BuildOptions) -> Result<Steps> {
        let tok = load_tokenizer(&opts)?;
        let recipe = build::make_recipe(&opts, &tok)?;
        let work = resume::work_dir(&opts.output, opts.local_cell_dir.as_deref())?;
        let cfg = Arc::new(Stage1Config {
            encoder: tok.encoder.clone(),
            text_key: opts.text_key.clone(),
            bos_id: recipe.bos_id,
            eot_id: recipe.eot_id,
            pad_id: recipe.pad_id,
            seqlen: recipe.seqlen as usize,
            dtype: recipe.dtype,
            tail: recipe.tail,
            errors: recipe.errors,
        });
        Ok(Steps { opts, recipe, work, cfg })
    }

    pub fn work(&self) -> &Path {
        &self.work
    }
    pub fn input_sizes(&self) -> Vec<u64> {
        self.recipe.inputs.iter().map(|f| f.bytes).collect()
    }
    /// Input files whose stage 1 a killed run finished.
    pub fn files_done(&self) -> Vec<usize> {
        (0..self.recipe.inputs.len()).filter(|&f| stage1::summary_path(&self.work, f).exists()).collect()
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.recipe.inputs.iter().map(|f| PathBuf::from(&f.path)).collect()
    }
    fn pool(threads: usize) -> Result<Arc<rayon::ThreadPool>> {
        let threads = threads.max(1);
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tokshuf-{i}"))
            .build()
            .map(Arc::new)
            .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))
    }
    fn write_meta(&self, status: &str, stats: Value, build: &Value) -> Result<Value> {
        build::write_meta(&self.opts.output, &self.recipe, status, stats, build)
    }

    /// Driver: take the build lock, decide start / resume / complete as `build::build` does,
    /// and publish the first tokshuf.json.
    pub fn begin(&self, build_info: &Value) -> Result<Begun> {
        testhook::init();
        let out = &self.opts.output;
        let lock = BuildLock::acquire(out)?;
        let start = match resume::prepare(out, &self.work, &self.recipe, self.opts.overwrite) {
            Ok(s) => s,
            Err(e) => {
                if lock.created {
                    let _ = lock.remove();
                }
                return Err(e);
            }
        };
        if let Start::Complete(meta) = start {
            lock.remove()?;
            return Ok(Begun::Complete(meta));
        }
        resume::init_work(&self.work, &self.recipe)?;
        if !out.join(META_NAME).exists() {
            if self.recipe.shuffle {
                self.write_meta("building", json!({}), build_info)?;
            } else {
                self.write_meta("streaming", json!({ "num_chunks_ready": 0 }), build_info)?;
            }
        }
        testhook::point("start");
        let manifest = Manifest::open(out, matches!(start, Start::Fresh))?;
        let listed = manifest.lines.len() as u64;
        Ok(Begun::Started(Driver { lock: Some(lock), manifest, listed }))
    }

    /// Any node: stage 1 of `files` (those a killed run finished are skipped) on `threads`
    /// threads. Returns their summaries, in the order given.
    pub fn stage1(&self, files: &[usize], threads: usize, cancel: &Arc<AtomicBool>) -> Result<Vec<FileSummary>> {
        testhook::init();
        let todo: Vec<usize> = files.iter().copied().filter(|&f| !stage1::summary_path(&self.work, f).exists()).collect();
        let pool = Self::pool(threads)?;
        let schedule = Schedule { window: 1, notify_every: 0, batch_bytes: stage1::BATCH_BYTES };
        stage1::run(&self.cfg, &self.paths(), &todo, &self.work, &pool, cancel, schedule, |_| Ok(()))?;
        files.iter().map(|&f| meta::read_json(&stage1::summary_path(&self.work, f))).collect()
    }

    /// Driver, after every file's stage 1: stitch the tails, plan the chunks (`chunks.json`)
    /// and publish them in tokshuf.json ("writing"). Returns the number of chunks.
    pub fn plan_chunks(&self, threads: usize, build_info: &Value) -> Result<u64> {
        let recipe = &self.recipe;
        let n = recipe.inputs.len();
        let mut summaries: Vec<FileSummary> =
            (0..n).map(|f| meta::read_json(&stage1::summary_path(&self.work, f))).collect::<Result<_>>()?;
        let stitched = if recipe.tail == Tail::Stitch {
            let path = stage1::summary_path(&self.work, n);
            Some(if path.exists() {
                meta::read_json(&path)?
            } else {
                let ids: Vec<u32> = summaries.iter().flat_map(|s| s.tail.iter().copied()).collect();
                let s = stage1::write_stitched(&self.cfg, &self.work, n, &ids)?;
                testhook::point("stage1.stitched");
                s
            })
        } else {
            None
        };
        let stitched_n = stitched.as_ref().map(|s| s.num_contexts);
        summaries.extend(stitched);
        let counts: Vec<u64> = summaries.iter().map(|s| s.num_contexts).collect();
        if counts.len() >= 1 << FILE_BITS || counts.iter().any(|&c| c >= 1 << POS_BITS) {
            return Err(Error::Config("too many input files or contexts in one file".into()));
        }
        let cs = recipe.chunk_size as u64;
        let total: u64 = counts.iter().sum();
        let (cells, cell_sizes, chunk_sizes, stats) = if recipe.shuffle {
            let cells = self.opts.num_local_cells.unwrap_or_else(|| total.div_ceil(DEFAULT_CELL_CONTEXTS)).max(1);
            let pool = Self::pool(threads)?;
            let sizes = build::cell_sizes(&pool, recipe.seed, &counts, cells);
            let chunk_sizes: Vec<u64> = (0..total.div_ceil(cs)).map(|k| cs.min(total - k * cs)).collect();
            let stats = build::totals(&summaries, recipe, &chunk_sizes, Some(cells));
            (cells, sizes, chunk_sizes, stats)
        } else {
            let real = &counts[..n];
            let chunk_sizes: Vec<u64> = stream::plan(real, stitched_n, cs).iter().map(|p| p.len).collect();
            let stats = build::totals(&summaries, recipe, &chunk_sizes, None);
            (0, Vec::new(), chunk_sizes, stats)
        };
        let padded = summaries.iter().enumerate().flat_map(|(f, s)| s.padded.iter().map(move |&(p, k)| (f, p, k))).collect();
        let plan = ChunkPlan { counts, stitched: stitched_n, cells, cell_sizes, chunk_sizes, padded, stats };
        meta::write_atomic(&self.work.join(CHUNK_PLAN), &meta::to_json_bytes(&plan))?;
        let status = meta::read_json::<Value>(&self.opts.output.join(META_NAME)).ok();
        if status.as_ref().and_then(|m| m.get("status")).and_then(Value::as_str) != Some("writing") {
            self.write_meta("writing", plan.stats.clone(), build_info)?;
        }
        testhook::point("plan");
        Ok(plan.chunk_sizes.len() as u64)
    }

    pub fn chunk_plan(&self) -> Result<ChunkPlan> {
        meta::read_json(&self.work.join(CHUNK_PLAN))
    }

    /// Any node: write chunks `first..last` (a shard already in place is only hashed).
    /// Returns their manifest lines, in chunk order.
    pub fn stage2(&self, plan: &ChunkPlan, first: u64, last: u64, threads: usize, cancel: &Arc<AtomicBool>) -> Result<Vec<ManifestLine>> {
        testhook::init();
        let recipe = &self.recipe;
        let last = last.min(plan.chunk_sizes.len() as u64);
        if first >= last {
            return Ok(Vec::new());
        }
        let spec = ShardSpec {
            out: self.opts.output.clone(),
            format: recipe.format,
            dtype: recipe.dtype,
            seqlen: recipe.seqlen as u64,
            cancel: cancel.clone(),
        };
        let pool = Self::pool(threads)?;
        let cs = recipe.chunk_size as u64;
        let spills = Spills::open(&self.work, plan.counts.len(), spec.context_bytes())?;
        if recipe.shuffle {
            let padded: HashMap<u64, u32> = plan.padded.iter().map(|&(f, p, n)| (build::pack(f, p), n)).collect();
            // The cells holding global positions first*cs .. last*cs, shuffled whole.
            let (p0, p1) = (first * cs, (last * cs).min(plan.counts.iter().sum()));
            let mut start = 0u64;
            let (mut c0, mut base) = (0u64, 0u64);
            let mut c1 = plan.cells;
            for (c, &n) in plan.cell_sizes.iter().enumerate() {
                if start + n <= p0 {
                    c0 = c as u64 + 1;
                    base = start + n;
                }
                if start >= p1 {
                    c1 = c as u64;
                    break;
                }
                start += n;
            }
            let ids = build::shuffled_cells(&pool, recipe.seed, &plan.counts, plan.cells, c0, c1, &plan.cell_sizes[c0 as usize..c1 as usize]);
            let ids = &ids[(p0 - base) as usize..(p1 - base) as usize];
            pool.install(|| {
                ids.par_chunks(cs as usize)
                    .enumerate()
                    .map(|(i, c)| {
                        testhook::point("stage2.group");
                        let padding: u64 = c.iter().filter_map(|id| padded.get(id)).map(|&n| n as u64).sum();
                        let mut cache = HashMap::new();
                        build::write_shard(&spec, first + i as u64, c.len(), padding, |j, buf| spills.read(&mut cache, c[j as usize], buf))
                    })
                    .collect()
            })
        } else {
            let order = stream::plan(&plan.counts[..plan.counts.len() - plan.stitched.is_some() as usize], plan.stitched, cs);
            let padded: HashMap<(usize, u64), u32> = plan.padded.iter().map(|&(f, p, n)| ((f, p), n)).collect();
            pool.install(|| {
                order[first as usize..last as usize]
                    .par_iter()
                    .map(|p| {
                        let padding: u64 = (p.start..p.start + p.len).filter_map(|q| padded.get(&(p.file, q))).map(|&n| n as u64).sum();
                        let mut cache = HashMap::new();
                        build::write_shard(&spec, p.chunk, p.len as usize, padding, |j, buf| {
                            spills.read(&mut cache, build::pack(p.file, p.start + j), buf)
                        })
                    })
                    .collect()
            })
        }
    }

    /// Driver: list written chunks in the manifest (kept a prefix of the final one).
    pub fn add_lines(&self, driver: &mut Driver, first: u64, lines: Vec<ManifestLine>) -> Result<()> {
        let before = driver.manifest.lines.len();
        for (i, line) in lines.into_iter().enumerate() {
            driver.manifest.add(first + i as u64, line)?;
        }
        if driver.manifest.lines.len() > before {
            testhook::point("stage2.listed"); // manifest.jsonl grew
        }
        Ok(())
    }

    /// Driver: the final manifest, then tokshuf.json "complete" (with `build_info` as its
    /// `build`), then remove the work folder and the lock.
    pub fn finish(&self, mut driver: Driver, build_info: &Value) -> Result<Value> {
        let plan = self.chunk_plan()?;
        if driver.manifest.lines.len() as u64 != plan.chunk_sizes.len() as u64 {
            return Err(Error::Config("internal error: chunks missing from the manifest (please report)".into()));
        }
        driver.manifest.finish()?;
        let mut stats = plan.stats;
        stats["bytes_out"] = json!(driver.manifest.lines.iter().map(|m| m.bytes).sum::<u64>());
        let meta = self.write_meta("complete", stats, build_info)?;
        testhook::point("complete");
        resume::remove_work(&self.work)?;
        if let Some(lock) = driver.lock.take() {
            lock.remove()?;
        }
        Ok(meta)
    }
}
