//! The text of a `json.gz` member: a JSON list of ids (DESIGN §3).
//!
//! Builds write the list compactly, `[1,22,333]`. `parse_id_list` reads that form eight bytes
//! at a time: which bytes are digits, and the value of the digits, come from word arithmetic
//! rather than a branch per byte, and an id's bound is checked once it is whole. At the first
//! byte the compact form does not allow (whitespace, an id of eight digits or more, anything
//! malformed) it starts over with a byte-by-byte parser that also takes whitespace, and whose
//! errors are the ones reported: the fast form changes the speed, never the outcome.

use std::mem::MaybeUninit;

use super::members::Id;

/// Parse a JSON list of ids (`[1,2,3]`, whitespace tolerated) into `out` exactly: `out.len()`
/// ids, each at most `max`.
pub(super) fn parse_id_list<T: Id>(text: &[u8], max: u64, out: &mut [MaybeUninit<T>]) -> Result<(), String> {
    if parse_compact(text, max, out) {
        return Ok(());
    }
    parse_any(text, max, out)
}

const ONES: u64 = 0x0101_0101_0101_0101;

/// The leading decimal digits of the eight bytes `w` (first byte lowest): their value and
/// number, or None when all eight are digits.
#[inline(always)]
fn leading_digits(w: u64) -> Option<(u64, usize)> {
    let x = w ^ (ONES * b'0' as u64);
    // A byte is a digit when `x` is at most 9 there: adding 0x76 sets the high bit of the
    // larger values (the low seven bits are added alone, so no carry crosses bytes), and a
    // high bit already set marks a non-ASCII byte.
    let not_digit = (((x & (ONES * 0x7f)).wrapping_add(ONES * 0x76)) | x) & (ONES * 0x80);
    if not_digit == 0 {
        return None;
    }
    let len = (not_digit.trailing_zeros() / 8) as usize;
    if len == 0 {
        return Some((0, 0));
    }
    // Keep the digits, moved to the top bytes (the bytes below read as leading zeros), then
    // combine neighbours: pairs, quads, the whole.
    let mut v = x << (8 * (8 - len));
    v = ((v & (ONES * 0x0f)).wrapping_mul(10 * 256 + 1)) >> 8;
    v = ((v & 0x00ff_00ff_00ff_00ff).wrapping_mul(100 * 65536 + 1)) >> 16;
    v = ((v & 0x0000_ffff_0000_ffff).wrapping_mul(10000 * (1 << 32) + 1)) >> 32;
    Some((v, len))
}

/// The eight bytes of `text` from `at`, padded with spaces (not digits) past its end.
#[inline(always)]
fn word_at(text: &[u8], at: usize) -> u64 {
    match text.get(at..at + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
        Some(w) => u64::from_le_bytes(w),
        None => {
            let mut w = [b' '; 8];
            let rest = text.get(at..).unwrap_or_default();
            w[..rest.len()].copy_from_slice(rest);
            u64::from_le_bytes(w)
        }
    }
}

/// Positions of the commas in `block` (at most 64 bytes), as bits.
#[inline(always)]
fn commas(block: &[u8]) -> u64 {
    let Ok(full) = <&[u8; 64]>::try_from(block) else {
        let mut padded = [0u8; 64];
        padded[..block.len()].copy_from_slice(block);
        return commas64(&padded);
    };
    commas64(full)
}

#[inline(always)]
fn commas64(block: &[u8; 64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8};
        let mut mask = 0u64;
        for q in 0..4 {
            // SAFETY: SSE2 is part of x86-64; the load reads bytes 16q..16q + 16 of `block`.
            let bits = unsafe {
                let v = _mm_loadu_si128(block.as_ptr().add(16 * q).cast::<__m128i>());
                _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b',' as i8)))
            };
            mask |= u64::from(bits as u16) << (16 * q);
        }
        mask
    }
    #[cfg(not(target_arch = "x86_64"))]
    block.iter().enumerate().fold(0u64, |m, (k, &b)| m | (u64::from(b == b',') << k))
}

