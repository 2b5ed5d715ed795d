//! The character classes of the reference regex engines, as one table (see the module notes
//! of `pretok`).

use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// Class bits of one code point.
pub const L: u8 = 1; // \p{L}
pub const N: u8 = 2; // \p{N}
pub const S: u8 = 4; // \s
pub const UP: u8 = 8; // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
pub const LO: u8 = 16; // [\p{Ll}\p{Lm}\p{Lo}\p{M}]

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
    pub(super) ascii: [u8; 128],
    index: Vec<u16>,
    blocks: Vec<u8>,
    /// Non-ASCII code points matching `(?i:x)` for x in `FOLD_LETTERS`. Folds are simple
    /// (one character to one), so no single character matches a two-letter suffix.
    folds: [Vec<u32>; 8],
}

pub(super) const FOLD_LETTERS: [u8; 8] = *b"stmdlver";

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
    pub(super) fn folds_to(&self, cp: u32, letter: u8) -> bool {
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

    /// The table, built on first use (a few ms) and shared by the whole process.
    pub fn shared() -> Result<Arc<CharClasses>> {
        static TABLE: OnceLock<std::result::Result<Arc<CharClasses>, String>> = OnceLock::new();
        TABLE.get_or_init(|| build().map(Arc::new)).clone().map_err(Error::Tokenizer)
    }
}

/// The one-character classes of the table.
pub(super) const CLASSES: [(u8, &str); 5] =
    [(L, r"\p{L}"), (N, r"\p{N}"), (S, r"\s"), (UP, r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"), (LO, r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]")];

type Res<T> = std::result::Result<T, String>;

/// Code point ranges per class bit (inclusive, surrogates left out), and the non-ASCII `(?i)`
/// folds of each of `FOLD_LETTERS`.
struct Members {
    classes: Vec<(u8, Vec<(u32, u32)>)>,
    folds: [Vec<u32>; 8],
}

/// fancy-regex hands character classes to regex-syntax (the same crate and version here, one
/// semver-compatible copy in the build), whose parsed class *is* the set its matcher accepts:
/// read the ranges, no scan needed.
fn regex_syntax_members() -> Res<Members> {
    fn class(pattern: &str) -> Res<Vec<(u32, u32)>> {
        use regex_syntax::hir::{Class, HirKind};
        let hir = regex_syntax::Parser::new().parse(pattern).map_err(|e| format!("{pattern}: {e}"))?;
        match hir.kind() {
            HirKind::Class(Class::Unicode(c)) => Ok(c
                .ranges()
                .iter()
                .flat_map(|r| [(r.start() as u32, (r.end() as u32).min(0xD7FF)), ((r.start() as u32).max(0xE000), r.end() as u32)])
                .filter(|(first, last)| first <= last)
                .collect()),
            _ => Err(format!("{pattern}: not a Unicode class")),
        }
    }
    let classes = CLASSES.iter().map(|&(bit, p)| Ok((bit, class(p)?))).collect::<Res<_>>()?;
    let mut folds: [Vec<u32>; 8] = Default::default();
    for (k, &letter) in FOLD_LETTERS.iter().enumerate() {
        let cps = class(&format!("(?i:{})", letter as char))?.into_iter().flat_map(|(first, last)| first..=last);
        let (mut ascii, other): (Vec<u32>, Vec<u32>) = cps.partition(|&c| c < 128);
        // ASCII folds are assumed to be the plain case pair (`folds_to`); check it.
        ascii.sort_unstable();
        if ascii != [letter.to_ascii_uppercase() as u32, letter as u32] {
            return Err(format!("unexpected ASCII case folds of {:?}: {ascii:?}", letter as char));
        }
        folds[k] = other;
    }
    Ok(Members { classes, folds })
}

fn build() -> Res<CharClasses> {
    let members = regex_syntax_members()?;
    let mut table = vec![0u8; 0x110000];
    for (bit, ranges) in &members.classes {
        for &(first, last) in ranges {
            table[first as usize..=last as usize].iter_mut().for_each(|c| *c |= bit);
        }
    }
    let mut ascii = [0u8; 128];
    ascii.copy_from_slice(&table[..128]);
    let mut index = Vec::with_capacity(0x110000 / BLOCK);
    let mut blocks: Vec<u8> = Vec::new();
    let mut seen: rustc_hash::FxHashMap<&[u8], u16> = Default::default();
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
