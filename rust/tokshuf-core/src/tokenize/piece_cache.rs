//! Per-thread memo of pre-token bytes -> ids. Natural text repeats its pre-tokens (words
//! with their leading space) so often that most are merged once per thread and then
//! copied: on 4.5 MB of the benchmark corpus, 1.2 M pre-tokens are 57 k distinct ones, 93 %
//! of them are at most 8 bytes and 99.5 % at most 16.
//!
//! Pieces of up to 16 bytes with up to 3 ids (nearly all) need no allocation: they live
//! inline in 32-byte slots (the key read straight from the text as two words), two slots
//! per 64-byte set, the more recent first (a direct-mapped table missed 7 % of pieces on
//! text it had just seen, from collisions). Other pieces (longer, or with more ids) go to
//! a hash map bounded in bytes, emptied when full; a short one also gets a slot saying so.
//!
//! A set is one aligned cache line, so a lookup costs one line from memory, and `Lookahead`
//! requests that line when the scanner finds the piece and reads it once the scanner has
//! found 64 pieces, with many lines in flight (requesting only the next piece's set was too
//! late to help and cost 12 % more CPU time). Looking the 64 up in one tight loop after the
//! scan was 2-7 % faster on the subset than a ring that looked each piece up 16 pieces after finding it
//! (docs/performance.md, round twenty). The table sits on huge pages where the kernel allows
//! (`big_table.rs`). Tried and dropped, as no faster on the 100 MB subset: a 128 KiB table
//! of the most recent pieces in front of this one, and looking every short piece up in the
//! shared table of whole tokens before the memo (more lines read per piece).

use crate::big_table::BigTable;
use crate::tokenize::long_memo::LongMemo;
use crate::tokenize::prefetch::prefetch;
use crate::tokenize::token_table::{pack_words, TokenTable, MAX_LEN};

const KEY_BYTES: usize = 16;
const SLOT_IDS: usize = 3;
/// A slot's `n` for a short piece with more ids than a slot holds: they are in the map of
/// long pieces, so a piece the sets do not hold is never looked for in the map.
const IN_LONG: u8 = u8::MAX;
/// Pieces up to this long go to the map; longer ones are never cached.
const LONG_MAX: usize = 1024;
const LONG_BUDGET: usize = 4 << 20;

#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Slot {
    key: [u64; 2],
    len: u8,
    n: u8,
    ids: [u32; SLOT_IDS],
}

/// Two slots, the more recent first, in one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Set([Slot; 2]);

const EMPTY: Slot = Slot { key: [0; 2], len: 0, n: 0, ids: [0; SLOT_IDS] };

/// A piece of the text and the set that remembers it (`usize::MAX`: too long for a slot).
#[derive(Clone, Copy)]
struct Located {
    start: usize,
    end: usize,
    set: usize,
    key: [u64; 2],
}

/// The `set` of a waiting entry that is an id already known (`start`), not a piece.
const KNOWN: usize = usize::MAX - 1;

const IDLE: Located = Located { start: 0, end: 0, set: usize::MAX, key: [0; 2] };

/// Pieces looked up together (16 and 32 were slower, 128 and 256 no faster).
const BATCH: usize = 64;

/// Looks pieces up in batches: the scanner fills a batch, each piece's memo set requested as
/// it is found; then the batch's sets are checked, and for each piece the memo does not hold
/// its line in the tokenizer's table of short tokens is requested;
/// then the pieces are looked up in order. Ids come out in piece order.
pub struct Lookahead<'a, F> {
    cache: &'a mut PieceCache,
    tokens: &'a TokenTable,
    text: &'a [u8],
    out: &'a mut Vec<u32>,
    encode: F,
    batch: [Located; BATCH],
    len: usize,
}

impl<'a, F: Fn(&[u8], &mut Vec<u32>)> Lookahead<'a, F> {
    /// Pieces of `text` go through `cache`, their ids to `out`; `encode` merges a piece the
    /// cache does not hold (appending its ids to `out`), after its line in `tokens` (the table
    /// `encode` looks in first) was requested.
    pub fn new(cache: &'a mut PieceCache, tokens: &'a TokenTable, text: &'a [u8], out: &'a mut Vec<u32>, encode: F) -> Self {
        Lookahead { cache, tokens, text, out, encode, batch: [IDLE; BATCH], len: 0 }
    }