/// The compact form `[id,id,...]`: true when `text` is exactly that with `out.len()` ids of
/// fewer than eight digits, each at most `max` (then all of `out` is written).
///
/// The commas are found first, 64 bytes at a time, and each id is then read from where its
/// comma says it starts: ids do not wait on the parsing of the one before them.
fn parse_compact<T: Id>(text: &[u8], max: u64, out: &mut [MaybeUninit<T>]) -> bool {
    let n = text.len();
    if n < 2 || text[0] != b'[' || text[n - 1] != b']' {
        return false;
    }
    let body = n - 1;
    // The id in text[start..end] (`end` its comma or the closing bracket) into out[k].
    let mut put = |k: usize, start: usize, end: usize| -> bool {
        let Some((v, len)) = leading_digits(word_at(text, start)) else { return false };
        match out.get_mut(k) {
            Some(slot) if len == end - start && len > 0 && v <= max => {
                slot.write(T::from_id(v as u32));
                true
            }
            _ => false,
        }
    };
    let (mut k, mut start) = (0, 1);
    let mut block = 1;
    while block < body {
        let mut mask = commas(&text[block..body.min(block + 64)]);
        while mask != 0 {
            let end = block + mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if !put(k, start, end) {
                return false;
            }
            k += 1;
            start = end + 1;
        }
        block += 64;
    }
    if n == 2 {
        return out.is_empty();
    }
    put(k, start, body) && k + 1 == out.len()
}

