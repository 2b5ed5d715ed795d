//! Writing one chunk as a WebDataset tar (DESIGN §3; the layout itself is `format::layout`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::writeback::{self, Streamed};
use crate::error::{Error, Result};
use crate::format::{self, decode_ids, member_name, npy_header, Blocking, Dtype, Format, ManifestLine};
use crate::testhook;

/// Writes members to a tar, hashing every byte on the way.
pub struct ShardWriter {
    tar: tar::Builder<HashingWriter<BufWriter<Streamed<File>>>>,
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
        let w = HashingWriter { inner: BufWriter::with_capacity(1 << 20, f), hasher: Sha256::new(), bytes: 0 };
        Ok(ShardWriter {
            tar: tar::Builder::new(w),
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
                self.buf.extend_from_slice(&self.npy_header);
                self.buf.extend_from_slice(raw);
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
        self.write_member()
    }

    /// Write the contexts gathered so far as one member of a block format.
    fn flush_block(&mut self) -> std::io::Result<()> {
        let Some(blocking) = self.blocking else { return Ok(()) };
        if self.pending_rows == 0 {
            return Ok(());
        }
        self.buf.clear();
        self.buf.extend_from_slice(&blocking.header(self.pending_rows));
        self.buf.extend_from_slice(&self.pending);
        if let Some(z) = &mut self.zstd {
            self.buf = z.compress(&self.buf)?;
        }
        self.pending.clear();
        self.pending_rows = 0;
        self.write_member()
    }

    fn write_member(&mut self) -> std::io::Result<()> {
        let mut header = tar::Header::new_ustar();
        header.set_path(member_name(self.chunk, self.index, self.format))?;
        header.set_size(self.buf.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        self.tar.append(&header, &self.buf[..])?;
        self.index += 1;
        let end = self.offsets.last().copied().unwrap_or(0)
            + format::TAR_BLOCK
            + (self.buf.len() as u64).div_ceil(format::TAR_BLOCK) * format::TAR_BLOCK;
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

    /// Finish the archive, fsync it and return (bytes, sha256 hex).
    pub fn finish(mut self) -> std::io::Result<(u64, String)> {
        self.flush_block()?;
        let w = self.tar.into_inner()?;
        let HashingWriter { inner, hasher, bytes } = w;
        let mut f = inner.into_inner().map_err(|e| e.into_error())?;
        f.sync()?;
        Ok((bytes, crate::format::hex(&hasher.finalize())))
    }
}

struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        crate::testhook::charge(data.len())?;
        let n = self.inner.write(data)?;
        self.hasher.update(&data[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
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
