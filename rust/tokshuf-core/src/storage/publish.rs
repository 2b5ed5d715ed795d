//! Publishing a cache built on local disk to an object store (DESIGN.md section 10):
//! tokshuf.json with status `writing` (the chunk plan), the shards as whole objects with the
//! manifest's prefix uploaded now and then (what a reader following the build may read), the
//! whole manifest, then tokshuf.json with status `complete` last, so a reader never sees a
//! cache that claims to be complete before every part is there.
//! Run again after a failure, it uploads only what is missing: a shard already in the store
//! with the manifest's size is a finished upload (uploads are whole objects), and is skipped.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{put_bytes, put_file, stat, Location};
use crate::error::{Error, Result};

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

    let remote_meta = dest.join(META);
    if let Some(existing) = super::get(&remote_meta)? {
        let existing = read_json(&existing, &remote_meta.to_string())?;
        if recipe(&existing) != recipe(&meta) && !overwrite {
            return Err(Error::OutputExists(format!(
                "{dest}: holds another cache (its tokshuf.json differs); pass overwrite=True to replace it"
            )));
        }
        if recipe(&existing) == recipe(&meta) && existing.get("status").and_then(Value::as_str) == Some("complete") {
            return Ok(Published { uploaded: Vec::new(), skipped: shards });
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
        if overwrite || stat(&target)? != Some(size) {
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

    #[test]
    fn publishes_in_order_and_resumes() {
        let t = tempfile::tempdir().unwrap();
        let local = t.path().join("local");
        fake_cache(&local, &[b"aaaa", b"bbbbbb", b"cc"], 1);
        let dest = Location::Local(t.path().join("dest"));
        std::fs::create_dir_all(t.path().join("dest")).unwrap();
        // An earlier attempt got one shard up.
        std::fs::write(t.path().join("dest/shard_00000001.tar"), b"bbbbbb").unwrap();
        let got = publish(&local, &dest, false).unwrap();
        assert_eq!(got.skipped, vec!["shard_00000001.tar"]);
        assert_eq!(got.uploaded, vec!["shard_00000000.tar", "shard_00000002.tar"]);
        for f in ["shard_00000000.tar", "shard_00000002.tar", MANIFEST, META] {
            assert_eq!(std::fs::read(local.join(f)).unwrap(), std::fs::read(t.path().join("dest").join(f)).unwrap());
        }
        // Complete already: nothing to do.
        let again = publish(&local, &dest, false).unwrap();
        assert!(again.uploaded.is_empty());
        // Another recipe there: refused unless overwrite.
        let other = t.path().join("other");
        fake_cache(&other, &[b"x"], 2);
        assert!(matches!(publish(&other, &dest, false), Err(Error::OutputExists(_))));
        assert_eq!(publish(&other, &dest, true).unwrap().uploaded, vec!["shard_00000000.tar"]);
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
