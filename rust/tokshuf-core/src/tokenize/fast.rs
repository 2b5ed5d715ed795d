//! The fast tokenizer backend: byte-level BPE with ids exactly equal to the reference
//! libraries, for the tiktoken encodings and the tokenizer.json files of the GPT-2 /
//! GPT-NeoX / Llama-3 family.
//!
//! Why tokshuf has its own backend rather than a crate from crates.io is in
//! docs/fast-tokenizer.md; its measured speed, round by round, in docs/performance.md.
//!
//! HOW IT IS FAST
//! - Pre-tokenization by hand-written scanners (`pretok`), one per pattern family, with
//!   the reference engines' character classes, and ASCII fast paths (runs of ASCII letters
//!   measured 16 bytes at a time); over plain ASCII the pieces of 64 bytes are found at once
//!   from masks of their classes (`pretok/blocks.rs`).
//! - A per-thread memo of pre-token -> ids (`piece_cache.rs`, bounded; short pieces need no
//!   allocation): most pre-tokens are merged once per thread.
//! - Lookups that do not wait on memory: the memo and the tables behind it are far larger
//!   than the CPU caches, so pieces are looked up in batches of 64 after the scanner found
//!   them, each one's cache line requested when it was found (`piece_cache::Lookahead`),
//!   and the tables read one line per lookup (`token_table.rs`, `pair_table.rs`), on huge pages
//!   (`big_table.rs`); a merge requests the lines of the lookups its first rounds will make
//!   before making them.
//! - Little fixed cost per build, which matters below a few GB: the class table is read
//!   from regex-syntax rather than scanned (beside a tokenizer.json's parse), and
//!   the table of characters NFC never changes built only for an NFC normalizer (`nfc.rs`);
//!   tiktoken ranks are embedded already decoded (`build.rs`), their hash recorded rather
//!   than computed, and the reference's merge and regex only built if used; a
//!   tokenizer.json is read in one pass into typed structs, its strings borrowed from the
//!   file (`hf_json.rs`), and the `tokenizers` crate loaded only if the reference is used;
//!   nothing on the build path imports NumPy (whose OpenBLAS threads spin at import).
//! - Merging (on memo misses only) on integer pairs (`hfbpe.rs`), tiktoken's ranks turned
//!   into a merge list; a piece that is a token of its own is found in one lookup (for
//!   tokenizer.json files without `ignore_merges`, the short tokens whose own merge ends in
//!   them, which the first merge of each tells); O(n log n) on long pieces.
//! - NFC only where a character could change: a byte scan, then a per-character table.
//!
//! HOW IT STAYS EXACT
//! - Only configurations modelled here are accepted (`FastEncoder::tiktoken`,
//!   `tokenizer_json_parts` and `tokenizer_json` return the reason otherwise, and the
//!   reference is used): known pre-tokenizer patterns, no normalizer or an NFC one, BPE
//!   without dropout, prefixes or suffixes, every byte UTF-8 text can hold in the
//!   vocabulary, added tokens without lstrip/rstrip/single_word and unique after
//!   normalization.
//! - Added tokens follow `tokenizers`' AddedVocabulary: tokens that are not `normalized`
//!   are found on the raw text, the others on each normalized piece, leftmost-longest; with
//!   `encode_special_tokens` a special token's match is skipped but still consumed. Their
//!   ids are those the crate gives them on load (`hf_json::added_token_ids`); where that is
//!   not plain (repeated contents, a sparse vocabulary), the crate is loaded and asked.
//! - A document on which a scanner finds no match for some position (impossible for the
//!   supported patterns) is encoded by the reference instead.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;
use unicode_normalization_alignments::UnicodeNormalization;

