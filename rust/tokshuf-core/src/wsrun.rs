//! The tiktoken pre-tokenizer's match at the start of a long whitespace run, computed directly.
//!
//! fancy-regex's backtracking VM keeps one stack entry per character of `\s+(?!\S)` and gives
//! up ("Max stack size exceeded") on runs of about a million whitespace characters; Python
//! tiktoken then panics. The three patterns only ever match such a run in one of a few ways,
//! so when the regex gives up at a run we compute the same match here and carry on after it.
//!
//! Starting at a run of m >= 2 whitespace characters (`\s` = Unicode White_Space, the same set
//! as `char::is_whitespace`), every alternative before the whitespace ones needs a letter,
//! digit, apostrophe or other non-space by the second character, so fails. What is left:
//! - r50k/p50k: `\s++$ | \s+(?!\S)` -> the whole run at the end of the text, else all but its
//!   last character (which then joins the next piece, e.g. " word").
//! - cl100k: `\s++$ | \s*[\r\n] | \s+(?!\S)` -> whole run at the end; else up to and including
//!   its last CR/LF if it has one; else all but the last character.
//! - o200k: `\s*[\r\n]+ | \s+(?!\S) | \s+` -> up to and including its last CR/LF if it has one;
//!   else the whole run at the end; else all but the last character.
//!
//! The unit test below checks these rules against the regexes themselves on short runs.

/// Which tiktoken pattern a tokenizer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WsRule {
    R50k,
    Cl100k,
    O200k,
}

/// Byte length of the pattern's match at the start of `text` if `text` starts with a run of at
/// least two whitespace characters; `None` otherwise.
pub fn run_match(rule: WsRule, text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    let mut last_start = 0; // byte offset of the run's last character
    let mut last_newline_end = None;
    let mut count = 0usize;
    let mut end = text.len();
    while let Some(&(i, c)) = chars.peek() {
        if !c.is_whitespace() {
            end = i;
            break;
        }
        last_start = i;
        if c == '\r' || c == '\n' {
            last_newline_end = Some(i + 1);
        }
        count += 1;
        chars.next();
    }
    if count < 2 {
        return None;
    }
    let at_end = end == text.len();
    Some(match rule {
        WsRule::R50k if at_end => end,
        WsRule::R50k => last_start,
        WsRule::Cl100k if at_end => end,
        WsRule::Cl100k => last_newline_end.unwrap_or(last_start),
        WsRule::O200k => last_newline_end.unwrap_or(if at_end { end } else { last_start }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{CL100K_PAT, O200K_PAT, R50K_PAT};

    #[test]
    fn rules_equal_the_regexes() {
        let spaces = [' ', ' ', '\t', '\n', '\r', '\u{a0}', '\u{3000}', '\u{85}', '\u{2028}', '\u{b}'];
        let after = ["", "x", "1", ".", "'s", "中", " y", "\u{301}"];
        let mut seed = 7u64;
        let mut next = |n: usize| {
            seed = crate::hash::mix64(seed.wrapping_add(1));
            (seed % n as u64) as usize
        };
        for (rule, pat) in [(WsRule::R50k, R50K_PAT), (WsRule::Cl100k, CL100K_PAT), (WsRule::O200k, O200K_PAT)] {
            let re = fancy_regex::Regex::new(pat).unwrap();
            for _ in 0..3000 {
                let len = 2 + next(12);
                let mut text: String = (0..len).map(|_| spaces[next(spaces.len())]).collect();
                text.push_str(after[next(after.len())]);
                let m = re.find(&text).unwrap().unwrap();
                assert_eq!(m.start(), 0);
                assert_eq!(run_match(rule, &text), Some(m.end()), "{rule:?} {text:?}");
            }
        }
        assert_eq!(run_match(WsRule::R50k, " x"), None);
        assert_eq!(run_match(WsRule::R50k, "x  "), None);
    }
}
