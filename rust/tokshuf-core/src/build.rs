//! The build: options -> checks -> stage 1 (tokenize, window) -> plan (cells, chunks) ->
//! stage 2 (shuffle, write shards) -> manifest. Every step is resumable: a file is done when
//! its summary exists, a chunk when its shard exists (both renamed into place after fsync),
//! and the order of everything is a pure function of the recipe, never of timing. What a
//! build does with an existing output folder is decided in `resume.rs`.
//!
//! Cells (DESIGN §5) hold context ids only: the ids of one file's contexts are dense, so a
//! cell is the list of (file, position) pairs that hash to it, in id order, and the context
//! data stays in the per-file spills until stage 2 gathers it into shards. Stage 2 walks the
//! cells in groups that fit the memory budget, so no step holds more than one group of ids.
//!
//! `shuffle=False` builds stream: stage 1 reads its files side by side and each chunk is
//! written as soon as its place in the round-robin order (`stream.rs`) is known, so a reader
//! can follow the cache while it is being built.
//!
//! While a build runs, manifest.jsonl holds a prefix of the final manifest (complete lines
//! only count), and tokshuf.json says how far the build is: "building" (shuffled, stage 1),
//! "streaming" (`shuffle=False`, stage 1), "writing" (the full chunk plan is known:
//! num_chunks, num_contexts, chunk_sizes...), "complete".

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::hash;
use crate::meta::{self, BuildOptions, Dtype, Format, FileSummary, InputFile, ManifestLine, Recipe, Tail, TokenizerInfo};
use crate::progress::Progress;
pub use crate::resume::{MANIFEST_NAME, META_NAME};
use crate::resume::{self, Start};
use crate::shard::{self, ShardWriter};
use crate::stage1::{self, Event, Schedule, Stage1Config};
use crate::stream::{self, Placed, RoundRobin};
use crate::testhook;
use crate::tokenizer::Tokenizer;

/// Default cell size when `num_local_cells` is not given (ids only: 8 bytes each).
pub(crate) const DEFAULT_CELL_CONTEXTS: u64 = 1 << 16;
pub(crate) const FILE_BITS: u32 = 24;
pub(crate) const POS_BITS: u32 = 40;
/// Input files a streaming build reads side by side. Rounds of the chunk order past the first
/// wait until every file has been opened, so corpora of more files stream less smoothly.
const STREAM_WINDOW: usize = 64;
/// Least time between two rewrites of tokshuf.json while a build streams.
const META_EVERY: Duration = Duration::from_secs(1);

#[inline]
pub(crate) fn pack(file: usize, pos: u64) -> u64 {
    ((file as u64) << POS_BITS) | pos
}
#[inline]
fn unpack(id: u64) -> (usize, u64) {
    ((id >> POS_BITS) as usize, id & ((1 << POS_BITS) - 1))
}

/// What every step of one build run shares.
struct Run<'a> {
    opts: &'a BuildOptions,
    recipe: &'a Recipe,
    out: &'a Path,
    work: &'a Path,
    cfg: Arc<Stage1Config>,
    pool: Arc<rayon::ThreadPool>,
    cancel: Arc<AtomicBool>,
    progress: Progress,
    threads: usize,
    t0: Instant,
    timings: BTreeMap<&'static str, f64>,
}

impl Run<'_> {
    fn write_meta(&self, status: &str, stats: Value) -> Result<Value> {
        write_meta(self.out, self.recipe, status, stats, &build_info(self.threads, &self.timings, self.t0))
    }
    fn nfiles(&self) -> usize {
        self.recipe.inputs.len()
    }
    fn paths(&self) -> Vec<PathBuf> {
        self.recipe.inputs.iter().map(|f| PathBuf::from(&f.path)).collect()
    }
    fn shard_spec(&self) -> ShardSpec {
        ShardSpec {
            out: self.out.to_path_buf(),
            format: self.recipe.format,
            dtype: self.recipe.dtype,
            seqlen: self.recipe.seqlen as u64,
            cancel: self.cancel.clone(),
        }
    }
    /// Summary of the stitched tails (written now if a killed run did not finish it).
    fn stitched(&self, summaries: &[FileSummary]) -> Result<Option<FileSummary>> {
        if self.recipe.tail != Tail::Stitch {
            return Ok(None);
        }
        let n = self.nfiles();
        let path = stage1::summary_path(self.work, n);
        if path.exists() {
            return meta::read_json(&path).map(Some);
        }
        let ids: Vec<u32> = summaries.iter().flat_map(|s| s.tail.iter().copied()).collect();
        let s = stage1::write_stitched(&self.cfg, self.work, n, &ids)?;
        testhook::point("stage1.stitched");
        Ok(Some(s))
    }
    fn check_cancel(&self) -> Result<()> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        Ok(())
    }
}

