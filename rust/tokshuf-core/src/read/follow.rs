//! Follow mode: reading a cache while its build runs (docs/resume-and-follow.md).
//!
//! What the builder guarantees (and this relies on): tokshuf.json's status goes
//! building|streaming -> writing -> complete and never back; from "writing" it holds the final
//! chunk plan; shards appear by rename with their final bytes; manifest.jsonl's complete lines
//! are a growing prefix of the final manifest.
//!
//! - Opening waits for tokshuf.json. A shuffled build can serve nothing before its plan
//!   ("writing"): opening waits for it. A streaming build (`shuffle=False`) opens at once; until
//!   its plan is final the chunks known are the manifest lines seen so far (`Known`).
//! - `FollowSource` serves the §6 order (or the single pass) from what is known. The single pass
//!   is manifest order: example i is known once the manifest prefix covers it. For the endless
//!   order, N (number of chunks) is unknown while streaming, but positions p < N are epoch 0
//!   with chunk p at position p, so stream r's first chunks are chunks r, r + R*, r + 2R*, ...
//!   for as long as those are < N. With K chunks known (K <= N), example i (stream r = i mod R*,
//!   k = i div R*) is determined exactly when k < the contexts of stream r's chunks below K; it
//!   then lies in chunk r + t R* < K, whatever N turns out to be. Otherwise the reader waits for
//!   more lines or the final plan (epoch 1 needs N).
//! - Every wait polls with short sleeps, checks the caller's cancel flag (Ctrl-C), and tests the
//!   build lock (lock.rs): no build holding it and the cache still not complete means the
//!   build died: `BuildNotRunning` at once. Otherwise `FollowTimeout` after `timeout`.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::format::lock::{self, BuildState};
use crate::format::{shard_path, Status};
use crate::format::{MANIFEST_NAME, META_NAME};
use crate::read::cache::{self, Cache, CacheMeta, ChunkEntry, Growing};
use crate::read::order::{self, Loc, OrderOptions, Source};

/// Longest sleep between two looks at the build.
const MAX_POLL: Duration = Duration::from_millis(50);

/// What is known of the chunks so far.
#[derive(Debug, Default)]
struct Known {
    /// `sizes` is the whole plan.
    plan_final: bool,
    complete: bool,
    sizes: Vec<u64>,
    /// Contexts before chunk c (len sizes + 1).
    cumulative: Vec<u64>,
    /// Bytes of manifest.jsonl consumed (complete lines only).
    manifest_off: u64,
}

impl Known {
    fn push(&mut self, size: u64) {
        let last = self.cumulative.last().copied().unwrap_or(0);
        if self.cumulative.is_empty() {
            self.cumulative.push(0);
        }
        self.sizes.push(size);
        self.cumulative.push(last + size);
    }
}

/// Where a followed build is seen from: its own folder, or (`read::remote`) a local copy of
/// the tokshuf.json and manifest.jsonl of a cache being built in an object store.
pub trait Watch: Send + Sync {
    /// The folder holding tokshuf.json and manifest.jsonl (or copies of them).
    fn root(&self) -> &Path;
    /// Bring the copies up to date (a local build: nothing to do).
    fn sync(&self) -> Result<()>;
    /// Is the build running?
    fn state(&self) -> BuildState;
    /// Can chunk `c` (`entry`) be read now?
    fn shard_ready(&self, cache: &Cache, c: u64, entry: &ChunkEntry) -> Result<bool>;
    /// The build's output, for messages.
    fn name(&self) -> String;
}

/// A build writing into a local folder: its files are read where they are, and its build lock
/// (`format::lock`) tells whether it runs.
pub struct LocalWatch(pub PathBuf);

