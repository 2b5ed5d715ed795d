//! Tokenizers by spec string (DESIGN §4) behind one small trait, so that a faster exact
//! backend can replace one without touching the pipeline.
//!
//! - `tiktoken:{r50k,p50k,cl100k,o200k}_base`: embedded ranks (`data/`, decoded by
//!   `build.rs`), tiktoken's pre-tokenizer regex, our own merge (see `bpe.rs`). Ids equal
//!   Python tiktoken's `encode_ordinary`, so special-token strings in text are ordinary text.
//! - a `tokenizer.json` path (or a folder holding one), or `hf:ORG/NAME` from the local
//!   Hugging Face cache: the `tokenizers` crate with `encode_special_tokens = true` and no
//!   added special tokens, i.e. Python's `encode(text, add_special_tokens=False)` with
//!   `encode_special_tokens = True`.
//!
//! Each has a reference backend (the above) and, where `fast.rs` models the configuration
//! exactly, the fast one; `Backend` chooses (`Auto`: fast where possible).

mod added_tokens;
pub mod bpe;
mod encoder;
pub mod fast;
mod hf_json;
pub mod hfbpe;
mod long_memo;
pub mod nfc;
mod pair_ranks;
mod pair_table;
pub mod piece_cache;
mod prefetch;
pub mod pretok;
mod rank_bpe;
mod saved_tables;
mod tiktoken;
mod token_table;
mod tokenizer_json;

pub use encoder::Encoder;
pub use tiktoken::{tiktoken_data, TIKTOKEN_NAMES};
pub use tokenizer_json::tokenizer_json_path;

use std::sync::{Arc, Mutex};

use self::tiktoken::load_tiktoken;
use self::tokenizer_json::{load_tokenizer_json, JsonFile};
use crate::error::{Error, Result};

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
        Tokenizer::load_from(spec, Source::of(spec)?, allow_special, backend)
    }

    fn load_from(spec: &str, source: Source, allow_special: bool, backend: Backend) -> Result<Tokenizer> {
        match source {
            Source::Tiktoken(_) if allow_special => {
                Err(Error::Config("allow_special_tokens is only supported for tokenizer.json tokenizers".into()))
            }
            Source::Tiktoken(name) => load_tiktoken(spec, name, backend),
            // A bare `ORG/NAME` is recorded as the `hf:` spec it resolves as.
            Source::Json(file) => {
                let spec = tokenizer_json::hub_name(spec).map_or_else(|| spec.to_string(), |repo| format!("hf:{repo}"));
                load_tokenizer_json(&spec, file, allow_special, backend)
            }
        }
    }

    /// `load`, remembered for the rest of the process (the last `KEPT`): a process that builds
    /// several caches with one tokenizer (a script building a training and a validation
    /// cache, a Ray worker's tasks) loads it once, where loading GPT-NeoX's tokenizer.json is a
    /// quarter of a 10 MB build. A tokenizer.json is known by the SHA-256 of the file its spec
    /// names now (an `hf:` spec follows the cache's `refs/main`): a file replaced or edited is
    /// loaded again, whatever its size and modification time say. Reading and hashing it is a
    /// tenth of loading it.
    pub fn load_shared(spec: &str, allow_special: bool, backend: Backend) -> Result<Tokenizer> {
        const KEPT: usize = 4;
        static LOADED: Mutex<Vec<(String, Tokenizer)>> = Mutex::new(Vec::new());
        let mut source = Source::of(spec)?;
        let content = match &mut source {
            Source::Json(file) => file.sha256().to_string(),
            Source::Tiktoken(_) => String::new(),
        };
        let key = format!("{spec}\0{allow_special}\0{backend:?}\0{content}");
        if let Some(tok) = LOADED.lock().ok().and_then(|l| l.iter().find(|(k, _)| *k == key).map(|(_, t)| t.clone())) {
            return Ok(tok);
        }
        // The file as read and hashed above: the load neither reads nor hashes it again.
        let tok = Tokenizer::load_from(spec, source, allow_special, backend)?;
        if let Ok(mut loaded) = LOADED.lock() {
            // Two threads may have loaded it at once: one entry is enough.
            if !loaded.iter().any(|(k, _)| *k == key) {
                if loaded.len() >= KEPT {
                    loaded.remove(0);
                }
                loaded.push((key, tok.clone()));
            }
        }
        Ok(tok)
    }
}

