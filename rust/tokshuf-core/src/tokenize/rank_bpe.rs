//! Byte-level BPE by ranks, as tiktoken merges: the adjacent pair whose bytes together are
//! the token of lowest rank is merged, leftmost first, and a piece that is itself a token is
//! that token. The ids of tiktoken's tokens are their ranks.
//!
//! The rank of a pair is looked up by the bytes its two symbols span, in the table of whole
//! tokens that a piece's own lookup reads anyway (`token_table.rs`: one cache line a lookup,
//! the key one masked load from the piece), so loading builds that table and nothing else.
//! The first version listed every split of every token into two tokens as a pair of ids:
//! 2.9 M lookups to load o200k, and a second table as large as the first for merges to read.

use rustc_hash::FxHashMap;

use crate::tokenize::bpe::{merge_heap, TokenList};
use crate::tokenize::token_table::{pack, pack_at, TokenTable, MAX_LEN};

const NONE: u32 = u32::MAX;
/// Above this many bytes a piece is merged with the heap instead of the quadratic scan.
const HEAP_THRESHOLD: usize = 64;

pub struct RankBpe {
    /// Tokens of up to `MAX_LEN` bytes, and the longer ones.
    short: TokenTable,
    long: FxHashMap<Box<[u8]>, u32>,
    byte_ids: [u32; 256],
    /// The rank of each two-byte token by its bytes (`NONE`: not a token): the first round
    /// of every merge without a lookup.
    byte_pairs: Box<[u32]>,
}

impl RankBpe {
    /// The merge of a tiktoken encoding's ranks; `Err` names a single byte it lacks. A later
    /// line for the same bytes wins, as in tiktoken's dict.
    pub fn new(list: &TokenList) -> Result<RankBpe, String> {
        let short = TokenTable::build(list.iter().filter(|(b, _)| (1..=MAX_LEN).contains(&b.len())));
        let long = list.iter().filter(|(b, _)| b.len() > MAX_LEN).map(|(b, rank)| (b.into(), rank)).collect();
        let mut byte_ids = [NONE; 256];
        let mut byte_pairs = vec![NONE; 1 << 16].into_boxed_slice();
        for (bytes, rank) in list.iter() {
            match *bytes {
                [b] => byte_ids[b as usize] = rank,
                [a, b] => byte_pairs[(a as usize) << 8 | b as usize] = rank,
                _ => {}
            }
        }
        if let Some(b) = byte_ids.iter().position(|&id| id == NONE) {
            return Err(format!("vocabulary lacks the single byte {b:#04x}"));
        }
        Ok(RankBpe { short, long, byte_ids, byte_pairs })
    }

    /// The tokens of up to `MAX_LEN` bytes, where `encode_piece` looks first.
    pub fn short_tokens(&self) -> &TokenTable {
        &self.short
    }

    #[inline(always)]
    fn rank(&self, bytes: &[u8]) -> Option<u32> {
        if bytes.len() <= MAX_LEN {
            self.short.get(pack(bytes))
        } else {
            self.long.get(bytes).copied()
        }
    }

