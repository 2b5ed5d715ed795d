//! What tokshuf.json holds (DESIGN §2): the recipe that decides a cache's bytes, its enums, and
//! what stage 1 records about each input file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const FORMAT_VERSION: u32 = 1;
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tail {
    Stitch,
    Pad,
    Drop,
}

/// How documents become contexts (DESIGN §9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// Documents run together and are cut every `seqlen` ids.
    #[default]
    Concat,
    /// Best-fit decreasing over a window of documents: no document that fits is split.
    Bestfit,
    /// Every document (cut at `seqlen`) is an example of its own length, in length bins.
    #[serde(rename = "none")]
    Unpacked,
}

impl Packing {
    pub fn is_concat(&self) -> bool {
        *self == Packing::Concat
    }
    pub fn is_unpacked(&self) -> bool {
        *self == Packing::Unpacked
    }
}

/// What the input files hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// jsonl documents, tokenized and windowed (DESIGN §4).
    #[default]
    Jsonl,
    /// Tar shards of contexts (a tokshuf or tokshuf-rs cache's): each member is one context,
    /// taken as it is and shuffled again (`--shuffle-only`).
    Shards,
}

impl InputKind {
    pub fn is_jsonl(&self) -> bool {
        *self == InputKind::Jsonl
    }
}

/// How contexts are stored in a shard's tar members (DESIGN §3, docs/format.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Format {
    /// One 1-D npy array per context.
    #[serde(rename = "npy")]
    Npy,
    /// One gzipped JSON list per context.
    #[serde(rename = "json.gz")]
    JsonGz,
    /// One 2-D npy array of `block_size` contexts per member.
    #[serde(rename = "blocks")]
    Blocks,
    /// The `blocks` members, each compressed as one zstd frame.
    #[serde(rename = "blocks.zst")]
    BlocksZst,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Npy => "npy",
            Format::JsonGz => "json.gz",
            Format::Blocks => "blocks",
            Format::BlocksZst => "blocks.zst",
        }
    }
    /// Members hold `block_size` contexts each.
    pub fn is_blocked(self) -> bool {
        matches!(self, Format::Blocks | Format::BlocksZst)
    }
    /// Members differ in size: a shard is indexed by a scan of its tar headers.
    pub fn variable_members(self) -> bool {
        matches!(self, Format::JsonGz | Format::BlocksZst)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorPolicy {
    Raise,
    Skip,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    Uint16,
    Uint32,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::Uint16 => 2,
            Dtype::Uint32 => 4,
        }
    }
    pub fn descr(self) -> &'static str {
        match self {
            Dtype::Uint16 => "<u2",
            Dtype::Uint32 => "<u4",
        }
    }
}

/// One input file as recorded in tokshuf.json.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    pub path: String,
    pub bytes: u64,
}

/// The part of tokshuf.json that decides the output: a resumed build must match it exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    pub tokshuf_version: String,
    pub format_version: u32,
    pub inputs: Vec<InputFile>,
    pub tokenizer: TokenizerInfo,
    pub seqlen: u32,
    pub chunk_size: u32,
    pub num_local_cells: Option<u64>,
    pub seed: u64,
    pub text_key: String,
    pub format: Format,
    pub tail: Tail,
    pub eot_id: u32,
    pub pad_id: u32,
    pub bos_id: Option<u32>,
    pub allow_special_tokens: bool,
    pub shuffle: bool,
    pub errors: ErrorPolicy,
    pub dtype: Dtype,
    /// Absent (concat) in caches made before packing modes existed, so their recipes match.
    #[serde(default, skip_serializing_if = "Packing::is_concat")]
    pub packing: Packing,
    /// Documents per best-fit window (bestfit only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack_window: Option<u64>,
    /// Unpacked caches: the length bins' upper bounds, ascending, the last one `seqlen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bins: Option<Vec<u32>>,
    /// Contexts per member (block formats only, so other recipes are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    /// zstd level of the members (`blocks.zst` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zstd_level: Option<i32>,
    /// Absent (jsonl) in caches made before shards could be inputs, so their recipes match.
    #[serde(default, skip_serializing_if = "InputKind::is_jsonl")]
    pub input_kind: InputKind,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenizerInfo {
    pub spec: String,
    pub sha256: String,
    pub vocab_size: u32,
    pub backend: String,
}

