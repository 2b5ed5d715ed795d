//! The merge table of a BPE model: (left id, right id) -> (rank, merged id).
//!
//! Merging runs on memo misses only, yet its lookups missed the CPU caches so often that
//! they were a quarter of a cl100k build: a hashbrown probe reads a line of control bytes
//! and then a line of entries. Here an entry is 16 bytes holding its key and value, four
//! to a line, with linear probing at a load of at most 1/2: a lookup usually reads one
//! line, and `prefetch` lets the two lookups that follow a merge wait on memory together.

use crate::big_table::BigTable;
use crate::tokenize::prefetch::prefetch;

const EMPTY: u64 = u64::MAX;

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Entry {
    key: u64,
    rank: u32,
    id: u32,
}

pub struct PairTable {
    entries: BigTable<Entry>,
    shift: u32,
}

#[inline(always)]
fn key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl PairTable {
    /// An empty table with room for `n` pairs.
    pub fn with_capacity(n: usize) -> PairTable {
        let bits = (n.max(1) * 2).next_power_of_two().trailing_zeros().max(4);
        PairTable { entries: BigTable::new(1 << bits, Entry { key: EMPTY, rank: 0, id: 0 }), shift: 64 - bits }
    }

    /// Set the pair `(a, b)` to merge with `rank` into `id` (a pair set again takes the
    /// new value). At most the `n` pairs of `with_capacity`; ids are below `u32::MAX`.
    pub fn insert(&mut self, a: u32, b: u32, rank: u32, id: u32) {
        let k = key(a, b);
        debug_assert_ne!(k, EMPTY);
        let mask = self.entries.len() - 1;
        let mut i = self.home(k);
        while self.entries[i].key != EMPTY && self.entries[i].key != k {
            i = (i + 1) & mask;
        }
        self.entries[i] = Entry { key: k, rank, id };
    }

    /// Fibonacci hashing: the top bits of the product.
    #[inline(always)]
    fn home(&self, k: u64) -> usize {
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Ask for the line where the pair `(a, b)` would be.
    #[inline(always)]
    pub fn prefetch(&self, a: u32, b: u32) {
        prefetch(&self.entries[self.home(key(a, b))]);
    }

    /// (rank, merged id) of the pair `(a, b)`, if it merges.
    #[inline(always)]
    pub fn get(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        let k = key(a, b);
        let mask = self.entries.len() - 1;
        let mut i = self.home(k);
        loop {
            let e = &self.entries[i];
            if e.key == k {
                return Some((e.rank, e.id));
            }
            if e.key == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use rustc_hash::FxHashMap;

    use super::*;

    #[test]
    fn finds_exactly_the_pairs_it_holds() {
        let mut map = FxHashMap::default();
        let mut seed = 9u64;
        for i in 0..5000u32 {
            seed = crate::hash::mix64(seed + 1);
            // Few distinct left ids: many keys share high bits and collide.
            map.insert(key((seed % 7) as u32, seed as u32 >> 3), (i, i + 1));
        }
        let mut t = PairTable::with_capacity(map.len());
        for (&k, &(rank, id)) in &map {
            t.insert((k >> 32) as u32, k as u32, rank, id);
        }
        for (&k, &v) in &map {
            assert_eq!(t.get((k >> 32) as u32, k as u32), Some(v));
        }
        for a in 0..7u32 {
            for b in 0..2000u32 {
                assert_eq!(t.get(a, b), map.get(&key(a, b)).copied());
            }
        }
        t.insert(0, 0, 7, 8);
        t.insert(0, 0, 9, 10); // set again: the new value
        assert_eq!(t.get(0, 0), Some((9, 10)));
        assert_eq!(PairTable::with_capacity(0).get(1, 2), None);
    }
}
