//! Tokenizers by spec string (DESIGN §4) behind one small trait, so that a faster exact
//! backend can replace one without touching the pipeline.
//!
//! - `tiktoken:{r50k,p50k,cl100k,o200k}_base`: embedded ranks (gzip in `data/`), tiktoken's
//!   pre-tokenizer regex, our own merge (see `bpe.rs`). Ids equal Python tiktoken's
//!   `encode_ordinary`, so special-token strings in text are ordinary text.
//! - a `tokenizer.json` path (or a folder holding one), or `hf:ORG/NAME` from the local
//!   Hugging Face cache: the `tokenizers` crate with `encode_special_tokens = true` and no
//!   added special tokens, i.e. Python's `encode(text, add_special_tokens=False)` with
//!   `encode_special_tokens = True`.
//!
//! Each has a reference backend (the above) and, where `fast.rs` models the configuration
//! exactly, the fast one; `Backend` chooses (`Auto`: fast where possible).

pub mod bpe;
mod encoder;
pub mod fast;
pub mod hfbpe;
pub mod piece_cache;
pub mod pretok;

pub use encoder::Encoder;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use self::bpe::BytePairEncoder;
use crate::error::{Error, Result};
// tiktoken's pre-tokenizer patterns, as in tiktoken_ext.openai_public (the fast scanners
// recognise them by this exact text).
use self::pretok::{CL100K as CL100K_PAT, GPT2_TIKTOKEN as R50K_PAT, O200K as O200K_PAT};

/// Which implementation encodes: `Auto` takes the fast backend where it models the
/// tokenizer exactly and the reference otherwise; `Fast` fails where it cannot be used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    #[default]
    Auto,
    Fast,
    Reference,
}

impl Backend {
    pub fn parse(s: &str) -> Result<Backend> {
        match s {
            "auto" => Ok(Backend::Auto),
            "fast" => Ok(Backend::Fast),
            "reference" => Ok(Backend::Reference),
            _ => Err(Error::Config(format!("tokenizer_backend={s:?}: expected one of \"auto\", \"fast\", \"reference\""))),
        }
    }
}

/// Name of the fast backend in tokshuf.json.
pub const FAST_BACKEND: &str = "tokshuf-fast";

/// A loaded tokenizer and its identity as recorded in tokshuf.json.
#[derive(Clone)]
pub struct Tokenizer {
    pub spec: String,
    pub sha256: String,
    pub vocab_size: u32,
    pub backend: &'static str,
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub bos_id: Option<u32>,
    pub encoder: Arc<dyn Encoder>,
}

impl Tokenizer {
    /// Ids of one text (no EOT/BOS added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        self.encoder.encode_into(text, &mut out).map_err(Error::Tokenizer)?;
        Ok(out)
    }

    /// Ids of many texts, encoded on `threads` threads (0: all cores), in order.
    pub fn encode_batch(&self, texts: &[String], threads: usize) -> Result<Vec<Vec<u32>>> {
        use rayon::prelude::*;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::Config(format!("cannot start {threads} threads: {e}")))?;
        pool.install(|| texts.par_iter().map(|t| self.encode(t)).collect())
    }

    /// `allow_special`: special-token strings in text become their control ids (plain HF
    /// `encode`); only meaningful for tokenizer.json files.
    pub fn load(spec: &str, allow_special: bool, backend: Backend) -> Result<Tokenizer> {
        if let Some(name) = spec.strip_prefix("tiktoken:") {
            if allow_special {
                return Err(Error::Config("allow_special_tokens is only supported for tokenizer.json tokenizers".into()));
            }
            return load_tiktoken(spec, name, backend);
        }
        load_tokenizer_json(spec, &tokenizer_json_path(spec)?, allow_special, backend)
    }
}

