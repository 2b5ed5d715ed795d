//! Byte-level BPE by merge list, as the `BPE` model of Hugging Face `tokenizers` runs it on
//! the output of a ByteLevel pre-tokenizer: every byte starts as the id of its byte-level
//! character, then the adjacent pair with the lowest merge rank is merged, leftmost first,
//! until none is left. Ranks belong to pairs of ids.
//!
//! `tokenizers` uses a heap whose stale entries are recognised by the merged id alone; as
//! symbols only ever grow to the right, a stale entry can never pass that test with a
//! different pair, so its order is exactly "lowest rank, then leftmost", which is what both
//! loops here implement.
//!
//! Merging runs only on memo misses, yet took a quarter of a cl100k build, most of it
//! waiting on pair-table lookups from memory (see `pair_table.rs` for the table's layout).
//! A per-thread 64 KiB direct-mapped cache of those lookups was tried and gave no
//! measurable gain: the pairs met are too varied.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU8, Ordering};

use rustc_hash::FxHashMap;

use crate::tokenize::bpe::{Starts, COMPACT_THRESHOLD};
use crate::tokenize::hf_json::{BpeModel, Merge, Vocab};
use crate::tokenize::pair_ranks::PairRanks;
use crate::tokenize::pair_table::PairTable;
use crate::tokenize::side_by_side;
use crate::tokenize::token_table::{pack, TokenTable, MAX_LEN};

const NO_PAIR: (u32, u32) = (u32::MAX, u32::MAX);

/// Above this many bytes a piece is merged with the heap instead of the quadratic scan.
const HEAP_THRESHOLD: usize = 64;

/// GPT-2's byte -> printable character table used by ByteLevel.
pub fn byte_level_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("latin extended")
        };
    }
    table
}

/// The ids of each merge's two tokens and of the token they make.
fn merge_ids(vocab: &Vocab, merges: &[Merge]) -> Result<Vec<[u32; 3]>, String> {
    let id_of = |tok: &str| vocab.get(tok).copied().ok_or_else(|| format!("merge token {tok:?} is not in the vocabulary"));
    let mut merged = String::new();
    merges
        .iter()
        .map(|Merge(a, b)| {
            merged.clear();
            merged.push_str(a);
            merged.push_str(b);
            Ok([id_of(a)?, id_of(b)?, id_of(&merged)?])
        })
        .collect()
}

/// Every token's bytes in one buffer (no allocation per token) and the end of each in it
/// with its id; tokens holding a character outside `alphabet` are left out.
fn token_bytes(vocab: &Vocab, alphabet: &[char; 256]) -> (Vec<u8>, Vec<(usize, u32)>) {
    // The alphabet's characters are below U+0200.
    let mut inverse = [u16::MAX; 0x200];
    for (b, &c) in alphabet.iter().enumerate() {
        inverse[c as usize] = b as u16;
    }
    let (mut bytes, mut ends) = (Vec::with_capacity(vocab.len() * 8), Vec::with_capacity(vocab.len()));
    'tokens: for (tok, &id) in vocab {
        let start = bytes.len();
        for c in tok.chars() {
            match inverse.get(c as usize) {
                Some(&b) if b != u16::MAX => bytes.push(b as u8),
                _ => {
                    bytes.truncate(start);
                    continue 'tokens;
                }
            }
        }
        ends.push((bytes.len(), id));
    }
    (bytes, ends)
}

/// The table of `merges` ((left, right, merged) ids by rank), and whether every merged id
/// is below 2^31.
fn pair_table(merges: &[[u32; 3]]) -> (PairTable, bool) {
    let mut table = PairTable::with_capacity(merges.len());
    let mut ids_fit = true;
    for (rank, &[a, b, merged]) in merges.iter().enumerate() {
        // Later duplicates win, as in `tokenizers` (it collects into a map in order).
        table.insert(a, b, rank as u32, merged);
        ids_fit &= merged < 1 << 31;
    }
    (table, ids_fit)
}

