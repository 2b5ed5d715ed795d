//! What a build does with an existing output folder (start, resume, confirm or refuse), the
//! work folder's own state, and the progress report behind `tokshuf status`.
//!
//! A build is resumable because every unit of work is published by a rename: a stage-1 file is
//! done when its summary exists, a chunk when its shard exists, the cache when tokshuf.json says
//! "complete". Whatever else a killed run leaves (`*.tmp` files, a half-removed work folder) is
//! rewritten or removed by the next run. The work folder also records each input's size and
//! modification time when the build started, so an input edited in place (same size) is
//! noticed; tokshuf.json cannot hold mtimes, its bytes must not depend on the machine.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::build::stage1;
use crate::build::steps::Job;
use crate::error::{Error, Result};
use crate::format::{self, is_data, is_ours, Metadata, Recipe, Status, MANIFEST_NAME, META_NAME, WORK_NAME};
use crate::hash;

const WORK_STATE: &str = "recipe.json";

/// What the output folder asks of this build.
pub enum Start {
    /// Nothing of this build exists yet (the folder is empty or was cleared).
    Fresh,
    /// An unfinished build of the same recipe: continue it.
    Resume,
    /// The same build is complete: tokshuf.json.
    Complete(Box<Metadata>),
}

/// The work folder's record of the build it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkState {
    pub recipe: Recipe,
    pub inputs: Vec<InputStamp>,
}

/// An input file as found when the build started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputStamp {
    pub path: String,
    pub bytes: u64,
    pub mtime_ns: u64,
}

/// The inputs of `job` as they are now.
pub fn stamps(job: &Job) -> Result<Vec<InputStamp>> {
    job.recipe
        .inputs
        .iter()
        .zip(job.paths())
        .map(|(f, open)| {
            if crate::storage::Location::is_url(&f.path) {
                let bytes = crate::storage::input_size(&f.path)?;
                return Ok(InputStamp { path: f.path.clone(), bytes, mtime_ns: 0 });
            }
            let md = std::fs::metadata(&open).map_err(|e| Error::io(&open, e))?;
            let mtime_ns = md.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as u64);
            Ok(InputStamp { path: f.path.clone(), bytes: md.len(), mtime_ns })
        })
        .collect()
}

/// The folder for stage-1 spills: inside the output, or a per-output folder under `local_cell_dir`.
pub fn work_dir(output: &Path, local_cell_dir: Option<&Path>) -> Result<PathBuf> {
    Ok(match local_cell_dir {
        None => output.join(WORK_NAME),
        Some(dir) => {
            let abs = std::path::absolute(output).map_err(|e| Error::io(output, e))?;
            let h = hash::combine(0, abs.to_string_lossy().bytes().fold(0u64, |h, b| hash::combine(h, b as u64)));
            dir.join(format!("tokshuf-work-{h:016x}"))
        }
    })
}