/// The tokenizer.json a spec other than `tiktoken:...` names: a file, a folder holding
/// one, or `hf:ORG/NAME` in the local Hugging Face cache.
pub fn tokenizer_json_path(spec: &str) -> Result<PathBuf> {
    if let Some(repo) = spec.strip_prefix("hf:") {
        return hf_cache_path(repo);
    }
    let p = PathBuf::from(spec);
    Ok(if p.is_dir() { p.join("tokenizer.json") } else { p })
}

/// The fast encoder if `backend` wants it and `fast` could build it, else the reference.
fn choose(
    spec: &str,
    backend: Backend,
    reference: (Arc<dyn Encoder>, &'static str),
    fast: impl FnOnce() -> std::result::Result<crate::tokenize::fast::FastEncoder, String>,
) -> Result<(Arc<dyn Encoder>, &'static str)> {
    if backend == Backend::Reference {
        return Ok(reference);
    }
    match fast() {
        Ok(f) => Ok((Arc::new(f), FAST_BACKEND)),
        Err(reason) if backend == Backend::Fast => {
            Err(Error::Config(format!("{spec}: the fast tokenizer backend cannot be used: {reason}")))
        }
        Err(_) => Ok(reference),
    }
}

// ---------------------------------------------------------------------------------------
// tiktoken

struct TiktokenSpec {
    data: &'static [u8],
    pattern: &'static str,
    ws: WsRule,
    /// (token, id) of the special tokens; the first is end-of-text.
    specials: &'static [(&'static str, u32)],
}

