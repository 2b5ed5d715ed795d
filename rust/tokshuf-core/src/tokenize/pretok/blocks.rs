//! Pre-tokens over plain ASCII, 64 bytes at a time: where pieces start is found with bit
//! operations on one mask per character class, instead of a branch per piece (the shape of
//! gigatoken's scanners, issue 16).
//!
//! Over ASCII without `'` there is no contraction to try, and away from the end of the text a
//! piece's start depends only on the bytes around it: `gpt2_starts` and `cl100k_starts` give
//! each pattern's rules. A window of 64 bytes (and the one after them) is taken only from a
//! byte where a piece is known to start; one that holds a byte of 0x80 or more, or a `'`, is
//! left to the scanner, and so are the last 64 bytes of a text, where its end decides how
//! whitespace splits.

use super::classes::{CharClasses, L, LO, N, S, UP};

/// Bytes looked at from a piece's start: its 64 and the one after them.
pub(super) const WINDOW: usize = 65;

/// The classes of 64 bytes, bit `k` for byte `k`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Masks {
    upper: u64,
    lower: u64,
    letter: u64,
    digit: u64,
    /// `\s`.
    ws: u64,
    space: u64,
    /// `\r` and `\n`.
    newline: u64,
    slash: u64,
    /// Bytes of 0x80 or more, and `'`: the ones this module leaves to the scanner.
    other: u64,
}

