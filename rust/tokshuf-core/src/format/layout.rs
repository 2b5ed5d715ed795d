//! Tar members (DESIGN §3, docs/format.md §3). Tar headers are plain ustar with mtime 0, uid/gid
//! 0 and mode 0644. `npy` members all have the same header and size, so member i of a chunk
//! starts at byte `i * stride`. Block formats hold `block_size` contexts per member as one 2-D
//! npy array: `blocks` members all have the same size but the chunk's last (which may hold
//! fewer contexts), so they are reached at a fixed stride too; `blocks.zst` members are those
//! arrays compressed, found by one scan of the tar headers, like `json.gz` members.

use super::{Dtype, Format};

pub const TAR_BLOCK: u64 = 512;

/// zstd level of `blocks.zst` members: decompression speed does not depend on it, and level 3
/// already stores ids in well under json.gz's bytes while a build still writes at disk speed.
pub const ZSTD_LEVEL: i32 = 3;

/// Contexts per block when a build asks for a block format without saying.
pub const DEFAULT_BLOCK_SIZE: u64 = 64;
/// Largest block: a block is decoded whole, so this bounds what one read holds.
pub const MAX_BLOCK_SIZE: u64 = 1 << 16;
/// Longest context: builds refuse more and readers trust no more (it bounds what tokshuf.json
/// can make a reader allocate).
pub const MAX_SEQLEN: u64 = 1 << 24;

/// The NumPy format 1.0 header of a little-endian array of `shape` ids, padded to 64 bytes.
pub fn npy_header_shaped(dtype: Dtype, shape: &[u64]) -> Vec<u8> {
    let mut dict = Vec::new();
    match shape {
        [n] => write_dict(&mut dict, dtype, format_args!("({n},)")),
        _ => write_dict(&mut dict, dtype, format_args!("({})", shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))),
    }
    .expect("writing to a Vec");
    let mut h = vec![0; header_len(dict.len())];
    enclose_header(&dict, &mut h);
    h
}

/// The header of one `npy` member: a 1-D array of `len` ids.
pub fn npy_header(dtype: Dtype, len: u64) -> Vec<u8> {
    npy_header_shaped(dtype, &[len])
}

/// `npy_header(dtype, len)` written into `buf`, without allocating (a reader checks one per
/// example of an unpacked cache); returns its length.
pub fn npy_header_into(dtype: Dtype, len: u64, buf: &mut [u8; 128]) -> usize {
    let mut dict = [0u8; 100];
    let mut w = &mut dict[..];
    write_dict(&mut w, dtype, format_args!("({len},)")).expect("a 1-D dict fits in 100 bytes");
    let n = 100 - w.len();
    let total = header_len(n);
    enclose_header(&dict[..n], &mut buf[..total]);
    total
}

/// The header's dict for ids of `dtype` in an array of shape `dims` (a Python tuple).
fn write_dict(w: &mut impl std::io::Write, dtype: Dtype, dims: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    write!(w, "{{'descr': '{}', 'fortran_order': False, 'shape': {dims}, }}", dtype.descr())
}

/// Bytes of a header around a dict of `dict_len` bytes: magic, version, length, the dict and
/// its newline, padded to a multiple of 64.
fn header_len(dict_len: usize) -> usize {
    (10 + dict_len + 1).div_ceil(64) * 64
}

/// Fill `out` (`header_len(dict.len())` bytes) with the header around `dict`.
fn enclose_header(dict: &[u8], out: &mut [u8]) {
    let total = out.len();
    out[..8].copy_from_slice(b"\x93NUMPY\x01\x00");
    out[8..10].copy_from_slice(&((total - 10) as u16).to_le_bytes());
    out[10..10 + dict.len()].copy_from_slice(dict);
    out[10 + dict.len()..total - 1].fill(b' ');
    out[total - 1] = b'\n';
}

/// Bytes a tar member of `size` bytes of data takes (header block + data padded to blocks).
pub fn member_span(size: u64) -> u64 {
    TAR_BLOCK + size.div_ceil(TAR_BLOCK) * TAR_BLOCK
}

/// Byte distance between consecutive `npy` members of a chunk (header block + padded data).
pub fn npy_stride(dtype: Dtype, seqlen: u64) -> u64 {
    member_span(npy_header(dtype, seqlen).len() as u64 + seqlen * dtype.size() as u64)
}

