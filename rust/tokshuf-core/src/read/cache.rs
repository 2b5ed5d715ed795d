//! An opened cache: random access to contexts (DESIGN §2-3). Opening runs the checks of
//! `validate`; shards are mapped lazily, on first use, at most `MAX_MAPPED` at a time (the
//! kernel limits mappings per process), and read by `chunk` in their member format.
//!
//! Fork safety: the mutable part (the mapped chunks) lives in a `PerProcess` slot, so a child
//! forked while a thread of the parent held its lock starts from a fresh slot.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use memmap2::Mmap;
use sha2::{Digest, Sha256};

use super::block_cache::BlockCache;
use super::buffers::BufferPool;
use super::chunk::Chunk;
pub use super::chunk::Layout;
use super::gather::copy_rows;
pub use super::members::Id;
use super::order::{cache_source, OrderOptions, Source};
use super::per_process::PerProcess;
use super::validate::{check_listed, list_shards, read_manifest_text};
pub use super::validate::{
    check_shard, check_shards_of, parse_manifest, parse_manifest_all, read_meta, recipe_fingerprint, CacheMeta, ChunkEntry,
};
use crate::error::{Error, Result};
use crate::format::{shard_path, Format, MANIFEST_NAME, META_NAME};

/// Chunks mapped at once per cache and process (Linux allows ~65k mappings per process).
const MAX_MAPPED: usize = 1024;

#[derive(Default)]
struct Maps {
    by_chunk: HashMap<u64, Arc<Chunk>>,
    fifo: VecDeque<u64>,
}

/// How a cache opened while its build runs learns its chunks: the one seam through which
/// follow mode (`read::follow`) enters. A complete cache has none.
pub trait Growing: Send + Sync {
    /// Chunk `c`'s entry, if its manifest line has been seen.
    fn entry(&self, c: u64) -> Option<ChunkEntry>;
    /// Wait until chunk `c`'s shard exists and passes `cache.check_chunk`.
    fn wait_chunk(&self, cache: &Cache, c: u64, cancel: &AtomicBool) -> Result<()>;
    /// Wait for the final chunk plan; every chunk's size.
    fn wait_plan(&self, cancel: &AtomicBool) -> Result<Vec<u64>>;
    /// Wait until the default R* is known.
    fn default_ideal_readers(&self, cancel: &AtomicBool) -> Result<u64>;
    /// The order source over what is known so far.
    fn source(self: Arc<Self>, cache: Arc<Cache>, opts: OrderOptions, single_pass: bool) -> Arc<dyn Source>;
}

/// An opened, validated cache.
pub struct Cache {
    pub root: PathBuf,
    pub meta: CacheMeta,
    /// Every chunk, or (a cache following a streaming build, opened before its plan was
    /// final: `final_plan` false) none: then `follow` knows the chunks seen so far.
    pub chunks: Vec<ChunkEntry>,
    /// Contexts before chunk c (len N + 1).
    pub cumulative: Vec<u64>,
    /// Hex sha256 of manifest.jsonl and the recipe: names the cache's content. A cache opened
    /// in follow mode before its build completed has no final manifest: it uses
    /// `recipe_fingerprint` instead.
    pub fingerprint: String,
    /// Hex sha256 of the recipe alone (what the build was asked to make).
    pub recipe_fingerprint: String,
    /// `chunks` holds the whole plan.
    pub final_plan: bool,
    /// Set when opened on an unfinished build (follow mode): how the cache learns its chunks.
    growing: Option<Arc<dyn Growing>>,
    pub layout: Layout,
    maps: PerProcess<Mutex<Maps>>,
    /// `blocks.zst`: decoded blocks.
    blocks: PerProcess<BlockCache>,
    /// A cache in an object store: shards are brought into `root` before they are mapped.
    remote: Option<Arc<super::remote::RemoteShards>>,
    /// Buffers of the batches of this cache's readers, for the next batches.
    pub buffers: Arc<BufferPool>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cache({}, {} chunks)", self.root.display(), self.chunks.len())
    }
}

