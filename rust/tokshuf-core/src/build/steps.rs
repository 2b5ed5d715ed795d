//! The build as composable, idempotent steps. The one-machine driver (`build::build`) runs them
//! on a rayon pool; another engine (a cluster) can run the same steps on other machines, since
//! every input is plain data (paths, the recipe, summaries, chunk ranges) and every output is a
//! pure function of those inputs, published by an atomic rename: a step run twice, or
//! elsewhere, writes the same bytes.
//!
//! 1. [`plan`]: options -> recipe (and the loaded tokenizer).
//! 2. [`stage1_files`]: input files -> their spills and summaries in the work folder (jsonl
//!    tokenized by `stage1`, or tar shards of contexts read by `shards`).
//! 3. [`stitch`] (tail "stitch" only): the files' tails -> one more spill and summary.
//! 4. [`ChunkPlan::new`]: the summaries -> which contexts form which chunk.
//! 5. [`stage2_chunks`]: a range of chunks -> their shards in the output, and manifest lines.
//! 6. [`finalize`]: manifest.jsonl, then tokshuf.json with status "complete".

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rayon::prelude::*;
use rayon::ThreadPool;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::cells::pack;
use super::gather::Gather;
use super::manifest::manifest_text;
use super::plan::{self, ChunkPlan};
use super::shard::{write_shard, HashHelpers, ShardSpec, ShardTimes};
use super::shards;
use super::spills::Spills;
use super::stage1::{self, Schedule, Stage1Config};
use super::BuildOptions;
use crate::error::{Error, Result};
use crate::format::{self, FileSummary, InputKind, ManifestLine, Metadata, Recipe, Status, Totals, MANIFEST_NAME, META_NAME};
use crate::testhook;
use crate::tokenize::Tokenizer;

/// What every step of one build needs besides its own arguments.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub recipe: Recipe,
    /// The cache folder.
    pub out: PathBuf,
    /// The work folder of stage 1's spills and summaries (must be shared by the machines that
    /// run stage 1 and stage 2 of the same files).
    pub work: PathBuf,
    /// The folder the recipe's local input paths are relative to, on this machine.
    pub input_root: Option<PathBuf>,
}

impl Job {
    /// Where each input file is, in recipe order (`input_paths`).
    pub fn paths(&self) -> Vec<PathBuf> {
        input_paths(&self.recipe, self.input_root.as_deref())
    }
    fn shard_spec(&self, cancel: Arc<AtomicBool>, times: Arc<ShardTimes>) -> ShardSpec {
        ShardSpec::new(&self.recipe, self.out.clone(), cancel, times)
    }
}

/// Step 1: load the tokenizer and make the recipe; the job of building it into `opts.output`.
pub fn plan(opts: &BuildOptions) -> Result<(Job, Tokenizer)> {
    opts.validate()?;
    let tok = Tokenizer::load_shared(&opts.tokenizer, opts.allow_special_tokens, opts.tokenizer_backend)?;
    Ok((job(opts, &tok)?, tok))
}

/// Where each input file of `recipe` is on this machine, in recipe order: a URL as recorded, a
/// local file under `input_root` (the folder its paths are relative to).
pub fn input_paths(recipe: &Recipe, input_root: Option<&Path>) -> Vec<PathBuf> {
    recipe
        .inputs
        .iter()
        .map(|f| match input_root {
            Some(root) if !crate::storage::Location::is_url(&f.path) => root.join(&f.path),
            _ => PathBuf::from(&f.path),
        })
        .collect()
}

/// The job of building `opts` with `tok` (loaded from `opts.tokenizer`).
pub fn job(opts: &BuildOptions, tok: &Tokenizer) -> Result<Job> {
    let (recipe, input_root) = plan::recipe(opts, tok)?;
    let work = super::resume::work_dir(&opts.output, opts.local_cell_dir.as_deref())?;
    Ok(Job { recipe, out: opts.output.clone(), work, input_root })
}

/// What stage 1 needs of the recipe and tokenizer.
pub fn stage1_config(recipe: &Recipe, tok: &Tokenizer, memory_limit: u64, shared_work: bool) -> Arc<Stage1Config> {
    Arc::new(Stage1Config {
        encoder: tok.encoder.clone(),
        text_key: recipe.text_key.clone(),
        bos_id: recipe.bos_id,
        eot_id: recipe.eot_id,
        pad_id: recipe.pad_id,
        seqlen: recipe.seqlen as usize,
        dtype: recipe.dtype,
        tail: recipe.tail,
        errors: recipe.errors,
        pack_window: recipe.pack_window.map(|w| w as usize),
        bins: recipe.bins.clone(),
        vocab_size: recipe.tokenizer.vocab_size,
        input_names: recipe.inputs.iter().map(|f| f.path.clone()).collect(),
        input_bytes: recipe.inputs.iter().map(|f| f.bytes).collect(),
        max_line: stage1::max_line(memory_limit),
        shared_work,
    })
}

