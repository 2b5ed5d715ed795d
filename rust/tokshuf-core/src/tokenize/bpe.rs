//! Byte-level BPE for the tiktoken encodings, written here instead of taken from tiktoken-rs
//! because its merge is quadratic in the piece length (a 1 MB run of one character never
//! finishes). Short pieces use tiktoken's own scan (fastest for the usual 2-10 bytes); long
//! pieces use a heap of candidate pairs with lazy invalidation: O(n log n), same ids, because
//! both always merge the lowest-ranked adjacent pair, leftmost first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};

pub type Ranks = FxHashMap<Vec<u8>, u32>;

/// The tokens of a `.tiktoken` file in one buffer (no allocation per token): token `i` is
/// `bytes[spans[i].0..spans[i].1]` with rank `spans[i].2`.
pub struct TokenList {
    bytes: Vec<u8>,
    spans: Vec<(u32, u32, u32)>,
}

impl TokenList {
    /// (bytes, rank) of every token, in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], u32)> + Clone + '_ {
        self.spans.iter().map(|&(a, b, r)| (&self.bytes[a as usize..b as usize], r))
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn max_rank(&self) -> Option<u32> {
        self.spans.iter().map(|s| s.2).max()
    }
}

/// Parse a `.tiktoken` file: one `base64(token) rank` per line. Bytes, not `str` methods: a
/// char search per line was a tenth of loading an encoding.
pub fn parse_token_list(data: &[u8]) -> Result<TokenList> {
    let lines = memchr::memchr_iter(b'\n', data).count() + 1;
    let mut list = TokenList { bytes: Vec::with_capacity(data.len() * 3 / 4), spans: Vec::with_capacity(lines) };
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let bad = || Error::Tokenizer(format!("tiktoken file line {}: expected 'BASE64 RANK'", i + 1));
        let space = line.iter().position(|&b| b == b' ').ok_or_else(bad)?;
        let rank = parse_rank(line[space + 1..].trim_ascii()).ok_or_else(bad)?;
        let start = list.bytes.len();
        base64_decode_into(&line[..space], &mut list.bytes).ok_or_else(bad)?;
        let end = list.bytes.len();
        let span = (u32::try_from(start).map_err(|_| bad())?, u32::try_from(end).map_err(|_| bad())?, rank);
        list.spans.push(span);
    }
    Ok(list)
}

/// The rank of every token (a later line for the same bytes wins, as in tiktoken's dict).
pub fn ranks_of(list: &TokenList) -> Ranks {
    let mut ranks = Ranks::default();
    ranks.reserve(list.spans.len());
    for (tok, rank) in list.iter() {
        ranks.insert(tok.to_vec(), rank);
    }
    ranks
}

#[cfg(test)]
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    base64_decode_into(s.as_bytes(), &mut out)?;
    Some(out)
}

/// Decimal digits, nothing else.
fn parse_rank(s: &[u8]) -> Option<u32> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u32, |n, &c| if c.is_ascii_digit() { n.checked_mul(10)?.checked_add((c - b'0') as u32) } else { None })
}

