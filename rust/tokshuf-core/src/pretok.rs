//! Pre-tokenization without a regex engine: hand-written scanners, one per family of
//! pre-tokenizer patterns, that return exactly the matches the reference regex engines find.
//!
//! Exactness rests on two things:
//! - Character classes (`\p{L}`, `\p{N}`, `\s`, o200k's case classes, `(?i)` letter folds)
//!   are not our own Unicode tables but those of the reference engines: read from
//!   regex-syntax, the parser under fancy-regex, which is tiktoken's engine. Oniguruma
//!   (Hugging Face's engine) agrees with them on every code point: a unit test runs the
//!   `tokenizers` crate's Oniguruma over all of them, and the Python tests check the table
//!   against Python tiktoken and tokenizers themselves. A version bump that breaks the
//!   agreement fails those tests. (Scanning Oniguruma at run time instead cost 0.2 s of
//!   every NeoX build.)
//! - Each scanner follows the backtracking order of its pattern, alternative by alternative;
//!   the comments next to each branch name the alternative it implements. Patterns are
//!   recognised by their exact text; anything else is not handled here.
//!
//! A scanner returns `None` where a position matches no alternative (cannot happen for the
//! patterns below, whose alternatives cover every character, but the caller then falls
//! back to the reference rather than guess).

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// Class bits of one code point.
pub const L: u8 = 1; // \p{L}
pub const N: u8 = 2; // \p{N}
pub const S: u8 = 4; // \s
pub const UP: u8 = 8; // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
pub const LO: u8 = 16; // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
/// NFC quick check is Yes and the canonical combining class is 0: such a character never
/// changes under NFC, whatever surrounds it (from the normalizer Hugging Face uses).
pub const NFC_SAFE: u8 = 32;

const BLOCK: usize = 128;

/// The regex engine whose matches a scanner reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// fancy-regex / regex-syntax, the engine of tiktoken.
    FancyRegex,
    /// Oniguruma, the engine of Hugging Face `tokenizers`.
    Onig,
}

/// Per-code-point class bits in a two-level table, plus the `(?i)` folds of the letters
/// that appear in contractions.
pub struct CharClasses {
    ascii: [u8; 128],
    index: Vec<u16>,
    blocks: Vec<u8>,
    /// Non-ASCII code points matching `(?i:x)` for x in `FOLD_LETTERS`. Folds are simple
    /// (one character to one), so no single character matches a two-letter suffix.
    folds: [Vec<u32>; 8],
}

const FOLD_LETTERS: [u8; 8] = *b"stmdlver";

impl CharClasses {
    #[inline(always)]
    pub fn get(&self, cp: u32) -> u8 {
        if cp < 128 {
            self.ascii[cp as usize]
        } else {
            let blk = self.index[(cp as usize) / BLOCK] as usize;
            self.blocks[blk * BLOCK + (cp as usize) % BLOCK]
        }
    }

    /// Does `cp` match `(?i:letter)`?
    #[inline]
    fn folds_to(&self, cp: u32, letter: u8) -> bool {
        if cp < 128 {
            return (cp as u8).to_ascii_lowercase() == letter;
        }
        let k = FOLD_LETTERS.iter().position(|&l| l == letter).expect("known letter");
        self.folds[k].contains(&cp)
    }

    /// All code points with `bit` set, for tests comparing with the reference engines.
    pub fn members(&self, bit: u8) -> Vec<u32> {
        (0..0x110000u32).filter(|&cp| !(0xD800..0xE000).contains(&cp) && self.get(cp) & bit != 0).collect()
    }

    pub fn fold_members(&self, letter: u8) -> Vec<u32> {
        let mut v: Vec<u32> = (0..128u32).filter(|&c| (c as u8).to_ascii_lowercase() == letter).collect();
        if let Some(k) = FOLD_LETTERS.iter().position(|&l| l == letter) {
            v.extend(self.folds[k].iter().copied());
        }
        v
    }

    /// The table, built on first use (about 20 ms) and shared by the whole process.
    pub fn shared() -> Result<Arc<CharClasses>> {
        static TABLE: OnceLock<std::result::Result<Arc<CharClasses>, String>> = OnceLock::new();
        TABLE.get_or_init(|| build().map(Arc::new)).clone().map_err(Error::Tokenizer)
    }
}

