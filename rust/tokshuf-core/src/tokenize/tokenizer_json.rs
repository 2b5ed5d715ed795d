//! Hugging Face `tokenizer.json` files (a path, a folder holding one, or `hf:ORG/NAME` from the
//! local cache): the `tokenizers` crate with `encode_special_tokens = true`, or the fast backend.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use super::fast::FastEncoder;
use super::hf_json::{crate_added_tokens, needless_escapes_written_out};
use super::hfbpe::MergeBpe;
use super::pretok::CharClasses;
use super::saved_tables::{self, Saved};
use super::{choose, side_by_side, Backend, Encoder, Tokenizer, FAST_BACKEND};
use crate::error::{Error, Result};

/// The tokenizer.json a spec other than `tiktoken:...` names: a file, a folder holding
/// one, or `hf:ORG/NAME` (also `ORG/NAME` where no such path exists, as tokshuf-rs and
/// `from_pretrained` take it) in the local Hugging Face cache.
pub fn tokenizer_json_path(spec: &str) -> Result<PathBuf> {
    if let Some(repo) = spec.strip_prefix("hf:").or_else(|| hub_name(spec)) {
        return hf_cache_path(repo);
    }
    let p = PathBuf::from(spec);
    if !p.exists() {
        return Err(Error::Tokenizer(format!(
            "{spec}: no such tokenizer: give tiktoken:NAME (NAME one of {}), a tokenizer.json file or a folder holding one, or hf:ORG/NAME (or ORG/NAME) from the local Hugging Face cache",
            super::TIKTOKEN_NAMES.join(", ")
        )));
    }
    if p.is_dir() {
        return Ok(p.join("tokenizer.json"));
    }
    if !p.is_file() {
        // /dev/zero would be read until memory ran out; a FIFO would wait for a writer.
        return Err(Error::Tokenizer(format!("{spec}: not a regular file (a FIFO, socket or device)")));
    }
    Ok(p)
}

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
    fn decode(&self, ids: &[u32]) -> std::result::Result<String, String> {
        self.0.decode(ids, false).map_err(|e| format!("decode failed: {e}"))
    }
}

/// The `tokenizers` crate's tokenizer of a tokenizer.json, loaded when first used: the fast
/// backend needs it only to decode and for a document no scanner models.
struct LazyHf {
    path: PathBuf,
    bytes: Arc<Vec<u8>>,
    allow_special: bool,
    tok: OnceLock<std::result::Result<HfTokenizer, String>>,
}

impl LazyHf {
    fn get(&self) -> std::result::Result<&HfTokenizer, String> {
        let tok = self.tok.get_or_init(|| {
            load_hf(&self.path, &self.bytes, self.allow_special).map(|(t, _)| HfTokenizer(Arc::new(t))).map_err(|e| e.to_string())
        });
        tok.as_ref().map_err(Clone::clone)
    }
}

impl Encoder for LazyHf {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        self.get()?.encode_into(text, out)
    }
    fn decode(&self, ids: &[u32]) -> std::result::Result<String, String> {
        self.get()?.decode(ids)
    }
}

/// The `tokenizers` crate's tokenizer of a file, and the pad id of its padding section (which
/// is then cleared, as is truncation: a build keeps every id of a document).
fn load_hf(path: &Path, bytes: &[u8], allow_special: bool) -> Result<(tokenizers::Tokenizer, Option<u32>)> {
    let unusable = |e: String| Error::Tokenizer(format!("{}: not a usable tokenizer.json: {e}", path.display()));
    // The crate panics on some files it cannot use (a merge shorter than the continuing-
    // subword prefix): that is a bad file, not a bug of ours.
    let loaded = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes)).map_err(|panic| {
        let what = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        unusable(format!("the tokenizers library failed on it ({})", what.unwrap_or_default()))
    })?;
    let mut tok = loaded.map_err(|e| unusable(e.to_string()))?;
    if let tokenizers::ModelWrapper::BPE(bpe) = tok.get_model() {
        if let Some(p) = bpe.dropout.filter(|&p| p > 0.0) {
            return Err(unusable(format!(
                "BPE dropout {p} makes the ids random, and a cache must be a pure function of its inputs: set \"dropout\" to null"
            )));
        }
    }
    let pad_id = tok.get_padding().map(|p| p.pad_id);
    tok.set_encode_special_tokens(!allow_special);
    let _ = tok.with_padding(None).with_truncation(None);
    Ok((tok, pad_id))
}

