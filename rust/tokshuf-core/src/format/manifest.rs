//! manifest.jsonl (DESIGN §2): one line per chunk, in chunk order, newline-terminated.

use serde::{Deserialize, Serialize};

/// One line of manifest.jsonl. `shard` and `num_sequences` are what open_lm and DCLM tooling
/// read; tokshuf writes the other keys too, and reads caches whose manifests lack them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestLine {
    pub shard: String,
    pub num_sequences: u64,
    /// Real (not padding) token ids in the chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_tokens: Option<u64>,
    /// Size of the shard file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Hex sha256 of the shard file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl ManifestLine {
    pub fn bytes(&self) -> u64 {
        self.bytes.unwrap_or(0)
    }
    pub fn num_tokens(&self) -> u64 {
        self.num_tokens.unwrap_or(0)
    }
}