/// The summary of input file `file`, if stage 1 finished it.
pub fn summary(job: &Job, file: usize) -> Result<Option<FileSummary>> {
    let path = stage1::summary_path(&job.work, file);
    if path.exists() {
        format::read_json(&path).map(Some)
    } else {
        Ok(None)
    }
}

/// Step 2: tokenize and window input files `files`, writing their spills and summaries.
/// Files already done are skipped; `on_done` hears of each file finished now (an error from
/// it stops stage 1). Returns the summaries of `files`, in order, without their tails (`stitch` reads them back).
pub fn stage1_files(
    job: &Job,
    cfg: &Arc<Stage1Config>,
    files: &[usize],
    pool: &Arc<ThreadPool>,
    cancel: &Arc<AtomicBool>,
    mut on_done: impl FnMut(usize, &FileSummary) -> Result<()>,
) -> Result<Vec<FileSummary>> {
    std::fs::create_dir_all(&job.work).map_err(|e| Error::io(&job.work, e))?;
    let todo: Vec<usize> = files.iter().copied().filter(|&f| !stage1::summary_path(&job.work, f).exists()).collect();
    let mut fresh = HashMap::new();
    let mut record = |file: usize, summary: &FileSummary| {
        fresh.insert(file, summary.clone().without_tail());
        on_done(file, summary)
    };
    match job.recipe.input_kind {
        InputKind::Shards => shards::run(cfg, &job.paths(), &todo, &job.work, pool, cancel, &mut record)?,
        InputKind::Jsonl => {
            let schedule = Schedule { window: 1, notify_every: 0, batch_bytes: stage1::BATCH_BYTES, open_budget: u64::MAX };
            stage1::run(cfg, &job.paths(), &todo, &job.work, pool, cancel, schedule, |ev| match ev {
                stage1::Event::Done { file, summary, .. } => record(file, summary),
                _ => Ok(()),
            })?;
        }
    }
    files
        .iter()
        .map(|&f| match fresh.remove(&f) {
            Some(s) => Ok(s),
            None => Ok(summary(job, f)?.ok_or_else(|| unfinished(f))?.without_tail()),
        })
        .collect()
}

/// Step 3: with tail "stitch", window the tails of all files as one more file (once: the
/// summary of a stitch already made is returned). Each tail is read back from its file's
/// summary when its turn comes (`stage1_files` returns summaries without them). None for
/// the other tail policies.
pub fn stitch(job: &Job, cfg: &Stage1Config) -> Result<Option<FileSummary>> {
    if !job.recipe.stitches_tails() {
        return Ok(None);
    }
    let n = job.recipe.inputs.len();
    if let Some(s) = summary(job, n)? {
        return Ok(Some(s));
    }
    // Best fit leaves no tails: its last window is packed like any other.
    let files = if cfg.pack_window.is_some() { 0..0 } else { 0..n };
    let tails = files.map(|f| Ok(summary(job, f)?.ok_or_else(|| unfinished(f))?.tail));
    let s = stage1::write_stitched(cfg, &job.work, n, tails)?;
    testhook::point("stage1.stitched");
    Ok(Some(s))
}

pub fn unfinished(file: usize) -> Error {
    Error::Config(format!("stage 1 left file {file} unfinished"))
}

/// How stage 2 runs on this machine: never what it writes.
#[derive(Clone, Debug)]
pub struct Stage2Io {
    /// Contexts each thread gathers from the spills at a time (`budget::Stage2Budget`).
    pub gather_window: usize,
    pub times: Arc<ShardTimes>,
}

/// Step 5: write the shards of chunks `chunks` (of `plan`, from the spills of `summaries`);
/// returns their manifest lines in chunk order. A shard already there is kept (and hashed).
/// `on_chunk` hears of each chunk as it is written, on the pool's threads.
#[allow(clippy::too_many_arguments)]
pub fn stage2_chunks(
    job: &Job,
    plan: &ChunkPlan,
    summaries: &[FileSummary],
    chunks: Range<u64>,
    io: &Stage2Io,
    pool: &ThreadPool,
    cancel: &Arc<AtomicBool>,
    on_chunk: &(dyn Fn(u64, &ManifestLine) -> Result<()> + Sync),
) -> Result<Vec<ManifestLine>> {
    if chunks.is_empty() {
        return Ok(Vec::new());
    }
    let spec =
        ShardSpec { hash_helpers: Some(HashHelpers::new(pool.current_num_threads())), ..job.shard_spec(cancel.clone(), io.times.clone()) };
    let cs = plan.chunk_size;
    let lines = match plan.cells {
        Some(_) => {
            let ids = &plan.ids(job.recipe.seed, chunks.clone(), pool);
            let padded: HashMap<u64, u32> =
                summaries.iter().enumerate().flat_map(|(f, s)| s.padded.iter().map(move |&(p, n)| (pack(f, p), n))).collect();
            let spills = Spills::open(&job.work, plan.counts.len(), spec.context_bytes())?;
            testhook::point("stage2.group");
            pool.install(|| {
                ids.par_chunks(cs as usize)
                    .enumerate()
                    .map(|(i, ids)| {
                        let chunk = chunks.start + i as u64;
                        let padding: u64 = ids.iter().filter_map(|id| padded.get(id)).map(|&n| n as u64).sum();
                        let mut gather = Gather::new(&spills, ids, io.gather_window);
                        let line = write_shard(&spec, chunk, ids.len(), padding, |i, out| gather.read(i as usize, out))?;
                        on_chunk(chunk, &line)?;
                        Ok(line)
                    })
                    .collect::<Result<Vec<_>>>()
            })?
        }
        None => pool.install(|| {
            chunks
                .clone()
                .into_par_iter()
                .map(|chunk| {
                    let p = plan.placed(chunk).ok_or_else(|| Error::Config(format!("chunk {chunk} is not in the plan")))?;
                    let line = write_placed(job, &spec, summaries, p.file, p.start, p.len, chunk)?;
                    on_chunk(chunk, &line)?;
                    Ok(line)
                })
                .collect::<Result<Vec<_>>>()
        })?,
    };
    Ok(lines)
}