/// What a spec names: an embedded tiktoken encoding, or a tokenizer.json (read).
enum Source<'a> {
    Tiktoken(&'a str),
    Json(JsonFile),
}

impl Source<'_> {
    fn of(spec: &str) -> Result<Source<'_>> {
        Ok(match spec.strip_prefix("tiktoken:") {
            Some(name) => Source::Tiktoken(name),
            None => Source::Json(JsonFile::read(&tokenizer_json_path(spec)?)?),
        })
    }
}

/// `(a(), b())`, `a` on a thread of its own: a tokenizer's load uses two cores without a
/// thread pool (none is started outside a build). Should `a` panic there, it runs again here.
fn side_by_side<A: Send, B>(a: impl Fn() -> A + Sync, b: impl FnOnce() -> B) -> (A, B) {
    std::thread::scope(|sc| {
        let h = sc.spawn(&a);
        let b = b();
        (h.join().unwrap_or_else(|_| a()), b)
    })
}

/// The fast encoder if `backend` wants it and `fast` could build it, else the reference.
pub(super) fn choose(
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
        assert_eq!(c.encoder.decode(&out).unwrap(), "hello world<|endoftext|>");
        assert!(!out.contains(&100257));
    }

    /// A process loads a tokenizer once for all its builds, and again once its file changed.
    #[test]
    fn shared_loads_are_reused_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let file = |merges: &[&str]| {
            let vocab: serde_json::Map<String, serde_json::Value> = hfbpe::byte_level_alphabet()
                .iter()
                .enumerate()
                .map(|(i, c)| (c.to_string(), i.into()))
                .chain([("ab".to_string(), 256.into()), ("ba".to_string(), 257.into())])
                .collect();
            let json = serde_json::json!({
                "added_tokens": [],
                "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
                "model": {"type": "BPE", "vocab": vocab, "merges": merges},
            });
            std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        };
        let ids = |t: &Tokenizer| {
            let mut out = vec![];
            t.encoder.encode_into("abab", &mut out).unwrap();
            out
        };
        file(&[]);
        let spec = path.to_str().unwrap();
        let first = Tokenizer::load_shared(spec, false, Backend::Auto).unwrap();
        let again = Tokenizer::load_shared(spec, false, Backend::Auto).unwrap();
        assert!(Arc::ptr_eq(&first.encoder, &again.encoder));
        assert_eq!(ids(&again), [97, 98, 97, 98]);
        // Another backend or option is another tokenizer.
        let reference = Tokenizer::load_shared(spec, false, Backend::Reference).unwrap();
        assert!(!Arc::ptr_eq(&first.encoder, &reference.encoder));
        // The file rewritten: loaded again, with its merge.
        file(&["a b"]);
        let edited = Tokenizer::load_shared(spec, false, Backend::Auto).unwrap();
        assert!(!Arc::ptr_eq(&first.encoder, &edited.encoder));
        assert_ne!(edited.sha256, first.sha256);
        assert_eq!(ids(&edited), [256, 256]);
        // Rewritten to the same size with its old modification time: known by its bytes.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        file(&["b a"]);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
        let same_size = Tokenizer::load_shared(spec, false, Backend::Auto).unwrap();
        assert_eq!(ids(&same_size), [97, 257, 98]);
    }

    #[test]
    fn unknown_specs_are_errors() {
        assert!(matches!(Tokenizer::load("tiktoken:nope", false, Backend::Auto), Err(Error::Tokenizer(_))));
        assert!(matches!(Tokenizer::load("/no/such/tokenizer.json", false, Backend::Auto), Err(Error::Tokenizer(_))));
        assert!(matches!(Tokenizer::load_shared("/no/such/tokenizer.json", false, Backend::Auto), Err(Error::Tokenizer(_))));
        assert!(matches!(Tokenizer::load_shared("tiktoken:r50k_base", true, Backend::Auto), Err(Error::Config(_))));
        assert!(matches!(Tokenizer::load("hf:no-org/no-model", false, Backend::Auto), Err(Error::Tokenizer(_))));
        match Tokenizer::load("no-org/no-model", false, Backend::Auto) {
            Err(Error::Tokenizer(m)) => assert!(m.contains("hf download no-org/no-model tokenizer.json"), "{m}"),
            other => panic!("{:?}", other.map(|t| t.spec)),
        }
    }
}
