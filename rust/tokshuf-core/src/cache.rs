//! Opening a finished cache: strict, cheap validation, then random access to contexts.
//!
//! Opening reads tokshuf.json and manifest.jsonl and stats every shard; it reads no shard data.
//! Every check names the file it failed on (`Error::Corrupt`). Shards are mapped lazily, on first
//! use, at most `MAX_MAPPED` at a time (the kernel limits mappings per process): `npy` chunks are
//! read at their fixed stride, `json.gz` chunks through an index of member offsets built by one
//! scan of the tar headers. Member names are checked against what the builder writes; nothing is
//! ever opened by a name read from a file.
//!
//! The open steps (`read_meta`, `parse_manifest`, `check_shard`) are separate functions so that a
//! reader following a running build (follow mode) can run them again on new shards.
//!
//! Fork safety: the mutable part (the mapped chunks) lives in a `PerProcess` slot, so a child
//! forked while a thread of the parent held its lock starts from a fresh slot.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::Mmap;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::build::{MANIFEST_NAME, META_NAME};
use crate::error::{Error, Result};
use crate::meta::{self, Dtype, Format};
use crate::shard;

/// Chunks mapped at once per cache and process (Linux allows ~65k mappings per process).
const MAX_MAPPED: usize = 1024;
/// Longest context the reader accepts (guards allocations driven by tokshuf.json).
const MAX_SEQLEN: u64 = 1 << 24;

/// The fields of tokshuf.json the reader relies on, validated.
#[derive(Clone, Debug)]
pub struct CacheMeta {
    pub seqlen: u64,
    pub dtype: Dtype,
    pub format: Format,
    pub chunk_size: u64,
    pub num_chunks: u64,
    pub num_contexts: u64,
    pub shuffle: bool,
    pub chunk_sizes: Option<Vec<u64>>,
    pub ideal_readers: Option<u64>,
    pub status: String,
    /// The whole document, as read.
    pub raw: Value,
}

/// One manifest line, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    pub size: u64,
    /// `bytes` from the manifest, if given.
    pub bytes: Option<u64>,
}

fn field_u64(path: &Path, v: &Value, key: &str) -> Result<u64> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| Error::corrupt(path, format!("{key:?} missing or not a non-negative integer")))
}

fn field_str<'a>(path: &Path, v: &'a Value, key: &str) -> Result<&'a str> {
    v.get(key).and_then(Value::as_str).ok_or_else(|| Error::corrupt(path, format!("{key:?} missing or not a string")))
}

/// Read and check tokshuf.json. `complete_only`: refuse a build still running.
pub fn read_meta(root: &Path, complete_only: bool) -> Result<CacheMeta> {
    let path = root.join(META_NAME);
    if !root.is_dir() {
        return Err(Error::io(root, std::io::Error::new(std::io::ErrorKind::NotFound, "no such cache folder")));
    }
    let raw: Value = meta::read_json(&path)?;
    if !raw.is_object() {
        return Err(Error::corrupt(&path, "not a JSON object"));
    }
    let version = field_u64(&path, &raw, "format_version")?;
    if version != meta::FORMAT_VERSION as u64 {
        return Err(Error::corrupt(&path, format!("format_version {version} is not supported (this tokshuf reads {})", meta::FORMAT_VERSION)));
    }
    let status = field_str(&path, &raw, "status")?.to_string();
    if complete_only && status != "complete" {
        return Err(Error::corrupt(&path, format!("status is {status:?}: the build is not finished (run it again to resume)")));
    }
    let seqlen = field_u64(&path, &raw, "seqlen")?;
    if seqlen == 0 || seqlen > MAX_SEQLEN {
        return Err(Error::corrupt(&path, format!("seqlen {seqlen} out of range 1..={MAX_SEQLEN}")));
    }
    let dtype = match field_str(&path, &raw, "dtype")? {
        "uint16" => Dtype::Uint16,
        "uint32" => Dtype::Uint32,
        other => return Err(Error::corrupt(&path, format!("dtype {other:?} is not uint16 or uint32"))),
    };
    let format = match field_str(&path, &raw, "format")? {
        "npy" => Format::Npy,
        "json.gz" => Format::JsonGz,
        other => return Err(Error::corrupt(&path, format!("format {other:?} is not npy or json.gz"))),
    };
    let chunk_size = field_u64(&path, &raw, "chunk_size")?;
    if chunk_size == 0 || chunk_size > u32::MAX as u64 {
        return Err(Error::corrupt(&path, format!("chunk_size {chunk_size} out of range")));
    }
    // An unfinished build ("building", "streaming") has no chunk plan yet (follow mode).
    let planned = status == "complete" || status == "writing";
    if !planned && !matches!(status.as_str(), "building" | "streaming") {
        return Err(Error::corrupt(&path, format!("unknown status {status:?}")));
    }
    let num_chunks = if planned { field_u64(&path, &raw, "num_chunks")? } else { 0 };
    let num_contexts = if planned { field_u64(&path, &raw, "num_contexts")? } else { 0 };
    let shuffle = raw.get("shuffle").and_then(Value::as_bool).unwrap_or(true);
    let chunk_sizes = match raw.get("chunk_sizes") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|x| x.as_u64().ok_or_else(|| Error::corrupt(&path, "chunk_sizes holds a value that is not a non-negative integer")))
                .collect::<Result<Vec<_>>>()?,
        ),
        Some(_) => return Err(Error::corrupt(&path, "chunk_sizes is not a list")),
    };
    let ideal_readers = match raw.get("ideal_readers") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(r) if r > 0 => Some(r),
            _ => return Err(Error::corrupt(&path, "ideal_readers is not a positive integer")),
        },
    };
    if raw.get("recipe").is_none_or(|r| !r.is_object()) {
        return Err(Error::corrupt(&path, "\"recipe\" missing or not an object"));
    }
    Ok(CacheMeta { seqlen, dtype, format, chunk_size, num_chunks, num_contexts, shuffle, chunk_sizes, ideal_readers, status, raw })
}

