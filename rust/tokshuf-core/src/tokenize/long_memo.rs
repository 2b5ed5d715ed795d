//! The memo's map of the pieces its sets do not hold (longer than a slot's key, or with more
//! ids than a slot has room for). Keys and ids live in two arenas and the map holds their
//! offsets, so remembering a piece allocates nothing once the arenas have grown, and
//! emptying the map when its budget is spent frees nothing: with a box for each key and
//! each id list, `malloc`, `free` and the map's regrowth showed in a build's profile
//! (docs/performance.md, round six).

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry as Slot, HashTable};
use rustc_hash::FxBuildHasher;

/// What an entry costs besides its key and ids: itself and its share of the map's buckets and
/// control bytes (a map at most 7/8 full, its buckets a power of two).
const ENTRY_COST: usize = 64;

#[derive(Clone, Copy)]
struct Entry {
    hash: u64,
    key: u32,
    key_len: u32,
    ids: u32,
    ids_len: u32,
}

impl Entry {
    /// Is this the entry of `piece` (whose hash is `hash`), its key in `keys`?
    #[inline]
    fn holds(&self, keys: &[u8], hash: u64, piece: &[u8]) -> bool {
        self.hash == hash && &keys[self.key as usize..][..self.key_len as usize] == piece
    }
}

pub struct LongMemo {
    table: HashTable<Entry>,
    keys: Vec<u8>,
    ids: Vec<u32>,
    budget: usize,
}

impl LongMemo {
    /// A map that empties itself before it would hold more than `budget` bytes.
    pub fn new(budget: usize) -> Self {
        LongMemo { table: HashTable::new(), keys: Vec::new(), ids: Vec::new(), budget }
    }

    /// Bytes held: keys, ids, and the map's entries.
    pub fn bytes(&self) -> usize {
        self.keys.len() + 4 * self.ids.len() + ENTRY_COST * self.table.len()
    }

    #[inline]
    pub fn get(&self, piece: &[u8]) -> Option<&[u32]> {
        self.find(FxBuildHasher.hash_one(piece), piece)
    }

    fn find(&self, hash: u64, piece: &[u8]) -> Option<&[u32]> {
        let e = self.table.find(hash, |e| e.holds(&self.keys, hash, piece))?;
        Some(&self.ids[e.ids as usize..][..e.ids_len as usize])
    }

    /// Remember the ids of `piece` (kept as they are if it is already there).
    pub fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        let cost = piece.len() + 4 * ids.len() + ENTRY_COST;
        if cost > self.budget {
            return;
        }
        let hash = FxBuildHasher.hash_one(piece);
        if self.bytes() + cost > self.budget {
            if self.find(hash, piece).is_some() {
                return;
            }
            self.table.clear();
            self.keys.clear();
            self.ids.clear();
        }
        // One probe finds the piece or its free slot.
        let keys = &self.keys;
        let e =
            Entry { hash, key: self.keys.len() as u32, key_len: piece.len() as u32, ids: self.ids.len() as u32, ids_len: ids.len() as u32 };
        match self.table.entry(hash, |e| e.holds(keys, hash, piece), |e| e.hash) {
            Slot::Occupied(_) => return,
            Slot::Vacant(v) => v.insert(e),
        };
        self.keys.extend_from_slice(piece);
        self.ids.extend_from_slice(ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_fits_and_empties_when_full() {
        let mut m = LongMemo::new(1000);
        m.insert(b"hello world", &[1, 2, 3, 4]);
        m.insert(b"hello worlds", &[5]);
        m.insert(b"hello world", &[9]); // already there: kept as it was
        assert_eq!(m.get(b"hello world"), Some(&[1, 2, 3, 4][..]));
        assert_eq!(m.get(b"hello worlds"), Some(&[5][..]));
        assert_eq!(m.get(b"hello worl"), None);
        assert!(m.bytes() <= 1000);
        // Filling it past its budget empties it first: only the newest remain.
        for i in 0..100u32 {
            m.insert(format!("piece number {i}").as_bytes(), &[i; 3]);
            assert!(m.bytes() <= 1000);
            assert_eq!(m.get(format!("piece number {i}").as_bytes()), Some(&[i; 3][..]));
        }
        assert_eq!(m.get(b"hello world"), None);
        // A piece larger than the whole budget is never held.
        m.insert(&[7; 2000], &[1]);
        assert_eq!(m.get(&[7; 2000]), None);
    }
}
