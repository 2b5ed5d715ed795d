//! Copying a batch's rows out of mapped shards, with the rows to come prefetched.
//!
//! A batch's rows are scattered over the page cache (later epochs permute contexts inside
//! each chunk), and each row is a few KiB: too short for the hardware prefetchers, which
//! learn a stream anew at every row (and stop at page boundaries), so a plain row-by-row
//! copy waits on memory most of the time. The reader knows every row of the batch before it
//! copies the first, so it asks for the lines of the rows `PREFETCH_AHEAD` bytes ahead while
//! it copies the current one. The prefetches go to L2 (`T1`): prefetching into L1 takes the
//! few L1 miss buffers the copy itself needs, and gains nothing (benches/read_bench.py and
//! docs/reading.md "Measured" give the measurements).

use std::mem::MaybeUninit;

use super::members::{copy_ids, Id};
use crate::format::Dtype;

/// How far ahead of the copy the prefetches run, in bytes of rows (a few rows of a typical
/// context, well inside L2).
const PREFETCH_AHEAD: usize = 16 << 10;

const LINE: usize = 64;

/// Ask for the cache lines of `bytes` (a hint: no effect on what is read).
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let start = bytes.as_ptr() as usize & !(LINE - 1);
        let end = bytes.as_ptr() as usize + bytes.len();
        let mut line = start;
        while line < end {
            // SAFETY: prefetching is a hint that never faults; every line touched overlaps
            // `bytes` (the first may start before it, within the same cache line).
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line as *const i8) };
            line += LINE;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Copy each `(source ids of dtype, row)` pair in order, prefetching the sources ahead.
pub(super) fn copy_rows<T: Id>(dtype: Dtype, rows: &mut [(&[u8], &mut [MaybeUninit<T>])]) {
    let Some(first) = rows.first() else { return };
    let ahead = (PREFETCH_AHEAD / first.0.len().max(1)).max(1);
    for (src, _) in rows.iter().take(ahead) {
        prefetch(src);
    }
    for k in 0..rows.len() {
        if let Some((next, _)) = rows.get(k + ahead) {
            prefetch(next);
        }
        let (src, row) = &mut rows[k];
        copy_ids(dtype, src, row);
    }
}