    /// The next piece, `text[start..end]`.
    #[inline(always)]
    pub fn push(&mut self, start: usize, end: usize) {
        let at = self.cache.locate(self.text, start, end);
        self.cache.prefetch(&at);
        self.batch[self.len] = at;
        self.len += 1;
        if self.len == BATCH {
            self.flush();
        }
    }

    /// The next id is `id` itself (an added token between pieces).
    pub fn push_id(&mut self, id: u32) {
        self.batch[self.len] = Located { start: id as usize, end: 0, set: KNOWN, key: [0; 2] };
        self.len += 1;
        if self.len == BATCH {
            self.flush();
        }
    }

    /// Look the batch up: first request the token-table lines of the pieces the memo does
    /// not hold (their sets were requested as they were found), then resolve in order.
    #[inline(never)]
    fn flush(&mut self) {
        let n = self.len;
        for at in &self.batch[..n] {
            if at.set < KNOWN && at.end - at.start <= MAX_LEN && !self.cache.holds(at) {
                // The memo's key already holds the piece's bytes, zero-padded.
                self.tokens.prefetch(pack_words(at.key, at.end - at.start));
            }
        }
        for at in &self.batch[..n] {
            if at.set == KNOWN {
                self.out.push(at.start as u32);
            } else {
                self.cache.resolve(self.text, at, self.out, &self.encode);
            }
        }
        self.len = 0;
    }

    /// Look up the pieces still waiting.
    pub fn finish(mut self) {
        self.flush();
    }
}

pub struct PieceCache {
    sets: BigTable<Set>,
    mask: usize,
    long: LongMemo,
}

