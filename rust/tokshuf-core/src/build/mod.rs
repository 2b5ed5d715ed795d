//! The build (DESIGN §4-5, §8): options -> recipe -> stage 1 (tokenize, window) -> chunk plan
//! (cells, chunks) -> stage 2 (shuffle, write shards) -> manifest -> tokshuf.json. The steps
//! themselves are in `steps`; this module is the one-machine driver that runs them on a rayon
//! pool, with the progress bar, the build lock and resumption around them.
//!
//! Every step is resumable: a file is done when its summary exists (and its spill still has
//! the CRC-32 the summary records), a chunk when its shard exists (renamed into place after
//! fsync), and the order of everything is a pure function
//! of the recipe, never of timing. What a build does with an existing output folder is decided
//! in `resume`.
//!
//! While a build runs, manifest.jsonl holds a prefix of the final manifest (complete lines
//! only count), and tokshuf.json says how far the build is (`format::Status`).

pub mod binned;
pub mod budget;
pub mod cell_spills;
pub mod cells;
mod doc_window;
pub mod driver;
mod gather;
pub mod input;
mod manifest;
mod options;
pub mod pack;
pub mod place;
pub mod plan;
pub mod progress;
pub mod resume;
pub mod shard;
mod shards;
mod spills;
pub mod stage1;
pub mod steps;
pub mod stream;
mod streaming;
pub mod writeback;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

use self::budget::Stage2Budget;
use self::manifest::Manifest;
pub use self::options::BuildOptions;
use self::plan::ChunkPlan;
use self::progress::Progress;
use self::resume::Start;
use self::shard::{ShardSpec, ShardTimes};
use self::stage1::Stage1Config;
use self::steps::{Job, Stage2Io};
use crate::error::{Error, Result};
use crate::format::{self, lock::BuildLock, Metadata, Status, Totals, META_NAME};
use crate::testhook;

/// What every step of one build run shares.
pub(crate) struct Run<'a> {
    opts: &'a BuildOptions,
    job: Job,
    cfg: Arc<Stage1Config>,
    pool: Arc<rayon::ThreadPool>,
    cancel: Arc<AtomicBool>,
    progress: Progress,
    threads: usize,
    t0: Instant,
    timings: BTreeMap<&'static str, f64>,
    shard_times: Arc<ShardTimes>,
    /// Shuffled builds: stage 2's share of `memory_limit`, and the groups of chunks it made.
    stage2_budget: Option<(Stage2Budget, usize)>,
}

impl Run<'_> {
    fn build_info(&self) -> Value {
        let mut info = build_info(self.threads, &self.timings, self.t0);
        // Where this run found the local inputs that the recipe names relative to it.
        info["input_root"] = json!(self.job.input_root.as_ref().map(|r| r.to_string_lossy()));
        info["stage2"] = self.shard_times.to_json();
        if let Some((budget, groups)) = self.stage2_budget {
            info["stage2"]["gather_window"] = budget.gather_window.into();
            info["stage2"]["groups"] = groups.into();
        }
        info
    }
    fn metadata(&self, status: Status) -> Metadata {
        Metadata::new(&self.job.recipe, status, self.build_info())
    }
    fn write_planned(&self, plan: &ChunkPlan, totals: &Totals) -> Result<()> {
        steps::write_metadata(&self.job.out, &steps::planned_metadata(&self.job.recipe, plan, totals.clone(), self.build_info()))
    }
    fn nfiles(&self) -> usize {
        self.job.recipe.inputs.len()
    }
    fn shard_spec(&self) -> ShardSpec {
        ShardSpec::new(&self.job.recipe, self.job.out.clone(), self.cancel.clone(), self.shard_times.clone())
    }
    /// Cell ids stage 2 may hold at once: a quarter of the memory limit, at least two chunks.
    fn budget_ids(&self, chunk_size: u64) -> u64 {
        (self.opts.memory_limit() / 4 / 8).max(chunk_size * 2)
    }
    fn check_cancel(&self) -> Result<()> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        Ok(())
    }
}

