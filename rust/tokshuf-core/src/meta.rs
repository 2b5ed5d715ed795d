//! Options of a build, and what tokshuf.json / manifest.jsonl / the work folder hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub const FORMAT_VERSION: u32 = 1;
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tail {
    Stitch,
    Pad,
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Format {
    #[serde(rename = "npy")]
    Npy,
    #[serde(rename = "json.gz")]
    JsonGz,
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

/// Everything a caller chooses. Only `threads`, `memory_limit`, `local_cell_dir` and
/// `progress` may differ between a build and its resumption: they never change the output.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    pub tokenizer: String,
    pub seqlen: u32,
    pub chunk_size: u32,
    pub num_local_cells: Option<u64>,
    pub local_cell_dir: Option<PathBuf>,
    pub seed: u64,
    pub threads: usize,
    pub text_key: String,
    pub format: Format,
    pub tail: Tail,
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub bos: bool,
    pub bos_id: Option<u32>,
    pub allow_special_tokens: bool,
    /// Fast or reference tokenizer implementation; never changes the ids.
    pub tokenizer_backend: crate::tokenizer::Backend,
    pub shuffle: bool,
    pub memory_limit: u64,
    pub errors: ErrorPolicy,
    pub progress: bool,
    pub overwrite: bool,
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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    pub spec: String,
    pub sha256: String,
    pub vocab_size: u32,
    pub backend: String,
}

impl Recipe {
    /// Names of the fields that differ, for an error that says what changed.
    pub fn differences(&self, other: &Recipe) -> Vec<String> {
        let a = serde_json::to_value(self).unwrap_or_default();
        let b = serde_json::to_value(other).unwrap_or_default();
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return vec!["recipe".into()] };
        a.keys().filter(|k| a.get(*k) != b.get(*k)).map(|k| {
            if k == "inputs" {
                let inputs_a: Vec<_> = self.inputs.iter().collect();
                let changed: Vec<String> = other.inputs.iter().filter(|f| !inputs_a.contains(f)).map(|f| f.path.clone()).take(3).collect();
                format!("inputs (new or changed: {})", if changed.is_empty() { "files removed".to_string() } else { changed.join(", ") })
            } else {
                format!("{k} ({} -> {})", a[k], b[k])
            }
        }).collect()
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
}

/// One line of manifest.jsonl.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestLine {
    pub shard: String,
    pub num_sequences: u64,
    pub num_tokens: u64,
    pub bytes: u64,
    pub sha256: String,
}

pub fn shard_stem(chunk: u64) -> String {
    format!("shard_{chunk:08}")
}

/// Write `data` to `path` through a temporary name in the same folder, fsynced, then renamed.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_atomic_as(path, data, &path.file_name().unwrap_or_default().to_string_lossy())
}

/// `write_atomic`, naming the write `name` for the test hooks (`testhook`).
pub fn write_atomic_as(path: &Path, data: &[u8], name: &str) -> Result<()> {
    use std::io::Write;
    let tmp = tmp_name(path);
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let (head, rest) = data.split_at(data.len() / 2);
    let written = crate::testhook::charge(head.len())
        .and_then(|_| f.write_all(head))
        .map(|_| crate::testhook::point(&format!("atomic_partial:{name}")))
        .and_then(|_| crate::testhook::charge(rest.len()))
        .and_then(|_| f.write_all(rest))
        .and_then(|_| f.sync_all());
    if let Err(e) = written {
        drop(f);
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    crate::testhook::point(&format!("atomic:{name}"));
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

pub fn tmp_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(path, format!("unreadable JSON: {e}")))
}

pub fn to_json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(value).unwrap_or_default();
    v.push(b'\n');
    v
}
