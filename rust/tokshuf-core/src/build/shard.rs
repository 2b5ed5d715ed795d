//! Writing one chunk as a WebDataset tar (DESIGN §3; the layout itself is `format::layout`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::format::{self, decode_ids, member_name, npy_header, Dtype, Format, ManifestLine};
use crate::testhook;

/// Writes members to a tar, hashing every byte on the way.
pub struct ShardWriter {
    tar: tar::Builder<HashingWriter<BufWriter<File>>>,
    chunk: u64,
    index: u64,
    format: Format,
    dtype: Dtype,
    npy_header: Vec<u8>,
    buf: Vec<u8>,
    /// Where each member's tar header starts, then where the next one would (see `format::idx`).
    offsets: Vec<u64>,
}

impl ShardWriter {
    pub fn create(path: &Path, chunk: u64, format: Format, dtype: Dtype, seqlen: u64) -> Result<Self> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
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
        }
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
    pub fn finish(self) -> std::io::Result<(u64, String)> {
        let w = self.tar.into_inner()?;
        let HashingWriter { inner, hasher, bytes } = w;
        let f = inner.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
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

/// sha256 of a file already on disk (a shard finished by an earlier, interrupted run).
pub fn file_sha256(path: &Path) -> Result<(u64, String)> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let bytes = std::io::copy(&mut f, &mut hasher).map_err(|e| Error::io(path, e))?;
    Ok((bytes, crate::format::hex(&hasher.finalize())))
}

/// What writing any shard of this cache needs.
pub struct ShardSpec {
    pub out: PathBuf,
    pub format: Format,
    pub dtype: Dtype,
    pub seqlen: u64,
    pub cancel: Arc<AtomicBool>,
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
    let (bytes, sha256, ids) = if path.exists() {
        let (bytes, sha256) = file_sha256(&path)?;
        let offsets = std::fs::read(&idx_path).map_err(|e| Error::io(&idx_path, e))?;
        (bytes, sha256, ragged_ids(&path, spec.dtype, &offsets, n)?)
    } else {
        let tmp = format::tmp_name(&path);
        let idx_tmp = format::tmp_name(&idx_path);
        let mut write = || -> Result<(u64, String, u64)> {
            let mut w = ShardWriter::create(&tmp, chunk, spec.format, spec.dtype, spec.seqlen)?;
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

/// Ids in a ragged shard a killed run finished, from its sidecar: each member's data size
/// less its npy header.
fn ragged_ids(path: &Path, dtype: Dtype, idx: &[u8], n: usize) -> Result<u64> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    let tar_len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    format::idx::check(path, idx, n as u64, tar_len)?;
    let mut total = 0;
    let mut head = [0u8; 10];
    for i in 0..n as u64 {
        let at = format::idx::offset(idx, i);
        let mut size = [0u8; 12];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut size, at + 124).map_err(|e| Error::io(path, e))?;
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut head, at + format::TAR_BLOCK).map_err(|e| Error::io(path, e))?;
        let size =
            std::str::from_utf8(&size).ok().and_then(|s| u64::from_str_radix(s.trim_matches(|c: char| c == '\0' || c == ' '), 8).ok());
        let header = 10 + u16::from_le_bytes([head[8], head[9]]) as u64;
        let size = size.filter(|&s| s >= header).ok_or_else(|| Error::corrupt(path, format!("member {i}: unreadable size")))?;
        total += (size - header) / dtype.size() as u64;
    }
    Ok(total)
}

/// Write chunk `chunk` of `n` contexts (`read(i, buf)` fills context i) through a temporary
/// name; a shard a killed run finished is kept and only hashed.
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
    let (bytes, sha256) = if path.exists() {
        file_sha256(&path)?
    } else {
        let tmp = format::tmp_name(&path);
        let mut write = || -> Result<(u64, String)> {
            let mut w = ShardWriter::create(&tmp, chunk, spec.format, spec.dtype, spec.seqlen)?;
            let mut buf = vec![0u8; spec.context_bytes() as usize];
            for i in 0..n as u64 {
                read(i, &mut buf)?;
                w.append(&buf).map_err(|e| Error::io(&tmp, e))?;
            }
            w.finish().map_err(|e| Error::io(&tmp, e))
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