/// Build (or resume, or confirm) a cache. Returns the final tokshuf.json.
pub fn build(opts: &BuildOptions, cancel: Arc<AtomicBool>) -> Result<Value> {
    let t0 = Instant::now();
    testhook::init();
    let tok = Tokenizer::load(&opts.tokenizer, opts.allow_special_tokens, opts.tokenizer_backend)?;
    let recipe = make_recipe(opts, &tok)?;
    let out = &opts.output;
    let work = resume::work_dir(out, opts.local_cell_dir.as_deref())?;
    // Held for the whole run: refuses a second build into the same folder, and tells a reader
    // following this build whether it is still alive (see lock.rs).
    let lock = crate::lock::BuildLock::acquire(out)?;
    let start = match resume::prepare(out, &work, &recipe, opts.overwrite) {
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
        return Ok(meta);
    }
    resume::init_work(&work, &recipe)?;

    let threads = if opts.threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { opts.threads };
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tokshuf-{i}"))
            .build()
            .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))?,
    );
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
    let mut run = Run {
        opts,
        recipe: &recipe,
        out,
        work: &work,
        cfg,
        pool,
        cancel,
        progress: Progress::new(opts.progress),
        threads,
        t0,
        timings: BTreeMap::new(),
    };
    // A resumed build keeps the metadata it has: a reader following the build must never see
    // it go back (say from "writing", with the chunk plan, to "building").
    if !out.join(META_NAME).exists() {
        if recipe.shuffle {
            run.write_meta("building", json!({}))?;
        } else {
            run.write_meta("streaming", json!({ "num_chunks_ready": 0 }))?;
        }
    }
    testhook::point("start");
    let mut manifest = Manifest::open(out, matches!(start, Start::Fresh))?;
    let stats = if recipe.shuffle { build_shuffled(&mut run, &mut manifest)? } else { build_streaming(&mut run, &mut manifest)? };

    // Manifest, then the final metadata: a complete tokshuf.json means a complete cache.
    manifest.finish()?;
    let mut stats = stats;
    stats["bytes_out"] = json!(manifest.lines.iter().map(|m| m.bytes).sum::<u64>());
    let final_meta = run.write_meta("complete", stats)?;
    testhook::point("complete");
    resume::remove_work(&work)?;
    lock.remove()?;
    Ok(final_meta)
}