fn tiktoken_spec(name: &str) -> Option<TiktokenSpec> {
    Some(match name {
        "r50k_base" | "gpt2" => TiktokenSpec {
            data: include_bytes!("../../data/r50k_base.tiktoken.gz"),
            pattern: R50K_PAT,
            ws: WsRule::R50k,
            specials: &[("<|endoftext|>", 50256)],
        },
        "p50k_base" => TiktokenSpec {
            data: include_bytes!("../../data/p50k_base.tiktoken.gz"),
            pattern: R50K_PAT,
            ws: WsRule::R50k,
            specials: &[("<|endoftext|>", 50256)],
        },
        "cl100k_base" => TiktokenSpec {
            data: include_bytes!("../../data/cl100k_base.tiktoken.gz"),
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
            data: include_bytes!("../../data/o200k_base.tiktoken.gz"),
            pattern: O200K_PAT,
            ws: WsRule::O200k,
            specials: &[("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)],
        },
        _ => return None,
    })
}

/// The embedded `.tiktoken` file of an encoding (decompressed), for building the Python
/// reference offline.
pub fn tiktoken_data(name: &str) -> Result<Vec<u8>> {
    let s = tiktoken_spec(name).ok_or_else(|| Error::Tokenizer(format!("unknown tiktoken encoding {name:?}")))?;
    bpe::gunzip(s.data)
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
    bpe: Arc<BytePairEncoder>,
    regex: fancy_regex::Regex,
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
    fn regex(&self) -> &fancy_regex::Regex {
        match rayon::current_thread_index() {
            Some(i) if i < REGEX_SLOTS => {
                self.per_thread[i].get_or_init(|| compile_pattern(self.regex.as_str()).unwrap_or_else(|_| self.regex.clone()))
            }
            _ => &self.regex,
        }
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
        // `find_iter`, unrolled so that long whitespace runs can bypass the regex. The
        // patterns have no look-behind or `^`, so matching from `pos` equals `find_iter`'s.
        let mut pos = 0;
        while pos < text.len() {
            let b = text.as_bytes()[pos];
            if b >= 0x80 || (b as char).is_whitespace() {
                if let Some(len) = self.long_whitespace_piece(text, pos) {
                    self.bpe.encode_piece(&text.as_bytes()[pos..pos + len], out);
                    pos += len;
                    continue;
                }
            }
            let m = match self.regex().find_from_pos(text, pos) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return Err(format!("tokenizer regex failed: {e}")),
            };
            if m.end() > m.start() {
                self.bpe.encode_piece(m.as_str().as_bytes(), out);
                pos = m.end();
            } else {
                // An empty match: step over one character, as `find_iter` does.
                pos = m.end() + text[m.end()..].chars().next().map_or(1, char::len_utf8);
            }
        }
        Ok(())
    }
    fn decode(&self, ids: &[u32]) -> String {
        let decoder = self.decoder.get_or_init(|| {
            let mut decoder = vec![Vec::new(); self.vocab_size as usize];
            for (bytes, &id) in self.bpe.ranks() {
                decoder[id as usize] = bytes.clone();
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
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn load_tiktoken(spec: &str, name: &str, backend: Backend) -> Result<Tokenizer> {
    let s = tiktoken_spec(name)
        .ok_or_else(|| Error::Tokenizer(format!("unknown tiktoken encoding {name:?}; known: {}", TIKTOKEN_NAMES.join(", "))))?;
    // The fast backend's class table is built beside the ranks.
    let (raw, ranks) = std::thread::scope(|sc| {
        if backend != Backend::Reference {
            sc.spawn(crate::tokenize::pretok::CharClasses::shared);
        }
        let raw = bpe::gunzip(s.data)?;
        let ranks = bpe::parse_tiktoken(&raw)?;
        Ok::<_, Error>((raw, ranks))
    })?;
    let sha256 = crate::format::hex(&Sha256::digest(&raw));
    let max_rank = ranks.values().copied().max().unwrap_or(0);
    let max_special = s.specials.iter().map(|&(_, id)| id).max().unwrap_or(0);
    let vocab_size = max_rank.max(max_special) + 1;
    let regex = compile_pattern(s.pattern).map_err(|e| Error::Tokenizer(format!("{spec}: bad pattern: {e}")))?;
    let per_thread = (0..REGEX_SLOTS).map(|_| OnceLock::new()).collect();
    let eot = s.specials[0].1;
    let bpe = Arc::new(BytePairEncoder::new(ranks)?);
    let reference: Arc<dyn Encoder> =
        Arc::new(Tiktoken { bpe: bpe.clone(), regex, per_thread, ws: s.ws, decoder: OnceLock::new(), specials: s.specials, vocab_size });
    let (encoder, backend) = choose(spec, backend, (reference.clone(), "tokshuf-bpe"), || {
        crate::tokenize::fast::FastEncoder::tiktoken(s.pattern, bpe, reference)
    })?;
    Ok(Tokenizer { spec: spec.to_string(), sha256, vocab_size, backend, eot_id: Some(eot), pad_id: None, bos_id: None, encoder })
}

// ---------------------------------------------------------------------------------------
// Hugging Face tokenizer.json

const EOT_CANDIDATES: [&str; 4] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"];
const PAD_CANDIDATES: [&str; 5] = ["<|padding|>", "<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>"];
const BOS_CANDIDATES: [&str; 4] = ["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"];

struct HfTokenizer(Arc<tokenizers::Tokenizer>);

impl Encoder for HfTokenizer {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        let enc = self.0.encode_fast(text, false).map_err(|e| format!("tokenizer failed: {e}"))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }
    fn decode(&self, ids: &[u32]) -> String {
        self.0.decode(ids, false).unwrap_or_default()
    }
}

fn load_tokenizer_json(spec: &str, path: &Path, allow_special: bool, backend: Backend) -> Result<Tokenizer> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    // The fast backend's parts are built beside the reference, which takes longer.
    let (tok, parts) = std::thread::scope(|sc| {
        let parts = (backend != Backend::Reference).then(|| sc.spawn(|| crate::tokenize::fast::FastEncoder::tokenizer_json_parts(&bytes)));
        let tok = tokenizers::Tokenizer::from_bytes(&bytes);
        (tok, parts.map(|h| h.join().unwrap_or_else(|_| Err("building the fast backend panicked".into()))))
    });
    let mut tok = tok.map_err(|e| Error::Tokenizer(format!("{}: not a usable tokenizer.json: {e}", path.display())))?;
    tok.set_encode_special_tokens(!allow_special);
    let _ = tok.with_padding(None).with_truncation(None);
    let find = |cands: &[&str]| cands.iter().find_map(|t| tok.token_to_id(t));
    let pad_id = tok.get_padding().map(|p| p.pad_id).or_else(|| find(&PAD_CANDIDATES));
    let (eot_id, bos_id) = (find(&EOT_CANDIDATES), find(&BOS_CANDIDATES));
    let vocab_size = tok.get_vocab_size(true) as u32;
    let tok = Arc::new(tok);
    let reference: Arc<dyn Encoder> = Arc::new(HfTokenizer(tok.clone()));
    let (encoder, backend) = choose(spec, backend, (reference.clone(), "hf-tokenizers"), || {
        let parts = parts.unwrap_or_else(|| Err("not built".into()))?;
        crate::tokenize::fast::FastEncoder::tokenizer_json(parts, &tok, allow_special, reference)
    })?;
    Ok(Tokenizer {
        spec: spec.to_string(),
        sha256: crate::format::hex(&Sha256::digest(&bytes)),
        vocab_size,
        backend,
        eot_id,
        pad_id,
        bos_id,
        encoder,
    })
}

/// `hf:ORG/NAME` -> tokenizer.json of the snapshot `refs/main` points to in the local cache.
fn hf_cache_path(repo: &str) -> Result<PathBuf> {
    let hub = if let Ok(p) = std::env::var("HF_HUB_CACHE") {
        PathBuf::from(p)
    } else if let Ok(p) = std::env::var("HF_HOME") {
        PathBuf::from(p).join("hub")
    } else {
        let home = std::env::var("HOME").unwrap_or_default();
        PathBuf::from(home).join(".cache/huggingface/hub")
    };
    let dir = hub.join(format!("models--{}", repo.replace('/', "--")));
    let snapshot = std::fs::read_to_string(dir.join("refs/main")).ok().map(|r| r.trim().to_string());
    let mut candidates: Vec<PathBuf> = snapshot.map(|s| dir.join("snapshots").join(s)).into_iter().collect();
    if let Ok(rd) = std::fs::read_dir(dir.join("snapshots")) {
        let mut others: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        others.sort();
        candidates.extend(others);
    }
    candidates.into_iter().map(|d| d.join("tokenizer.json")).find(|p| p.is_file()).ok_or_else(|| {
        Error::Tokenizer(format!(
            "hf:{repo}: no tokenizer.json in the local Hugging Face cache ({}); tokshuf never \
                 downloads: fetch it once with `huggingface-cli download {repo} tokenizer.json` \
                 or pass the path of a tokenizer.json",
            dir.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiktoken_known_ids() {
        let t = Tokenizer::load("tiktoken:r50k_base", false, Backend::Auto).unwrap();
        let mut out = vec![];
        t.encoder.encode_into("Hello world", &mut out).unwrap();
        assert_eq!(out, vec![15496, 995]);
        assert_eq!(t.vocab_size, 50257);
        assert_eq!(t.eot_id, Some(50256));
        let c = Tokenizer::load("tiktoken:cl100k_base", false, Backend::Auto).unwrap();
        out.clear();
        c.encoder.encode_into("hello world<|endoftext|>", &mut out).unwrap();
        assert_eq!(c.encoder.decode(&out), "hello world<|endoftext|>");
        assert!(!out.contains(&100257));
    }

    #[test]
    fn unknown_specs_are_errors() {
        assert!(matches!(Tokenizer::load("tiktoken:nope", false, Backend::Auto), Err(Error::Tokenizer(_))));
        assert!(matches!(Tokenizer::load("/no/such/tokenizer.json", false, Backend::Auto), Err(Error::Io { .. })));
        assert!(matches!(Tokenizer::load("hf:no-org/no-model", false, Backend::Auto), Err(Error::Tokenizer(_))));
    }
}