/// A tokenizer.json as read, and the SHA-256 of its bytes where already computed.
pub(super) struct JsonFile {
    path: PathBuf,
    bytes: Vec<u8>,
    sha256: Option<String>,
}

impl JsonFile {
    pub(super) fn read(path: &Path) -> Result<JsonFile> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Ok(JsonFile { path: path.to_path_buf(), bytes, sha256: None })
    }

    /// The SHA-256 of its bytes, computed once (the load then reuses it).
    pub(super) fn sha256(&mut self) -> &str {
        let bytes = &self.bytes;
        self.sha256.get_or_insert_with(|| crate::format::hex(&Sha256::digest(bytes)))
    }
}

pub(super) fn load_tokenizer_json(spec: &str, file: JsonFile, allow_special: bool, backend: Backend) -> Result<Tokenizer> {
    load_saving_tables(spec, file, allow_special, backend, saved_tables::folder().as_deref())
}

/// `load_tokenizer_json`, with the fast backend's tables loaded from, or saved to, `tables`.
pub(super) fn load_saving_tables(
    spec: &str,
    file: JsonFile,
    allow_special: bool,
    backend: Backend,
    tables: Option<&Path>,
) -> Result<Tokenizer> {
    let JsonFile { path, bytes, sha256: known } = file;
    // (Not an `Arc<[u8]>`: that would copy the file, a millisecond for GPT-NeoX's.)
    let bytes = Arc::new(bytes);
    let fast = backend != Backend::Reference;
    let tables = tables.filter(|_| fast);
    let hash = || crate::format::hex(&Sha256::digest(bytes.as_slice()));
    let reference = || Arc::new(LazyHf { path: path.clone(), bytes: bytes.clone(), allow_special, tok: OnceLock::new() });
    // Tables saved by an earlier load are found by the file's hash: then nothing is parsed.
    let known = if tables.is_some() { Some(known.unwrap_or_else(hash)) } else { known };
    if let (Some(dir), Some(sha256)) = (tables, &known) {
        if let Some(Saved { tables: saved, special_ids: [eot_id, pad_id, bos_id], vocab_size }) = saved_tables::load(dir, sha256) {
            let model = MergeBpe::from_source(&saved.source);
            if let Ok(fast) = FastEncoder::from_tables(&saved, model, allow_special, reference()) {
                let (backend, encoder, sha256) = (FAST_BACKEND, Arc::new(fast), sha256.clone());
                return Ok(Tokenizer { spec: spec.to_string(), sha256, vocab_size, backend, eot_id, pad_id, bos_id, encoder });
            }
        }
    }
    let text = fast.then(|| needless_escapes_written_out(&bytes));
    // Beside the model: the hash, and the fast backend's class table.
    let (sha256, parts) = side_by_side(
        || {
            if fast {
                let _ = CharClasses::shared();
            }
            known.clone().unwrap_or_else(hash)
        },
        || text.as_deref().map(FastEncoder::tokenizer_json_parts),
    );
    // Where the fast backend models the whole file, added tokens included, the `tokenizers`
    // crate (0.1 s for GPT-NeoX) is loaded only if the reference is ever used.
    let parts = match parts {
        Some(Ok(p)) if p.knows_added_tokens() => {
            let [eot_id, pad_id, bos_id] = special_ids(|t| p.token_id(t));
            let pad_id = p.pad_id().or(pad_id);
            let vocab_size = id_bound(&path, p.max_id(), p.vocab_size())?;
            let built = p.into_tables().and_then(|(t, model)| Ok((FastEncoder::from_tables(&t, model, allow_special, reference())?, t)));
            match built {
                Ok((fast, made)) => {
                    if let Some(dir) = tables {
                        saved_tables::save(dir, &sha256, &Saved { tables: made, special_ids: [eot_id, pad_id, bos_id], vocab_size });
                    }
                    let (backend, encoder) = (FAST_BACKEND, Arc::new(fast));
                    return Ok(Tokenizer { spec: spec.to_string(), sha256, vocab_size, backend, eot_id, pad_id, bos_id, encoder });
                }
                Err(reason) => Some(Err(reason)),
            }
        }
        other => other,
    };
    let (tok, padding) = load_hf(&path, &bytes, allow_special)?;
    let [eot_id, pad_id, bos_id] = special_ids(|t| tok.token_to_id(t));
    let pad_id = padding.or(pad_id);
    let vocab_size = id_bound(&path, tok.get_vocab(true).into_values().max(), tok.get_vocab_size(true))?;
    let tok = Arc::new(tok);
    let reference: Arc<dyn Encoder> = Arc::new(HfTokenizer(tok.clone()));
    let (encoder, backend) = choose(spec, backend, (reference.clone(), "hf-tokenizers"), || {
        let parts = parts.unwrap_or_else(|| Err("not built".into()))?;
        FastEncoder::tokenizer_json(parts.with_added_tokens(crate_added_tokens(&tok)), allow_special, reference)
    })?;
    Ok(Tokenizer { spec: spec.to_string(), sha256, vocab_size, backend, eot_id, pad_id, bos_id, encoder })
}

