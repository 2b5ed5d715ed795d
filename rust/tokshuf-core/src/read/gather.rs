//! Copying a batch's rows out of mapped shards, with the rows to come prefetched.
//!
//! A batch's rows are scattered over the page cache (later epochs permute contexts inside
//! each chunk), and each row is a few KiB: too short for the hardware prefetchers, which
//! learn a stream anew at every row (and stop at page boundaries), so a plain row-by-row
//! copy waits on memory most of the time. The reader knows every row of the batch before it
//! copies the first, so it asks for the lines of the rows `PREFETCH_AHEAD` bytes ahead while
//! it copies the current one. The prefetches go to L2 (`T1`): prefetching into L1 takes the
//! few L1 miss buffers the copy itself needs, and gains nothing. A large batch is written with
//! streaming stores (`stream.rs`). benches/read_bench.py and docs/performance.md (reading, round
//! by round) give the measurements.

use std::mem::MaybeUninit;

use super::members::{copy_ids, Id};
use super::stream::{self, LINE};
use crate::format::Dtype;

/// How far ahead of the copy the prefetches run, in bytes of rows (a few rows of a typical
/// context, well inside L2).
const PREFETCH_AHEAD: usize = 16 << 10;

/// Batches of at least this many bytes are written with streaming stores (`stream.rs`): the
/// few a read-ahead keeps in flight no longer stay in the last-level cache, so plain stores
/// would read each line from memory before writing it. Smaller ones are often still in cache
/// when read, and plain stores were as fast or faster there (docs/performance.md, reading).
const STREAM_MIN: usize = 4 << 20;

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

/// Copy each `(source ids of dtype, row)` pair in order, prefetching the sources ahead. The
/// rows belong to a batch of `batch_bytes` (a blend's component fills only some of its rows),
/// whose size decides how they are stored.
pub(super) fn copy_rows<T: Id>(dtype: Dtype, rows: &mut [(&[u8], &mut [MaybeUninit<T>])], batch_bytes: usize) {
    let Some(first) = rows.first() else { return };
    let ahead = (PREFETCH_AHEAD / first.0.len().max(1)).max(1);
    for (src, _) in rows.iter().take(ahead) {
        prefetch(src);
    }
    let streamed = batch_bytes >= STREAM_MIN && stream::available();
    for k in 0..rows.len() {
        if let Some((next, _)) = rows.get(k + ahead) {
            prefetch(next);
        }
        let (src, row) = &mut rows[k];
        if streamed {
            stream::copy(dtype, src, row);
        } else {
            copy_ids(dtype, src, row);
        }
    }
    if streamed {
        stream::fence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches on both sides of `STREAM_MIN`, of every output width, hold the ids of their
    /// rows, in order, whether or not they were streamed.
    #[test]
    fn rows_hold_their_ids() {
        fn check<T: Id + std::fmt::Debug + PartialEq>(dtype: Dtype, rows: usize, seqlen: usize) {
            let ids: Vec<u32> = (0..rows * seqlen).map(|k| (crate::hash::mix64(k as u64) % 50_000) as u32).collect();
            let raw: Vec<u8> = ids.iter().flat_map(|&x| x.to_le_bytes()[..dtype.size()].to_vec()).collect();
            // Source rows in reverse order, as a shuffled batch reads them out of order.
            let row_bytes = seqlen * dtype.size();
            let mut out = vec![MaybeUninit::<T>::uninit(); rows * seqlen];
            let mut pairs: Vec<(&[u8], &mut [MaybeUninit<T>])> =
                out.chunks_exact_mut(seqlen).enumerate().map(|(r, row)| (&raw[(rows - 1 - r) * row_bytes..][..row_bytes], row)).collect();
            copy_rows(dtype, &mut pairs, rows * seqlen * std::mem::size_of::<T>());
            for r in 0..rows {
                let got: Vec<T> = out[r * seqlen..][..seqlen].iter().map(|x| unsafe { x.assume_init() }).collect();
                let want: Vec<T> = ids[(rows - 1 - r) * seqlen..][..seqlen].iter().map(|&x| T::from_id(x)).collect();
                assert_eq!(got, want, "row {r} of {rows}");
            }
        }
        for rows in [3, STREAM_MIN / (2049 * 2) + 1] {
            check::<u16>(Dtype::Uint16, rows, 2049);
            check::<i64>(Dtype::Uint16, rows, 2049);
            check::<u32>(Dtype::Uint32, rows, 2049);
        }
        for rows in [3, STREAM_MIN / (2049 * 4) + 1] {
            check::<i32>(Dtype::Uint16, rows, 2049);
            check::<i64>(Dtype::Uint32, rows, 2049);
        }
    }
}