/// The one-character classes of the table.
const CLASSES: [(u8, &str); 5] = [
    (L, r"\p{L}"),
    (N, r"\p{N}"),
    (S, r"\s"),
    (UP, r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"),
    (LO, r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"),
];

type Res<T> = std::result::Result<T, String>;

/// Code points per class bit, and the non-ASCII `(?i)` folds of each of `FOLD_LETTERS`.
struct Members {
    classes: Vec<(u8, Vec<u32>)>,
    folds: [Vec<u32>; 8],
}

/// fancy-regex hands character classes to regex-syntax (the same crate and version here, one
/// semver-compatible copy in the build), whose parsed class *is* the set its matcher accepts:
/// read the ranges, no scan needed.
fn regex_syntax_members() -> Res<Members> {
    fn class(pattern: &str) -> Res<Vec<u32>> {
        use regex_syntax::hir::{Class, HirKind};
        let hir = regex_syntax::Parser::new().parse(pattern).map_err(|e| format!("{pattern}: {e}"))?;
        match hir.kind() {
            HirKind::Class(Class::Unicode(c)) => {
                let cps = c.ranges().iter().flat_map(|r| r.start() as u32..=r.end() as u32);
                Ok(cps.filter(|cp| !(0xD800..0xE000).contains(cp)).collect())
            }
            _ => Err(format!("{pattern}: not a Unicode class")),
        }
    }
    let classes = CLASSES.iter().map(|&(bit, p)| Ok((bit, class(p)?))).collect::<Res<_>>()?;
    let mut folds: [Vec<u32>; 8] = Default::default();
    for (k, &letter) in FOLD_LETTERS.iter().enumerate() {
        let (mut ascii, other): (Vec<u32>, Vec<u32>) =
            class(&format!("(?i:{})", letter as char))?.into_iter().partition(|&c| c < 128);
        // ASCII folds are assumed to be the plain case pair (`folds_to`); check it.
        ascii.sort_unstable();
        if ascii != [letter.to_ascii_uppercase() as u32, letter as u32] {
            return Err(format!("unexpected ASCII case folds of {:?}: {ascii:?}", letter as char));
        }
        folds[k] = other;
    }
    Ok(Members { classes, folds })
}

/// Code points that never change under NFC, whatever surrounds them, as the normalizer
/// Hugging Face uses decides.
fn nfc_safe() -> Vec<u32> {
    use unicode_normalization_alignments::{char::canonical_combining_class, is_nfc_quick, IsNormalized};
    (0..0x110000u32)
        .filter_map(char::from_u32)
        .filter(|&c| canonical_combining_class(c) == 0 && is_nfc_quick(std::iter::once(c)) == IsNormalized::Yes)
        .map(|c| c as u32)
        .collect()
}

fn build() -> Res<CharClasses> {
    let members = regex_syntax_members()?;
    let mut table = vec![0u8; 0x110000];
    for (bit, cps) in &members.classes {
        for &cp in cps {
            table[cp as usize] |= bit;
        }
    }
    for cp in nfc_safe() {
        table[cp as usize] |= NFC_SAFE;
    }
    let mut ascii = [0u8; 128];
    ascii.copy_from_slice(&table[..128]);
    let mut index = Vec::with_capacity(0x110000 / BLOCK);
    let mut blocks: Vec<u8> = Vec::new();
    let mut seen: std::collections::HashMap<&[u8], u16> = std::collections::HashMap::new();
    for chunk in table.chunks(BLOCK) {
        let id = match seen.get(chunk) {
            Some(&id) => id,
            None => {
                let id = u16::try_from(seen.len()).map_err(|_| "too many distinct class blocks".to_string())?;
                seen.insert(chunk, id);
                blocks.extend_from_slice(chunk);
                id
            }
        };
        index.push(id);
    }
    Ok(CharClasses { ascii, index, blocks, folds: members.folds })
}

/// The pre-tokenizer pattern families the scanners implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// GPT-2: r50k/p50k in tiktoken, ByteLevel(use_regex) in Hugging Face.
    Gpt2,
    /// cl100k_base (tiktoken only: its `$` means end of text in fancy-regex, end of line in
    /// Oniguruma).
    Cl100k,
    /// Llama 3 (and cl100k converted to tokenizer.json); `digits` = 1 is Qwen 2's variant.
    Llama3 { digits: u8 },
    /// o200k_base.
    O200k,
}

pub const GPT2_TIKTOKEN: &str = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s";
pub const GPT2_HF: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
pub const CL100K: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);