impl Watch for LocalWatch {
    fn root(&self) -> &Path {
        &self.0
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn state(&self) -> BuildState {
        lock::build_state(&self.0)
    }
    /// Shards appear by rename with their final bytes: one that exists must pass the checks.
    fn shard_ready(&self, cache: &Cache, c: u64, entry: &ChunkEntry) -> Result<bool> {
        if !shard_path(&cache.root, c).exists() {
            return Ok(false);
        }
        cache.check_chunk(c, entry)?;
        Ok(true)
    }
    fn name(&self) -> String {
        self.0.display().to_string()
    }
}

/// The follow-mode state of a `Cache` opened on an unfinished build.
pub struct Follow {
    watch: Arc<dyn Watch>,
    timeout: Option<Duration>,
    chunk_size: u64,
    /// tokshuf.json fields that must never change during the build.
    ident: Value,
    known: Mutex<Known>,
    ready: Mutex<HashSet<u64>>,
    /// tokshuf.json as `check_same_build` last found it the followed build's (inode, size,
    /// mtime): looked at again only once it changed, not parsed for every shard.
    checked_meta: Mutex<Option<(u64, u64, std::time::SystemTime)>>,
}

fn ident(meta: &CacheMeta) -> Value {
    let r = &meta.raw;
    serde_json::json!([r["recipe"], r["seqlen"], r["dtype"], r["format"], r["chunk_size"], r.get("shuffle")])
}

/// The chunk sizes of a planned ("writing" or "complete") tokshuf.json.
fn plan_sizes(path: &Path, meta: &CacheMeta) -> Result<Vec<u64>> {
    let (n, cs, total) = (meta.num_chunks, meta.chunk_size, meta.num_contexts);
    let sizes = match &meta.chunk_sizes {
        Some(s) => s.clone(),
        None => {
            if n > 0 && (total <= (n - 1) * cs || total > n * cs) {
                return Err(Error::corrupt(path, format!("num_contexts {total} does not fit num_chunks {n} of chunk_size {cs}")));
            }
            (0..n).map(|k| cs.min(total - k * cs)).collect()
        }
    };
    if sizes.len() as u64 != n || sizes.iter().any(|&s| s == 0 || s > cs) || sizes.iter().sum::<u64>() != total {
        return Err(Error::corrupt(path, "chunk plan (num_chunks, num_contexts, chunk_sizes) is inconsistent"));
    }
    Ok(sizes)
}

/// Nothing of a build is at `name` yet (no `what`) and none is running.
pub fn not_started(name: &str, what: &str) -> Error {
    Error::BuildNotRunning(format!(
        "{name}: no build has written {what} there yet, and none is running; start the build first, or pass a timeout to wait for it to start"
    ))
}

/// tokshuf.json at `meta_path` is no longer the followed build's (`why`).
fn replaced(meta_path: &Path, why: &str) -> Error {
    Error::corrupt(meta_path, format!("{why} while following the build (another build into the same folder, or overwrite=True?)"))
}

/// Wait for `attempt` to give a value: see the module notes. `what` names it in errors.
/// `starting`: nothing of the build exists yet, so a build not running may be one about to
/// start (a trainer and its build launched together): with a timeout, it is waited for.
fn wait_for<T>(
    watch: &dyn Watch,
    timeout: Option<Duration>,
    cancel: &AtomicBool,
    what: &dyn Fn() -> String,
    starting: bool,
    attempt: &mut dyn FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let t0 = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(v) = attempt()? {
            return Ok(v);
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        if watch.state() == BuildState::NotRunning && !(starting && timeout.is_some()) {
            // The build may have finished between our look and the lock test: look again.
            if let Some(v) = attempt()? {
                return Ok(v);
            }
            if starting {
                return Err(not_started(&watch.name(), &what()));
            }
            return Err(Error::BuildNotRunning(format!(
                "{}: waiting for {}, but the build is not running and the cache is not complete; resume it by running the same build command again",
                watch.name(),
                what()
            )));
        }
        if let Some(t) = timeout {
            if t0.elapsed() >= t {
                return Err(Error::FollowTimeout(format!(
                    "{}: waited {:.1}s for {} (the build is running; pass a longer timeout)",
                    watch.name(),
                    t.as_secs_f64(),
                    what()
                )));
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_POLL);
    }
}

impl Follow {
    pub fn wait<T>(
        &self,
        cancel: &AtomicBool,
        what: &dyn Fn() -> String,
        attempt: &mut dyn FnMut(&Follow) -> Result<Option<T>>,
    ) -> Result<T> {
        wait_for(&*self.watch, self.timeout, cancel, what, false, &mut || attempt(self))
    }

    fn lock_known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn entry(&self, c: u64) -> Option<ChunkEntry> {
        self.lock_known().sizes.get(c as usize).map(|&size| ChunkEntry { size, bytes: None })
    }

    pub fn is_ready(&self, c: u64) -> bool {
        self.lock_known().complete || self.ready.lock().unwrap_or_else(|e| e.into_inner()).contains(&c)
    }

    pub fn set_ready(&self, c: u64) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).insert(c);
    }

