//! The names of everything in a cache folder (DESIGN §2). Readers and builders build paths
//! from these and from indices only: nothing is opened by a name read from a file.

use std::path::{Path, PathBuf};

pub const META_NAME: &str = "tokshuf.json";
pub const MANIFEST_NAME: &str = "manifest.jsonl";
/// The builder's scratch folder inside the output (unless `local_cell_dir` moves it).
pub const WORK_NAME: &str = ".tokshuf-work";
/// Held (flock) by a running build: see `lock`.
pub const LOCK_NAME: &str = ".tokshuf-lock";

pub fn shard_stem(chunk: u64) -> String {
    format!("shard_{chunk:08}")
}

/// Shard path of chunk `c`.
pub fn shard_path(root: &Path, c: u64) -> PathBuf {
    root.join(format!("{}.tar", shard_stem(c)))
}

/// Sub-cache folder of length bin `k` of an unpacked cache (DESIGN §9).
pub fn bin_dir(root: &Path, k: usize) -> PathBuf {
    root.join(format!("bin_{k:02}"))
}

fn is_bin_dir(name: &str) -> bool {
    name.len() == 6 && name.starts_with("bin_") && name[4..].bytes().all(|b| b.is_ascii_digit())
}

/// Names a build writes into its output folder (finished or not).
pub fn is_ours(name: &str) -> bool {
    let final_name = |n: &str| n == META_NAME || n == MANIFEST_NAME || (n.starts_with("shard_") && n.ends_with(".tar"));
    final_name(name) || name == WORK_NAME || name == LOCK_NAME || is_bin_dir(name) || super::tmp_base(name).is_some_and(final_name)
}

/// Names that hold cache data (as opposed to metadata and scratch).
pub fn is_data(name: &str) -> bool {
    name == MANIFEST_NAME || (name.starts_with("shard_") && name.ends_with(".tar")) || is_bin_dir(name)
}
