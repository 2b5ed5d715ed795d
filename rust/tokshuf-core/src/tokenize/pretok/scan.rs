//! The scanners: one method per pattern family, each following its pattern's alternatives in
//! backtracking order (the comment at each branch names the alternative).

use super::classes::{CharClasses, L, LO, N, S, UP};

const APOS: u32 = '\'' as u32;
const CR: u32 = '\r' as u32;
const LF: u32 = '\n' as u32;
const SPACE: u32 = ' ' as u32;

pub(super) struct Scanner<'a> {
    pub(super) b: &'a [u8],
    pub(super) t: &'a CharClasses,
}

/// What a whitespace run starting at some position looks like.
struct WsRun {
    /// End of the run (first byte that is not whitespace, or the end of text).
    end: usize,
    /// End of the run's first character.
    first_end: usize,
    /// Start of the run's last character.
    last_start: usize,
    /// End of the run's last `\r` or `\n`, if any.
    last_newline_end: Option<usize>,
    chars: usize,
}

impl WsRun {
    /// `\s+(?!\S)|\s+` (or `|\s`, the same here) for a run no newline rule took: all of it
    /// at the end of the text, else all but its last character, which goes with what
    /// follows, or its only character.
    #[inline(always)]
    fn space_end(&self, n: usize) -> usize {
        if self.end == n {
            n
        } else if self.chars >= 2 {
            self.last_start
        } else {
            self.first_end
        }
    }
}

impl<'a> Scanner<'a> {
    /// Code point at `i` (a char boundary) and the index after it.
    #[inline(always)]
    fn ch(&self, i: usize) -> (u32, usize) {
        let b = self.b;
        let x = b[i] as u32;
        if x < 0x80 {
            (x, i + 1)
        } else if x < 0xE0 {
            (((x & 0x1F) << 6) | (b[i + 1] as u32 & 0x3F), i + 2)
        } else if x < 0xF0 {
            (((x & 0x0F) << 12) | ((b[i + 1] as u32 & 0x3F) << 6) | (b[i + 2] as u32 & 0x3F), i + 3)
        } else {
            (((x & 0x07) << 18) | ((b[i + 1] as u32 & 0x3F) << 12) | ((b[i + 2] as u32 & 0x3F) << 6) | (b[i + 3] as u32 & 0x3F), i + 4)
        }
    }

    /// (code point, class bits, next index) at `i`.
    #[inline(always)]
    fn at(&self, i: usize) -> (u32, u8, usize) {
        let (c, nx) = self.ch(i);
        (c, self.t.get(c), nx)
    }

    #[inline(always)]
    fn class_at(&self, i: usize) -> u8 {
        if i < self.b.len() {
            self.at(i).1
        } else {
            0
        }
    }

    /// End of the run of characters whose class intersects `mask`, from `i`.
    #[inline(always)]
    fn run(&self, mut i: usize, mask: u8) -> usize {
        let b = self.b;
        while i < b.len() {
            if mask == L {
                // ASCII letters 16 at a time; the loop below takes any other letter.
                i = LETTERS.run_end(b, i);
                if i == b.len() {
                    break;
                }
            }
            let x = b[i];
            if x < 0x80 {
                if self.t.ascii[x as usize] & mask == 0 {
                    return i;
                }
                i += 1;
            } else {
                let (_, cls, nx) = self.at(i);
                if cls & mask == 0 {
                    return i;
                }
                i = nx;
            }
        }
        i
    }

    /// End of the run of characters in neither `\s`, `\p{L}` nor `\p{N}`, from `i`.
    #[inline(always)]
    fn run_other(&self, mut i: usize) -> usize {
        let b = self.b;
        while i < b.len() {
            let x = b[i];
            let (cls, nx) = if x < 0x80 {
                (self.t.ascii[x as usize], i + 1)
            } else {
                let (_, c, nx) = self.at(i);
                (c, nx)
            };
            if cls & (S | L | N) != 0 {
                return i;
            }
            i = nx;
        }
        i
    }

