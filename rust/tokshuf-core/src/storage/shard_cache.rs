//! A local cache of whole shards of a remote cache, within a byte budget (DESIGN.md section 10).
//!
//! The reader knows the exact order in which it will need shards, so it hands that order to
//! `prefetch` and shards are downloaded ahead, a bounded number at once, as far as the budget
//! allows. `get` returns the local path of a shard, downloading it on the spot if it is not
//! there yet. A download is written under a temporary name, checked against the manifest
//! (size, and sha256 when the manifest has one) and only then renamed into place, so nothing
//! partial or altered is ever used. Eviction drops the least recently used shard that is not
//! among the next ones wanted; a mapped shard that is evicted stays readable (unlinking does not
//! unmap it).
//!
//! Fork safety: the bookkeeping lives in a `PerProcess` slot; a forked child starts from the
//! files on disk, without the parent's download threads.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use super::Location;
use crate::error::{Error, Result};
use crate::read::per_process::PerProcess;

/// One shard as the manifest describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// File name in the cache (`shard_00000007.tar`).
    pub name: String,
    pub size: u64,
    pub sha256: Option<String>,
}

/// Shards of the remote cache at `root` kept in `dir`.
pub struct ShardCache {
    inner: Arc<Inner>,
}

struct Inner {
    root: Location,
    dir: PathBuf,
    limit: u64,
    parallel: usize,
    slot: PerProcess<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Shards on disk: size, last use, and whether this process has checked them against the
    /// manifest (a file an earlier run left is hashed once before it is first used).
    local: HashMap<String, (u64, u64, bool)>,
    downloading: HashMap<String, u64>,
    /// Why a background download failed, for the `get` that wants the shard (the error itself:
    /// its kind decides the Python exception).
    failed: HashMap<String, Error>,
    /// What `prefetch` asked for, in the order it will be needed.
    queue: VecDeque<Want>,
    /// The next shards wanted, by position (the last `prefetch`, which the reader renews with
    /// every batch, the shard in use first): not evicted to make room for later ones.
    protected: HashMap<String, usize>,
    workers: usize,
    tick: u64,
    scanned: bool,
}

impl State {
    fn used(&self) -> u64 {
        self.local.values().map(|v| v.0).sum::<u64>() + self.downloading.values().sum::<u64>()
    }
}

/// How many of the next wanted shards are protected from eviction.
const PROTECT: usize = 64;

