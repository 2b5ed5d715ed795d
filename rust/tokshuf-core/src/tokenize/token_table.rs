//! Tokens of up to 15 bytes by their bytes: the table behind "a piece that is itself a
//! token is that token" (tiktoken, and tokenizer.json files with `ignore_merges`), and
//! behind the rank of each pair a tiktoken merge forms.
//!
//! A key is the token's bytes and length packed in one integer; an entry holds key and id,
//! probed linearly at a load of at most 1/2, so a lookup usually reads one cache line (a
//! hashbrown map reads a line of control bytes, then one of entries), and `prefetch` lets
//! many lookups wait on memory together. Tokens of up to 7 bytes have entries of 16 bytes
//! in a table of their own, longer ones 32.

use crate::big_table::BigTable;
use crate::tokenize::prefetch::prefetch;

/// The longest token the table holds.
pub const MAX_LEN: usize = 15;

/// `bytes` (at most `MAX_LEN`) and their length in one integer; never 0 for a non-empty
/// piece, so 0 marks an empty slot.
///
/// Loads from both ends of the slice, which overlap, rather than a copy into a zeroed buffer:
/// that buffer was read back as two words over several smaller stores, which the CPU cannot
/// forward, a stall on every piece the memo misses.
#[inline(always)]
pub fn pack(bytes: &[u8]) -> u128 {
    let n = bytes.len();
    debug_assert!(n <= MAX_LEN);
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let half = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as u64;
    let (lo, hi) = match n {
        0 => (0, 0),
        1..=3 => (bytes[0] as u64 | (bytes[n / 2] as u64) << (8 * (n / 2)) | (bytes[n - 1] as u64) << (8 * (n - 1)), 0),
        4..=7 => (half(0) | half(n - 4) << (8 * (n - 4)), 0),
        8 => (word(0), 0),
        _ => (word(0), word(n - 8) >> (8 * (16 - n))),
    };
    pack_words([lo, hi], n)
}

/// `pack` of a piece of `len` bytes (at most `MAX_LEN`) given as two little-endian words,
/// zero beyond the piece (the memo's key of it).
#[inline(always)]
pub fn pack_words(words: [u64; 2], len: usize) -> u128 {
    debug_assert!(len <= MAX_LEN);
    words[0] as u128 | (words[1] as u128) << 64 | (len as u128) << 120
}

/// `pack(&buf[start..start + len])` for a buffer holding at least 16 bytes from `start`:
/// one load and a mask, no copy.
#[inline(always)]
pub fn pack_at(buf: &[u8], start: usize, len: usize) -> u128 {
    debug_assert!(len <= MAX_LEN);
    let word = u128::from_le_bytes(buf[start..start + 16].try_into().expect("16 bytes"));
    (word & ((1u128 << (8 * len)) - 1)) | ((len as u128) << 120)
}

/// Tokens of up to this many bytes (most of every vocabulary, and most lookups a merge
/// makes) live in a table of 16-byte entries, a quarter the size of the full table's: the
/// rank lookups after each merge wait on memory, and the smaller table is far more often
/// still in the caches.
const NARROW_LEN: usize = 7;

/// One open-addressing table of keys (never 0: 0 marks an empty slot) and ids, probed
/// linearly at a load of at most 1/2, each entry's line requested `AHEAD` inserts before it is
/// written (inserts stay in order, so a later duplicate still wins).
struct Open<K: Key> {
    entries: BigTable<Entry<K>>,
    shift: u32,
}

/// A key and its id: 16 bytes with a `u64` key, 32 with a `u128` one, so that no entry
/// straddles two cache lines (the table starts on one).
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry<K> {
    key: K,
    id: u32,
}

trait Key: Copy + Eq {
    const EMPTY: Self;
    fn hash(self) -> u64;
}