    /// Look at the build again: tokshuf.json, and new manifest lines while streaming. Files
    /// are read outside the lock (held only to copy and apply), so that a child forked while
    /// another thread refreshes never finds it held.
    pub fn refresh(&self) -> Result<()> {
        let (complete, plan_final, nknown, off) = {
            let k = self.lock_known();
            (k.complete, k.plan_final, k.sizes.len(), k.manifest_off)
        };
        if complete {
            return Ok(());
        }
        self.watch.sync()?;
        let root = self.watch.root();
        let meta_path = root.join(META_NAME);
        let meta = cache::read_meta(root, false)?;
        if ident(&meta) != self.ident {
            return Err(replaced(&meta_path, "changed"));
        }
        let planned = meta.status.planned();
        let mut plan = None;
        let mut lines = Vec::new();
        let mut consumed = 0u64;
        if planned && !plan_final {
            plan = Some(plan_sizes(&meta_path, &meta)?);
        } else if !planned && meta.status == Status::Streaming {
            let mpath = root.join(MANIFEST_NAME);
            let mut text = Vec::new();
            match File::open(&mpath) {
                Ok(mut f) => {
                    f.seek(SeekFrom::Start(off)).map_err(|e| Error::io(&mpath, e))?;
                    f.read_to_end(&mut text).map_err(|e| Error::io(&mpath, e))?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&mpath, e)),
            }
            // A last line without its newline may be being appended: not yet.
            let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            lines = cache::parse_manifest(&mpath, &text[..end], nknown as u64, self.chunk_size)?;
            consumed = end as u64;
        }
        let mut k = self.lock_known();
        if k.sizes.len() != nknown || k.manifest_off != off || k.plan_final != plan_final {
            return Ok(()); // another thread refreshed meanwhile
        }
        if let Some(sizes) = plan {
            if sizes.len() < nknown || sizes[..nknown] != k.sizes[..] {
                return Err(Error::corrupt(
                    &meta_path,
                    "the chunk plan disagrees with the manifest lines read while the build was streaming",
                ));
            }
            for &s in &sizes[nknown..] {
                k.push(s);
            }
            k.plan_final = true;
        }
        for e in lines {
            k.push(e.size);
        }
        k.manifest_off += consumed;
        k.complete = meta.status == Status::Complete;
        Ok(())
    }

    /// The folder still holds the build this follows (tokshuf.json there, with the same recipe
    /// and layout). A build with the same recipe writes the same bytes, so it may take over.
    fn check_same_build(&self) -> Result<()> {
        self.watch.sync()?;
        let root = self.watch.root();
        let meta_path = root.join(META_NAME);
        let Ok(md) = std::fs::metadata(&meta_path) else { return Err(replaced(&meta_path, "was removed")) };
        let stamp = (std::os::unix::fs::MetadataExt::ino(&md), md.len(), md.modified().unwrap_or(std::time::UNIX_EPOCH));
        let mut checked = self.checked_meta.lock().unwrap_or_else(|e| e.into_inner());
        if *checked == Some(stamp) {
            return Ok(());
        }
        let meta = cache::read_meta(root, false)?;
        if ident(&meta) != self.ident {
            return Err(replaced(&meta_path, "changed"));
        }
        *checked = Some(stamp);
        Ok(())
    }

    /// The final chunk sizes, waiting for the plan.
    pub fn wait_plan(&self, cancel: &AtomicBool) -> Result<Vec<u64>> {
        self.wait(cancel, &|| "the chunk plan (status \"writing\")".into(), &mut |f| {
            f.refresh()?;
            let k = f.lock_known();
            Ok(k.plan_final.then(|| k.sizes.clone()))
        })
    }

    /// R* when none is given (as `Cache::default_ideal_readers`): min(64, N) is known once the
    /// plan is, or once 64 chunks are.
    pub fn default_ideal_readers(&self, cancel: &AtomicBool) -> Result<u64> {
        self.wait(cancel, &|| "the chunk plan or 64 chunks (to choose the default ideal_readers)".into(), &mut |f| {
            f.refresh()?;
            let k = f.lock_known();
            Ok((k.plan_final || k.sizes.len() >= 64).then(|| (k.sizes.len() as u64).clamp(1, 64)))
        })
    }

    /// Known chunk sizes from index `from` on, and whether they are the whole plan.
    fn sizes_from(&self, from: usize) -> (Vec<u64>, bool) {
        let k = self.lock_known();
        (k.sizes.get(from..).map(<[u64]>::to_vec).unwrap_or_default(), k.plan_final)
    }
}

