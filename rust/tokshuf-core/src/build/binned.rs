//! Unpacked builds (DESIGN §9, `packing="none"`): stage 1 writes every document, cut at
//! `seqlen`, as an example of its own length and notes per length bin where each example is
//! (`stage1::pos_path`). Then each bin is planned, shuffled and chunked on its own exactly as
//! DESIGN §5 does for a whole cache (its examples' ids are (file, position among the file's
//! examples of that bin)), into the sub-cache `CACHE/bin_KK/` with its own manifest.jsonl; its
//! shards hold npy members of their own lengths and a `.idx` sidecar each. One tokshuf.json at
//! the top describes the bins.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rayon::prelude::*;
use rayon::ThreadPool;

use super::manifest::manifest_text;
use super::plan::ChunkPlan;
use super::shard::{write_ragged_shard, HashHelpers, ShardSpec};
use super::spills::BinSpills;
use super::steps::Job;
use crate::error::{Error, Result};
use serde_json::Value;

use crate::format::{self, BinInfo, FileSummary, ManifestLine, Metadata, Status, Totals, MANIFEST_NAME};

/// Bin `k`'s view of the files' summaries: what a chunk plan of that bin reads.
pub fn bin_summaries(summaries: &[FileSummary], k: usize) -> Vec<FileSummary> {
    summaries.iter().map(|s| FileSummary { num_contexts: s.bin_examples.get(k).copied().unwrap_or(0), ..Default::default() }).collect()
}

/// The chunk plan of every bin.
pub fn plans(job: &Job, summaries: &[FileSummary], num_local_cells: Option<u64>, pool: &ThreadPool) -> Result<Vec<ChunkPlan>> {
    let nbins = job.recipe.bins.as_ref().map_or(0, Vec::len);
    (0..nbins).map(|k| ChunkPlan::new(&job.recipe, &bin_summaries(summaries, k), num_local_cells, pool)).collect()
}

/// Write the shards (and sidecars) of chunks `chunks` of bin `k`; their manifest lines in
/// chunk order. A shard already there is kept.
pub fn write_chunks(
    job: &Job,
    k: usize,
    plan: &ChunkPlan,
    chunks: Range<u64>,
    pool: &ThreadPool,
    cancel: &Arc<AtomicBool>,
    on_chunk: &(dyn Fn(u64, &ManifestLine) -> Result<()> + Sync),
) -> Result<Vec<ManifestLine>> {
    if chunks.is_empty() {
        return Ok(Vec::new());
    }
    let out = format::bin_dir(&job.out, k);
    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    let bound = job.recipe.bins.as_ref().and_then(|b| b.get(k)).copied().unwrap_or(job.recipe.seqlen);
    let spec = ShardSpec {
        seqlen: bound as u64,
        block_size: None,
        zstd_level: None,
        hash_helpers: Some(HashHelpers::new(pool.current_num_threads())),
        ..ShardSpec::new(&job.recipe, out, cancel.clone(), Arc::default())
    };
    let ids = plan.ids(job.recipe.seed, chunks.clone(), pool);
    let spills = BinSpills::open(&job.work, plan.counts.len(), k, job.recipe.dtype.size() as u64);
    let sizes = plan.chunk_sizes();
    let starts: Vec<usize> = chunks
        .clone()
        .scan(0usize, |at, c| {
            let s = *at;
            *at += sizes[c as usize] as usize;
            Some(s)
        })
        .collect();
    pool.install(|| {
        chunks
            .clone()
            .zip(starts)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|(chunk, start)| {
                let n = sizes[chunk as usize] as usize;
                let mut open = HashMap::new();
                let line = write_ragged_shard(&spec, chunk, n, |i, buf| spills.read(&mut open, ids[start + i as usize], buf))?;
                on_chunk(chunk, &line)?;
                Ok(line)
            })
            .collect::<Result<Vec<_>>>()
    })
}

/// Remove the temporary files a killed run left in bin `k`'s folder. Only while no writer of
/// that bin runs: the local engine before it writes the bin, the Ray driver once every task is
/// done (its tasks write one bin concurrently, so none of them may clear it).
pub fn remove_tmp(job: &Job, k: usize) -> Result<()> {
    let out = format::bin_dir(&job.out, k);
    let entries = match std::fs::read_dir(&out) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(&out, e)),
    };
    // Each writer has its own temporary name, so none of these is ever reused.
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(format::is_tmp) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// Publish bin `k`'s manifest (every chunk's line, in order).
pub fn finish_bin(job: &Job, k: usize, plan: &ChunkPlan, lines: &[ManifestLine]) -> Result<()> {
    if lines.len() as u64 != plan.num_chunks() || lines.iter().enumerate().any(|(c, l)| l.shard != format::shard_stem(c as u64)) {
        return Err(Error::Config(format!("internal error: chunks missing from the manifest of bin {k} (please report)")));
    }
    let out = format::bin_dir(&job.out, k);
    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    format::write_atomic(&out.join(MANIFEST_NAME), &manifest_text(lines))
}

/// Every bin's token count over all files (tokshuf.json's `bins[k].num_tokens`): what
/// `metadata` needs of the summaries, small enough for the Ray driver to keep in its plan.
pub fn bin_tokens(summaries: &[FileSummary], nbins: usize) -> Vec<u64> {
    (0..nbins).map(|k| summaries.iter().map(|s| s.bin_tokens.get(k).copied().unwrap_or(0)).sum()).collect()
}

/// tokshuf.json of an unpacked build once its bins are planned: the totals over all bins, and
/// one `bins` entry per bin (`bin_tokens`: each bin's tokens).
pub fn metadata(job: &Job, plans: &[ChunkPlan], bin_tokens: &[u64], totals: Totals, status: Status, build: Value) -> Metadata {
    let bounds = job.recipe.bins.clone().unwrap_or_default();
    let mut m = Metadata::new(&job.recipe, status, build);
    m.num_chunks = Some(plans.iter().map(ChunkPlan::num_chunks).sum());
    m.num_contexts = Some(plans.iter().map(ChunkPlan::num_contexts).sum());
    m.chunk_sizes = Some(None);
    m.totals = Some(totals);
    m.bins = Some(
        plans
            .iter()
            .zip(&bounds)
            .enumerate()
            .map(|(k, (plan, &bound))| BinInfo {
                max_len: bound as u64,
                num_chunks: plan.num_chunks(),
                num_examples: plan.num_contexts(),
                num_tokens: bin_tokens.get(k).copied().unwrap_or(0),
            })
            .collect(),
    );
    m
}
