//! Stage 1 of input kind "shards" (`--shuffle-only`): tar shards of contexts, a tokshuf
//! cache's or tokshuf-rs's, instead of jsonl to tokenize. Each member (`.npy` or `.json.gz`)
//! is one context, taken as it is; a file's contexts are its members in tar order, so context
//! ids, cells and chunks are those of any build (DESIGN §5) and the reshuffle is exact,
//! deterministic and resumable the same way: a file is done when its spill and summary are in
//! the work folder.
//!
//! Files are read whole by one thread each, side by side on the pool (a cache has many
//! shards; one shard is a few seconds of gunzip at most).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rayon::ThreadPool;

use super::stage1::{FileWriter, Stage1Config};
use crate::build::input;
use crate::error::{Error, Result};
use serde_json::{json, Value};

use crate::format::{self, FileSummary, Recipe, Tail};

/// Read the shards `files` (indices into `paths`) into their spills in `work`. `on_done` hears
/// of each file finished, on the calling thread. The error returned is that of the lowest
/// file that fails, whatever the threads' timing: a failure stops the files after it, the
/// files before it go on.
pub fn run(
    cfg: &Arc<Stage1Config>,
    paths: &[PathBuf],
    files: &[usize],
    work: &Path,
    pool: &ThreadPool,
    cancel: &Arc<AtomicBool>,
    mut on_done: impl FnMut(usize, &FileSummary) -> Result<()>,
) -> Result<()> {
    let first_bad = Arc::new(AtomicUsize::new(usize::MAX));
    let (tx, rx) = crossbeam_channel::unbounded();
    for &file in files {
        let (cfg, path, work, cancel, first_bad, tx) =
            (cfg.clone(), paths[file].clone(), work.to_path_buf(), cancel.clone(), first_bad.clone(), tx.clone());
        pool.spawn(move || {
            let halted = || cancel.load(Ordering::Relaxed) || first_bad.load(Ordering::Relaxed) < file;
            let result = if halted() { Err(Error::Interrupted) } else { read_shard(&cfg, &path, file, &work, &halted) };
            let _ = tx.send((file, result));
        });
    }
    drop(tx);
    let mut worst: Option<(usize, Error)> = None;
    // Every task sends once, so this ends when the last one has: none outlives the call.
    for (file, result) in rx {
        let result = result.and_then(|summary| if worst.is_none() { on_done(file, &summary) } else { Ok(()) });
        if let Err(e) = result {
            first_bad.fetch_min(file, Ordering::Relaxed);
            if worst.as_ref().is_none_or(|(f, _)| file < *f) {
                worst = Some((file, e));
            }
        }
    }
    worst.map_or(Ok(()), |(_, e)| Err(e))
}

/// One shard into the spill and summary of input `file`.
fn read_shard(cfg: &Stage1Config, path: &Path, file: usize, work: &Path, halted: &dyn Fn() -> bool) -> Result<FileSummary> {
    let mut w = FileWriter::create(cfg, work, file, 1 << 20)?;
    let tmp = w.tmp.clone();
    let result = copy_members(cfg, path, file, &mut w, halted).and_then(|_| w.finish(cfg, Tail::Drop, work, file));
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    Ok(result?.0)
}