impl Growing for Follow {
    fn entry(&self, c: u64) -> Option<ChunkEntry> {
        Follow::entry(self, c)
    }

    fn wait_chunk(&self, cache: &Cache, c: u64, cancel: &AtomicBool) -> Result<()> {
        if self.is_ready(c) {
            return Ok(());
        }
        self.wait(cancel, &|| format!("shard {}", shard_path(&cache.root, c).display()), &mut |f| {
            if cache.entry(c).is_none() {
                f.refresh()?;
            }
            let Some(entry) = cache.entry(c) else { return Ok(None) };
            if !f.watch.shard_ready(cache, c, &entry)? {
                return Ok(None);
            }
            // A shard is renamed into place after the tokshuf.json of its build: looking at
            // tokshuf.json now tells whether the shard is of the build this follows, or of
            // another run into the folder (overwrite=True with other options).
            f.check_same_build()?;
            f.set_ready(c);
            Ok(Some(()))
        })
    }

    fn wait_plan(&self, cancel: &AtomicBool) -> Result<Vec<u64>> {
        Follow::wait_plan(self, cancel)
    }

    fn default_ideal_readers(&self, cancel: &AtomicBool) -> Result<u64> {
        Follow::default_ideal_readers(self, cancel)
    }

    fn source(self: Arc<Self>, cache: Arc<Cache>, opts: OrderOptions, single_pass: bool) -> Arc<dyn Source> {
        Arc::new(FollowSource::new(cache, self, opts, single_pass))
    }
}

/// A follow-mode timeout given in seconds (None: wait as long as the build runs).
pub fn timeout(seconds: Option<f64>) -> Result<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(Error::Config(format!("timeout={t}: expected a number of seconds >= 0 or None"))),
    }
}

/// Open `root` for reading while its build runs. A complete cache opens as usual; a shuffled
/// build waits for its chunk plan; a streaming one opens at once.
pub fn open(root: &Path, check_files: bool, timeout: Option<Duration>, cancel: &AtomicBool) -> Result<Cache> {
    match open_watched(Arc::new(LocalWatch(root.to_path_buf())), timeout, cancel)? {
        Opened::Following(cache) => Ok(*cache),
        Opened::Complete => Cache::open_with(root, check_files),
    }
}

/// What `open_watched` found.
pub enum Opened {
    /// The build is running (or stopped unfinished): the cache, following it.
    Following(Box<Cache>),
    /// The cache is complete: open it as usual.
    Complete,
}

/// Open the build `watch` sees, waiting for its tokshuf.json (and, shuffled, its plan).
pub fn open_watched(watch: Arc<dyn Watch>, timeout: Option<Duration>, cancel: &AtomicBool) -> Result<Opened> {
    let root = watch.root().to_path_buf();
    let meta_path = root.join(META_NAME);
    let meta = wait_for(&*watch, timeout, cancel, &|| META_NAME.to_string(), true, &mut || {
        watch.sync()?;
        if !meta_path.exists() {
            return Ok(None);
        }
        cache::read_meta(&root, false).map(Some)
    })?;
    if meta.status == Status::Complete {
        return Ok(Opened::Complete);
    }
    let follow = Follow {
        watch,
        timeout,
        chunk_size: meta.chunk_size,
        ident: ident(&meta),
        known: Mutex::new(Known::default()),
        ready: Mutex::new(HashSet::new()),
        checked_meta: Mutex::new(None),
    };
    let chunks: Vec<ChunkEntry> = if meta.shuffle {
        follow.wait_plan(cancel)?.into_iter().map(|size| ChunkEntry { size, bytes: None }).collect()
    } else {
        follow.refresh()?;
        let (sizes, fin) = follow.sizes_from(0);
        if fin {
            sizes.into_iter().map(|size| ChunkEntry { size, bytes: None }).collect()
        } else {
            Vec::new()
        }
    };
    let plan_final = !chunks.is_empty() || follow.lock_known().plan_final;
    if follow.lock_known().complete {
        // Finished meanwhile: the usual open checks everything.
        return Ok(Opened::Complete);
    }
    Ok(Opened::Following(Box::new(Cache::from_parts(&root, meta, chunks, None, Some((Arc::new(follow), plan_final))))))
}

