//! Publishing a cache built on local disk to an object store (DESIGN.md section 10):
//! tokshuf.json with status `writing` (the chunk plan), the shards as whole objects with the
//! manifest's prefix uploaded now and then (what a reader following the build may read), the
//! whole manifest, then tokshuf.json with status `complete` last, so a reader never sees a
//! cache that claims to be complete before every part is there.
//! Run again after a failure, it uploads only what is missing: a shard already in the store
//! with the manifest's size is a finished upload (uploads are whole objects), and is skipped.
//! That holds because the "writing" tokshuf.json of a cache goes up only once nothing else of
//! ours is left under the prefix (an overwritten cache's shards have the same sizes), and a
//! lease keeps a second build out while one publishes.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::lease::Lease;
use super::{delete, list, put_bytes, put_file, stat, Location};
use crate::error::{Error, Result};
use crate::format::{is_data, is_ours, LOCK_NAME};

const META: &str = "tokshuf.json";
const MANIFEST: &str = "manifest.jsonl";

/// What a publish did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Published {
    pub uploaded: Vec<String>,
    pub skipped: Vec<String>,
}

/// The recipe part of tokshuf.json: everything but what varies by run or by progress.
fn recipe(meta: &Value) -> Value {
    let mut v = meta.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("build");
        o.remove("status");
    }
    v
}

fn read_json(bytes: &[u8], what: &str) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| Error::corrupt(what, format!("not valid JSON: {e}")))
}

/// Refuse a prefix that holds objects tokshuf does not write or that another build is
/// writing into. Run before a build, so that a mistake in the URL, the bucket or the
/// credentials shows before any work.
pub fn check_output(dest: &Location) -> Result<()> {
    let (names, _) = list_output(dest)?;
    if names.iter().any(|n| n == LOCK_NAME) {
        // Refused if live; else given up at once (a stale lease is a build that died).
        drop(Lease::take(dest.join(LOCK_NAME), &dest.to_string())?);
    }
    Ok(())
}

/// Names directly under `dest` (the first part of each key below it) and every object's
/// location, after refusing a prefix that holds objects tokshuf does not write.
fn list_output(dest: &Location) -> Result<(Vec<String>, Vec<Location>)> {
    let base = format!("{}/", dest.to_string().trim_end_matches('/'));
    let found = list(&base)?;
    let mut names: Vec<String> = found
        .iter()
        .filter_map(|e| e.location.to_string().strip_prefix(&base).map(|k| k.split('/').next().unwrap_or("").to_string()))
        .collect();
    names.sort();
    names.dedup();
    let foreign: Vec<&String> = names.iter().filter(|n| !is_ours(n)).take(3).collect();
    if !foreign.is_empty() {
        return Err(Error::OutputExists(format!(
            "{dest}: holds objects tokshuf did not write ({foreign:?}); choose an empty or new prefix"
        )));
    }
    Ok((names, found.into_iter().map(|e| e.location).collect()))
}

