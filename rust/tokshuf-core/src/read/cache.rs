//! An opened cache: random access to contexts (DESIGN §2-3). Opening runs the checks of
//! `validate`; shards are mapped lazily, on first use, at most `MAX_MAPPED` at a time (the
//! kernel limits mappings per process): `npy` chunks are read at their fixed stride, `json.gz`
//! chunks through an index of member offsets built by one scan of the tar headers (`members`).
//!
//! Fork safety: the mutable part (the mapped chunks) lives in a `PerProcess` slot, so a child
//! forked while a thread of the parent held its lock starts from a fresh slot.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use memmap2::Mmap;
use sha2::{Digest, Sha256};

pub use super::members::Id;
use super::members::{header_name_is, index_json_gz, parse_id_list};
use super::order::{cache_source, OrderOptions, Source};
use super::per_process::PerProcess;
pub use super::validate::{
    check_shard, check_shards_of, parse_manifest, parse_manifest_all, read_meta, recipe_fingerprint, CacheMeta, ChunkEntry,
};
use super::validate::{check_shards, check_size};
use crate::error::{Error, Result};
use crate::format::{self, shard_path, Dtype, Format, MANIFEST_NAME, META_NAME};

/// Chunks mapped at once per cache and process (Linux allows ~65k mappings per process).
const MAX_MAPPED: usize = 1024;

/// A chunk ready to read.
enum Mapped {
    Npy(Mmap),
    /// Data range of each member.
    JsonGz(Mmap, Vec<(usize, usize)>),
    /// Members of their own lengths (an unpacked cache's bin), and the shard's `.idx` sidecar.
    Ragged(Mmap, Vec<u8>),
}

#[derive(Default)]
struct Maps {
    by_chunk: HashMap<u64, Arc<Mapped>>,
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
    stride: u64,
    npy_header: Vec<u8>,
    maps: PerProcess<Mutex<Maps>>,
    /// A cache in an object store: shards are brought into `root` before they are mapped.
    remote: Option<(Arc<crate::storage::shard_cache::ShardCache>, Vec<crate::storage::shard_cache::Want>)>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cache({}, {} chunks)", self.root.display(), self.chunks.len())
    }
}

impl Cache {
    pub fn open(root: &Path) -> Result<Cache> {
        Self::open_with(root, true)
    }

