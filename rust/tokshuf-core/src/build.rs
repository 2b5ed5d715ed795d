//! The build: options -> checks -> stage 1 (tokenize, window) -> plan (cells, chunks) ->
//! stage 2 (shuffle, write shards) -> manifest. Every step is resumable: a file is done when
//! its summary exists, a chunk when its shard exists (both renamed into place after fsync),
//! and the order of everything is a pure function of the recipe, never of timing.
//!
//! Cells (DESIGN §5) hold context ids only: the ids of one file's contexts are dense, so a
//! cell is the list of (file, position) pairs that hash to it, in id order, and the context
//! data stays in the per-file spills until stage 2 gathers it into shards. Stage 2 walks the
//! cells in groups that fit the memory budget, so no step holds more than one group of ids.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::hash;
use crate::meta::{self, BuildOptions, Dtype, FileSummary, InputFile, ManifestLine, Recipe, Tail, TokenizerInfo};
use crate::progress::Progress;
use crate::shard::{self, ShardWriter};
use crate::stage1::{self, Stage1Config};
use crate::tokenizer::Tokenizer;

pub const META_NAME: &str = "tokshuf.json";
pub const MANIFEST_NAME: &str = "manifest.jsonl";
const WORK_NAME: &str = ".tokshuf-work";
/// Default cell size when `num_local_cells` is not given (ids only: 8 bytes each).
const DEFAULT_CELL_CONTEXTS: u64 = 1 << 16;
const FILE_BITS: u32 = 24;
const POS_BITS: u32 = 40;

#[inline]
fn pack(file: usize, pos: u64) -> u64 {
    ((file as u64) << POS_BITS) | pos
}
#[inline]
fn unpack(id: u64) -> (usize, u64) {
    ((id >> POS_BITS) as usize, id & ((1 << POS_BITS) - 1))
}