/// Two tokenizers are the same when their data and implementation are: the spec is only how
/// it was named (a relative or absolute path, `hf:ORG/NAME`), so a build resumes however its
/// tokenizer is spelled.
impl PartialEq for TokenizerInfo {
    fn eq(&self, other: &Self) -> bool {
        (&self.sha256, self.vocab_size, &self.backend) == (&other.sha256, other.vocab_size, &other.backend)
    }
}

impl Eq for TokenizerInfo {}

impl Recipe {
    /// Whether stage 1 leaves tails to stitch into one more file (one more spill and summary,
    /// DESIGN §4): concat with tail "stitch" (best fit stitches an empty one); unpacked builds
    /// and shard inputs have no tails.
    pub fn stitches_tails(&self) -> bool {
        self.tail == Tail::Stitch && !self.packing.is_unpacked() && self.input_kind.is_jsonl()
    }

    /// Names of the fields that differ, for an error that says what changed.
    pub fn differences(&self, other: &Recipe) -> Vec<String> {
        let a = serde_json::to_value(self).unwrap_or_default();
        let b = serde_json::to_value(other).unwrap_or_default();
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return vec!["recipe".into()] };
        // Fields at their default are left out of a recipe, so either side may lack a key.
        let show = |v: Option<&Value>| v.map_or_else(|| "default".to_string(), Value::to_string);
        a.keys()
            .chain(b.keys().filter(|k| !a.contains_key(*k)))
            .filter(|k| if *k == "tokenizer" { self.tokenizer != other.tokenizer } else { a.get(*k) != b.get(*k) })
            .map(|k| {
                if k == "inputs" {
                    let inputs_a: Vec<_> = self.inputs.iter().collect();
                    let changed: Vec<String> =
                        other.inputs.iter().filter(|f| !inputs_a.contains(f)).map(|f| f.path.clone()).take(3).collect();
                    format!(
                        "inputs (new or changed: {})",
                        if changed.is_empty() { "files removed".to_string() } else { changed.join(", ") }
                    )
                } else {
                    format!("{k} ({} -> {})", show(a.get(k)), show(b.get(k)))
                }
            })
            .collect()
    }
}

/// What stage 1 learned about one input file; its JSON file in the work folder marks the
/// file as done.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FileSummary {
    pub num_contexts: u64,
    pub num_documents: u64,
    pub empty_documents: u64,
    pub blank_lines: u64,
    pub num_tokens: u64,
    pub text_bytes: u64,
    pub dropped_tokens: u64,
    /// (position, padding ids) of contexts that end in padding.
    pub padded: Vec<(u64, u32)>,
    /// Ids left over after the last whole context (stitch policy only).
    pub tail: Vec<u32>,
    pub skipped: BTreeMap<String, u64>,
    pub skipped_examples: BTreeMap<String, Vec<String>>,
    /// Documents cut across contexts, and how many concat would have cut (bestfit only).
    #[serde(default)]
    pub documents_split: u64,
    #[serde(default)]
    pub concat_documents_split: u64,
    /// Unpacked builds: examples and real tokens of this file in each length bin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bin_examples: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bin_tokens: Vec<u64>,
    /// CRC-32 of the spill as written, and of each bin's positions file (unpacked builds): a
    /// resumed build checks the spills a killed run left (`resume::check_spills`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_crc32: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pos_crc32: Vec<u32>,
}

impl FileSummary {
    /// This summary without its tail: what a build keeps in memory, the tails staying in the
    /// summaries on disk until the stitch reads them back one at a time.
    pub fn without_tail(self) -> FileSummary {
        FileSummary { tail: Vec::new(), ..self }
    }
}

