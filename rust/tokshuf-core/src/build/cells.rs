//! The cell shuffle (DESIGN §5). Every context id `(file, position)` goes to cell
//! `cell_hash(seed, file, position) mod C`; each cell, in id order, is Fisher-Yates shuffled with
//! its own generator; the shuffled cells concatenated in cell order are the global order.
//!
//! Cells hold ids only: the ids of one file's contexts are dense, so a cell's contents are
//! recomputed from the per-file counts whenever needed, and the context data stays in the
//! spills until stage 2 gathers it into shards.

use rayon::prelude::*;

use crate::hash;

/// Default cell size when `num_local_cells` is not given (ids only: 8 bytes each).
pub const DEFAULT_CELL_CONTEXTS: u64 = 1 << 16;
/// The most cells a build may ask for. The plan keeps a count per cell (8 bytes), so this
/// bounds that to 128 MiB; with the default of one cell per 65,536 contexts it is more
/// contexts than any build holds.
pub const MAX_CELLS: u64 = 1 << 24;
pub const FILE_BITS: u32 = 24;
pub const POS_BITS: u32 = 40;

/// One u64 per context id: file index in the high bits, position in the low ones.
#[inline]
pub fn pack(file: usize, pos: u64) -> u64 {
    ((file as u64) << POS_BITS) | pos
}

#[inline]
pub fn unpack(id: u64) -> (usize, u64) {
    ((id >> POS_BITS) as usize, id & ((1 << POS_BITS) - 1))
}

/// Contexts in each of `cells` cells, for files of `counts` contexts.
pub fn cell_sizes(pool: &rayon::ThreadPool, seed: u64, counts: &[u64], cells: u64) -> Vec<u64> {
    pool.install(|| {
        counts
            .par_iter()
            .enumerate()
            .map(|(f, &n)| {
                let mut sizes = vec![0u64; cells as usize];
                for p in 0..n {
                    sizes[(hash::cell_hash(seed, f as u64, p) % cells) as usize] += 1;
                }
                sizes
            })
            .reduce(
                || vec![0u64; cells as usize],
                |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    a
                },
            )
    })
}

/// Contexts of cells `c0..c1`, each cell in id order then Fisher-Yates shuffled, concatenated.
/// Holds nothing but the result (8 bytes a context: `budget::ID_BYTES`).
pub fn shuffled_cells(pool: &rayon::ThreadPool, seed: u64, counts: &[u64], cells: u64, c0: u64, c1: u64, sizes: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; sizes.iter().sum::<u64>() as usize];
    let mut next: Vec<usize> = sizes
        .iter()
        .scan(0usize, |at, &n| {
            let start = *at;
            *at += n as usize;
            Some(start)
        })
        .collect();
    for (f, &n) in counts.iter().enumerate() {
        for p in 0..n {
            let c = hash::cell_hash(seed, f as u64, p) % cells;
            if c >= c0 && c < c1 {
                let at = &mut next[(c - c0) as usize];
                out[*at] = pack(f, p);
                *at += 1;
            }
        }
    }
    let mut parts: Vec<&mut [u64]> = Vec::with_capacity(sizes.len());
    let mut rest = &mut out[..];
    for &n in sizes {
        let (cell, tail) = rest.split_at_mut(n as usize);
        parts.push(cell);
        rest = tail;
    }
    pool.install(|| {
        parts.par_iter_mut().enumerate().for_each(|(i, g)| hash::fisher_yates(g, &mut hash::cell_rng(seed, c0 + i as u64)));
    });
    out
}
