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
    }
}
