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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::bpe::{self, BytePairEncoder};
use crate::error::{Error, Result};
use crate::wsrun::{self, WsRule};

/// Encode text into ids. Implementations are shared by all worker threads.
pub trait Encoder: Send + Sync {
    /// Append the ids of `text` to `out`.
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String>;
    /// Text of `ids` (lossy where ids split a character); for `inspect` and tests.
    fn decode(&self, ids: &[u32]) -> String;
}

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
    /// `allow_special`: special-token strings in text become their control ids (plain HF
    /// `encode`); only meaningful for tokenizer.json files.
    pub fn load(spec: &str, allow_special: bool) -> Result<Tokenizer> {
        if let Some(name) = spec.strip_prefix("tiktoken:") {
            if allow_special {
                return Err(Error::Config("allow_special_tokens is only supported for tokenizer.json tokenizers".into()));
            }
            return load_tiktoken(spec, name);
        }
        let path = if let Some(repo) = spec.strip_prefix("hf:") {
            hf_cache_path(repo)?
        } else {
            let p = PathBuf::from(spec);
            if p.is_dir() { p.join("tokenizer.json") } else { p }
        };
        load_tokenizer_json(spec, &path, allow_special)
    }
}

// ---------------------------------------------------------------------------------------
// tiktoken

pub(crate) const R50K_PAT: &str = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s";
pub(crate) const CL100K_PAT: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
pub(crate) const O200K_PAT: &str = concat!(
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

struct TiktokenSpec {
    data: &'static [u8],
    pattern: &'static str,
    /// (token, id) of the special tokens; the first is end-of-text.
    specials: &'static [(&'static str, u32)],
    ws_rule: WsRule,
}

