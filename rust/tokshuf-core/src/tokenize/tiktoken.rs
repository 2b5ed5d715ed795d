//! The tiktoken encodings (`tiktoken:NAME`): embedded ranks, tiktoken's pre-tokenizer regex and
//! our own merge (`bpe`), or the fast backend. Ids equal Python tiktoken's `encode_ordinary`.

use std::sync::{Arc, OnceLock};

use super::bpe::{self, BytePairEncoder, TokenList};
// tiktoken's pre-tokenizer patterns, as in tiktoken_ext.openai_public (the fast scanners
// recognise them by this exact text).
use super::pretok::{CL100K as CL100K_PAT, GPT2_TIKTOKEN as R50K_PAT, O200K as O200K_PAT};
use super::{choose, Backend, Encoder, Tokenizer};
use crate::error::{Error, Result};

struct TiktokenSpec {
    /// The ranks, as `build.rs` embeds them from `data/NAME.tiktoken.gz` (`bpe::parse_embedded`).
    tokens: &'static [u8],
    /// Of the published `.tiktoken` file (the hashes tiktoken checks its downloads against): a
    /// constant rather than computed at every load; a test checks it.
    sha256: &'static str,
    pattern: &'static str,
    ws: WsRule,
    /// (token, id) of the special tokens; the first is end-of-text.
    specials: &'static [(&'static str, u32)],
}

fn tiktoken_spec(name: &str) -> Option<TiktokenSpec> {
    Some(match name {
        "r50k_base" | "gpt2" => TiktokenSpec {
            tokens: include_bytes!(concat!(env!("OUT_DIR"), "/r50k_base.tokens")),
            sha256: "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
            pattern: R50K_PAT,
            ws: WsRule::R50k,
            specials: &[("<|endoftext|>", 50256)],
        },
        "p50k_base" => TiktokenSpec {
            tokens: include_bytes!(concat!(env!("OUT_DIR"), "/p50k_base.tokens")),
            sha256: "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
            pattern: R50K_PAT,
            ws: WsRule::R50k,
            specials: &[("<|endoftext|>", 50256)],
        },
        "cl100k_base" => TiktokenSpec {
            tokens: include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.tokens")),
            sha256: "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
            pattern: CL100K_PAT,
            ws: WsRule::Cl100k,
            specials: &[
                ("<|endoftext|>", 100257),
                ("<|fim_prefix|>", 100258),
                ("<|fim_middle|>", 100259),
                ("<|fim_suffix|>", 100260),
                ("<|endofprompt|>", 100276),
            ],
        },
        "o200k_base" => TiktokenSpec {
            tokens: include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.tokens")),
            sha256: "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
            pattern: O200K_PAT,
            ws: WsRule::O200k,
            specials: &[("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)],
        },
        _ => return None,
    })
}

/// The `.tiktoken` file of an embedded encoding, for building the Python reference offline.
pub fn tiktoken_data(name: &str) -> Result<Vec<u8>> {
    let s = tiktoken_spec(name).ok_or_else(|| Error::Tokenizer(format!("unknown tiktoken encoding {name:?}")))?;
    Ok(bpe::tiktoken_text(&bpe::parse_embedded(s.tokens)))
}

/// Names accepted after `tiktoken:`.
pub const TIKTOKEN_NAMES: [&str; 4] = ["r50k_base", "p50k_base", "cl100k_base", "o200k_base"];

/// How a pattern splits a long whitespace run. The regexes' greedy `\s+(?!\S)` pushes one
/// backtracking entry per character, so fancy-regex (and Python tiktoken, which panics) fails
/// with "Max stack size exceeded" on runs of about a million characters. Inside a run of at
/// least two whitespace characters only the whitespace alternatives can match, and their
/// outcome is simple enough to compute directly (see `long_whitespace_piece`).
#[derive(Clone, Copy, Debug)]
enum WsRule {
    /// `\s++$|\s+(?!\S)|\s` (r50k, p50k)
    R50k,
    /// `\s++$|\s*[\r\n]|\s+(?!\S)|\s` (cl100k)
    Cl100k,
    /// `\s*[\r\n]+|\s+(?!\S)|\s+` (o200k)
    O200k,
}

/// Whitespace runs at least this many characters long are split without the regex.
const LONG_WHITESPACE: usize = 64;

/// Per-thread copies of the pattern. A compiled fancy-regex keeps its matching scratch in a
/// pool that only its first user reaches without locking: shared by the workers, every other
/// thread paid for a locked pool on each match (about a tenth of its time, in profiles).
/// Rayon worker `i` < `REGEX_SLOTS` compiles its own copy on first use; other threads share.
const REGEX_SLOTS: usize = 64;

struct Tiktoken {
    list: Arc<TokenList>,
    /// The merge by ranks, built on first use: the fast backend needs none of it.
    bpe: OnceLock<std::result::Result<BytePairEncoder, String>>,
    pattern: &'static str,
    /// The pattern compiled on first use, as the merge: the fast backend needs it only for a
    /// document its scanner cannot split, and compiling it took half as long as building the
    /// fast backend's tables.
    regex: OnceLock<std::result::Result<fancy_regex::Regex, String>>,
    per_thread: Vec<OnceLock<fancy_regex::Regex>>,
    ws: WsRule,
    /// Bytes of each id, built on the first `decode` (builds never decode).
    decoder: OnceLock<Vec<Vec<u8>>>,
    specials: &'static [(&'static str, u32)],
    vocab_size: u32,
}

