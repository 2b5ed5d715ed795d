//! Byte-level BPE for the tiktoken encodings, written here instead of taken from tiktoken-rs
//! because its merge is quadratic in the piece length (a 1 MB run of one character never
//! finishes). Short pieces use tiktoken's own scan (fastest for the usual 2-10 bytes); long
//! pieces use a heap of candidate pairs with lazy invalidation (over 64 KiB, a tournament of
//! the pairs' ranks, for memory): O(n log n), same ids, because all always merge the
//! lowest-ranked adjacent pair, leftmost first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::tokenize::pair_ranks::PairRanks;

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

/// The tokens `build.rs` embeds: each rank's token as a length byte and its bytes, a zero
/// length for a rank without a token.
pub fn parse_embedded(data: &[u8]) -> TokenList {
    let mut list = TokenList { bytes: Vec::with_capacity(data.len()), spans: Vec::new() };
    let (mut at, mut rank) = (0, 0u32);
    while let Some(&n) = data.get(at) {
        let Some(token) = data.get(at + 1..at + 1 + n as usize) else { break };
        if n > 0 {
            let start = list.bytes.len() as u32;
            list.bytes.extend_from_slice(token);
            list.spans.push((start, start + n as u32, rank));
        }
        at += 1 + n as usize;
        rank += 1;
    }
    list
}

/// `list` as a `.tiktoken` file: `base64(token) rank` a line, in list order.
pub fn tiktoken_text(list: &TokenList) -> Vec<u8> {
    const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(list.bytes.len() * 2);
    for (token, rank) in list.iter() {
        for chunk in token.chunks(3) {
            let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &b)| acc | (b as u32) << (16 - 8 * i));
            for k in 0..4 {
                out.push(if k <= chunk.len() { DIGITS[(n >> (18 - 6 * k)) as usize & 63] } else { b'=' });
            }
        }
        out.push(b' ');
        out.extend_from_slice(rank.to_string().as_bytes());
        out.push(b'\n');
    }
    out
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
/// (the ids of tiktoken's tokens are their ranks). Candidate pairs sit in a min-heap keyed
/// by `rank << 32 | start` (so the lowest rank wins, leftmost first). One `u64` per entry
/// keeps the heap small; on a 1 MB piece the heap, not the lookups, is the cost, and its
/// cache misses grow with its size.
pub(crate) fn merge_heap(piece: &[u8], byte_ids: &[u32; 256], rank: impl Fn(&[u8]) -> Option<u32>, out: &mut Vec<u32>) {
    if piece.len() > COMPACT_THRESHOLD {
        merge_compact(piece, byte_ids, rank, out);
    } else {
        merge_linked(piece, byte_ids, rank, out);
    }
}

/// Above this many bytes a piece is merged by `merge_compact` (and its twin in `hfbpe.rs`).
pub(crate) const COMPACT_THRESHOLD: usize = 1 << 16;