/// The value of each base64 digit; 0xFF: not one.
const BASE64: [u8; 256] = {
    let digits = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut t = [0xFF; 256];
    let mut i = 0;
    while i < 64 {
        t[digits[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Append the bytes of base64 `s` to `out`.
fn base64_decode_into(s: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let s = &s[..s.iter().rposition(|&c| c != b'=').map_or(0, |i| i + 1)];
    for chunk in s.chunks(4) {
        let (mut acc, mut any_bad) = (0u32, 0u8);
        for (i, &c) in chunk.iter().enumerate() {
            let v = BASE64[c as usize];
            any_bad |= v;
            acc |= (v as u32) << (18 - 6 * i);
        }
        if any_bad >= 64 {
            return None;
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(())
}

/// Decompress embedded gzip data, in one call into a buffer of the size its trailer gives.
pub fn gunzip(data: &[u8]) -> Result<Vec<u8>> {
    let damaged = |e: &dyn std::fmt::Display| Error::Tokenizer(format!("embedded tokenizer data is damaged: {e}"));
    let size = match data.len().checked_sub(4) {
        Some(at) => u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize,
        None => return Err(damaged(&"too short")),
    };
    let mut out = vec![0; size];
    let n = libdeflater::Decompressor::new().gzip_decompress(data, &mut out).map_err(|e| damaged(&e))?;
    out.truncate(n);
    Ok(out)
}

/// Above this many bytes a piece is merged with the heap instead of the quadratic scan.
const HEAP_THRESHOLD: usize = 256;

pub struct BytePairEncoder {
    ranks: Ranks,
    byte_ranks: [u32; 256],
}

impl BytePairEncoder {
    pub fn new(ranks: Ranks) -> Result<Self> {
        let mut byte_ranks = [0u32; 256];
        for b in 0..=255u8 {
            byte_ranks[b as usize] =
                *ranks.get(&[b][..]).ok_or_else(|| Error::Tokenizer(format!("vocabulary lacks the single byte {b:#04x}")))?;
        }
        Ok(BytePairEncoder { ranks, byte_ranks })
    }

    pub fn ranks(&self) -> &Ranks {
        &self.ranks
    }

    #[inline]
    fn rank(&self, bytes: &[u8]) -> Option<u32> {
        self.ranks.get(bytes).copied()
    }

    #[inline]
    fn token(&self, bytes: &[u8]) -> u32 {
        // Every merged symbol is a key of `ranks`; single bytes are always present (checked in new).
        match bytes.len() {
            1 => self.byte_ranks[bytes[0] as usize],
            _ => self.rank(bytes).unwrap_or(u32::MAX),
        }
    }

    /// Append the ids of one pre-tokenized piece.
    pub fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if let Some(r) = self.rank(piece) {
            out.push(r);
        } else if piece.len() <= HEAP_THRESHOLD {
            self.merge_scan(piece, out);
        } else {
            self.merge_heap(piece, out);
        }
    }

    /// tiktoken's algorithm: `parts[i]` = (start, rank of the pair starting there).
    fn merge_scan(&self, piece: &[u8], out: &mut Vec<u32>) {
        let pair_rank = |parts: &[(usize, u32)], i: usize| -> u32 {
            if i + 3 < parts.len() {
                self.rank(&piece[parts[i].0..parts[i + 3].0]).unwrap_or(u32::MAX)
            } else {
                u32::MAX
            }
        };
        let mut parts: Vec<(usize, u32)> = Vec::with_capacity(piece.len() + 1);
        for i in 0..piece.len() - 1 {
            parts.push((i, self.rank(&piece[i..i + 2]).unwrap_or(u32::MAX)));
        }
        parts.push((piece.len() - 1, u32::MAX));
        parts.push((piece.len(), u32::MAX));
        loop {
            let mut min = (u32::MAX, usize::MAX);
            for (i, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
                if r < min.0 {
                    min = (r, i);
                }
            }
            if min.0 == u32::MAX {
                break;
            }
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = pair_rank(&parts, i - 1);
            }
            parts[i].1 = pair_rank(&parts, i);
            parts.remove(i + 1);
        }
        for w in parts.windows(2) {
            out.push(self.token(&piece[w[0].0..w[1].0]));
        }
    }

    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        merge_heap(piece, &self.byte_ranks, |bytes| self.rank(bytes), out);
    }
}

/// tiktoken's merge (lowest rank of the merged bytes, leftmost first) in O(n log n), for
/// any table of ranks: `rank` of a byte string that is a token, `byte_ids` of each byte
/// (the ids of tiktoken's tokens are their ranks). Symbols form a linked list over byte
/// offsets, candidate pairs sit in a min-heap keyed by `rank << 32 | start` (so the lowest
/// rank wins, leftmost first), and a popped candidate is stale unless `pair_rank[start]`
/// still holds its rank. That check is exact: the pair starting at a symbol only ever
/// grows, and a rank names one byte string, so a rank seen again means the same pair. One
/// `u64` per entry keeps the heap small; on a 1 MB piece the heap, not the lookups, is the
/// cost, and its cache misses grow with its size.
pub(crate) fn merge_heap(piece: &[u8], byte_ids: &[u32; 256], rank: impl Fn(&[u8]) -> Option<u32>, out: &mut Vec<u32>) {
    let n = piece.len();
    debug_assert!(n < u32::MAX as usize); // pieces come from one document line
    const NONE: u32 = u32::MAX;
    let mut next: Vec<u32> = (1..=n as u32).collect();
    let mut prev: Vec<u32> = (0..n as u32).map(|i| if i == 0 { NONE } else { i - 1 }).collect();
    // The id of the symbol starting at each offset, and the rank of the pair starting there.
    let mut sym: Vec<u32> = piece.iter().map(|&b| byte_ids[b as usize]).collect();
    let mut pair_rank: Vec<u32> = vec![NONE; n];
    let mut initial = Vec::with_capacity(n);
    for i in 0..n.saturating_sub(1) {
        if let Some(r) = rank(&piece[i..i + 2]) {
            pair_rank[i] = r;
            initial.push(Reverse(((r as u64) << 32) | i as u64));
        }
    }
    let mut heap = BinaryHeap::from(initial);
    while let Some(Reverse(key)) = heap.pop() {
        let (r, s) = ((key >> 32) as u32, (key & 0xFFFF_FFFF) as usize);
        if pair_rank[s] != r {
            continue;
        }
        // Merge the symbol at s with its right neighbour [m, e).
        let m = next[s] as usize;
        let e = next[m] as usize;
        next[s] = e as u32;
        sym[s] = r;
        pair_rank[m] = NONE;
        pair_rank[s] = NONE;
        if e < n {
            prev[e] = s as u32;
            if let Some(r) = rank(&piece[s..next[e] as usize]) {
                pair_rank[s] = r;
                heap.push(Reverse(((r as u64) << 32) | s as u64));
            }
        }
        let p = prev[s];
        if p != NONE {
            let p = p as usize;
            pair_rank[p] = NONE;
            if let Some(r) = rank(&piece[p..e]) {
                pair_rank[p] = r;
                heap.push(Reverse(((r as u64) << 32) | p as u64));
            }
        }
    }
    let mut s = 0;
    while s < n {
        out.push(sym[s]);
        s = next[s] as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_roundtrip() {
        assert_eq!(base64_decode("IQ==").unwrap(), b"!");
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs").unwrap(), b"hel");
        assert_eq!(base64_decode("a-Vs"), None);
    }

    #[test]
    fn token_list_lines() {
        let list = parse_token_list(b"IQ== 5\r\naGVs 7 \n\n").unwrap();
        assert_eq!(list.iter().collect::<Vec<_>>(), [(&b"!"[..], 5), (&b"hel"[..], 7)]);
        for bad in [&b"IQ== x\n"[..], b"IQ==5\n", b"IQ== 4294967296\n", b"I*== 1\n", b"IQ== \n"] {
            let e = parse_token_list(bad).err().unwrap().to_string();
            assert!(e.contains("line 1: expected 'BASE64 RANK'"), "{e}");
        }
    }

    #[test]
    fn heap_and_scan_agree() {
        let mut ranks = Ranks::default();
        for b in 0..=255u8 {
            ranks.insert(vec![b], b as u32);
        }
        for (i, t) in ["ab", "bc", "abc", "aa", "aaaa", "ca", "bcab"].iter().enumerate() {
            ranks.insert(t.as_bytes().to_vec(), 256 + i as u32);
        }
        let enc = BytePairEncoder::new(ranks).unwrap();
        let mut seed = 1u64;
        for len in 2..300 {
            let piece: Vec<u8> = (0..len)
                .map(|_| {
                    seed = crate::hash::mix64(seed + 1);
                    b"abc"[(seed % 3) as usize]
                })
                .collect();
            let (mut a, mut b) = (vec![], vec![]);
            enc.merge_scan(&piece, &mut a);
            enc.merge_heap(&piece, &mut b);
            assert_eq!(a, b, "{}", String::from_utf8_lossy(&piece));
        }
    }
}
