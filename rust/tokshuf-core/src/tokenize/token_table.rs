//! Tokens of up to 15 bytes by their bytes: the table behind "a piece that is itself a
//! token is that token" (tiktoken, and tokenizer.json files with `ignore_merges`), and
//! behind finding tiktoken's merge pairs when an encoding loads.
//!
//! A key is the token's bytes and length packed in one integer, an entry 32 bytes holding
//! key and id, two to a cache line, probed linearly at a load of at most 1/2: a lookup
//! usually reads one line (a hashbrown map reads a line of control bytes, then one of
//! entries), and `prefetch` lets many lookups wait on memory together, which is what makes
//! loading o200k's 2.9 M split lookups quick.

use crate::tokenize::big_table::BigTable;
use crate::tokenize::prefetch::prefetch;

/// The longest token the table holds.
pub const MAX_LEN: usize = 15;

/// `bytes` (at most `MAX_LEN`) and their length in one integer; never 0 for a non-empty
/// piece, so 0 marks an empty slot.
#[inline(always)]
pub fn pack(bytes: &[u8]) -> u128 {
    let mut buf = [0u8; 16];
    buf[..bytes.len()].copy_from_slice(bytes);
    buf[15] = bytes.len() as u8;
    u128::from_le_bytes(buf)
}

/// `pack(&buf[start..start + len])` for a buffer holding at least 16 bytes from `start`:
/// one load and a mask, no copy.
#[inline(always)]
pub fn pack_at(buf: &[u8], start: usize, len: usize) -> u128 {
    debug_assert!(len <= MAX_LEN);
    let word = u128::from_le_bytes(buf[start..start + 16].try_into().expect("16 bytes"));
    (word & ((1u128 << (8 * len)) - 1)) | ((len as u128) << 120)
}

#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Entry {
    key: u128,
    id: u32,
}

pub struct TokenTable {
    entries: BigTable<Entry>,
    shift: u32,
}

impl TokenTable {
    /// From (bytes, id) of tokens of 1 to `MAX_LEN` bytes; a later duplicate wins.
    pub fn new(tokens: &[(&[u8], u32)]) -> TokenTable {
        TokenTable::build(tokens.len(), tokens.iter().copied())
    }

    /// From at most `n` tokens of 1 to `MAX_LEN` bytes, (bytes, id); a later duplicate wins.
    /// Inserts land on random lines of a table far larger than the caches, so each token's
    /// line is requested `AHEAD` tokens before it is written (inserts stay in order).
    pub fn build<'a>(n: usize, tokens: impl Iterator<Item = (&'a [u8], u32)>) -> TokenTable {
        const AHEAD: usize = 16;
        let bits = (n.max(1) * 2).next_power_of_two().trailing_zeros().max(4);
        let mut t = TokenTable { entries: BigTable::new(1 << bits, Entry { key: 0, id: 0 }), shift: 64 - bits };
        let mut waiting = [(0u128, 0u32, 0usize); AHEAD];
        let mut k = 0;
        for (bytes, id) in tokens {
            debug_assert!((1..=MAX_LEN).contains(&bytes.len()));
            let key = pack(bytes);
            let home = t.home(key);
            prefetch(&t.entries[home]);
            let slot = &mut waiting[k % AHEAD];
            if k >= AHEAD {
                t.insert(*slot);
            }
            *slot = (key, id, home);
            k += 1;
        }
        for j in k.saturating_sub(AHEAD)..k {
            t.insert(waiting[j % AHEAD]);
        }
        t
    }

    #[inline(always)]
    fn insert(&mut self, (key, id, home): (u128, u32, usize)) {
        let mask = self.entries.len() - 1;
        let mut i = home;
        while self.entries[i].key != 0 && self.entries[i].key != key {
            i = (i + 1) & mask;
        }
        self.entries[i] = Entry { key, id };
    }

    #[inline(always)]
    fn home(&self, key: u128) -> usize {
        let x = (key as u64) ^ ((key >> 64) as u64).rotate_left(29);
        (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Ask for the line where `key` would be.
    #[inline(always)]
    pub fn prefetch(&self, key: u128) {
        prefetch(&self.entries[self.home(key)]);
    }

    /// The id of the token whose packed bytes are `key`.
    #[inline(always)]
    pub fn get(&self, key: u128) -> Option<u32> {
        let mask = self.entries.len() - 1;
        let mut i = self.home(key);
        loop {
            let e = &self.entries[i];
            if e.key == key {
                return Some(e.id);
            }
            if e.key == 0 {
                return None;
            }
            i = (i + 1) & mask;
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