/// Build (or resume, or confirm) a cache. Returns the final tokshuf.json.
pub fn build(opts: &BuildOptions, cancel: Arc<AtomicBool>) -> Result<Value> {
    let t0 = Instant::now();
    let progress = Progress::new(opts.progress);
    let tok = Tokenizer::load(&opts.tokenizer, opts.allow_special_tokens)?;
    let recipe = make_recipe(opts, &tok)?;
    let out = &opts.output;
    if let Some(done) = prepare_output(opts, &recipe)? {
        return Ok(done);
    }
    let work = work_dir(opts)?;
    std::fs::create_dir_all(&work).map_err(|e| Error::io(&work, e))?;
    check_work(&work, &recipe)?;

    let threads = if opts.threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { opts.threads };
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tokshuf-{i}"))
            .build()
            .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))?,
    );
    let mut timings = BTreeMap::new();
    write_meta(out, &recipe, "building", json!({}), &build_info(threads, &timings, t0))?;

    // Stage 1.
    let t = Instant::now();
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
    let paths: Vec<PathBuf> = recipe.inputs.iter().map(|f| PathBuf::from(&f.path)).collect();
    let nfiles = paths.len();
    let todo: Vec<usize> = (0..nfiles).filter(|&f| !stage1::summary_path(&work, f).exists()).collect();
    progress.stage("tokenize", nfiles as u64);
    progress.advance((nfiles - todo.len()) as u64, 0, 0);
    stage1::run(&cfg, &paths, &todo, &work, &pool, &cancel, |f, s, _| {
        progress.advance(1, recipe.inputs[f].bytes, s.num_tokens)
    })?;
    let mut summaries: Vec<FileSummary> =
        (0..nfiles).map(|f| meta::read_json(&stage1::summary_path(&work, f))).collect::<Result<_>>()?;
    if recipe.tail == Tail::Stitch {
        let path = stage1::summary_path(&work, nfiles);
        let stitched = if path.exists() {
            meta::read_json(&path)?
        } else {
            let ids: Vec<u32> = summaries.iter().flat_map(|s| s.tail.iter().copied()).collect();
            stage1::write_stitched(&cfg, &work, nfiles, &ids)?
        };
        summaries.push(stitched);
    }
    timings.insert("tokenize_s", t.elapsed().as_secs_f64());
    if cancel.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }

    // Plan.
    let t = Instant::now();
    let counts: Vec<u64> = summaries.iter().map(|s| s.num_contexts).collect();
    let total: u64 = counts.iter().sum();
    if counts.len() >= 1 << FILE_BITS || counts.iter().any(|&c| c >= 1 << POS_BITS) {
        return Err(Error::Config("too many input files or contexts in one file".into()));
    }
    let cs = recipe.chunk_size as u64;
    let plan = if recipe.shuffle {
        let cells = opts.num_local_cells.unwrap_or_else(|| total.div_ceil(DEFAULT_CELL_CONTEXTS)).max(1);
        Plan::Shuffled { cells, sizes: cell_sizes(&pool, recipe.seed, &counts, cells) }
    } else {
        Plan::RoundRobin(round_robin(&counts, cs))
    };
    let chunk_sizes = plan.chunk_sizes(total, cs);
    let stats = totals(&summaries, &recipe, &chunk_sizes, &plan);
    timings.insert("plan_s", t.elapsed().as_secs_f64());
    write_meta(out, &recipe, "writing", stats.clone(), &build_info(threads, &timings, t0))?;

    // Stage 2.
    let t = Instant::now();
    let padded: HashMap<u64, u32> = summaries
        .iter()
        .enumerate()
        .flat_map(|(f, s)| s.padded.iter().map(move |&(p, n)| (pack(f, p), n)))
        .collect();
    let spills = Spills::open(&work, counts.len(), recipe.seqlen as u64 * recipe.dtype.size() as u64)?;
    let writer = ChunkWriter { out, recipe: &recipe, spills: &spills, padded: &padded, cancel: &cancel, progress: &progress };
    progress.stage("write", chunk_sizes.len() as u64);
    let mut manifest: Vec<ManifestLine> = Vec::with_capacity(chunk_sizes.len());
    let budget_ids = (opts.memory_limit / 4 / 8).max(cs * 2);
    match &plan {
        Plan::Shuffled { cells, sizes } => {
            let mut carry: Vec<u64> = Vec::new();
            let mut c0 = 0u64;
            while c0 < *cells {
                let mut c1 = c0 + 1;
                let mut n = sizes[c0 as usize];
                while c1 < *cells && n + sizes[c1 as usize] <= budget_ids {
                    n += sizes[c1 as usize];
                    c1 += 1;
                }
                carry.extend(shuffled_cells(&pool, recipe.seed, &counts, *cells, c0, c1, &sizes[c0 as usize..c1 as usize]));
                let full = (carry.len() as u64 / cs) * cs;
                let last_group = c1 == *cells;
                let upto = if last_group { carry.len() } else { full as usize };
                let first_chunk = manifest.len() as u64;
                manifest.extend(pool.install(|| writer.write_chunks(first_chunk, &carry[..upto], cs))?);
                carry.drain(..upto);
                c0 = c1;
            }
        }
        Plan::RoundRobin(chunks) => {
            let lines = pool.install(|| {
                chunks
                    .par_iter()
                    .enumerate()
                    .map(|(k, &(f, start, len))| {
                        let ids: Vec<u64> = (start..start + len).map(|p| pack(f, p)).collect();
                        writer.write_chunk(k as u64, &ids)
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            manifest.extend(lines);
        }
    }
    progress.end();
    timings.insert("write_s", t.elapsed().as_secs_f64());

    // Manifest, then the final metadata: a complete tokshuf.json means a complete cache.
    let mut text = Vec::new();
    for line in &manifest {
        text.extend_from_slice(serde_json::to_string(line).unwrap_or_default().as_bytes());
        text.push(b'\n');
    }
    meta::write_atomic(&out.join(MANIFEST_NAME), &text)?;
    let mut stats = stats;
    stats["bytes_out"] = json!(manifest.iter().map(|m| m.bytes).sum::<u64>());
    let final_meta = write_meta(out, &recipe, "complete", stats, &build_info(threads, &timings, t0))?;
    drop(spills);
    std::fs::remove_dir_all(&work).map_err(|e| Error::io(&work, e))?;
    Ok(final_meta)
}

fn make_recipe(opts: &BuildOptions, tok: &Tokenizer) -> Result<Recipe> {
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

fn is_ours(name: &str) -> bool {
    name == META_NAME
        || name == MANIFEST_NAME
        || name == WORK_NAME
        || (name.starts_with("shard_") && (name.ends_with(".tar") || name.ends_with(".tar.tmp")))
        || name.ends_with(".tmp")
}

/// Decide what to do with the output folder: start, resume, or report a finished cache.
fn prepare_output(opts: &BuildOptions, recipe: &Recipe) -> Result<Option<Value>> {
    let out = &opts.output;
    if !out.exists() {
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
        return Ok(None);
    }
    let entries: Vec<String> = std::fs::read_dir(out)
        .map_err(|e| Error::io(out, e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    if entries.is_empty() {
        return Ok(None);
    }
    let foreign: Vec<&String> = entries.iter().filter(|n| !is_ours(n)).take(3).collect();
    let meta_path = out.join(META_NAME);
    if !foreign.is_empty() || !meta_path.exists() {
        let what = if foreign.is_empty() { "files of an unknown build".to_string() } else { format!("{foreign:?}") };
        return Err(Error::OutputExists(format!(
            "{}: output folder is not empty and holds no tokshuf build ({what}); choose an empty or new folder",
            out.display()
        )));
    }
    let existing: Value = meta::read_json(&meta_path)?;
    let old: Option<Recipe> = existing.get("recipe").and_then(|r| serde_json::from_value(r.clone()).ok());
    let same = old.as_ref() == Some(recipe);
    if same && existing.get("status").and_then(Value::as_str) == Some("complete") && !opts.overwrite {
        return Ok(Some(existing));
    }
    if !same && !opts.overwrite {
        let diff = old.map(|o| o.differences(recipe).join("; ")).unwrap_or_else(|| "unreadable recipe".into());
        return Err(Error::OutputExists(format!(
            "{}: holds a build with other inputs or options ({diff}); pass overwrite=True (--overwrite) to start over",
            out.display()
        )));
    }
    if opts.overwrite && !(same && existing.get("status").and_then(Value::as_str) != Some("complete")) {
        for name in entries {
            let p = out.join(&name);
            let r = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.map_err(|e| Error::io(&p, e))?;
        }
        if let Ok(w) = work_dir(opts) {
            let _ = std::fs::remove_dir_all(w);
        }
    }
    Ok(None)
}

fn work_dir(opts: &BuildOptions) -> Result<PathBuf> {
    Ok(match &opts.local_cell_dir {
        None => opts.output.join(WORK_NAME),
        Some(dir) => {
            let abs = std::path::absolute(&opts.output).map_err(|e| Error::io(&opts.output, e))?;
            let h = hash::combine(0, abs.to_string_lossy().bytes().fold(0u64, |h, b| hash::combine(h, b as u64)));
            dir.join(format!("tokshuf-work-{h:016x}"))
        }
    })
}

/// The work folder belongs to exactly one recipe; a stale one (other options) is cleared.
fn check_work(work: &Path, recipe: &Recipe) -> Result<()> {
    let path = work.join("recipe.json");
    if path.exists() {
        let old: Option<Recipe> = meta::read_json(&path).ok();
        if old.as_ref() == Some(recipe) {
            return Ok(());
        }
        std::fs::remove_dir_all(work).map_err(|e| Error::io(work, e))?;
        std::fs::create_dir_all(work).map_err(|e| Error::io(work, e))?;
    }
    meta::write_atomic(&path, &meta::to_json_bytes(recipe))
}

fn write_meta(out: &Path, recipe: &Recipe, status: &str, stats: Value, build: &Value) -> Result<Value> {
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
    meta::write_atomic(&out.join(META_NAME), &meta::to_json_bytes(&v))?;
    Ok(v)
}

fn build_info(threads: usize, timings: &BTreeMap<&str, f64>, t0: Instant) -> Value {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    json!({
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

enum Plan {
    Shuffled { cells: u64, sizes: Vec<u64> },
    /// (file, first position, length) of each chunk, in chunk order.
    RoundRobin(Vec<(usize, u64, u64)>),
}

impl Plan {
    fn chunk_sizes(&self, total: u64, cs: u64) -> Vec<u64> {
        match self {
            Plan::Shuffled { .. } => (0..total.div_ceil(cs)).map(|k| cs.min(total - k * cs)).collect(),
            Plan::RoundRobin(chunks) => chunks.iter().map(|c| c.2).collect(),
        }
    }
}

/// Chunk c is the (c div K)-th chunk of file c mod K, skipping files that ran out.
fn round_robin(counts: &[u64], cs: u64) -> Vec<(usize, u64, u64)> {
    let per_file: Vec<u64> = counts.iter().map(|&n| n.div_ceil(cs)).collect();
    let rounds = per_file.iter().copied().max().unwrap_or(0);
    let mut chunks = Vec::new();
    for j in 0..rounds {
        for (f, &n) in counts.iter().enumerate() {
            if j < per_file[f] {
                chunks.push((f, j * cs, cs.min(n - j * cs)));
            }
        }
    }
    chunks
}

fn cell_sizes(pool: &rayon::ThreadPool, seed: u64, counts: &[u64], cells: u64) -> Vec<u64> {
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
fn shuffled_cells(pool: &rayon::ThreadPool, seed: u64, counts: &[u64], cells: u64, c0: u64, c1: u64, sizes: &[u64]) -> Vec<u64> {
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

fn totals(summaries: &[FileSummary], recipe: &Recipe, chunk_sizes: &[u64], plan: &Plan) -> Value {
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
        "num_local_cells": match plan { Plan::Shuffled { cells, .. } => json!(cells), _ => Value::Null },
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
struct Spills {
    paths: Vec<PathBuf>,
    open: Option<Vec<File>>,
    context_bytes: u64,
}

const KEEP_OPEN: usize = 256;

impl Spills {
    fn open(work: &Path, n: usize, context_bytes: u64) -> Result<Self> {
        let paths: Vec<PathBuf> = (0..n).map(|f| stage1::spill_path(work, f)).collect();
        let open = if n <= KEEP_OPEN {
            Some(paths.iter().map(|p| File::open(p).map_err(|e| Error::io(p, e))).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        Ok(Spills { paths, open, context_bytes })
    }

    fn read(&self, cache: &mut HashMap<usize, File>, id: u64, buf: &mut [u8]) -> Result<()> {
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

struct ChunkWriter<'a> {
    out: &'a Path,
    recipe: &'a Recipe,
    spills: &'a Spills,
    padded: &'a HashMap<u64, u32>,
    cancel: &'a AtomicBool,
    progress: &'a Progress,
}

impl ChunkWriter<'_> {
    /// Write the chunks `first, first+1, ...` holding `ids` in order, in parallel.
    fn write_chunks(&self, first: u64, ids: &[u64], cs: u64) -> Result<Vec<ManifestLine>> {
        ids.par_chunks(cs as usize).enumerate().map(|(i, c)| self.write_chunk(first + i as u64, c)).collect()
    }

    fn write_chunk(&self, chunk: u64, ids: &[u64]) -> Result<ManifestLine> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        let stem = meta::shard_stem(chunk);
        let path = self.out.join(format!("{stem}.tar"));
        let seqlen = self.recipe.seqlen as u64;
        let padding: u64 = ids.iter().filter_map(|id| self.padded.get(id)).map(|&n| n as u64).sum();
        let num_tokens = ids.len() as u64 * seqlen - padding;
        let (bytes, sha256) = if path.exists() {
            shard::file_sha256(&path)?
        } else {
            let tmp = meta::tmp_name(&path);
            let mut w = ShardWriter::create(&tmp, chunk, self.recipe.format, self.recipe.dtype, seqlen)?;
            let mut buf = vec![0u8; self.spills.context_bytes as usize];
            let mut cache = HashMap::new();
            for &id in ids {
                self.spills.read(&mut cache, id, &mut buf)?;
                w.append(&buf).map_err(|e| Error::io(&tmp, e))?;
            }
            let r = w.finish().map_err(|e| Error::io(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
            r
        };
        self.progress.advance(1, bytes, num_tokens);
        Ok(ManifestLine { shard: stem, num_sequences: ids.len() as u64, num_tokens, bytes, sha256 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_drops_exhausted_files() {
        // file 0: 3 chunks, file 1: 1 chunk, file 2: 2 chunks (chunk size 2)
        let chunks = round_robin(&[5, 2, 4], 2);
        let files: Vec<usize> = chunks.iter().map(|c| c.0).collect();
        assert_eq!(files, vec![0, 1, 2, 0, 2, 0]);
        assert_eq!(chunks[5], (0, 4, 1));
    }
}
