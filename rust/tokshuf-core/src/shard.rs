//! Writing one chunk as a WebDataset tar (DESIGN §3).
//!
//! `npy` members all have the same header and size, and tar headers are plain ustar with
//! mtime 0, uid/gid 0 and mode 0644, so member i of a chunk starts at byte `i * stride`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::meta::{Dtype, Format};

pub const TAR_BLOCK: u64 = 512;

/// The NumPy format 1.0 header of a 1-D little-endian array of `len` ids, padded to 64 bytes.
pub fn npy_header(dtype: Dtype, len: u64) -> Vec<u8> {
    let dict = format!("{{'descr': '{}', 'fortran_order': False, 'shape': ({len},), }}", dtype.descr());
    let unpadded = 10 + dict.len() + 1;
    let total = unpadded.div_ceil(64) * 64;
    let mut h = Vec::with_capacity(total);
    h.extend_from_slice(b"\x93NUMPY\x01\x00");
    h.extend_from_slice(&((total - 10) as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(total - 1, b' ');
    h.push(b'\n');
    h
}

/// Byte distance between consecutive `npy` members of a chunk (header block + padded data).
pub fn npy_stride(dtype: Dtype, seqlen: u64) -> u64 {
    let data = npy_header(dtype, seqlen).len() as u64 + seqlen * dtype.size() as u64;
    TAR_BLOCK + data.div_ceil(TAR_BLOCK) * TAR_BLOCK
}

pub fn member_name(chunk: u64, index: u64, format: Format) -> String {
    match format {
        Format::Npy => format!("{chunk:08}_{index:08}.npy"),
        Format::JsonGz => format!("{chunk:08}_{index:08}.json.gz"),
    }
}

/// Writes members to a tar, hashing every byte on the way.
pub struct ShardWriter {
    tar: tar::Builder<HashingWriter<BufWriter<File>>>,
    chunk: u64,
    index: u64,
    format: Format,
    dtype: Dtype,
    npy_header: Vec<u8>,
    buf: Vec<u8>,
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
        Ok(())
    }

    /// Finish the archive, fsync it and return (bytes, sha256 hex).
    pub fn finish(self) -> std::io::Result<(u64, String)> {
        let w = self.tar.into_inner()?;
        let HashingWriter { inner, hasher, bytes } = w;
        let f = inner.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok((bytes, crate::tokenizer::hex(&hasher.finalize())))
    }
}

pub fn decode_ids(dtype: Dtype, raw: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let size = dtype.size();
    raw.chunks_exact(size).map(move |c| match size {
        2 => u16::from_le_bytes([c[0], c[1]]) as u32,
        _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    })
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
    Ok((bytes, crate::tokenizer::hex(&hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_numpy_shaped() {
        let h = npy_header(Dtype::Uint16, 2049);
        assert_eq!(h.len() % 64, 0);
        assert_eq!(h.len(), 128);
        assert!(h.ends_with(b"\n"));
        assert_eq!(npy_stride(Dtype::Uint16, 2049), 512 + 4608);
    }
}
