//! The build's steps (`steps`) driven from outside, one call at a time: what an engine that runs
//! them on other machines (the Ray engine, `python/tokshuf/_ray.py`) needs around them.
//!
//! The output and the work folder are `Place`s: folders on storage every node mounts at the
//! same path, or (for an output in an object store) prefixes in the store, `OUTPUT/.tokshuf-work`
//! for the work; then every step produces its files in a local scratch folder
//! (`local_cell_dir`, else the system's temporary folder) and uploads them as whole objects.
//!
//! The driver calls `begin` (build lock, start / resume / complete, first tokshuf.json, the
//! manifest prefix of a killed run), `plan_chunks` once every file's stage 1 is done (stitch,
//! chunk plan saved as `chunks.json` in the work folder, tokshuf.json "writing"), `add_lines`
//! as chunks are written, and `finish`. Tasks on any node call `stage1` (input files to
//! spills), then for a shuffled build `regroup` (spills to cell order, `cell_spills`) and
//! `stage2` (chunk ranges to shards), reading what they need from the work folder. Every
//! output is the one-machine builder's (`build::build`): the same bytes.
//!
//! An unpacked build (`packing="none"`, `binned`) has one chunk plan per length bin, saved as
//! `bins.json`: no regroup (stage 2 reads each example through its bin's positions,
//! `spills::BinSpills`), `stage2_bin` writes a range of one bin's chunks into `bin_KK/`, the
//! driver keeps each bin's lines (`add_bin_lines`) and `finish` publishes every bin's manifest.
//! Its output must be a folder every node sees (an object store is refused in `Steps::open`).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::binned;
use super::cell_spills::{self, cells_name};
use super::cells::unpack;
use super::manifest::{manifest_text, Manifest};
use super::place::Place;
use super::plan::{self, ChunkPlan};
use super::resume::{self, Start};
use super::shard::{write_shard, ShardSpec};
use super::stage1::{self, spill_name, summary_name, Stage1Config};
use super::steps::{self, Job};
use super::BuildOptions;
use crate::error::{Error, Result};
use crate::format::{
    self, lock::BuildLock, FileSummary, ManifestLine, Metadata, Recipe, Status, Totals, LOCK_NAME, MANIFEST_NAME, META_NAME, WORK_NAME,
};
use crate::storage::lease::Lease;
use crate::testhook;
use crate::tokenize::Tokenizer;

const CHUNK_PLAN: &str = "chunks.json";
/// The chunk plans of an unpacked build's bins (`PlannedBins`), in the work folder.
const BIN_PLANS: &str = "bins.json";

/// One build, as every process that runs a step of it sees it.
pub struct Steps {
    opts: BuildOptions,
    recipe: Recipe,
    /// The folder the recipe's local input paths are relative to (`steps::Job::input_root`).
    input_root: Option<PathBuf>,
    cfg: Arc<Stage1Config>,
    out: Place,
    work: Place,
}

/// The recipe as the driver made it, sent to every task so that none lists the inputs again.
#[derive(Serialize, Deserialize)]
pub struct Shipped {
    pub recipe: Recipe,
    pub input_root: Option<PathBuf>,
}

/// The driver's state between `begin` and `finish`.
pub struct Driver {
    /// The build lock of a folder output, the lease of an output in a store.
    lock: Option<BuildLock>,
    lease: Option<Lease>,
    /// manifest.jsonl of a packed build (an unpacked one has one per bin, written at the end).
    manifest: Option<Manifest>,
    /// An unpacked build's manifest lines so far, per bin, by chunk.
    bins: Vec<BTreeMap<u64, ManifestLine>>,
    /// Chunks a killed run listed (their shards are in place): no task needs to write them.
    /// Always 0 for an unpacked build, whose bin manifests appear only at the end: its tasks
    /// find the shards a killed run wrote and keep them.
    pub listed: u64,
}

impl Driver {
    fn manifest(&mut self) -> Result<&mut Manifest> {
        self.manifest
            .as_mut()
            .ok_or_else(|| Error::Config("internal error: an unpacked build has no single manifest (please report)".into()))
    }
}