fn list(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

fn read_work_state(work: &Path) -> Option<WorkState> {
    format::read_json(&work.join(WORK_STATE)).ok()
}

/// Decide what to do with the output folder of `job`, clearing it when starting over.
pub fn prepare(job: &Job, overwrite: bool) -> Result<Start> {
    let (output, work, recipe) = (job.out.as_path(), job.work.as_path(), &job.recipe);
    if !output.exists() {
        std::fs::create_dir_all(output).map_err(|e| Error::io(output, e))?;
    }
    let entries = list(output)?;
    let foreign: Vec<&String> = entries.iter().filter(|n| !is_ours(n)).take(3).collect();
    if !foreign.is_empty() {
        return Err(Error::OutputExists(format!(
            "{}: output folder holds files tokshuf did not write ({foreign:?}); choose an empty or new folder",
            output.display()
        )));
    }
    let meta_path = output.join(META_NAME);
    let existing: Option<Metadata> = if meta_path.exists() {
        match format::read_json::<Metadata>(&meta_path) {
            Ok(v) => Some(v),
            Err(_) if overwrite => None,
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let work_state = read_work_state(work);
    let old: Option<Recipe> = match &existing {
        Some(m) => m.typed_recipe(),
        None => work_state.as_ref().map(|w| w.recipe.clone()),
    };
    let Some(old) = old else {
        // No recipe anywhere: an empty folder, or a build killed before its first metadata
        // (left only `*.tmp` files or a work folder without state). Shards without metadata
        // are another matter: they may be someone's data.
        if !overwrite && (existing.is_some() || entries.iter().any(|n| is_data(n))) {
            return Err(Error::OutputExists(format!(
                "{}: holds cache files but no readable tokshuf.json; pass overwrite=True (--overwrite) to start over",
                output.display()
            )));
        }
        clear(output, work, &entries)?;
        return Ok(Start::Fresh);
    };
    if overwrite {
        clear(output, work, &entries)?;
        return Ok(Start::Fresh);
    }
    if &old != recipe {
        return Err(Error::OutputExists(format!(
            "{}: holds a build with other inputs or options ({}); pass overwrite=True (--overwrite) to start over",
            output.display(),
            old.differences(recipe).join("; ")
        )));
    }
    if let Some(m) = existing.as_ref().filter(|m| m.status == Status::Complete) {
        // A run killed after publishing the cache may have left its work folder or temporaries.
        remove_tree(work)?;
        for name in entries.iter().filter(|n| n.ends_with(".tmp")) {
            remove_tree(&output.join(name))?;
        }
        return Ok(Start::Complete(Box::new(m.clone())));
    }
    if let Some(w) = &work_state {
        let changed = changed_inputs(w, job)?;
        if !changed.is_empty() {
            return Err(Error::OutputExists(format!(
                "{}: input files changed since this unfinished build started ({}); pass overwrite=True (--overwrite) to start over",
                output.display(),
                changed.join("; ")
            )));
        }
    }
    Ok(Start::Resume)
}

/// Inputs of the unfinished build `w` whose size or mtime differ now (`job` has its recipe).
fn changed_inputs(w: &WorkState, job: &Job) -> Result<Vec<String>> {
    let now = stamps(job)?;
    Ok(w.inputs
        .iter()
        .zip(&now)
        .zip(job.paths())
        .filter(|((a, b), _)| a != b)
        .take(5)
        .map(|((a, b), path)| {
            if a.bytes != b.bytes {
                format!("{}: size {} -> {}", path.display(), a.bytes, b.bytes)
            } else {
                format!("{}: modified (mtime changed)", path.display())
            }
        })
        .collect())
}

/// Remove everything a build wrote (only our names: `prepare` refused foreign files).
fn clear(output: &Path, work: &Path, entries: &[String]) -> Result<()> {
    // The lock file is the running build's own: removing it would let a second build in.
    for name in entries.iter().filter(|n| *n != crate::format::LOCK_NAME) {
        remove_tree(&output.join(name))?;
    }
    remove_tree(work)
}

pub fn remove_tree(p: &Path) -> Result<()> {
    let r = match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
    };
    r.map_err(|e| Error::io(p, e))
}

/// Create the work folder of `job`, or keep it if it already belongs to its recipe. A work
/// folder of another recipe (possible under `local_cell_dir`) is stale and cleared.
pub fn init_work(job: &Job) -> Result<()> {
    let (work, recipe) = (job.work.as_path(), &job.recipe);
    if let Some(w) = read_work_state(work) {
        if &w.recipe == recipe {
            return Ok(());
        }
    }
    remove_tree(work)?;
    std::fs::create_dir_all(work).map_err(|e| Error::io(work, e))?;
    let state = WorkState { recipe: recipe.clone(), inputs: stamps(job)? };
    format::write_atomic(&work.join(WORK_STATE), &format::to_json_bytes(&state))
}

/// Remove the work folder at the end of a build, file by file (a run killed part-way leaves a
/// folder the next run removes).
pub fn remove_work(work: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(work) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(work, e)),
    };
    for (i, entry) in entries.enumerate() {
        remove_tree(&entry.map_err(|e| Error::io(work, e))?.path())?;
        if i == 0 {
            crate::testhook::point("cleanup");
        }
    }
    std::fs::remove_dir(work).map_err(|e| Error::io(work, e))
}