/// How the contexts of one chunk are cut into members of a block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Contexts per member (the last member of a chunk may hold fewer).
    pub block_size: u64,
    pub seqlen: u64,
    pub dtype: Dtype,
}

impl Blocking {
    /// Members of a chunk of `n` contexts.
    pub fn blocks(&self, n: u64) -> u64 {
        n.div_ceil(self.block_size)
    }
    /// Contexts in member `b` of a chunk of `n`.
    pub fn rows(&self, n: u64, b: u64) -> u64 {
        (n - b * self.block_size).min(self.block_size)
    }
    /// The npy file of a block of `rows` contexts (what a member holds, before compression).
    pub fn header(&self, rows: u64) -> Vec<u8> {
        npy_header_shaped(self.dtype, &[rows, self.seqlen])
    }
    pub fn array_bytes(&self, rows: u64) -> u64 {
        self.header(rows).len() as u64 + rows * self.seqlen * self.dtype.size() as u64
    }
    /// `blocks`: distance between consecutive members (all but a chunk's last are full).
    pub fn stride(&self) -> u64 {
        member_span(self.array_bytes(self.block_size))
    }
    /// `blocks`: bytes of a shard of `n` contexts.
    pub fn shard_bytes(&self, n: u64) -> u64 {
        let nb = self.blocks(n);
        (nb - 1) * self.stride() + member_span(self.array_bytes(self.rows(n, nb - 1))) + 2 * TAR_BLOCK
    }
}

pub fn member_name(chunk: u64, index: u64, format: Format) -> String {
    let mut name = Vec::new();
    write_member_name(&mut name, chunk, index, format).expect("writing to a Vec");
    String::from_utf8_lossy(&name).into_owned()
}

/// `member_name` written into `w` (a reader checks names without allocating them).
pub fn write_member_name(w: &mut impl std::io::Write, chunk: u64, index: u64, format: Format) -> std::io::Result<()> {
    let ext = match format {
        Format::Npy | Format::Blocks => "npy",
        Format::JsonGz => "json.gz",
        Format::BlocksZst => "npy.zst",
    };
    write!(w, "{chunk:08}_{index:08}.{ext}")
}

pub fn decode_ids(dtype: Dtype, raw: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let size = dtype.size();
    raw.chunks_exact(size).map(move |c| match size {
        2 => u16::from_le_bytes([c[0], c[1]]) as u32,
        _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    })
}

