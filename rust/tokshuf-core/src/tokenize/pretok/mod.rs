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
//! Over plain ASCII (no `'`, no byte of 0x80 or more) every pattern here splits by rules that
//! look only at the bytes around a piece's start, so there `blocks.rs` finds where the pieces of
//! 64 bytes start with bit operations, and the scanners take the rest; tests hold the two to the
//! same pieces.
//!
//! A scanner returns `None` where a position matches no alternative (cannot happen for the
//! patterns below, whose alternatives cover every character, but the caller then falls
//! back to the reference rather than guess).

mod blocks;
mod classes;
mod scan;

use std::sync::Arc;

pub use classes::{CharClasses, Engine, L, LO, N, S, UP};
use scan::Scanner;

use crate::error::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
pub const CL100K: &str =
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
pub const LLAMA3: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
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
    /// Plain ASCII is split 64 bytes at a time (`blocks.rs`).
    blocks: bool,
}

impl PreTokenizer {
    pub fn new(pattern: Pattern) -> Result<Self> {
        let classes = CharClasses::shared()?;
        // The digit rule of `blocks` is tested for groups of 1 and 3, what Llama 3 and Qwen 2 use.
        let blocks = !matches!(pattern, Pattern::Llama3 { digits } if digits != 1 && digits != 3) && blocks::agrees_with(&classes);
        Ok(PreTokenizer { pattern, classes, blocks })
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
            Pattern::Gpt2 if self.blocks => drive_blocks(&sc, emit, blocks::gpt2_starts, |sc, i| sc.gpt2(i)),
            Pattern::Gpt2 => drive(&sc, emit, |sc, i| sc.gpt2(i)),
            Pattern::Cl100k if self.blocks => drive_blocks(&sc, emit, |w| blocks::cl100k_starts(w, 3), |sc, i| sc.cl100k(i)),
            Pattern::Cl100k => drive(&sc, emit, |sc, i| sc.cl100k(i)),
            Pattern::Llama3 { digits } if self.blocks => {
                drive_blocks(&sc, emit, |w| blocks::cl100k_starts(w, digits.into()), |sc, i| sc.llama3(i, digits as usize))
            }
            Pattern::Llama3 { digits } => drive(&sc, emit, |sc, i| sc.llama3(i, digits as usize)),
            Pattern::O200k if self.blocks => drive_blocks(&sc, emit, blocks::o200k_starts, |sc, i| sc.o200k(i)),
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
    let mut i = 0;
    while i < sc.b.len() {
        i = scan_one(sc, &mut emit, &next, i)?;
    }
    Ok(())
}

/// The scanner's piece at `i`, emitted; where it ends, or `Err(i)` when nothing matches there.
#[inline(always)]
fn scan_one(
    sc: &Scanner,
    emit: &mut impl FnMut(usize, usize),
    next: &impl Fn(&Scanner, usize) -> Option<usize>,
    i: usize,
) -> std::result::Result<usize, usize> {
    match next(sc, i) {
        Some(e) if e > i => {
            emit(i, e);
            Ok(e)
        }
        _ => Err(i),
    }
}

/// `drive`, taking plain ASCII 64 bytes at a time where `starts` can (`blocks.rs`).
#[inline(always)]
fn drive_blocks(
    sc: &Scanner,
    mut emit: impl FnMut(usize, usize),
    starts: impl Fn(&[u8; blocks::WINDOW]) -> std::result::Result<u64, usize>,
    next: impl Fn(&Scanner, usize) -> Option<usize>,
) -> std::result::Result<(), usize> {
    let n = sc.b.len();
    let mut i = 0;
    // Blocks are not tried again before this: past the last byte a block left to the scanner.
    let mut scan_until = 0;
    while i < n {
        if i >= scan_until {
            match sc.b.get(i..i + blocks::WINDOW).map(|w| starts(w.try_into().expect("a window"))) {
                Some(Ok(mut starts)) => {
                    let mut s = i;
                    while starts != 0 {
                        let e = i + starts.trailing_zeros() as usize;
                        emit(s, e);
                        s = e;
                        starts &= starts - 1;
                    }
                    i = s;
                    continue;
                }
                Some(Err(k)) => scan_until = i + k + 1,
                None => scan_until = n,
            }
        }
        i = scan_one(sc, &mut emit, &next, i)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::classes::{CLASSES, FOLD_LETTERS};
    use super::*;

    fn pieces(p: &PreTokenizer, text: &str) -> Vec<String> {
        let mut v = vec![];
        p.split(text, |b| v.push(String::from_utf8(b.to_vec()).unwrap())).unwrap();
        v
    }

    /// Each pattern with the regex its scanner implements.
    const PATTERNS: [(Pattern, &str); 5] = [
        (Pattern::Gpt2, GPT2_TIKTOKEN),
        (Pattern::Cl100k, CL100K),
        (Pattern::Llama3 { digits: 3 }, LLAMA3),
        (Pattern::Llama3 { digits: 1 }, QWEN2),
        (Pattern::O200k, O200K),
    ];

    /// The scanners against the regexes they implement, run by fancy-regex, on strings
    /// over an alphabet that hits every class boundary.
    #[test]
    fn scanners_match_fancy_regex() {
        let alphabet: Vec<char> = " \t\n\r\u{a0}\u{3000}aZé'sStTlLvVrReEmMdDſ1٣Ⅻ.!/-_\u{301}\u{903}ǅʰ中😀\u{180e}\u{1c}".chars().collect();
        let ascii: Vec<char> = " \t\n\r\x0b\x1caZzA'sSlLdDtTvVeErRmM09./-_(\"".chars().collect();
        for (pattern, pat) in PATTERNS {
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

    /// Plain ASCII split 64 bytes at a time equals the scanner alone, and fancy-regex, on texts
    /// long enough for many windows: runs of every ASCII class, now and then a `'` or a
    /// non-ASCII character, every length up to 300 bytes (so every distance from a window to
    /// the end of the text).
    #[test]
    fn blocks_equal_the_scanner() {
        let common: Vec<char> = "  \t\n\r\x0b\x0c\x1c\x00\x7fabcXYZqQ0189.,-(\"_!/#".chars().collect();
        let rare: Vec<char> = "'\u{a0}\u{85}\u{3000}é中😀".chars().collect();
        for (pattern, regex) in PATTERNS {
            let p = PreTokenizer::new(pattern).unwrap();
            assert!(p.blocks);
            let scanner = PreTokenizer { blocks: false, ..p.clone() };
            let re = fancy_regex::Regex::new(regex).unwrap();
            let mut seed = 11u64;
            let mut draw = |n: u64| {
                seed = crate::hash::mix64(seed.wrapping_add(1));
                (seed % n) as usize
            };
            for case in 0..6000 {
                let mut text = String::new();
                while text.len() < case % 301 {
                    let c = if draw(60) == 0 { rare[draw(rare.len() as u64)] } else { common[draw(common.len() as u64)] };
                    text.extend(std::iter::repeat_n(c, 1 + draw(5) * draw(3)));
                }
                let want = pieces(&scanner, &text);
                assert_eq!(pieces(&p, &text), want, "{pattern:?} on {text:?}");
                if case % 4 == 0 {
                    let regex: Vec<String> = re.find_iter(&text).map(|m| m.unwrap().as_str().to_string()).collect();
                    assert_eq!(want, regex, "{pattern:?} on {text:?}");
                }
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
    }
}