/// Complete lines of manifest.jsonl (a prefix of the final manifest while a build runs).
pub fn manifest_prefix(output: &Path) -> Vec<format::ManifestLine> {
    let Ok(bytes) = std::fs::read(output.join(MANIFEST_NAME)) else { return Vec::new() };
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    bytes[..end].split(|&b| b == b'\n').filter(|l| !l.is_empty()).map_while(|l| serde_json::from_slice(l).ok()).collect()
}

/// Progress of a build (finished or not) in `output`, for `tokshuf status`.
pub fn status(output: &Path, local_cell_dir: Option<&Path>) -> Result<Value> {
    let meta_path = output.join(META_NAME);
    let work = work_dir(output, local_cell_dir)?;
    let (meta, recipe): (Option<Metadata>, Recipe) = if meta_path.exists() {
        let m: Metadata = format::read_json(&meta_path)?;
        let r = m.typed_recipe().ok_or_else(|| Error::corrupt(&meta_path, "no readable recipe"))?;
        (Some(m), r)
    } else if let Some(w) = read_work_state(&work) {
        (None, w.recipe)
    } else {
        return Err(Error::Config(format!("{}: no tokshuf build here (no {META_NAME})", output.display())));
    };
    let status = meta.as_ref().map_or("starting", |m| m.status.as_str());
    let complete = status == "complete";
    let nfiles = recipe.inputs.len();
    let files_done = if complete { nfiles } else { (0..nfiles).filter(|&f| stage1::summary_path(&work, f).exists()).count() };
    let shards = if output.exists() { list(output)?.iter().filter(|n| n.starts_with("shard_") && n.ends_with(".tar")).count() } else { 0 };
    let stage = match status {
        "starting" | "building" => "tokenize",
        "streaming" => "tokenize and write (streaming)",
        "writing" => "write",
        "complete" => "complete",
        _ => "unknown",
    };
    Ok(json!({
        "output": output.display().to_string(),
        "status": status,
        "stage": stage,
        "files_done": files_done,
        "files_total": nfiles,
        "chunks_written": shards,
        "chunks_listed": manifest_prefix(output).len(),
        "chunks_planned": meta.as_ref().and_then(|m| m.num_chunks),
        "contexts_planned": meta.as_ref().and_then(|m| m.num_contexts),
        "shuffle": recipe.shuffle,
        // Whether a build holds the lock now (a dead build leaves status "building" behind).
        "running": crate::format::lock::build_state(output) == crate::format::lock::BuildState::Running,
        "work_dir": if work.exists() { json!(work.display().to_string()) } else { Value::Null },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_prefix_ignores_a_torn_last_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let line =
            |k: u64| format!(r#"{{"shard":"{}","num_sequences":4,"num_tokens":8,"bytes":3072,"sha256":"ab"}}"#, format::shard_stem(k));
        let text = format!("{}\n{}\n{}", line(0), line(1), &line(2)[..20]);
        std::fs::write(dir.path().join(MANIFEST_NAME), text).expect("write");
        let lines = manifest_prefix(dir.path());
        assert_eq!(lines.iter().map(|l| l.shard.as_str()).collect::<Vec<_>>(), ["shard_00000000", "shard_00000001"]);
        assert!(manifest_prefix(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn only_our_names_are_ours() {
        for name in ["tokshuf.json", "manifest.jsonl", ".tokshuf-work", "shard_00000003.tar", "shard_00000003.tar.tmp", "tokshuf.json.tmp"]
        {
            assert!(is_ours(name), "{name}");
        }
        for name in ["notes.txt", "data.tmp", "shard_1.npy", "tokshuf.jsonx"] {
            assert!(!is_ours(name), "{name}");
        }
    }
}