pub enum Begun {
    Complete(Box<Metadata>),
    Started(Box<Driver>),
}

/// What the steps after stage 1 need, written once by the driver.
#[derive(Serialize, Deserialize)]
struct Planned {
    plan: ChunkPlan,
    totals: Totals,
    /// Each file's padded contexts (position, padding ids), for the manifest's `num_tokens`:
    /// so stage 2 reads no summary.
    padded: Vec<Vec<(u64, u32)>>,
}

/// An unpacked build's plan, written once by the driver: each bin's chunk plan, and what its
/// tokshuf.json needs of the summaries (so `finish` reads none).
#[derive(Serialize, Deserialize)]
struct PlannedBins {
    plans: Vec<ChunkPlan>,
    totals: Totals,
    bin_tokens: Vec<u64>,
}

/// The tokenizer of `opts`, loaded once per process: a worker runs many tasks of one build.
fn load_tokenizer(opts: &BuildOptions) -> Result<Tokenizer> {
    Tokenizer::load_shared(&opts.tokenizer, opts.allow_special_tokens, opts.tokenizer_backend)
}

/// Load `opts`' tokenizer into this process (a worker warming up before its first task);
/// its identity (sha256, backend), to compare with the driver's.
pub fn warm(opts: &BuildOptions) -> Result<(String, String)> {
    let tok = load_tokenizer(opts)?;
    Ok((tok.sha256.clone(), tok.backend.to_string()))
}

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    let threads = threads.max(1);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tokshuf-{i}"))
        .build()
        .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))
}

fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

impl Steps {
    /// Load the tokenizer (once per process) and take the build's recipe: `recipe` as the driver
    /// made it (a task: no input file is listed or sized again), else made from `opts`. No
    /// side effect.
    pub fn open(opts: BuildOptions, shipped: Option<Shipped>) -> Result<Steps> {
        opts.validate()?;
        let scratch = opts.local_cell_dir.clone().unwrap_or_else(std::env::temp_dir);
        let out = Place::new(&opts.output, &scratch)?;
        if opts.packing.is_unpacked() && out.is_store() {
            // Its stage 2 reads examples at random through the bins' position files, which
            // only a folder serves; before anything is loaded or listed.
            return Err(Error::Config(
                "engine=\"ray\" builds packing=\"none\" caches into a folder every node sees, not into an object store yet; \
                 build into a shared folder, or use the local engine"
                    .into(),
            ));
        }
        let tok = load_tokenizer(&opts)?;
        let Shipped { recipe, input_root } = match shipped {
            Some(Shipped { recipe: r, .. }) if r.tokshuf_version != format::VERSION => {
                return Err(Error::Config(format!(
                    "this machine runs tokshuf {}, the driver {}: install the same version on every node",
                    format::VERSION,
                    r.tokshuf_version
                )))
            }
            Some(Shipped { recipe: r, .. }) if r.tokenizer.sha256 != tok.sha256 || r.tokenizer.backend != tok.backend => {
                return Err(Error::Config(format!(
                    "{}: this machine's tokenizer is not the driver's ({} {}, here {} {}); every node needs the same tokenizer file",
                    tok.spec, r.tokenizer.backend, r.tokenizer.sha256, tok.backend, tok.sha256
                )))
            }
            Some(s) => s,
            None => {
                let (recipe, input_root) = plan::recipe(&opts, &tok)?;
                Shipped { recipe, input_root }
            }
        };
        let work = match &out {
            Place::Dir(p) => Place::Dir(resume::work_dir(p, opts.local_cell_dir.as_deref())?),
            Place::Store { .. } => out.child(WORK_NAME),
        };
        // Workers on other machines write the spills stage 2 reads.
        let cfg = steps::stage1_config(&recipe, &tok, opts.memory_limit(), true);
        Ok(Steps { opts, recipe, input_root, cfg, out, work })
    }