    /// End of the run of bytes in `set` (ASCII only), from `i`.
    #[inline(always)]
    fn run_ascii(&self, mut i: usize, set: &[u8]) -> usize {
        while i < self.b.len() && set.contains(&self.b[i]) {
            i += 1;
        }
        i
    }

    #[inline(always)]
    fn ws_run(&self, mut i: usize) -> WsRun {
        let mut r = WsRun { end: i, first_end: i, last_start: i, last_newline_end: None, chars: 0 };
        while i < self.b.len() {
            let (c, cls, nx) = self.at(i);
            if cls & S == 0 {
                break;
            }
            if r.chars == 0 {
                r.first_end = nx;
            }
            r.last_start = i;
            r.chars += 1;
            if c == CR || c == LF {
                r.last_newline_end = Some(nx);
            }
            i = nx;
        }
        r.end = i;
        r
    }

    /// `min(count, max)` characters of class N from `i`.
    #[inline(always)]
    fn digits(&self, mut i: usize, max: usize) -> usize {
        for _ in 0..max {
            if i >= self.b.len() {
                break;
            }
            let (_, cls, nx) = self.at(i);
            if cls & N == 0 {
                break;
            }
            i = nx;
        }
        i
    }

    /// End of a case-insensitive contraction `'s|'t|'re|'ve|'m|'ll|'d` at `i`, if one is there.
    #[inline(always)]
    fn contraction_ci(&self, i: usize) -> Option<usize> {
        if i < self.b.len() && self.b[i] == b'\'' {
            self.contraction_ci_after_apostrophe(i)
        } else {
            None
        }
    }