    /// Append the ids of one pre-token.
    pub fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        match piece.len() {
            0 => {}
            1 => out.push(self.byte_ids[piece[0] as usize]),
            n => {
                if let Some(rank) = self.rank(piece) {
                    out.push(rank);
                } else if n <= HEAP_THRESHOLD {
                    self.merge_scan(piece, out);
                } else {
                    merge_heap(piece, &self.byte_ids, |b| self.rank(b), out);
                }
            }
        }
    }

    /// Ask for the line holding the rank of `buf[s..e]`, if short.
    #[inline(always)]
    fn prefetch_span(&self, buf: &[u8], s: usize, e: usize) {
        if e - s <= MAX_LEN {
            self.short.prefetch(pack_at(buf, s, e - s));
        }
    }

    /// The rank of `buf[s..e]` (`NONE`: not a token), `buf` holding 16 readable bytes from `s`.
    #[inline(always)]
    fn span_rank(&self, buf: &[u8], s: usize, e: usize) -> u32 {
        let rank = if e - s <= MAX_LEN { self.short.get(pack_at(buf, s, e - s)) } else { self.long.get(&buf[s..e]).copied() };
        rank.unwrap_or(NONE)
    }

    /// Short pieces: rescan the pair ranks for the minimum after every merge (on the stack:
    /// no allocation).
    fn merge_scan(&self, piece: &[u8], out: &mut Vec<u32>) {
        let len = piece.len();
        debug_assert!((2..=HEAP_THRESHOLD).contains(&len));
        // The piece, with 16 readable bytes from any offset for `pack_at`.
        let mut buf = [0u8; HEAP_THRESHOLD + 16];
        buf[..len].copy_from_slice(piece);
        // Symbol i spans start[i]..start[i + 1] and is token ids[i]; ranks[i] is the rank of
        // symbols i and i + 1 together.
        let mut start = [0usize; HEAP_THRESHOLD + 1];
        let mut ids = [0u32; HEAP_THRESHOLD];
        let mut ranks = [NONE; HEAP_THRESHOLD];
        for (i, &b) in piece.iter().enumerate() {
            start[i] = i;
            ids[i] = self.byte_ids[b as usize];
        }
        start[len] = len;
        for i in 0..len - 1 {
            ranks[i] = self.byte_pairs[(piece[i] as usize) << 8 | piece[i + 1] as usize];
        }
        // The first merges join pairs of bytes, so most lookups that follow are of spans of
        // 3 to 6 bytes: their lines are all requested now, to wait on memory together
        // rather than once per merge (merging was 40 % of a cold memo's time, most of it
        // waiting; spans of 3 and 4 made it about a third faster, 5 and 6 another 1.5-3.5 %
        // for cl100k and o200k, 7 and 8 nothing more).
        for i in 0..len - 2 {
            for e in i + 3..(i + 7).min(len + 1) {
                self.prefetch_span(&buf, i, e);
            }
        }
        let mut n = len;
        while n > 1 {
            let mut best = (NONE, 0);
            for (i, &r) in ranks[..n - 1].iter().enumerate() {
                if r < best.0 {
                    best = (r, i);
                }
            }
            let (rank, i) = best;
            if rank == NONE {
                break;
            }
            // The ranks of the two pairs the merged symbol forms, looked up before the arrays
            // shift: the shifting then runs while their lines come from memory.
            let left = if i > 0 { self.span_rank(&buf, start[i - 1], start[i + 2]) } else { NONE };
            let right = if i + 2 < n { self.span_rank(&buf, start[i], start[i + 3]) } else { NONE };
            ids[i] = rank;
            // Shift left by hand: short, and a memmove call would cost more.
            for k in i + 1..n - 1 {
                start[k] = start[k + 1];
                ids[k] = ids[k + 1];
                ranks[k - 1] = ranks[k];
            }
            start[n - 1] = start[n];
            n -= 1;
            if i > 0 {
                ranks[i - 1] = left;
            }
            if i + 1 < n {
                ranks[i] = right;
            }
        }
        out.extend_from_slice(&ids[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::bpe::{merge_compact, merge_linked, parse_embedded, ranks_of, BytePairEncoder};

    /// Every byte, then `tokens` ranked in order after them, as `build.rs` embeds a list.
    fn token_list(tokens: &[&str]) -> TokenList {
        let mut data: Vec<u8> = (0..=255u8).flat_map(|b| [1, b]).collect();
        for t in tokens {
            data.push(t.len() as u8);
            data.extend_from_slice(t.as_bytes());
        }
        parse_embedded(&data)
    }

    /// Same ids as the reference merge of `bpe.rs` on pieces of every length, through the
    /// scan and the heap, with tokens longer than the short table holds and with pairs
    /// that two splits form.
    #[test]
    fn equals_the_reference_merge() {
        let tokens = [
            "ab",
            "bc",
            "abc",
            "aa",
            "aaaa",
            "ca",
            "bcab",
            "cab",
            "abca",
            "aaaaaaaa",
            "aaaaaaaaaaaaaaaa",
            "abcabcabcabcabcab",
            "cabcabcabcabcabca",
        ];
        let list = token_list(&tokens);
        let reference = BytePairEncoder::new(ranks_of(&list)).unwrap();
        let bpe = RankBpe::new(&list).unwrap();
        let mut seed = 5u64;
        for len in 1..300 {
            for alphabet in [&b"abc"[..], b"aab", b"a"] {
                let piece: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = crate::hash::mix64(seed + 1);
                        alphabet[(seed % alphabet.len() as u64) as usize]
                    })
                    .collect();
                let (mut x, mut y) = (vec![7], vec![7]);
                bpe.encode_piece(&piece, &mut x);
                reference.encode_piece(&piece, &mut y);
                assert_eq!(x, y, "{}", String::from_utf8_lossy(&piece));
            }
        }
    }

    #[test]
    fn a_missing_byte_is_an_error() {
        let list = parse_embedded(&[1, b'a']);
        assert_eq!(RankBpe::new(&list).err().unwrap(), "vocabulary lacks the single byte 0x00");
    }

    /// Run in release: `cargo test --release -p tokshuf-core --lib measure_long_rank_merges -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn measure_long_rank_merges() {
        let bpe = RankBpe::new(&parse_embedded(include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.tokens")))).unwrap();
        crate::tokenize::bpe::tests::measure("tokenize::rank_bpe::tests::measure_long_rank_merges", |variant, piece, out| match variant {
            "linked" => merge_linked(piece, &bpe.byte_ids, |b| bpe.rank(b), out),
            _ => merge_compact(piece, &bpe.byte_ids, |b| bpe.rank(b), out),
        });
    }
}
