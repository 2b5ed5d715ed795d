//! tokshuf core: jsonl corpora -> tokenized, windowed, shuffled WebDataset caches, and the
//! deterministic order in which readers consume them. No Python here; `rust/tokshuf-py`
//! is a thin PyO3 layer over this crate.
//!
//! Design notes (the contract is DESIGN.md; this is how the code meets it):
//! - Determinism: every randomized choice goes through `hash` (SplitMix64 mixing, our own
//!   Fisher-Yates and bounded integers), keyed by seed and integer indices. Threads change
//!   speed, never bytes: stage 1 consumes batches in file order, cells are built in id order.
//! - Resumability: each unit of work (an input file in stage 1, a chunk in stage 2) is
//!   written under a temporary name, fsynced and renamed; its presence means it is done.
//! - Errors: one `Error` enum whose variants map to Python exception classes; bad input is
//!   an error with file and line, never a panic.

pub mod blend;
pub mod bpe;
pub mod cache;
pub mod build;
pub mod error;
pub mod fast;
pub mod hash;
pub mod hfbpe;
pub mod input;
pub mod lock;
pub mod follow;
pub mod meta;
pub mod order;
pub mod piece_cache;
pub mod pretok;
pub mod progress;
pub mod reader;
pub mod resume;
pub mod shard;
pub mod stage1;
pub mod steps;
pub mod stream;
pub mod testhook;
pub mod tokenizer;

pub use error::{Error, Result};