    /// `check_files`: stat every shard now (else each shard's size is checked when it is
    /// first mapped, which every read does anyway; for very large caches opened often).
    pub fn open_with(root: &Path, check_files: bool) -> Result<Cache> {
        let meta = read_meta(root, true)?;
        let mpath = root.join(MANIFEST_NAME);
        let text = std::fs::read(&mpath).map_err(|e| Error::corrupt(&mpath, format!("cannot read: {e}")))?;
        let chunks = parse_manifest_all(&mpath, &text, meta.chunk_size)?;
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
        let stride = format::npy_stride(meta.dtype, meta.seqlen);
        if check_files {
            check_shards(root, &chunks, meta.format, stride)?;
        }
        let mut h = Sha256::new();
        h.update(b"tokshuf-cache-v1\0");
        h.update(&text);
        h.update(b"\0");
        h.update(serde_json::to_string(&meta.raw["recipe"]).unwrap_or_default().as_bytes());
        let fingerprint = crate::format::hex(&h.finalize());
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
            npy_header: format::npy_header(meta.dtype, meta.seqlen),
            stride: if meta.ragged { super::validate::RAGGED } else { format::npy_stride(meta.dtype, meta.seqlen) },
            meta,
            chunks,
            cumulative,
            fingerprint: fingerprint.unwrap_or_else(|| recipe_fingerprint.clone()),
            recipe_fingerprint,
            final_plan,
            growing,
            maps: PerProcess::new(),
            remote: None,
        }
    }

    /// Serve shards through `shards` (see `read::remote`); `wants[c]` describes chunk c.
    pub(crate) fn attach_remote(
        &mut self,
        shards: Arc<crate::storage::shard_cache::ShardCache>,
        wants: Vec<crate::storage::shard_cache::Want>,
    ) {
        self.remote = Some((shards, wants));
    }

    /// A cache in an object store (`read::remote`).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// A remote cache whose local copy of chunk `c` was evicted.
    fn evicted(&self, c: u64) -> bool {
        match &self.remote {
            Some((shards, wants)) => wants.get(c as usize).is_some_and(|w| !shards.holds(&w.name)),
            None => false,
        }
    }

    /// A remote cache: download these chunks ahead, in this order, as the budget allows.
    pub fn prefetch_chunks(&self, order: &[u64]) {
        if let Some((shards, wants)) = &self.remote {
            shards.prefetch(order.iter().filter_map(|&c| wants.get(c as usize).cloned()).collect());
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
        check_shard(&self.root, c, entry, self.meta.format, self.stride).map(|_| ())
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
            _ => cache_source(&self.sizes(), self.meta.chunk_size, opts, single_pass),
        })
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

    fn mapped(&self, c: u64) -> Result<Arc<Mapped>> {
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

    fn map_chunk(&self, c: u64) -> Result<Mapped> {
        let path = shard_path(&self.root, c);
        let entry = &self.entry(c).ok_or_else(|| Error::corrupt(&path, format!("chunk {c} is not in the cache's plan or manifest")))?;
        if let Some((shards, wants)) = &self.remote {
            if let Some(w) = wants.get(c as usize) {
                shards.get(w)?;
            }
        }
        let f = File::open(&path).map_err(|e| Error::corrupt(&path, format!("cannot open shard: {e}")))?;
        let len = f.metadata().map_err(|e| Error::io(&path, e))?.len();
        // SAFETY: shards are immutable once renamed into place; a file truncated behind our back
        // is the one case a map cannot guard against (its size is checked right here).
        let mmap = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&path, e))?;
        if mmap.len() as u64 != len {
            return Err(Error::corrupt(&path, "shard changed while being mapped"));
        }
        match self.meta.format {
            Format::Npy if self.meta.ragged => {
                check_size(&path, entry, len, Format::Npy, self.stride)?;
                let ipath = format::idx::idx_path(&self.root, c);
                let idx = std::fs::read(&ipath).map_err(|e| Error::corrupt(&ipath, format!("cannot read the shard's index: {e}")))?;
                format::idx::check(&ipath, &idx, entry.size, len)?;
                Ok(Mapped::Ragged(mmap, idx))
            }
            Format::Npy => {
                check_size(&path, entry, len, Format::Npy, self.stride)?;
                for i in [0, entry.size - 1] {
                    let at = (i * self.stride) as usize;
                    let header = &mmap[at..at + 512];
                    let name = format::member_name(c, i, Format::Npy);
                    if !header_name_is(header, &name) {
                        return Err(Error::corrupt(&path, format!("member {i} is not named {name:?}: not the fixed-stride layout")));
                    }
                    let h = &mmap[at + 512..at + 512 + self.npy_header.len()];
                    if h != self.npy_header.as_slice() {
                        return Err(Error::corrupt(&path, format!("member {name}: npy header differs from the cache's dtype/seqlen")));
                    }
                }
                Ok(Mapped::Npy(mmap))
            }
            Format::JsonGz => {
                check_size(&path, entry, len, Format::JsonGz, self.stride)?;
                let members = index_json_gz(&path, &mmap, c, entry.size)?;
                Ok(Mapped::JsonGz(mmap, members))
            }
        }
    }

    /// Member `index` of a ragged chunk: its ids' bytes and their number, checked against the
    /// member's tar and npy headers.
    fn ragged_member<'m>(&self, mmap: &'m [u8], idx: &[u8], c: u64, index: u64) -> Result<(&'m [u8], usize)> {
        let path = || shard_path(&self.root, c);
        let name = format::member_name(c, index, Format::Npy);
        let (start, end) = (format::idx::offset(idx, index) as usize, format::idx::offset(idx, index + 1) as usize);
        let header = &mmap[start..start + format::TAR_BLOCK as usize];
        if !header_name_is(header, &name) {
            return Err(Error::corrupt(path(), format!("member {index} is not named {name:?} where the index says")));
        }
        let size = super::members::member_size(header).ok_or_else(|| Error::corrupt(path(), format!("member {name}: unreadable size")))?;
        let data_at = start + format::TAR_BLOCK as usize;
        let data = mmap.get(data_at..data_at + size).filter(|_| data_at + size <= end);
        let data = data.ok_or_else(|| Error::corrupt(path(), format!("member {name}: size {size} runs past the next member")))?;
        let dsize = self.meta.dtype.size();
        let hlen = if data.len() >= 10 && data.starts_with(b"\x93NUMPY\x01\x00") {
            10 + u16::from_le_bytes([data[8], data[9]]) as usize
        } else {
            usize::MAX
        };
        let len = (size.saturating_sub(hlen)) / dsize;
        if hlen > size
            || (size - hlen) % dsize != 0
            || len as u64 > self.meta.seqlen
            || data[..hlen] != npy_header_of(self.meta.dtype, len)[..]
        {
            return Err(Error::corrupt(
                path(),
                format!("member {name}: not a 1-D npy array of at most {} ids of the cache's dtype", self.meta.seqlen),
            ));
        }
        Ok((&data[hlen..], len))
    }

    /// Number of ids of example `index` of chunk `c` (a ragged cache; else `seqlen`).
    pub fn example_len(&self, c: u64, index: u64) -> Result<usize> {
        if !self.meta.ragged {
            return Ok(self.seqlen());
        }
        match &*self.mapped(c)? {
            Mapped::Ragged(mmap, idx) => self.ragged_member(mmap, idx, c, index).map(|m| m.1),
            _ => Ok(self.seqlen()),
        }
    }

    /// Read example `index` of ragged chunk `c` into the start of `out` (at least as long as
    /// the example); returns its length.
    pub fn read_ragged<T: Id>(&self, c: u64, index: u64, out: &mut [T]) -> Result<usize> {
        let m = self.mapped(c)?;
        let Mapped::Ragged(mmap, idx) = &*m else {
            return Err(Error::Config("internal error: read_ragged on a cache of fixed-length contexts".into()));
        };
        let (data, len) = self.ragged_member(mmap, idx, c, index)?;
        if len > out.len() {
            return Err(Error::Config(format!("internal error: example of {len} ids in a row of {}", out.len())));
        }
        decode_into(self.meta.dtype, data, &mut out[..len]);
        Ok(len)
    }

    fn read_mapped<T: Id>(&self, mapped: &Mapped, c: u64, index: u64, out: &mut [T]) -> Result<()> {
        let seqlen = self.seqlen();
        debug_assert_eq!(out.len(), seqlen);
        match mapped {
            Mapped::Ragged(mmap, idx) => {
                // Random access by global index (`Cache.get`): the example, padded to the row.
                let (data, len) = self.ragged_member(mmap, idx, c, index)?;
                decode_into(self.meta.dtype, data, &mut out[..len]);
                let pad = self.meta.raw.get("pad_id").and_then(serde_json::Value::as_u64).unwrap_or(0) as u32;
                out[len..].fill(T::from_id(pad));
                Ok(())
            }
            Mapped::Npy(mmap) => {
                let at = (index * self.stride + format::TAR_BLOCK) as usize + self.npy_header.len();
                match self.meta.dtype {
                    Dtype::Uint16 => {
                        let src = &mmap[at..at + 2 * seqlen];
                        for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                            *o = T::from_id(u16::from_le_bytes([b[0], b[1]]) as u32);
                        }
                    }
                    Dtype::Uint32 => {
                        let src = &mmap[at..at + 4 * seqlen];
                        for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                            *o = T::from_id(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                        }
                    }
                }
                Ok(())
            }
            Mapped::JsonGz(mmap, members) => {
                let (start, len) = members[index as usize];
                let path = shard_path(&self.root, c);
                let name = format::member_name(c, index, Format::JsonGz);
                let mut text = Vec::with_capacity(seqlen * 6 + 2);
                let limit = (seqlen as u64) * 11 + 64;
                flate2::read::GzDecoder::new(&mmap[start..start + len])
                    .take(limit)
                    .read_to_end(&mut text)
                    .map_err(|e| Error::corrupt(&path, format!("member {name}: bad gzip data: {e}")))?;
                let max = match self.meta.dtype {
                    Dtype::Uint16 => u16::MAX as u64,
                    Dtype::Uint32 => u32::MAX as u64,
                };
                parse_id_list(&text, max, out).map_err(|reason| Error::corrupt(&path, format!("member {name}: {reason}")))
            }
        }
    }
}