/// (rank, merged id) of each pair of single bytes, from the merges in order of rank (later
/// duplicates win, as in `pair_table`): one pass over the merges rather than a lookup of
/// every pair in the table, which missed the caches 65,536 times.
fn byte_pairs(byte_ids: &[u32; 256], merges: &[[u32; 3]]) -> Box<[(u32, u32)]> {
    // Two bytes' characters may share an id, in a vocabulary that gives two tokens one id.
    let mut bytes_of: FxHashMap<u32, Vec<u8>> = FxHashMap::default();
    for (b, &id) in byte_ids.iter().enumerate().filter(|&(_, &id)| id != u32::MAX) {
        bytes_of.entry(id).or_default().push(b as u8);
    }
    let mut pairs = vec![NO_PAIR; 256 * 256].into_boxed_slice();
    for (rank, [a, b, merged]) in merges.iter().enumerate() {
        if let (Some(xs), Some(ys)) = (bytes_of.get(a), bytes_of.get(b)) {
            for &x in xs {
                for &y in ys {
                    pairs[x as usize * 256 + y as usize] = (rank as u32, *merged);
                }
            }
        }
    }
    pairs
}

/// The tokens of `token_bytes` as (bytes, id).
fn decoded<'a>(bytes: &'a [u8], ends: &'a [(usize, u32)]) -> impl Iterator<Item = (&'a [u8], u32)> {
    let starts = std::iter::once(0).chain(ends.iter().map(|&(end, _)| end));
    starts.zip(ends).map(|(start, &(end, id))| (&bytes[start..end], id))
}

/// Pieces that are themselves a token and encode to it, found without merging: tokens of up
/// to 15 bytes in a `TokenTable` (most lookups), longer ones by their bytes. With
/// `ignore_merges` every token is its own encoding. Otherwise a token is only when its merge
/// ends in it (all but 2 of GPT-NeoX's 49,912 short ones): `own` says so for each token, found
/// by merging it the first time any thread meets it as a piece, rather than for every token
/// while the tokenizer loads (where it was a large part of the load, and a small build meets
/// only some of them); longer pieces are always merged.
struct Whole {
    short: TokenTable,
    long: FxHashMap<Vec<u8>, u32>,
    own: Option<Box<[AtomicU8]>>,
}

/// `Whole::own` of a token not yet merged, of one that is its own encoding, of one that is not.
const UNKNOWN: u8 = 0;
const OWN: u8 = 1;
const NOT_OWN: u8 = 2;
/// Tokens with larger ids (a sparse vocabulary) are left out of `Whole` without
/// `ignore_merges`, and merged every time, so that `own` stays small.
const MAX_OWN_IDS: usize = 1 << 22;

impl Whole {
    /// Every token of `it` (with `ignore_merges`).
    fn tokens<'a>(it: impl Iterator<Item = (&'a [u8], u32)>) -> Whole {
        let (short, long): (Vec<_>, Vec<_>) = it.filter(|(b, _)| !b.is_empty()).partition(|(b, _)| b.len() <= MAX_LEN);
        Whole { short: TokenTable::new(&short), long: long.into_iter().map(|(b, id)| (b.to_vec(), id)).collect(), own: None }
    }

    /// The tokens of `it`: all of them with `ignore_merges`, else the short ones.
    fn of<'a>(it: impl Iterator<Item = (&'a [u8], u32)>, ignore_merges: bool) -> Whole {
        if ignore_merges {
            Whole::tokens(it)
        } else {
            Whole::merged_tokens(it)
        }
    }

    /// The short tokens of `it`, each its own encoding once merging it says so.
    fn merged_tokens<'a>(it: impl Iterator<Item = (&'a [u8], u32)>) -> Whole {
        let short: Vec<_> = it.filter(|(b, id)| (1..=MAX_LEN).contains(&b.len()) && (*id as usize) < MAX_OWN_IDS).collect();
        let ids = short.iter().map(|&(_, id)| id as usize + 1).max().unwrap_or(0);
        let own = (0..ids).map(|_| AtomicU8::new(UNKNOWN)).collect();
        Whole { short: TokenTable::new(&short), long: FxHashMap::default(), own: Some(own) }
    }

    #[inline(always)]
    fn get(&self, piece: &[u8]) -> Option<u32> {
        if piece.len() <= MAX_LEN {
            self.short.get(pack(piece))
        } else {
            self.long.get(piece).copied()
        }
    }
}