/// Stage 1 over every file, then the cell plan, then stage 2. Returns the cache's figures.
fn build_shuffled(run: &mut Run<'_>, manifest: &mut Manifest) -> Result<Value> {
    let (recipe, work) = (run.recipe, run.work);
    let t = Instant::now();
    let paths = run.paths();
    let nfiles = paths.len();
    let todo: Vec<usize> = (0..nfiles).filter(|&f| !stage1::summary_path(work, f).exists()).collect();
    run.progress.stage("tokenize", nfiles as u64);
    run.progress.advance((nfiles - todo.len()) as u64, 0, 0);
    let schedule = Schedule { window: 1, notify_every: 0, batch_bytes: stage1::BATCH_BYTES };
    stage1::run(&run.cfg, &paths, &todo, work, &run.pool, &run.cancel, schedule, |ev| {
        if let Event::Done { file, summary, .. } = ev {
            run.progress.advance(1, recipe.inputs[file].bytes, summary.num_tokens);
        }
        Ok(())
    })?;
    let mut summaries: Vec<FileSummary> =
        (0..nfiles).map(|f| meta::read_json(&stage1::summary_path(work, f))).collect::<Result<_>>()?;
    if let Some(s) = run.stitched(&summaries)? {
        summaries.push(s);
    }
    run.timings.insert("tokenize_s", t.elapsed().as_secs_f64());
    run.check_cancel()?;

    // Plan.
    let t = Instant::now();
    let counts: Vec<u64> = summaries.iter().map(|s| s.num_contexts).collect();
    let total: u64 = counts.iter().sum();
    if counts.len() >= 1 << FILE_BITS || counts.iter().any(|&c| c >= 1 << POS_BITS) {
        return Err(Error::Config("too many input files or contexts in one file".into()));
    }
    let cs = recipe.chunk_size as u64;
    let cells = run.opts.num_local_cells.unwrap_or_else(|| total.div_ceil(DEFAULT_CELL_CONTEXTS)).max(1);
    let sizes = cell_sizes(&run.pool, recipe.seed, &counts, cells);
    let chunk_sizes: Vec<u64> = (0..total.div_ceil(cs)).map(|k| cs.min(total - k * cs)).collect();
    let stats = totals(&summaries, recipe, &chunk_sizes, Some(cells));
    run.timings.insert("plan_s", t.elapsed().as_secs_f64());
    run.write_meta("writing", stats.clone())?;
    testhook::point("plan");

    // Stage 2.
    let t = Instant::now();
    let padded: HashMap<u64, u32> = summaries
        .iter()
        .enumerate()
        .flat_map(|(f, s)| s.padded.iter().map(move |&(p, n)| (pack(f, p), n)))
        .collect();
    let spills = Spills::open(work, counts.len(), recipe.seqlen as u64 * recipe.dtype.size() as u64)?;
    let spec = run.shard_spec();
    let listed = manifest.lines.clone();
    let shared_manifest = Mutex::new(&mut *manifest);
    let writer =
        ChunkWriter { spec: &spec, spills: &spills, padded: &padded, listed: &listed, manifest: &shared_manifest, progress: &run.progress };
    run.progress.stage("write", chunk_sizes.len() as u64);
    run.progress.advance(listed.len() as u64, 0, 0);
    let budget_ids = (run.opts.memory_limit / 4 / 8).max(cs * 2);
    let mut carry: Vec<u64> = Vec::new();
    let mut next_chunk = 0u64;
    let mut c0 = 0u64;
    while c0 < cells {
        let mut c1 = c0 + 1;
        let mut n = sizes[c0 as usize];
        while c1 < cells && n + sizes[c1 as usize] <= budget_ids {
            n += sizes[c1 as usize];
            c1 += 1;
        }
        carry.extend(shuffled_cells(&run.pool, recipe.seed, &counts, cells, c0, c1, &sizes[c0 as usize..c1 as usize]));
        let full = (carry.len() as u64 / cs) * cs;
        let upto = if c1 == cells { carry.len() } else { full as usize };
        testhook::point("stage2.group");
        run.pool.install(|| writer.write_chunks(next_chunk, &carry[..upto], cs))?;
        next_chunk += upto.div_ceil(cs as usize) as u64;
        carry.drain(..upto);
        c0 = c1;
    }
    drop(spills);
    run.progress.end();
    run.timings.insert("write_s", t.elapsed().as_secs_f64());
    Ok(stats)
}

/// Stage 1 with chunks written as soon as their place in the round-robin order is known, then
/// the stitched tails' chunks. Returns the cache's figures.
fn build_streaming(run: &mut Run<'_>, manifest: &mut Manifest) -> Result<Value> {
    let nfiles = run.nfiles();
    let (tx, rx) = crossbeam_channel::unbounded();
    let existing: Option<Value> = meta::read_json(&run.out.join(META_NAME)).ok();
    let plan_published = existing.as_ref().and_then(|m| m.get("status")).and_then(Value::as_str) == Some("writing");
    let mut st = Streamer {
        run: &*run,
        manifest,
        rr: RoundRobin::new(nfiles, run.recipe.chunk_size as u64),
        summaries: vec![None; nfiles + 1],
        live: HashMap::new(),
        spec: Arc::new(run.shard_spec()),
        tx,
        rx,
        in_flight: 0,
        last_meta: Instant::now(),
        plan_published,
        tokenize_s: 0.0,
    };
    let t = Instant::now();
    let result = st.stream().and_then(|stats| st.wait_all().map(|_| stats));
    // Whatever happened, no shard task outlives this call (a resumed run would race it).
    st.drain_quietly();
    let tokenize_s = st.tokenize_s;
    drop(st);
    run.progress.end();
    run.timings.insert("tokenize_s", tokenize_s);
    run.timings.insert("write_s", t.elapsed().as_secs_f64() - tokenize_s);
    result
}

