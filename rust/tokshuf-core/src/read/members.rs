//! Reading tar members (DESIGN §3): ids into the reader's output types, the member index of
//! shards whose members vary in size (`json.gz`, `blocks.zst`).

use std::mem::MaybeUninit;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{self, Dtype, Format};

/// Output element types of the reader. Rows are written into uninitialized memory (a batch is
/// never zeroed first: that would be one more pass over it); the bulk conversions are plain
/// loops the compiler vectorizes (with AVX2 where the CPU has it: `widen`), and a straight
/// copy where the types agree.
pub trait Id: Copy + Default + Send + Sync + 'static {
    fn from_id(x: u32) -> Self;
    fn from_u16s(src: &[u16], out: &mut [MaybeUninit<Self>]) {
        widen(src, out, |x| Self::from_id(u16::from_le(x) as u32));
    }
    fn from_u32s(src: &[u32], out: &mut [MaybeUninit<Self>]) {
        widen(src, out, |x| Self::from_id(u32::from_le(x)));
    }
}

/// `out[k] = f(src[k])`. Wheels target baseline x86-64 (SSE2, 16-byte vectors); the same loop
/// compiled for AVX2 converts twice the ids per instruction, which the reader's widening
/// copies (uint16 ids into int32 or int64 batches) need to keep up with memory.
#[inline]
fn widen<S: Copy, T>(src: &[S], out: &mut [MaybeUninit<T>], f: impl Fn(S) -> T) {
    #[inline(always)]
    fn plain<S: Copy, T>(src: &[S], out: &mut [MaybeUninit<T>], f: impl Fn(S) -> T) {
        for (o, &x) in out.iter_mut().zip(src) {
            o.write(f(x));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<S: Copy, T>(src: &[S], out: &mut [MaybeUninit<T>], f: impl Fn(S) -> T) {
            plain(src, out, f)
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2(src, out, f) };
        }
    }
    plain(src, out, f)
}
impl Id for u16 {
    #[inline]
    fn from_id(x: u32) -> Self {
        x as u16
    }
    fn from_u16s(src: &[u16], out: &mut [MaybeUninit<Self>]) {
        if cfg!(target_endian = "little") {
            let n = src.len().min(out.len());
            // SAFETY: both ranges hold n u16s and do not overlap (a mapped shard or a decoded
            // block, and a batch being filled).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr().cast::<u16>(), n) }
        } else {
            for (o, &x) in out.iter_mut().zip(src) {
                o.write(u16::from_le(x));
            }
        }
    }
}
impl Id for u32 {
    #[inline]
    fn from_id(x: u32) -> Self {
        x
    }
    fn from_u32s(src: &[u32], out: &mut [MaybeUninit<Self>]) {
        if cfg!(target_endian = "little") {
            let n = src.len().min(out.len());
            // SAFETY: as for u16.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr().cast::<u32>(), n) }
        } else {
            for (o, &x) in out.iter_mut().zip(src) {
                o.write(u32::from_le(x));
            }
        }
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

/// Write the little-endian ids `raw` (of `dtype`) into `out` (as many as it holds).
pub(super) fn copy_ids<T: Id>(dtype: Dtype, raw: &[u8], out: &mut [MaybeUninit<T>]) {
    // SAFETY: every bit pattern is a valid u16/u32; align_to returns the aligned middle part.
    match dtype {
        Dtype::Uint16 => match unsafe { raw.align_to::<u16>() } {
            ([], ids, []) => T::from_u16s(ids, out),
            _ => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                    o.write(T::from_id(u16::from_le_bytes([b[0], b[1]]) as u32));
                }
            }
        },
        Dtype::Uint32 => match unsafe { raw.align_to::<u32>() } {
            ([], ids, []) => T::from_u32s(ids, out),
            _ => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                    o.write(T::from_id(u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                }
            }
        },
    }
}

pub(super) fn header_name_is(header: &[u8], name: &[u8]) -> bool {
    let field = &header[..100];
    let n = name.len();
    n < 100 && &field[..n] == name && field[n..].iter().all(|&b| b == 0) && header[345..500].iter().all(|&b| b == 0)
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

/// The data size in a tar member header.
pub(super) fn member_size(header: &[u8]) -> Option<usize> {
    parse_octal(&header[124..136]).map(|s| s as usize)
}

/// Offsets of the data of each member of a shard whose members vary in size, checking names,
/// types, checksums and that exactly `n` members are followed by the end-of-archive blocks.
pub(super) fn index_members(path: &Path, data: &[u8], chunk: u64, n: u64, fmt: Format) -> Result<Vec<(usize, usize)>> {
    let block = format::TAR_BLOCK as usize;
    let mut members = Vec::with_capacity(n as usize);
    let mut off = 0usize;
    for i in 0..n {
        let name = format::member_name(chunk, i, fmt);
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
        if !header_name_is(h, name.as_bytes()) {
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