/// Refuse output elements of `out_bytes` that are narrower than the ids of a `dtype` cache
/// (uint16 batches of a uint32 cache), where every copy would silently truncate them.
pub(crate) fn holds_ids(out_bytes: usize, dtype: crate::format::Dtype) -> Result<()> {
    if out_bytes < dtype.size() {
        return Err(Error::Config("dtype uint16 cannot hold the ids of a uint32 cache".into()));
    }
    Ok(())
}

impl Cache {
    pub fn open(root: &Path) -> Result<Cache> {
        Self::open_with(root, true)
    }

    /// `check_files`: check now that every shard exists (one directory listing). Each shard's
    /// size is checked when it is first mapped, whatever `check_files` says.
    pub fn open_with(root: &Path, check_files: bool) -> Result<Cache> {
        // Listing a large folder is the longest step of opening (the kernel's, per entry), so
        // it starts first, on a thread of its own; after an error before it is needed, it
        // ends on its own. The fingerprint hashes the whole manifest on another thread while
        // the manifest is parsed: one thread is enough for the parse, which takes less time
        // than the hash of the same bytes.
        let listing = check_files.then(|| {
            let root = root.to_path_buf();
            std::thread::spawn(move || list_shards(&root))
        });
        let meta = read_meta(root, true)?;
        let mpath = root.join(MANIFEST_NAME);
        let text = read_manifest_text(&mpath)?;
        let recipe = serde_json::to_string(&meta.raw["recipe"]).unwrap_or_default();
        let (chunks, fingerprint) = std::thread::scope(|s| {
            let hashing = s.spawn(|| {
                let mut h = Sha256::new();
                h.update(b"tokshuf-cache-v1\0");
                h.update(&*text);
                h.update(b"\0");
                h.update(recipe.as_bytes());
                crate::format::hex(&h.finalize())
            });
            (parse_manifest(&mpath, &text, 0, meta.chunk_size), hashing.join())
        });
        let chunks = chunks?;
        let fingerprint = fingerprint.map_err(|_| Error::Config("manifest hashing thread panicked".into()))?;
        let meta_path = root.join(META_NAME);
        if chunks.len() as u64 != meta.num_chunks {
            return Err(Error::corrupt(&mpath, format!("{} lines, tokshuf.json says num_chunks {}", chunks.len(), meta.num_chunks)));
        }
        let total: u64 = chunks.iter().map(|c| c.size).sum();
        if total != meta.num_contexts {
            return Err(Error::corrupt(
                &mpath,
                format!("num_sequences add up to {total}, tokshuf.json says num_contexts {}", meta.num_contexts),
            ));
        }
        if let Some(sizes) = &meta.chunk_sizes {
            if sizes.len() != chunks.len() || sizes.iter().zip(&chunks).any(|(a, b)| *a != b.size) {
                return Err(Error::corrupt(&meta_path, "chunk_sizes does not match the manifest's num_sequences"));
            }
        } else if let Some(k) = chunks.iter().take(chunks.len().saturating_sub(1)).position(|c| c.size != meta.chunk_size) {
            return Err(Error::corrupt(
                &mpath,
                format!("line {}: only the last chunk of a shuffled cache may hold fewer than {} contexts", k + 1, meta.chunk_size),
            ));
        }
        if let Some(listing) = listing {
            let listed = listing.join().map_err(|_| Error::Config("folder listing thread panicked".into()))??;
            check_listed(root, &chunks, listed)?;
        }
        Ok(Cache::from_parts(root, meta, chunks, Some(fingerprint), None))
    }