use crate::tokenize::added_tokens::{segments, Matcher, Seg};
use crate::tokenize::bpe::TokenList;
use crate::tokenize::encoder::Encoder;
use crate::tokenize::hf_json::{added_token_ids, AddedToken, BpeModel, ModelHead, TokenizerFile, Vocab};
use crate::tokenize::hfbpe::{MergeBpe, MergeSource};
use crate::tokenize::nfc::NfcSafe;
use crate::tokenize::piece_cache::{Lookahead, PieceCache};
use crate::tokenize::pretok::{Engine, Pattern, PreTokenizer};
use crate::tokenize::rank_bpe::RankBpe;
use crate::tokenize::token_table::TokenTable;

/// Slots of each thread's memo: 2^18 x 32 bytes = 8 MiB per thread and tokenizer, allocated
/// when the thread first encodes with it. On the 100 MB subset, 2^16 slots missed 5.6 % of pieces and 2^18
/// 3.5 % (2.7 % are new pieces), which made it 1.5x faster.
const CACHE_BITS: u32 = 18;
/// Memos kept per thread (one per tokenizer in use); the oldest is dropped beyond this.
const CACHES_PER_THREAD: usize = 4;

/// How pieces the memo does not hold are merged.
enum Model {
    /// tokenizer.json: the merge list, ranks of pairs of ids.
    Merges(MergeBpe),
    /// tiktoken: ranks of the merged bytes.
    Ranks(RankBpe),
}

impl Model {
    #[inline]
    fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        match self {
            Model::Merges(m) => m.encode_piece(piece, out),
            Model::Ranks(r) => r.encode_piece(piece, out),
        }
    }

    /// The tokens of up to `MAX_LEN` bytes, where `encode_piece` looks first.
    fn short_tokens(&self) -> &TokenTable {
        match self {
            Model::Merges(m) => m.short_tokens(),
            Model::Ranks(r) => r.short_tokens(),
        }
    }
}

struct ThreadState {
    uid: u64,
    cache: PieceCache,
}

thread_local! {
    static STATES: RefCell<Vec<ThreadState>> = const { RefCell::new(Vec::new()) };
}

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// See `FastEncoder::tokenizer_json_parts`.
pub struct JsonParts<'a> {
    /// Whether the normalizer is NFC (else there is none).
    nfc: bool,
    pattern: Pattern,
    model: MergeBpe,
    source: MergeSource,
    vocab: Vocab<'a>,
    /// The added tokens by the ids the `tokenizers` crate gives them, if found without it.
    added: Option<Vec<(u32, AddedToken)>>,
    /// The pad id of the padding section.
    pad_id: Option<u32>,
}

/// All a tokenizer.json's fast encoder is made from, without its strings: what
/// `saved_tables` keeps on disk.
pub struct JsonTables {
    /// Whether the normalizer is NFC (else there is none).
    pub nfc: bool,
    pub pattern: Pattern,
    pub source: MergeSource,
    /// The added tokens by their ids.
    pub added: Vec<(u32, AddedToken)>,
}

impl<'a> JsonParts<'a> {
    /// Are the added tokens known without the `tokenizers` crate (see
    /// `hf_json::added_token_ids`)? `vocab_size` and `token_id` are those of the crate then.
    pub fn knows_added_tokens(&self) -> bool {
        self.added.is_some()
    }

    /// The same parts with the added tokens the crate loaded (`hf_json::crate_added_tokens`).
    pub fn with_added_tokens(self, added: Vec<(u32, AddedToken)>) -> JsonParts<'a> {
        JsonParts { added: Some(added), ..self }
    }

    /// The vocabulary's size with the added tokens, as `get_vocab_size(true)`.
    pub fn vocab_size(&self) -> usize {
        let added = self.added.as_deref().unwrap_or_default();
        self.vocab.len() + added.iter().filter(|(_, t)| !self.vocab.contains_key(t.content.as_str())).count()
    }

    /// The tables (if the added tokens are known) and the merge model made from them.
    pub fn into_tables(self) -> Result<(JsonTables, MergeBpe), String> {
        let JsonParts { nfc, pattern, model, source, added, .. } = self;
        let added = added.ok_or("the added tokens' ids are not known")?;
        Ok((JsonTables { nfc, pattern, source, added }, model))
    }

    /// The pad id the file's padding section names, if it has one.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// The largest id of the vocabulary and the added tokens.
    pub fn max_id(&self) -> Option<u32> {
        let added = self.added.as_deref().unwrap_or_default();
        self.vocab.values().chain(added.iter().map(|(id, _)| id)).max().copied()
    }

    /// The id of `token`, an added token's first, as `token_to_id`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        let added = self.added.as_deref().unwrap_or_default();
        added.iter().find(|(_, t)| t.content == token).map(|&(id, _)| id).or_else(|| self.vocab.get(token).copied())
    }
}

