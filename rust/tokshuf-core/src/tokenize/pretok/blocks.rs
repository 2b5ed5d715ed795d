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
    /// `\r` and `\n`.
    newline: u64,
    /// Neither ASCII nor `'`: bytes this module does not decide on.
    other: u64,
}

/// What the masks take each ASCII byte to be; `matches_the_table` checks it against the
/// classes of the reference engines.
#[inline(always)]
fn byte_masks(x: u8) -> (bool, bool, bool, bool, bool, bool) {
    let letter = (x | 0x20).wrapping_sub(b'a') < 26;
    let digit = x.wrapping_sub(b'0') < 10;
    let space = x == b' ';
    let ws = space || x.wrapping_sub(b'\t') < 5;
    (letter, digit, ws, space, x == b'\n' || x == b'\r', x >= 0x80 || x == b'\'')
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn masks(b: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks { letter: 0, digit: 0, ws: 0, space: 0, newline: 0, other: 0 };
    for q in 0..4 {
        // SAFETY: SSE2 is part of x86-64; the load reads bytes 16q..16q + 16 of `b`.
        let (letter, digit, ws, space, newline, other) = unsafe {
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
            let newline = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'\n' as i8)), _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\r' as i8)));
            let apostrophe = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\'' as i8));
            // The high bit marks bytes of 0x80 and more.
            (bits(letter), bits(digit), bits(ws), bits(space), bits(newline), bits(_mm_or_si128(v, apostrophe)))
        };
        let at = 16 * q;
        m.letter |= letter << at;
        m.digit |= digit << at;
        m.ws |= ws << at;
        m.space |= space << at;
        m.newline |= newline << at;
        m.other |= other << at;
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn masks(b: &[u8; 64]) -> Masks {
    let mut m = Masks { letter: 0, digit: 0, ws: 0, space: 0, newline: 0, other: 0 };
    for (k, &x) in b.iter().enumerate() {
        let (letter, digit, ws, space, newline, other) = byte_masks(x);
        m.letter |= u64::from(letter) << k;
        m.digit |= u64::from(digit) << k;
        m.ws |= u64::from(ws) << k;
        m.space |= u64::from(space) << k;
        m.newline |= u64::from(newline) << k;
        m.other |= u64::from(other) << k;
    }
    m
}

/// The masks of `window[..64]` and whether byte 64 is `\s`; `Err(k)`: byte `k` is one this
/// module leaves to the scanner, and no later byte of the window is.
#[inline(always)]
fn plain(window: &[u8; WINDOW]) -> Result<(Masks, bool), usize> {
    let block: &[u8; 64] = window[..64].try_into().expect("64 of 65 bytes");
    let m = masks(block);
    let (_, _, last_ws, _, _, last_other) = byte_masks(window[64]);
    if m.other != 0 || last_other {
        return Err(if last_other { 64 } else { 63 - m.other.leading_zeros() as usize });
    }
    Ok((m, last_ws))
}

/// Bit `k` set for byte `k - 1`'s: what precedes each byte.
#[inline(always)]
fn before(x: u64) -> u64 {
    x << 1
}

/// The starts found, bit 0 (the known start) cleared; `Err(0)` when there are none.
#[inline(always)]
fn found(starts: u64) -> Result<u64, usize> {
    match starts & !1 {
        0 => Err(0),
        s => Ok(s),
    }
}

/// Where GPT-2's pieces start within `window[1..64]`, `window[0]` being a piece's start (bit
/// `k` for byte `k`). `Err(k)`: byte `k` is one this module leaves to the scanner, and no later
/// byte of the window is (0 when none is, but the pieces are longer than 64 bytes).
#[inline(always)]
pub(super) fn gpt2_starts(window: &[u8; WINDOW]) -> Result<u64, usize> {
    let (m, last_ws) = plain(window)?;
    let rest = !m.ws & !m.letter & !m.digit;
    // Byte 64 is not W: bit 63 of `after(!ws)` is set.
    let not_ws_after = (!m.ws >> 1) | (u64::from(!last_ws) << 63);
    let class_changes = (m.letter & !before(m.letter)) | (m.digit & !before(m.digit)) | (rest & !before(rest));
    found(
        (class_changes & !before(m.space))
            | (m.space & not_ws_after)
            | (m.ws & !m.space & before(m.ws) & not_ws_after)
            | (m.ws & !before(m.ws)),
    )
}

