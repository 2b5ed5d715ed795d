//! The candidate pairs of a compact merge (`bpe::merge_compact`, `hfbpe`'s twin): the rank of
//! the pair starting at each offset of the piece, and the lowest of them, leftmost first,
//! in O(1), kept by a tournament over blocks of offsets.
//!
//! It replaced a heap of `rank << 32 | offset` with lazily dropped stale entries, which held
//! 8 bytes per byte of a long piece (every adjacent pair of bytes a candidate at first).
//! Here a piece costs 4 bytes per byte and a quarter of a byte for the tournament (a leaf of
//! 8 bytes per 64 offsets, as many nodes above it), and no entry is ever stale: the minimum
//! is always a pair the piece has now. Changing a rank rescans its block (64 ranks, a few
//! cache lines) only when that rank was the block's minimum, and walks up the tournament
//! only while the minimum changes; long pieces merge 2-3x faster than with the heap, whose
//! pops missed the cache at every level.

/// Offsets per leaf of the tournament.
const BLOCK: usize = 64;

pub(crate) struct PairRanks {
    /// The rank of the pair at each offset; at or above `limit`, no pair (the caller may keep
    /// other values there, see `hfbpe::MergeBpe::merge_compact`).
    ranks: Vec<u32>,
    limit: u32,
    /// `tree[leaves + b]`: the least `key` of block `b`; `tree[j]`: the lesser of its two
    /// children; `tree[1]`: the least of all.
    tree: Vec<u64>,
    leaves: usize,
}

#[inline(always)]
fn key(rank: u32, at: usize) -> u64 {
    (rank as u64) << 32 | at as u64
}

impl PairRanks {
    /// The `n` offsets of a piece (below 2^32), the pair at offset `i` ranked `rank_at(i)`
    /// (all but the last offset) or none; ranks at or above `limit` are none.
    pub(crate) fn new(n: usize, limit: u32, rank_at: impl Fn(usize) -> Option<u32>) -> PairRanks {
        debug_assert!(n >= 1 && n < u32::MAX as usize);
        let mut ranks = Vec::with_capacity(n);
        ranks.extend((0..n - 1).map(|i| rank_at(i).unwrap_or(u32::MAX)));
        ranks.resize(n, u32::MAX);
        let leaves = n.div_ceil(BLOCK).next_power_of_two();
        let mut p = PairRanks { ranks, limit, tree: vec![u64::MAX; 2 * leaves], leaves };
        for b in 0..n.div_ceil(BLOCK) {
            p.tree[leaves + b] = p.block_min(b);
        }
        for j in (1..leaves).rev() {
            p.tree[j] = p.tree[2 * j].min(p.tree[2 * j + 1]);
        }
        p
    }

    /// The offset of the pair of lowest rank, leftmost first.
    #[inline(always)]
    pub(crate) fn min(&self) -> Option<usize> {
        let k = self.tree[1];
        ((k >> 32) < self.limit as u64).then_some((k & 0xFFFF_FFFF) as usize)
    }

    /// The value at offset `i`.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> u32 {
        self.ranks[i]
    }

    /// Set the value at offset `i` (a rank, or at or above `limit` for none).
    #[inline(always)]
    pub(crate) fn set(&mut self, i: usize, value: u32) {
        self.ranks[i] = value;
        let b = i / BLOCK;
        let leaf = self.leaves + b;
        let k = key(value.min(self.limit), i);
        let old = self.tree[leaf];
        if k < old {
            self.tree[leaf] = k;
            self.lower_up(leaf, k);
        } else if old & 0xFFFF_FFFF == i as u64 && k != old {
            self.tree[leaf] = self.block_min(b);
            self.update_up(leaf);
        }
    }

    /// The least key of block `b`, values at or above `limit` counted as `limit`.
    #[inline(always)]
    fn block_min(&self, b: usize) -> u64 {
        let start = b * BLOCK;
        let end = (start + BLOCK).min(self.ranks.len());
        let mut best = u64::MAX;
        for (i, &r) in self.ranks[start..end].iter().enumerate() {
            best = best.min(key(r.min(self.limit), start + i));
        }
        best
    }

    /// A leaf's key fell to `k`: it becomes the minimum of each ancestor above it while it is
    /// less than theirs.
    #[inline(always)]
    fn lower_up(&mut self, mut j: usize, k: u64) {
        j /= 2;
        while j >= 1 && k < self.tree[j] {
            self.tree[j] = k;
            j /= 2;
        }
    }

    /// A leaf's key rose: recompute its ancestors while they change.
    #[inline(always)]
    fn update_up(&mut self, mut j: usize) {
        j /= 2;
        while j >= 1 {
            let m = self.tree[2 * j].min(self.tree[2 * j + 1]);
            if self.tree[j] == m {
                break;
            }
            self.tree[j] = m;
            j /= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a plain scan for the least (rank, offset), through random updates on sizes
    /// around the block and the tournament's powers of two, with values above the limit.
    #[test]
    fn min_equals_a_scan() {
        let mut seed = 9u64;
        let mut next = |m: u64| {
            seed = crate::hash::mix64(seed + 1);
            seed % m
        };
        for n in [1, 2, 63, 64, 65, 129, 1000, 4097] {
            let limit = 50;
            let mut want: Vec<u32> = (0..n).map(|i| if i + 1 < n { next(60) as u32 } else { u32::MAX }).collect();
            let w = want.clone();
            let mut p = PairRanks::new(n, limit, |i| Some(w[i]));
            for step in 0..3000 {
                let scan = want.iter().enumerate().filter(|(_, &r)| r < limit).min_by_key(|&(i, &r)| (r, i)).map(|(i, &r)| (r, i));
                assert_eq!(p.min().map(|at| (p.get(at), at)), scan, "n {n} step {step}");
                let i = next(n as u64) as usize;
                // Mostly raises of the minimum (as merges do), some lowers and none-values.
                let v = match next(4) {
                    0 => u32::MAX,
                    1 => limit + next(100) as u32,
                    _ => next(60) as u32,
                };
                let i = if next(2) == 0 { scan.map_or(i, |(_, at)| at) } else { i };
                want[i] = v;
                p.set(i, v);
                assert_eq!(p.get(i), v);
            }
        }
    }
}