impl Pattern {
    /// The scanner for `pattern` as run by `engine`, if there is one.
    pub fn recognise(pattern: &str, engine: Engine) -> Option<Pattern> {
        Some(match (pattern, engine) {
            (GPT2_TIKTOKEN, _) | (GPT2_HF, _) => Pattern::Gpt2,
            (CL100K, Engine::FancyRegex) => Pattern::Cl100k,
            (LLAMA3, _) => Pattern::Llama3 { digits: 3 },
            (QWEN2, _) => Pattern::Llama3 { digits: 1 },
            (O200K, _) => Pattern::O200k,
            _ => return None,
        })
    }
}

/// A pattern with the class table.
#[derive(Clone)]
pub struct PreTokenizer {
    pattern: Pattern,
    classes: Arc<CharClasses>,
}

impl PreTokenizer {
    pub fn new(pattern: Pattern) -> Result<Self> {
        Ok(PreTokenizer { pattern, classes: CharClasses::shared()? })
    }

    pub fn classes(&self) -> &CharClasses {
        &self.classes
    }

    /// Call `emit` with each pre-token of `text`, in order. `Err(at)`: no alternative of the
    /// pattern matches at byte `at` (the caller must fall back to the reference).
    #[inline]
    pub fn split(&self, text: &str, mut emit: impl FnMut(&[u8])) -> std::result::Result<(), usize> {
        let b = text.as_bytes();
        self.split_ranges(text, |s, e| emit(&b[s..e]))
    }

    /// As `split`, with the byte range of each pre-token in `text`.
    #[inline]
    pub fn split_ranges(&self, text: &str, emit: impl FnMut(usize, usize)) -> std::result::Result<(), usize> {
        let sc = Scanner { b: text.as_bytes(), t: &self.classes };
        // One loop per pattern, so that the scanner is inlined into it.
        match self.pattern {
            Pattern::Gpt2 => drive(&sc, emit, |sc, i| sc.gpt2(i)),
            Pattern::Cl100k => drive(&sc, emit, |sc, i| sc.cl100k(i)),
            Pattern::Llama3 { digits } => drive(&sc, emit, |sc, i| sc.llama3(i, digits as usize)),
            Pattern::O200k => drive(&sc, emit, |sc, i| sc.o200k(i)),
        }
    }
}

#[inline(always)]
fn drive(
    sc: &Scanner,
    mut emit: impl FnMut(usize, usize),
    next: impl Fn(&Scanner, usize) -> Option<usize>,
) -> std::result::Result<(), usize> {
    let n = sc.b.len();
    let mut i = 0;
    while i < n {
        match next(sc, i) {
            Some(e) if e > i => {
                emit(i, e);
                i = e;
            }
            _ => return Err(i),
        }
    }
    Ok(())
}

const APOS: u32 = '\'' as u32;
const CR: u32 = '\r' as u32;
const LF: u32 = '\n' as u32;
const SPACE: u32 = ' ' as u32;

