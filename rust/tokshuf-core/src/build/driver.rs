//! The build's steps (`steps`) driven from outside, one call at a time: what an engine that runs
//! them on other machines (the Ray engine, `python/tokshuf/_ray.py`) needs around them.
//!
//! The driver calls `begin` (build lock, start / resume / complete, first tokshuf.json, the
//! manifest prefix of a killed run), `plan_chunks` once every file's stage 1 is done (stitch,
//! chunk plan saved as `chunks.json` in the work folder, tokshuf.json "writing"), `add_lines`
//! as chunks are written, and `finish`. Tasks on any node call `stage1` and `stage2`, which
//! read everything they need from the shared work folder. Every output is the one-machine
//! builder's (`build::build`): the same steps, the same bytes.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::manifest::Manifest;
use super::plan::{self, ChunkPlan};
use super::resume::{self, Start};
use super::stage1::Stage1Config;
use super::steps::{self, Job};
use super::BuildOptions;
use crate::error::{Error, Result};
use crate::format::{self, lock::BuildLock, FileSummary, ManifestLine, Metadata, Status, Totals, META_NAME};
use crate::testhook;
use crate::tokenize::Tokenizer;

const CHUNK_PLAN: &str = "chunks.json";

/// One build, as every process that runs a step of it sees it.
pub struct Steps {
    opts: BuildOptions,
    job: Job,
    cfg: Arc<Stage1Config>,
}

/// The driver's state between `begin` and `finish`.
pub struct Driver {
    lock: Option<BuildLock>,
    manifest: Manifest,
    /// Chunks a killed run listed (their shards are in place): no task needs to write them.
    pub listed: u64,
}

pub enum Begun {
    Complete(Box<Metadata>),
    Started(Driver),
}

/// What stage 2 needs besides the summaries, written once by the driver.
#[derive(Serialize, Deserialize)]
struct Planned {
    plan: ChunkPlan,
    totals: Totals,
}

/// The tokenizer of `opts`, loaded once per process: a worker runs many tasks of one build, and
/// loading takes 0.1-0.3 s. Keyed by the spec file's size and mtime too, so a tokenizer file
/// replaced in place is loaded again.
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

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    let threads = threads.max(1);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tokshuf-{i}"))
        .build()
        .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))
}

impl Steps {
    /// Load the tokenizer (once per process) and make the recipe; no side effect.
    pub fn open(opts: BuildOptions) -> Result<Steps> {
        opts.validate()?;
        if opts.packing.is_unpacked() {
            // Its steps differ after stage 1 (one chunk plan and manifest per bin).
            return Err(Error::Config(
                "engine=\"ray\" does not build packing=\"none\" caches yet; build them with the local engine".into(),
            ));
        }
        let tok = load_tokenizer(&opts)?;
        let recipe = plan::recipe(&opts, &tok)?;
        let work = resume::work_dir(&opts.output, opts.local_cell_dir.as_deref())?;
        let cfg = steps::stage1_config(&recipe, &tok);
        let job = Job { recipe, out: opts.output.clone(), work };
        Ok(Steps { opts, job, cfg })
    }

    pub fn work(&self) -> &Path {
        &self.job.work
    }
    pub fn input_sizes(&self) -> Vec<u64> {
        self.job.recipe.inputs.iter().map(|f| f.bytes).collect()
    }
    /// Input files whose stage 1 a killed run finished.
    pub fn files_done(&self) -> Vec<usize> {
        (0..self.job.recipe.inputs.len()).filter(|&f| steps::summary(&self.job, f).ok().flatten().is_some()).collect()
    }
    fn summaries(&self) -> Result<Vec<FileSummary>> {
        let n = self.job.recipe.inputs.len() + self.job.recipe.stitches_tails() as usize;
        (0..n).map(|f| steps::summary(&self.job, f)?.ok_or_else(|| Error::Config(format!("stage 1 left file {f} unfinished")))).collect()
    }
    fn plan_path(&self) -> PathBuf {
        self.job.work.join(CHUNK_PLAN)
    }

