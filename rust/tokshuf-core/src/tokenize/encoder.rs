//! The one interface the pipeline sees of a tokenizer.

/// Encode text into ids. Implementations are shared by all worker threads.
pub trait Encoder: Send + Sync {
    /// Append the ids of `text` to `out`.
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String>;
    /// Text of `ids` (lossy where ids split a character); for `inspect` and tests. `Err` if
    /// the decoder itself cannot be had (a tokenizer.json the `tokenizers` crate, loaded on
    /// first use, refuses).
    fn decode(&self, ids: &[u32]) -> std::result::Result<String, String>;
}