/// Build (or resume, or confirm) a cache. Returns the final tokshuf.json.
pub fn build(opts: &BuildOptions, cancel: Arc<AtomicBool>) -> Result<Metadata> {
    let t0 = Instant::now();
    testhook::init();
    let (job, tok) = steps::plan(opts)?;
    let (out, work) = (job.out.clone(), job.work.clone());
    // Held for the whole run: refuses a second build into the same folder, and tells a reader
    // following this build whether it is still alive (see format::lock).
    let lock = BuildLock::acquire(&out)?;
    let (out_place, work_place) = (place::Place::Dir(out.clone()), place::Place::Dir(work.clone()));
    let inputs = job.paths();
    let start = match resume::prepare(&out_place, &work_place, &job.recipe, &inputs, opts.overwrite) {
        Ok(s) => s,
        Err(e) => {
            if lock.created {
                let _ = lock.remove(); // leave a refused folder as we found it
            }
            return Err(e);
        }
    };
    if let Start::Complete(meta) = start {
        lock.remove()?;
        return Ok(*meta);
    }
    resume::init_work(&work_place, &job.recipe, &inputs, false)?;

    let threads = opts.threads();
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tokshuf-{i}"))
            .build()
            .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))?,
    );
    let cfg = steps::stage1_config(&job.recipe, &tok, opts.memory_limit(), false);
    let mut run = Run {
        opts,
        job,
        cfg,
        pool,
        cancel,
        progress: Progress::new(opts.progress),
        threads,
        t0,
        timings: BTreeMap::new(),
        shard_times: Arc::default(),
        stage2_budget: None,
    };
    // A resumed build keeps the metadata it has: a reader following the build must never see
    // it go back (say from "writing", with the chunk plan, to "building").
    let streams = !run.job.recipe.shuffle && !run.job.recipe.packing.is_unpacked();
    if !out.join(META_NAME).exists() {
        let mut m = run.metadata(if streams { Status::Streaming } else { Status::Building });
        if streams {
            m.num_chunks_ready = Some(0);
        }
        steps::write_metadata(&out, &m)?;
    }
    testhook::point("start");
    if run.job.recipe.packing.is_unpacked() {
        let meta = build_unpacked(&mut run)?;
        resume::remove_work(&work, Some(&run.pool))?;
        lock.remove()?;
        return Ok(meta);
    }
    let mut manifest = Manifest::open(&out_place, matches!(start, Start::Fresh))?;
    let (plan, totals) = if run.job.recipe.shuffle {
        build_shuffled(&mut run, &mut manifest)?
    } else {
        streaming::build_streaming(&mut run, &mut manifest)?
    };
    // Manifest, then the final metadata: a complete tokshuf.json means a complete cache.
    manifest.close();
    let meta = steps::finalize(&run.job, &plan, totals, &manifest.lines, run.build_info())?;
    resume::remove_work(&work, Some(&run.pool))?;
    lock.remove()?;
    Ok(meta)
}

/// Stage 1 over every file, then the cell plan, then stage 2 in groups of chunks whose cells
/// fit the memory budget.
fn build_shuffled(run: &mut Run<'_>, manifest: &mut Manifest) -> Result<(ChunkPlan, Totals)> {
    let summaries = run_stage1(run)?;

    let t = Instant::now();
    let plan = ChunkPlan::new(&run.job.recipe, &summaries, run.opts.num_local_cells, &run.pool)?;
    let totals = plan::totals(&summaries, &run.job.recipe, plan.cells);
    run.timings.insert("plan_s", t.elapsed().as_secs_f64());
    run.write_planned(&plan, &totals)?;
    testhook::point("plan");

    let t = Instant::now();
    let listed = manifest.lines.len() as u64;
    run.progress.stage("write", plan.num_chunks(), "chunks");
    run.progress.advance(listed, 0, 0);
    let budget = Stage2Budget::for_recipe(run.opts.memory_limit(), run.threads, &run.job.recipe);
    let io = Stage2Io { gather_window: budget.gather_window, times: run.shard_times.clone() };
    let shared = Mutex::new(&mut *manifest);
    let progress = &run.progress;
    let on_chunk = |chunk: u64, line: &format::ManifestLine| -> Result<()> {
        progress.advance(1, line.bytes(), line.num_tokens());
        let mut m = shared.lock().map_err(|_| Error::Config("internal error: manifest lock poisoned".into()))?;
        m.add(chunk, line.clone())
    };
    let groups = plan.groups(listed, budget.group_ids);
    run.stage2_budget = Some((budget, groups.len()));
    for group in groups {
        steps::stage2_chunks(&run.job, &plan, &summaries, group, &io, &run.pool, &run.cancel, &on_chunk)?;
    }
    run.progress.end();
    run.timings.insert("write_s", t.elapsed().as_secs_f64());
    Ok((plan, totals))
}