struct Streamer<'r, 'a> {
    run: &'r Run<'a>,
    manifest: &'r mut Manifest,
    rr: RoundRobin,
    /// Summaries of finished files (index `nfiles`: the stitched tails).
    summaries: Vec<Option<FileSummary>>,
    /// Spills still being written, by file (finished ones are opened by name).
    live: HashMap<usize, Arc<File>>,
    spec: Arc<ShardSpec>,
    tx: crossbeam_channel::Sender<(u64, Result<ManifestLine>)>,
    rx: crossbeam_channel::Receiver<(u64, Result<ManifestLine>)>,
    in_flight: usize,
    last_meta: Instant,
    /// tokshuf.json already holds the full plan (from a killed run): never write "streaming".
    plan_published: bool,
    tokenize_s: f64,
}

impl Streamer<'_, '_> {
    fn stream(&mut self) -> Result<Value> {
        let run = self.run;
        let (recipe, work) = (run.recipe, run.work);
        let t = Instant::now();
        let nfiles = run.nfiles();
        let cs = recipe.chunk_size as u64;
        // Files a killed run finished have final counts already.
        for f in 0..nfiles {
            let path = stage1::summary_path(work, f);
            if path.exists() {
                let s: FileSummary = meta::read_json(&path)?;
                self.rr.set_final(f, s.num_contexts);
                self.summaries[f] = Some(s);
            }
        }
        let todo: Vec<usize> = (0..nfiles).filter(|&f| self.summaries[f].is_none()).collect();
        run.progress.stage("tokenize", nfiles as u64);
        run.progress.advance((nfiles - todo.len()) as u64, 0, 0);
        self.place()?;
        // Batches of about half a chunk of text (~4 bytes a token), so chunks appear steadily.
        let batch_bytes = (cs * recipe.seqlen as u64 * 2).clamp(64 << 10, stage1::BATCH_BYTES as u64) as usize;
        let schedule = Schedule { window: STREAM_WINDOW.min(todo.len()).max(1), notify_every: cs, batch_bytes };
        stage1::run(&run.cfg, &run.paths(), &todo, work, &run.pool, &run.cancel, schedule, |ev| self.on_event(ev))?;
        run.check_cancel()?;
        let real: Vec<FileSummary> = self.summaries[..nfiles]
            .iter()
            .map(|s| s.clone().ok_or_else(|| Error::Config("stage 1 ended with a file unfinished".into())))
            .collect::<Result<_>>()?;
        let stitched = run.stitched(&real)?;
        self.tokenize_s = t.elapsed().as_secs_f64();

        // Every count is final now: the rest of the order, and the whole plan.
        let counts: Vec<u64> = real.iter().map(|s| s.num_contexts).collect();
        let tail_n = stitched.as_ref().map(|s| s.num_contexts);
        let plan = stream::plan(&counts, tail_n, cs);
        if !self.rr.done() || plan.len() as u64 != self.rr.next_chunk() + tail_n.unwrap_or(0).div_ceil(cs) {
            return Err(Error::Config("internal error: streamed chunk order disagrees with the plan (please report)".into()));
        }
        self.summaries[nfiles] = stitched.clone();
        for p in stream::tail_chunks(nfiles, tail_n.unwrap_or(0), cs, self.rr.next_chunk()) {
            self.submit(p)?;
        }
        let mut all = real;
        all.extend(stitched);
        let chunk_sizes: Vec<u64> = plan.iter().map(|p| p.len).collect();
        let stats = totals(&all, recipe, &chunk_sizes, None);
        run.write_meta("writing", stats.clone())?;
        self.plan_published = true;
        testhook::point("plan");
        run.progress.stage("write", plan.len() as u64);
        run.progress.advance(self.manifest.lines.len() as u64, 0, 0);
        Ok(stats)
    }

    fn on_event(&mut self, ev: Event<'_>) -> Result<()> {
        match ev {
            Event::Contexts { file, count, spill } => {
                self.live.insert(file, spill.clone());
                self.rr.set_known(file, count);
            }
            Event::Done { file, summary, .. } => {
                self.live.remove(&file);
                self.rr.set_final(file, summary.num_contexts);
                self.summaries[file] = Some(summary.clone());
                self.run.progress.advance(1, self.run.recipe.inputs[file].bytes, summary.num_tokens);
            }
            Event::Idle => {}
        }
        self.place()?;
        self.collect(false)?;
        if !self.plan_published && self.last_meta.elapsed() >= META_EVERY {
            self.run.write_meta("streaming", json!({ "num_chunks_ready": self.manifest.lines.len() }))?;
            self.last_meta = Instant::now();
        }
        Ok(())
    }

