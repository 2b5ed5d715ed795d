//! Writing one chunk as a WebDataset tar (DESIGN §3; the layout itself is `format::layout`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::writeback::{self, Streamed};
use crate::error::{Error, Result};
use crate::format::{self, decode_ids, member_name, npy_header, Blocking, Dtype, Format, ManifestLine};
use crate::testhook;

/// Writes members to a tar, hashing every byte on the way. The tar is written here rather than
/// through `tar::Builder` (the same bytes: each member's header, its data, zeros to the next
/// 512-byte block, and 1,024 zeros at the end) so that a member's data goes from the caller's
/// buffer into the block written to the file in one copy.
pub struct ShardWriter {
    sink: Sink,
    chunk: u64,
    /// Members written so far.
    index: u64,
    format: Format,
    dtype: Dtype,
    npy_header: Vec<u8>,
    buf: Vec<u8>,
    /// Where each member's tar header starts, then where the next one would (see `format::idx`).
    offsets: Vec<u64>,
    /// Block formats: contexts per member, and the contexts of the member being filled.
    blocking: Option<Blocking>,
    pending: Vec<u8>,
    pending_rows: u64,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl ShardWriter {
    pub fn create(path: &Path, chunk: u64, spec: &ShardSpec) -> Result<Self> {
        let (format, dtype, seqlen) = (spec.format, spec.dtype, spec.seqlen);
        let blocking =
            format.is_blocked().then(|| Blocking { block_size: spec.block_size.unwrap_or(format::DEFAULT_BLOCK_SIZE), seqlen, dtype });
        let zstd = match format {
            Format::BlocksZst => {
                let level = spec.zstd_level.unwrap_or(format::ZSTD_LEVEL);
                let mut z = zstd::bulk::Compressor::new(level).map_err(|e| Error::io(path, e))?;
                // A checksum in every frame: a damaged member fails to decode instead of
                // yielding wrong ids.
                z.include_checksum(true).map_err(|e| Error::io(path, e))?;
                z.include_contentsize(true).map_err(|e| Error::io(path, e))?;
                Some(z)
            }
            _ => None,
        };
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        // Shards are not read again by the build: their pages leave the page cache once written.
        let f = Streamed::new(f, writeback::Cache::Drop);
        Ok(ShardWriter {
            sink: Sink::new(f, spec.hash_helpers.clone()),
            chunk,
            index: 0,
            format,
            dtype,
            npy_header: npy_header(dtype, seqlen),
            buf: Vec::new(),
            offsets: vec![0],
            blocking,
            pending: Vec::new(),
            pending_rows: 0,
            zstd,
        })
    }

    /// Append one context, given as raw little-endian ids of the cache dtype.
    pub fn append(&mut self, raw: &[u8]) -> std::io::Result<()> {
        self.buf.clear();
        match self.format {
            Format::Npy => {
                let header = std::mem::take(&mut self.npy_header);
                let written = self.write_member(&[&header, raw]);
                self.npy_header = header;
                return written;
            }
            Format::JsonGz => {
                let mut json = Vec::with_capacity(raw.len() * 3);
                json.push(b'[');
                for (i, id) in decode_ids(self.dtype, raw).enumerate() {
                    if i > 0 {
                        json.push(b',');
                    }
                    json.extend_from_slice(id.to_string().as_bytes());
                }
                json.push(b']');
                let mut gz = flate2::GzBuilder::new().mtime(0).write(&mut self.buf, flate2::Compression::default());
                gz.write_all(&json)?;
                gz.finish()?;
            }
            Format::Blocks | Format::BlocksZst => {
                self.pending.extend_from_slice(raw);
                self.pending_rows += 1;
                if self.blocking.is_some_and(|b| self.pending_rows == b.block_size) {
                    self.flush_block()?;
                }
                return Ok(());
            }
        }
        let buf = std::mem::take(&mut self.buf);
        let written = self.write_member(&[&buf]);
        self.buf = buf;
        written
    }

    /// Write the contexts gathered so far as one member of a block format.
    fn flush_block(&mut self) -> std::io::Result<()> {
        let Some(blocking) = self.blocking else { return Ok(()) };
        if self.pending_rows == 0 {
            return Ok(());
        }
        let header = blocking.header(self.pending_rows);
        let pending = std::mem::take(&mut self.pending);
        let written = match self.zstd.as_mut() {
            Some(z) => {
                self.buf.clear();
                self.buf.extend_from_slice(&header);
                self.buf.extend_from_slice(&pending);
                let member = z.compress(&self.buf)?;
                self.write_member(&[&member])
            }
            None => self.write_member(&[&header, &pending]),
        };
        self.pending = pending;
        self.pending.clear();
        self.pending_rows = 0;
        written
    }

    /// One member whose data is `parts` one after another.
    fn write_member(&mut self, parts: &[&[u8]]) -> std::io::Result<()> {
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut header = tar::Header::new_ustar();
        header.set_path(member_name(self.chunk, self.index, self.format))?;
        header.set_size(size);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        self.sink.write_all(header.as_bytes())?;
        for part in parts {
            self.sink.write_all(part)?;
        }
        let padded = size.div_ceil(format::TAR_BLOCK) * format::TAR_BLOCK;
        self.sink.write_all(&[0; format::TAR_BLOCK as usize][..(padded - size) as usize])?;
        self.index += 1;
        let end = self.offsets.last().copied().unwrap_or(0) + format::TAR_BLOCK + padded;
        self.offsets.push(end);
        Ok(())
    }

    /// Append one example of its own length (unpacked caches: the npy header gives the length).
    pub fn append_ragged(&mut self, raw: &[u8]) -> std::io::Result<()> {
        self.npy_header = npy_header(self.dtype, (raw.len() / self.dtype.size()) as u64);
        self.append(raw)
    }

    /// Member offsets so far: the content of the shard's `.idx` sidecar.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// Finish the archive (two zero blocks), fsync it and return (bytes, sha256 hex).
    pub fn finish(mut self) -> std::io::Result<(u64, String)> {
        self.flush_block()?;
        self.sink.write_all(&[0; 2 * format::TAR_BLOCK as usize])?;
        let (mut f, bytes, hash) = self.sink.finish()?;
        f.sync()?;
        Ok((bytes, crate::format::hex(&hash)))
    }
}

/// Bytes a shard's blocks hold: each is written to the file, then hashed.
const BLOCK: usize = 1 << 20;
/// Blocks a helper may have yet to hash before the writer waits for it.
const HELPER_BLOCKS: usize = 2;

/// The bytes of a shard on their way to its file: gathered into blocks, each written and then
/// hashed, on the writer's thread or, once `HashHelpers` says a thread is idle, on a helper.
struct Sink {
    file: Streamed<File>,
    block: Vec<u8>,
    bytes: u64,
    hash: Hashing,
    helpers: Option<Arc<HashHelpers>>,
}

enum Hashing {
    Here(Sha256),
    /// Full blocks go to the helper, which hands each back once hashed, and the hash at the end.
    /// `made`: blocks allocated since, at most `HELPER_BLOCKS + 1`.
    Helper {
        blocks: SyncSender<Vec<u8>>,
        spare: Receiver<Vec<u8>>,
        done: JoinHandle<Sha256>,
        made: usize,
        _slot: HelperSlot,
    },
}

impl Hashing {
    /// A helper thread that goes on from `hasher`, in `slot` (None if no thread starts).
    fn helper(mut hasher: Sha256, slot: HelperSlot) -> Option<Hashing> {
        let (blocks, todo) = mpsc::sync_channel::<Vec<u8>>(HELPER_BLOCKS);
        let (back, spare) = mpsc::channel::<Vec<u8>>();
        let done = std::thread::Builder::new()
            .name("tokshuf-hash".into())
            .spawn(move || {
                for block in todo {
                    hasher.update(&block);
                    let _ = back.send(block);
                }
                hasher
            })
            .ok()?;
        slot.0.started.fetch_add(1, Ordering::Relaxed);
        Some(Hashing::Helper { blocks, spare, done, made: 0, _slot: slot })
    }
}

impl Sink {
    fn new(file: Streamed<File>, helpers: Option<Arc<HashHelpers>>) -> Sink {
        Sink { file, block: Vec::with_capacity(BLOCK), bytes: 0, hash: Hashing::Here(Sha256::new()), helpers }
    }

