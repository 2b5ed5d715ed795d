//! Tar members (DESIGN §3). `npy` members all have the same header and size, and tar headers
//! are plain ustar with mtime 0, uid/gid 0 and mode 0644, so member i of a chunk starts at byte
//! `i * stride`.

use super::{Dtype, Format};

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

pub fn decode_ids(dtype: Dtype, raw: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let size = dtype.size();
    raw.chunks_exact(size).map(move |c| match size {
        2 => u16::from_le_bytes([c[0], c[1]]) as u32,
        _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    })
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