fn compile_pattern(pattern: &str) -> std::result::Result<fancy_regex::Regex, fancy_regex::Error> {
    fancy_regex::RegexBuilder::new(pattern).backtrack_limit(100_000_000).build()
}

impl Tiktoken {
    fn bpe(&self) -> std::result::Result<&BytePairEncoder, String> {
        let bpe = self.bpe.get_or_init(|| BytePairEncoder::new(bpe::ranks_of(&self.list)).map_err(|e| e.to_string()));
        bpe.as_ref().map_err(Clone::clone)
    }

    fn regex(&self) -> std::result::Result<&fancy_regex::Regex, String> {
        let shared = self.regex.get_or_init(|| compile_pattern(self.pattern).map_err(|e| format!("bad pattern: {e}")));
        let shared = shared.as_ref().map_err(Clone::clone)?;
        Ok(match rayon::current_thread_index() {
            Some(i) if i < REGEX_SLOTS => {
                self.per_thread[i].get_or_init(|| compile_pattern(self.pattern).unwrap_or_else(|_| shared.clone()))
            }
            _ => shared,
        })
    }

    /// The piece (its length in bytes) the pattern matches at `pos` when a whitespace run of
    /// at least `LONG_WHITESPACE` characters starts there; `None` otherwise (use the regex).
    /// With two or more whitespace characters ahead, every letter, number and punctuation
    /// alternative fails (each needs a non-space at `pos` or `pos + 1`), which leaves:
    /// the run up to its end if it reaches the end of the text (`\s++$`), else up to and
    /// including its last `\r`/`\n` (`\s*[\r\n]`, not r50k), else all but its last character
    /// (`\s+(?!\S)`). o200k tries the newline rule before the end-of-text one.
    fn long_whitespace_piece(&self, text: &str, pos: usize) -> Option<usize> {
        let rest = &text[pos..];
        let (mut chars, mut end, mut last_char, mut last_newline) = (0usize, 0usize, 0usize, None);
        for (i, c) in rest.char_indices() {
            if !c.is_whitespace() {
                break;
            }
            chars += 1;
            last_char = c.len_utf8();
            end = i + last_char;
            if c == '\r' || c == '\n' {
                last_newline = Some(end);
            }
        }
        if chars < LONG_WHITESPACE {
            return None;
        }
        let at_end = end == rest.len();
        let all_but_last = end - last_char;
        Some(match self.ws {
            WsRule::R50k => {
                if at_end {
                    end
                } else {
                    all_but_last
                }
            }
            WsRule::Cl100k => {
                if at_end {
                    end
                } else {
                    last_newline.unwrap_or(all_but_last)
                }
            }
            WsRule::O200k => last_newline.unwrap_or(if at_end { end } else { all_but_last }),
        })
    }
}