pub struct MergeBpe {
    byte_ids: [u32; 256],
    /// (rank, merged id) of each pair of single bytes, `NO_PAIR` if none: the first round
    /// of every merge without hashing.
    byte_pairs: Box<[(u32, u32)]>,
    merges: PairTable,
    whole: Whole,
    /// Every merged id is below 2^31, as `merge_compact` needs (to mark ids apart from ranks).
    ids_fit: bool,
}

/// What a `MergeBpe` is made from, without the vocabulary's strings: each byte's id, each
/// merge's ids by rank, and each token's bytes. It is what `saved_tables` keeps on disk.
pub struct MergeSource {
    pub byte_ids: [u32; 256],
    /// (left, right, merged) ids, by rank.
    pub merges: Vec<[u32; 3]>,
    /// The bytes of every token, one after another; `tokens` holds (end, id) of each.
    pub token_bytes: Vec<u8>,
    pub tokens: Vec<(usize, u32)>,
    pub ignore_merges: bool,
}

impl MergeBpe {
    /// From the `model` of a tokenizer.json, which the caller has checked to be a plain
    /// byte-level BPE (no dropout, prefixes, suffixes), with what it was made from. Errors
    /// name what is missing.
    pub fn from_model(model: &BpeModel, ignore_merges: bool) -> std::result::Result<(MergeBpe, MergeSource), String> {
        let vocab = &model.vocab;
        let id_of = |tok: &str| vocab.get(tok).copied();
        let alphabet = byte_level_alphabet();
        // Bytes that never occur in UTF-8 text (C0, C1, F5..FF) may be missing.
        let mut byte_ids = [u32::MAX; 256];
        for (b, c) in alphabet.iter().enumerate() {
            match id_of(&c.to_string()) {
                Some(id) => byte_ids[b] = id,
                None if b == 0xC0 || b == 0xC1 || b >= 0xF5 => {}
                None => return Err(format!("vocabulary lacks the byte-level character of byte {b:#04x}")),
            }
        }
        // Two threads: one looks up the ids of 7/8 of the merges, the other those of the
        // first eighth, then decodes the tokens and builds the table of whole tokens (which
        // take about as long as three quarters of the lookups). The second thread's errors
        // come after the first's, as if in one pass.
        let (first, second) = model.merges.split_at(model.merges.len() / 8);
        let (rest, (ids, token_bytes, tokens, whole)) = side_by_side(
            || merge_ids(vocab, second),
            || {
                let ids = merge_ids(vocab, first);
                let (bytes, ends) = token_bytes(vocab, &alphabet);
                let whole = Whole::of(decoded(&bytes, &ends), ignore_merges);
                (ids, bytes, ends, whole)
            },
        );
        let mut merges = ids?;
        merges.extend(rest?);
        let (table, ids_fit) = pair_table(&merges);
        let byte_pairs = byte_pairs(&byte_ids, &merges);
        let bpe = MergeBpe { byte_ids, byte_pairs, merges: table, whole, ids_fit };
        Ok((bpe, MergeSource { byte_ids, merges, token_bytes, tokens, ignore_merges }))
    }

    /// From what `from_model` made it from: the table of pairs and that of whole tokens
    /// side by side.
    pub fn from_source(source: &MergeSource) -> MergeBpe {
        let MergeSource { byte_ids, merges, token_bytes, tokens, ignore_merges } = source;
        let (whole, ((table, ids_fit), byte_pairs)) =
            side_by_side(|| Whole::of(decoded(token_bytes, tokens), *ignore_merges), || (pair_table(merges), byte_pairs(byte_ids, merges)));
        MergeBpe { byte_ids: *byte_ids, byte_pairs, merges: table, whole, ids_fit }
    }

    #[inline]
    fn pair(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.merges.get(a, b)
    }