pub struct FastEncoder {
    uid: u64,
    pretok: PreTokenizer,
    model: Model,
    /// With an NFC normalizer, the characters it never changes.
    nfc: Option<Arc<NfcSafe>>,
    raw_added: Option<Matcher>,
    normalized_added: Option<Matcher>,
    reference: Arc<dyn Encoder>,
}

impl FastEncoder {
    /// A tiktoken encoding with pre-tokenizer `pattern`; `Err(reason)` if not modelled.
    pub fn tiktoken(pattern: &str, list: &TokenList, reference: Arc<dyn Encoder>) -> Result<FastEncoder, String> {
        let p = Pattern::recognise(pattern, Engine::FancyRegex).ok_or("pre-tokenizer pattern not recognised")?;
        Ok(FastEncoder {
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            pretok: PreTokenizer::new(p).map_err(|e| e.to_string())?,
            model: Model::Ranks(RankBpe::new(list)?),
            nfc: None,
            raw_added: None,
            normalized_added: None,
            reference,
        })
    }

    /// The parts of the encoder of a tokenizer.json read from its bytes (with its added
    /// tokens, where that needs no `tokenizers` crate); `Err(reason)` if its configuration
    /// is not one this backend models exactly.
    pub fn tokenizer_json_parts(bytes: &[u8]) -> Result<JsonParts<'_>, String> {
        // One SIMD check of the whole text, rather than serde's check of every string and raw
        // value it borrows (a millisecond of GPT-NeoX's load).
        let text =
            simdutf8::compat::from_utf8(bytes).map_err(|e| format!("not a tokenizer.json: not UTF-8 after byte {}", e.valid_up_to()))?;
        let file: TokenizerFile = serde_json::from_str(text).map_err(|e| format!("not a tokenizer.json: {e}"))?;
        let nfc = match &file.normalizer {
            None => false,
            Some(n) => match normalizer_is_nfc(n) {
                Some(nfc) => nfc,
                None => return Err(format!("normalizer {} is not supported", short(n))),
            },
        };
        let pattern = match &file.pre_tokenizer {
            Some(p) => pre_tokenizer_pattern(p).ok_or_else(|| format!("pre_tokenizer {} is not supported", short(p)))?,
            None => return Err("no pre_tokenizer (not byte-level)".into()),
        };
        let head = file.model.ok_or("no model")?;
        check_bpe_model(&head)?;
        let ignore_merges = head.ignore_merges.as_ref().and_then(Value::as_bool).unwrap_or(false);
        let body = BpeModel::parse(&head)?;
        let added = added_token_ids(file.added_tokens, &body.vocab);
        // The crate's default pad id is 0.
        let pad_id = file.padding.filter(|p| !p.is_null()).map(|p| p.get("pad_id").and_then(Value::as_u64).unwrap_or(0) as u32);
        let (model, source) = MergeBpe::from_model(&body, ignore_merges)?;
        Ok(JsonParts { nfc, pattern, model, source, vocab: body.vocab, added, pad_id })
    }

    /// The encoder of a tokenizer.json from its `parts`, their added tokens known (read from
    /// the file, or `with_added_tokens`); `Err(reason)` if its added tokens are not modelled.
    pub fn tokenizer_json(parts: JsonParts<'_>, allow_special: bool, reference: Arc<dyn Encoder>) -> Result<FastEncoder, String> {
        let (tables, model) = parts.into_tables()?;
        FastEncoder::from_tables(&tables, model, allow_special, reference)
    }

    /// The encoder of a tokenizer.json from its `tables` and the `model` made from them
    /// (`JsonParts::into_tables`, or `MergeBpe::from_source` of tables saved on disk).
    pub fn from_tables(
        tables: &JsonTables,
        model: MergeBpe,
        allow_special: bool,
        reference: Arc<dyn Encoder>,
    ) -> Result<FastEncoder, String> {
        let nfc = tables.nfc.then(NfcSafe::shared);
        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        for (id, t) in &tables.added {
            if t.single_word || t.lstrip || t.rstrip {
                return Err(format!("added token {:?} uses single_word/lstrip/rstrip", t.content));
            }
            let skip = t.special && !allow_special;
            if t.normalized {
                let content = if nfc.is_some() { t.content.nfc().map(|(c, _)| c).collect() } else { t.content.clone() };
                normalized.push((content, *id, skip));
            } else {
                raw.push((t.content.clone(), *id, skip));
            }
        }
        // All-skipped raw tokens never split anything; with no split, the normalizer runs
        // on the whole text.
        let raw_added = if raw.iter().all(|&(_, _, skip)| skip) { None } else { Matcher::build(raw)? };
        let normalized_added = if normalized.iter().all(|&(_, _, skip)| skip) { None } else { Matcher::build(normalized)? };
        Ok(FastEncoder {
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            pretok: PreTokenizer::new(tables.pattern).map_err(|e| e.to_string())?,
            model: Model::Merges(model),
            nfc,
            raw_added,
            normalized_added,
            reference,
        })
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut ThreadState) -> R) -> R {
        STATES.with(|cell| {
            let mut states = cell.borrow_mut();
            let i = match states.iter().position(|s| s.uid == self.uid) {
                Some(i) => i,
                None => {
                    if states.len() >= CACHES_PER_THREAD {
                        states.remove(0);
                    }
                    states.push(ThreadState { uid: self.uid, cache: PieceCache::new(CACHE_BITS) });
                    states.len() - 1
                }
            };
            f(&mut states[i])
        })
    }

    /// Pre-tokenize and merge `text`, or with `added` each piece of it between added tokens
    /// (their ids in place), all through one lookahead (so that GPT-NeoX's space-run tokens,
    /// which cut code at every indent, do not drain it); `Err` if a scanner met a position
    /// it does not model.
    #[inline]
    fn encode_plain(&self, text: &str, added: Option<&Matcher>, out: &mut Vec<u32>, st: &mut ThreadState) -> Result<(), usize> {
        let model = &self.model;
        let encode = |p: &[u8], o: &mut Vec<u32>| model.encode_piece(p, o);
        let mut pieces = Lookahead::new(&mut st.cache, model.short_tokens(), text.as_bytes(), out, encode);
        if added.is_none() {
            self.pretok.split_ranges(text, |s, e| pieces.push(s, e))?;
        } else {
            let mut result = Ok(());
            segments(added, text, |seg| match seg {
                Seg::Token(id) => pieces.push_id(id),
                Seg::Text(t) if result.is_ok() => {
                    let at = t.as_ptr() as usize - text.as_ptr() as usize;
                    result = self.pretok.split_ranges(t, |s, e| pieces.push(at + s, at + e));
                }
                Seg::Text(_) => {}
            });
            result?;
        }
        pieces.finish();
        Ok(())
    }

    fn encode_normalized(&self, text: &str, out: &mut Vec<u32>, st: &mut ThreadState) -> Result<(), usize> {
        let text: Cow<str> = if self.nfc.as_ref().is_some_and(|t| t.may_change(text)) {
            Cow::Owned(text.nfc().map(|(c, _)| c).collect())
        } else {
            Cow::Borrowed(text)
        };
        self.encode_plain(&text, self.normalized_added.as_ref(), out, st)
    }

    fn encode_fast(&self, text: &str, out: &mut Vec<u32>) -> Result<(), usize> {
        // Rarely more than one id per 2 bytes: pushes then never reallocate.
        out.reserve(text.len() / 2 + 16);
        self.with_state(|st| {
            if self.raw_added.is_none() {
                return self.encode_normalized(text, out, st);
            }
            let mut result = Ok(());
            segments(self.raw_added.as_ref(), text, |seg| match seg {
                Seg::Token(id) => out.push(id),
                Seg::Text(t) => {
                    if result.is_ok() {
                        result = self.encode_normalized(t, out, st);
                    }
                }
            });
            result
        })
    }
}