    fn place(&mut self) -> Result<()> {
        for p in self.rr.advance() {
            self.submit(p)?;
        }
        let rr = &self.rr;
        self.live.retain(|&f, _| !rr.file_done(f));
        Ok(())
    }

    /// Write chunk `p` on the pool (unless a killed run listed it already).
    fn submit(&mut self, p: Placed) -> Result<()> {
        if p.chunk < self.manifest.lines.len() as u64 {
            return Ok(());
        }
        let path = stage1::spill_path(self.run.work, p.file);
        // A finished spill is opened by the task itself: many chunks can be queued at once
        // (a resumed build places all chunks of its finished files together).
        let live = self.live.get(&p.file).cloned();
        let end = p.start + p.len;
        let padding: u64 = self.summaries[p.file]
            .as_ref()
            .map_or(0, |s| s.padded.iter().filter(|&&(pos, _)| pos >= p.start && pos < end).map(|&(_, n)| n as u64).sum());
        let (spec, tx) = (self.spec.clone(), self.tx.clone());
        self.in_flight += 1;
        self.run.pool.spawn(move || {
            let cb = spec.context_bytes();
            let r = match live.map_or_else(|| File::open(&path).map(Arc::new), Ok) {
                Ok(spill) => write_shard(&spec, p.chunk, p.len as usize, padding, |i, buf| {
                    spill.read_exact_at(buf, (p.start + i) * cb).map_err(|e| Error::io(&path, e))
                }),
                Err(e) => Err(Error::io(&path, e)),
            };
            let _ = tx.send((p.chunk, r));
        });
        Ok(())
    }

    /// List finished chunks; with `block`, wait until every chunk in flight is finished.
    fn collect(&mut self, block: bool) -> Result<()> {
        loop {
            let msg = if block && self.in_flight > 0 { self.rx.recv().ok() } else { self.rx.try_recv().ok() };
            let Some((chunk, r)) = msg else { return Ok(()) };
            self.in_flight -= 1;
            let line = r?;
            if self.plan_published {
                self.run.progress.advance(1, line.bytes, line.num_tokens);
            }
            self.manifest.add(chunk, line)?;
        }
    }

    fn wait_all(&mut self) -> Result<()> {
        self.collect(true)
    }

    /// Wait for the chunks in flight after an error, still listing those that were written.
    fn drain_quietly(&mut self) {
        while self.in_flight > 0 {
            let Ok((chunk, r)) = self.rx.recv() else { break };
            self.in_flight -= 1;
            if let Ok(line) = r {
                let _ = self.manifest.add(chunk, line);
            }
        }
    }
}

/// manifest.jsonl, kept a prefix of the final manifest while the build runs: a line is
/// appended, in chunk order, once its chunk and every earlier one are written.
pub(crate) struct Manifest {
    path: PathBuf,
    file: Option<File>,
    pub(crate) lines: Vec<ManifestLine>,
    pending: BTreeMap<u64, ManifestLine>,
}

impl Manifest {
    /// Start the manifest, keeping the lines of a killed run whose shards are there.
    pub(crate) fn open(out: &Path, fresh: bool) -> Result<Self> {
        let path = out.join(MANIFEST_NAME);
        let mut lines = if fresh { Vec::new() } else { resume::manifest_prefix(out) };
        let valid = lines
            .iter()
            .enumerate()
            .take_while(|(k, l)| {
                l.shard == meta::shard_stem(*k as u64)
                    && std::fs::metadata(out.join(format!("{}.tar", l.shard))).is_ok_and(|m| m.len() == l.bytes)
            })
            .count();
        lines.truncate(valid);
        meta::write_atomic_as(&path, &manifest_text(&lines), "manifest.jsonl[prefix]")?;
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| Error::io(&path, e))?;
        Ok(Manifest { path, file: Some(file), lines, pending: BTreeMap::new() })
    }

    pub(crate) fn add(&mut self, chunk: u64, line: ManifestLine) -> Result<()> {
        if chunk < self.lines.len() as u64 {
            return Ok(());
        }
        self.pending.insert(chunk, line);
        let start = self.lines.len();
        while let Some(l) = self.pending.remove(&(self.lines.len() as u64)) {
            self.lines.push(l);
        }
        if self.lines.len() > start {
            let data = manifest_text(&self.lines[start..]);
            if let Some(f) = self.file.as_mut() {
                testhook::charge(data.len()).and_then(|_| f.write_all(&data)).map_err(|e| Error::io(&self.path, e))?;
            }
        }
        Ok(())
    }

    /// The final manifest, written whole (so no torn line of any run can survive).
    pub(crate) fn finish(&mut self) -> Result<()> {
        self.file = None;
        if !self.pending.is_empty() {
            return Err(Error::Config("internal error: chunks missing from the manifest (please report)".into()));
        }
        meta::write_atomic(&self.path, &manifest_text(&self.lines))
    }
}