/// What tokshuf records as `vocab_size`: a bound on the ids, so one above the largest. Ids
/// need not run 0..n-1 (a file may leave gaps): the count of tokens would then pick a dtype
/// too narrow for the largest. u32::MAX itself is refused, as the encoders' "no id".
fn id_bound(path: &Path, max_id: Option<u32>, count: usize) -> Result<u32> {
    match max_id {
        Some(u32::MAX) => {
            Err(Error::Tokenizer(format!("{}: token id 4294967295 (2**32 - 1) is beyond the ids tokshuf stores", path.display())))
        }
        top => Ok(top.map_or(0, |m| m + 1).max(count as u32)),
    }
}

/// The ids of the end-of-text, padding and beginning-of-text tokens, by the usual names.
fn special_ids(id_of: impl Fn(&str) -> Option<u32>) -> [Option<u32>; 3] {
    [EOT_CANDIDATES.as_slice(), &PAD_CANDIDATES, &BOS_CANDIDATES].map(|cands| cands.iter().find_map(|t| id_of(t)))
}

/// `ORG/NAME` when `spec` names a Hugging Face model rather than a path: one slash between
/// two names of the characters the Hub allows, and nothing of that name on disk.
pub fn hub_name(spec: &str) -> Option<&str> {
    let (org, name) = spec.split_once('/')?;
    let part =
        |s: &str| !s.is_empty() && !s.starts_with('.') && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (part(org) && part(name) && !Path::new(spec).exists()).then_some(spec)
}

/// The local cache folder of model `repo` (which may not exist).
fn repo_dir(repo: &str) -> PathBuf {
    let hub = if let Ok(p) = std::env::var("HF_HUB_CACHE") {
        PathBuf::from(p)
    } else if let Ok(p) = std::env::var("HF_HOME") {
        PathBuf::from(p).join("hub")
    } else {
        let home = std::env::var("HOME").unwrap_or_default();
        PathBuf::from(home).join(".cache/huggingface/hub")
    };
    hub.join(format!("models--{}", repo.replace('/', "--")))
}

/// `hf:ORG/NAME` -> tokenizer.json of the snapshot `refs/main` points to in the local cache.
fn hf_cache_path(repo: &str) -> Result<PathBuf> {
    let dir = repo_dir(repo);
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
                 downloads: fetch it once with `hf download {repo} tokenizer.json` (older huggingface_hub: \
                 `huggingface-cli download {repo} tokenizer.json`), or pass the path of a tokenizer.json",
            dir.display()
        ))
    })
}
