//! Spills in cell order, for a stage 2 that runs away from stage 1 (the Ray engine).
//!
//! Stage 1 writes each file's contexts in position order. A stage-2 task writes the chunks of
//! a range of cells, and a cell takes any context with probability 1/C, so its contexts are
//! spread over every spill: read in place, that is one small read per context. On a local disk
//! that is cheap; on shared storage it is bound by the storage's small-read rate, and in an
//! object store it would be one request per context. So once the chunk plan has fixed the
//! number of cells, each spill is rewritten once, sequentially, with its contexts ordered by
//! (cell, position) (a counting sort): then the contexts of any range of cells are one
//! contiguous byte range of each file, and a stage-2 task makes one read per file.
//!
//! Nothing here changes which context goes where: `gather` lists the contexts of a cell range
//! in exactly the order of `cells::shuffled_cells` (a unit test holds the two together).

use std::fs::File;
use std::io::{BufReader, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;

use super::cells::pack;
use crate::error::{Error, Result};
use crate::hash;

/// The name of file `file`'s cell-ordered spill in the work folder.
pub fn cells_name(file: usize) -> String {
    format!("f{file:08}.cells")
}

fn cell_of(seed: u64, file: usize, pos: u64, cells: u64) -> u64 {
    hash::cell_hash(seed, file as u64, pos) % cells
}

/// Write the `count` contexts of `cb` bytes that `src` yields in position order (file `file`'s
/// spill) to `dst` in (cell, position) order. `what` names `src` in errors.
#[allow(clippy::too_many_arguments)]
pub fn write(
    seed: u64,
    file: usize,
    count: u64,
    cells: u64,
    cb: u64,
    src: impl Read,
    what: &str,
    dst: &File,
    dst_path: &Path,
) -> Result<()> {
    let mut next = vec![0u64; cells as usize + 1];
    for p in 0..count {
        next[cell_of(seed, file, p, cells) as usize + 1] += 1;
    }
    for c in 1..next.len() {
        next[c] += next[c - 1];
    }
    let mut src = BufReader::with_capacity(1 << 20, src);
    let mut buf = vec![0u8; cb as usize];
    for p in 0..count {
        src.read_exact(&mut buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::corrupt(what, format!("holds fewer than the {count} contexts its summary counts")),
            _ => Error::io(what, e),
        })?;
        let c = cell_of(seed, file, p, cells) as usize;
        crate::testhook::charge(buf.len()).and_then(|_| dst.write_all_at(&buf, next[c] * cb)).map_err(|e| Error::io(dst_path, e))?;
        next[c] += 1;
    }
    dst.sync_all().map_err(|e| Error::io(dst_path, e))
}

/// The contexts of cells `c0..c1` in the order stage 2 writes them, and where they are.
pub struct Gathered {
    /// (context id, index among its file's contexts of cells `c0..c1` in cell order), shuffled:
    /// cell by cell, each in id order then Fisher-Yates shuffled (DESIGN §5).
    pub order: Vec<(u64, u64)>,
    /// Per file: the contexts of its cell-ordered spill that hold cells `c0..c1`.
    pub ranges: Vec<Range<u64>>,
}

/// The contexts of cells `c0..c1` (`sizes`: their contexts) over files of `counts` contexts.
pub fn gather(pool: &rayon::ThreadPool, seed: u64, counts: &[u64], cells: u64, c0: u64, c1: u64, sizes: &[u64]) -> Gathered {
    let width = (c1 - c0) as usize;
    // Per file: contexts in cells before c0, and (cell, id, index) of those in c0..c1.
    type Inside = Vec<(u64, u64, u64)>;
    let per_file: Vec<(u64, Inside)> = pool.install(|| {
        counts
            .par_iter()
            .enumerate()
            .map(|(f, &n)| {
                let mut before = 0u64;
                let mut inside = Vec::new();
                let mut per_cell = vec![0u64; width + 1];
                for p in 0..n {
                    let c = cell_of(seed, f, p, cells);
                    if c < c0 {
                        before += 1;
                    } else if c < c1 {
                        inside.push((c, pack(f, p), 0));
                        per_cell[(c - c0) as usize + 1] += 1;
                    }
                }
                for i in 1..per_cell.len() {
                    per_cell[i] += per_cell[i - 1];
                }
                // Positions come in order, so each cell's contexts get consecutive indices.
                for e in inside.iter_mut() {
                    let k = (e.0 - c0) as usize;
                    e.2 = per_cell[k];
                    per_cell[k] += 1;
                }
                (before, inside)
            })
            .collect()
    });
    let mut groups: Vec<Vec<(u64, u64)>> = sizes.iter().map(|&n| Vec::with_capacity(n as usize)).collect();
    let mut ranges = Vec::with_capacity(counts.len());
    for (before, inside) in per_file {
        ranges.push(before..before + inside.len() as u64);
        for (c, id, idx) in inside {
            groups[(c - c0) as usize].push((id, idx));
        }
    }
    pool.install(|| {
        groups.par_iter_mut().enumerate().for_each(|(i, g)| hash::fisher_yates(g, &mut hash::cell_rng(seed, c0 + i as u64)));
    });
    Gathered { order: groups.concat(), ranges }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::cells::{shuffled_cells, unpack};
    use crate::hash::SplitMix64;

    #[test]
    fn gathered_cells_read_from_cell_ordered_spills_are_the_shuffled_cells() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut rng = SplitMix64::new(11);
        let dir = tempfile::tempdir().unwrap();
        for case in 0..40 {
            let seed = rng.next_u64();
            let counts: Vec<u64> = (0..1 + rng.below(6)).map(|_| rng.below(60)).collect();
            let cells = 1 + rng.below(9);
            let sizes = crate::build::cells::cell_sizes(&pool, seed, &counts, cells);
            // Each context's 8 bytes are its id; spill f in position order, then cell order.
            let spills: Vec<File> = counts
                .iter()
                .enumerate()
                .map(|(f, &n)| {
                    let src: Vec<u8> = (0..n).flat_map(|p| pack(f, p).to_le_bytes()).collect();
                    let path = dir.path().join(format!("{case}-{f}"));
                    let dst = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
                    write(seed, f, n, cells, 8, &src[..], "spill", &dst, &path).unwrap();
                    dst
                })
                .collect();
            let c0 = rng.below(cells);
            let c1 = c0 + 1 + rng.below(cells - c0);
            let want = shuffled_cells(&pool, seed, &counts, cells, c0, c1, &sizes[c0 as usize..c1 as usize]);
            let got = gather(&pool, seed, &counts, cells, c0, c1, &sizes[c0 as usize..c1 as usize]);
            assert_eq!(got.order.iter().map(|&(id, _)| id).collect::<Vec<_>>(), want, "case {case}");
            for &(id, idx) in &got.order {
                let (f, _) = unpack(id);
                let r = &got.ranges[f];
                assert!(idx < r.end - r.start);
                let mut b = [0u8; 8];
                spills[f].read_exact_at(&mut b, (r.start + idx) * 8).unwrap();
                assert_eq!(u64::from_le_bytes(b), id, "case {case}");
            }
        }
    }
}