/// Any JSON list of ids, byte by byte, with the error that explains what is wrong.
fn parse_any<T: Id>(text: &[u8], max: u64, out: &mut [MaybeUninit<T>]) -> Result<(), String> {
    let mut pos = 0usize;
    let skip_ws = |pos: &mut usize| {
        while *pos < text.len() && matches!(text[*pos], b' ' | b'\n' | b'\r' | b'\t') {
            *pos += 1;
        }
    };
    skip_ws(&mut pos);
    if text.get(pos) != Some(&b'[') {
        return Err("not a JSON list of ids".into());
    }
    pos += 1;
    let mut count = 0usize;
    loop {
        skip_ws(&mut pos);
        if count == 0 && text.get(pos) == Some(&b']') {
            pos += 1;
            break;
        }
        let start = pos;
        let mut v: u64 = 0;
        while pos < text.len() && text[pos].is_ascii_digit() {
            v = v * 10 + (text[pos] - b'0') as u64;
            if v > max {
                return Err(format!("id at position {count} exceeds {max}"));
            }
            pos += 1;
        }
        if pos == start {
            return Err(format!("position {count} is not a non-negative integer"));
        }
        if count >= out.len() {
            return Err(format!("more than {} ids", out.len()));
        }
        out[count].write(T::from_id(v as u32));
        count += 1;
        skip_ws(&mut pos);
        match text.get(pos) {
            Some(b',') => pos += 1,
            Some(b']') => {
                pos += 1;
                break;
            }
            _ => return Err("malformed JSON list".into()),
        }
    }
    skip_ws(&mut pos);
    if pos != text.len() {
        return Err("trailing bytes after the JSON list".into());
    }
    if count != out.len() {
        return Err(format!("{count} ids, expected {}", out.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &[u8], max: u64, n: usize) -> Result<Vec<u32>, String> {
        let mut out = vec![MaybeUninit::<u32>::uninit(); n];
        parse_id_list(text, max, &mut out)?;
        // SAFETY: parse_id_list wrote all of `out` when it returned Ok.
        Ok(out.into_iter().map(|x| unsafe { x.assume_init() }).collect())
    }

    /// What a JSON parser makes of `text`: ids, if it is a list of `n` integers in 0..=max.
    fn reference(text: &[u8], max: u64, n: usize) -> Option<Vec<u32>> {
        if text.contains(&b'-') {
            return None; // `-0` is JSON's zero, but a sign is never part of an id
        }
        let v: serde_json::Value = serde_json::from_slice(text).ok()?;
        let ids: Option<Vec<u32>> = v.as_array()?.iter().map(|x| x.as_u64().filter(|&x| x <= max).map(|x| x as u32)).collect();
        ids.filter(|ids| ids.len() == n)
    }

    #[test]
    fn digits_of_a_word() {
        for (text, want) in [
            (&b"0,......"[..], Some((0, 1))),
            (b"7]......", Some((7, 1))),
            (b"50276,12", Some((50276, 5))),
            (b"1234567]", Some((1234567, 7))),
            (b"0000001,", Some((1, 7))),
            (b",1234567", Some((0, 0))),
            (b"12345678", None),
            (b"12:/\xb0\xff\x00 ", Some((12, 2))),
        ] {
            let w = u64::from_le_bytes(<[u8; 8]>::try_from(text).unwrap());
            assert_eq!(leading_digits(w), want, "{}", String::from_utf8_lossy(text));
        }
        // Every byte next to a digit: only '0'..='9' continue the run.
        for b in 0..=255u8 {
            let w = u64::from_le_bytes([b'4', b, b'x', b'x', b'x', b'x', b'x', b'x']);
            let want = if b.is_ascii_digit() { (40 + (b - b'0') as u64, 2) } else { (4, 1) };
            assert_eq!(leading_digits(w), Some(want), "byte {b}");
        }
    }

    #[test]
    fn errors_name_what_is_wrong() {
        for (text, n, want) in [
            (&b"[1,2]"[..], 3, "2 ids, expected 3"),
            (b"[1,2,3,4]", 3, "more than 3 ids"),
            (b"[1,-2,3]", 3, "position 1 is not a non-negative integer"),
            (b"[1,2,3", 3, "malformed JSON list"),
            (b"1,2,3", 3, "not a JSON list of ids"),
            (b"[1,2,3]x", 3, "trailing bytes after the JSON list"),
            (b"[1,2,99999]", 3, "id at position 2 exceeds 1000"),
            (b"[1,,3]", 3, "position 1 is not a non-negative integer"),
            (b"[1,2,3,]", 3, "position 3 is not a non-negative integer"),
            (b"[]", 1, "0 ids, expected 1"),
            (b"", 1, "not a JSON list of ids"),
        ] {
            assert_eq!(parse(text, 1000, n).unwrap_err(), want, "{}", String::from_utf8_lossy(text));
        }
        assert_eq!(parse(b"[1,22,333]", 1000, 3).unwrap(), [1, 22, 333]);
        assert_eq!(parse(b" [ 1 , 2,3 ] \n", 1000, 3).unwrap(), [1, 2, 3]);
        assert_eq!(parse(b"[]", 1000, 0).unwrap(), Vec::<u32>::new());
        assert_eq!(parse(b"[4294967295,12345678]", u32::MAX as u64, 2).unwrap(), [u32::MAX, 12345678]);
        assert!(parse(b"[4294967296]", u32::MAX as u64, 1).is_err());
    }

    /// Random lists, written compactly or with whitespace, then damaged at random: the parser
    /// agrees with a JSON parser on every one (leading zeros aside, which JSON forbids and the
    /// parser has always read as decimals).
    #[test]
    fn agrees_with_a_json_parser() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let noise = [&b" "[..], b"\n", b",", b"]", b"[", b"-", b"0", b"9", b"a", b"\xff", b"1.5", b"1e3", b""];
        let mut damaged_ok = 0;
        for round in 0..20_000 {
            let n = rand(40) as usize;
            let max = [9, 1000, u16::MAX as u64, 199_998, u32::MAX as u64][rand(5) as usize];
            let ids: Vec<u64> = (0..n).map(|_| rand(max.min(1 << 32) + 1)).collect();
            let spaced = round % 4 == 0;
            let sep = if spaced { ", " } else { "," };
            let body: Vec<String> = ids.iter().map(|x| x.to_string()).collect();
            let mut text = format!("[{}]", body.join(sep)).into_bytes();
            if spaced {
                text.insert(0, b' ');
            }
            let want: Vec<u32> = ids.iter().map(|&x| x as u32).collect();
            assert_eq!(parse(&text, max, n), Ok(want), "{}", String::from_utf8_lossy(&text));
            // One to three edits: a byte replaced, inserted or removed.
            for _ in 0..=rand(3) {
                let at = rand(text.len() as u64 + 1) as usize;
                match rand(3) {
                    0 if at < text.len() => {
                        text.remove(at);
                    }
                    1 if at < text.len() => {
                        let b = noise[rand(noise.len() as u64) as usize];
                        text.splice(at..at + 1, b.iter().copied());
                    }
                    _ => {
                        let b = noise[rand(noise.len() as u64) as usize];
                        text.splice(at..at, b.iter().copied());
                    }
                }
            }
            let leading_zero = text
                .windows(2)
                .enumerate()
                .any(|(k, w)| w[0] == b'0' && w[1].is_ascii_digit() && (k == 0 || !text[k - 1].is_ascii_digit()));
            if leading_zero {
                continue;
            }
            let got = parse(&text, max, n).ok();
            assert_eq!(got, reference(&text, max, n), "{}", String::from_utf8_lossy(&text));
            damaged_ok += usize::from(got.is_some());
        }
        assert!(damaged_ok > 100, "some edits keep a valid list ({damaged_ok})");
    }
}