/// The ids of a NumPy file (format 1.0 to 3.0) holding a 1-D little-endian array of
/// non-negative integers below 2^32, whatever its integer type: tokshuf writes `<u2`/`<u4`,
/// other tools other widths.
pub fn parse_npy_ids(data: &[u8]) -> Result<Vec<u32>, String> {
    let bad = |what: &str| Err(format!("not a 1-D integer NumPy array: {what}"));
    if data.len() < 10 || &data[..6] != b"\x93NUMPY" {
        return bad("no NumPy magic");
    }
    let (len, start) = match data[6] {
        1 => (u16::from_le_bytes([data[8], data[9]]) as usize, 10),
        2 | 3 if data.len() >= 12 => (u32::from_le_bytes([data[8], data[9], data[10], data[11]]) as usize, 12),
        v => return bad(&format!("format version {v}")),
    };
    let Some(header) = data.get(start..start + len).and_then(|h| std::str::from_utf8(h).ok()) else {
        return bad("truncated header");
    };
    let field = |key: &str| -> Option<&str> {
        let rest = &header[header.find(&format!("'{key}':"))? + key.len() + 3..];
        Some(rest.trim_start())
    };
    let descr = field("descr").and_then(|r| r.strip_prefix('\'')).and_then(|r| r.split('\'').next());
    let (signed, width) = match descr {
        Some(d) if d.len() >= 3 && (d.starts_with('<') || d.starts_with('|')) => match (&d[1..2], d[2..].parse::<usize>()) {
            ("u", Ok(w @ (1 | 2 | 4 | 8))) => (false, w),
            ("i", Ok(w @ (1 | 2 | 4 | 8))) => (true, w),
            _ => return bad(&format!("dtype {d:?}")),
        },
        other => return bad(&format!("dtype {other:?}")),
    };
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return bad("Fortran order");
    }
    let shape = field("shape").and_then(|r| r.strip_prefix('(')).and_then(|r| r.split(')').next()).unwrap_or("");
    let dims: Vec<&str> = shape.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    let Some(n) = (dims.len() == 1).then(|| dims[0].parse::<usize>().ok()).flatten() else {
        return bad(&format!("shape ({shape})"));
    };
    let body = &data[start + len..];
    if body.len() != n * width {
        return bad(&format!("{} data bytes for {n} items of {width} bytes", body.len()));
    }
    body.chunks_exact(width)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..width].copy_from_slice(c);
            let negative = signed && c[width - 1] & 0x80 != 0;
            let v = u64::from_le_bytes(b);
            match u32::try_from(v) {
                Ok(id) if !negative => Ok(id),
                _ => Err("an id is negative or above 2^32".to_string()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header written in place is the allocated one, at every length (header sizes of 64
    /// and 128 bytes), and is what NumPy writes (`\x93NUMPY`, version 1.0, 64-byte aligned).
    #[test]
    fn npy_header_into_equals_npy_header() {
        for dtype in [Dtype::Uint16, Dtype::Uint32] {
            for len in [0, 1, 9, 10, 2049, 1 << 24, u32::MAX as u64, u64::MAX] {
                let mut buf = [0u8; 128];
                let n = npy_header_into(dtype, len, &mut buf);
                let want = npy_header(dtype, len);
                assert_eq!(&buf[..n], &want[..], "{dtype:?} {len}");
                assert!(n % 64 == 0 && want.starts_with(b"\x93NUMPY\x01\x00") && want.ends_with(b"\n"));
            }
        }
        assert_eq!(npy_header(Dtype::Uint16, 3), b"\x93NUMPY\x01\x00v\x00{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }                                                            \n");
    }

    #[test]
    fn npy_ids_round_trip_and_other_integer_types_are_read() {
        for dtype in [Dtype::Uint16, Dtype::Uint32] {
            let mut f = npy_header(dtype, 3);
            for id in [7u32, 0, 65535] {
                f.extend_from_slice(&id.to_le_bytes()[..dtype.size()]);
            }
            assert_eq!(parse_npy_ids(&f).unwrap(), [7, 0, 65535]);
        }
        // What numpy.save writes for an int64 array (format 1.0), and variations of it.
        let npy = |dict: &str, body: &[i64]| {
            let mut f = b"\x93NUMPY\x01\x00".to_vec();
            f.extend_from_slice(&(dict.len() as u16).to_le_bytes());
            f.extend_from_slice(dict.as_bytes());
            f.extend(body.iter().flat_map(|v| v.to_le_bytes()));
            f
        };
        let i8s = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
        assert_eq!(parse_npy_ids(&npy(i8s, &[5, 70000])).unwrap(), [5, 70000]);
        assert!(parse_npy_ids(&npy(i8s, &[5, -1])).unwrap_err().contains("negative"));
        assert!(parse_npy_ids(&npy(i8s, &[5, 1 << 40])).unwrap_err().contains("above 2^32"));
        assert!(parse_npy_ids(&npy(i8s, &[5])).unwrap_err().contains("data bytes"));
        assert!(parse_npy_ids(&npy(&i8s.replace("(2,)", "(1, 2)"), &[5, 6])).unwrap_err().contains("shape"));
        assert!(parse_npy_ids(&npy(&i8s.replace("<i8", "<f8"), &[5, 6])).unwrap_err().contains("dtype"));
        assert!(parse_npy_ids(&npy(&i8s.replace("False", "True"), &[5, 6])).unwrap_err().contains("Fortran"));
        assert!(parse_npy_ids(b"[1, 2]").is_err());
    }

    #[test]
    fn npy_header_is_numpy_shaped() {
        let h = npy_header(Dtype::Uint16, 2049);
        assert_eq!(h.len() % 64, 0);
        assert_eq!(h.len(), 128);
        assert!(h.ends_with(b"\n"));
        assert_eq!(npy_stride(Dtype::Uint16, 2049), 512 + 4608);
        let b = Blocking { block_size: 64, seqlen: 2049, dtype: Dtype::Uint16 };
        assert!(String::from_utf8_lossy(&b.header(64)).contains("'shape': (64, 2049), }"));
        // 2.01 bytes per id at seqlen 2049: the overhead of a member is shared by 64 contexts.
        let per_token = b.stride() as f64 / (64.0 * 2049.0);
        assert!(per_token < 2.02, "{per_token}");
        assert_eq!(b.blocks(130), 3);
        assert_eq!(b.rows(130, 2), 2);
        assert_eq!(b.shard_bytes(128), 2 * b.stride() + 1024);
    }
}