/// How far a build is. It only ever moves forward: building (shuffled) or streaming
/// (`shuffle=False`) while stage 1 runs, writing once the whole chunk plan is known, complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Building,
    Streaming,
    Writing,
    Complete,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Building => "building",
            Status::Streaming => "streaming",
            Status::Writing => "writing",
            Status::Complete => "complete",
        }
    }
    /// tokshuf.json holds the final chunk plan (num_chunks, num_contexts, chunk_sizes).
    pub fn planned(self) -> bool {
        matches!(self, Status::Writing | Status::Complete)
    }
}

/// The cache's figures, known once stage 1 is done (status "writing" and "complete").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// The cells of the shuffle; null for streaming builds.
    pub num_local_cells: Option<u64>,
    pub num_documents: u64,
    pub num_tokens: u64,
    pub num_padding_tokens: u64,
    pub dropped_tokens: u64,
    pub empty_documents: u64,
    pub blank_lines: u64,
    pub text_bytes: u64,
    pub bytes_in: u64,
    pub skipped: BTreeMap<String, u64>,
    pub skipped_examples: BTreeMap<String, Vec<String>>,
    /// What packing did (bestfit caches only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing_stats: Option<PackingFigures>,
}

/// How well best-fit packing did, and what concat would have done with the same documents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PackingFigures {
    pub mode: Packing,
    /// Padding ids over all ids stored.
    pub padding_fraction: f64,
    /// Documents cut into more than one context (only those longer than seqlen).
    pub documents_split: u64,
    /// Documents concat would have cut across contexts.
    pub concat_documents_split: u64,
}

/// tokshuf.json. The builder writes every field; a reader needs only the layout and the plan,
/// so the rest is optional when reading (caches made by other tools, or by tests, stay
/// readable). Written with sorted keys (through `serde_json::Value`), so its bytes never
/// depend on field order here.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metadata {
    pub format_version: u32,
    pub status: Status,
    pub seqlen: u64,
    pub dtype: Dtype,
    pub format: Format,
    pub chunk_size: u64,
    #[serde(default = "yes")]
    pub shuffle: bool,
    /// What decides the bytes (a `Recipe` when tokshuf wrote it); the cache's fingerprint.
    pub recipe: Value,
    /// R* readers should use when none is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ideal_readers: Option<u64>,
    /// Contexts per member (block formats only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokshuf_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eot_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "present")]
    pub bos_id: Option<Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<Tail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<ErrorPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<InputFile>>,
    /// How documents became contexts (absent: concat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<Packing>,
    /// The chunk plan (from status "writing" on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_chunks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_contexts: Option<u64>,
    /// Per chunk (streaming builds, whose chunks vary); null for shuffled builds.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "present")]
    pub chunk_sizes: Option<Option<Vec<u64>>>,
    /// The cache's figures (from status "writing" on).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<Totals>,
    /// Chunks written so far while a streaming build runs.
    /// Unpacked caches: one entry per length bin (sub-cache `bin_KK/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bins: Option<Vec<BinInfo>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_chunks_ready: Option<u64>,
    /// Bytes of all shards (complete caches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_out: Option<u64>,
    /// What varies by run (durations, peak memory, threads, host): the one part of a cache
    /// that is not a pure function of its recipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<Value>,
}

/// One length bin of an unpacked cache, as tokshuf.json records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinInfo {
    /// Longest example of the bin; the shortest is one more than the previous bin's bound.
    pub max_len: u64,
    pub num_chunks: u64,
    pub num_examples: u64,
    /// Real ids of its examples (there is no padding in an unpacked cache).
    pub num_tokens: u64,
}

fn yes() -> bool {
    true
}