/// The masks of one byte (bit 0); `agrees_with` checks them against the classes of the
/// reference engines.
#[inline(always)]
fn byte_masks(x: u8) -> Masks {
    let upper = x.wrapping_sub(b'A') < 26;
    let lower = x.wrapping_sub(b'a') < 26;
    let space = x == b' ';
    Masks {
        upper: upper.into(),
        lower: lower.into(),
        letter: (upper || lower).into(),
        digit: (x.wrapping_sub(b'0') < 10).into(),
        ws: (space || x.wrapping_sub(b'\t') < 5).into(),
        space: space.into(),
        newline: (x == b'\n' || x == b'\r').into(),
        slash: (x == b'/').into(),
        other: (x >= 0x80 || x == b'\'').into(),
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn masks(b: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks::default();
    for q in 0..4 {
        // SAFETY: SSE2 is part of x86-64; the load reads bytes 16q..16q + 16 of `b`.
        let one = unsafe {
            let v = _mm_loadu_si128(b.as_ptr().add(16 * q).cast::<__m128i>());
            // x in lo..lo + n as one signed compare: move lo to -128 first.
            let within = |lo: u8, n: u8| {
                let shifted = _mm_add_epi8(v, _mm_set1_epi8(128u8.wrapping_sub(lo) as i8));
                _mm_cmplt_epi8(shifted, _mm_set1_epi8(128u8.wrapping_add(n) as i8))
            };
            let is = |c: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(c as i8));
            let bits = |x: __m128i| u64::from(_mm_movemask_epi8(x) as u16);
            let (upper, lower, space) = (within(b'A', 26), within(b'a', 26), is(b' '));
            Masks {
                upper: bits(upper),
                lower: bits(lower),
                letter: bits(_mm_or_si128(upper, lower)),
                digit: bits(within(b'0', 10)),
                ws: bits(_mm_or_si128(space, within(b'\t', 5))),
                space: bits(space),
                newline: bits(_mm_or_si128(is(b'\n'), is(b'\r'))),
                slash: bits(is(b'/')),
                // The high bit marks bytes of 0x80 and more.
                other: bits(_mm_or_si128(v, is(b'\''))),
            }
        };
        m.add(one, 16 * q);
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn masks(b: &[u8; 64]) -> Masks {
    let mut m = Masks::default();
    for (k, &x) in b.iter().enumerate() {
        m.add(byte_masks(x), k);
    }
    m
}

impl Masks {
    /// Take in the masks of the bytes from `at` on.
    #[inline(always)]
    fn add(&mut self, o: Masks, at: usize) {
        self.upper |= o.upper << at;
        self.lower |= o.lower << at;
        self.letter |= o.letter << at;
        self.digit |= o.digit << at;
        self.ws |= o.ws << at;
        self.space |= o.space << at;
        self.newline |= o.newline << at;
        self.slash |= o.slash << at;
        self.other |= o.other << at;
    }
}

/// The masks of `window[..64]` and whether byte 64 is `\s`; `Err(k)`: byte `k` is one this
/// module leaves to the scanner, and no later byte of the window is.
#[inline(always)]
fn plain(window: &[u8; WINDOW]) -> Result<(Masks, bool), usize> {
    let block: &[u8; 64] = window[..64].try_into().expect("64 of 65 bytes");
    let m = masks(block);
    let last = byte_masks(window[64]);
    if m.other != 0 || last.other != 0 {
        return Err(if last.other != 0 { 64 } else { 63 - m.other.leading_zeros() as usize });
    }
    Ok((m, last.ws != 0))
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
///
/// Taking W for `\s`, and a class among letters, digits and the rest for any other byte, byte
/// `j` starts a piece when
/// - it is not W, its class differs from byte `j - 1`'s, and byte `j - 1` is not a space (a run
///   of letters, digits or the rest; a space before it starts the piece instead);
/// - it is a space and byte `j + 1` is not W (` ?X+` takes it: a run of whitespace gives up its
///   last space to what follows);
/// - it is W other than a space, byte `j - 1` is W and byte `j + 1` is not (`\s+(?!\S)` ends one
///   before it, and `\s+` takes it alone);
/// - it is W and byte `j - 1` is not (a run of whitespace starts).
#[inline(always)]
pub(super) fn gpt2_starts(window: &[u8; WINDOW]) -> Result<u64, usize> {
    let (m, last_ws) = plain(window)?;
    let rest = !m.ws & !m.letter & !m.digit;
    // Bit 63 from byte 64.
    let not_ws_after = (!m.ws >> 1) | (u64::from(!last_ws) << 63);
    let class_changes = (m.letter & !before(m.letter)) | (m.digit & !before(m.digit)) | (rest & !before(rest));
    found(
        (class_changes & !before(m.space))
            | (m.space & not_ws_after)
            | (m.ws & !m.space & before(m.ws) & not_ws_after)
            | (m.ws & !before(m.ws)),
    )
}

/// As `gpt2_starts`, for cl100k and Llama 3 (`max_digits` 3) or Qwen 2 (1). Llama 3's pattern
/// differs from cl100k's in possessive quantifiers, `\s*[\r\n]+` and no `\s++$`, none of which
/// changes a match over plain ASCII with more text after it. Here
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
    found(cl100k_family(&m, last_ws, max_digits, m.newline, 0))
}

/// As `cl100k_starts` (digits in threes), for o200k, which differs over plain ASCII in two
/// ways: a run of letters also breaks before an uppercase letter that follows a lowercase one
/// (`[\p{Lu}…]*[\p{Ll}…]+` ends there), and punctuation takes newlines and then `/` too
/// (`[\r\n/]*`).
#[inline(always)]
pub(super) fn o200k_starts(window: &[u8; WINDOW]) -> Result<u64, usize> {
    let (m, last_ws) = plain(window)?;
    found(cl100k_family(&m, last_ws, 3, m.newline | m.slash, m.upper & before(m.lower)))
}

/// `cl100k_starts`'s rules, with what punctuation takes after it (`takes`) and where runs of
/// letters break besides (`breaks`).
#[inline(always)]
fn cl100k_family(m: &Masks, last_ws: bool, max_digits: u32, takes: u64, breaks: u64) -> u64 {
    let punct = !m.ws & !m.letter & !m.digit;
    // What a run of punctuation takes after its end (`[\r\n]*+`): not punctuation first (`/`
    // right after it is still the run), then anything in `takes`.
    let mut taken = 0;
    let mut edge = before(punct) & takes & !punct;
    while edge != 0 {
        taken |= edge;
        edge = before(edge) & takes;
    }
    let ws = m.ws & !taken;
    // Byte 64 counts as `ws` when byte 63 is in it: nothing before byte 64 took it then.
    let run_ends = ws & !((ws >> 1) | (u64::from(last_ws) << 63));
    // The part of each run that ended in the window after its last newline: filled from the
    // run's last byte down, as a carry runs up the bit-reversed masks.
    let (z, seeds) = ((ws & !m.newline).reverse_bits(), (run_ends & !m.newline).reverse_bits());
    let after_newline = ((z.wrapping_add(seeds) ^ z) & z).reverse_bits();
    let ws_starts = (ws & !before(ws)) | (after_newline & !before(after_newline)) | (run_ends & after_newline & before(after_newline));
    let own_punct = punct & !taken;
    let punct_starts = own_punct & !before(own_punct) & !before(m.space);
    // Punctuation right before letters that starts a piece is a run of one.
    let letter_starts = (m.letter & !before(m.letter) & !before(punct_starts) & !before(m.ws & !m.newline)) | breaks;
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
    ws_starts | letter_starts | digit_starts | punct_starts
}

/// Whether the masks' idea of each ASCII byte is the reference engines' (`classes`): when it is
/// not, the scanner alone is used.
pub(super) fn agrees_with(t: &CharClasses) -> bool {
    (0..128u8).all(|x| {
        let (m, cls) = (byte_masks(x), t.ascii[x as usize]);
        let is = |mask: u64, bit: u8| (mask != 0) == (cls & bit != 0);
        is(m.letter, L) && is(m.digit, N) && is(m.ws, S) && is(m.upper, UP) && is(m.lower, LO)
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
                let mut want = Masks::default();
                for (j, &y) in block.iter().enumerate() {
                    want.add(byte_masks(y), j);
                }
                assert_eq!(masks(&block), want, "{x} at {k}");
            }
        }
    }
}