    /// Write the block to the file and hash it.
    fn write_block(&mut self) -> std::io::Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        self.file.write_all(&self.block)?;
        if let Hashing::Here(hasher) = &self.hash {
            let slot = self.helpers.as_ref().and_then(|h| h.claim());
            if let Some(helper) = slot.and_then(|slot| Hashing::helper(hasher.clone(), slot)) {
                self.hash = helper;
            }
        }
        match &mut self.hash {
            Hashing::Here(hasher) => {
                hasher.update(&self.block);
                self.block.clear();
            }
            Hashing::Helper { blocks, spare, made, .. } => {
                // Beyond HELPER_BLOCKS + 1 new blocks, the writer waits for one to come back.
                let mut next = match spare.try_recv() {
                    Ok(b) => b,
                    Err(_) if *made <= HELPER_BLOCKS => {
                        *made += 1;
                        Vec::with_capacity(BLOCK)
                    }
                    Err(_) => spare.recv().map_err(|_| helper_stopped())?,
                };
                next.clear();
                blocks.send(std::mem::replace(&mut self.block, next)).map_err(|_| helper_stopped())?;
            }
        }
        Ok(())
    }

    /// The file, the bytes written and their SHA-256.
    fn finish(mut self) -> std::io::Result<(Streamed<File>, u64, sha2::digest::Output<Sha256>)> {
        self.write_block()?;
        let hasher = match self.hash {
            Hashing::Here(h) => h,
            Hashing::Helper { blocks, done, .. } => {
                drop(blocks);
                done.join().map_err(|_| helper_stopped())?
            }
        };
        Ok((self.file, self.bytes, hasher.finalize()))
    }
}