    #[inline(never)]
    fn contraction_ci_after_apostrophe(&self, i: usize) -> Option<usize> {
        let b = self.b;
        if i + 1 >= b.len() {
            return None;
        }
        let (c1, n1) = self.ch(i + 1);
        let f = |c: u32, l: u8| self.t.folds_to(c, l);
        if f(c1, b's') || f(c1, b't') || f(c1, b'm') || f(c1, b'd') {
            return Some(n1);
        }
        if n1 < b.len() {
            let (c2, n2) = self.ch(n1);
            if (f(c1, b'r') && f(c2, b'e')) || (f(c1, b'v') && f(c2, b'e')) || (f(c1, b'l') && f(c2, b'l')) {
                return Some(n2);
            }
        }
        None
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    /// (tiktoken's r50k spelling, `...|\s++$|\s+(?!\S)|\s`, matches the same).
    #[inline(always)]
    pub(super) fn gpt2(&self, i: usize) -> Option<usize> {
        self.gpt2_ascii(i).or_else(|| self.gpt2_general(i))
    }

    // ASCII fast paths. Most pre-tokens start with an ASCII character whose class, and
    // that of the next one, decide the alternative; each fast path follows its pattern's
    // alternatives in order and gives up (`None`, the general scanner decides) wherever a
    // decision would depend on a non-ASCII character. Runs (`run`, `run_other`) handle
    // any character.

    /// The ASCII whitespace run from `i` (which is whitespace); `None` if a non-ASCII
    /// character follows (it could be whitespace too).
    #[inline(always)]
    fn ascii_ws(&self, i: usize) -> Option<WsRun> {
        let b = self.b;
        let mut j = i;
        let mut newline = None;
        while j < b.len() {
            let y = b[j];
            if y >= 0x80 {
                return None;
            }
            if self.t.ascii[y as usize] & S == 0 {
                break;
            }
            if y == b'\r' || y == b'\n' {
                newline = Some(j + 1);
            }
            j += 1;
        }
        Some(WsRun { end: j, first_end: i + 1, last_start: j - 1, last_newline_end: newline, chars: j - i })
    }

    /// `\p{N}{1,max}` from an ASCII digit at `i`.
    #[inline(always)]
    fn ascii_digits(&self, i: usize, max: usize) -> Option<usize> {
        let b = self.b;
        let mut j = i;
        while j < b.len() && j - i < max && b[j].is_ascii_digit() {
            j += 1;
        }
        if j - i < max && j < b.len() && b[j] >= 0x80 {
            return None;
        }
        Some(j)
    }

    /// Class of the ASCII character at `i`, `None` past the end or if not ASCII.
    #[inline(always)]
    fn ascii_class(&self, i: usize) -> Option<u8> {
        match self.b.get(i) {
            Some(&y) if y < 0x80 => Some(self.t.ascii[y as usize]),
            _ => None,
        }
    }

    #[inline(always)]
    fn gpt2_ascii(&self, i: usize) -> Option<usize> {
        let b = self.b;
        let n = b.len();
        let x = b[i];
        if x >= 0x80 || x == b'\'' {
            return None;
        }
        let cls = self.t.ascii[x as usize];
        if cls & L != 0 {
            return Some(self.run(i, L));
        }
        if cls & N != 0 {
            return Some(self.run(i, N));
        }
        if cls & S == 0 {
            return Some(self.run_other(i));
        }
        if x == b' ' && i + 1 < n {
            let c2 = self.ascii_class(i + 1)?;
            if c2 & L != 0 {
                return Some(self.run(i + 1, L));
            }
            if c2 & N != 0 {
                return Some(self.run(i + 1, N));
            }
            if c2 & S == 0 {
                return Some(self.run_other(i + 1));
            }
        }
        Some(self.ascii_ws(i)?.space_end(n))
    }

    /// cl100k and Llama 3 (`newline_first`: Llama 3 has no `\s++$` before its newline rule).
    #[inline(always)]
    fn cl_ascii(&self, i: usize, max_digits: usize, newline_first: bool) -> Option<usize> {
        let b = self.b;
        let n = b.len();
        let x = b[i];
        if x >= 0x80 || x == b'\'' {
            return None;
        }
        let cls = self.t.ascii[x as usize];
        if cls & L != 0 {
            return Some(self.run(i, L));
        }
        // [^\r\n\p{L}\p{N}]\p{L}+
        if x != b'\r' && x != b'\n' && cls & N == 0 && i + 1 < n && self.ascii_class(i + 1)? & L != 0 {
            return Some(self.run(i + 1, L));
        }
        if cls & N != 0 {
            return self.ascii_digits(i, max_digits);
        }
        let other = |k: u8| k & (S | L | N) == 0;
        // The next character is ASCII here when it exists (checked above for a space).
        if x == b' ' && i + 1 < n && other(self.t.ascii[b[i + 1] as usize]) {
            return Some(self.run_ascii(self.run_other(i + 1), b"\r\n"));
        }
        if other(cls) {
            return Some(self.run_ascii(self.run_other(i), b"\r\n"));
        }
        let r = self.ascii_ws(i)?;
        Some(match (r.last_newline_end, newline_first) {
            (Some(e), true) => e,
            (Some(e), false) if r.end < n => e,
            _ => r.space_end(n),
        })
    }

    #[inline(always)]
    fn o200k_ascii(&self, i: usize) -> Option<usize> {
        let b = self.b;
        let n = b.len();
        let x = b[i];
        if x >= 0x80 {
            return None;
        }
        let cls = self.t.ascii[x as usize];
        // 1 and 2 on ASCII letters: UP is A-Z and LO is a-z, so from the first letter both
        // end after the lowercase run that follows the uppercase run (alternative 1 when
        // there is a lowercase letter, 2 otherwise), then the optional contraction.
        let first = if cls & L != 0 {
            Some(i)
        } else if x != b'\r' && x != b'\n' && cls & N == 0 && i + 1 < n {
            if self.ascii_class(i + 1)? & L != 0 {
                Some(i + 1)
            } else {
                None
            }
        } else {
            None
        };
        if let Some(s) = first {
            let k = LOWER.run_end(b, UPPER.run_end(b, s));
            if k < n && b[k] >= 0x80 {
                return None;
            }
            return Some(self.contraction_ci(k).unwrap_or(k));
        }
        if cls & N != 0 {
            return self.ascii_digits(i, 3);
        }
        let other = |k: u8| k & (S | L | N) == 0;
        if x == b' ' && i + 1 < n && other(self.t.ascii[b[i + 1] as usize]) {
            return Some(self.run_ascii(self.run_other(i + 1), b"\r\n/"));
        }
        if other(cls) {
            return Some(self.run_ascii(self.run_other(i), b"\r\n/"));
        }
        let r = self.ascii_ws(i)?;
        Some(r.last_newline_end.unwrap_or_else(|| r.space_end(n)))
    }

    #[inline(never)]
    fn gpt2_general(&self, i: usize) -> Option<usize> {
        let b = self.b;
        let n = b.len();
        let (c, cls, nx) = self.at(i);
        // 's 't 're 've 'm 'll 'd (case-sensitive)
        if c == APOS && nx < n {
            match b[nx] {
                b's' | b't' | b'm' | b'd' => return Some(nx + 1),
                b'r' | b'v' if nx + 1 < n && b[nx + 1] == b'e' => return Some(nx + 2),
                b'l' if nx + 1 < n && b[nx + 1] == b'l' => return Some(nx + 2),
                _ => {}
            }
        }
        // ` ?X+` for X in \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional leading space.
        let (start, cls) = if c == SPACE && nx < n {
            let c2 = self.class_at(nx);
            if c2 & (L | N) != 0 || c2 & S == 0 {
                (nx, c2)
            } else {
                (i, cls)
            }
        } else {
            (i, cls)
        };
        if cls & L != 0 {
            return Some(self.run(start, L));
        }
        if cls & N != 0 {
            return Some(self.run(start, N));
        }
        if cls & S == 0 {
            return Some(self.run_other(start));
        }
        // \s+(?!\S) | \s+
        let r = self.ws_run(i);
        Some(r.space_end(n))
    }

    /// `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`
    #[inline(always)]
    pub(super) fn cl100k(&self, i: usize) -> Option<usize> {
        self.cl_ascii(i, 3, false).or_else(|| self.cl100k_general(i))
    }

    #[inline(never)]
    fn cl100k_general(&self, i: usize) -> Option<usize> {
        let n = self.b.len();
        if let Some(e) = self.contraction_ci(i) {
            return Some(e);
        }
        let (c, cls, nx) = self.at(i);
        if let Some(e) = self.letters_with_prefix(c, cls, i, nx) {
            return Some(e);
        }
        if cls & N != 0 {
            return Some(self.digits(i, 3));
        }
        if let Some(e) = self.punct(c, cls, i, nx, b"\r\n") {
            return Some(e);
        }
        if cls & S == 0 {
            return None;
        }
        let r = self.ws_run(i);
        // \s++$
        if r.end == n {
            return Some(n);
        }
        // \s*[\r\n]
        if let Some(e) = r.last_newline_end {
            return Some(e);
        }
        // \s+(?!\S) | \s
        Some(r.space_end(n))
    }

    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    #[inline(always)]
    pub(super) fn llama3(&self, i: usize, max_digits: usize) -> Option<usize> {
        self.cl_ascii(i, max_digits, true).or_else(|| self.llama3_general(i, max_digits))
    }

    #[inline(never)]
    fn llama3_general(&self, i: usize, max_digits: usize) -> Option<usize> {
        if let Some(e) = self.contraction_ci(i) {
            return Some(e);
        }
        let (c, cls, nx) = self.at(i);
        if let Some(e) = self.letters_with_prefix(c, cls, i, nx) {
            return Some(e);
        }
        self.digits_punct_space(c, cls, i, nx, max_digits, b"\r\n")
    }

    /// `\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[tail]*|\s*[\r\n]+|\s+(?!\S)|\s+`: the
    /// alternatives Llama 3 and o200k share after their letter rules.
    #[inline(always)]
    fn digits_punct_space(&self, c: u32, cls: u8, i: usize, nx: usize, max_digits: usize, tail: &[u8]) -> Option<usize> {
        let n = self.b.len();
        if cls & N != 0 {
            return Some(self.digits(i, max_digits));
        }
        if let Some(e) = self.punct(c, cls, i, nx, tail) {
            return Some(e);
        }
        if cls & S == 0 {
            return None;
        }
        let r = self.ws_run(i);
        // \s*[\r\n]+: up to the run's last newline
        if let Some(e) = r.last_newline_end {
            return Some(e);
        }
        // \s+(?!\S) | \s+
        Some(r.space_end(n))
    }

    /// `[^\r\n\p{L}\p{N}]?\p{L}+` (the possessive and the backtracking spelling match the
    /// same: if the optional character is taken, it is not a letter, so dropping it
    /// cannot let `\p{L}+` start there).
    #[inline(always)]
    fn letters_with_prefix(&self, c: u32, cls: u8, i: usize, nx: usize) -> Option<usize> {
        if cls & L != 0 {
            return Some(self.run(i, L));
        }
        if c != CR && c != LF && cls & N == 0 && self.class_at(nx) & L != 0 {
            return Some(self.run(nx, L));
        }
        None
    }

    /// ` ?[^\s\p{L}\p{N}]+[tail]*`
    #[inline(always)]
    fn punct(&self, c: u32, cls: u8, i: usize, nx: usize, tail: &[u8]) -> Option<usize> {
        let other = |k: u8| k & (S | L | N) == 0;
        let start = if c == SPACE && nx < self.b.len() && other(self.class_at(nx)) {
            nx
        } else if other(cls) {
            i
        } else {
            return None;
        };
        Some(self.run_ascii(self.run_other(start), tail))
    }

    /// o200k_base:
    /// 1. `[^\r\n\p{L}\p{N}]?[UP]*[LO]+C?`
    /// 2. `[^\r\n\p{L}\p{N}]?[UP]+[LO]*C?`
    /// 3. `\p{N}{1,3}`
    /// 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    /// 5. `\s*[\r\n]+`  6. `\s+(?!\S)`  7. `\s+`
    ///
    /// with UP = `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`, LO = `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`,
    /// C = `(?i:'s|'t|'re|'ve|'m|'ll|'d)`.
    #[inline(always)]
    pub(super) fn o200k(&self, i: usize) -> Option<usize> {
        self.o200k_ascii(i).or_else(|| self.o200k_general(i))
    }

    #[inline(never)]
    fn o200k_general(&self, i: usize) -> Option<usize> {
        let n = self.b.len();
        let (c, cls, nx) = self.at(i);
        let prefix_ok = c != CR && c != LF && cls & (L | N) == 0 && nx < n;
        // 1: the optional prefix is tried first, then without it.
        if prefix_ok {
            if let Some(e) = self.upper_then_lower(nx) {
                return Some(e);
            }
        }
        if let Some(e) = self.upper_then_lower(i) {
            return Some(e);
        }
        // 2
        if prefix_ok {
            if let Some(e) = self.upper_run_then_lower(nx) {
                return Some(e);
            }
        }
        if let Some(e) = self.upper_run_then_lower(i) {
            return Some(e);
        }
        // 3 to 7
        self.digits_punct_space(c, cls, i, nx, 3, b"\r\n/")
    }

    /// `[UP]*[LO]+C?` from `s`: the greedy `[UP]*` gives back characters until `[LO]+` can
    /// match; characters in both classes (Lm, Lo, M) make that possible inside the run.
    #[inline]
    fn upper_then_lower(&self, s: usize) -> Option<usize> {
        let e_u = self.run(s, UP);
        let end = if self.class_at(e_u) & LO != 0 {
            self.run(e_u, LO)
        } else {
            // Backtrack: the last character of [s, e_u) that is also LO ends the match
            // (the ones after it are UP but not LO, and e_u is not LO).
            let mut last = None;
            let mut k = s;
            while k < e_u {
                let (_, cls, nx) = self.at(k);
                if cls & LO != 0 {
                    last = Some(nx);
                }
                k = nx;
            }
            last?
        };
        Some(self.contraction_ci(end).unwrap_or(end))
    }

    /// `[UP]+[LO]*C?` from `s`.
    #[inline]
    fn upper_run_then_lower(&self, s: usize) -> Option<usize> {
        let e_u = self.run(s, UP);
        if e_u == s {
            return None;
        }
        let end = self.run(e_u, LO);
        Some(self.contraction_ci(end).unwrap_or(end))
    }
}

/// ASCII byte ranges that runs are made of, scanned 16 bytes at a time: where a word ends is
/// then computed rather than found by a branch per letter, which the CPU mispredicted at the
/// end of nearly every word.
#[derive(Clone, Copy)]
struct AsciiRange {
    /// OR-ed into each byte first (0x20 folds the case of letters).
    fold: u8,
    lo: u8,
    hi: u8,
}

const LETTERS: AsciiRange = AsciiRange { fold: 0x20, lo: b'a', hi: b'z' };
const UPPER: AsciiRange = AsciiRange { fold: 0, lo: b'A', hi: b'Z' };
const LOWER: AsciiRange = AsciiRange { fold: 0, lo: b'a', hi: b'z' };

impl AsciiRange {
    #[inline(always)]
    fn has(self, x: u8) -> bool {
        (x | self.fold).wrapping_sub(self.lo) <= self.hi - self.lo
    }