fn manifest_text(lines: &[ManifestLine]) -> Vec<u8> {
    let mut text = Vec::new();
    for line in lines {
        text.extend_from_slice(serde_json::to_string(line).unwrap_or_default().as_bytes());
        text.push(b'\n');
    }
    text
}

/// What writing any shard of this cache needs.
pub(crate) struct ShardSpec {
    pub(crate) out: PathBuf,
    pub(crate) format: Format,
    pub(crate) dtype: Dtype,
    pub(crate) seqlen: u64,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl ShardSpec {
    pub(crate) fn context_bytes(&self) -> u64 {
        self.seqlen * self.dtype.size() as u64
    }
}

/// Write chunk `chunk` of `n` contexts (`read(i, buf)` fills context i) through a temporary
/// name; a shard a killed run finished is kept and only hashed.
pub(crate) fn write_shard(
    spec: &ShardSpec,
    chunk: u64,
    n: usize,
    padding: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<ManifestLine> {
    if spec.cancel.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    let stem = meta::shard_stem(chunk);
    let path = spec.out.join(format!("{stem}.tar"));
    let num_tokens = n as u64 * spec.seqlen - padding;
    let (bytes, sha256) = if path.exists() {
        shard::file_sha256(&path)?
    } else {
        let tmp = meta::tmp_name(&path);
        let mut write = || -> Result<(u64, String)> {
            let mut w = ShardWriter::create(&tmp, chunk, spec.format, spec.dtype, spec.seqlen)?;
            let mut buf = vec![0u8; spec.context_bytes() as usize];
            for i in 0..n as u64 {
                read(i, &mut buf)?;
                w.append(&buf).map_err(|e| Error::io(&tmp, e))?;
            }
            w.finish().map_err(|e| Error::io(&tmp, e))
        };
        let r = write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        testhook::point("stage2.tmp");
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        testhook::point("stage2.shard");
        r
    };
    Ok(ManifestLine { shard: stem, num_sequences: n as u64, num_tokens, bytes, sha256 })
}

/// Writes the chunks of the shuffled order from the spills.
struct ChunkWriter<'a> {
    spec: &'a ShardSpec,
    spills: &'a Spills,
    padded: &'a HashMap<u64, u32>,
    /// Lines a killed run listed: those chunks are done.
    listed: &'a [ManifestLine],
    manifest: &'a Mutex<&'a mut Manifest>,
    progress: &'a Progress,
}

impl ChunkWriter<'_> {
    /// Write the chunks `first, first+1, ...` holding `ids` in order, in parallel.
    /// Write the chunks `first, first+1, ...` holding `ids` in order, in parallel, listing each
    /// in the manifest as soon as it and all before it are written.
    fn write_chunks(&self, first: u64, ids: &[u64], cs: u64) -> Result<()> {
        ids.par_chunks(cs as usize).enumerate().try_for_each(|(i, c)| self.write_chunk(first + i as u64, c))
    }

    fn write_chunk(&self, chunk: u64, ids: &[u64]) -> Result<()> {
        if chunk < self.listed.len() as u64 {
            return Ok(());
        }
        let padding: u64 = ids.iter().filter_map(|id| self.padded.get(id)).map(|&n| n as u64).sum();
        let mut cache = HashMap::new();
        let line = write_shard(self.spec, chunk, ids.len(), padding, |i, buf| self.spills.read(&mut cache, ids[i as usize], buf))?;
        self.progress.advance(1, line.bytes, line.num_tokens);
        let mut manifest = self.manifest.lock().map_err(|_| Error::Config("internal error: manifest lock poisoned".into()))?;
        manifest.add(chunk, line)
    }
}

