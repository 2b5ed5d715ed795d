//! Opening a cache that lives in an object store (DESIGN.md section 10): tokshuf.json and
//! manifest.jsonl are fetched into a local folder named by the URL and the manifest, and the
//! cache is opened there with a `ShardCache` that brings whole shards in before they are
//! mapped, checked against the manifest (size, and sha256 when it has one), within a budget.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::cache::Cache;
use super::reader::BatchSpec;
use crate::error::{Error, Result};
use crate::format::{shard_stem, MANIFEST_NAME, META_NAME};
use crate::storage::shard_cache::{cache_dir_for, ShardCache, Want};
use crate::storage::{self, Location};

/// The shard `c` as the manifest line `line` describes it.
fn want(c: u64, line: &Value, bytes: Option<u64>) -> Want {
    Want {
        name: format!("{}.tar", shard_stem(c)),
        size: bytes.unwrap_or(0),
        sha256: line.get("sha256").and_then(Value::as_str).map(str::to_string),
    }
}

/// Open the complete cache at `url`, keeping at most `limit` bytes of shards under `cache_dir`
/// and downloading up to `parallel` shards at once.
pub fn open_remote(url: &str, cache_dir: &Path, limit: u64, parallel: usize) -> Result<Cache> {
    let root = Location::parse(url.trim_end_matches('/'))?;
    let fetch = |name: &str| -> Result<Vec<u8>> {
        let loc = root.join(name);
        let n = storage::head(&loc)?;
        storage::get_range(&loc, 0..n)
    };
    let manifest = fetch(MANIFEST_NAME)?;
    let meta = fetch(META_NAME)?;
    let dir = cache_dir_for(cache_dir, &root.to_string(), &manifest);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    crate::format::write_atomic(&dir.join(MANIFEST_NAME), &manifest)?;
    crate::format::write_atomic(&dir.join(META_NAME), &meta)?;
    let mut cache = Cache::open_with(&dir, false)?;
    let mut wants = Vec::with_capacity(cache.chunks.len());
    for (c, line) in manifest.split(|b| *b == b'\n').filter(|l| !l.is_empty()).enumerate() {
        let v: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
        let entry = cache.chunks.get(c).copied();
        let Some(bytes) = entry.and_then(|e| e.bytes) else {
            return Err(Error::corrupt(
                dir.join(MANIFEST_NAME),
                format!("line {}: a remote cache needs each shard's size (`bytes`) in its manifest", c + 1),
            ));
        };
        wants.push(want(c as u64, &v, Some(bytes)));
    }
    let shards = ShardCache::new(root, dir, limit, parallel)?;
    cache.attach_remote(Arc::new(shards), wants);
    Ok(cache)
}

/// Examples of this rank looked at ahead, and distinct shards asked for, per call.
const AHEAD_EXAMPLES: u64 = 4096;
const AHEAD_SHARDS: usize = 16;

/// Hand each remote cache of `spec` the shards this rank will read next, in the exact order
/// it will first need them (from the order itself, DESIGN.md section 6), starting at the batch
/// at example `first`. A no-op when no cache is remote.
pub fn prefetch_ahead(spec: &BatchSpec, first: u64) {
    if !spec.caches.iter().any(|c| c.is_remote()) {
        return;
    }
    let mut order: Vec<Vec<u64>> = vec![Vec::new(); spec.caches.len()];
    let mut seen = std::collections::HashSet::new();
    let end = spec.source.num_examples().unwrap_or(u64::MAX).min(crate::read::reader::MAX_EXAMPLE);
    let mut i = first.saturating_add(spec.rank);
    for _ in 0..AHEAD_EXAMPLES {
        if i >= end || seen.len() >= AHEAD_SHARDS {
            break;
        }
        let l = spec.source.locate(i);
        if seen.insert((l.component, l.chunk)) {
            if let Some(o) = order.get_mut(l.component) {
                o.push(l.chunk);
            }
        }
        i = i.saturating_add(spec.world_size.max(1));
    }
    for (cache, chunks) in spec.caches.iter().zip(order) {
        cache.prefetch_chunks(&chunks);
    }
}