    /// Driver: take the build lock and decide start / resume / complete as `build::build` does.
    pub fn begin(&self, build: &Value) -> Result<Begun> {
        testhook::init();
        let out = &self.job.out;
        let lock = BuildLock::acquire(out)?;
        let start = match resume::prepare(out, &self.job.work, &self.job.recipe, self.opts.overwrite) {
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
        resume::init_work(&self.job.work, &self.job.recipe)?;
        if !out.join(META_NAME).exists() {
            let shuffle = self.job.recipe.shuffle;
            let mut m = Metadata::new(&self.job.recipe, if shuffle { Status::Building } else { Status::Streaming }, build.clone());
            if !shuffle {
                m.num_chunks_ready = Some(0);
            }
            steps::write_metadata(out, &m)?;
        }
        testhook::point("start");
        let manifest = Manifest::open(out, matches!(start, Start::Fresh))?;
        let listed = manifest.lines.len() as u64;
        Ok(Begun::Started(Driver { lock: Some(lock), manifest, listed }))
    }

    /// Any node: stage 1 of `files` (those a killed run finished are skipped) on `threads`
    /// threads; their summaries, in the order given.
    pub fn stage1(&self, files: &[usize], threads: usize, cancel: &Arc<AtomicBool>) -> Result<Vec<FileSummary>> {
        testhook::init();
        steps::stage1_files(&self.job, &self.cfg, files, &Arc::new(pool(threads)?), cancel, |_, _| {})
    }

    /// Driver, once every file's stage 1 is done: stitch the tails, plan the chunks, publish
    /// the plan (tokshuf.json "writing"). Returns the number of chunks.
    pub fn plan_chunks(&self, threads: usize, build: &Value) -> Result<u64> {
        let n = self.job.recipe.inputs.len();
        let mut summaries: Vec<FileSummary> = (0..n)
            .map(|f| steps::summary(&self.job, f)?.ok_or_else(|| Error::Config(format!("stage 1 left file {f} unfinished"))))
            .collect::<Result<_>>()?;
        if let Some(s) = steps::stitch(&self.job, &self.cfg, &summaries)? {
            summaries.push(s);
        }
        let plan = ChunkPlan::new(&self.job.recipe, &summaries, self.opts.num_local_cells, &pool(threads)?)?;
        let totals = plan::totals(&summaries, &self.job.recipe, plan.cells);
        let planned = Planned { plan, totals };
        format::write_atomic(&self.plan_path(), &format::to_json_bytes(&planned))?;
        steps::write_metadata(&self.job.out, &steps::planned_metadata(&self.job, &planned.plan, planned.totals.clone(), build.clone()))?;
        testhook::point("plan");
        Ok(planned.plan.num_chunks())
    }

    fn planned(&self) -> Result<Planned> {
        format::read_json(&self.plan_path())
    }

    /// Any node: write chunks `chunks` (a shard already in place is only hashed); their
    /// manifest lines, in chunk order.
    pub fn stage2(&self, chunks: Range<u64>, threads: usize, cancel: &Arc<AtomicBool>) -> Result<Vec<ManifestLine>> {
        testhook::init();
        let planned = self.planned()?;
        let chunks = chunks.start..chunks.end.min(planned.plan.num_chunks());
        steps::stage2_chunks(&self.job, &planned.plan, &self.summaries()?, chunks, &pool(threads)?, cancel, &|_, _| Ok(()))
    }

    /// Driver: list chunks `first, first+1, ...` in manifest.jsonl (kept a prefix of the final one).
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

    /// Driver: the whole manifest, tokshuf.json "complete" (with `build`), then the work
    /// folder and the lock removed.
    pub fn finish(&self, mut driver: Driver, build: &Value) -> Result<Metadata> {
        let planned = self.planned()?;
        driver.manifest.close();
        let meta = steps::finalize(&self.job, &planned.plan, planned.totals, &driver.manifest.lines, build.clone())?;
        resume::remove_work(&self.job.work)?;
        if let Some(lock) = driver.lock.take() {
            lock.remove()?;
        }
        Ok(meta)
    }
}