fn helper_stopped() -> std::io::Error {
    std::io::Error::other("the thread hashing a shard stopped")
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(BLOCK - self.block.len());
        crate::testhook::charge(n)?;
        self.block.extend_from_slice(&data[..n]);
        self.bytes += n as u64;
        if self.block.len() == BLOCK {
            self.write_block()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(()) // blocks are written whole, and `finish` writes the last
    }
}

/// Lets the writers of a pool that writes nothing but shards hash on helper threads while
/// the pool has a thread with no shard to write: with fewer shards left than threads (one
/// chunk; the last of a group), hashing, nearly half of a shard's CPU time, would otherwise
/// run beside an idle thread. A helper starts only while writers and helpers together are
/// fewer than `threads` (a writer that starts later still runs).
pub struct HashHelpers {
    threads: usize,
    busy: AtomicUsize,
    /// Helpers started so far.
    started: AtomicUsize,
}

impl HashHelpers {
    pub fn new(threads: usize) -> Arc<HashHelpers> {
        Arc::new(HashHelpers { threads, busy: AtomicUsize::new(0), started: AtomicUsize::new(0) })
    }

    /// A helper's place, while writers and helpers are fewer than `threads`.
    fn claim(self: &Arc<Self>) -> Option<HelperSlot> {
        self.busy.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| (b < self.threads).then_some(b + 1)).ok()?;
        Some(HelperSlot(self.clone()))
    }

    /// A writer's place, taken whatever the count.
    fn writer(self: &Arc<Self>) -> HelperSlot {
        self.busy.fetch_add(1, Ordering::AcqRel);
        HelperSlot(self.clone())
    }
}

/// A writer's or a helper's place in `HashHelpers`, given back when dropped.
struct HelperSlot(Arc<HashHelpers>);