/// Per-stream prefix sums over the chunks known so far (endless order while streaming).
#[derive(Default)]
struct Streams {
    /// Chunks (positions) taken into account.
    seen: u64,
    /// cum[r][t]: contexts in stream r's first t + 1 chunks.
    cum: Vec<Vec<u64>>,
}

/// The example source of a cache following a streaming build whose plan was not final at open:
/// serves what the known chunks determine, and becomes the usual source once the plan is final.
pub struct FollowSource {
    cache: Arc<Cache>,
    follow: Arc<Follow>,
    opts: OrderOptions,
    single_pass: bool,
    fin: OnceLock<Arc<dyn Source>>,
    streams: Mutex<Streams>,
}

impl FollowSource {
    fn new(cache: Arc<Cache>, follow: Arc<Follow>, opts: OrderOptions, single_pass: bool) -> Self {
        let r = opts.ideal_readers.max(1) as usize;
        FollowSource {
            cache,
            follow,
            opts,
            single_pass,
            fin: OnceLock::new(),
            streams: Mutex::new(Streams { seen: 0, cum: vec![Vec::new(); r] }),
        }
    }

    fn follow(&self) -> Option<&Follow> {
        Some(&self.follow)
    }

    /// The usual source, once the plan is final.
    fn final_source(&self) -> Option<&Arc<dyn Source>> {
        if let Some(s) = self.fin.get() {
            return Some(s);
        }
        let f = self.follow()?;
        let (sizes, fin) = f.sizes_from(0);
        if !fin || sizes.is_empty() {
            return None;
        }
        Some(
            self.fin.get_or_init(|| {
                order::cache_source(&sizes, self.cache.meta.chunk_size, self.cache.order_block(), self.opts, self.single_pass)
            }),
        )
    }

    /// Location of example i if the chunks known so far determine it.
    fn locate_known(&self, i: u64) -> Option<Loc> {
        if let Some(s) = self.final_source() {
            return Some(s.locate(i));
        }
        let f = self.follow()?;
        if self.single_pass {
            let k = f.lock_known();
            if i >= k.cumulative.last().copied().unwrap_or(0) {
                return None;
            }
            let c = k.cumulative.partition_point(|&x| x <= i) - 1;
            return Some(Loc { component: 0, chunk: c as u64, index: i - k.cumulative[c] });
        }
        let r_star = self.opts.ideal_readers;
        let mut st = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let (new, _) = f.sizes_from(st.seen as usize);
        for s in new {
            let r = (st.seen % r_star) as usize;
            let last = st.cum[r].last().copied().unwrap_or(0);
            st.cum[r].push(last + s);
            st.seen += 1;
        }
        let (r, k) = (i % r_star, i / r_star);
        let cum = &st.cum[r as usize];
        let t = cum.partition_point(|&x| x <= k);
        if t >= cum.len() {
            return None;
        }
        let before = if t == 0 { 0 } else { cum[t - 1] };
        Some(Loc { component: 0, chunk: r + t as u64 * r_star, index: k - before })
    }
}