/// An unpacked build (`binned`): stage 1, then every bin planned, then each bin's chunks
/// written and its manifest published, then tokshuf.json.
fn build_unpacked(run: &mut Run<'_>) -> Result<Metadata> {
    let summaries = run_stage1(run)?;
    let t = Instant::now();
    let plans = binned::plans(&run.job, &summaries, run.opts.num_local_cells, &run.pool)?;
    let totals = plan::totals(&summaries, &run.job.recipe, None);
    run.timings.insert("plan_s", t.elapsed().as_secs_f64());
    let bin_tokens = binned::bin_tokens(&summaries, plans.len());
    let planned = binned::metadata(&run.job, &plans, &bin_tokens, totals.clone(), Status::Writing, run.build_info());
    steps::write_metadata(&run.job.out, &planned)?;
    testhook::point("plan");

    let t = Instant::now();
    run.progress.stage("write", plans.iter().map(ChunkPlan::num_chunks).sum(), "chunks");
    let progress = &run.progress;
    let on_chunk = |_: u64, line: &format::ManifestLine| -> Result<()> {
        progress.advance(1, line.bytes(), line.num_tokens());
        Ok(())
    };
    let mut bytes_out = 0;
    for (k, plan) in plans.iter().enumerate() {
        binned::remove_tmp(&run.job, k)?;
        let mut lines = Vec::new();
        for group in plan.groups(0, run.budget_ids(plan.chunk_size)) {
            lines.extend(binned::write_chunks(&run.job, k, plan, group, &run.pool, &run.cancel, &on_chunk)?);
        }
        binned::finish_bin(&run.job, k, plan, &lines)?;
        bytes_out += lines.iter().map(|l| l.bytes()).sum::<u64>();
    }
    run.progress.end();
    run.timings.insert("write_s", t.elapsed().as_secs_f64());
    let mut meta = binned::metadata(&run.job, &plans, &bin_tokens, totals, Status::Complete, run.build_info());
    meta.bytes_out = Some(bytes_out);
    steps::write_metadata(&run.job.out, &meta)?;
    testhook::point("complete");
    Ok(meta)
}

/// Stage 1 over every file (those a killed run finished are kept), then the stitched tails.
fn run_stage1(run: &mut Run<'_>) -> Result<Vec<format::FileSummary>> {
    let t = Instant::now();
    let nfiles = run.nfiles();
    let done = (0..nfiles).filter(|&f| stage1::summary_path(&run.job.work, f).exists()).count();
    run.progress.stage("tokenize", nfiles as u64, "files");
    run.progress.advance(done as u64, 0, 0);
    let files: Vec<usize> = (0..nfiles).collect();
    let inputs = &run.job.recipe.inputs;
    let progress = &run.progress;
    let mut summaries = steps::stage1_files(&run.job, &run.cfg, &files, &run.pool, &run.cancel, |file, s| {
        progress.advance(1, inputs[file].bytes, s.num_tokens);
        Ok(())
    })?;
    if let Some(s) = steps::stitch(&run.job, &run.cfg)? {
        summaries.push(s);
    }
    run.timings.insert("tokenize_s", t.elapsed().as_secs_f64());
    run.check_cancel()?;
    Ok(summaries)
}

fn build_info(threads: usize, timings: &BTreeMap<&str, f64>, t0: Instant) -> Value {
    json!({
        "engine": "local",
        "threads": threads,
        "host": crate::storage::lease::hostname(),
        "durations": timings,
        "total_s": t0.elapsed().as_secs_f64(),
        "peak_rss_bytes": peak_rss(),
    })
}

/// Peak resident set size of this process (VmHWM), if the OS tells.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}