    /// The work folder (a path or a URL).
    pub fn work(&self) -> String {
        self.work.to_string()
    }
    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }
    pub fn input_sizes(&self) -> Vec<u64> {
        self.recipe.inputs.iter().map(|f| f.bytes).collect()
    }

    /// What `BuildSteps(recipe=...)` on another machine needs: the recipe and its input root.
    pub fn shipped(&self) -> Shipped {
        Shipped { recipe: self.recipe.clone(), input_root: self.input_root.clone() }
    }

    /// Where the input files are on this machine.
    fn inputs(&self) -> Vec<PathBuf> {
        steps::input_paths(&self.recipe, self.input_root.as_deref())
    }

    /// A job whose work folder is `work` (the shared one, or a step's own scratch folder).
    fn job(&self, work: &Path) -> Job {
        let out = self.out.dir().map_or_else(|| work.to_path_buf(), Path::to_path_buf);
        Job { recipe: self.recipe.clone(), out, work: work.to_path_buf(), input_root: self.input_root.clone() }
    }

    /// Input files whose stage 1 a killed run finished.
    pub fn files_done(&self) -> Result<Vec<usize>> {
        let names = self.work.names()?;
        Ok((0..self.recipe.inputs.len()).filter(|&f| names.binary_search(&summary_name(f)).is_ok()).collect())
    }

    fn summary(&self, file: usize) -> Result<Option<FileSummary>> {
        self.work.read_json(&summary_name(file))
    }

    fn planned(&self) -> Result<Planned> {
        self.work.read_json(CHUNK_PLAN)?.ok_or_else(|| Error::Config(format!("{}: no chunk plan yet (please report)", self.work)))
    }

    fn planned_bins(&self) -> Result<PlannedBins> {
        self.work.read_json(BIN_PLANS)?.ok_or_else(|| Error::Config(format!("{}: no bin plans yet (please report)", self.work)))
    }

    fn unpacked(&self) -> bool {
        self.recipe.packing.is_unpacked()
    }

    /// The job of an unpacked build's steps: output and work are folders (`open` refused a store).
    fn folder_job(&self) -> Result<Job> {
        match (&self.out, &self.work) {
            (Place::Dir(_), Place::Dir(work)) => Ok(self.job(work)),
            _ => Err(Error::Config("internal error: an unpacked build outside a folder (please report)".into())),
        }
    }

    fn write_meta(&self, meta: &Metadata) -> Result<()> {
        self.out.write(META_NAME, &meta.to_bytes(), &format!("tokshuf.json[{}]", meta.status.as_str()))
    }

    /// Publish a file a step produced in its scratch folder `dir` into the work folder.
    fn publish_work(&self, dir: &Path, name: &str) -> Result<()> {
        self.work.publish(&dir.join(name), name)
    }

    /// Driver: take the build lock (a folder output) and decide start / resume / complete as
    /// `build::build` does.
    pub fn begin(&self, build: &Value) -> Result<Begun> {
        testhook::init();
        let lock = self.out.dir().map(BuildLock::acquire).transpose()?;
        let lease = match &self.out {
            Place::Store { .. } => Some(Lease::take(self.out.location(LOCK_NAME), &self.out.to_string())?),
            Place::Dir(_) => None,
        };
        // A build refused, or found complete, leaves the output as it was (less its lock).
        let leave = |lock: Option<BuildLock>, lease: Option<Lease>| -> Result<()> {
            if let Some(lock) = lock {
                lock.remove()?;
            }
            lease.map_or(Ok(()), Lease::release)
        };
        let start = match resume::prepare(&self.out, &self.work, &self.recipe, &self.inputs(), self.opts.overwrite) {
            Ok(s) => s,
            Err(e) => {
                let _ = leave(lock.filter(|l| l.created), lease);
                return Err(e);
            }
        };
        if let Start::Complete(meta) = start {
            leave(lock, lease)?;
            return Ok(Begun::Complete(meta));
        }
        resume::init_work(&self.work, &self.recipe, &self.inputs(), true)?;
        if self.out.size(META_NAME)?.is_none() {
            // As `build::build`: an unpacked build is never followed while it streams.
            let streams = !self.recipe.shuffle && !self.unpacked();
            let mut m = Metadata::new(&self.recipe, if streams { Status::Streaming } else { Status::Building }, build.clone());
            if streams {
                m.num_chunks_ready = Some(0);
            }
            self.write_meta(&m)?;
        }
        testhook::point("start");
        let manifest = if self.unpacked() { None } else { Some(Manifest::open(&self.out, matches!(start, Start::Fresh))?) };
        let listed = manifest.as_ref().map_or(0, |m| m.lines.len() as u64);
        Ok(Begun::Started(Box::new(Driver { lock, lease, manifest, bins: Vec::new(), listed })))
    }

    /// Any node: stage 1 of `files` (those a killed run finished are skipped) on `threads`
    /// threads; their summaries, in the order given.
    pub fn stage1(&self, files: &[usize], threads: usize, cancel: &Arc<AtomicBool>) -> Result<Vec<FileSummary>> {
        testhook::init();
        let pool = Arc::new(pool(threads)?);
        match &self.work {
            Place::Dir(work) => steps::stage1_files(&self.job(work), &self.cfg, files, &pool, cancel, |_, _| Ok(())),
            Place::Store { .. } => {
                // Spill and summary are made locally, then uploaded: the summary last, as the
                // mark that the file is done.
                let mut done = HashMap::new();
                for &f in files {
                    if let Some(s) = self.summary(f)? {
                        done.insert(f, s);
                    }
                }
                let todo: Vec<usize> = files.iter().copied().filter(|f| !done.contains_key(f)).collect();
                let scratch = self.work.scratch_dir()?;
                let dir = scratch.path();
                let fresh = steps::stage1_files(&self.job(dir), &self.cfg, &todo, &pool, cancel, |f, _| {
                    self.publish_work(dir, &spill_name(f))?;
                    self.publish_work(dir, &summary_name(f))
                })?;
                done.extend(todo.into_iter().zip(fresh));
                files.iter().map(|f| done.remove(f).ok_or_else(|| Error::Config(format!("stage 1 left file {f} unfinished")))).collect()
            }
        }
    }

    /// Driver, once every file's stage 1 is done: stitch the tails, plan the chunks, publish
    /// the plan (tokshuf.json "writing"). Returns the number of chunks (over all bins).
    pub fn plan_chunks(&self, threads: usize, build: &Value) -> Result<u64> {
        let summaries = self.summaries()?;
        if self.unpacked() {
            return self.plan_bins(&summaries, threads, build);
        }
        let plan = ChunkPlan::new(&self.recipe, &summaries, self.opts.num_local_cells, &pool(threads)?)?;
        let totals = plan::totals(&summaries, &self.recipe, plan.cells);
        let padded = summaries.iter().map(|s| s.padded.clone()).collect();
        let planned = Planned { plan, totals, padded };
        self.work.write(CHUNK_PLAN, &format::to_json_bytes(&planned), CHUNK_PLAN)?;
        self.write_meta(&steps::planned_metadata(&self.recipe, &planned.plan, planned.totals.clone(), build.clone()))?;
        testhook::point("plan");
        Ok(planned.plan.num_chunks())
    }

    /// Unpacked builds: every bin's chunk plan (`binned::plans`, as `build_unpacked`), saved
    /// for the tasks and `finish`; tokshuf.json "writing".
    fn plan_bins(&self, summaries: &[FileSummary], threads: usize, build: &Value) -> Result<u64> {
        let job = self.folder_job()?;
        let plans = binned::plans(&job, summaries, self.opts.num_local_cells, &pool(threads)?)?;
        let totals = plan::totals(summaries, &self.recipe, None);
        let planned = PlannedBins { bin_tokens: binned::bin_tokens(summaries, plans.len()), plans, totals };
        self.work.write(BIN_PLANS, &format::to_json_bytes(&planned), BIN_PLANS)?;
        let meta = binned::metadata(&job, &planned.plans, &planned.bin_tokens, planned.totals.clone(), Status::Writing, build.clone());
        self.write_meta(&meta)?;
        testhook::point("plan");
        Ok(planned.plans.iter().map(ChunkPlan::num_chunks).sum())
    }

    /// Unpacked builds: the number of chunks of each bin, once planned; None for a packed build.
    pub fn bin_chunks(&self) -> Result<Option<Vec<u64>>> {
        if !self.unpacked() {
            return Ok(None);
        }
        Ok(Some(self.planned_bins()?.plans.iter().map(ChunkPlan::num_chunks).collect()))
    }

    /// Every file's summary, and the stitched tails' (made now if no run made them yet).
    fn summaries(&self) -> Result<Vec<FileSummary>> {
        let n = self.recipe.inputs.len();
        let mut summaries = Vec::with_capacity(n + 1);
        // A file's tail goes to the stitch as its summary is read: the tails of many files
        // are never held at once.
        let mut load = |f: usize| -> Result<Vec<u32>> {
            let mut s = self.summary(f)?.ok_or_else(|| steps::unfinished(f))?;
            let tail = std::mem::take(&mut s.tail);
            summaries.push(s);
            Ok(tail)
        };
        let made = if self.recipe.stitches_tails() { self.summary(n)? } else { None };
        if !self.recipe.stitches_tails() || made.is_some() {
            for f in 0..n {
                load(f)?;
            }
            summaries.extend(made);
            return Ok(summaries);
        }
        // A store's stitched spill is made in scratch, then published.
        let (work, scratch) = match &self.work {
            Place::Dir(work) => (work.clone(), None),
            Place::Store { .. } => {
                let s = self.work.scratch_dir()?;
                (s.path().to_path_buf(), Some(s))
            }
        };
        let stitched = stage1::write_stitched(&self.cfg, &work, n, (0..n).map(&mut load))?;
        testhook::point("stage1.stitched");
        if scratch.is_some() {
            self.publish_work(&work, &spill_name(n))?;
            self.publish_work(&work, &summary_name(n))?;
        }
        summaries.push(stitched);
        Ok(summaries)
    }

    /// Spills of the planned build (the input files', then the stitched tails'), and whether
    /// the build is shuffled (its spills are then regrouped before stage 2).
    pub fn spills(&self) -> Result<(usize, bool)> {
        let planned = self.planned()?;
        Ok((planned.plan.counts.len(), planned.plan.cells.is_some()))
    }

    /// Any node, shuffled builds: rewrite the spills of `files` in cell order
    /// (`cell_spills`), one file per thread; files already done are skipped.
    pub fn regroup(&self, files: &[usize], threads: usize, cancel: &Arc<AtomicBool>) -> Result<()> {
        testhook::init();
        let planned = self.planned()?;
        let Some(cells) = planned.plan.cells else { return Ok(()) };
        let cb = self.recipe.seqlen as u64 * self.recipe.dtype.size() as u64;
        let seed = self.recipe.seed;
        pool(threads)?.install(|| {
            files.par_iter().try_for_each(|&f| {
                check_cancel(cancel)?;
                let name = cells_name(f);
                if self.work.size(&name)?.is_some() {
                    return Ok(());
                }
                let count = *planned.plan.counts.get(f).ok_or_else(|| Error::Config(format!("no spill {f} in the plan")))?;
                let src = self.work.open_range(&spill_name(f), 0..count * cb)?;
                let staged = self.work.staging(&name)?;
                let written = File::options()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&staged)
                    .map_err(|e| Error::io(&staged, e))
                    .and_then(|dst| {
                        cell_spills::write(seed, f, count, cells, cb, src, &self.work.location(&spill_name(f)).to_string(), &dst, &staged)
                    });
                if let Err(e) = written {
                    let _ = std::fs::remove_file(&staged);
                    return Err(e);
                }
                testhook::point("regroup.tmp");
                self.work.publish(&staged, &name)
            })
        })
    }

    /// Any node: write chunks `chunks` (a shard already in place is kept); their manifest
    /// lines, in chunk order.
    pub fn stage2(&self, chunks: Range<u64>, threads: usize, cancel: &Arc<AtomicBool>) -> Result<Vec<ManifestLine>> {
        testhook::init();
        let planned = self.planned()?;
        let plan = &planned.plan;
        let chunks = chunks.start..chunks.end.min(plan.num_chunks());
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        let pool = pool(threads)?;
        let scratch = match (&self.out, &self.work) {
            (Place::Dir(_), Place::Dir(_)) => None,
            _ => Some(self.work.scratch_dir()?),
        };
        let shard_dir = match (&self.out, &scratch) {
            (Place::Dir(p), _) => p.clone(),
            (Place::Store { .. }, Some(s)) => s.path().to_path_buf(),
            (Place::Store { .. }, None) => return Err(Error::Config("internal error: no scratch folder (please report)".into())),
        };
        let spec = ShardSpec::new(&self.recipe, shard_dir.clone(), cancel.clone(), Arc::default());
        let cb = spec.context_bytes();
        // A shard made in scratch goes to the store, over one a killed run left unlisted
        // (a same-sized object is not proof of the same bytes).
        let publish = |line: ManifestLine| -> Result<ManifestLine> {
            if self.out.is_store() {
                let name = format!("{}.tar", line.shard);
                self.out.publish(&shard_dir.join(&name), &name)?;
            }
            Ok(line)
        };
        let padding_in = |file: usize, range: Range<u64>| -> u64 {
            planned.padded.get(file).map_or(0, |p| p.iter().filter(|(pos, _)| range.contains(pos)).map(|&(_, n)| n as u64).sum())
        };
        let cs = plan.chunk_size;
        match plan.cells {
            Some(ncells) => {
                let (c0, c1, skip) = plan.cells_of(chunks.start, chunks.end);
                let g =
                    cell_spills::gather(&pool, self.recipe.seed, &plan.counts, ncells, c0, c1, &plan.cell_sizes[c0 as usize..c1 as usize]);
                let end = (chunks.end * cs).min(plan.num_contexts()) - chunks.start * cs;
                let order = &g.order[skip as usize..(skip + end) as usize];
                let padded: HashMap<u64, u32> = planned
                    .padded
                    .iter()
                    .enumerate()
                    .flat_map(|(f, p)| p.iter().map(move |&(pos, n)| (super::cells::pack(f, pos), n)))
                    .collect();
                let source = self.cell_source(&g.ranges, cb, scratch.as_ref().map(|s| s.path()), &pool)?;
                testhook::point("stage2.group");
                pool.install(|| {
                    order
                        .par_chunks(cs as usize)
                        .enumerate()
                        .map(|(i, part)| {
                            let chunk = chunks.start + i as u64;
                            let padding: u64 = part.iter().filter_map(|(id, _)| padded.get(id)).map(|&n| n as u64).sum();
                            let line = write_shard(&spec, chunk, part.len(), padding, |k, buf| {
                                let (id, idx) = part[k as usize];
                                source.read(id, idx, buf)
                            })?;
                            publish(line)
                        })
                        .collect()
                })
            }
            None => pool.install(|| {
                chunks
                    .into_par_iter()
                    .map(|chunk| {
                        let p = plan.placed(chunk).ok_or_else(|| Error::Config(format!("chunk {chunk} is not in the plan")))?;
                        let name = spill_name(p.file);
                        let what = self.work.location(&name).to_string();
                        let mut src: Option<BufReader<Box<dyn Read + Send>>> = None;
                        let line = write_shard(&spec, chunk, p.len as usize, padding_in(p.file, p.start..p.start + p.len), |_, buf| {
                            if src.is_none() {
                                src = Some(BufReader::with_capacity(
                                    1 << 20,
                                    self.work.open_range(&name, p.start * cb..(p.start + p.len) * cb)?,
                                ));
                            }
                            src.as_mut().map_or(Ok(()), |s| s.read_exact(buf)).map_err(|e| Error::io(&what, e))
                        })?;
                        publish(line)
                    })
                    .collect()
            }),
        }
    }

    /// Any node, unpacked builds: write chunks `chunks` of bin `bin` into `bin_KK/` (a shard
    /// already there is kept, as a resumed build needs); their manifest lines, in chunk order.
    pub fn stage2_bin(&self, bin: usize, chunks: Range<u64>, threads: usize, cancel: &Arc<AtomicBool>) -> Result<Vec<ManifestLine>> {
        testhook::init();
        let planned = self.planned_bins()?;
        let plan =
            planned.plans.get(bin).ok_or_else(|| Error::Config(format!("internal error: no bin {bin} in the plan (please report)")))?;
        let chunks = chunks.start..chunks.end.min(plan.num_chunks());
        binned::write_chunks(&self.folder_job()?, bin, plan, chunks, &pool(threads)?, cancel, &|_, _| Ok(()))
    }

    /// Where stage 2 reads the contexts of its cells: each file's cell-ordered spill in place
    /// (a folder), or its part of it downloaded into one local file (a store), one ranged
    /// read per file, several at once.
    fn cell_source(&self, ranges: &[Range<u64>], cb: u64, scratch: Option<&Path>, pool: &rayon::ThreadPool) -> Result<CellSource> {
        let mut files = vec![None; ranges.len()];
        match (&self.work, scratch) {
            (Place::Dir(dir), _) => {
                for (f, r) in ranges.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
                    let path = dir.join(cells_name(f));
                    let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
                    files[f] = Some((Arc::new(file), r.start));
                }
            }
            (Place::Store { .. }, Some(dir)) => {
                let path: PathBuf = dir.join("cells");
                let local = Arc::new(File::options().read(true).write(true).create_new(true).open(&path).map_err(|e| Error::io(&path, e))?);
                let mut base = 0u64;
                let mut jobs = Vec::new();
                for (f, r) in ranges.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
                    files[f] = Some((local.clone(), base));
                    jobs.push((f, r.clone(), base));
                    base += r.end - r.start;
                }
                pool.install(|| {
                    jobs.par_iter().try_for_each(|(f, r, base)| {
                        let name = cells_name(*f);
                        let mut src = self.work.open_range(&name, r.start * cb..r.end * cb)?;
                        let mut at = base * cb;
                        let mut buf = vec![0u8; (1 << 20) / cb.max(1) as usize * cb as usize + cb as usize];
                        loop {
                            let n = src.read(&mut buf).map_err(|e| crate::storage::unwrap_io(&self.work.location(&name), e))?;
                            if n == 0 {
                                break;
                            }
                            local.write_all_at(&buf[..n], at).map_err(|e| Error::io(&path, e))?;
                            at += n as u64;
                        }
                        if at != (base + r.end - r.start) * cb {
                            return Err(Error::corrupt(self.work.location(&name).to_string(), "shorter than its plan says"));
                        }
                        Ok(())
                    })
                })?;
            }
            (Place::Store { .. }, None) => return Err(Error::Config("internal error: no scratch folder (please report)".into())),
        }
        Ok(CellSource { files, cb })
    }

    /// Driver: list chunks `first, first+1, ...` in manifest.jsonl (kept a prefix of the final one).
    pub fn add_lines(&self, driver: &mut Driver, first: u64, lines: Vec<ManifestLine>) -> Result<()> {
        let manifest = driver.manifest()?;
        let before = manifest.lines.len();
        for (i, line) in lines.into_iter().enumerate() {
            manifest.add(first + i as u64, line)?;
        }
        if manifest.lines.len() > before {
            testhook::point("stage2.listed"); // manifest.jsonl grew
        }
        Ok(())
    }

    /// Driver, unpacked builds: the lines of chunks `first, first+1, ...` of bin `bin`, kept
    /// until `finish` publishes the bin's manifest.
    pub fn add_bin_lines(&self, driver: &mut Driver, bin: usize, first: u64, lines: Vec<ManifestLine>) -> Result<()> {
        if bin >= driver.bins.len() {
            driver.bins.resize_with(bin + 1, BTreeMap::new);
        }
        let listed = !lines.is_empty();
        driver.bins[bin].extend((first..).zip(lines));
        if listed {
            testhook::point("stage2.listed"); // the driver holds more written chunks
        }
        Ok(())
    }

    /// Driver, from time to time: bring a store's manifest up to date with the chunks listed
    /// (`now`: even if the last upload was a moment ago).
    pub fn upload_manifest(&self, driver: &mut Driver, now: bool) -> Result<()> {
        match driver.manifest.as_mut() {
            Some(m) => m.upload(now),
            None => Ok(()), // unpacked: the bins' manifests are written whole at the end
        }
    }

    /// Driver: the whole manifest, tokshuf.json "complete" (with `build`), then the work
    /// folder and the lock removed.
    pub fn finish(&self, mut driver: Driver, build: &Value) -> Result<Metadata> {
        let meta = if self.unpacked() { self.finish_bins(&driver, build)? } else { self.finish_manifest(&mut driver, build)? };
        self.write_meta(&meta)?;
        testhook::point("complete");
        match &self.work {
            Place::Dir(work) => resume::remove_work(work, None)?,
            Place::Store { .. } => self.work.remove_all()?,
        }
        // Temporary files of tasks that died with their node (their retries wrote the shards).
        for name in self.out.names()?.iter().filter(|n| format::is_tmp(n)) {
            self.out.remove(name)?;
        }
        if let Some(lock) = driver.lock.take() {
            lock.remove()?;
        }
        if let Some(lease) = driver.lease.take() {
            lease.release()?;
        }
        Ok(meta)
    }

    /// A packed build's whole manifest published; its tokshuf.json "complete".
    fn finish_manifest(&self, driver: &mut Driver, build: &Value) -> Result<Metadata> {
        let planned = self.planned()?;
        let manifest = driver.manifest()?;
        manifest.close();
        let lines = &manifest.lines;
        let meta = steps::complete_metadata(&self.recipe, &planned.plan, planned.totals, lines, build.clone())?;
        self.out.write(MANIFEST_NAME, &manifest_text(lines), MANIFEST_NAME)?;
        Ok(meta)
    }

    /// An unpacked build's bin manifests published (each bin's temporary files of tasks that
    /// died first, as `build_unpacked` does); its tokshuf.json "complete", as `build_unpacked`'s.
    fn finish_bins(&self, driver: &Driver, build: &Value) -> Result<Metadata> {
        let planned = self.planned_bins()?;
        let job = self.folder_job()?;
        let mut bytes_out = 0;
        for (k, plan) in planned.plans.iter().enumerate() {
            binned::remove_tmp(&job, k)?;
            let lines: Vec<ManifestLine> = driver.bins.get(k).map(|b| b.values().cloned().collect()).unwrap_or_default();
            binned::finish_bin(&job, k, plan, &lines)?;
            bytes_out += lines.iter().map(ManifestLine::bytes).sum::<u64>();
        }
        let mut meta = binned::metadata(&job, &planned.plans, &planned.bin_tokens, planned.totals, Status::Complete, build.clone());
        meta.bytes_out = Some(bytes_out);
        Ok(meta)
    }
}

/// The contexts of a stage-2 task's cells: per file, an open file and where that file's
/// contexts of those cells start in it.
struct CellSource {
    files: Vec<Option<(Arc<File>, u64)>>,
    cb: u64,
}

impl CellSource {
    fn read(&self, id: u64, idx: u64, buf: &mut [u8]) -> Result<()> {
        let (f, _) = unpack(id);
        let Some((file, first)) = self.files.get(f).and_then(Option::as_ref) else {
            return Err(Error::Config(format!("internal error: no cell data of file {f} (please report)")));
        };
        file.read_exact_at(buf, (first + idx) * self.cb).map_err(|e| Error::io(format!("cell-ordered spill of file {f}"), e))
    }
}