impl ShardCache {
    /// `dir` should be specific to one remote cache and its contents (see `cache_dir_for`).
    pub fn new(root: Location, dir: PathBuf, limit: u64, parallel: usize) -> Result<ShardCache> {
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(ShardCache { inner: Arc::new(Inner { root, dir, limit, parallel: parallel.max(1), slot: PerProcess::new() }) })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The shard is on disk (this process's view).
    pub fn holds(&self, name: &str) -> bool {
        self.inner.shared().1.local.contains_key(name)
    }

    /// Bytes of shards held on disk now (this process's view).
    pub fn used(&self) -> u64 {
        let (_, st) = self.inner.shared();
        st.local.values().map(|v| v.0).sum()
    }

    /// The local path of `want`, fetched and checked first if need be (blocking).
    pub fn get(&self, want: &Want) -> Result<PathBuf> {
        let inner = &self.inner;
        let (sh, mut st) = inner.shared();
        loop {
            st.tick += 1;
            let tick = st.tick;
            if let Some(&(_, _, checked)) = st.local.get(&want.name) {
                // Another process sharing the folder may have evicted it, or an old run left a
                // file of another size: use it only if it is there, whole.
                let path = inner.dir.join(&want.name);
                match std::fs::metadata(&path) {
                    Ok(md) if md.len() == want.size && (checked || want.sha256.is_none()) => {
                        st.local.insert(want.name.clone(), (want.size, tick, true));
                        return Ok(path);
                    }
                    Ok(md) if md.len() == want.size => {
                        // Left by an earlier run: the manifest's sha256 first, as for a download.
                        drop(st);
                        let intact = sha256_of(&path).is_some_and(|h| want.sha256.as_ref().is_some_and(|w| h.eq_ignore_ascii_case(w)));
                        st = lock(&sh.state);
                        if intact {
                            st.local.insert(want.name.clone(), (want.size, tick, true));
                            return Ok(path);
                        }
                        let _ = std::fs::remove_file(&path);
                        st.local.remove(&want.name);
                    }
                    Ok(_) => {
                        let _ = std::fs::remove_file(&path);
                        st.local.remove(&want.name);
                    }
                    Err(_) => {
                        st.local.remove(&want.name);
                    }
                }
            }
            if let Some(e) = st.failed.remove(&want.name) {
                return Err(e);
            }
            if !st.downloading.contains_key(&want.name) {
                break;
            }
            st = sh.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        // Not here and nobody fetching it: fetch it on this thread, making room even if that
        // evicts protected shards (this one is needed now).
        inner.make_room(&mut st, want.size, true);
        st.downloading.insert(want.name.clone(), want.size);
        drop(st);
        let got = inner.download(want);
        let mut st = lock(&sh.state);
        st.downloading.remove(&want.name);
        st.tick += 1;
        let tick = st.tick;
        if got.is_ok() {
            st.local.insert(want.name.clone(), (want.size, tick, true));
        }
        sh.changed.notify_all();
        got.map(|()| inner.dir.join(&want.name))
    }

    /// Fetch `order` ahead, in that order, as far as the budget allows; replaces the previous
    /// order. Returns at once: downloads run on up to `parallel` background threads.
    pub fn prefetch(&self, order: Vec<Want>) {
        let (sh, mut st) = self.inner.shared();
        st.protected = order.iter().take(PROTECT).enumerate().map(|(i, w)| (w.name.clone(), i)).collect();
        st.queue = order.into_iter().filter(|w| !st.local.contains_key(&w.name)).collect();
        let spawn = self.inner.parallel.saturating_sub(st.workers).min(st.queue.len());
        st.workers += spawn;
        drop(st);
        for _ in 0..spawn {
            let inner = self.inner.clone();
            let started = std::thread::Builder::new().name("tokshuf-fetch".into()).spawn(move || inner.work());
            if started.is_err() {
                let mut st = lock(&sh.state);
                st.workers -= 1;
            }
        }
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    fn shared(&self) -> (&Shared, MutexGuard<'_, State>) {
        let sh = self.slot.get(|| Shared { state: Mutex::new(State::default()), changed: Condvar::new() });
        let mut st = lock(&sh.state);
        if !st.scanned {
            st.scanned = true;
            self.scan(&mut st);
        }
        (sh, st)
    }

    /// Adopt the shards a previous run left (warm start); drop leftovers of interrupted ones.
    fn scan(&self, st: &mut State) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for ent in entries.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            let Ok(md) = ent.metadata() else { continue };
            if !md.is_file() || !name.starts_with("shard_") {
                continue;
            }
            if let Some((_, writer)) = name.split_once(".part.") {
                // Another live process may be writing it, on this machine or on another that
                // shares the folder: only a process of this machine that is gone is known dead.
                if writer.split_once('.').is_some_and(|(_, tag)| super::lease::tag_gone(tag)) {
                    let _ = std::fs::remove_file(ent.path());
                }
                continue;
            }
            st.local.insert(name, (md.len(), 0, false));
        }
    }

    /// Evict shards until `need` more bytes fit: the least recently used of those not wanted
    /// soon; when `urgent`, then the wanted one needed last. Returns whether it fits.
    fn make_room(&self, st: &mut State, need: u64, urgent: bool) -> bool {
        while st.used() + need > self.limit {
            let victim = st
                .local
                .iter()
                .filter_map(|(n, v)| match st.protected.get(n) {
                    None => Some(((0u8, v.1), n)),
                    Some(&pos) if urgent => Some(((1u8, u64::MAX - pos as u64), n)),
                    Some(_) => None,
                })
                .min()
                .map(|(_, n)| n.clone());
            let Some(v) = victim else { return false };
            st.local.remove(&v);
            let _ = std::fs::remove_file(self.dir.join(&v));
        }
        true
    }

    /// A background downloader: take the next wanted shard that fits, until none is left.
    fn work(self: Arc<Self>) {
        let (sh, mut st) = self.shared();
        loop {
            let next = loop {
                let Some(w) = st.queue.pop_front() else { break None };
                if st.local.contains_key(&w.name) || st.downloading.contains_key(&w.name) {
                    continue;
                }
                if !self.make_room(&mut st, w.size, false) {
                    // The budget is full of shards needed sooner: stop until asked again.
                    st.queue.push_front(w);
                    break None;
                }
                break Some(w);
            };
            let Some(w) = next else {
                st.workers -= 1;
                sh.changed.notify_all();
                return;
            };
            st.downloading.insert(w.name.clone(), w.size);
            drop(st);
            let got = self.download(&w);
            st = lock(&sh.state);
            st.downloading.remove(&w.name);
            st.tick += 1;
            let tick = st.tick;
            match got {
                Ok(()) => {
                    st.local.insert(w.name.clone(), (w.size, tick, true));
                }
                // Interrupted: nobody needs it now; a later `get` fetches it again.
                Err(Error::Interrupted) => {}
                Err(e) => {
                    st.failed.insert(w.name.clone(), e);
                }
            }
            sh.changed.notify_all();
        }
    }

    /// Stream one shard to a temporary file, check it, rename it into place.
    fn download(&self, want: &Want) -> Result<()> {
        let src = self.root.join(&want.name);
        let dest = self.dir.join(&want.name);
        // Unique per download, the machine and pid last (see `scan`): two caches of one process
        // sharing the folder may fetch the same shard at once, and each renames its own file
        // into place.
        static DOWNLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let k = DOWNLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.dir.join(format!("{}.part.{k}.{}", want.name, super::lease::tag()));
        let result = (|| {
            let mut r = super::open(&src).map_err(|e| match e {
                // The manifest lists it: a shard missing from the store is a damaged cache.
                Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    Error::corrupt(PathBuf::from(src.to_string()), "no such object, though the manifest lists it")
                }
                e => e,
            })?;
            let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
            let mut w = BufWriter::with_capacity(1 << 20, file);
            let mut hash = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut n = 0u64;
            loop {
                let k = r.read(&mut buf).map_err(|e| super::unwrap_io(&src, e))?;
                if k == 0 {
                    break;
                }
                if want.sha256.is_some() {
                    hash.update(&buf[..k]);
                }
                w.write_all(&buf[..k]).map_err(|e| Error::io(&tmp, e))?;
                n += k as u64;
            }
            w.flush().map_err(|e| Error::io(&tmp, e))?;
            if n != want.size {
                return Err(Error::corrupt(PathBuf::from(src.to_string()), format!("{n} bytes, the manifest says {}", want.size)));
            }
            if let Some(expect) = &want.sha256 {
                let got = format!("{:x}", hash.finalize());
                if !got.eq_ignore_ascii_case(expect) {
                    return Err(Error::corrupt(
                        PathBuf::from(src.to_string()),
                        format!("sha256 {got} differs from the manifest's {expect}"),
                    ));
                }
            }
            std::fs::rename(&tmp, &dest).map_err(|e| Error::io(&dest, e))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// Hex sha256 of a file's bytes, or None when it cannot be read.
fn sha256_of(path: &Path) -> Option<String> {
    let mut f = File::open(path).ok()?;
    let mut hash = Sha256::new();
    std::io::copy(&mut f, &mut hash).ok()?;
    Some(crate::format::hex(&hash.finalize()))
}

/// The folder under `cache_dir` for one remote cache: named by a hash of its URL and its
/// manifest, so a rebuilt cache at the same URL never reuses stale shards.
pub fn cache_dir_for(cache_dir: &Path, url: &str, manifest: &[u8]) -> PathBuf {
    let mut h = Sha256::new();
    h.update(url.as_bytes());
    h.update([0]);
    h.update(manifest);
    let hex = format!("{:x}", h.finalize());
    cache_dir.join(&hex[..24])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(dir: &Path, shards: &[(&str, usize)]) -> Vec<Want> {
        std::fs::create_dir_all(dir).unwrap();
        shards
            .iter()
            .map(|(name, size)| {
                let salt: usize = name.bytes().map(usize::from).sum();
                let data: Vec<u8> = (0..*size).map(|i| (i * 31 + salt) as u8).collect();
                std::fs::write(dir.join(name), &data).unwrap();
                Want { name: name.to_string(), size: *size as u64, sha256: Some(format!("{:x}", Sha256::digest(&data))) }
            })
            .collect()
    }

    /// `n` shards `shard_NNNNNNNN.tar` in `dir`, shard i of `size + i` bytes.
    fn numbered(dir: &Path, n: usize, size: usize) -> Vec<Want> {
        let names: Vec<(String, usize)> = (0..n).map(|i| (format!("shard_{i:08}.tar"), size + i)).collect();
        let refs: Vec<(&str, usize)> = names.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        remote(dir, &refs)
    }

    #[test]
    fn fetches_checks_and_stays_within_budget() {
        let t = tempfile::tempdir().unwrap();
        let wants = remote(&t.path().join("remote"), &[("a.tar", 1000), ("b.tar", 1000), ("c.tar", 1000)]);
        let cache = ShardCache::new(Location::Local(t.path().join("remote")), t.path().join("local"), 2500, 2).unwrap();
        for w in wants.iter().chain(wants.iter()) {
            let p = cache.get(w).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), std::fs::read(t.path().join("remote").join(&w.name)).unwrap());
            assert!(cache.used() <= 2500);
        }
        // A wrong size or hash in the manifest: an error, nothing left behind.
        let mut bad = wants[0].clone();
        bad.name = "c.tar".into();
        let cache2 = ShardCache::new(Location::Local(t.path().join("remote")), t.path().join("local2"), 1 << 20, 1).unwrap();
        assert!(matches!(cache2.get(&bad), Err(Error::Corrupt { .. })));
        assert_eq!(std::fs::read_dir(t.path().join("local2")).unwrap().count(), 0);
    }

    #[test]
    fn a_later_run_checks_the_shards_it_finds_and_errors_keep_their_kind() {
        let t = tempfile::tempdir().unwrap();
        let (remote, local) = (t.path().join("remote"), t.path().join("local"));
        let wants = numbered(&remote, 3, 1000);
        let root = Location::Local(remote.clone());
        let first = ShardCache::new(root.clone(), local.clone(), 1 << 20, 1).unwrap();
        for w in &wants {
            first.get(w).unwrap();
        }
        // A byte of a kept shard changes between runs: the next run hashes what it finds and
        // fetches that shard again instead of serving it.
        let kept = local.join(&wants[1].name);
        let mut data = std::fs::read(&kept).unwrap();
        data[500] ^= 1;
        std::fs::write(&kept, &data).unwrap();
        let later = ShardCache::new(root.clone(), local.clone(), 1 << 20, 1).unwrap();
        for w in &wants {
            let p = later.get(w).unwrap();
            assert_eq!(std::fs::read(p).unwrap(), std::fs::read(remote.join(&w.name)).unwrap());
        }
        // A shard the manifest lists but the store lacks is a damaged cache, whether the
        // reader's own thread or a prefetching one found out.
        std::fs::remove_file(remote.join(&wants[2].name)).unwrap();
        for prefetched in [false, true] {
            let cache = ShardCache::new(root.clone(), t.path().join(format!("fresh{prefetched}")), 1 << 20, 1).unwrap();
            if prefetched {
                cache.prefetch(vec![wants[2].clone()]);
                while cache.inner.shared().1.workers > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            let e = cache.get(&wants[2]).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
            assert_eq!(e.to_string().matches("shard_00000002.tar").count(), 1, "{e}");
        }
    }

    #[test]
    fn only_downloads_of_gone_processes_of_this_machine_are_swept() {
        let t = tempfile::tempdir().unwrap();
        let (remote, local) = (t.path().join("remote"), t.path().join("local"));
        let wants = numbered(&remote, 1, 100);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let (host, me) = (crate::storage::lease::hostname(), std::process::id());
        std::fs::create_dir_all(&local).unwrap();
        let part = |writer: String| local.join(format!("shard_00000009.tar.part.0.{writer}"));
        let names = [format!("{host}-{dead}"), format!("{host}-{me}"), format!("other-host.example-{dead}"), "junk".into()];
        for w in &names {
            std::fs::write(part(w.clone()), b"x").unwrap();
        }
        let cache = ShardCache::new(Location::Local(remote), local.clone(), 1 << 20, 1).unwrap();
        cache.get(&wants[0]).unwrap(); // the first use scans the folder
        let left: Vec<bool> = names.iter().map(|w| part(w.clone()).exists()).collect();
        assert_eq!(left, [false, true, true, true]);
    }

    #[test]
    fn two_caches_of_one_process_fetch_the_same_shards_at_once() {
        // Each download has a file of its own until it is renamed into place.
        let t = tempfile::tempdir().unwrap();
        let wants = numbered(&t.path().join("remote"), 64, 200_000);
        for round in 0..4 {
            let dir = t.path().join(format!("local{round}"));
            let caches: Vec<ShardCache> =
                (0..2).map(|_| ShardCache::new(Location::Local(t.path().join("remote")), dir.clone(), 1 << 30, 1).unwrap()).collect();
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                for c in &caches {
                    let (wants, start) = (&wants, &start);
                    s.spawn(move || {
                        start.wait();
                        for w in wants {
                            c.get(w).unwrap();
                        }
                    });
                }
            });
        }
    }

    #[test]
    fn prefetch_in_order_then_warm() {
        let t = tempfile::tempdir().unwrap();
        let wants = numbered(&t.path().join("remote"), 8, 500);
        let root = Location::Local(t.path().join("remote"));
        let cache = ShardCache::new(root.clone(), t.path().join("local"), 1 << 20, 3).unwrap();
        cache.prefetch(wants.clone());
        for w in &wants {
            cache.get(w).unwrap();
        }
        // Another instance (a later run) finds them on disk and downloads nothing.
        std::fs::remove_dir_all(t.path().join("remote")).unwrap();
        let warm = ShardCache::new(root, t.path().join("local"), 1 << 20, 3).unwrap();
        for w in &wants {
            warm.get(w).unwrap();
        }
        assert_eq!(warm.used(), wants.iter().map(|w| w.size).sum::<u64>());
    }

    #[test]
    fn prefetch_stops_at_the_budget() {
        let t = tempfile::tempdir().unwrap();
        let names: Vec<(String, usize)> = (0..6).map(|i| (format!("s{i}.tar"), 1000)).collect();
        let refs: Vec<(&str, usize)> = names.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let wants = remote(&t.path().join("remote"), &refs);
        let cache = ShardCache::new(Location::Local(t.path().join("remote")), t.path().join("local"), 3000, 2).unwrap();
        cache.prefetch(wants.clone());
        // Wait for the downloaders to stop.
        for _ in 0..500 {
            let idle = cache.inner.shared().1.workers == 0;
            if idle {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Exactly the first three (the next wanted) are there; nothing was evicted for later ones.
        let mut have: Vec<String> =
            std::fs::read_dir(t.path().join("local")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        have.sort();
        assert_eq!(have, vec!["s0.tar", "s1.tar", "s2.tar"]);
        // Reading on evicts the oldest to make room.
        for w in &wants {
            cache.get(w).unwrap();
            assert!(cache.used() <= 3000);
        }
    }

    #[test]
    fn dir_names_follow_url_and_manifest() {
        let base = Path::new("/c");
        assert_ne!(cache_dir_for(base, "s3://b/x", b"m1"), cache_dir_for(base, "s3://b/x", b"m2"));
        assert_ne!(cache_dir_for(base, "s3://b/x", b"m1"), cache_dir_for(base, "s3://b/y", b"m1"));
        assert_eq!(cache_dir_for(base, "s3://b/x", b"m1"), cache_dir_for(base, "s3://b/x", b"m1"));
    }
}