    /// Append the ids of one pre-token (raw bytes; the byte-level mapping is implied).
    pub fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        if let Some(id) = self.whole.get(piece) {
            let Some(own) = &self.whole.own else {
                out.push(id);
                return;
            };
            // Threads that meet a token at once both merge it, to the same ids.
            let known = &own[id as usize];
            match known.load(Ordering::Relaxed) {
                OWN => return out.push(id),
                NOT_OWN => {}
                _ => {
                    let begin = out.len();
                    self.merge(piece, out);
                    known.store(if out[begin..] == [id] { OWN } else { NOT_OWN }, Ordering::Relaxed);
                    return;
                }
            }
        }
        self.merge(piece, out);
    }

    /// The tokens of up to `MAX_LEN` bytes, where `encode_piece` looks first.
    pub fn short_tokens(&self) -> &TokenTable {
        &self.whole.short
    }

    fn merge(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() == 1 {
            out.push(self.byte_ids[piece[0] as usize]);
        } else if piece.len() <= HEAP_THRESHOLD {
            self.merge_scan(piece, out);
        } else if piece.len() > COMPACT_THRESHOLD && self.ids_fit {
            self.merge_compact(piece, out);
        } else {
            self.merge_heap(piece, out);
        }
    }

    /// Short pieces: rescan the pair ranks for the minimum after every merge (on the
    /// stack: no allocation).
    fn merge_scan(&self, piece: &[u8], out: &mut Vec<u32>) {
        const NONE: (u32, u32) = (u32::MAX, u32::MAX);
        let mut syms = [0u32; HEAP_THRESHOLD];
        // pairs[i]: (rank, merged id) of (syms[i], syms[i + 1]).
        let mut pairs = [NONE; HEAP_THRESHOLD];
        debug_assert!(piece.len() <= HEAP_THRESHOLD);
        let mut n = piece.len();
        for (s, &b) in syms.iter_mut().zip(piece) {
            *s = self.byte_ids[b as usize];
        }
        for i in 0..n - 1 {
            pairs[i] = self.byte_pairs[(piece[i] as usize) << 8 | piece[i + 1] as usize];
        }
        // The first merges join pairs of bytes: the lines of the pairs each such merge would
        // form with its neighbours are all requested now, to wait on memory together.
        for i in 0..n - 1 {
            let m = pairs[i].1;
            if m != u32::MAX {
                if i + 2 < n {
                    self.merges.prefetch(m, syms[i + 2]);
                }
                if i > 0 {
                    self.merges.prefetch(syms[i - 1], m);
                }
            }
        }
        while n > 1 {
            let mut best = (u32::MAX, 0);
            for (i, &(r, _)) in pairs[..n - 1].iter().enumerate() {
                if r < best.0 {
                    best = (r, i);
                }
            }
            if best.0 == u32::MAX {
                break;
            }
            let i = best.1;
            let merged = pairs[i].1;
            // The pairs the merged symbol forms, looked up before the arrays shift: the
            // shifting then runs while their lines come from memory.
            let left = if i > 0 { self.pair(syms[i - 1], merged).unwrap_or(NONE) } else { NONE };
            let right = if i + 2 < n { self.pair(merged, syms[i + 2]).unwrap_or(NONE) } else { NONE };
            syms[i] = merged;
            // Shift left by hand: short, and a memmove call would cost more.
            for k in i + 1..n - 1 {
                syms[k] = syms[k + 1];
                pairs[k - 1] = pairs[k];
            }
            n -= 1;
            if i > 0 {
                pairs[i - 1] = left;
            }
            if i + 1 < n {
                pairs[i] = right;
            }
        }
        out.extend_from_slice(&syms[..n]);
    }

    /// Long pieces: a heap of `rank << 32 | position` (lowest rank, then leftmost), O(n log n).
    /// A popped entry is stale unless the pair now starting at its position still has its
    /// rank: the pair at a position only changes when one of its symbols grows, and a rank
    /// belongs to one pair, so an unchanged rank means an unchanged pair.
    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        const NONE: u32 = u32::MAX;
        let mut sym: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut next: Vec<u32> = (1..=n as u32).collect();
        let mut prev: Vec<u32> = (0..n as u32).map(|i| i.wrapping_sub(1)).collect();
        // Rank and merged id of the pair starting at each symbol.
        let mut pair: Vec<(u32, u32)> = vec![(NONE, 0); n];
        let mut initial = Vec::with_capacity(n);
        for i in 0..n - 1 {
            let (r, new) = self.byte_pairs[(piece[i] as usize) << 8 | piece[i + 1] as usize];
            if r != NONE {
                pair[i] = (r, new);
                initial.push(Reverse(((r as u64) << 32) | i as u64));
            }
        }
        let mut heap = BinaryHeap::from(initial);
        let set_pair = |heap: &mut BinaryHeap<Reverse<u64>>, pair: &mut [(u32, u32)], p: usize, a: u32, b: u32| {
            pair[p] = match self.pair(a, b) {
                Some((r, new)) => {
                    heap.push(Reverse(((r as u64) << 32) | p as u64));
                    (r, new)
                }
                None => (NONE, 0),
            };
        };
        while let Some(Reverse(key)) = heap.pop() {
            let (r, p) = ((key >> 32) as u32, (key & 0xFFFF_FFFF) as usize);
            if pair[p].0 != r {
                continue;
            }
            // Merge the symbol at p with its right neighbour q.
            let q = next[p] as usize;
            sym[p] = pair[p].1;
            next[p] = next[q];
            pair[q] = (NONE, 0);
            let after = next[p] as usize;
            if after < n {
                prev[after] = p as u32;
                set_pair(&mut heap, &mut pair, p, sym[p], sym[after]);
            } else {
                pair[p] = (NONE, 0);
            }
            let l = prev[p];
            if l != NONE {
                set_pair(&mut heap, &mut pair, l as usize, sym[l as usize], sym[p]);
            }
        }
        let mut p = 0;
        while p < n {
            out.push(sym[p]);
            p = next[p] as usize;
        }
    }

    /// `merge_heap` for long pieces. It exists for memory: a hostile document line can be one
    /// pre-token of many MiB (one letter, digit or space repeated), and `merge_heap` keeps
    /// some 29 bytes per byte of it. Here the merge keeps one bit per byte (which offsets
    /// start a symbol) and the rank of the pair at each start (`PairRanks`): about 4.4 bytes
    /// per byte. The id of a symbol is that of its byte, or of its pair of bytes, or (3 bytes
    /// or more) is kept at its second offset, which starts no pair, marked by `HAS_ID`; so
    /// the ids are `merge_heap`'s, whatever the vocabulary.
    fn merge_compact(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        debug_assert!(n >= 2 && n < u32::MAX as usize && self.ids_fit);
        // Ranks are offsets in the merge list and merged ids are below 2^31 (`ids_fit`).
        const HAS_ID: u32 = 1 << 31;
        const NONE: u32 = u32::MAX;
        let mut starts = Starts::new(n);
        let id = |pairs: &PairRanks, s: usize, e: usize| -> u32 {
            match e - s {
                1 => self.byte_ids[piece[s] as usize],
                2 => self.byte_pairs[(piece[s] as usize) << 8 | piece[s + 1] as usize].1,
                _ => pairs.get(s + 1) & !HAS_ID,
            }
        };
        let byte_pair = |i: usize| Some(self.byte_pairs[(piece[i] as usize) << 8 | piece[i + 1] as usize].0).filter(|&r| r != u32::MAX);
        let mut pairs = PairRanks::new(n, HAS_ID, byte_pair);
        while let Some(s) = pairs.min() {
            // The pair at s joins the symbols s..m and m..e into `merged`.
            let m = starts.next(s);
            let e = starts.next(m);
            let Some((_, merged)) = self.pair(id(&pairs, s, m), id(&pairs, m, e)) else {
                pairs.set(s, NONE); // never: the rank at a start is its pair's
                continue;
            };
            starts.clear(m);
            pairs.set(m, NONE);
            if e - s >= 3 {
                pairs.set(s + 1, merged | HAS_ID);
            }
            let right = if e < n { self.pair(merged, id(&pairs, e, starts.next(e))) } else { None };
            pairs.set(s, right.map_or(NONE, |(r, _)| r));
            if s > 0 {
                let p = starts.prev(s);
                let left = self.pair(id(&pairs, p, s), merged);
                pairs.set(p, left.map_or(NONE, |(r, _)| r));
            }
        }
        out.reserve(starts.count() - 1);
        let mut s = 0;
        while s < n {
            let e = starts.next(s);
            out.push(id(&pairs, s, e));
            s = e;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::hf_json::Text;

    fn toy(merges: &[(&str, &str)]) -> MergeBpe {
        let alphabet = byte_level_alphabet();
        let text = |s: String| Text(s.into());
        let mut vocab = FxHashMap::default();
        for c in alphabet {
            let id = vocab.len() as u32;
            vocab.insert(text(c.to_string()), id);
        }
        for (a, b) in merges {
            let id = vocab.len() as u32;
            vocab.entry(text(format!("{a}{b}"))).or_insert(id);
        }
        let merges = merges.iter().map(|(a, b)| Merge(text(a.to_string()), text(b.to_string()))).collect();
        MergeBpe::from_model(&BpeModel { vocab, merges }, false).unwrap().0
    }

    /// `len` letters of "abc", pseudo-random from `seed`.
    fn random_abc(seed: &mut u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *seed = crate::hash::mix64(*seed + 1);
                b"abc"[(*seed % 3) as usize]
            })
            .collect()
    }

    #[test]
    fn heap_and_scan_agree() {
        // Overlapping merges with competing ranks, and two pairs giving the same string.
        let bpe = toy(&[("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc"), ("a", "a"), ("aa", "aa"), ("c", "a"), ("ca", "b")]);
        let mut seed = 3u64;
        for len in 2..=HEAP_THRESHOLD {
            let piece = random_abc(&mut seed, len);
            let (mut x, mut y, mut z) = (vec![], vec![], vec![]);
            bpe.merge_scan(&piece, &mut x);
            bpe.merge_heap(&piece, &mut y);
            bpe.merge_compact(&piece, &mut z);
            assert_eq!(x, y, "{}", String::from_utf8_lossy(&piece));
            assert_eq!(x, z, "{}", String::from_utf8_lossy(&piece));
        }
        for len in [100, 1000, 5000] {
            let piece = random_abc(&mut seed, len);
            let (mut y, mut z) = (vec![], vec![]);
            bpe.merge_heap(&piece, &mut y);
            bpe.merge_compact(&piece, &mut z);
            assert_eq!(y, z, "{}", String::from_utf8_lossy(&piece));
        }
    }

    /// The compact merge gives the heap merge's ids (and, where short enough, the scan's)
    /// with the merges of a real tokenizer.json.
    #[test]
    fn compact_equals_heap_with_real_merges() {
        let bpe = neox();
        assert!(bpe.ids_fit);
        for piece in crate::tokenize::bpe::tests::hard_pieces() {
            let (mut x, mut y, mut z) = (vec![7], vec![7], vec![7]);
            bpe.merge_heap(&piece, &mut x);
            bpe.merge_compact(&piece, &mut y);
            assert_eq!(x, y, "{:?}", String::from_utf8_lossy(&piece));
            if piece.len() <= HEAP_THRESHOLD {
                bpe.merge_scan(&piece, &mut z);
                assert_eq!(x, z, "{:?}", String::from_utf8_lossy(&piece));
            }
        }
        // Above the threshold `merge` takes the compact path.
        let piece: Vec<u8> = "ab 日本 1".bytes().cycle().take(COMPACT_THRESHOLD + 7).collect();
        let (mut x, mut y) = (vec![], vec![]);
        bpe.merge_heap(&piece, &mut x);
        bpe.merge(&piece, &mut y);
        assert_eq!(x, y);
    }

    #[test]
    fn lowest_rank_then_leftmost() {
        let bpe = toy(&[("a", "a"), ("b", "c")]);
        let mut out = vec![];
        bpe.encode_piece(b"aaabc", &mut out);
        // aa | a | bc: "aa" merges at the left first.
        let ids: Vec<u32> = out;
        assert_eq!(ids.len(), 3);
        assert_eq!(ids[1], bpe.byte_ids[b'a' as usize]);
    }

    /// The merges of tests/data/gpt-neox-20b.json.
    fn neox() -> MergeBpe {
        let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/gpt-neox-20b.json")).unwrap();
        let file: crate::tokenize::hf_json::TokenizerFile = serde_json::from_slice(&bytes).unwrap();
        MergeBpe::from_model(&BpeModel::parse(&file.model.unwrap()).unwrap(), false).unwrap().0
    }

    /// The pairs of single bytes made in one pass over the merges are those the pair table
    /// gives every pair: GPT-NeoX's, and merges where two bytes share an id and pairs repeat.
    #[test]
    fn byte_pairs_equal_the_pair_table() {
        let every_pair = |byte_ids: &[u32; 256], merges: &[[u32; 3]]| {
            let (table, _) = pair_table(merges);
            let mut pairs = vec![NO_PAIR; 256 * 256];
            for a in 0..256 {
                for b in 0..256 {
                    if byte_ids[a] != u32::MAX && byte_ids[b] != u32::MAX {
                        pairs[a * 256 + b] = table.get(byte_ids[a], byte_ids[b]).unwrap_or(NO_PAIR);
                    }
                }
            }
            pairs
        };
        let bpe = neox();
        let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/gpt-neox-20b.json")).unwrap();
        let file: crate::tokenize::hf_json::TokenizerFile = serde_json::from_slice(&bytes).unwrap();
        let (_, source) = MergeBpe::from_model(&BpeModel::parse(&file.model.unwrap()).unwrap(), false).unwrap();
        assert_eq!(*bpe.byte_pairs, every_pair(&bpe.byte_ids, &source.merges)[..]);
        let mut byte_ids = [u32::MAX; 256];
        byte_ids[b'a' as usize] = 1;
        byte_ids[b'b' as usize] = 1;
        byte_ids[b'c' as usize] = 2;
        let merges = [[1, 2, 10], [2, 1, 11], [1, 1, 12], [1, 2, 13], [10, 2, 14], [2, 9, 15]];
        let pairs = byte_pairs(&byte_ids, &merges);
        assert_eq!(*pairs, every_pair(&byte_ids, &merges)[..]);
        assert_eq!(pairs[b'b' as usize * 256 + b'c' as usize], (3, 13));
    }

    /// A short token met as a piece gives the ids of its merge, the first time (when it is
    /// merged and its `own` recorded) as after; GPT-NeoX has two that are not their own
    /// encoding.
    #[test]
    fn whole_tokens_learnt_as_met_equal_their_merge() {
        let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/gpt-neox-20b.json")).unwrap();
        let file: crate::tokenize::hf_json::TokenizerFile = serde_json::from_slice(&bytes).unwrap();
        let model = BpeModel::parse(&file.model.unwrap()).unwrap();
        let (bpe, _) = MergeBpe::from_model(&model, false).unwrap();
        let (bytes, ends) = token_bytes(&model.vocab, &byte_level_alphabet());
        let short: Vec<(&[u8], u32)> = decoded(&bytes, &ends).filter(|(b, _)| b.len() <= MAX_LEN).collect();
        let mut not_own = Vec::new();
        for pass in 0..2 {
            for &(piece, id) in &short {
                let (mut got, mut want) = (vec![7], vec![7]);
                bpe.encode_piece(piece, &mut got);
                bpe.merge(piece, &mut want);
                assert_eq!(got, want, "pass {pass}: {:?}", String::from_utf8_lossy(piece));
                if pass == 1 && want[1..] != [id] {
                    not_own.push(id);
                }
            }
        }
        let own = bpe.whole.own.as_ref().unwrap();
        assert!(short.iter().all(|&(_, id)| own[id as usize].load(Ordering::Relaxed) != UNKNOWN));
        assert_eq!((short.len(), not_own.len()), (49_912, 2));
        assert!(not_own.iter().all(|&id| own[id as usize].load(Ordering::Relaxed) == NOT_OWN));
    }

    /// Run in release: `cargo test --release -p tokshuf-core --lib measure_long_hf_merges -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn measure_long_hf_merges() {
        let bpe = neox();
        crate::tokenize::bpe::tests::measure("tokenize::hfbpe::tests::measure_long_hf_merges", |variant, piece, out| match variant {
            "linked" => bpe.merge_heap(piece, out),
            _ => bpe.merge_compact(piece, out),
        });
    }
}