#[derive(Deserialize)]
struct RawLine<'a> {
    #[serde(borrow)]
    shard: std::borrow::Cow<'a, str>,
    num_sequences: u64,
    #[serde(default)]
    bytes: Option<u64>,
}

/// Parse manifest lines starting at line number `first` (0-based; follow mode appends).
/// Line k must name `shard_{k:08}`: nothing is ever opened by a name read from a file.
pub fn parse_manifest(path: &Path, text: &[u8], first: u64, chunk_size: u64) -> Result<Vec<ChunkEntry>> {
    if !text.is_empty() && !text.ends_with(b"\n") {
        return Err(Error::corrupt(path, "last line is not newline-terminated (truncated?)"));
    }
    let mut out = Vec::with_capacity(text.len() / 100);
    if text.is_empty() {
        return Ok(out);
    }
    for (k, line) in text[..text.len() - 1].split(|&b| b == b'\n').enumerate() {
        let lineno = first + k as u64;
        if line.is_empty() {
            return Err(Error::corrupt(path, format!("line {}: empty line", lineno + 1)));
        }
        let raw: RawLine = serde_json::from_slice(line)
            .map_err(|e| Error::corrupt(path, format!("line {}: {e}", lineno + 1)))?;
        let want = meta::shard_stem(lineno);
        if raw.shard != want {
            return Err(Error::corrupt(path, format!("line {}: shard {:?} is not {want:?} (shards must be named shard_NNNNNNNN in manifest order)", lineno + 1, raw.shard)));
        }
        if raw.num_sequences == 0 || raw.num_sequences > chunk_size {
            return Err(Error::corrupt(path, format!("line {}: num_sequences {} out of range 1..={chunk_size}", lineno + 1, raw.num_sequences)));
        }
        out.push(ChunkEntry { size: raw.num_sequences, bytes: raw.bytes });
    }
    Ok(out)
}

/// `parse_manifest` of a whole manifest, in parts on a few threads when it is large.
pub fn parse_manifest_all(path: &Path, text: &[u8], chunk_size: u64) -> Result<Vec<ChunkEntry>> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
    if text.len() < (1 << 20) || threads == 1 || !text.ends_with(b"\n") {
        return parse_manifest(path, text, 0, chunk_size);
    }
    // Cut after newlines, so every part is whole lines; number each part's first line.
    let mut cuts = vec![0usize];
    for t in 1..threads {
        let at = (text.len() * t / threads).max(*cuts.last().unwrap_or(&0));
        let next = text[at..].iter().position(|&b| b == b'\n').map_or(text.len(), |k| at + k + 1);
        cuts.push(next);
    }
    cuts.push(text.len());
    cuts.dedup();
    let mut firsts = vec![0u64];
    for w in cuts.windows(2).take(cuts.len().saturating_sub(2)) {
        let lines = text[w[0]..w[1]].iter().filter(|&&b| b == b'\n').count() as u64;
        firsts.push(firsts.last().copied().unwrap_or(0) + lines);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = cuts
            .windows(2)
            .zip(&firsts)
            .map(|(w, &first)| {
                let part = &text[w[0]..w[1]];
                s.spawn(move || parse_manifest(path, part, first, chunk_size))
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.extend(h.join().unwrap_or_else(|_| Err(Error::Config("manifest parser thread panicked".into())))?);
        }
        Ok(out)
    })
}

