//! Finding added tokens in text, as `tokenizers`' AddedVocabulary does: leftmost-longest,
//! non-overlapping; a skipped token (a special one under `encode_special_tokens`) is
//! consumed but yields no id.
//!
//! GPT-NeoX's added tokens that split text are its 23 runs of 2 to 24 spaces, and an
//! automaton over them stopped at every space of every document (4 % of the encode). Where
//! every pattern is a run of one ASCII byte, matches are found with a substring search for
//! the shortest run instead, and measured along the run.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use memchr::memmem;

/// Added tokens: how they are found, and (id, skipped) per pattern.
pub struct Matcher {
    finder: Finder,
    tokens: Vec<(u32, bool)>,
}

enum Finder {
    Automaton(AhoCorasick),
    /// Every pattern is `byte` repeated; `by_len[k]` is the pattern of `k` bytes, if any.
    Runs {
        byte: u8,
        shortest: Box<memmem::Finder<'static>>,
        min: usize,
        by_len: Vec<Option<usize>>,
    },
}

pub enum Seg<'a> {
    Text(&'a str),
    Token(u32),
}

impl Matcher {
    /// `patterns`: (content, id, skipped). `None` if there are none; `Err` if one is empty
    /// or repeated.
    pub fn build(patterns: Vec<(String, u32, bool)>) -> Result<Option<Matcher>, String> {
        if patterns.is_empty() {
            return Ok(None);
        }
        let mut seen = std::collections::HashSet::new();
        for (p, _, _) in &patterns {
            if p.is_empty() || !seen.insert(p.clone()) {
                return Err(format!("added token {p:?} is empty or not unique after normalization"));
            }
        }
        let first = patterns[0].0.as_bytes()[0];
        let runs = first.is_ascii() && patterns.iter().all(|(p, _, _)| p.bytes().all(|b| b == first));
        let finder = if runs {
            let max = patterns.iter().map(|(p, _, _)| p.len()).max().unwrap_or(0);
            let min = patterns.iter().map(|(p, _, _)| p.len()).min().unwrap_or(1);
            let mut by_len = vec![None; max + 1];
            for (i, (p, _, _)) in patterns.iter().enumerate() {
                by_len[p.len()] = Some(i);
            }
            let shortest = Box::new(memmem::Finder::new(&vec![first; min]).into_owned());
            Finder::Runs { byte: first, shortest, min, by_len }
        } else {
            let ac = AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(patterns.iter().map(|(p, _, _)| p.as_str()))
                .map_err(|e| format!("added tokens: {e}"))?;
            Finder::Automaton(ac)
        };
        Ok(Some(Matcher { finder, tokens: patterns.into_iter().map(|(_, id, skip)| (id, skip)).collect() }))
    }

    /// Call `f(pattern, start, end)` for each match, in order.
    #[inline]
    fn matches(&self, text: &str, mut f: impl FnMut(usize, usize, usize)) {
        match &self.finder {
            Finder::Automaton(ac) => {
                for m in ac.find_iter(text) {
                    f(m.pattern().as_usize(), m.start(), m.end());
                }
            }
            Finder::Runs { byte, shortest, min, by_len } => {
                let b = text.as_bytes();
                let mut at = 0;
                // The leftmost match starts where a run at least as long as the shortest
                // pattern does (the search resumes only at the end of a run), and is the
                // longest pattern the run holds; the rest of the run is matched likewise.
                while let Some(off) = shortest.find(&b[at..]) {
                    let mut s = at + off;
                    let end = s + b[s..].iter().position(|x| x != byte).unwrap_or(b.len() - s);
                    while end - s >= *min {
                        let longest = (*min..=(end - s).min(by_len.len() - 1)).rev().find_map(|k| by_len[k].map(|p| (p, k)));
                        let Some((p, k)) = longest else { break };
                        f(p, s, s + k);
                        s += k;
                    }
                    at = end;
                }
            }
        }
    }
}

/// Call `f` with the pieces of `text` between added tokens and with the added tokens.
#[inline]
pub fn segments<'a>(m: Option<&Matcher>, text: &'a str, mut f: impl FnMut(Seg<'a>)) {
    let Some(m) = m else {
        if !text.is_empty() {
            f(Seg::Text(text));
        }
        return;
    };
    let mut start = 0;
    m.matches(text, |pattern, s, e| {
        let (id, skip) = m.tokens[pattern];
        if skip {
            return;
        }
        if start < s {
            f(Seg::Text(&text[start..s]));
        }
        f(Seg::Token(id));
        start = e;
    });
    if start < text.len() {
        f(Seg::Text(&text[start..]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(m: &Matcher, text: &str) -> Vec<String> {
        let mut out = vec![];
        segments(Some(m), text, |s| {
            out.push(match s {
                Seg::Text(t) => format!("T{t:?}"),
                Seg::Token(id) => format!("#{id}"),
            })
        });
        out
    }

    /// The run finder gives exactly the automaton's segments, on runs of every length
    /// between other text, for pattern sets with gaps, a skipped pattern and one byte long.
    #[test]
    fn runs_equal_the_automaton() {
        let sets: [&[usize]; 4] =
            [&[2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], &[3, 5], &[1, 4], &[2]];
        for lens in sets {
            let patterns: Vec<(String, u32, bool)> = lens.iter().map(|&k| (" ".repeat(k), 100 + k as u32, k == 5)).collect();
            let runs = Matcher::build(patterns.clone()).unwrap().unwrap();
            assert!(matches!(runs.finder, Finder::Runs { .. }));
            let ac = AhoCorasickBuilder::new().match_kind(MatchKind::LeftmostLongest).build(patterns.iter().map(|(p, _, _)| p)).unwrap();
            let automaton = Matcher { finder: Finder::Automaton(ac), tokens: runs.tokens.clone() };
            let mut seed = 1u64;
            for _ in 0..300 {
                let mut text = String::new();
                for _ in 0..8 {
                    seed = crate::hash::mix64(seed);
                    text.push_str(&" ".repeat((seed % 60) as usize));
                    text.push_str(["x", "é", "\n", "ab"][(seed >> 8) as usize % 4]);
                }
                assert_eq!(segs(&runs, &text), segs(&automaton, &text), "{lens:?} {text:?}");
            }
        }
        let mixed = Matcher::build(vec![("  ".into(), 1, false), ("<s>".into(), 2, false)]).unwrap().unwrap();
        assert!(matches!(mixed.finder, Finder::Automaton(_)));
    }
}
