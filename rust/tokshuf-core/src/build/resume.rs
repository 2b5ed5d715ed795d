//! What a build does with an existing output folder (start, resume, confirm or refuse), the
//! work folder's own state, and the progress report behind `tokshuf status`.
//!
//! A build is resumable because every unit of work is published by a rename: a stage-1 file is
//! done when its summary exists, a chunk when its shard exists, the cache when tokshuf.json says
//! "complete". Whatever else a killed run leaves (temporary `*.tmp.TAG` files, a half-removed
//! work folder) is removed by the next run. The work folder also records each input's size and
//! modification time when the build started, so an input edited in place (same size) is
//! noticed; tokshuf.json cannot hold mtimes, its bytes must not depend on the machine.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use super::place::remove_tree;
use super::place::Place;
use crate::build::stage1;
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

/// The inputs of `recipe` as they are now (`inputs`: where they are on this machine).
pub fn stamps(recipe: &Recipe, inputs: &[PathBuf]) -> Result<Vec<InputStamp>> {
    recipe
        .inputs
        .iter()
        .zip(inputs)
        .map(|(f, open)| {
            if crate::storage::Location::is_url(&f.path) {
                let bytes = crate::storage::input_size(&f.path)?;
                return Ok(InputStamp { path: f.path.clone(), bytes, mtime_ns: 0 });
            }
            let md = std::fs::metadata(open).map_err(|e| Error::io(open, e))?;
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

/// Decide what to do with the output (a folder, or a prefix in an object store), clearing it
/// when starting over. `inputs`: where the recipe's input files are on this machine.
pub fn prepare(out: &Place, work: &Place, recipe: &Recipe, inputs: &[PathBuf], overwrite: bool) -> Result<Start> {
    if let Some(dir) = out.dir() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let entries = out.names()?;
    let foreign: Vec<&String> = entries.iter().filter(|n| !is_ours(n)).take(3).collect();
    if !foreign.is_empty() {
        return Err(Error::OutputExists(format!(
            "{out}: output folder holds files tokshuf did not write ({foreign:?}); choose an empty or new folder"
        )));
    }
    let existing: Option<Metadata> = match out.read_json::<Metadata>(META_NAME) {
        Ok(m) => m,
        Err(_) if overwrite => None,
        Err(e) => return Err(e),
    };
    let work_state: Option<WorkState> = work.read_json(WORK_STATE).ok().flatten();
    let old: Option<Recipe> = match &existing {
        Some(m) => m.typed_recipe(),
        None => work_state.as_ref().map(|w| w.recipe.clone()),
    };
    let Some(old) = old else {
        // No recipe anywhere: an empty folder, or a build killed before its first metadata
        // (left only temporary files or a work folder without state). Shards without metadata
        // are another matter: they may be someone's data.
        if !overwrite && (existing.is_some() || entries.iter().any(|n| is_data(n))) {
            return Err(Error::OutputExists(format!(
                "{out}: holds cache files but no readable tokshuf.json; pass overwrite=True (--overwrite) to start over"
            )));
        }
        clear(out, work, &entries)?;
        return Ok(Start::Fresh);
    };
    if overwrite {
        clear(out, work, &entries)?;
        return Ok(Start::Fresh);
    }
    if &old != recipe {
        return Err(Error::OutputExists(format!(
            "{out}: holds a build with other inputs or options ({}); pass overwrite=True (--overwrite) to start over",
            old.differences(recipe).join("; ")
        )));
    }
    if let Some(m) = existing.as_ref().filter(|m| m.status == Status::Complete) {
        // Trusted as a reader would trust it: a tokshuf.json that says complete too early
        // (written by hand, or copied) must not end the build nor cost its work folder.
        if let Some(dir) = out.dir() {
            let opened = if recipe.packing.is_unpacked() {
                crate::read::unpacked::Unpacked::open(dir, true).map(drop)
            } else {
                // And every shard's size, which a reader checks only as it first reads one.
                crate::read::cache::Cache::open_with(dir, true).and_then(|cache| {
                    (0..cache.sizes().len() as u64).try_for_each(|c| cache.entry(c).map_or(Ok(()), |e| cache.check_chunk(c, &e)))
                })
            };
            opened.map_err(|e| {
                Error::corrupt(
                    dir.join(META_NAME),
                    format!("says complete, but the cache is not ({e}); pass overwrite=True (--overwrite) to build it again"),
                )
            })?;
        }
        // A run killed after publishing the cache may have left its work folder or temporaries.
        work.remove_all()?;
        remove_tmp(out, &entries)?;
        remove_unused_work(out, work, &entries)?;
        return Ok(Start::Complete(Box::new(m.clone())));
    }
    let Some(w) = &work_state else {
        // The work folder's record is gone, unreadable or elsewhere (`local_cell_dir` given
        // or dropped): nothing tells whether an input was edited in place since the killed
        // run, so its shards are not trusted. Stage 1 starts over anyway, without spills.
        clear(out, work, &entries)?;
        return Ok(Start::Fresh);
    };
    let changed = changed_inputs(w, recipe, inputs)?;
    if !changed.is_empty() {
        return Err(Error::OutputExists(format!(
            "{out}: input files changed since this unfinished build started ({}); pass overwrite=True (--overwrite) to start over",
            changed.join("; ")
        )));
    }
    // Temporary files of the killed run: every writer has its own name, so none is reused.
    remove_tmp(out, &entries)?;
    remove_unused_work(out, work, &entries)?;
    check_spills(work)?;
    Ok(Start::Resume)
}

/// Stage 1 files of a killed run whose spill (or positions file) no longer has the checksum it
/// was written with lose their summary, so this run tokenizes them again: what stage 2 copies
/// into shards, and hashes, must be what stage 1 wrote. Spills in an object store are not
/// read back here (the store checks what it was sent). Returns the files redone.
pub fn check_spills(work: &Place) -> Result<Vec<usize>> {
    let Some(dir) = work.dir() else { return Ok(Vec::new()) };
    let mut redo = Vec::new();
    for name in work.names()? {
        let Some(file) = name.strip_prefix('f').and_then(|n| n.strip_suffix(".json")).and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        let path = dir.join(&name);
        let intact = match work.read_json::<format::FileSummary>(&name) {
            Ok(Some(s)) => match s.spill_crc32 {
                Some(crc) => {
                    let pos = (0..s.pos_crc32.len()).map(|k| stage1::pos_path(dir, file, k));
                    crc32_of(&stage1::spill_path(dir, file)) == Some(crc) && pos.zip(&s.pos_crc32).all(|(p, &c)| crc32_of(&p) == Some(c))
                }
                None => true, // written before spills had checksums
            },
            Ok(None) | Err(_) => false,
        };
        if !intact {
            // The summary first: without it the file is not done, whatever else is left.
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            redo.push(file);
        }
    }
    Ok(redo)
}

/// CRC-32 of a file's bytes, or None when it cannot be read.
fn crc32_of(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(h.finalize()),
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// A work folder inside the output that this run does not use: a killed run's that had none
/// of `local_cell_dir`, resumed with one. Its spills are not read from there, so it goes.
fn remove_unused_work(out: &Place, work: &Place, entries: &[String]) -> Result<()> {
    if entries.iter().any(|n| n == WORK_NAME) && out.dir().map(|d| d.join(WORK_NAME)).as_deref() != work.dir() {
        out.remove(WORK_NAME)?;
    }
    Ok(())
}

/// Remove the temporary files (`format::is_tmp`) among `entries` of `place`.
fn remove_tmp(place: &Place, entries: &[String]) -> Result<()> {
    for name in entries.iter().filter(|n| format::is_tmp(n)) {
        place.remove(name)?;
    }
    Ok(())
}

/// Inputs of the unfinished build `w` whose size or mtime differ now (`inputs`: where they are).
fn changed_inputs(w: &WorkState, recipe: &Recipe, inputs: &[PathBuf]) -> Result<Vec<String>> {
    let now = stamps(recipe, inputs)?;
    Ok(w.inputs
        .iter()
        .zip(&now)
        .zip(inputs)
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
fn clear(out: &Place, work: &Place, entries: &[String]) -> Result<()> {
    // The lock file is the running build's own: removing it would let a second build in.
    for name in entries.iter().filter(|n| *n != crate::format::LOCK_NAME) {
        out.remove(name)?;
    }
    work.remove_all()
}

/// Create the work folder for `recipe`, or keep it if it already belongs to it (less the
/// temporary files of a killed run). A work folder of another recipe (possible under
/// `local_cell_dir`) is stale and cleared. `inputs`: where the input files are. `durable`:
/// fsync the record; without it (one machine, whose spills are not synced either) a record a
/// power cut left unreadable makes the next run start over (`prepare`).
pub fn init_work(work: &Place, recipe: &Recipe, inputs: &[PathBuf], durable: bool) -> Result<()> {
    if let Some(w) = work.read_json::<WorkState>(WORK_STATE).ok().flatten() {
        if &w.recipe == recipe {
            return remove_tmp(work, &work.names()?);
        }
    }
    work.remove_all()?;
    if let Some(dir) = work.dir() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let state = WorkState { recipe: recipe.clone(), inputs: stamps(recipe, inputs)? };
    match work.dir() {
        Some(dir) if !durable => format::write_atomic_synced_if(&dir.join(WORK_STATE), &format::to_json_bytes(&state), false),
        _ => work.write(WORK_STATE, &format::to_json_bytes(&state), WORK_STATE),
    }
}

/// Remove the work folder at the end of a build, file by file (a run killed part-way leaves a
/// folder the next run removes), on `pool`'s threads if given: unlinking a spill frees its
/// pages in the page cache, tens of milliseconds for a few hundred MB, which the build's
/// caller waits for.
pub fn remove_work(work: &Path, pool: Option<&rayon::ThreadPool>) -> Result<()> {
    let entries = match std::fs::read_dir(work) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(work, e)),
    };
    let paths = entries.map(|e| e.map(|e| e.path()).map_err(|e| Error::io(work, e))).collect::<Result<Vec<PathBuf>>>()?;
    if let Some((first, rest)) = paths.split_first() {
        remove_tree(first)?;
        crate::testhook::point("cleanup");
        match pool {
            Some(pool) => pool.install(|| rest.par_iter().try_for_each(|p| remove_tree(p)))?,
            None => rest.iter().try_for_each(|p| remove_tree(p))?,
        }
    }
    std::fs::remove_dir(work).map_err(|e| Error::io(work, e))
}

/// Complete lines of manifest.jsonl (a prefix of the final manifest while a build runs).
pub fn manifest_prefix(output: &Path) -> Vec<format::ManifestLine> {
    std::fs::read(output.join(MANIFEST_NAME)).map(|b| super::manifest::prefix(&b)).unwrap_or_default()
}

/// Progress of a build (finished or not) in `output` (a folder or an object-store URL), for
/// `tokshuf status`.
pub fn status(output: &Path, local_cell_dir: Option<&Path>) -> Result<Value> {
    let scratch = local_cell_dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let out = Place::new(output, &scratch)?;
    let work = match &out {
        Place::Dir(p) => Place::Dir(work_dir(p, local_cell_dir)?),
        Place::Store { .. } => out.child(WORK_NAME),
    };
    let (meta, recipe): (Option<Metadata>, Recipe) = match out.read_json::<Metadata>(META_NAME)? {
        Some(m) => {
            let r = m.typed_recipe().ok_or_else(|| Error::corrupt(out.location(META_NAME).to_string(), "no readable recipe"))?;
            (Some(m), r)
        }
        None => match work.read_json::<WorkState>(WORK_STATE).ok().flatten() {
            Some(w) => (None, w.recipe),
            None => return Err(Error::Config(format!("{out}: no tokshuf build here (no {META_NAME})"))),
        },
    };
    let status = meta.as_ref().map_or("starting", |m| m.status.as_str());
    let complete = status == "complete";
    let nfiles = recipe.inputs.len();
    let work_names = if complete { Vec::new() } else { work.names()? };
    let files_done =
        if complete { nfiles } else { (0..nfiles).filter(|&f| work_names.binary_search(&stage1::summary_name(f)).is_ok()).count() };
    let shards = out.names()?.iter().filter(|n| n.starts_with("shard_") && n.ends_with(".tar")).count();
    let stage = match status {
        "starting" | "building" => "tokenize",
        "streaming" => "tokenize and write (streaming)",
        "writing" => "write",
        "complete" => "complete",
        _ => "unknown",
    };
    // Whether a build holds the lock (a folder) or renews the lease (a store) now: a dead build
    // leaves status "building" behind. Unknown (null) for a store without a lease.
    let running = match &out {
        Place::Dir(p) => json!(crate::format::lock::build_state(p) == crate::format::lock::BuildState::Running),
        Place::Store { .. } => match crate::storage::lease::state(&out.location(crate::format::LOCK_NAME)) {
            crate::format::lock::BuildState::Running => json!(true),
            crate::format::lock::BuildState::NotRunning => json!(false),
            crate::format::lock::BuildState::Unknown => Value::Null,
        },
    };
    let listed = super::manifest::prefix(&out.read(MANIFEST_NAME)?.unwrap_or_default()).len();
    Ok(json!({
        "output": out.to_string(),
        "status": status,
        "stage": stage,
        "files_done": files_done,
        "files_total": nfiles,
        "chunks_written": shards,
        "chunks_listed": listed,
        "chunks_planned": meta.as_ref().and_then(|m| m.num_chunks),
        "contexts_planned": meta.as_ref().and_then(|m| m.num_contexts),
        "shuffle": recipe.shuffle,
        "running": running,
        "work_dir": if work_names.is_empty() { Value::Null } else { json!(work.to_string()) },
        // Where it looked: a build given local_cell_dir keeps its work folder there, which only
        // the same local_cell_dir finds.
        "work_looked": work.to_string(),
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
    fn spills_that_lost_their_checksum_are_redone() {
        let dir = tempfile::tempdir().unwrap();
        let work = Place::Dir(dir.path().to_path_buf());
        let (spill, pos) = (b"0123456789abcdef".to_vec(), b"positions of bin 0".to_vec());
        for file in 0..4 {
            std::fs::write(stage1::spill_path(dir.path(), file), &spill).unwrap();
            std::fs::write(stage1::pos_path(dir.path(), file, 0), &pos).unwrap();
            let summary = format::FileSummary {
                spill_crc32: (file != 3).then(|| crc32fast::hash(&spill)),
                pos_crc32: if file == 3 { vec![] } else { vec![crc32fast::hash(&pos)] },
                ..Default::default()
            };
            std::fs::write(stage1::summary_path(dir.path(), file), format::to_json_bytes(&summary)).unwrap();
        }
        std::fs::write(stage1::spill_path(dir.path(), 1), b"0123456789abcdeF").unwrap();
        std::fs::write(stage1::pos_path(dir.path(), 2, 0), b"positions of bin 1").unwrap();
        std::fs::write(stage1::spill_path(dir.path(), 3), b"no checksum: trusted").unwrap();
        std::fs::write(dir.path().join(WORK_STATE), b"{}").unwrap();
        assert_eq!(check_spills(&work).unwrap(), vec![1, 2]);
        let done: Vec<bool> = (0..4).map(|f| stage1::summary_path(dir.path(), f).exists()).collect();
        assert_eq!(done, [true, false, false, true]);
        assert_eq!(check_spills(&work).unwrap(), Vec::<usize>::new(), "a second look finds nothing more");
    }

    #[test]
    fn only_our_names_are_ours() {
        for name in [
            "tokshuf.json",
            "manifest.jsonl",
            ".tokshuf-work",
            "shard_00000003.tar",
            "shard_00000003.tar.tmp",
            "shard_00000003.tar.tmp.0123456789abcdef",
            "tokshuf.json.tmp",
            "manifest.jsonl.tmp.fedcba9876543210",
        ] {
            assert!(is_ours(name), "{name}");
        }
        for name in ["notes.txt", "data.tmp", "shard_1.npy", "tokshuf.jsonx", "notes.txt.tmp.0123456789abcdef", "shard_00000003.tar.tmp.x"]
        {
            assert!(!is_ours(name), "{name}");
        }
    }
}