/// Shard path of chunk `c` (built from the index, never from a name read from disk).
pub fn shard_path(root: &Path, c: u64) -> PathBuf {
    root.join(format!("{}.tar", meta::shard_stem(c)))
}

/// Expected size of an `npy` shard of `n` contexts.
pub fn npy_shard_bytes(n: u64, stride: u64) -> u64 {
    n * stride + 2 * shard::TAR_BLOCK
}

/// Check that chunk `c`'s shard exists with a plausible size; returns the size.
pub fn check_shard(root: &Path, c: u64, entry: &ChunkEntry, format: Format, stride: u64) -> Result<u64> {
    let path = shard_path(root, c);
    let md = std::fs::symlink_metadata(&path).map_err(|e| Error::corrupt(&path, format!("shard missing or unreadable: {e}")))?;
    if !md.file_type().is_file() {
        return Err(Error::corrupt(&path, "not a regular file"));
    }
    let len = md.len();
    check_size(&path, entry, len, format, stride)?;
    Ok(len)
}

fn check_size(path: &Path, entry: &ChunkEntry, len: u64, format: Format, stride: u64) -> Result<()> {
    if let Some(b) = entry.bytes {
        if b != len {
            return Err(Error::corrupt(path, format!("size {len} bytes, manifest says {b} (truncated or changed?)")));
        }
    }
    match format {
        Format::Npy => {
            let want = npy_shard_bytes(entry.size, stride);
            if len != want {
                return Err(Error::corrupt(path, format!("size {len} bytes, expected {want} for {} contexts (truncated or changed?)", entry.size)));
            }
        }
        Format::JsonGz => {
            let min = (entry.size * 2 + 2) * shard::TAR_BLOCK;
            if len < min || len % shard::TAR_BLOCK != 0 {
                return Err(Error::corrupt(path, format!("size {len} bytes cannot hold {} json.gz members (truncated?)", entry.size)));
            }
        }
    }
    Ok(())
}

/// A value that belongs to one process: after a fork the child gets a fresh one, never touching
/// the parent's (whose locks may have been held by threads that do not exist in the child).
/// Replaced slots are leaked on purpose: at most one per fork.
pub struct PerProcess<T> {
    ptr: AtomicPtr<(u32, T)>,
}