impl Drop for HelperSlot {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// CPU time this thread has used, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a pointer to a timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Time this thread has spent ready to run but waiting for a CPU, in nanoseconds (0 where the
/// kernel does not say).
fn thread_run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// What writing any shard of this cache needs.
pub struct ShardSpec {
    pub out: PathBuf,
    pub format: Format,
    pub dtype: Dtype,
    pub seqlen: u64,
    /// Block formats: contexts per member and (`blocks.zst`) the zstd level, from the recipe.
    pub block_size: Option<u64>,
    pub zstd_level: Option<i32>,
    pub cancel: Arc<AtomicBool>,
    pub times: Arc<ShardTimes>,
    /// Where the pool writes nothing but shards: its writers may hash on helper threads.
    pub hash_helpers: Option<Arc<HashHelpers>>,
}

impl ShardSpec {
    /// Shards of `recipe` written into `out`.
    pub fn new(recipe: &crate::format::Recipe, out: PathBuf, cancel: Arc<AtomicBool>, times: Arc<ShardTimes>) -> ShardSpec {
        let r = recipe;
        ShardSpec {
            out,
            format: r.format,
            dtype: r.dtype,
            seqlen: r.seqlen as u64,
            block_size: r.block_size,
            zstd_level: r.zstd_level,
            cancel,
            times,
            hash_helpers: None,
        }
    }
}

/// Where writing shards spent its time, summed over threads (tokshuf.json `build.stage2`).
#[derive(Debug, Default)]
pub struct ShardTimes {
    /// Getting contexts (stage 2: gathering them from the spills).
    read_ns: AtomicU64,
    /// Formatting, hashing and handing bytes to the kernel (and, paced by the disk, waiting
    /// for earlier windows to reach it: see `writeback`).
    write_ns: AtomicU64,
    /// The fsync of each shard.
    sync_ns: AtomicU64,
    /// CPU time of the threads in all of the above, and the time they were ready to run but
    /// waited for a CPU (Linux schedstat): with the wall times, what was left is waiting for
    /// the disk.
    cpu_ns: AtomicU64,
    cpu_wait_ns: AtomicU64,
    shards: AtomicU64,
}

impl ShardTimes {
    pub fn to_json(&self) -> serde_json::Value {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        serde_json::json!({
            "read_s": s(&self.read_ns),
            "write_s": s(&self.write_ns),
            "sync_s": s(&self.sync_ns),
            "cpu_s": s(&self.cpu_ns),
            "cpu_wait_s": s(&self.cpu_wait_ns),
            "shards": self.shards.load(Ordering::Relaxed),
        })
    }
}

impl ShardSpec {
    pub fn context_bytes(&self) -> u64 {
        self.seqlen * self.dtype.size() as u64
    }
}

/// Write chunk `chunk` of `n` examples of their own lengths (an unpacked cache's bin), with its
/// `.idx` sidecar: `read(i, buf)` fills `buf` with example i's raw ids. The sidecar is renamed
/// into place before the tar, so a shard that exists always has its sidecar.
pub fn write_ragged_shard(
    spec: &ShardSpec,
    chunk: u64,
    n: usize,
    mut read: impl FnMut(u64, &mut Vec<u8>) -> Result<()>,
) -> Result<ManifestLine> {
    if spec.cancel.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    let _writing = spec.hash_helpers.as_ref().map(|h| h.writer());
    let stem = format::shard_stem(chunk);
    let path = spec.out.join(format!("{stem}.tar"));
    let idx_path = format::idx::idx_path(&spec.out, chunk);
    // Written again if a killed run left one, as `write_shard` does.
    let (bytes, sha256, ids) = {
        let tmp = format::tmp_name(&path);
        let idx_tmp = format::tmp_name(&idx_path);
        let mut write = || -> Result<(u64, String, u64)> {
            let mut w = ShardWriter::create(&tmp, chunk, spec)?;
            let mut buf = Vec::new();
            let mut ids = 0;
            for i in 0..n as u64 {
                read(i, &mut buf)?;
                ids += (buf.len() / spec.dtype.size()) as u64;
                w.append_ragged(&buf).map_err(|e| Error::io(&tmp, e))?;
            }
            let idx = format::idx::encode(w.offsets());
            let (bytes, sha) = w.finish().map_err(|e| Error::io(&tmp, e))?;
            let mut f = File::create(&idx_tmp).map_err(|e| Error::io(&idx_tmp, e))?;
            crate::testhook::charge(idx.len())
                .and_then(|_| f.write_all(&idx))
                .and_then(|_| f.sync_all())
                .map_err(|e| Error::io(&idx_tmp, e))?;
            Ok((bytes, sha, ids))
        };
        let r = write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&idx_tmp);
        })?;
        testhook::point("stage2.tmp");
        std::fs::rename(&idx_tmp, &idx_path).map_err(|e| Error::io(&idx_path, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        testhook::point("stage2.shard");
        r
    };
    Ok(ManifestLine { shard: stem, num_sequences: n as u64, num_tokens: Some(ids), bytes: Some(bytes), sha256: Some(sha256) })
}

