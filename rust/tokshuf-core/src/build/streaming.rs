//! `shuffle=False` builds stream: stage 1 reads its files side by side and each chunk is
//! written as soon as its place in the round-robin order (`stream`) is known, so a reader can
//! follow the cache while it is built (DESIGN §5, last bullet).

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::manifest::Manifest;
use super::plan::{self, ChunkPlan};
use super::shard::ShardSpec;
use super::stage1::{self, Event, Schedule};
use super::steps;
use super::stream::{self, Placed, RoundRobin};
use super::Run;
use crate::error::{Error, Result};
use crate::format::{self, FileSummary, ManifestLine, Metadata, Status, Totals, META_NAME};
use crate::testhook;

/// Input files a streaming build reads side by side, at most (fewer when their decoders'
/// windows do not fit in half of `memory_limit`). Rounds of the chunk order past the first
/// wait until every file has been opened, so corpora of more files stream less smoothly.
const STREAM_WINDOW: usize = 64;
/// Least time between two rewrites of tokshuf.json while a build streams.
const META_EVERY: Duration = Duration::from_secs(1);

/// Stage 1 with chunks written as soon as their place in the round-robin order is known, then
/// the stitched tails' chunks. Returns the cache's figures.
pub(super) fn build_streaming(run: &mut Run<'_>, manifest: &mut Manifest) -> Result<(ChunkPlan, Totals)> {
    let nfiles = run.nfiles();
    let (tx, rx) = crossbeam_channel::unbounded();
    let existing: Option<Metadata> = format::read_json(&run.job.out.join(META_NAME)).ok();
    let plan_published = existing.is_some_and(|m| m.status == Status::Writing);
    let mut st = Streamer {
        run: &*run,
        manifest,
        rr: RoundRobin::new(nfiles, run.job.recipe.chunk_size as u64),
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

/// A file stage 1 is still writing: its spill, and its contexts that end in padding so far
/// (best fit pads nearly every context, so a chunk's count of real tokens needs them before
/// the file's summary exists).
struct Live {
    spill: Arc<File>,
    padded: Vec<(u64, u32)>,
}

struct Streamer<'r, 'a> {
    run: &'r Run<'a>,
    manifest: &'r mut Manifest,
    rr: RoundRobin,
    /// Summaries of finished files (index `nfiles`: the stitched tails).
    summaries: Vec<Option<FileSummary>>,
    /// Spills still being written, by file (finished ones are opened by name).
    live: HashMap<usize, Live>,
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
    fn stream(&mut self) -> Result<(ChunkPlan, Totals)> {
        let run = self.run;
        let (recipe, work) = (&run.job.recipe, run.job.work.as_path());
        let t = Instant::now();
        let nfiles = run.nfiles();
        let cs = recipe.chunk_size as u64;
        // Files a killed run finished have final counts already.
        for f in 0..nfiles {
            let path = stage1::summary_path(work, f);
            if path.exists() {
                let s: FileSummary = format::read_json(&path)?;
                self.rr.set_final(f, s.num_contexts);
                // Tails stay on disk until `stitch` reads them back.
                self.summaries[f] = Some(s.without_tail());
            }
        }
        let todo: Vec<usize> = (0..nfiles).filter(|&f| self.summaries[f].is_none()).collect();
        run.progress.stage("tokenize", nfiles as u64, "files");
        run.progress.advance((nfiles - todo.len()) as u64, 0, 0);
        self.place()?;
        // Batches of about half a chunk of text (~4 bytes a token), so chunks appear steadily.
        let batch_bytes = (cs * recipe.seqlen as u64 * 2).clamp(64 << 10, stage1::BATCH_BYTES as u64) as usize;
        let window = STREAM_WINDOW.min(todo.len()).max(1);
        // Stage 2 of a streaming build holds no cell ids: the open files' decoders get half the limit.
        let schedule = Schedule { window, notify_every: cs, batch_bytes, open_budget: run.opts.memory_limit() / 2 };
        stage1::run(&run.cfg, &run.job.paths(), &todo, work, &run.pool, &run.cancel, schedule, |ev| self.on_event(ev))?;
        run.check_cancel()?;
        let real: Vec<FileSummary> = self.summaries[..nfiles]
            .iter()
            .map(|s| s.clone().ok_or_else(|| Error::Config("stage 1 ended with a file unfinished".into())))
            .collect::<Result<_>>()?;
        let stitched = steps::stitch(&run.job, &run.cfg)?;
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
        let chunk_plan = ChunkPlan::new(recipe, &all, None, &run.pool)?;
        let totals = plan::totals(&all, recipe, None);
        run.write_planned(&chunk_plan, &totals)?;
        self.plan_published = true;
        testhook::point("plan");
        run.progress.stage("write", plan.len() as u64, "chunks");
        run.progress.advance(self.manifest.lines.len() as u64, 0, 0);
        Ok((chunk_plan, totals))
    }

    fn on_event(&mut self, ev: Event<'_>) -> Result<()> {
        match ev {
            Event::Contexts { file, count, spill, padded } => {
                let live = self.live.entry(file).or_insert_with(|| Live { spill: spill.clone(), padded: Vec::new() });
                live.padded.extend_from_slice(&padded[live.padded.len()..]);
                self.rr.set_known(file, count);
            }
            Event::Done { file, summary, .. } => {
                self.live.remove(&file);
                self.rr.set_final(file, summary.num_contexts);
                self.summaries[file] = Some(summary.clone().without_tail());
                self.run.progress.advance(1, self.run.job.recipe.inputs[file].bytes, summary.num_tokens);
            }
            Event::Idle => {}
        }
        self.place()?;
        self.collect(false)?;
        if !self.plan_published && self.last_meta.elapsed() >= META_EVERY {
            let mut m = self.run.metadata(Status::Streaming);
            m.num_chunks_ready = Some(self.manifest.lines.len() as u64);
            steps::write_metadata(&self.run.job.out, &m)?;
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
        let path = stage1::spill_path(&self.run.job.work, p.file);
        // A finished spill is opened by the task itself: many chunks can be queued at once
        // (a resumed build places all chunks of its finished files together).
        let (start, end) = (p.start, p.start + p.len);
        let (live, padding) = match (self.live.get(&p.file), &self.summaries[p.file]) {
            (Some(l), _) => (Some(l.spill.clone()), steps::padding_in(&l.padded, start, end)),
            (None, s) => (None, s.as_ref().map_or(0, |s| steps::padding_in(&s.padded, start, end))),
        };
        let (spec, tx) = (self.spec.clone(), self.tx.clone());
        self.in_flight += 1;
        self.run.pool.spawn(move || {
            let r = match live.map_or_else(|| File::open(&path).map(Arc::new), Ok) {
                Ok(spill) => steps::write_spill_range(&spec, &path, &spill, padding, p.start, p.len, p.chunk),
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
                self.run.progress.advance(1, line.bytes(), line.num_tokens());
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