pub(crate) fn make_recipe(opts: &BuildOptions, tok: &Tokenizer) -> Result<Recipe> {
    if opts.inputs.is_empty() {
        return Err(Error::Config("no input files".into()));
    }
    if opts.seqlen == 0 || opts.chunk_size == 0 {
        return Err(Error::Config("seqlen and chunk_size must be positive".into()));
    }
    if opts.num_local_cells == Some(0) {
        return Err(Error::Config("num_local_cells must be positive".into()));
    }
    let eot_id = opts.eot_id.or(tok.eot_id).ok_or_else(|| {
        Error::Config(format!("{}: no end-of-text token found (tried <|endoftext|>, <|end_of_text|>, </s>, <eos>); pass eot_id", tok.spec))
    })?;
    let pad_id = opts.pad_id.or(tok.pad_id).unwrap_or(eot_id);
    let bos_id = if opts.bos {
        Some(opts.bos_id.or(tok.bos_id).ok_or_else(|| Error::Config(format!("{}: no BOS token found; pass bos_id", tok.spec)))?)
    } else {
        None
    };
    for (name, id) in [("eot_id", Some(eot_id)), ("pad_id", Some(pad_id)), ("bos_id", bos_id)] {
        if let Some(id) = id {
            if id >= tok.vocab_size {
                return Err(Error::Config(format!("{name} {id} is not an id of {} (vocab size {})", tok.spec, tok.vocab_size)));
            }
        }
    }
    let mut paths: Vec<String> = opts.inputs.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    paths.sort();
    paths.dedup();
    let inputs = paths
        .into_iter()
        .map(|path| {
            let md = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
            if md.is_dir() {
                return Err(Error::io(&path, std::io::Error::other("is a directory, not an input file")));
            }
            if md.is_file() {
                // Fail before hours of work on file 1, not when file 900 turns out unreadable.
                File::open(&path).map_err(|e| Error::io(&path, e))?;
            }
            Ok(InputFile { path, bytes: md.len() })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Recipe {
        tokshuf_version: meta::VERSION.to_string(),
        format_version: meta::FORMAT_VERSION,
        inputs,
        tokenizer: TokenizerInfo { spec: tok.spec.clone(), sha256: tok.sha256.clone(), vocab_size: tok.vocab_size, backend: tok.backend.to_string() },
        seqlen: opts.seqlen,
        chunk_size: opts.chunk_size,
        num_local_cells: opts.num_local_cells,
        seed: opts.seed,
        text_key: opts.text_key.clone(),
        format: opts.format,
        tail: opts.tail,
        eot_id,
        pad_id,
        bos_id,
        allow_special_tokens: opts.allow_special_tokens,
        shuffle: opts.shuffle,
        errors: opts.errors,
        dtype: if tok.vocab_size <= 1 << 16 { Dtype::Uint16 } else { Dtype::Uint32 },
    })
}

pub(crate) fn write_meta(out: &Path, recipe: &Recipe, status: &str, stats: Value, build: &Value) -> Result<Value> {
    let mut v = json!({
        "format_version": meta::FORMAT_VERSION,
        "status": status,
        "tokshuf_version": meta::VERSION,
        "tokenizer": recipe.tokenizer,
        "eot_id": recipe.eot_id,
        "pad_id": recipe.pad_id,
        "bos_id": recipe.bos_id,
        "seqlen": recipe.seqlen,
        "dtype": recipe.dtype,
        "chunk_size": recipe.chunk_size,
        "seed": recipe.seed,
        "tail": recipe.tail,
        "format": recipe.format,
        "shuffle": recipe.shuffle,
        "text_key": recipe.text_key,
        "errors": recipe.errors,
        "inputs": recipe.inputs,
        "recipe": recipe,
        "build": build,
    });
    if let (Some(obj), Value::Object(extra)) = (v.as_object_mut(), stats) {
        obj.extend(extra);
    }
    meta::write_atomic_as(&out.join(META_NAME), &meta::to_json_bytes(&v), &format!("tokshuf.json[{status}]"))?;
    Ok(v)
}

fn build_info(threads: usize, timings: &BTreeMap<&str, f64>, t0: Instant) -> Value {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    json!({
        "engine": "local",
        "threads": threads,
        "host": host,
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

pub(crate) fn cell_sizes(pool: &rayon::ThreadPool, seed: u64, counts: &[u64], cells: u64) -> Vec<u64> {
    pool.install(|| {
        counts
            .par_iter()
            .enumerate()
            .map(|(f, &n)| {
                let mut sizes = vec![0u64; cells as usize];
                for p in 0..n {
                    sizes[(hash::cell_hash(seed, f as u64, p) % cells) as usize] += 1;
                }
                sizes
            })
            .reduce(|| vec![0u64; cells as usize], |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            })
    })
}

/// Contexts of cells `c0..c1`, each cell in id order then Fisher-Yates shuffled, concatenated.
pub(crate) fn shuffled_cells(pool: &rayon::ThreadPool, seed: u64, counts: &[u64], cells: u64, c0: u64, c1: u64, sizes: &[u64]) -> Vec<u64> {
    let mut groups: Vec<Vec<u64>> = sizes.iter().map(|&n| Vec::with_capacity(n as usize)).collect();
    for (f, &n) in counts.iter().enumerate() {
        for p in 0..n {
            let c = hash::cell_hash(seed, f as u64, p) % cells;
            if c >= c0 && c < c1 {
                groups[(c - c0) as usize].push(pack(f, p));
            }
        }
    }
    pool.install(|| {
        groups.par_iter_mut().enumerate().for_each(|(i, g)| hash::fisher_yates(g, &mut hash::cell_rng(seed, c0 + i as u64)));
    });
    groups.concat()
}

pub(crate) fn totals(summaries: &[FileSummary], recipe: &Recipe, chunk_sizes: &[u64], cells: Option<u64>) -> Value {
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let mut examples: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in summaries {
        for (k, v) in &s.skipped {
            *skipped.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &s.skipped_examples {
            let e = examples.entry(k.clone()).or_default();
            e.extend(v.iter().take(5usize.saturating_sub(e.len())).cloned());
        }
    }
    let stitched = recipe.tail == Tail::Stitch;
    let real = &summaries[..summaries.len() - stitched as usize];
    json!({
        "num_chunks": chunk_sizes.len(),
        "num_contexts": chunk_sizes.iter().sum::<u64>(),
        "chunk_sizes": if recipe.shuffle { Value::Null } else { json!(chunk_sizes) },
        "num_local_cells": cells,
        "num_documents": real.iter().map(|s| s.num_documents).sum::<u64>(),
        "num_tokens": real.iter().map(|s| s.num_tokens).sum::<u64>(),
        "num_padding_tokens": summaries.iter().flat_map(|s| s.padded.iter().map(|p| p.1 as u64)).sum::<u64>(),
        "dropped_tokens": real.iter().map(|s| s.dropped_tokens).sum::<u64>(),
        "empty_documents": real.iter().map(|s| s.empty_documents).sum::<u64>(),
        "blank_lines": real.iter().map(|s| s.blank_lines).sum::<u64>(),
        "text_bytes": real.iter().map(|s| s.text_bytes).sum::<u64>(),
        "bytes_in": recipe.inputs.iter().map(|f| f.bytes).sum::<u64>(),
        "skipped": skipped,
        "skipped_examples": examples,
    })
}

/// Spill files of stage 1, read by position. Few files stay open; many are opened per use,
/// so no build needs a raised open-file limit.
pub(crate) struct Spills {
    paths: Vec<PathBuf>,
    open: Option<Vec<File>>,
    context_bytes: u64,
}

const KEEP_OPEN: usize = 256;

impl Spills {
    pub(crate) fn open(work: &Path, n: usize, context_bytes: u64) -> Result<Self> {
        let paths: Vec<PathBuf> = (0..n).map(|f| stage1::spill_path(work, f)).collect();
        let open = if n <= KEEP_OPEN {
            Some(paths.iter().map(|p| File::open(p).map_err(|e| Error::io(p, e))).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        Ok(Spills { paths, open, context_bytes })
    }

    pub(crate) fn read(&self, cache: &mut HashMap<usize, File>, id: u64, buf: &mut [u8]) -> Result<()> {
        let (f, p) = unpack(id);
        let file = match &self.open {
            Some(files) => &files[f],
            None => {
                if cache.len() >= KEEP_OPEN / 4 && !cache.contains_key(&f) {
                    cache.clear();
                }
                match cache.entry(f) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(File::open(&self.paths[f]).map_err(|err| Error::io(&self.paths[f], err))?)
                    }
                }
            }
        };
        file.read_exact_at(buf, p * self.context_bytes).map_err(|e| Error::io(&self.paths[f], e))
    }
}

