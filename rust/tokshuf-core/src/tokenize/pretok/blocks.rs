//! GPT-2's pre-tokens over plain ASCII, 64 bytes at a time: where pieces start is found with
//! bit operations on one mask per character class, instead of a branch per piece (the shape of
//! gigatoken's scanners, issue 16).
//!
//! Over ASCII without `'` the GPT-2 pattern (`'s|'t|… | ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
//! \s+(?!\S)|\s+`) has no contraction to try, and a piece's start depends only on the bytes just
//! before and after it. Taking W for `\s`, and a class among letters, digits and the rest for
//! any other byte, byte `j` (after a known start) starts a piece when
//! - it is not W, its class differs from byte `j - 1`'s, and byte `j - 1` is not a space (a
//!   run of letters, digits or the rest; a space before it starts the piece instead);
//! - it is a space and byte `j + 1` is not W (` ?X+` takes it: a run of whitespace gives up its
//!   last space to what follows);
//! - it is W other than a space, byte `j - 1` is W and byte `j + 1` is not (`\s+(?!\S)` ends one
//!   before it, and `\s+` takes it alone);
//! - it is W and byte `j - 1` is not (a run of whitespace starts).
//!
//! A block that holds a byte of 0x80 or more, or a `'`, is left to the scanner; so are the last
//! 64 bytes of a text, where the end of the text decides how whitespace splits.

use super::classes::{CharClasses, L, N, S};

/// Bytes looked at from a piece's start: its 64 and the one after them.
pub(super) const WINDOW: usize = 65;

/// The classes of 64 bytes, bit `k` for byte `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Masks {
    letter: u64,
    digit: u64,
    /// `\s`.
    ws: u64,
    space: u64,
    /// Neither ASCII nor `'`: bytes this module does not decide on.
    other: u64,
}

/// What the masks take each ASCII byte to be; `matches_the_table` checks it against the
/// classes of the reference engines.
#[inline(always)]
fn byte_masks(x: u8) -> (bool, bool, bool, bool, bool) {
    let letter = (x | 0x20).wrapping_sub(b'a') < 26;
    let digit = x.wrapping_sub(b'0') < 10;
    let space = x == b' ';
    let ws = space || x.wrapping_sub(b'\t') < 5;
    (letter, digit, ws, space, x >= 0x80 || x == b'\'')
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn masks(b: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks { letter: 0, digit: 0, ws: 0, space: 0, other: 0 };
    for q in 0..4 {
        // SAFETY: SSE2 is part of x86-64; the load reads bytes 16q..16q + 16 of `b`.
        let (letter, digit, ws, space, other) = unsafe {
            let v = _mm_loadu_si128(b.as_ptr().add(16 * q).cast::<__m128i>());
            // x in lo..lo + n as one signed compare: move lo to -128 first.
            let within = |x: __m128i, lo: u8, n: u8| {
                let shifted = _mm_add_epi8(x, _mm_set1_epi8(128u8.wrapping_sub(lo) as i8));
                _mm_cmplt_epi8(shifted, _mm_set1_epi8(128u8.wrapping_add(n) as i8))
            };
            let bits = |x: __m128i| u64::from(_mm_movemask_epi8(x) as u16);
            let letter = within(_mm_or_si128(v, _mm_set1_epi8(0x20)), b'a', 26);
            let digit = within(v, b'0', 10);
            let space = _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8));
            let ws = _mm_or_si128(space, within(v, b'\t', 5));
            let apostrophe = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\'' as i8));
            // The high bit marks bytes of 0x80 and more.
            (bits(letter), bits(digit), bits(ws), bits(space), bits(_mm_or_si128(v, apostrophe)))
        };
        let at = 16 * q;
        m.letter |= letter << at;
        m.digit |= digit << at;
        m.ws |= ws << at;
        m.space |= space << at;
        m.other |= other << at;
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn masks(b: &[u8; 64]) -> Masks {
    let mut m = Masks { letter: 0, digit: 0, ws: 0, space: 0, other: 0 };
    for (k, &x) in b.iter().enumerate() {
        let (letter, digit, ws, space, other) = byte_masks(x);
        m.letter |= u64::from(letter) << k;
        m.digit |= u64::from(digit) << k;
        m.ws |= u64::from(ws) << k;
        m.space |= u64::from(space) << k;
        m.other |= u64::from(other) << k;
    }
    m
}

/// Where GPT-2's pieces start within `window[1..64]`, `window[0]` being a piece's start (bit
/// `k` for byte `k`, bit 0 clear). `Err(k)`: byte `k` is one this module leaves to the scanner,
/// and no later byte of the window is (0 when none is, but the pieces are longer than 64 bytes).
#[inline(always)]
pub(super) fn gpt2_starts(window: &[u8; WINDOW]) -> Result<u64, usize> {
    let block: &[u8; 64] = window[..64].try_into().expect("64 of 65 bytes");
    let m = masks(block);
    let (_, _, last_ws, _, last_other) = byte_masks(window[64]);
    if m.other != 0 || last_other {
        let last = if last_other { 64 } else { 63 - m.other.leading_zeros() as usize };
        return Err(last);
    }
    let rest = !m.ws & !m.letter & !m.digit;
    let before = |x: u64| x << 1;
    // Byte 64 is not W: bit 63 of `after(!ws)` is set.
    let not_ws_after = (!m.ws >> 1) | (u64::from(!last_ws) << 63);
    let class_changes = (m.letter & !before(m.letter)) | (m.digit & !before(m.digit)) | (rest & !before(rest));
    let starts = (class_changes & !before(m.space))
        | (m.space & not_ws_after)
        | (m.ws & !m.space & before(m.ws) & not_ws_after)
        | (m.ws & !before(m.ws));
    match starts & !1 {
        0 => Err(0),
        s => Ok(s),
    }
}

/// Whether the masks' idea of each ASCII byte is the reference engines' (`classes`): when it is
/// not, the scanner alone is used.
pub(super) fn agrees_with(t: &CharClasses) -> bool {
    (0..128u8).all(|x| {
        let (letter, digit, ws, _, _) = byte_masks(x);
        let cls = t.ascii[x as usize];
        letter == (cls & L != 0) && digit == (cls & N != 0) && ws == (cls & S != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_table() {
        assert!(agrees_with(&CharClasses::shared().unwrap()));
    }

    /// The vector masks against the byte-by-byte definition, for every byte at every place.
    #[test]
    fn masks_equal_byte_by_byte() {
        for x in 0..=255u8 {
            for k in 0..64 {
                let mut block = [b'a'; 64];
                block[k] = x;
                let m = masks(&block);
                let (letter, digit, ws, space, other) = byte_masks(x);
                let bit = |mask: u64| mask >> k & 1 == 1;
                assert_eq!(
                    (bit(m.letter), bit(m.digit), bit(m.ws), bit(m.space), bit(m.other)),
                    (letter, digit, ws, space, other),
                    "{x} at {k}"
                );
                let all_letters = (1u64 << k) ^ u64::MAX;
                assert_eq!(m.letter & all_letters, all_letters, "{x} at {k}");
            }
        }
    }
}