/// Upload the complete local cache `local` to `dest`. A different cache already at `dest`
/// is an `OutputExists` error unless `overwrite`.
pub fn publish(local: &Path, dest: &Location, overwrite: bool) -> Result<Published> {
    let meta_path = local.join(META);
    let meta_bytes = std::fs::read(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
    let meta = read_json(&meta_bytes, &meta_path.to_string_lossy())?;
    if meta.get("status").and_then(Value::as_str) != Some("complete") {
        return Err(Error::Config(format!("{}: the local cache is not complete; finish the build first", local.display())));
    }
    let manifest_path = local.join(MANIFEST);
    let manifest = std::fs::read_to_string(&manifest_path).map_err(|e| Error::io(&manifest_path, e))?;
    let mut shards = Vec::new();
    for (i, line) in manifest.lines().enumerate() {
        let v = read_json(line.as_bytes(), &manifest_path.to_string_lossy())?;
        let expect = format!("shard_{i:08}");
        if v.get("shard").and_then(Value::as_str) != Some(expect.as_str()) {
            return Err(Error::corrupt(&manifest_path, format!("line {} does not name {expect}", i + 1)));
        }
        shards.push(format!("{expect}.tar"));
    }

    // Listed first, so nothing is written into a prefix of foreign objects; the lease
    // refuses another build's live one.
    let (names, found) = list_output(dest)?;
    let lease = Lease::take(dest.join(LOCK_NAME), &dest.to_string())?;
    let remote_meta = dest.join(META);
    let existing = match super::get(&remote_meta)? {
        Some(bytes) => Some(read_json(&bytes, &remote_meta.to_string())?),
        None => None,
    };
    // Same cache: a publish of it was cut short (every shard there is its own), or it is done.
    let resume = match &existing {
        Some(e) if recipe(e) == recipe(&meta) => {
            if e.get("status").and_then(Value::as_str) == Some("complete") {
                lease.release()?;
                return Ok(Published { uploaded: Vec::new(), skipped: shards });
            }
            true
        }
        Some(_) if !overwrite => {
            return Err(Error::OutputExists(format!(
                "{dest}: holds another cache (its tokshuf.json differs); pass overwrite=True to replace it"
            )))
        }
        None if !overwrite && names.iter().any(|n| is_data(n)) => {
            return Err(Error::OutputExists(format!(
                "{dest}: holds cache objects but no readable tokshuf.json; pass overwrite=True to start over"
            )))
        }
        _ => false,
    };
    if !resume {
        // tokshuf.json first, so that no reader takes the old cache for complete meanwhile.
        delete(&remote_meta)?;
        let lock = dest.join(LOCK_NAME);
        for loc in found.iter().filter(|l| **l != lock && **l != remote_meta) {
            delete(loc)?;
        }
    }
    // Say "writing" first, with the chunk plan: a reader that finds the cache now refuses it,
    // or (follow mode) reads each shard once the manifest lists it.
    let mut writing = meta.clone();
    writing["status"] = Value::from("writing");
    put_bytes(serde_json::to_vec_pretty(&writing).unwrap_or_default(), &remote_meta)?;

    let mut out = Published::default();
    let lines: Vec<&str> = manifest.lines().collect();
    let mut last = Instant::now();
    for (i, name) in shards.iter().enumerate() {
        let src = local.join(name);
        let size = std::fs::metadata(&src).map_err(|e| Error::io(&src, e))?.len();
        let target = dest.join(name);
        if !resume || stat(&target)? != Some(size) {
            put_file(&src, &target)?;
            out.uploaded.push(name.clone());
        } else {
            out.skipped.push(name.clone());
        }
        // The manifest's prefix, now and then: the lines of the shards in the store.
        if last.elapsed() >= LIST_EVERY && i + 1 < shards.len() {
            let prefix: String = lines[..=i].iter().map(|l| format!("{l}\n")).collect();
            put_bytes(prefix.into_bytes(), &dest.join(MANIFEST))?;
            last = Instant::now();
        }
    }
    put_file(&manifest_path, &dest.join(MANIFEST))?;
    put_file(&meta_path, &remote_meta)?;
    lease.release()?;
    Ok(out)
}

/// Least time between two uploads of the manifest's prefix while shards go up.
const LIST_EVERY: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_cache(dir: &Path, shards: &[&[u8]], seed: u64) {
        std::fs::create_dir_all(dir).unwrap();
        let mut manifest = String::new();
        for (i, data) in shards.iter().enumerate() {
            std::fs::write(dir.join(format!("shard_{i:08}.tar")), data).unwrap();
            manifest.push_str(&format!("{{\"shard\":\"shard_{i:08}\",\"num_sequences\":1}}\n"));
        }
        std::fs::write(dir.join(MANIFEST), manifest).unwrap();
        let meta = serde_json::json!({"status": "complete", "seed": seed, "build": {"total_s": 1.0}});
        std::fs::write(dir.join(META), serde_json::to_vec(&meta).unwrap()).unwrap();
    }

    fn same_files(a: &Path, b: &Path) {
        let names = |d: &Path| {
            let mut v: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
            v.sort();
            v
        };
        assert_eq!(names(a), names(b));
        for f in names(a) {
            assert_eq!(std::fs::read(a.join(&f)).unwrap(), std::fs::read(b.join(&f)).unwrap(), "{f:?}");
        }
    }

    #[test]
    fn publishes_in_order_and_resumes() {
        let t = tempfile::tempdir().unwrap();
        let local = t.path().join("local");
        fake_cache(&local, &[b"aaaa", b"bbbbbb", b"cc"], 1);
        let d = t.path().join("dest");
        let dest = Location::Local(d.clone());
        // An earlier attempt said "writing" and got one shard up.
        std::fs::create_dir_all(&d).unwrap();
        let mut writing: Value = serde_json::from_slice(&std::fs::read(local.join(META)).unwrap()).unwrap();
        writing["status"] = Value::from("writing");
        std::fs::write(d.join(META), serde_json::to_vec(&writing).unwrap()).unwrap();
        std::fs::write(d.join("shard_00000001.tar"), b"bbbbbb").unwrap();
        let got = publish(&local, &dest, false).unwrap();
        assert_eq!(got.skipped, vec!["shard_00000001.tar"]);
        assert_eq!(got.uploaded, vec!["shard_00000000.tar", "shard_00000002.tar"]);
        same_files(&local, &d); // the lease is gone too
                                // Complete already: nothing to do.
        let again = publish(&local, &dest, false).unwrap();
        assert!(again.uploaded.is_empty());
        // Another recipe there: refused unless overwrite; what it leaves is only the new cache.
        let other = t.path().join("other");
        fake_cache(&other, &[b"x"], 2);
        assert!(matches!(publish(&other, &dest, false), Err(Error::OutputExists(_))));
        assert_eq!(publish(&other, &dest, true).unwrap().uploaded, vec!["shard_00000000.tar"]);
        same_files(&other, &d);
    }

    #[test]
    fn an_overwrite_cut_short_never_keeps_the_old_caches_shards() {
        // The old cache's shards have the sizes of the new one's: a rerun must not take them
        // for uploads of its own.
        let t = tempfile::tempdir().unwrap();
        let (old, new, d) = (t.path().join("old"), t.path().join("new"), t.path().join("dest"));
        fake_cache(&old, &[b"1111", b"2222", b"3333"], 1);
        fake_cache(&new, &[b"aaaa", b"bbbb", b"cccc"], 2);
        let dest = Location::Local(d.clone());
        publish(&old, &dest, false).unwrap();
        // The overwrite's first steps, as a run killed after its first upload leaves them.
        let mut writing: Value = serde_json::from_slice(&std::fs::read(new.join(META)).unwrap()).unwrap();
        writing["status"] = Value::from("writing");
        let cut_short = |d: &Path| {
            std::fs::write(d.join(META), serde_json::to_vec(&writing).unwrap()).unwrap();
            std::fs::write(d.join("shard_00000000.tar"), b"aaaa").unwrap();
        };
        // Killed while clearing: the old tokshuf.json is gone, the old shards are not.
        std::fs::remove_file(d.join(META)).unwrap();
        assert!(matches!(publish(&new, &dest, false), Err(Error::OutputExists(_))));
        publish(&new, &dest, true).unwrap();
        same_files(&new, &d);
        // Killed while uploading, after a full clear: the rerun (even without overwrite) resumes.
        publish(&old, &dest, true).unwrap();
        for f in ["shard_00000001.tar", "shard_00000002.tar", MANIFEST] {
            std::fs::remove_file(d.join(f)).unwrap();
        }
        cut_short(&d);
        let got = publish(&new, &dest, false).unwrap();
        assert_eq!(got.skipped, vec!["shard_00000000.tar"]);
        same_files(&new, &d);
    }

    #[test]
    fn refuses_foreign_objects_and_a_live_lease() {
        let t = tempfile::tempdir().unwrap();
        let (local, d) = (t.path().join("local"), t.path().join("dest"));
        fake_cache(&local, &[b"a"], 1);
        let dest = Location::Local(d.clone());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("notes.txt"), b"mine").unwrap();
        for overwrite in [false, true] {
            assert!(matches!(publish(&local, &dest, overwrite), Err(Error::OutputExists(m)) if m.contains("notes.txt")));
        }
        std::fs::remove_file(d.join("notes.txt")).unwrap();
        // Held by a live process (this one): another build's, as far as the check can tell.
        let held = Lease::take(dest.join(LOCK_NAME), "other build").unwrap();
        assert!(matches!(check_output(&dest), Err(Error::OutputExists(m)) if m.contains("another tokshuf build is writing")));
        drop(held); // given up: stale at once
        publish(&local, &dest, false).unwrap();
        same_files(&local, &d);
    }

    #[test]
    fn refuses_an_unfinished_local_cache() {
        let t = tempfile::tempdir().unwrap();
        let local = t.path().join("local");
        fake_cache(&local, &[b"a"], 1);
        std::fs::write(local.join(META), br#"{"status":"building"}"#).unwrap();
        assert!(matches!(publish(&local, &Location::Local(t.path().join("d")), false), Err(Error::Config(_))));
    }
}
