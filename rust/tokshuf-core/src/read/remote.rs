//! Opening a cache that lives in an object store (DESIGN.md section 10): tokshuf.json and
//! manifest.jsonl are fetched into a local folder named by the URL and the manifest, and the
//! cache is opened there with a `ShardCache` that brings whole shards in before they are
//! mapped, checked against the manifest (size, and sha256 when it has one), within a budget.
//!
//! Following a build into a store (`open_remote_follow`): the folder is named by the URL and
//! the recipe, and holds copies of tokshuf.json and of the manifest's complete lines, brought up
//! to date as the reader waits (`RemoteWatch`); the follow logic (`read::follow`) reads those
//! copies as it reads a local build's files. A chunk can be read once its manifest line is
//! listed (the builder lists a chunk only after its shard is uploaded, and the line gives the
//! size and sha256 the download is checked against). Whether the build runs is its lease's
//! business (`storage::lease`).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cache::{Cache, ChunkEntry};
use super::follow::{self, Opened, Watch};
use super::reader::BatchSpec;
use crate::error::{Error, Result};
use crate::format::lock::BuildState;
use crate::format::{shard_stem, LOCK_NAME, MANIFEST_NAME, META_NAME};
use crate::storage::shard_cache::{cache_dir_for, ShardCache, Want};
use crate::storage::{self, lease, Location};

/// The shards of a remote cache: the local shard cache, and each chunk's shard as its
/// manifest line describes it (lines are added as they are listed while following a build).
pub struct RemoteShards {
    pub cache: ShardCache,
    wants: RwLock<Vec<Want>>,
}

impl RemoteShards {
    fn new(cache: ShardCache) -> Self {
        RemoteShards { cache, wants: RwLock::new(Vec::new()) }
    }

    /// Chunk `c`'s shard, once its manifest line is known.
    pub fn want(&self, c: u64) -> Option<Want> {
        self.wants.read().unwrap_or_else(|e| e.into_inner()).get(c as usize).cloned()
    }

    /// Add the manifest lines `text` (complete lines, the next chunks in order).
    fn add_lines(&self, text: &[u8], what: &Path) -> Result<()> {
        let mut wants = self.wants.write().unwrap_or_else(|e| e.into_inner());
        for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let c = wants.len() as u64;
            let v: Value = serde_json::from_slice(line).map_err(|e| Error::corrupt(what, format!("line {}: {e}", c + 1)))?;
            let Some(size) = v.get("bytes").and_then(Value::as_u64) else {
                return Err(Error::corrupt(
                    what,
                    format!("line {}: a remote cache needs each shard's size (`bytes`) in its manifest", c + 1),
                ));
            };
            let sha256 = v.get("sha256").and_then(Value::as_str).map(str::to_string);
            wants.push(Want { name: format!("{}.tar", shard_stem(c)), size, sha256 });
        }
        Ok(())
    }
}

/// Open the complete cache at `url`, keeping at most `limit` bytes of shards under `cache_dir`
/// and downloading up to `parallel` shards at once.
pub fn open_remote(url: &str, cache_dir: &Path, limit: u64, parallel: usize) -> Result<Cache> {
    let root = Location::parse(url.trim_end_matches('/'))?;
    let need = |name: &str| -> Result<Vec<u8>> {
        let loc = root.join(name);
        storage::get(&loc)?.ok_or_else(|| Error::io(PathBuf::from(loc.to_string()), std::io::Error::from(std::io::ErrorKind::NotFound)))
    };
    let meta = need(META_NAME)?;
    refuse_unpacked(&root, &meta)?;
    let manifest = need(MANIFEST_NAME)?;
    let dir = cache_dir_for(cache_dir, &root.to_string(), &manifest);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    crate::format::write_atomic(&dir.join(MANIFEST_NAME), &manifest)?;
    crate::format::write_atomic(&dir.join(META_NAME), &meta)?;
    let named = |e: Error| e.naming_url(&dir, &root.to_string());
    let mut cache = Cache::open_with(&dir, false).map_err(named)?;
    let shards = RemoteShards::new(ShardCache::new(root.clone(), dir.clone(), limit, parallel)?);
    shards.add_lines(&manifest, &dir.join(MANIFEST_NAME)).map_err(named)?;
    cache.attach_remote(Arc::new(shards));
    Ok(cache)
}

/// Least time between two looks at the store while waiting (each is a few requests).
const SYNC_EVERY: Duration = Duration::from_millis(200);
/// Least time between two looks at the build's lease.
const LEASE_EVERY: Duration = Duration::from_secs(1);

/// A build into an object store, seen through local copies of its tokshuf.json and manifest.
struct RemoteWatch {
    url: Location,
    mirror: PathBuf,
    shards: Arc<RemoteShards>,
    synced: Mutex<Synced>,
}

#[derive(Default)]
struct Synced {
    /// Bytes of the remote manifest copied (complete lines).
    manifest_off: u64,
    last: Option<Instant>,
    lease: Option<(Instant, BuildState)>,
}