/// As `gpt2_starts`, for cl100k and Llama 3 (`max_digits` 3) or Qwen 2 (1), whose patterns
/// split plain ASCII alike away from the end of the text (module notes of `pretok`):
/// - a run of letters takes the byte before it when that is a space or other `\s` but not a
///   newline, or punctuation that is a run of its own not preceded by a space;
/// - digits start a piece every `max_digits` from the start of their run;
/// - a run of punctuation starts a piece unless a space precedes it, and takes the newlines
///   right after it;
/// - a run of whitespace (less those newlines) is a piece up to its last newline, then all but
///   its last byte, then that byte, which goes with letters after it, or if a space with
///   punctuation (`\s*[\r\n]`, `\s+(?!\S)`, `\s`). A run still open at the window's end has
///   only its start here.
#[inline(always)]
pub(super) fn cl100k_starts(window: &[u8; WINDOW], max_digits: u32) -> Result<u64, usize> {
    let (m, last_ws) = plain(window)?;
    let punct = !m.ws & !m.letter & !m.digit;
    // The newlines a run of punctuation takes (`[\r\n]*+`).
    let mut taken = 0;
    let mut edge = before(punct) & m.newline;
    while edge != 0 {
        taken |= edge;
        edge = before(edge) & m.newline;
    }
    let ws = m.ws & !taken;
    // Byte 64 counts as `ws` when byte 63 is in it: nothing before byte 64 took it then.
    let run_ends = ws & !((ws >> 1) | (u64::from(last_ws) << 63));
    // The part of each run that ended in the window after its last newline: filled from the
    // run's last byte down, as a carry runs up the bit-reversed masks.
    let (z, seeds) = ((ws & !m.newline).reverse_bits(), (run_ends & !m.newline).reverse_bits());
    let after_newline = ((z.wrapping_add(seeds) ^ z) & z).reverse_bits();
    let ws_starts = (ws & !before(ws)) | (after_newline & !before(after_newline)) | (run_ends & after_newline & before(after_newline));
    let punct_starts = punct & !before(punct) & !before(m.space);
    // Punctuation right before letters that starts a piece is a run of one.
    let letter_starts = m.letter & !before(m.letter) & !before(punct_starts) & !before(m.ws & !m.newline);
    // Each `max_digits`-th digit from the start of its run: `full` marks the digits that end
    // `max_digits` digits in a row.
    let mut full = m.digit;
    for k in 1..max_digits {
        full &= m.digit << k;
    }
    let mut group = m.digit & !before(m.digit);
    let mut digit_starts = group;
    while group != 0 {
        group = (group << max_digits) & full;
        digit_starts |= group;
    }
    found(ws_starts | letter_starts | digit_starts | punct_starts)
}

/// Whether the masks' idea of each ASCII byte is the reference engines' (`classes`): when it is
/// not, the scanner alone is used.
pub(super) fn agrees_with(t: &CharClasses) -> bool {
    (0..128u8).all(|x| {
        let (letter, digit, ws, _, _, _) = byte_masks(x);
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
                let bit = |mask: u64| mask >> k & 1 == 1;
                assert_eq!(
                    (bit(m.letter), bit(m.digit), bit(m.ws), bit(m.space), bit(m.newline), bit(m.other)),
                    byte_masks(x),
                    "{x} at {k}"
                );
                let all_letters = (1u64 << k) ^ u64::MAX;
                assert_eq!(m.letter & all_letters, all_letters, "{x} at {k}");
            }
        }
    }
}