impl Source for FollowSource {
    /// Not used by the reader (it calls `locate_wait`); answers what is known without waiting,
    /// else a chunk that does not exist (reading it fails with a clear error).
    fn locate(&self, i: u64) -> Loc {
        self.locate_known(i).unwrap_or(Loc { component: 0, chunk: u64::MAX, index: 0 })
    }
    fn locate_wait(&self, i: u64, cancel: &AtomicBool) -> Result<Loc> {
        if let Some(l) = self.locate_known(i) {
            return Ok(l);
        }
        let Some(f) = self.follow() else { return Ok(self.locate(i)) };
        f.wait(cancel, &|| format!("the chunk holding example {i}"), &mut |f| {
            f.refresh()?;
            Ok(self.locate_known(i))
        })
    }
    fn num_examples(&self) -> Option<u64> {
        self.final_source().and_then(|s| s.num_examples())
    }
    fn len_pending(&self) -> bool {
        self.single_pass && self.final_source().is_none()
    }
    fn wait_len(&self, n: u64, cancel: &AtomicBool) -> Result<Option<u64>> {
        if !self.single_pass {
            return Ok(None);
        }
        let Some(f) = self.follow() else { return Ok(self.num_examples()) };
        f.wait(cancel, &|| format!("{n} contexts or the end of the build"), &mut |f| {
            if let Some(s) = self.final_source() {
                return Ok(Some(s.num_examples()));
            }
            f.refresh()?;
            if let Some(s) = self.final_source() {
                return Ok(Some(s.num_examples()));
            }
            let known = f.lock_known().cumulative.last().copied().unwrap_or(0);
            Ok((known >= n).then_some(None))
        })
    }
    fn describe(&self) -> String {
        order::describe(self.cache.meta.chunk_size, self.opts, self.single_pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::SplitMix64;

    /// A streaming build's folder: tokshuf.json "streaming" and the first `known` manifest lines.
    fn streaming_dir(dir: &Path, sizes: &[u64], known: usize, cs: u64) {
        let meta = serde_json::json!({
            "format_version": crate::format::FORMAT_VERSION, "status": "streaming", "seqlen": 4,
            "dtype": "uint16", "format": "npy", "chunk_size": cs, "shuffle": false, "recipe": {},
        });
        std::fs::write(dir.join(META_NAME), meta.to_string()).unwrap();
        let lines: String = sizes[..known]
            .iter()
            .enumerate()
            .map(|(c, s)| format!("{{\"shard\":\"{}\",\"num_sequences\":{s}}}\n", crate::format::shard_stem(c as u64)))
            .collect();
        std::fs::write(dir.join(MANIFEST_NAME), lines + "{\"shard\":\"torn").unwrap();
    }

    #[test]
    fn prefix_serves_exactly_what_it_determines() {
        let mut rng = SplitMix64::new(3);
        let never = AtomicBool::new(false);
        for case in 0..200 {
            let dir = tempfile::tempdir().unwrap();
            let cs = 1 + rng.below(5);
            let n = 1 + rng.below(20) as usize;
            let sizes: Vec<u64> = (0..n).map(|_| if rng.below(3) == 0 { 1 + rng.below(cs) } else { cs }).collect();
            let known = rng.below(n as u64 + 1) as usize;
            streaming_dir(dir.path(), &sizes, known, cs);
            let cache = Arc::new(open(dir.path(), false, None, &never).unwrap());
            assert!(!cache.final_plan);
            let r_star = [1, 2, 3, 4, 7][rng.below(5) as usize];
            let opts = OrderOptions { ideal_readers: r_star, seed: case, reshuffle: true };
            let full = order::Order::new(&sizes, cs, opts);
            let src = cache.source(opts, false).unwrap();
            let single = cache.source(opts, true).unwrap();
            let total: u64 = sizes.iter().sum();
            let before_known: u64 = sizes[..known].iter().sum();
            for i in 0..3 * total + 10 {
                let (r, k) = (i % r_star, i / r_star);
                // Determined iff k falls inside stream r's chunks below `known`.
                let stream_known: u64 = (r..known as u64).step_by(r_star as usize).map(|c| sizes[c as usize]).sum();
                let got = Some(src.locate(i)).filter(|l| l.chunk != u64::MAX);
                assert_eq!(got.is_some(), k < stream_known, "case {case} i {i}");
                if let Some(l) = got {
                    assert_eq!(l, full.locate(i), "case {case} i {i}");
                }
                let sp = Some(single.locate(i)).filter(|l| l.chunk != u64::MAX);
                assert_eq!(sp.is_some(), i < before_known);
                if let Some(l) = sp {
                    assert_eq!(l, order::SinglePass::new(&sizes).locate(i));
                }
            }
        }
    }
}