impl RemoteWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Synced> {
        self.synced.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watch for RemoteWatch {
    fn root(&self) -> &Path {
        &self.mirror
    }

    fn sync(&self) -> Result<()> {
        let mut st = self.lock();
        if st.last.is_some_and(|t| t.elapsed() < SYNC_EVERY) {
            return Ok(());
        }
        st.last = Some(Instant::now());
        // tokshuf.json first: if it says complete, the manifest read after it is the final one
        // (the builder writes the manifest, then tokshuf.json "complete").
        let Some(meta) = storage::get(&self.url.join(META_NAME))? else { return Ok(()) };
        let mloc = self.url.join(MANIFEST_NAME);
        if let Some(n) = storage::stat(&mloc)?.filter(|&n| n > st.manifest_off) {
            let text = storage::get_range(&mloc, st.manifest_off..n)?;
            let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            if end > 0 {
                let path = self.mirror.join(MANIFEST_NAME);
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::io(&path, e))?;
                // The mirror holds the `manifest_off` bytes synced so far; after a failed
                // append the next sync sends the same lines again.
                crate::format::append_lines(&mut f, st.manifest_off, &text[..end]).map_err(|e| Error::io(&path, e))?;
                self.shards.add_lines(&text[..end], &path).map_err(|e| e.naming_url(&self.mirror, &self.url.to_string()))?;
                st.manifest_off += end as u64;
            }
        }
        crate::format::write_atomic(&self.mirror.join(META_NAME), &meta)
    }

    fn state(&self) -> BuildState {
        let mut st = self.lock();
        match st.lease {
            Some((t, s)) if t.elapsed() < LEASE_EVERY => s,
            _ => {
                let s = lease::state(&self.url.join(LOCK_NAME));
                st.lease = Some((Instant::now(), s));
                s
            }
        }
    }

    fn shard_ready(&self, _cache: &Cache, c: u64, _entry: &ChunkEntry) -> Result<bool> {
        if self.shards.want(c).is_none() {
            self.sync()?;
        }
        Ok(self.shards.want(c).is_some())
    }

    fn name(&self) -> String {
        self.url.to_string()
    }
}

/// Open the cache at `url` while it is being built (`Cache(url, follow=True)`): waits for its
/// tokshuf.json (and, shuffled, its chunk plan) as `read::follow::open` does for a folder. A
/// complete cache opens as `open_remote` does.
pub fn open_remote_follow(
    url: &str,
    cache_dir: &Path,
    limit: u64,
    parallel: usize,
    timeout: Option<Duration>,
    cancel: &AtomicBool,
) -> Result<Cache> {
    let root = Location::parse(url.trim_end_matches('/'))?;
    // The local folder is named by the recipe, known once tokshuf.json is there: shards of
    // another build at the same URL are never mistaken for this one's.
    let meta = wait_for_meta(&root, timeout, cancel)?;
    refuse_unpacked(&root, &meta)?;
    let recipe: Value = serde_json::from_slice::<Value>(&meta).map(|v| v["recipe"].clone()).unwrap_or(Value::Null);
    let dir = cache_dir_for(cache_dir, &root.to_string(), format!("following {recipe}").as_bytes());
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    // Copies from an earlier follow of the same build are rebuilt from the start.
    let _ = std::fs::remove_file(dir.join(MANIFEST_NAME));
    let shards = Arc::new(RemoteShards::new(ShardCache::new(root.clone(), dir.clone(), limit, parallel)?));
    let url_name = root.to_string();
    let watch = RemoteWatch { url: root, mirror: dir.clone(), shards: shards.clone(), synced: Mutex::new(Synced::default()) };
    let opened = follow::open_watched(Arc::new(watch), timeout, cancel).map_err(|e| e.naming_url(&dir, &url_name))?;
    match opened {
        Opened::Complete => open_remote(url, cache_dir, limit, parallel),
        Opened::Following(mut cache) => {
            cache.attach_remote(shards);
            Ok(*cache)
        }
    }
}

/// An unpacked cache (`"packing": "none"`) has a manifest per length bin, which the remote
/// reader does not fetch: say so, rather than that manifest.jsonl is missing.
fn refuse_unpacked(root: &Location, meta: &[u8]) -> Result<()> {
    let packing = serde_json::from_slice::<Value>(meta).ok().and_then(|v| v.get("packing").and_then(Value::as_str).map(str::to_string));
    if packing.as_deref() == Some("none") {
        return Err(Error::Config(format!(
            "{root}: reading an unpacked (packing='none') cache from a store is not supported; copy it to a local folder and open that"
        )));
    }
    Ok(())
}

/// tokshuf.json of the build at `root`, waiting for it to appear. A build not running may be
/// about to start: with a timeout, it is waited for (as `follow::open_watched` does).
fn wait_for_meta(root: &Location, timeout: Option<Duration>, cancel: &AtomicBool) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    loop {
        if let Some(meta) = storage::get(&root.join(META_NAME))? {
            return Ok(meta);
        }
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        if timeout.is_none() && lease::state(&root.join(LOCK_NAME)) == BuildState::NotRunning {
            return Err(follow::not_started(&root.to_string(), META_NAME));
        }
        if timeout.is_some_and(|t| t0.elapsed() >= t) {
            return Err(Error::FollowTimeout(format!(
                "{root}: waited {:.1}s for {META_NAME} (pass a longer timeout)",
                timeout.map_or(0.0, |t| t.as_secs_f64())
            )));
        }
        std::thread::sleep(SYNC_EVERY);
    }
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
        if l.chunk == u64::MAX {
            break; // following a build: not known yet
        }
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