/// Write chunk `chunk` from contexts `start..start+len` of one file's spill (streaming order).
pub(crate) fn write_placed(
    job: &Job,
    spec: &ShardSpec,
    summaries: &[FileSummary],
    file: usize,
    start: u64,
    len: u64,
    chunk: u64,
) -> Result<ManifestLine> {
    let path = stage1::spill_path(&job.work, file);
    let spill = File::open(&path).map_err(|e| Error::io(&path, e))?;
    let padding = summaries.get(file).map_or(0, |s| padding_in(&s.padded, start, start + len));
    write_spill_range(spec, &path, &spill, padding, start, len, chunk)
}

/// Padding ids of the contexts `start..end` of one file, from its `padded` list.
pub(crate) fn padding_in(padded: &[(u64, u32)], start: u64, end: u64) -> u64 {
    padded.iter().filter(|&&(pos, _)| pos >= start && pos < end).map(|&(_, n)| n as u64).sum()
}

/// Write chunk `chunk` from contexts `start..start+len` of an open spill.
pub(crate) fn write_spill_range(
    spec: &ShardSpec,
    path: &Path,
    spill: &File,
    padding: u64,
    start: u64,
    len: u64,
    chunk: u64,
) -> Result<ManifestLine> {
    let cb = spec.context_bytes();
    write_shard(spec, chunk, len as usize, padding, |i, buf| spill.read_exact_at(buf, (start + i) * cb).map_err(|e| Error::io(path, e)))
}

/// The figures and plan fields of tokshuf.json from status "writing" on.
pub fn planned_metadata(recipe: &Recipe, plan: &ChunkPlan, totals: Totals, build: Value) -> Metadata {
    let mut m = Metadata::new(recipe, Status::Writing, build);
    m.num_chunks = Some(plan.num_chunks());
    m.num_contexts = Some(plan.num_contexts());
    m.chunk_sizes = Some((!recipe.shuffle).then(|| plan.chunk_sizes()));
    m.totals = Some(totals);
    m
}

/// Publish tokshuf.json (the one file a reader trusts for the state of the build).
pub fn write_metadata(out: &Path, meta: &Metadata) -> Result<()> {
    format::write_atomic_as(&out.join(META_NAME), &meta.to_bytes(), &format!("tokshuf.json[{}]", meta.status.as_str()))
}

/// Step 6: the whole manifest, then tokshuf.json "complete": a complete tokshuf.json means a
/// complete cache. `lines` are every chunk's, in chunk order.
pub fn finalize(job: &Job, plan: &ChunkPlan, totals: Totals, lines: &[ManifestLine], build: Value) -> Result<Metadata> {
    let meta = complete_metadata(&job.recipe, plan, totals, lines, build)?;
    format::write_atomic(&job.out.join(MANIFEST_NAME), &manifest_text(lines))?;
    write_metadata(&job.out, &meta)?;
    testhook::point("complete");
    Ok(meta)
}

/// tokshuf.json "complete" for the manifest `lines` (every chunk's, in chunk order).
pub fn complete_metadata(recipe: &Recipe, plan: &ChunkPlan, totals: Totals, lines: &[ManifestLine], build: Value) -> Result<Metadata> {
    if lines.len() as u64 != plan.num_chunks() || lines.iter().enumerate().any(|(k, l)| l.shard != format::shard_stem(k as u64)) {
        return Err(Error::Config("internal error: chunks missing from the manifest (please report)".into()));
    }
    let mut meta = planned_metadata(recipe, plan, totals, build);
    meta.status = Status::Complete;
    meta.bytes_out = Some(lines.iter().map(|m| m.bytes()).sum());
    Ok(meta)
}