fn copy_members(cfg: &Stage1Config, path: &Path, file: usize, w: &mut FileWriter, halted: &dyn Fn() -> bool) -> Result<()> {
    let stream = input::open(path, cfg.input_bytes.get(file).copied(), input::BUFFER)?.reader;
    let mut archive = tar::Archive::new(stream);
    let entries = archive.entries().map_err(|e| io_error(path, e, |e| Error::corrupt(path, format!("not a readable tar file: {e}"))))?;
    // A member far larger than a context's encoding is not one: refuse it before reading it.
    let max_member = 16 * cfg.seqlen as u64 + 4096;
    let mut data = Vec::new();
    for (i, entry) in entries.enumerate() {
        if i % 256 == 0 && halted() {
            return Err(Error::Interrupted);
        }
        let mut entry = entry.map_err(|e| io_error(path, e, |e| Error::corrupt(path, format!("not a readable tar file: {e}"))))?;
        let kind = entry.header().entry_type();
        if kind.is_dir() || kind.is_pax_global_extensions() {
            continue; // they hold no context
        }
        let name = entry.path().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let member = |reason: String| Error::corrupt(path, format!("member {} ({name}): {reason}", i + 1));
        if !(kind.is_file() || kind.is_contiguous()) {
            // A link or a device is no context, and skipping it would lose one silently.
            return Err(member(format!("a {kind:?} entry, not a context")));
        }
        if entry.size() > max_member {
            return Err(member(format!("{} bytes: too large for a context of {} ids", entry.size(), cfg.seqlen)));
        }
        data.clear();
        entry.read_to_end(&mut data).map_err(|e| io_error(path, e, |e| member(format!("cannot read: {e}"))))?;
        let ids = decode(&name, &data, max_member).map_err(member)?;
        if ids.len() != cfg.seqlen {
            return Err(Error::Config(format!(
                "{}: member {} ({name}) holds {} ids, not seqlen={}: pass the seqlen the shards were made with",
                path.display(),
                i + 1,
                ids.len(),
                cfg.seqlen
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id >= cfg.vocab_size) {
            return Err(Error::Config(format!(
                "{}: member {} ({name}) holds id {id}, outside the tokenizer's {} ids: pass the tokenizer the shards were made with",
                path.display(),
                i + 1,
                cfg.vocab_size
            )));
        }
        let padding = trailing_padding(&ids, cfg.eot_id, cfg.pad_id);
        let s = &mut w.summary;
        if padding > 0 {
            s.padded.push((s.num_contexts, padding as u32));
        }
        s.num_tokens += (ids.len() - padding) as u64;
        s.num_documents += ids[..ids.len() - padding].iter().filter(|&&id| id == cfg.eot_id).count() as u64;
        w.write_context(cfg, &ids)?;
    }
    Ok(())
}

/// A read failure: the object store's own error if it is one (never taken for a damaged
/// shard), else what `local` makes of it.
fn io_error(path: &Path, e: std::io::Error, local: impl FnOnce(std::io::Error) -> Error) -> Error {
    if crate::storage::remote_error(&e).is_some() {
        return crate::storage::unwrap_io(&crate::storage::Location::Local(path.to_path_buf()), e);
    }
    local(e)
}

/// The ids of one member: a `.npy` array, or a gzipped JSON list (`.json.gz`, open_lm's).
fn decode(name: &str, data: &[u8], max_json: u64) -> std::result::Result<Vec<u32>, String> {
    if name.ends_with(".npy") {
        return format::parse_npy_ids(data);
    }
    if name.ends_with(".json.gz") {
        let mut json = Vec::new();
        flate2::read::MultiGzDecoder::new(data).take(max_json + 1).read_to_end(&mut json).map_err(|e| format!("not a gzip stream: {e}"))?;
        if json.len() as u64 > max_json {
            return Err("too large for a context".into());
        }
        let ids: Vec<u64> = serde_json::from_slice(&json).map_err(|e| format!("not a JSON list of ids: {e}"))?;
        return ids.into_iter().map(|id| u32::try_from(id).map_err(|_| format!("id {id} is above 2^32"))).collect();
    }
    Err("not a context (expected a .npy or .json.gz member)".into())
}

/// Padding ids at the end of a context, by the rule the reader's document boundaries use: the
/// trailing run of `pad` right after an EOT (a run after anything else is text); when
/// `pad == eot`, the first id of that run is the EOT that ends the last document.
fn trailing_padding(ids: &[u32], eot: u32, pad: u32) -> usize {
    let run = ids.iter().rev().take_while(|&&id| id == pad).count();
    if pad == eot {
        run.saturating_sub(1)
    } else if run < ids.len() && ids[ids.len() - run - 1] == eot {
        run
    } else {
        0
    }
}

/// The caches the shards come from, where their tokshuf.json sits beside them: a shard of
/// another tokenizer, context length, end or padding id would be mixed in silently (its ids
/// may all be inside this vocabulary), and the block formats' members are not contexts.
pub fn check_sources(recipe: &Recipe, shards: &[PathBuf]) -> Result<()> {
    let mut folders: Vec<&Path> = shards.iter().filter_map(|p| p.parent()).collect();
    folders.dedup();
    for dir in folders {
        let meta_path = dir.join(format::META_NAME);
        let Some(meta) = std::fs::read(&meta_path).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()) else { continue };
        let theirs = |k: &str| meta.get(k).cloned().unwrap_or(Value::Null);
        let wrong = |what: String| {
            Err(Error::Config(format!("{}: {what}; reshuffle shards with the options they were made with", meta_path.display())))
        };
        let sha = meta.get("tokenizer").and_then(|t| t.get("sha256")).and_then(Value::as_str);
        if sha.is_some_and(|sha| sha != recipe.tokenizer.sha256) {
            let spec = meta.get("tokenizer").and_then(|t| t.get("spec")).and_then(Value::as_str).unwrap_or("?");
            return wrong(format!("the shards were made with tokenizer {spec}, not {}", recipe.tokenizer.spec));
        }
        for (key, ours) in [("seqlen", json!(recipe.seqlen)), ("eot_id", json!(recipe.eot_id)), ("pad_id", json!(recipe.pad_id))] {
            if !theirs(key).is_null() && theirs(key) != ours {
                return wrong(format!("the shards have {key} {}, this build {ours}", theirs(key)));
            }
        }
        if let Some(f) = meta.get("format").and_then(Value::as_str).filter(|f| !matches!(*f, "npy" | "json.gz")) {
            return wrong(format!("the shards are of format {f:?}: a reshuffle reads npy and json.gz members, one context each"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_the_trailing_run_after_the_last_eot() {
        assert_eq!(trailing_padding(&[5, 6, 0, 9, 9], 0, 9), 2);
        assert_eq!(trailing_padding(&[5, 6, 0, 1, 2], 0, 9), 0);
        // After anything but an EOT, or in a context without one, a pad id is text.
        assert_eq!(trailing_padding(&[9, 9, 9], 0, 9), 0);
        assert_eq!(trailing_padding(&[5, 6, 9, 9], 0, 9), 0);
        // pad == eot: the first of the run ends the last document.
        assert_eq!(trailing_padding(&[5, 6, 0, 0, 0], 0, 0), 2);
        assert_eq!(trailing_padding(&[5, 6, 7, 0], 0, 0), 0);
        assert_eq!(trailing_padding(&[0, 0], 0, 0), 1);
    }

    #[test]
    fn members_decode_by_name() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"[1,2,50256]").unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(decode("00000000_00000001_0b5c.json.gz", &gz, 1000).unwrap(), [1, 2, 50256]);
        assert!(decode("x.json.gz", b"[1,2]", 1000).unwrap_err().contains("gzip"));
        assert!(decode("x.json.gz", &gz, 4).unwrap_err().contains("too large"));
        assert!(decode("x.txt", &gz, 1000).unwrap_err().contains(".npy or .json.gz"));
        let mut npy = format::npy_header(format::Dtype::Uint16, 2);
        npy.extend_from_slice(&[3, 0, 4, 0]);
        assert_eq!(decode("a.npy", &npy, 1000).unwrap(), [3, 4]);
    }
}