/// Write chunk `chunk` of `n` contexts (`read(i, buf)` fills context i) through a temporary
/// name. A shard a killed run left unlisted is written again, not trusted: it may have been
/// damaged since, and hashing it would bless the damage.
pub fn write_shard(
    spec: &ShardSpec,
    chunk: u64,
    n: usize,
    padding: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<ManifestLine> {
    if spec.cancel.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    let _writing = spec.hash_helpers.as_ref().map(|h| h.writer());
    let stem = format::shard_stem(chunk);
    let path = spec.out.join(format!("{stem}.tar"));
    let num_tokens = n as u64 * spec.seqlen - padding;
    let (bytes, sha256) = {
        let tmp = format::tmp_name(&path);
        let mut write = || -> Result<(u64, String)> {
            let (t0, cpu0, wait0) = (Instant::now(), thread_cpu_ns(), thread_run_delay_ns());
            let mut reading = std::time::Duration::ZERO;
            let mut w = ShardWriter::create(&tmp, chunk, spec)?;
            let mut buf = vec![0u8; spec.context_bytes() as usize];
            for i in 0..n as u64 {
                let t = Instant::now();
                read(i, &mut buf)?;
                reading += t.elapsed();
                w.append(&buf).map_err(|e| Error::io(&tmp, e))?;
            }
            let t = Instant::now();
            let r = w.finish().map_err(|e| Error::io(&tmp, e))?;
            let times = &spec.times;
            let sync = t.elapsed();
            times.read_ns.fetch_add(reading.as_nanos() as u64, Ordering::Relaxed);
            times.sync_ns.fetch_add(sync.as_nanos() as u64, Ordering::Relaxed);
            times.write_ns.fetch_add((t0.elapsed() - reading - sync).as_nanos() as u64, Ordering::Relaxed);
            times.cpu_ns.fetch_add(thread_cpu_ns().saturating_sub(cpu0), Ordering::Relaxed);
            times.cpu_wait_ns.fetch_add(thread_run_delay_ns().saturating_sub(wait0), Ordering::Relaxed);
            times.shards.fetch_add(1, Ordering::Relaxed);
            Ok(r)
        };
        let r = write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        testhook::point("stage2.tmp");
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        testhook::point("stage2.shard");
        r
    };
    Ok(ManifestLine { shard: stem, num_sequences: n as u64, num_tokens: Some(num_tokens), bytes: Some(bytes), sha256: Some(sha256) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(out: &Path, helpers: Option<Arc<HashHelpers>>) -> ShardSpec {
        ShardSpec {
            out: out.to_path_buf(),
            format: Format::Npy,
            dtype: Dtype::Uint16,
            seqlen: 2049,
            block_size: None,
            zstd_level: None,
            cancel: Arc::default(),
            times: Arc::default(),
            hash_helpers: helpers,
        }
    }

    /// A shard hashed on a helper thread (several times `BLOCK`, so the writer also waits for
    /// blocks to come back) has the bytes and the sha256 of one hashed on the writer's thread,
    /// and both are the file's own; a pool with no idle thread starts no helper.
    #[test]
    fn a_helper_hashes_what_the_writer_would() {
        let dir = tempfile::tempdir().unwrap();
        let n = 3000; // 15 MB of members
        let context = |i: u64, buf: &mut [u8]| {
            for (k, b) in buf.iter_mut().enumerate() {
                *b = crate::hash::mix64(i * 7919 + k as u64) as u8;
            }
            Ok(())
        };
        let mut got = Vec::new();
        for (name, helpers) in [("here", None), ("helper", Some(HashHelpers::new(2))), ("busy", Some(HashHelpers::new(1)))] {
            let out = dir.path().join(name);
            std::fs::create_dir(&out).unwrap();
            let spec = spec(&out, helpers.clone());
            let line = write_shard(&spec, 0, n, 0, context).unwrap();
            let bytes = std::fs::read(out.join("shard_00000000.tar")).unwrap();
            assert_eq!(line.sha256.as_deref(), Some(crate::format::hex(&Sha256::digest(&bytes)).as_str()), "{name}");
            assert_eq!(line.bytes, Some(bytes.len() as u64), "{name}");
            if let Some(h) = helpers {
                assert_eq!(h.busy.load(Ordering::Relaxed), 0, "{name}: every place is given back");
                assert_eq!(h.started.load(Ordering::Relaxed), (name == "helper") as usize, "{name}");
            }
            got.push(bytes);
        }
        assert!(got[0].len() > 8 * BLOCK && got.iter().all(|b| *b == got[0]));
    }
}