impl Encoder for FastEncoder {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        let start = out.len();
        if self.encode_fast(text, out).is_err() {
            out.truncate(start);
            return self.reference.encode_into(text, out);
        }
        Ok(())
    }
    fn decode(&self, ids: &[u32]) -> std::result::Result<String, String> {
        self.reference.decode(ids)
    }
}

/// `Some(true)`: NFC; `Some(false)`: nothing; `None`: anything else.
fn normalizer_is_nfc(n: &Value) -> Option<bool> {
    match n.get("type")?.as_str()? {
        "NFC" => Some(true),
        "Sequence" => {
            let list = n.get("normalizers")?.as_array()?;
            match list.as_slice() {
                [] => Some(false),
                [one] => normalizer_is_nfc(one),
                _ => None,
            }
        }
        _ => None,
    }
}

fn is_byte_level(p: &Value, use_regex: bool) -> bool {
    p.get("type").and_then(Value::as_str) == Some("ByteLevel")
        && p.get("add_prefix_space").and_then(Value::as_bool) == Some(false)
        && p.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == use_regex
}

/// The scanner for a supported pre_tokenizer: ByteLevel with its regex, or
/// Split(known regex, Isolated) followed by ByteLevel without regex.
fn pre_tokenizer_pattern(p: &Value) -> Option<Pattern> {
    if is_byte_level(p, true) {
        return Some(Pattern::Gpt2);
    }
    if p.get("type")?.as_str()? != "Sequence" {
        return None;
    }
    let [split, bl] = p.get("pretokenizers")?.as_array()?.as_slice() else { return None };
    if !is_byte_level(bl, false)
        || split.get("type")?.as_str()? != "Split"
        || split.get("behavior")?.as_str()? != "Isolated"
        || split.get("invert").and_then(Value::as_bool).unwrap_or(false)
    {
        return None;
    }
    Pattern::recognise(split.get("pattern")?.get("Regex")?.as_str()?, Engine::Onig)
}

fn check_bpe_model(m: &ModelHead) -> Result<(), String> {
    if m.kind.as_ref().and_then(Value::as_str) != Some("BPE") {
        return Err(format!("model {} is not BPE", short(m.kind.as_ref().unwrap_or(&Value::Null))));
    }
    let unset = |v: &Option<Value>| match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        _ => false,
    };
    for (k, v) in [("continuing_subword_prefix", &m.continuing_subword_prefix), ("end_of_word_suffix", &m.end_of_word_suffix)] {
        if !unset(v) {
            return Err(format!("BPE {k} is not supported"));
        }
    }
    match &m.dropout {
        None | Some(Value::Null) => {}
        Some(d) if d.as_f64() == Some(0.0) => {}
        Some(_) => return Err("BPE dropout is not supported".into()),
    }
    Ok(())
}

fn short(v: &Value) -> String {
    let s = v.get("type").map(|t| t.to_string()).unwrap_or_else(|| v.to_string());
    s.chars().take(80).collect()
}