fn tiktoken_spec(name: &str) -> Option<TiktokenSpec> {
    Some(match name {
        "r50k_base" | "gpt2" => TiktokenSpec {
            data: include_bytes!("../data/r50k_base.tiktoken.gz"),
            pattern: R50K_PAT,
            specials: &[("<|endoftext|>", 50256)],
            ws_rule: WsRule::R50k,
        },
        "p50k_base" => TiktokenSpec {
            data: include_bytes!("../data/p50k_base.tiktoken.gz"),
            pattern: R50K_PAT,
            specials: &[("<|endoftext|>", 50256)],
            ws_rule: WsRule::R50k,
        },
        "cl100k_base" => TiktokenSpec {
            data: include_bytes!("../data/cl100k_base.tiktoken.gz"),
            pattern: CL100K_PAT,
            specials: &[
                ("<|endoftext|>", 100257),
                ("<|fim_prefix|>", 100258),
                ("<|fim_middle|>", 100259),
                ("<|fim_suffix|>", 100260),
                ("<|endofprompt|>", 100276),
            ],
            ws_rule: WsRule::Cl100k,
        },
        "o200k_base" => TiktokenSpec {
            data: include_bytes!("../data/o200k_base.tiktoken.gz"),
            pattern: O200K_PAT,
            specials: &[("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)],
            ws_rule: WsRule::O200k,
        },
        _ => return None,
    })
}

/// Names accepted after `tiktoken:`.
pub const TIKTOKEN_NAMES: [&str; 4] = ["r50k_base", "p50k_base", "cl100k_base", "o200k_base"];

struct Tiktoken {
    bpe: BytePairEncoder,
    ws_rule: WsRule,
    regex: fancy_regex::Regex,
    decoder: Vec<Vec<u8>>,
}

impl Encoder for Tiktoken {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        // The patterns have no lookbehind, `^` or `\b`, so matching may resume on a suffix.
        let mut rest = text;
        'resume: loop {
            let mut done = 0;
            for m in self.regex.find_iter(rest) {
                match m {
                    Ok(m) => {
                        if !m.as_str().is_empty() {
                            self.bpe.encode_piece(m.as_str().as_bytes(), out);
                        }
                        done = m.end();
                    }
                    Err(e) => {
                        // Every character starts a match, so the failed search began at `done`.
                        let tail = &rest[done..];
                        let n = wsrun::run_match(self.ws_rule, tail).ok_or_else(|| format!("tokenizer regex failed: {e}"))?;
                        self.bpe.encode_piece(&tail.as_bytes()[..n], out);
                        rest = &tail[n..];
                        continue 'resume;
                    }
                }
            }
            return Ok(());
        }
    }
    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(b) = self.decoder.get(id as usize) {
                bytes.extend_from_slice(b);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn load_tiktoken(spec: &str, name: &str) -> Result<Tokenizer> {
    let s = tiktoken_spec(name).ok_or_else(|| {
        Error::Tokenizer(format!("unknown tiktoken encoding {name:?}; known: {}", TIKTOKEN_NAMES.join(", ")))
    })?;
    let raw = bpe::gunzip(s.data)?;
    let sha256 = hex(&Sha256::digest(&raw));
    let ranks = bpe::parse_tiktoken(&raw)?;
    let max_rank = ranks.values().copied().max().unwrap_or(0);
    let max_special = s.specials.iter().map(|&(_, id)| id).max().unwrap_or(0);
    let vocab_size = max_rank.max(max_special) + 1;
    let mut decoder = vec![Vec::new(); vocab_size as usize];
    for (bytes, &id) in &ranks {
        decoder[id as usize] = bytes.clone();
    }
    for &(tok, id) in s.specials {
        decoder[id as usize] = tok.as_bytes().to_vec();
    }
    let regex = fancy_regex::RegexBuilder::new(s.pattern)
        .backtrack_limit(100_000_000)
        .build()
        .map_err(|e| Error::Tokenizer(format!("{spec}: bad pattern: {e}")))?;
    let eot = s.specials[0].1;
    Ok(Tokenizer {
        spec: spec.to_string(),
        sha256,
        vocab_size,
        backend: "tokshuf-bpe",
        eot_id: Some(eot),
        pad_id: None,
        bos_id: None,
        encoder: Arc::new(Tiktoken { bpe: BytePairEncoder::new(ranks)?, ws_rule: s.ws_rule, regex, decoder }),
    })
}

// ---------------------------------------------------------------------------------------
// Hugging Face tokenizer.json

const EOT_CANDIDATES: [&str; 4] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"];
const PAD_CANDIDATES: [&str; 5] = ["<|padding|>", "<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>"];
const BOS_CANDIDATES: [&str; 4] = ["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"];

struct HfTokenizer(tokenizers::Tokenizer);

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

fn load_tokenizer_json(spec: &str, path: &Path, allow_special: bool) -> Result<Tokenizer> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut tok = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| Error::Tokenizer(format!("{}: not a usable tokenizer.json: {e}", path.display())))?;
    tok.set_encode_special_tokens(!allow_special);
    let _ = tok.with_padding(None).with_truncation(None);
    let find = |cands: &[&str]| cands.iter().find_map(|t| tok.token_to_id(t));
    let pad_id = tok.get_padding().map(|p| p.pad_id).or_else(|| find(&PAD_CANDIDATES));
    Ok(Tokenizer {
        spec: spec.to_string(),
        sha256: hex(&Sha256::digest(&bytes)),
        vocab_size: tok.get_vocab_size(true) as u32,
        backend: "hf-tokenizers",
        eot_id: find(&EOT_CANDIDATES),
        pad_id,
        bos_id: find(&BOS_CANDIDATES),
        encoder: Arc::new(HfTokenizer(tok)),
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
    candidates
        .into_iter()
        .map(|d| d.join("tokenizer.json"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Tokenizer(format!(
                "hf:{repo}: no tokenizer.json in the local Hugging Face cache ({}); tokshuf never \
                 downloads: fetch it once with `huggingface-cli download {repo} tokenizer.json` \
                 or pass the path of a tokenizer.json",
                dir.display()
            ))
        })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiktoken_known_ids() {
        let t = Tokenizer::load("tiktoken:r50k_base", false).unwrap();
        let mut out = vec![];
        t.encoder.encode_into("Hello world", &mut out).unwrap();
        assert_eq!(out, vec![15496, 995]);
        assert_eq!(t.vocab_size, 50257);
        assert_eq!(t.eot_id, Some(50256));
        let c = Tokenizer::load("tiktoken:cl100k_base", false).unwrap();
        out.clear();
        c.encoder.encode_into("hello world<|endoftext|>", &mut out).unwrap();
        assert_eq!(c.encoder.decode(&out), "hello world<|endoftext|>");
        assert!(!out.contains(&100257));
    }

    #[test]
    fn unknown_specs_are_errors() {
        assert!(matches!(Tokenizer::load("tiktoken:nope", false), Err(Error::Tokenizer(_))));
        assert!(matches!(Tokenizer::load("/no/such/tokenizer.json", false), Err(Error::Io { .. })));
        assert!(matches!(Tokenizer::load("hf:no-org/no-model", false), Err(Error::Tokenizer(_))));
    }
}
