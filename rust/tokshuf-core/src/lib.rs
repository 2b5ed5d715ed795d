//! tokshuf core: jsonl corpora -> tokenized, windowed, shuffled WebDataset caches, and the
//! deterministic order in which readers consume them. No Python here; `rust/tokshuf-py`
//! is a thin PyO3 layer over this crate.
//!
//! The crate is grouped like the format contract (docs/architecture.md maps each section to a module):
//! - `format`: what a cache folder holds: names, tokshuf.json and manifest.jsonl as typed
//!   values, the tar member layout, atomic publication, the build lock.
//! - `tokenize`: tokenizers (tiktoken encodings, tokenizer.json), and the fast exact backend.
//! - `build`: inputs -> stage 1 (tokenize, window, spill) -> chunk plan -> stage 2 (cell
//!   shuffle, shards) -> manifest and tokshuf.json, as composable steps (`build::steps`) that the
//!   one-machine driver runs on a thread pool.
//! - `read`: opening a cache, the global example order, batches, follow mode, blends.
//!
//! Design notes (the contract is DESIGN.md; this is how the code meets it):
//! - Determinism: every randomized choice goes through `hash` (SplitMix64 mixing, our own
//!   Fisher-Yates and bounded integers), keyed by seed and integer indices. Threads change
//!   speed, never bytes: stage 1 consumes batches in file order, cells are built in id order.
//! - Resumability: each unit of work (an input file in stage 1, a chunk in stage 2) is
//!   written under a temporary name, fsynced and renamed; its presence means it is done.
//! - Errors: one `Error` enum; the bindings map each variant to a Python exception class. Bad
//!   input is an error with file and line, never a panic.
//! - `read` never imports `build`: both depend on `format` only.

mod big_table;
pub mod build;
pub mod error;
pub mod format;
pub mod hash;
pub mod memory;
pub mod read;
pub mod storage;
pub mod testhook;
pub mod tokenize;

pub use error::{Error, Result};