    pub(crate) fn from_parts(
        root: &Path,
        meta: CacheMeta,
        chunks: Vec<ChunkEntry>,
        fingerprint: Option<String>,
        growing: Option<(Arc<dyn Growing>, bool)>,
    ) -> Cache {
        let mut cumulative = Vec::with_capacity(chunks.len() + 1);
        cumulative.push(0u64);
        for c in &chunks {
            cumulative.push(cumulative.last().copied().unwrap_or(0) + c.size);
        }
        let recipe_fingerprint = recipe_fingerprint(&meta.raw);
        let final_plan = growing.as_ref().is_none_or(|g| g.1);
        let growing = growing.map(|g| g.0);
        Cache {
            root: root.to_path_buf(),
            layout: Layout::new(meta.format, meta.dtype, meta.seqlen, meta.block_size).ragged(meta.ragged),
            meta,
            chunks,
            cumulative,
            fingerprint: fingerprint.unwrap_or_else(|| recipe_fingerprint.clone()),
            recipe_fingerprint,
            final_plan,
            growing,
            maps: PerProcess::new(),
            blocks: PerProcess::new(),
            remote: None,
            buffers: Arc::new(BufferPool::new()),
        }
    }

    /// Serve shards through `shards` (see `read::remote`).
    pub(crate) fn attach_remote(&mut self, shards: Arc<super::remote::RemoteShards>) {
        self.remote = Some(shards);
    }

    /// A cache in an object store (`read::remote`).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// A remote cache whose local copy of chunk `c` was evicted.
    fn evicted(&self, c: u64) -> bool {
        match &self.remote {
            Some(r) => r.want(c).is_some_and(|w| !r.cache.holds(&w.name)),
            None => false,
        }
    }

    /// A remote cache: download these chunks ahead, in this order, as the budget allows.
    pub fn prefetch_chunks(&self, order: &[u64]) {
        if let Some(r) = &self.remote {
            r.cache.prefetch(order.iter().filter_map(|&c| r.want(c)).collect());
        }
    }

    /// Chunk `c`'s entry: from the plan, or (following a streaming build) the manifest lines
    /// seen so far.
    pub fn entry(&self, c: u64) -> Option<ChunkEntry> {
        match self.chunks.get(c as usize) {
            Some(e) => Some(*e),
            None => self.growing.as_ref().and_then(|g| g.entry(c)),
        }
    }

    /// Opened on a build that was still running (follow mode).
    pub fn is_following(&self) -> bool {
        self.growing.is_some()
    }

    /// Reading this cache may wait for its build (the plan is not final yet).
    pub fn may_wait(&self) -> bool {
        self.growing.is_some() && !self.final_plan
    }

    /// Follow mode: wait until chunk `c`'s shard exists (and passes the size checks). At once
    /// for a cache that was complete when opened.
    pub fn wait_chunk(&self, c: u64, cancel: &AtomicBool) -> Result<()> {
        match &self.growing {
            Some(g) => g.wait_chunk(self, c, cancel),
            None => Ok(()),
        }
    }

    /// The size checks of chunk `c`'s shard against `entry` (follow mode: as each appears).
    pub fn check_chunk(&self, c: u64, entry: &ChunkEntry) -> Result<()> {
        check_shard(&self.root, c, entry, &self.layout).map(|_| ())
    }

    /// Every chunk's size (following a build: waits for the chunk plan).
    pub fn wait_sizes(&self, cancel: &AtomicBool) -> Result<Vec<u64>> {
        match &self.growing {
            Some(g) if !self.final_plan => g.wait_plan(cancel),
            _ => Ok(self.sizes()),
        }
    }

    /// `default_ideal_readers`, waiting (following a streaming build) for what decides it.
    pub fn wait_default_ideal_readers(&self, cancel: &AtomicBool) -> Result<u64> {
        match &self.growing {
            Some(g) if !self.final_plan && self.meta.ideal_readers.is_none() => g.default_ideal_readers(cancel),
            _ => Ok(self.default_ideal_readers()),
        }
    }

