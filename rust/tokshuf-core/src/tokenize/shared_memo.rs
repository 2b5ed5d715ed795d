//! A memo of short pre-tokens -> ids shared by every thread that encodes with one encoder,
//! behind each thread's own (`piece_cache.rs`): a piece one thread has merged, the others
//! copy from here instead of merging it again. Without it, two threads on a build merged
//! most new pieces twice, and merging is where a cold memo's time goes.
//!
//! Insert-only and of fixed size, so readers take no lock and memory is bounded: a slot is
//! written once, by the thread that claims it (compare-and-swap of its last word from empty
//! to busy), and published by a release store of that word with a `FULL` mark; a reader
//! acquires that word before reading the rest, and a slot is never written again, so no
//! reader can see a slot half-written. A set that is full simply takes no more pieces (the
//! first pieces met, the common ones, stay). After `fork` a child keeps a consistent copy.
//! Ids never depend on what this holds: a piece it does not hold is merged.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::tokenize::prefetch::prefetch;

/// Ids a slot holds; pieces with more are not shared.
pub const SHARED_IDS: usize = 3;

/// Marks of a slot's last word: published, or claimed by a writer.
const FULL: u64 = 1 << 63;
const BUSY: u64 = 1 << 62;

/// Key (two words), ids 0 and 1, then id 2 | len << 32 | n << 40 | marks.
#[derive(Default)]
#[repr(C, align(32))]
struct Slot([AtomicU64; 4]);

#[derive(Default)]
#[repr(C, align(64))]
struct Set([Slot; 2]);

pub struct SharedMemo {
    sets: Box<[Set]>,
    mask: usize,
}

impl SharedMemo {
    /// A memo of `1 << bits` slots of 32 bytes.
    pub fn new(bits: u32) -> SharedMemo {
        let n = 1usize << (bits - 1);
        SharedMemo { sets: (0..n).map(|_| Set::default()).collect(), mask: n - 1 }
    }

    /// Ask for the line of the set of `hash` now, for a `get` a little later.
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        prefetch(&self.sets[hash as usize & self.mask]);
    }

    /// The ids of the piece with zero-padded `key` of `len` bytes and this `hash`, copied
    /// into `ids`; their number, or `None` if not held.
    #[inline(always)]
    pub fn get(&self, hash: u64, key: [u64; 2], len: usize, ids: &mut [u32; SHARED_IDS]) -> Option<usize> {
        for slot in &self.sets[hash as usize & self.mask].0 {
            let last = slot.0[3].load(Ordering::Acquire);
            if last & FULL == 0 || (last >> 32) as u8 as usize != len {
                continue;
            }
            if slot.0[0].load(Ordering::Relaxed) == key[0] && slot.0[1].load(Ordering::Relaxed) == key[1] {
                let pair = slot.0[2].load(Ordering::Relaxed);
                *ids = [pair as u32, (pair >> 32) as u32, last as u32];
                return Some((last >> 40) as u8 as usize);
            }
        }
        None
    }

    /// Remember `ids` (at most `SHARED_IDS`) for the piece of `key` and `len` bytes, if its
    /// set has a free slot.
    pub fn insert(&self, hash: u64, key: [u64; 2], len: usize, ids: &[u32]) {
        debug_assert!(ids.len() <= SHARED_IDS && (1..=16).contains(&len));
        let mut all = [0u32; SHARED_IDS];
        all[..ids.len()].copy_from_slice(ids);
        for slot in &self.sets[hash as usize & self.mask].0 {
            if slot.0[3].compare_exchange(0, BUSY, Ordering::Acquire, Ordering::Relaxed).is_err() {
                continue;
            }
            slot.0[0].store(key[0], Ordering::Relaxed);
            slot.0[1].store(key[1], Ordering::Relaxed);
            slot.0[2].store(all[0] as u64 | (all[1] as u64) << 32, Ordering::Relaxed);
            let last = FULL | (ids.len() as u64) << 40 | (len as u64) << 32 | all[2] as u64;
            slot.0[3].store(last, Ordering::Release);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads inserting and reading the same pieces at once only ever read what was
    /// inserted for that piece (or nothing), and a set takes at most two pieces.
    #[test]
    fn concurrent_readers_see_whole_entries() {
        let memo = SharedMemo::new(4); // 8 sets: most pieces find their set full
        let piece = |i: u64| -> (u64, [u64; 2], usize, Vec<u32>) {
            let len = 1 + (i % 16) as usize;
            let key = [crate::hash::mix64(i) & crate::hash::mix64(len as u64), 0];
            let ids: Vec<u32> = (0..=(i % 3) as u32).map(|k| (i as u32) * 7 + k).collect();
            (crate::hash::mix64(key[0]), key, len, ids)
        };
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let memo = &memo;
                sc.spawn(move || {
                    for round in 0..200u64 {
                        for i in 0..64u64 {
                            let i = (i * 5 + t + round) % 64;
                            let (h, key, len, ids) = piece(i);
                            let mut got = [0; SHARED_IDS];
                            match memo.get(h, key, len, &mut got) {
                                Some(n) => assert_eq!(&got[..n], &ids[..], "piece {i}"),
                                None => memo.insert(h, key, len, &ids),
                            }
                        }
                    }
                });
            }
        });
        let held = (0..64).filter(|&i| {
            let (h, key, len, _) = piece(i);
            memo.get(h, key, len, &mut [0; SHARED_IDS]).is_some()
        });
        assert!((1..=16).contains(&held.count()));
    }
}
