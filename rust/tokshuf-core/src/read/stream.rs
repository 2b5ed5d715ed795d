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

const LINE: usize = 64;

/// Streamed copies are used where the CPU has them.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Write the little-endian ids `raw` (each `src_size` bytes) zero-extended into `out`, as many
/// as it holds, streaming its whole lines. Call `fence` before another thread reads `out`.
/// `available()` must be true, and `T` at least `src_size` bytes wide (`Cache::read_many`
/// refuses narrower outputs).
pub(super) fn copy<T>(src_size: usize, raw: &[u8], out: &mut [MaybeUninit<T>]) {
    #[cfg(target_arch = "x86_64")]
    {
        let n = (raw.len() / src_size).min(out.len());
        // SAFETY: `available()` (AVX2) is the caller's promise; `raw` holds n ids of
        // `src_size` bytes and `out` n elements of T, and they do not overlap (a mapped shard
        // or a decoded block, and a batch being filled).
        unsafe { x86::copy(src_size, std::mem::size_of::<T>(), raw.as_ptr(), out.as_mut_ptr().cast::<u8>(), n) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (src_size, raw, out);
        unreachable!("stream::copy without stream::available()")
    }
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

    /// Id `k` of `s` zero-extended into element `k` of `d`, plainly stored.
    #[inline(always)]
    unsafe fn one<const SS: usize, const DS: usize>(s: *const u8, d: *mut u8, k: usize) {
        let x =
            if SS == 2 { s.add(2 * k).cast::<u16>().read_unaligned() as u64 } else { s.add(4 * k).cast::<u32>().read_unaligned() as u64 };
        match DS {
            2 => d.add(2 * k).cast::<u16>().write_unaligned(x as u16),
            4 => d.add(4 * k).cast::<u32>().write_unaligned(x as u32),
            _ => d.add(8 * k).cast::<u64>().write_unaligned(x),
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn run<const SS: usize, const DS: usize>(s: *const u8, d: *mut u8, n: usize) {
        // Elements before the first whole line (the element type's alignment divides 64).
        let head = ((LINE - d as usize % LINE) % LINE / DS).min(n);
        for k in 0..head {
            one::<SS, DS>(s, d, k);
        }
        let mut k = head;
        while k + LINE / DS <= n {
            line::<SS, DS>(s.add(k * SS), d.add(k * DS));
            k += LINE / DS;
        }
        for k in k..n {
            one::<SS, DS>(s, d, k);
        }
    }

    /// `n` ids of `ss` bytes at `s` into `n` elements of `ds` bytes at `d` (`ds >= ss`).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy(ss: usize, ds: usize, s: *const u8, d: *mut u8, n: usize) {
        match (ss, ds) {
            (2, 2) => run::<2, 2>(s, d, n),
            (2, 4) => run::<2, 4>(s, d, n),
            (2, 8) => run::<2, 8>(s, d, n),
            (4, 4) => run::<4, 4>(s, d, n),
            (4, 8) => run::<4, 8>(s, d, n),
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
        fn check<T: Copy + Default + PartialEq + std::fmt::Debug + TryFrom<u64>>(ss: usize) {
            let ids: Vec<u64> = (0..300u64).map(|k| (k * 0x9e37_79b9) % if ss == 2 { 1 << 16 } else { 1 << 31 }).collect();
            let raw: Vec<u8> = ids.iter().flat_map(|&x| x.to_le_bytes()[..ss].to_vec()).collect();
            for skew in 0..16 {
                for len in [0, 1, 7, 15, 16, 17, 63, 64, 65, 100, 200] {
                    let src = &raw[(skew % 4) * ss..][..len * ss];
                    let mut out = vec![MaybeUninit::<T>::uninit(); len + 16];
                    let row = &mut out[skew..skew + len];
                    copy(ss, src, row);
                    fence();
                    let got: Vec<T> = row.iter().map(|x| unsafe { x.assume_init() }).collect();
                    let want: Vec<T> = ids[skew % 4..][..len].iter().map(|&x| T::try_from(x).ok().unwrap()).collect();
                    assert_eq!(got, want, "src {ss} bytes, dst {} bytes, skew {skew}, len {len}", std::mem::size_of::<T>());
                }
            }
        }
        check::<u16>(2);
        check::<u32>(2);
        check::<u64>(2);
        check::<u32>(4);
        check::<u64>(4);
    }
}
