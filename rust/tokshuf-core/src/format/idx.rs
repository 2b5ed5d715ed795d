//! The `.idx` sidecar of a shard (DESIGN §9): the byte offset of every member's tar header,
//! then the offset where the end-of-archive blocks start: `count + 1` little-endian uint64s.
//! Member `i` occupies bytes `[off[i], off[i+1])` of the tar, so a reader reaches any member in
//! O(1) even when members differ in size. Only offsets are stored: whatever a member holds
//! (a variable-length npy array today, perhaps a compressed block later) is read from the
//! member itself, so any layout of members can share this sidecar.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// `shard_NNNNNNNN.idx` beside `shard_NNNNNNNN.tar` in `root`.
pub fn idx_path(root: &Path, chunk: u64) -> PathBuf {
    root.join(format!("{}.idx", super::shard_stem(chunk)))
}

/// Bytes of the sidecar of a shard of `count` members.
pub fn idx_len(count: u64) -> u64 {
    (count + 1) * 8
}

/// The sidecar's bytes for member offsets `offsets` (already `count + 1` long).
pub fn encode(offsets: &[u64]) -> Vec<u8> {
    offsets.iter().flat_map(|o| o.to_le_bytes()).collect()
}

/// Offset `i` of a sidecar held in `data` (the caller checked its length).
#[inline]
pub fn offset(data: &[u8], i: u64) -> u64 {
    let at = (i * 8) as usize;
    u64::from_le_bytes(data[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// Check a sidecar of a shard of `count` members and `tar_len` bytes: its length, offsets that
/// start at 0, grow by at least a tar header and a block each, stay block-aligned, and end
/// where the tar's two end-of-archive blocks begin.
pub fn check(path: &Path, data: &[u8], count: u64, tar_len: u64) -> Result<()> {
    if data.len() as u64 != idx_len(count) {
        return Err(Error::corrupt(path, format!("{} bytes, expected {} for {count} members", data.len(), idx_len(count))));
    }
    let block = super::TAR_BLOCK;
    let mut prev = None;
    for i in 0..=count {
        let o = offset(data, i);
        let bad = |why: &str| Error::corrupt(path, format!("offset {i} ({o}) {why}"));
        match prev {
            None if o != 0 => return Err(bad("is not 0")),
            Some(p) if o < p + 2 * block => return Err(bad("leaves no room for a member header and data")),
            _ => {}
        }
        if o % block != 0 {
            return Err(bad("is not a multiple of 512"));
        }
        prev = Some(o);
    }
    let end = offset(data, count);
    if end + 2 * block != tar_len {
        return Err(Error::corrupt(path, format!("last offset {end} + 1024 does not match the shard's {tar_len} bytes")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checks() {
        let offs = [0u64, 1024, 2560, 4096];
        let data = encode(&offs);
        assert_eq!(data.len() as u64, idx_len(3));
        assert_eq!((0..4).map(|i| offset(&data, i)).collect::<Vec<_>>(), offs);
        let p = Path::new("x.idx");
        check(p, &data, 3, 4096 + 1024).unwrap();
        assert!(check(p, &data, 3, 4096).is_err());
        assert!(check(p, &data, 2, 4096 + 1024).is_err());
        assert!(check(p, &encode(&[0, 512, 2048]), 2, 3072).is_err(), "a member needs a header and data");
        assert!(check(p, &encode(&[0, 1030, 2048]), 2, 3072).is_err(), "unaligned");
        assert!(check(p, &encode(&[512, 1536]), 1, 2560).is_err(), "first offset");
    }
}