    /// The order of this cache's examples (DESIGN §6); following a streaming build whose plan
    /// is not final, what the chunks known so far determine.
    pub fn source(self: &Arc<Self>, opts: OrderOptions, single_pass: bool) -> Result<Arc<dyn Source>> {
        if self.is_empty() && self.final_plan {
            return Err(Error::Config(format!("{}: cache holds no contexts", self.root.display())));
        }
        if opts.ideal_readers == 0 {
            return Err(Error::Config("ideal_readers must be positive".into()));
        }
        Ok(match &self.growing {
            Some(g) if !self.final_plan => g.clone().source(self.clone(), opts, single_pass),
            _ => cache_source(&self.sizes(), self.meta.chunk_size, self.order_block(), opts, single_pass),
        })
    }

    /// Contexts that later epochs keep together (§6): a `blocks.zst` block is decoded whole.
    pub fn order_block(&self) -> u64 {
        if self.meta.format == Format::BlocksZst {
            self.layout.block_size()
        } else {
            1
        }
    }

    pub fn len(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn seqlen(&self) -> usize {
        self.meta.seqlen as usize
    }
    pub fn sizes(&self) -> Vec<u64> {
        self.chunks.iter().map(|c| c.size).collect()
    }
    /// R* when none is given: tokshuf.json `ideal_readers`, else min(64, number of chunks).
    /// (Following a streaming build, see `Follow::default_ideal_readers`.)
    pub fn default_ideal_readers(&self) -> u64 {
        self.meta.ideal_readers.unwrap_or_else(|| (self.chunks.len() as u64).clamp(1, 64))
    }
    /// (chunk, index) of the i-th context in manifest order.
    pub fn global_to_local(&self, i: u64) -> Option<(u64, u64)> {
        if i >= self.len() {
            return None;
        }
        let c = self.cumulative.partition_point(|&x| x <= i) - 1;
        Some((c as u64, i - self.cumulative[c]))
    }

    fn mapped(&self, c: u64) -> Result<Arc<Chunk>> {
        let maps = self.maps.get(|| Mutex::new(Maps::default()));
        {
            let mut g = maps.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(m) = g.by_chunk.get(&c) {
                if !self.evicted(c) {
                    return Ok(m.clone());
                }
                // A remote shard dropped from the local cache: unmap it so its disk space is
                // given back, and bring it in again.
                g.by_chunk.remove(&c);
                g.fifo.retain(|&x| x != c);
                self.block_cache().forget(c);
            }
        }
        // Map outside the lock: other threads keep reading other chunks meanwhile.
        let fresh = Arc::new(self.map_chunk(c)?);
        let mut g = maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = g.by_chunk.get(&c) {
            return Ok(m.clone());
        }
        if g.fifo.len() >= MAX_MAPPED {
            if let Some(old) = g.fifo.pop_front() {
                g.by_chunk.remove(&old);
            }
        }
        g.fifo.push_back(c);
        g.by_chunk.insert(c, fresh.clone());
        Ok(fresh)
    }

    /// Number of ids of example `index` of chunk `c` (a ragged cache; else `seqlen`).
    pub fn example_len(&self, c: u64, index: u64) -> Result<usize> {
        if !self.meta.ragged {
            return Ok(self.seqlen());
        }
        let chunk = self.mapped(c)?;
        self.layout.ragged_member(&chunk, &shard_path(&self.root, c), c, index).map(|m| m.1)
    }

    /// Read example `index` of ragged chunk `c` into the start of `out` (at least as long as
    /// the example); returns its length.
    pub fn read_ragged<T: Id>(&self, c: u64, index: u64, out: &mut [T]) -> Result<usize> {
        let chunk = self.mapped(c)?;
        let (data, len) = self.layout.ragged_member(&chunk, &shard_path(&self.root, c), c, index)?;
        if len > out.len() {
            return Err(Error::Config(format!("internal error: example of {len} ids in a row of {}", out.len())));
        }
        for (o, id) in out[..len].iter_mut().zip(crate::format::decode_ids(self.meta.dtype, data)) {
            *o = T::from_id(id);
        }
        Ok(len)
    }

    /// Examples `locs` ((chunk, index) pairs) of a ragged cache, each member found once, one
    /// mapping lookup per chunk: `with` gets each example's raw ids (of the cache's dtype) in
    /// the order of `locs`.
    pub fn with_ragged<R>(&self, locs: &[(u64, u64)], with: impl FnOnce(&[&[u8]]) -> R) -> Result<R> {
        let mut chunks: Vec<u64> = locs.iter().map(|&(c, _)| c).collect();
        chunks.sort_unstable();
        chunks.dedup();
        let maps = chunks.iter().map(|&c| self.mapped(c)).collect::<Result<Vec<_>>>()?;
        let mut members = Vec::with_capacity(locs.len());
        for &(c, index) in locs {
            let k = chunks.binary_search(&c).map_err(|_| Error::Config("internal error: a chunk left unmapped".into()))?;
            members.push(self.layout.ragged_member(&maps[k], &shard_path(&self.root, c), c, index)?.0);
        }
        Ok(with(&members))
    }

    fn block_cache(&self) -> &BlockCache {
        self.blocks.get(|| BlockCache::new(self.layout.block_bytes()))
    }

    fn map_chunk(&self, c: u64) -> Result<Chunk> {
        let path = shard_path(&self.root, c);
        let entry = &self.entry(c).ok_or_else(|| Error::corrupt(&path, format!("chunk {c} is not in the cache's plan or manifest")))?;
        let open = || File::open(&path);
        let opened = match &self.remote {
            None => open(),
            Some(r) => {
                let w = r.want(c).ok_or_else(|| Error::corrupt(&path, format!("chunk {c} is not in the remote cache's manifest yet")))?;
                // Another cache sharing the folder may evict the shard between `get` and the
                // open: it is then fetched again.
                let mut tries = 0;
                loop {
                    r.cache.get(&w)?;
                    match open() {
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
                        other => break other,
                    }
                }
            }
        };
        let f = opened.map_err(|e| Error::corrupt(&path, format!("cannot open shard: {e}")))?;
        let len = f.metadata().map_err(|e| Error::io(&path, e))?.len();
        // SAFETY: shards are immutable once renamed into place; a file truncated behind our back
        // is the one case a map cannot guard against (its size is checked right here).
        let mmap = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&path, e))?;
        if mmap.len() as u64 != len {
            return Err(Error::corrupt(&path, "shard changed while being mapped"));
        }
        self.layout.open(&path, c, entry, mmap)
    }

    /// Read contexts `locs` ((chunk, index) pairs) into the rows of `out` (len = pairs *
    /// seqlen), writing every element. Rows are read grouped by chunk (one mapping lookup per
    /// chunk), each chunk's rows in the order of `locs`: a shuffled epoch's rows are scattered
    /// over the chunk anyway, and so the rows of `out` are written front to back (sorting them
    /// by context as well cost more than it saved). Rows stored as they are (`npy`, `blocks`)
    /// are copied last, all together, so that `gather` can prefetch the rows to come while it
    /// copies one.
    pub fn read_many<T: Id>(&self, locs: &[(u64, u64)], out: &mut [MaybeUninit<T>]) -> Result<()> {
        debug_assert_eq!(out.len(), locs.len() * self.seqlen());
        let batch_bytes = std::mem::size_of_val(out);
        self.read_rows(locs, out.chunks_exact_mut(self.seqlen()).collect(), batch_bytes)
    }

    /// `read_many` into rows that need not be side by side: a blend's component fills some
    /// rows of a batch of `batch_bytes`, all in one call, so that its rows are prefetched
    /// and stored as a whole batch's are.
    pub fn read_rows<T: Id>(&self, locs: &[(u64, u64)], rows: Vec<&mut [MaybeUninit<T>]>, batch_bytes: usize) -> Result<()> {
        debug_assert_eq!(rows.len(), locs.len());
        debug_assert!(rows.iter().all(|r| r.len() == self.seqlen()));
        holds_ids(std::mem::size_of::<T>(), self.meta.dtype)?;
        let mut order: Vec<(u64, u64, u32)> = locs.iter().zip(0..).map(|(&(c, i), j)| (c, i, j)).collect();
        order.sort_by_key(|&(c, _, _)| c);
        // Each chunk's mapping, and its rows' range of `order`.
        let mut groups: Vec<(Arc<Chunk>, std::ops::Range<usize>)> = Vec::new();
        let mut k = 0;
        while k < order.len() {
            let (c, start) = (order[k].0, k);
            while k < order.len() && order[k].0 == c {
                k += 1;
            }
            groups.push((self.mapped(c)?, start..k));
        }
        let blocks = (self.meta.format == Format::BlocksZst).then(|| self.block_cache());
        let mut rows = rows.into_iter().map(Some).collect::<Vec<_>>();
        let mut copies = Vec::with_capacity(order.len());
        for (chunk, range) in &groups {
            let c = order[range.start].0;
            let path = shard_path(&self.root, c);
            for &(_, i, j) in &order[range.clone()] {
                let Some(row) = rows[j as usize].take() else { continue };
                match self.layout.fixed_row(chunk, i) {
                    Some(ids) => copies.push((ids, row)),
                    None => self.layout.read_row(chunk, &path, c, i, blocks, row)?,
                }
            }
        }
        copy_rows(self.meta.dtype, &mut copies, batch_bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_rejects_crafted_lines() {
        let p = Path::new("manifest.jsonl");
        let ok = b"{\"shard\":\"shard_00000000\",\"num_sequences\":4}\n{\"shard\":\"shard_00000001\",\"num_sequences\":2,\"bytes\":10}\n";
        let got = parse_manifest(p, ok, 0, 4).unwrap();
        assert_eq!(got, vec![ChunkEntry { size: 4, bytes: None }, ChunkEntry { size: 2, bytes: Some(10) }]);
        for bad in [
            &b"{\"shard\":\"../shard_00000000\",\"num_sequences\":4}\n"[..],
            b"{\"shard\":\"/etc/passwd\",\"num_sequences\":4}\n",
            b"{\"shard\":\"shard_00000001\",\"num_sequences\":4}\n",
            b"{\"shard\":\"shard_00000000\",\"num_sequences\":-1}\n",
            b"{\"shard\":\"shard_00000000\",\"num_sequences\":5}\n",
            b"{\"shard\":\"shard_00000000\",\"num_sequences\":0}\n",
            b"{\"shard\":\"shard_00000000\",\"num_sequences\":4}",
            b"{\"shard\":\"shard_00000000\",\"num_sequences\":4}\n\n",
            b"[1]\n",
        ] {
            let e = parse_manifest(p, bad, 0, 4).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        }
        assert!(parse_manifest(p, b"", 0, 4).unwrap().is_empty());
        // Parallel parsing numbers lines as the sequential one does.
        let big: String = (0..40_000).map(|k| format!("{{\"shard\":\"shard_{k:08}\",\"num_sequences\":4}}\n")).collect();
        assert_eq!(parse_manifest_all(p, big.as_bytes(), 4).unwrap().len(), 40_000);
        let bad = big.replace("shard_00031234", "shard_00031299");
        let e = parse_manifest_all(p, bad.as_bytes(), 4).unwrap_err().to_string();
        assert!(e.contains("line 31235"), "{e}");
    }

    #[test]
    fn per_process_slot_is_reused_within_a_process() {
        let p: PerProcess<Mutex<u32>> = PerProcess::new();
        *p.get(|| Mutex::new(1)).lock().unwrap() += 1;
        assert_eq!(*p.get(|| Mutex::new(100)).lock().unwrap(), 2);
    }
}