#[inline(always)]
fn load(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Masks keeping the first `n` bytes of two little-endian words, for n = 0..=16.
const MASKS: [[u64; 2]; 17] = {
    let mut m = [[0u64; 2]; 17];
    let mut n = 0;
    while n <= 16 {
        let lo = if n >= 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
        let hi = if n >= 16 {
            u64::MAX
        } else if n <= 8 {
            0
        } else {
            (1u64 << (8 * (n - 8))) - 1
        };
        m[n] = [lo, hi];
        n += 1;
    }
    m
};

/// `text[start..end]` (at most 16 bytes) as two little-endian words, zero-padded.
#[inline(always)]
fn key_words(text: &[u8], start: usize, end: usize) -> [u64; 2] {
    let len = end - start;
    if start + KEY_BYTES <= text.len() {
        let m = MASKS[len];
        [load(text, start) & m[0], load(text, start + 8) & m[1]]
    } else {
        let mut buf = [0u8; KEY_BYTES];
        buf[..len].copy_from_slice(&text[start..end]);
        [load(&buf, 0), load(&buf, 8)]
    }
}

#[inline(always)]
fn hash(key: &[u64; 2]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let h = (key[0] ^ key[1].rotate_left(31)).wrapping_mul(K);
    h ^ (h >> 29)
}

impl PieceCache {
    /// A cache of `1 << bits` slots (32 bytes each), in sets of two.
    pub fn new(bits: u32) -> Self {
        PieceCache { sets: BigTable::new(1 << (bits - 1), Set([EMPTY; 2])), mask: (1 << (bits - 1)) - 1, long: LongMemo::new(LONG_BUDGET) }
    }

    /// Append the ids of the piece `text[start..end]` to `out`: from the cache, or computed
    /// by `encode` (which must append them to `out`) and remembered.
    #[inline(always)]
    pub fn encode(&mut self, text: &[u8], start: usize, end: usize, out: &mut Vec<u32>, encode: impl FnOnce(&[u8], &mut Vec<u32>)) {
        let p = self.locate(text, start, end);
        self.resolve(text, &p, out, encode);
    }

    /// Where the piece `text[start..end]` would be remembered. `prefetch` asks for that
    /// cache line now, so a later `resolve` finds it in cache.
    #[inline(always)]
    fn locate(&self, text: &[u8], start: usize, end: usize) -> Located {
        if end - start > KEY_BYTES {
            return Located { start, end, set: usize::MAX, key: [0; 2] };
        }
        let key = key_words(text, start, end);
        Located { start, end, set: hash(&key) as usize & self.mask, key }
    }

    #[inline(always)]
    fn prefetch(&self, p: &Located) {
        if let Some(set) = self.sets.get(p.set) {
            prefetch(set);
        }
    }

    /// Does the memo hold the piece at `p`? (A short piece's set only; long pieces: no.)
    #[inline(always)]
    fn holds(&self, p: &Located) -> bool {
        let len = p.end - p.start;
        self.sets.get(p.set).is_some_and(|set| set.0.iter().any(|s| s.key == p.key && s.len as usize == len))
    }

    #[inline(always)]
    fn resolve(&mut self, text: &[u8], p: &Located, out: &mut Vec<u32>, encode: impl FnOnce(&[u8], &mut Vec<u32>)) {
        let (start, end, key, si) = (p.start, p.end, p.key, p.set);
        if si == usize::MAX {
            return self.encode_long(&text[start..end], out, encode);
        }
        let len = end - start;
        let set = &mut self.sets[si].0;
        // Keys are zero-padded, so the length must match too ("a" vs "a\0").
        let hit = |s: &Slot| s.key == key && s.len as usize == len;
        let found = if hit(&set[0]) {
            true
        } else if hit(&set[1]) {
            // Move to the front of its set.
            set.swap(0, 1);
            true
        } else {
            false
        };
        if found {
            let slot = &set[0];
            if slot.n != IN_LONG {
                // Copy all three (a fixed-size copy, no memcpy call), keep n. Read from the
                // set itself: a copy of the slot on the stack was read back across two
                // stores, which the CPU cannot forward (a stall on every memo hit).
                let keep = out.len() + slot.n as usize;
                out.extend_from_slice(&slot.ids);
                out.truncate(keep);
                return;
            }
            if let Some(ids) = self.long.get(&text[start..end]) {
                out.extend_from_slice(ids);
                return;
            }
            // The map was emptied since: merge again, and keep the slot.
        }
        let begin = out.len();
        let piece = &text[start..end];
        encode(piece, out);
        let n = out.len() - begin;
        if n > SLOT_IDS {
            self.remember_long(piece, &out[begin..]);
        }
        if !found {
            let mut ids = [0; SLOT_IDS];
            let n = if n <= SLOT_IDS {
                ids[..n].copy_from_slice(&out[begin..]);
                n as u8
            } else {
                IN_LONG
            };
            // The older of the two goes.
            let set = &mut self.sets[si].0;
            set[1] = set[0];
            set[0] = Slot { key, len: len as u8, n, ids };
        }
    }

    #[cold]
    fn encode_long(&mut self, piece: &[u8], out: &mut Vec<u32>, encode: impl FnOnce(&[u8], &mut Vec<u32>)) {
        if let Some(ids) = self.long.get(piece) {
            out.extend_from_slice(ids);
            return;
        }
        let begin = out.len();
        encode(piece, out);
        self.remember_long(piece, &out[begin..]);
    }

    fn remember_long(&mut self, piece: &[u8], ids: &[u32]) {
        if piece.len() <= LONG_MAX {
            self.long.insert(piece, ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_equal_misses_and_collisions_overwrite() {
        let mut c = PieceCache::new(2); // 4 slots: collisions guaranteed
        let enc = |p: &[u8], out: &mut Vec<u32>| out.extend(p.iter().map(|&b| b as u32 * 3));
        let text: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        for round in 0..3 {
            for i in 0..400usize {
                // Pieces of every length, some touching the end of the text.
                let start = (i * 37) % text.len();
                let end = (start + i % 40 + 1).min(text.len());
                let mut got = vec![9];
                c.encode(&text, start, end, &mut got, enc);
                let mut want = vec![9];
                enc(&text[start..end], &mut want);
                assert_eq!(got, want, "round {round} piece {start}..{end}");
            }
        }
        // Same bytes, different lengths (zero padding must not alias).
        let t = b"a\0";
        let mut a = vec![];
        c.encode(t, 0, 1, &mut a, enc);
        let mut b = vec![];
        c.encode(t, 0, 2, &mut b, enc);
        assert_eq!(b, vec![97 * 3, 0]);
    }

    /// Short pieces with more ids than a slot holds keep their slot when the map of long
    /// pieces is emptied, and are merged again.
    #[test]
    fn short_pieces_with_many_ids_survive_the_long_map_being_emptied() {
        let enc = |p: &[u8], out: &mut Vec<u32>| out.extend(p.iter().map(|&b| b as u32 + 1));
        let mut c = PieceCache::new(18);
        let pieces: Vec<[u8; 16]> = (0..60_000u64).map(|i| (crate::hash::mix64(i) as u128 | 1).to_le_bytes()).collect();
        let text: Vec<u8> = pieces.concat();
        let (mut emptied, mut bytes) = (false, 0);
        for round in 0..2 {
            for (k, p) in pieces.iter().enumerate() {
                let mut got = vec![];
                c.encode(&text, 16 * k, 16 * k + 16, &mut got, enc);
                let mut want = vec![];
                enc(p, &mut want);
                assert_eq!(got, want, "round {round} piece {k}");
                emptied |= c.long.bytes() < bytes;
                bytes = c.long.bytes();
            }
        }
        assert!(emptied, "the map of long pieces was never emptied");
    }

    /// Ids through a `Lookahead` equal each piece's own encoding, in piece order, with and
    /// without a token table to prefetch from, for runs of pieces shorter and longer than
    /// a batch, with known ids between pieces, through a memo that keeps evicting.
    #[test]
    fn lookahead_equals_piece_by_piece() {
        let enc = |p: &[u8], out: &mut Vec<u32>| out.extend(p.iter().map(|&b| b as u32 * 3));
        let text: Vec<u8> = (0..5000u32).map(|i| b"abcab cba"[(crate::hash::mix64(i as u64) % 9) as usize]).collect();
        // Pieces of 1 to 20 bytes covering the text.
        let mut pieces = vec![];
        let mut at = 0;
        while at < text.len() {
            let end = (at + 1 + (crate::hash::mix64(at as u64 + 7) % 20) as usize).min(text.len());
            pieces.push((at, end));
            at = end;
        }
        // Every third distinct short piece is a "token" (its line is prefetched, nothing more).
        let mut distinct: Vec<&[u8]> = pieces.iter().map(|&(s, e)| &text[s..e]).filter(|p| p.len() <= MAX_LEN).collect();
        distinct.sort();
        distinct.dedup();
        let tokens: Vec<(&[u8], u32)> = distinct.iter().step_by(3).enumerate().map(|(i, &p)| (p, 1_000_000 + i as u32)).collect();
        let table = TokenTable::new(&tokens);
        for n in [0, 1, BATCH - 1, BATCH, BATCH + 1, 2 * BATCH + 3, pieces.len()] {
            // Every seventh piece comes after a known id (an added token).
            let mut want = vec![42];
            for (k, &(s, e)) in pieces[..n].iter().enumerate() {
                if k % 7 == 3 {
                    want.push(7_000_000 + k as u32);
                }
                enc(&text[s..e], &mut want);
            }
            let mut cache = PieceCache::new(3); // tiny: evictions throughout
            for round in 0..2 {
                let mut got = vec![42];
                let mut la = Lookahead::new(&mut cache, &table, &text, &mut got, enc);
                for (k, &(s, e)) in pieces[..n].iter().enumerate() {
                    if k % 7 == 3 {
                        la.push_id(7_000_000 + k as u32);
                    }
                    la.push(s, e);
                }
                la.finish();
                assert_eq!(got, want, "{n} pieces, round {round}");
            }
        }
    }
}
