//! Copying ids into a batch with stores that bypass the caches.
//!
//! A batch of a few MiB is written once and read once, by the consumer, long after (and the
//! read-ahead keeps several in flight), so its lines are not in cache when a row is copied into
//! them: each plain store first reads its line from memory (a read for ownership), then writes
//! it back when evicted, three transfers of the batch's bytes for one. Streaming stores
//! (`movntdq`) write whole lines without reading them. They only pay when a line is written
//! whole, so a row's whole 64-byte lines are streamed and its partial first and last lines
//! (rows of a batch are rarely line-aligned: 2049 ids) are stored plainly.
//!
//! Ids are widened by zero extension (every conversion the reader makes: uint16 into uint16,
//! uint32, int32 or int64; uint32 into uint32, int32 or int64), so one kernel per pair of
//! widths serves every output type.

use std::mem::MaybeUninit;

use super::members::{copy_ids, Id};
use crate::format::Dtype;

/// Bytes in a cache line.
pub(super) const LINE: usize = 64;

/// Streamed copies are used where the CPU has them.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `copy_ids(dtype, raw, out)`, with the whole lines of `out` streamed (its partial first and
/// last lines go through `copy_ids`). Call `fence` before another thread reads `out`.
/// `available()` must be true.
pub(super) fn copy<T: Id>(dtype: Dtype, raw: &[u8], out: &mut [MaybeUninit<T>]) {
    let (ss, ds) = (dtype.size(), std::mem::size_of::<T>());
    let n = (raw.len() / ss).min(out.len());
    // Elements before the first whole line (the element's alignment divides 64), then whole
    // lines; none where the output narrows the ids or the CPU has no kernel.
    let head = ((LINE - out.as_ptr() as usize % LINE) % LINE / ds).min(n);
    let lines = if cfg!(target_arch = "x86_64") && ds >= ss { (n - head) / (LINE / ds) } else { 0 };
    let tail = head + lines * (LINE / ds);
    copy_ids(dtype, &raw[..head * ss], &mut out[..head]);
    #[cfg(target_arch = "x86_64")]
    if lines > 0 {
        // SAFETY: `available()` (AVX2) is the caller's promise; `raw` holds the `lines` lines'
        // ids from id `head` on, `out[head..]` starts on a line and holds them widened, and the
        // two do not overlap (a mapped shard or a decoded block, and a batch being filled).
        unsafe { x86::lines(ss, ds, raw[head * ss..].as_ptr(), out[head..].as_mut_ptr().cast::<u8>(), lines) }
    }
    copy_ids(dtype, &raw[tail * ss..n * ss], &mut out[tail..n]);
}

/// Order the streamed stores before whatever follows (handing the batch to another thread):
/// they are weakly ordered, and a release store does not order them.
pub(super) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions (SSE, part of x86-64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::LINE;

    /// One 64-byte line of output from the `LINE / DS` ids of `SS` bytes at `s`, streamed to
    /// `d` (aligned to 64).
    #[inline(always)]
    unsafe fn line<const SS: usize, const DS: usize>(s: *const u8, d: *mut u8) {
        let (a, b) = match (SS, DS) {
            (2, 4) => (_mm256_cvtepu16_epi32(_mm_loadu_si128(s.cast())), _mm256_cvtepu16_epi32(_mm_loadu_si128(s.add(16).cast()))),
            (2, 8) => (_mm256_cvtepu16_epi64(_mm_loadl_epi64(s.cast())), _mm256_cvtepu16_epi64(_mm_loadl_epi64(s.add(8).cast()))),
            (4, 8) => (_mm256_cvtepu32_epi64(_mm_loadu_si128(s.cast())), _mm256_cvtepu32_epi64(_mm_loadu_si128(s.add(16).cast()))),
            _ => (_mm256_loadu_si256(s.cast()), _mm256_loadu_si256(s.add(32).cast())),
        };
        _mm256_stream_si256(d.cast(), a);
        _mm256_stream_si256(d.add(32).cast(), b);
    }

    #[target_feature(enable = "avx2")]
    unsafe fn run<const SS: usize, const DS: usize>(s: *const u8, d: *mut u8, lines: usize) {
        for k in 0..lines {
            line::<SS, DS>(s.add(k * LINE / DS * SS), d.add(k * LINE));
        }
    }

    /// `lines` lines of output at `d` (aligned to 64) from ids of `ss` bytes at `s`, widened
    /// to `ds` bytes (`ds >= ss`).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lines(ss: usize, ds: usize, s: *const u8, d: *mut u8, lines: usize) {
        match (ss, ds) {
            (2, 2) => run::<2, 2>(s, d, lines),
            (2, 4) => run::<2, 4>(s, d, lines),
            (2, 8) => run::<2, 8>(s, d, lines),
            (4, 4) => run::<4, 4>(s, d, lines),
            (4, 8) => run::<4, 8>(s, d, lines),
            _ => unreachable!("ids of {ss} bytes into elements of {ds}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair of widths, at every alignment of source and destination and every length
    /// around a few lines, gives the plain zero-extended ids.
    #[test]
    fn equals_a_plain_copy() {
        if !available() {
            return;
        }
        fn check<T: Id + PartialEq + std::fmt::Debug + TryFrom<u64>>(ss: usize) {
            let dtype = if ss == 2 { Dtype::Uint16 } else { Dtype::Uint32 };
            let ids: Vec<u64> = (0..300u64).map(|k| (k * 0x9e37_79b9) % if ss == 2 { 1 << 16 } else { 1 << 31 }).collect();
            let raw: Vec<u8> = ids.iter().flat_map(|&x| x.to_le_bytes()[..ss].to_vec()).collect();
            for skew in 0..16 {
                for len in [0, 1, 7, 15, 16, 17, 63, 64, 65, 100, 200] {
                    let src = &raw[(skew % 4) * ss..][..len * ss];
                    let mut out = vec![MaybeUninit::<T>::uninit(); len + 16];
                    let row = &mut out[skew..skew + len];
                    copy(dtype, src, row);
                    fence();
                    let got: Vec<T> = row.iter().map(|x| unsafe { x.assume_init() }).collect();
                    let want: Vec<T> = ids[skew % 4..][..len].iter().map(|&x| T::try_from(x).ok().unwrap()).collect();
                    assert_eq!(got, want, "src {ss} bytes, dst {} bytes, skew {skew}, len {len}", std::mem::size_of::<T>());
                }
            }
        }
        check::<u16>(2);
        check::<u32>(2);
        check::<i64>(2);
        check::<u32>(4);
        check::<i64>(4);
    }
}
