//! What `memory_limit` bounds, and how stage 2 spends it.
//!
//! The limit bounds the memory a build needs in proportion to its input or its chunks: stage
//! 2's cell ids (8 bytes for every context of the chunks being written) and each thread's
//! gather window (the contexts whose reads from the spills are announced ahead, `gather`:
//! memory of the page cache rather than of the build, which reads them a few MiB at a time).
//! What does not grow with the input is outside it and documented as a constant
//! (docs/building.md, "Large builds"): the tokenizer and its per-thread memos, stage 1's
//! batches in flight, gather and write buffers.
//!
//! Half the limit at most goes to the gather windows: past a chunk per thread a larger window
//! gains nothing. The rest bounds the cell ids of a group of chunks, whose shards are then
//! written in parallel; the plan's `groups` never gives less than one chunk, so a tiny limit
//! holds the ids of the cells one chunk spans (a cell is 65,536 contexts by default, 512 KiB
//! of ids) and one context per thread: slower, never different bytes.

use crate::format::Recipe;

/// Bytes of one cell id in stage 2 (`cells::shuffled_cells`).
pub const ID_BYTES: u64 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage2Budget {
    /// Cell ids a group of chunks may hold.
    pub group_ids: u64,
    /// Contexts each thread gathers at a time.
    pub gather_window: usize,
}

impl Stage2Budget {
    /// The budget of a build of `recipe` on `threads` threads.
    pub fn for_recipe(memory_limit: u64, threads: usize, recipe: &Recipe) -> Self {
        let context_bytes = recipe.seqlen as u64 * recipe.dtype.size() as u64;
        Self::new(memory_limit, threads, recipe.chunk_size as u64, context_bytes)
    }

    pub fn new(memory_limit: u64, threads: usize, chunk_size: u64, context_bytes: u64) -> Self {
        let threads = threads.max(1) as u64;
        let window = (memory_limit / 2 / threads / context_bytes.max(1)).clamp(1, chunk_size.max(1));
        let ids = memory_limit.saturating_sub(window * threads * context_bytes) / ID_BYTES;
        Stage2Budget { group_ids: ids, gather_window: window as usize }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_take_at_most_half_and_at_most_a_chunk_per_thread() {
        let cb = 2049 * 2;
        // Plenty: a whole chunk per thread, the rest for ids.
        let b = Stage2Budget::new(1 << 30, 2, 8192, cb);
        assert_eq!(b.gather_window, 8192);
        assert_eq!(b.group_ids, ((1u64 << 30) - 2 * 8192 * cb) / 8);
        // Tight: half the limit in windows.
        let b = Stage2Budget::new(64 << 20, 4, 8192, cb);
        assert_eq!(b.gather_window as u64, (32 << 20) / 4 / cb);
        assert!(b.gather_window as u64 * 4 * cb <= 32 << 20);
        assert_eq!(b.group_ids, ((64u64 << 20) - b.gather_window as u64 * 4 * cb) / 8);
        // Absurd: one context per thread, no ids (the plan still gives one chunk per group).
        let b = Stage2Budget::new(1, 16, 8192, cb);
        assert_eq!(b, Stage2Budget { group_ids: 0, gather_window: 1 });
    }
}