impl<T> PerProcess<T> {
    pub fn new() -> Self {
        PerProcess { ptr: AtomicPtr::new(std::ptr::null_mut()) }
    }
    pub fn get(&self, make: impl FnOnce() -> T) -> &T {
        let pid = std::process::id();
        let cur = self.ptr.load(Ordering::Acquire);
        // SAFETY: non-null pointers come from Box::into_raw below and are freed only in Drop.
        if !cur.is_null() && unsafe { (*cur).0 } == pid {
            return unsafe { &(*cur).1 };
        }
        let fresh = Box::into_raw(Box::new((pid, make())));
        match self.ptr.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => unsafe { &(*fresh).1 },
            Err(other) => {
                // Another thread of this process installed one first.
                drop(unsafe { Box::from_raw(fresh) });
                unsafe { &(*other).1 }
            }
        }
    }
}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let p = *self.ptr.get_mut();
        if !p.is_null() && unsafe { (*p).0 } == std::process::id() {
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// A chunk ready to read.
enum Mapped {
    Npy(Mmap),
    /// Data range of each member.
    JsonGz(Mmap, Vec<(usize, usize)>),
}

#[derive(Default)]
struct Maps {
    by_chunk: HashMap<u64, Arc<Mapped>>,
    fifo: VecDeque<u64>,
}

/// Output element types of the reader.
pub trait Id: Copy + Default + Send + Sync + 'static {
    fn from_id(x: u32) -> Self;
}
impl Id for u16 {
    #[inline]
    fn from_id(x: u32) -> Self {
        x as u16
    }
}
impl Id for u32 {
    #[inline]
    fn from_id(x: u32) -> Self {
        x
    }
}
impl Id for i32 {
    #[inline]
    fn from_id(x: u32) -> Self {
        x as i32
    }
}
impl Id for i64 {
    #[inline]
    fn from_id(x: u32) -> Self {
        x as i64
    }
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
    /// Set when opened in follow mode on an unfinished build.
    pub follow: Option<crate::follow::Follow>,
    stride: u64,
    npy_header: Vec<u8>,
    maps: PerProcess<Mutex<Maps>>,
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
            return Err(Error::corrupt(&mpath, format!("num_sequences add up to {total}, tokshuf.json says num_contexts {}", meta.num_contexts)));
        }
        if let Some(sizes) = &meta.chunk_sizes {
            if sizes.len() != chunks.len() || sizes.iter().zip(&chunks).any(|(a, b)| *a != b.size) {
                return Err(Error::corrupt(&meta_path, "chunk_sizes does not match the manifest's num_sequences"));
            }
        } else if let Some(k) = chunks.iter().take(chunks.len().saturating_sub(1)).position(|c| c.size != meta.chunk_size) {
            return Err(Error::corrupt(&mpath, format!("line {}: only the last chunk of a shuffled cache may hold fewer than {} contexts", k + 1, meta.chunk_size)));
        }
        let stride = shard::npy_stride(meta.dtype, meta.seqlen);
        if check_files {
            check_shards(root, &chunks, meta.format, stride)?;
        }
        let mut h = Sha256::new();
        h.update(b"tokshuf-cache-v1\0");
        h.update(&text);
        h.update(b"\0");
        h.update(serde_json::to_string(&meta.raw["recipe"]).unwrap_or_default().as_bytes());
        let fingerprint = crate::tokenizer::hex(&h.finalize());
        Ok(Cache::from_parts(root, meta, chunks, Some(fingerprint), None))
    }

    pub(crate) fn from_parts(
        root: &Path,
        meta: CacheMeta,
        chunks: Vec<ChunkEntry>,
        fingerprint: Option<String>,
        follow: Option<crate::follow::Follow>,
    ) -> Cache {
        let mut cumulative = Vec::with_capacity(chunks.len() + 1);
        cumulative.push(0u64);
        for c in &chunks {
            cumulative.push(cumulative.last().copied().unwrap_or(0) + c.size);
        }
        let recipe_fingerprint = recipe_fingerprint(&meta.raw);
        let final_plan = follow.as_ref().is_none_or(|f| f.plan_final_at_open);
        Cache {
            root: root.to_path_buf(),
            npy_header: shard::npy_header(meta.dtype, meta.seqlen),
            stride: shard::npy_stride(meta.dtype, meta.seqlen),
            meta,
            chunks,
            cumulative,
            fingerprint: fingerprint.unwrap_or_else(|| recipe_fingerprint.clone()),
            recipe_fingerprint,
            final_plan,
            follow,
            maps: PerProcess::new(),
        }
    }

    /// Chunk `c`'s entry: from the plan, or (following a streaming build) the manifest lines
    /// seen so far.
    pub fn entry(&self, c: u64) -> Option<ChunkEntry> {
        match self.chunks.get(c as usize) {
            Some(e) => Some(*e),
            None => self.follow.as_ref().and_then(|f| f.entry(c)),
        }
    }

    /// Follow mode: wait until chunk `c`'s shard exists (and passes the size checks). At once
    /// for a cache that was complete when opened.
    pub fn wait_chunk(&self, c: u64, cancel: &std::sync::atomic::AtomicBool) -> Result<()> {
        let Some(f) = &self.follow else { return Ok(()) };
        if f.is_ready(c) {
            return Ok(());
        }
        f.wait(cancel, &|| format!("shard {}", shard_path(&self.root, c).display()), &mut |f| {
            if self.entry(c).is_none() {
                f.refresh()?;
            }
            let Some(entry) = self.entry(c) else { return Ok(None) };
            let path = shard_path(&self.root, c);
            if !path.exists() {
                return Ok(None);
            }
            // Shards appear by rename with their final bytes: one that exists must pass.
            check_shard(&self.root, c, &entry, self.meta.format, self.stride)?;
            f.set_ready(c);
            Ok(Some(()))
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
        if let Some(m) = maps.lock().unwrap_or_else(|e| e.into_inner()).by_chunk.get(&c) {
            return Ok(m.clone());
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
        let f = File::open(&path).map_err(|e| Error::corrupt(&path, format!("cannot open shard: {e}")))?;
        let len = f.metadata().map_err(|e| Error::io(&path, e))?.len();
        // SAFETY: shards are immutable once renamed into place; a file truncated behind our back
        // is the one case a map cannot guard against (its size is checked right here).
        let mmap = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&path, e))?;
        if mmap.len() as u64 != len {
            return Err(Error::corrupt(&path, "shard changed while being mapped"));
        }
        match self.meta.format {
            Format::Npy => {
                check_size(&path, entry, len, Format::Npy, self.stride)?;
                for i in [0, entry.size - 1] {
                    let at = (i * self.stride) as usize;
                    let header = &mmap[at..at + 512];
                    let name = shard::member_name(c, i, Format::Npy);
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

    /// Copy context `index` of chunk `c` into `out` (len seqlen).
    pub fn read_into<T: Id>(&self, c: u64, index: u64, out: &mut [T]) -> Result<()> {
        let mapped = self.mapped(c)?;
        self.read_mapped(&mapped, c, index, out)
    }

    fn read_mapped<T: Id>(&self, mapped: &Mapped, c: u64, index: u64, out: &mut [T]) -> Result<()> {
        let seqlen = self.seqlen();
        debug_assert_eq!(out.len(), seqlen);
        match mapped {
            Mapped::Npy(mmap) => {
                let at = (index * self.stride + shard::TAR_BLOCK) as usize + self.npy_header.len();
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
                let name = shard::member_name(c, index, Format::JsonGz);
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

/// Hex sha256 of tokshuf.json's recipe: what a build was asked to make (known from its start).
pub fn recipe_fingerprint(raw: &Value) -> String {
    let mut h = Sha256::new();
    h.update(b"tokshuf-recipe-v1\0");
    h.update(serde_json::to_string(&raw["recipe"]).unwrap_or_default().as_bytes());
    crate::tokenizer::hex(&h.finalize())
}

/// Chunk number of a shard file name `shard_NNNNNNNN.tar` (as the builder writes it).
fn shard_number(name: &std::ffi::OsStr) -> Option<u64> {
    let name = name.to_str()?;
    let digits = name.strip_prefix("shard_")?.strip_suffix(".tar")?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let c: u64 = digits.parse().ok()?;
    (meta::shard_stem(c) + ".tar" == name).then_some(c)
}

/// Check the size of every shard. One directory listing, then `fstatat` relative to the
/// directory (no path walk per shard), on a few threads when there are many: opening a cache
/// of 100,000 chunks is dominated by these 100,000 stat calls.
fn check_shards(root: &Path, chunks: &[ChunkEntry], format: Format, stride: u64) -> Result<()> {
    let mut entries: Vec<Option<std::fs::DirEntry>> = (0..chunks.len()).map(|_| None).collect();
    for e in std::fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let e = e.map_err(|e| Error::io(root, e))?;
        if let Some(c) = shard_number(&e.file_name()) {
            if let Some(slot) = entries.get_mut(c as usize) {
                *slot = Some(e);
            }
        }
    }
    let check = |c: usize, e: &Option<std::fs::DirEntry>| -> Result<()> {
        let path = shard_path(root, c as u64);
        let Some(e) = e else {
            return Err(Error::corrupt(&path, "shard missing"));
        };
        let md = e.metadata().map_err(|err| Error::corrupt(&path, format!("cannot stat shard: {err}")))?;
        if !md.file_type().is_file() {
            return Err(Error::corrupt(&path, "not a regular file"));
        }
        check_size(&path, &chunks[c], md.len(), format, stride)
    };
    let threads = if chunks.len() < 4096 { 1 } else { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8) };
    let per = chunks.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = entries
            .chunks(per)
            .enumerate()
            .map(|(t, part)| s.spawn(move || part.iter().enumerate().try_for_each(|(k, e)| check(t * per + k, e))))
            .collect();
        // Report the error of the lowest chunk, whatever the thread timing.
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(Error::Config("shard check thread panicked".into()))))
    })
}

fn header_name_is(header: &[u8], name: &str) -> bool {
    let field = &header[..100];
    let n = name.len();
    n < 100 && &field[..n] == name.as_bytes() && field[n..].iter().all(|&b| b == 0) && header[345..500].iter().all(|&b| b == 0)
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let s = field.iter().position(|&b| b != b' ').unwrap_or(field.len());
    let mut v: u64 = 0;
    let mut digits = 0;
    for &b in &field[s..] {
        match b {
            b'0'..=b'7' => {
                v = v.checked_mul(8)?.checked_add((b - b'0') as u64)?;
                digits += 1;
            }
            0 | b' ' => break,
            _ => return None,
        }
    }
    (digits > 0).then_some(v)
}

/// Offsets of the data of each member of a json.gz shard, checking names, types, checksums and
/// that exactly `n` members are followed by the end-of-archive blocks.
fn index_json_gz(path: &Path, data: &[u8], chunk: u64, n: u64) -> Result<Vec<(usize, usize)>> {
    let block = shard::TAR_BLOCK as usize;
    let mut members = Vec::with_capacity(n as usize);
    let mut off = 0usize;
    for i in 0..n {
        let name = shard::member_name(chunk, i, Format::JsonGz);
        let bad = |reason: String| Error::corrupt(path, format!("member {i} at byte {off}: {reason}"));
        if off + block > data.len() {
            return Err(bad("archive ends early".into()));
        }
        let h = &data[off..off + block];
        let stored = parse_octal(&h[148..156]).ok_or_else(|| bad("unreadable header checksum".into()))?;
        let sum: u64 = h.iter().enumerate().map(|(k, &b)| if (148..156).contains(&k) { b' ' as u64 } else { b as u64 }).sum();
        if sum != stored {
            return Err(bad("header checksum mismatch".into()));
        }
        if !header_name_is(h, &name) {
            return Err(bad(format!("not named {name:?}")));
        }
        if !matches!(h[156], b'0' | 0) {
            return Err(bad("not a regular file member".into()));
        }
        let size = parse_octal(&h[124..136]).ok_or_else(|| bad("unreadable size".into()))? as usize;
        let start = off + block;
        let end = start.checked_add(size.div_ceil(block) * block).filter(|&e| e + 2 * block <= data.len());
        let end = end.ok_or_else(|| bad(format!("size {size} runs past the end of the shard")))?;
        members.push((start, size));
        off = end;
    }
    if data.len() - off != 2 * block || data[off..].iter().any(|&b| b != 0) {
        return Err(Error::corrupt(path, format!("expected the end of the archive after {n} members at byte {off}")));
    }
    Ok(members)
}

/// Parse a compact JSON list of ids (`[1,2,3]`, whitespace tolerated) into `out` exactly.
fn parse_id_list<T: Id>(text: &[u8], max: u64, out: &mut [T]) -> std::result::Result<(), String> {
    let mut pos = 0usize;
    let skip_ws = |pos: &mut usize| {
        while *pos < text.len() && matches!(text[*pos], b' ' | b'\n' | b'\r' | b'\t') {
            *pos += 1;
        }
    };
    skip_ws(&mut pos);
    if text.get(pos) != Some(&b'[') {
        return Err("not a JSON list of ids".into());
    }
    pos += 1;
    let mut count = 0usize;
    loop {
        skip_ws(&mut pos);
        if count == 0 && text.get(pos) == Some(&b']') {
            pos += 1;
            break;
        }
        let start = pos;
        let mut v: u64 = 0;
        while pos < text.len() && text[pos].is_ascii_digit() {
            v = v * 10 + (text[pos] - b'0') as u64;
            if v > max {
                return Err(format!("id at position {count} exceeds {max}"));
            }
            pos += 1;
        }
        if pos == start {
            return Err(format!("position {count} is not a non-negative integer"));
        }
        if count >= out.len() {
            return Err(format!("more than {} ids", out.len()));
        }
        out[count] = T::from_id(v as u32);
        count += 1;
        skip_ws(&mut pos);
        match text.get(pos) {
            Some(b',') => pos += 1,
            Some(b']') => {
                pos += 1;
                break;
            }
            _ => return Err("malformed JSON list".into()),
        }
    }
    skip_ws(&mut pos);
    if pos != text.len() {
        return Err("trailing bytes after the JSON list".into());
    }
    if count != out.len() {
        return Err(format!("{count} ids, expected {}", out.len()));
    }
    Ok(())
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