impl Key for u64 {
    const EMPTY: Self = 0;
    #[inline(always)]
    fn hash(self) -> u64 {
        (self ^ self >> 29).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

impl Key for u128 {
    const EMPTY: Self = 0;
    #[inline(always)]
    fn hash(self) -> u64 {
        ((self as u64) ^ ((self >> 64) as u64).rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

impl<K: Key> Open<K> {
    fn build(n: usize, keys: impl Iterator<Item = (K, u32)>) -> Open<K> {
        const AHEAD: usize = 16;
        let bits = (n.max(1) * 2).next_power_of_two().trailing_zeros().max(4);
        let empty = Entry { key: K::EMPTY, id: 0 };
        let mut t = Open { entries: BigTable::new(1 << bits, empty), shift: 64 - bits };
        let mut waiting = [(empty, 0usize); AHEAD];
        let mut k = 0;
        for (key, id) in keys {
            let home = t.home(key);
            prefetch(&t.entries[home]);
            let slot = &mut waiting[k % AHEAD];
            if k >= AHEAD {
                t.insert(*slot);
            }
            *slot = (Entry { key, id }, home);
            k += 1;
        }
        for j in k.saturating_sub(AHEAD)..k {
            t.insert(waiting[j % AHEAD]);
        }
        t
    }

    #[inline(always)]
    fn insert(&mut self, (entry, home): (Entry<K>, usize)) {
        let mask = self.entries.len() - 1;
        let mut i = home;
        while self.entries[i].key != K::EMPTY && self.entries[i].key != entry.key {
            i = (i + 1) & mask;
        }
        self.entries[i] = entry;
    }

    #[inline(always)]
    fn home(&self, key: K) -> usize {
        (key.hash() >> self.shift) as usize
    }

    #[inline(always)]
    fn prefetch(&self, key: K) {
        prefetch(&self.entries[self.home(key)]);
    }

    #[inline(always)]
    fn get(&self, key: K) -> Option<u32> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let e = &self.entries[i];
            if e.key == key {
                return Some(e.id);
            }
            if e.key == K::EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }
}

pub struct TokenTable {
    narrow: Open<u64>,
    wide: Open<u128>,
}

/// The key of a narrow table for a packed key of at most `NARROW_LEN` bytes: the bytes,
/// with the length in the top byte.
#[inline(always)]
fn narrow_key(key: u128) -> Option<u64> {
    let len = (key >> 120) as u64;
    (len as usize <= NARROW_LEN).then_some(key as u64 | len << 56)
}

impl TokenTable {
    /// From (bytes, id) of tokens of 1 to `MAX_LEN` bytes; a later duplicate wins.
    pub fn new(tokens: &[(&[u8], u32)]) -> TokenTable {
        TokenTable::build(tokens.iter().copied())
    }

    /// From tokens of 1 to `MAX_LEN` bytes, (bytes, id); a later duplicate wins. Inserts
    /// land on random lines of tables far larger than the caches, so their lines are
    /// requested ahead of the writes.
    pub fn build<'a>(tokens: impl Iterator<Item = (&'a [u8], u32)> + Clone) -> TokenTable {
        let (narrow_n, wide_n) = tokens.clone().fold((0, 0), |(n, w), (b, _)| if b.len() <= NARROW_LEN { (n + 1, w) } else { (n, w + 1) });
        let packed = tokens.map(|(bytes, id)| {
            debug_assert!((1..=MAX_LEN).contains(&bytes.len()));
            (pack(bytes), id)
        });
        let narrow = Open::build(narrow_n, packed.clone().filter_map(|(key, id)| Some((narrow_key(key)?, id))));
        let wide = Open::build(wide_n, packed.filter(|&(key, _)| narrow_key(key).is_none()));
        TokenTable { narrow, wide }
    }

    /// Ask for the line where `key` would be.
    #[inline(always)]
    pub fn prefetch(&self, key: u128) {
        match narrow_key(key) {
            Some(k) => self.narrow.prefetch(k),
            None => self.wide.prefetch(key),
        }
    }

    /// The id of the token whose packed bytes are `key`.
    #[inline(always)]
    pub fn get(&self, key: u128) -> Option<u32> {
        match narrow_key(key) {
            Some(k) => self.narrow.get(k),
            None => self.wide.get(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exactly_its_tokens_and_later_duplicates_win() {
        let words: Vec<Vec<u8>> = (0..3000u32).map(|i| format!("w{}", i * 7919 % 100_003).into_bytes()).collect();
        let mut tokens: Vec<(&[u8], u32)> = words.iter().enumerate().map(|(i, w)| (&w[..], i as u32)).collect();
        tokens.push((b"w0", 99_999));
        tokens.push((b"a\0", 5)); // a trailing zero byte differs from "a" by its length
        let t = TokenTable::new(&tokens);
        assert_eq!(t.get(pack(b"w0")), Some(99_999));
        assert_eq!(t.get(pack(&words[17])), Some(17));
        assert_eq!(t.get(pack(b"a\0")), Some(5));
        assert_eq!(t.get(pack(b"a")), None);
        assert_eq!(t.get(pack(b"w100004")), None);
    }

    /// Both tables, either side of their boundary: every token found with its id, and no
    /// piece that differs from a token by a byte or its length.
    #[test]
    fn finds_tokens_of_every_length() {
        let words: Vec<Vec<u8>> = (0..6000u64)
            .map(|i| (0..1 + i as usize % MAX_LEN).map(|k| (crate::hash::mix64(i * 31 + k as u64) % 3) as u8).collect())
            .collect();
        let t = TokenTable::new(&words.iter().enumerate().map(|(i, w)| (&w[..], i as u32)).collect::<Vec<_>>());
        let last: std::collections::HashMap<&[u8], u32> = words.iter().enumerate().map(|(i, w)| (&w[..], i as u32)).collect();
        for w in &words {
            assert_eq!(t.get(pack(w)), Some(last[&w[..]]));
            for len in [NARROW_LEN, NARROW_LEN + 1, w.len() + 1] {
                let mut other = w.clone();
                other.resize(len.min(MAX_LEN), 7);
                assert_eq!(t.get(pack(&other)), last.get(&other[..]).copied(), "{other:?}");
            }
        }
    }

    /// The loads from both ends, and the two zero-padded words, give what a copy into a zeroed
    /// buffer gives, at every length, zero bytes included.
    #[test]
    fn pack_equals_the_bytes_copied_into_a_zeroed_buffer() {
        let mut seed = 3u64;
        for len in 0..=MAX_LEN {
            for _ in 0..200 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = crate::hash::mix64(seed + 1);
                        [0, 1, 0x7f, 0x80, 0xff, seed as u8][(seed >> 8) as usize % 6]
                    })
                    .collect();
                let mut buf = [0u8; 16];
                buf[..len].copy_from_slice(&bytes);
                let words = [u64::from_le_bytes(buf[..8].try_into().unwrap()), u64::from_le_bytes(buf[8..].try_into().unwrap())];
                buf[15] = len as u8;
                assert_eq!(pack(&bytes), u128::from_le_bytes(buf), "{bytes:?}");
                assert_eq!(pack_words(words, len), pack(&bytes), "{bytes:?}");
            }
        }
    }

    #[test]
    fn pack_at_equals_pack() {
        let mut buf = [0u8; 48];
        for (i, b) in buf.iter_mut().enumerate().take(32) {
            *b = (i as u8).wrapping_mul(37) | 1;
        }
        for start in 0..32 {
            for len in 1..=MAX_LEN.min(32 - start) {
                assert_eq!(pack_at(&buf, start, len), pack(&buf[start..start + len]), "{start} {len}");
            }
        }
    }
}