/// `merge_heap` with symbols in a linked list over byte offsets; a popped candidate is stale
/// unless `pair_rank[start]` still holds its rank. That check is exact: the pair starting
/// at a symbol only ever grows, and a rank names one byte string, so a rank seen again
/// means the same pair. Some 25 bytes of memory per byte of the piece at peak.
pub(crate) fn merge_linked(piece: &[u8], byte_ids: &[u32; 256], rank: impl Fn(&[u8]) -> Option<u32>, out: &mut Vec<u32>) {
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

/// `merge_heap` for long pieces. It exists for memory: a hostile document line can be one
/// pre-token of many MiB (one letter, digit or space repeated), and `merge_linked` keeps some
/// 25 bytes per byte of it. Here the merge keeps one bit per byte (which offsets start a
/// symbol) and the rank of the pair at each start (`PairRanks`): about 4.4 bytes per byte.
/// Every symbol is a token, so the symbols beside an offset are a few words of bits away,
/// and the ids at the end are the ranks of each symbol's bytes (what `merge_linked` keeps
/// in `sym`), so the ids are the same. Ranks must be below `u32::MAX` (none).
pub(crate) fn merge_compact(piece: &[u8], byte_ids: &[u32; 256], rank: impl Fn(&[u8]) -> Option<u32>, out: &mut Vec<u32>) {
    let n = piece.len();
    debug_assert!(n >= 2 && n < u32::MAX as usize);
    const NONE: u32 = u32::MAX;
    let mut starts = Starts::new(n);
    let mut pairs = PairRanks::new(n, NONE, |i| rank(&piece[i..i + 2]));
    while let Some(s) = pairs.min() {
        // The pair at s joins the symbols s..m and m..e.
        let m = starts.next(s);
        let e = starts.next(m);
        starts.clear(m);
        pairs.set(m, NONE);
        let right = if e < n { rank(&piece[s..starts.next(e)]) } else { None };
        pairs.set(s, right.unwrap_or(NONE));
        if s > 0 {
            let p = starts.prev(s);
            pairs.set(p, rank(&piece[p..e]).unwrap_or(NONE));
        }
    }
    drop(pairs);
    out.reserve(starts.count() - 1);
    let mut s = 0;
    while s < n {
        let e = starts.next(s);
        out.push(if e - s == 1 { byte_ids[piece[s] as usize] } else { rank(&piece[s..e]).unwrap_or(u32::MAX) });
        s = e;
    }
}

/// The offsets of a piece of `n` bytes that start a symbol, one bit each, and `n` itself.
pub(crate) struct Starts(Vec<u64>);

impl Starts {
    /// Every offset a start (single bytes).
    pub(crate) fn new(n: usize) -> Starts {
        let mut words = vec![u64::MAX; n / 64 + 1];
        let last = n % 64;
        if last < 63 {
            words[n / 64] = (1u64 << (last + 1)) - 1;
        }
        Starts(words)
    }

    #[inline(always)]
    pub(crate) fn clear(&mut self, i: usize) {
        self.0[i >> 6] &= !(1u64 << (i & 63));
    }

    /// The first start after `i` (`i` below `n`).
    #[inline(always)]
    pub(crate) fn next(&self, i: usize) -> usize {
        let mut w = i >> 6;
        let mut bits = self.0[w] & (!1u64 << (i & 63));
        while bits == 0 {
            w += 1;
            bits = self.0[w];
        }
        w * 64 + bits.trailing_zeros() as usize
    }

    /// The last start before `i` (`i` above 0).
    #[inline(always)]
    pub(crate) fn prev(&self, i: usize) -> usize {
        let mut w = i >> 6;
        let mut bits = self.0[w] & ((1u64 << (i & 63)) - 1);
        while bits == 0 {
            w -= 1;
            bits = self.0[w];
        }
        w * 64 + 63 - bits.leading_zeros() as usize
    }

    /// The number of starts, `n` included.
    pub(crate) fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn embedded_tokens_and_their_text() {
        // Ranks 0 and 2: "!" and "hel"; rank 1 has no token.
        let list = parse_embedded(&[1, b'!', 0, 3, b'h', b'e', b'l']);
        assert_eq!(list.iter().collect::<Vec<_>>(), [(&b"!"[..], 0), (&b"hel"[..], 2)]);
        assert_eq!(tiktoken_text(&list), b"IQ== 0\naGVs 2\n");
        // A truncated last token is left out rather than read past the end.
        assert_eq!(parse_embedded(&[1, b'!', 4, b'a']).len(), 1);
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
            let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
            enc.merge_scan(&piece, &mut a);
            merge_linked(&piece, &enc.byte_ranks, |b| enc.rank(b), &mut b);
            merge_compact(&piece, &enc.byte_ranks, |b| enc.rank(b), &mut c);
            assert_eq!(a, b, "{}", String::from_utf8_lossy(&piece));
            assert_eq!(a, c, "{}", String::from_utf8_lossy(&piece));
        }
    }

    /// Pieces where a merge's bookkeeping can slip: runs of one byte of every length up to
    /// 200 and some longer, repeated patterns (multi-byte characters too) cut at every
    /// offset, random bytes, random text from small alphabets.
    pub(crate) fn hard_pieces() -> Vec<Vec<u8>> {
        let mut pieces = Vec::new();
        for b in [b'a', b'1', b' ', b'\n', b'z', 0xE2] {
            for len in (2..=200).chain([255, 256, 257, 1000, 4099]) {
                pieces.push(vec![b; len]);
            }
        }
        for pat in ["ab", "abc", "ab ", "aab", "é", "日本", "🙂", " \n", "12"] {
            for len in (2..=40).chain([511, 2048, 3001]) {
                pieces.push(pat.bytes().cycle().take(len).collect());
            }
        }
        let mut seed = 11u64;
        let mut random = |alphabet: &[u8], len: usize| -> Vec<u8> {
            (0..len)
                .map(|_| {
                    seed = crate::hash::mix64(seed + 1);
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect()
        };
        let bytes: Vec<u8> = (0..=255).collect();
        for len in [2, 3, 17, 300, 2000] {
            pieces.push(random(&bytes, len));
            pieces.push(random(b"abcdefghijklmnopqrstuvwxyz", len));
            pieces.push(random(b"ab c\n", len));
            pieces.push(random(b"aaab", len));
            pieces.push(random(b" \n", len));
        }
        pieces
    }

    /// The compact merge gives the linked merge's ids (and, where short enough, the scan's)
    /// with the ranks of two tiktoken encodings.
    #[test]
    fn compact_equals_linked_with_real_ranks() {
        for data in [
            &include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.tokens"))[..],
            &include_bytes!(concat!(env!("OUT_DIR"), "/r50k_base.tokens"))[..],
        ] {
            let enc = BytePairEncoder::new(ranks_of(&parse_embedded(data))).unwrap();
            for piece in hard_pieces() {
                let (mut a, mut b, mut c) = (vec![7], vec![7], vec![7]);
                merge_linked(&piece, &enc.byte_ranks, |b| enc.rank(b), &mut a);
                merge_compact(&piece, &enc.byte_ranks, |b| enc.rank(b), &mut b);
                assert_eq!(a, b, "{:?}", String::from_utf8_lossy(&piece));
                if piece.len() <= 300 {
                    enc.merge_scan(&piece, &mut c);
                    assert_eq!(a, c, "{:?}", String::from_utf8_lossy(&piece));
                }
            }
        }
    }

    #[test]
    fn starts_find_their_neighbours() {
        for n in [1, 62, 63, 64, 65, 200] {
            let mut starts = Starts::new(n);
            assert_eq!(starts.count(), n + 1);
            // Keep the offsets that are multiples of 3 (and n).
            for i in (0..n).filter(|i| i % 3 != 0) {
                starts.clear(i);
            }
            let kept: Vec<usize> = (0..n).filter(|i| i % 3 == 0).chain([n]).collect();
            assert_eq!(starts.count(), kept.len());
            for i in 0..n {
                assert_eq!(starts.next(i), *kept.iter().find(|&&k| k > i).unwrap(), "{n} {i}");
                if i > 0 {
                    assert_eq!(starts.prev(i), *kept.iter().rev().find(|&&k| k < i).unwrap(), "{n} {i}");
                }
            }
        }
    }

    /// A line of /proc/self/status, in bytes.
    fn status_bytes(field: &str) -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
    }

    /// Time and peak memory of `merge(variant, piece, out)` (variant "linked" or "compact") on
    /// pieces of 16 MiB and 1 MiB of 'a', ' ', '1' and random lowercase letters, each case in
    /// a fresh process: the test binary runs `test` again with `MERGE_CASE` set. Peak is the
    /// rise of VmHWM over VmRSS just before the merge (the peak reset through clear_refs).
    pub(crate) fn measure(test: &str, merge: impl Fn(&str, &[u8], &mut Vec<u32>)) {
        let Ok(case) = std::env::var("MERGE_CASE") else {
            for mib in [16, 1] {
                for kind in ["a", "space", "1", "lower"] {
                    for variant in ["linked", "compact"] {
                        let run = std::process::Command::new(std::env::current_exe().unwrap())
                            .args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
                            .env("MERGE_CASE", format!("{variant}:{kind}:{mib}"))
                            .output()
                            .unwrap();
                        let text = String::from_utf8_lossy(&run.stdout);
                        text.lines().filter_map(|l| l.find("RESULT").map(|at| &l[at..])).for_each(|l| println!("{l}"));
                        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
                    }
                }
            }
            return;
        };
        let parts: Vec<&str> = case.split(':').collect();
        let (variant, kind, mib) = (parts[0], parts[1], parts[2].parse::<usize>().unwrap());
        let n = mib << 20;
        let mut seed = 1u64;
        let piece: Vec<u8> = match kind {
            "a" => vec![b'a'; n],
            "space" => vec![b' '; n],
            "1" => vec![b'1'; n],
            _ => (0..n)
                .map(|_| {
                    seed = crate::hash::mix64(seed + 1);
                    b'a' + (seed % 26) as u8
                })
                .collect(),
        };
        let reps = if mib >= 16 { 1 } else { 3 };
        let (mut best, mut peak, mut ids) = (f64::MAX, 0, 0);
        for _ in 0..reps {
            let mut out = Vec::new();
            std::fs::write("/proc/self/clear_refs", "5").unwrap();
            let before = status_bytes("VmRSS");
            let t = std::time::Instant::now();
            merge(variant, &piece, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
            peak = peak.max(status_bytes("VmHWM").saturating_sub(before));
            ids = out.len();
        }
        println!(
            "RESULT {mib:>2} MiB {kind:<5} {variant:<7}: {best:7.3} s, peak +{:6.1} MiB = {:5.2} bytes/byte, {ids} ids",
            peak as f64 / (1 << 20) as f64,
            peak as f64 / n as f64
        );
    }
}