impl Encoder for Tiktoken {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        let bpe = self.bpe()?;
        // `find_iter`, unrolled so that long whitespace runs can bypass the regex. The
        // patterns have no look-behind or `^`, so matching from `pos` equals `find_iter`'s.
        let mut pos = 0;
        while pos < text.len() {
            let b = text.as_bytes()[pos];
            if b >= 0x80 || (b as char).is_whitespace() {
                if let Some(len) = self.long_whitespace_piece(text, pos) {
                    bpe.encode_piece(&text.as_bytes()[pos..pos + len], out);
                    pos += len;
                    continue;
                }
            }
            let m = match self.regex()?.find_from_pos(text, pos) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return Err(format!("tokenizer regex failed: {e}")),
            };
            if m.end() > m.start() {
                bpe.encode_piece(m.as_str().as_bytes(), out);
                pos = m.end();
            } else {
                // An empty match: step over one character, as `find_iter` does.
                pos = m.end() + text[m.end()..].chars().next().map_or(1, char::len_utf8);
            }
        }
        Ok(())
    }
    fn decode(&self, ids: &[u32]) -> std::result::Result<String, String> {
        let decoder = self.decoder.get_or_init(|| {
            let mut decoder = vec![Vec::new(); self.vocab_size as usize];
            for (bytes, id) in self.list.iter() {
                decoder[id as usize] = bytes.to_vec();
            }
            for &(tok, id) in self.specials {
                decoder[id as usize] = tok.as_bytes().to_vec();
            }
            decoder
        });
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(b) = decoder.get(id as usize) {
                bytes.extend_from_slice(b);
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

pub(super) fn load_tiktoken(spec: &str, name: &str, backend: Backend) -> Result<Tokenizer> {
    let s = tiktoken_spec(name)
        .ok_or_else(|| Error::Tokenizer(format!("unknown tiktoken encoding {name:?}; known: {}", TIKTOKEN_NAMES.join(", "))))?;
    let list = bpe::parse_embedded(s.tokens);
    let mut single = [false; 256];
    for (tok, _) in list.iter().filter(|(t, _)| t.len() == 1) {
        single[tok[0] as usize] = true;
    }
    if let Some(b) = single.iter().position(|&x| !x) {
        return Err(Error::Tokenizer(format!("{spec}: vocabulary lacks the single byte {b:#04x}")));
    }
    let sha256 = s.sha256.to_string();
    let max_rank = list.max_rank().unwrap_or(0);
    let max_special = s.specials.iter().map(|&(_, id)| id).max().unwrap_or(0);
    let vocab_size = max_rank.max(max_special) + 1;
    let per_thread = (0..REGEX_SLOTS).map(|_| OnceLock::new()).collect();
    let eot = s.specials[0].1;
    let list = Arc::new(list);
    let reference: Arc<dyn Encoder> = Arc::new(Tiktoken {
        list: list.clone(),
        bpe: OnceLock::new(),
        pattern: s.pattern,
        regex: OnceLock::new(),
        per_thread,
        ws: s.ws,
        decoder: OnceLock::new(),
        specials: s.specials,
        vocab_size,
    });
    let (encoder, backend) = choose(spec, backend, (reference.clone(), "tokshuf-bpe"), || {
        crate::tokenize::fast::FastEncoder::tiktoken(s.pattern, &list, reference)
    })?;
    Ok(Tokenizer { spec: spec.to_string(), sha256, vocab_size, backend, eot_id: Some(eot), pad_id: None, bos_id: None, encoder })
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    /// The embedded ranks are exactly the published files: rebuilt as text, they have the
    /// published hashes.
    #[test]
    fn embedded_files_have_their_recorded_hashes() {
        for name in TIKTOKEN_NAMES {
            let s = tiktoken_spec(name).unwrap();
            assert_eq!(crate::format::hex(&Sha256::digest(tiktoken_data(name).unwrap())), s.sha256, "{name}");
        }
    }
}