struct Scanner<'a> {
    b: &'a [u8],
    t: &'a CharClasses,
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
            (
                ((x & 0x07) << 18)
                    | ((b[i + 1] as u32 & 0x3F) << 12)
                    | ((b[i + 2] as u32 & 0x3F) << 6)
                    | (b[i + 3] as u32 & 0x3F),
                i + 4,
            )
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
            let (cls, nx) = if x < 0x80 { (self.t.ascii[x as usize], i + 1) } else { let (_, c, nx) = self.at(i); (c, nx) };
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
    fn gpt2(&self, i: usize) -> Option<usize> {
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
            let mut k = s;
            while k < n && b[k].is_ascii_uppercase() {
                k += 1;
            }
            while k < n && b[k].is_ascii_lowercase() {
                k += 1;
            }
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
    fn cl100k(&self, i: usize) -> Option<usize> {
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
    fn llama3(&self, i: usize, max_digits: usize) -> Option<usize> {
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
    fn o200k(&self, i: usize) -> Option<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(p: &PreTokenizer, text: &str) -> Vec<String> {
        let mut v = vec![];
        p.split(text, |b| v.push(String::from_utf8(b.to_vec()).unwrap())).unwrap();
        v
    }

    /// The scanners against the regexes they implement, run by fancy-regex, on strings
    /// over an alphabet that hits every class boundary.
    #[test]
    fn scanners_match_fancy_regex() {
        let alphabet: Vec<char> = " \t\n\r\u{a0}\u{3000}aZé'sStTlLvVrReEmMdDſ1٣Ⅻ.!/-_\u{301}\u{903}ǅʰ中😀\u{180e}\u{1c}"
            .chars()
            .collect();
        let cases = [
            (Pattern::Gpt2, GPT2_TIKTOKEN),
            (Pattern::Cl100k, CL100K),
            (Pattern::Llama3 { digits: 3 }, LLAMA3),
            (Pattern::Llama3 { digits: 1 }, QWEN2),
            (Pattern::O200k, O200K),
        ];
        let ascii: Vec<char> = " \t\n\r\x0b\x1caZzA'sSlLdDtTvVeErRmM09./-_(\"".chars().collect();
        for (pattern, pat) in cases {
            let p = PreTokenizer::new(pattern).unwrap();
            let re = fancy_regex::Regex::new(pat).unwrap();
            let mut seed = 7u64;
            for len in 0..20000 {
                let chars = if len % 2 == 0 { &alphabet } else { &ascii };
                let len = len % 19;
                let text: String = (0..len)
                    .map(|_| {
                        seed = crate::hash::mix64(seed.wrapping_add(1));
                        chars[(seed % chars.len() as u64) as usize]
                    })
                    .collect();
                let want: Vec<String> = re.find_iter(&text).map(|m| m.unwrap().as_str().to_string()).collect();
                assert_eq!(pieces(&p, &text), want, "{pattern:?} on {text:?}");
            }
        }
    }

    /// Every Unicode scalar value, in order.
    fn all_code_points() -> String {
        (0..0xD800u32).chain(0xE000..0x110000).filter_map(char::from_u32).collect()
    }

    fn match_ranges(engine: Engine, pattern: &str, text: &str) -> Vec<(usize, usize)> {
        match engine {
            Engine::FancyRegex => {
                let re = fancy_regex::Regex::new(pattern).unwrap();
                re.find_iter(text).map(|m| m.unwrap()).map(|m| (m.start(), m.end())).collect()
            }
            Engine::Onig => tokenizers::utils::SysRegex::new(pattern).unwrap().find_iter(text).collect(),
        }
    }

    /// Code points covered by the matches of `pattern`, found by the engine itself.
    fn matched(engine: Engine, pattern: &str, text: &str) -> Vec<u32> {
        match_ranges(engine, pattern, text).into_iter().flat_map(|(a, b)| text[a..b].chars().map(|c| c as u32)).collect()
    }

    /// The table is what each reference engine itself matches, on every code point: the
    /// guarantee behind using one table for both (about 0.3 s).
    #[test]
    fn table_equals_both_engines_on_every_code_point() {
        let text = all_code_points();
        let t = CharClasses::shared().unwrap();
        let (classes, folds) = (&CLASSES, FOLD_LETTERS);
        std::thread::scope(|sc| {
            for engine in [Engine::FancyRegex, Engine::Onig] {
                let (text, t) = (&text, &t);
                sc.spawn(move || {
                    for &(bit, pat) in classes {
                        assert_eq!(t.members(bit), matched(engine, &format!("{pat}+"), text), "{engine:?} {pat}");
                    }
                    for letter in folds {
                        let pat = format!("(?i:{})", letter as char);
                        let mut want = matched(engine, &pat, text);
                        want.sort_unstable();
                        assert_eq!(t.fold_members(letter), want, "{engine:?} {pat}");
                    }
                    // No multi-character folds onto a contraction suffix.
                    assert!(match_ranges(engine, "(?i:re|ve|ll)", text).iter().all(|&(a, b)| b - a >= 2), "{engine:?}");
                });
            }
        });
    }

    #[test]
    fn class_table_spot_checks() {
        let t = CharClasses::shared().unwrap();
        assert!(t.get('a' as u32) & L != 0 && t.get('7' as u32) & N != 0 && t.get(' ' as u32) & S != 0);
        assert!(t.get(0x17F) & L != 0 && t.fold_members(b's').contains(&0x17F));
        assert!(t.get(0x300) & UP != 0 && t.get(0x300) & LO != 0 && t.get(0x300) & L == 0);
        assert!(t.get('a' as u32) & NFC_SAFE != 0 && t.get(0x4E2D) & NFC_SAFE != 0);
        assert!(t.get(0x301) & NFC_SAFE == 0 && t.get(0x212B) & NFC_SAFE == 0 && t.get(0x1161) & NFC_SAFE == 0);
    }
}