impl Metadata {
    /// The metadata of a build of `recipe` at `status`, before any figures are known.
    pub fn new(recipe: &Recipe, status: Status, build: Value) -> Self {
        Metadata {
            format_version: FORMAT_VERSION,
            status,
            seqlen: recipe.seqlen as u64,
            dtype: recipe.dtype,
            format: recipe.format,
            chunk_size: recipe.chunk_size as u64,
            shuffle: recipe.shuffle,
            recipe: serde_json::to_value(recipe).unwrap_or_default(),
            ideal_readers: None,
            block_size: recipe.block_size,
            tokshuf_version: Some(VERSION.to_string()),
            tokenizer: Some(recipe.tokenizer.clone()),
            eot_id: Some(recipe.eot_id),
            pad_id: Some(recipe.pad_id),
            bos_id: Some(recipe.bos_id),
            seed: Some(recipe.seed),
            tail: Some(recipe.tail),
            text_key: Some(recipe.text_key.clone()),
            errors: Some(recipe.errors),
            inputs: Some(recipe.inputs.clone()),
            packing: (!recipe.packing.is_concat()).then_some(recipe.packing),
            num_chunks: None,
            num_contexts: None,
            chunk_sizes: None,
            totals: None,
            bins: None,
            num_chunks_ready: None,
            bytes_out: None,
            build: Some(build),
        }
    }

    /// The JSON text written to tokshuf.json (keys sorted).
    pub fn to_bytes(&self) -> Vec<u8> {
        super::to_json_bytes(&serde_json::to_value(self).unwrap_or_default())
    }

    /// The recipe, when tokshuf wrote this cache.
    pub fn typed_recipe(&self) -> Option<Recipe> {
        serde_json::from_value(self.recipe.clone()).ok()
    }
}

/// A field that the builder always writes but whose value may be null (`bos_id`): absent reads
/// as `None`, null as `Some(None)`.
mod present {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, T: Serialize>(v: &Option<Option<T>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => x.serialize(s),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

/// Parse a choice given by name (an option of the Python API or the CLI).
fn choose<T: Copy>(name: &str, value: &str, table: &[(&str, T)]) -> crate::error::Result<T> {
    table.iter().find(|(k, _)| *k == value).map(|(_, v)| *v).ok_or_else(|| {
        let known: Vec<&str> = table.iter().map(|(k, _)| *k).collect();
        crate::error::Error::Config(format!("{name}={value:?}: expected one of {known:?}"))
    })
}

impl std::str::FromStr for Format {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        let all = [Format::Npy, Format::JsonGz, Format::Blocks, Format::BlocksZst];
        choose("format", s, &all.map(|f| (f.name(), f)))
    }
}

impl std::str::FromStr for Tail {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        choose("tail", s, &[("stitch", Tail::Stitch), ("pad", Tail::Pad), ("drop", Tail::Drop)])
    }
}

impl std::str::FromStr for ErrorPolicy {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        choose("errors", s, &[("raise", ErrorPolicy::Raise), ("skip", ErrorPolicy::Skip)])
    }
}

impl std::str::FromStr for Packing {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        choose("packing", s, &[("concat", Packing::Concat), ("bestfit", Packing::Bestfit), ("none", Packing::Unpacked)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fraction written into the chunk plan and read back for tokshuf.json is the same f64:
    /// serde_json's default float parsing can land one step off (the Ray engine's tokshuf.json
    /// then differed from the local engine's in `padding_fraction`).
    #[test]
    fn figures_read_back_are_the_same_bits() {
        let f = PackingFigures { mode: Packing::Bestfit, padding_fraction: 5409.0 / (7814.0 * 256.0), ..Default::default() };
        let back: PackingFigures = serde_json::from_str(&serde_json::to_string(&f).expect("json")).expect("parse");
        assert_eq!(back.padding_fraction.to_bits(), f.padding_fraction.to_bits());
        for k in 1..20_000u64 {
            let x = (k * 7919 % 10_007) as f64 / (k as f64 * 2049.0);
            let y: f64 = serde_json::from_str(&serde_json::to_string(&x).expect("json")).expect("parse");
            assert_eq!(x.to_bits(), y.to_bits(), "{x}");
        }
    }
}