/// The npy header of a member of `len` ids.
fn npy_header_of(dtype: Dtype, len: usize) -> Vec<u8> {
    format::npy_header(dtype, len as u64)
}

/// Decode little-endian ids of `dtype` from `src` into `out` (as many as `out` holds).
fn decode_into<T: Id>(dtype: Dtype, src: &[u8], out: &mut [T]) {
    match dtype {
        Dtype::Uint16 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = T::from_id(u16::from_le_bytes([b[0], b[1]]) as u32);
            }
        }
        Dtype::Uint32 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = T::from_id(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            }
        }
    }
}

impl Cache {
    /// Read many (chunk, index) pairs into `out` (len = pairs * seqlen), reusing mappings.
    pub fn read_many<T: Id>(&self, locs: impl Iterator<Item = (u64, u64)>, out: &mut [T]) -> Result<()> {
        let seqlen = self.seqlen();
        let mut last: Option<(u64, Arc<Mapped>)> = None;
        for ((c, i), row) in locs.zip(out.chunks_exact_mut(seqlen)) {
            let m = match &last {
                Some((lc, m)) if *lc == c => m.clone(),
                _ => {
                    let m = self.mapped(c)?;
                    last = Some((c, m.clone()));
                    m
                }
            };
            self.read_mapped(&m, c, i, row)?;
        }
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
    fn id_list_parsing() {
        let mut out = [0u32; 3];
        parse_id_list(b"[1,22,333]", 1000, &mut out).unwrap();
        assert_eq!(out, [1, 22, 333]);
        parse_id_list(b" [ 1 , 2,3 ] ", 1000, &mut out).unwrap();
        for bad in [&b"[1,2]"[..], b"[1,2,3,4]", b"[1,-2,3]", b"[1,2,3", b"1,2,3", b"[1,2,3]x", b"[1,2,99999]", b"[1,,3]"] {
            assert!(parse_id_list(bad, 1000, &mut out).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn per_process_slot_is_reused_within_a_process() {
        let p: PerProcess<Mutex<u32>> = PerProcess::new();
        *p.get(|| Mutex::new(1)).lock().unwrap() += 1;
        assert_eq!(*p.get(|| Mutex::new(100)).lock().unwrap(), 2);
    }
}