    /// End of the run of bytes in the range from `i`.
    #[inline(always)]
    fn run_end(self, b: &[u8], mut i: usize) -> usize {
        while let Some(chunk) = b.get(i..i + 16) {
            let n = self.leading(chunk.try_into().expect("16 bytes"));
            i += n;
            if n < 16 {
                return i;
            }
        }
        while i < b.len() && self.has(b[i]) {
            i += 1;
        }
        i
    }

    /// How many of the 16 bytes, from the first, are in the range.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn leading(self, chunk: &[u8; 16]) -> usize {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86-64; the load reads exactly the 16 bytes of `chunk`.
        unsafe {
            let v = _mm_or_si128(_mm_loadu_si128(chunk.as_ptr() as *const __m128i), _mm_set1_epi8(self.fold as i8));
            // Move lo..=hi to the smallest signed bytes: one signed compare.
            let shifted = _mm_add_epi8(v, _mm_set1_epi8(128u8.wrapping_sub(self.lo) as i8));
            let bound = _mm_set1_epi8((128u8.wrapping_add(self.hi - self.lo + 1)) as i8);
            let inside = _mm_cmplt_epi8(shifted, bound);
            (!(_mm_movemask_epi8(inside) as u32)).trailing_zeros() as usize
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    fn leading(self, chunk: &[u8; 16]) -> usize {
        chunk.iter().take_while(|&&c| self.has(c)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ASCII members of the classes the 16-byte scans stand for (the table itself is
    /// checked against both regex engines in `pretok`'s tests).
    #[test]
    fn ascii_letters_are_the_ranges_scanned() {
        let t = CharClasses::shared().unwrap();
        for c in 0..128u8 {
            let cls = t.ascii[c as usize];
            assert_eq!(cls & L != 0, LETTERS.has(c), "{c}");
            assert_eq!(cls & UP != 0, UPPER.has(c), "{c}");
            assert_eq!(cls & LO != 0, LOWER.has(c), "{c}");
        }
    }

    /// Every byte value before, inside and after runs of every length, at every distance from
    /// the end of the text.
    #[test]
    fn ascii_runs_end_where_a_byte_loop_says() {
        let mut seed = 1u64;
        type IsIn = fn(&u8) -> bool;
        let ranges: [(AsciiRange, IsIn); 3] =
            [(LETTERS, u8::is_ascii_alphabetic), (UPPER, u8::is_ascii_uppercase), (LOWER, u8::is_ascii_lowercase)];
        for (stop, alphabet) in (0..=255u8).flat_map(|s| [b"aZqMxAzY", b"QWERTYUI", b"qwertyui"].map(|a| (s, a))) {
            for len in 0..40 {
                let mut text: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = crate::hash::mix64(seed);
                        alphabet[(seed % 8) as usize]
                    })
                    .collect();
                text.push(stop);
                text.extend_from_slice(b"abc");
                for cut in [len, len + 1, text.len()] {
                    let t = &text[..cut];
                    for i in 0..t.len() {
                        for (range, is) in ranges {
                            let want = i + t[i..].iter().take_while(|c| is(c)).count();
                            assert_eq!(range.run_end(t, i), want, "{t:?} from {i}");
                        }
                    }
                }
            }
        }
    }
}
