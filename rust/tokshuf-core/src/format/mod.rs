//! The cache format (DESIGN §2-3): names in a cache folder, tokshuf.json and manifest.jsonl as
//! typed values, the tar member layout, atomic publication, and the build lock that tells a
//! reader whether a build is running. Builders and readers both depend on this module and on
//! nothing of each other.

mod atomic;
pub mod idx;
mod layout;
pub mod lock;
mod manifest;
mod meta;
mod names;

pub use atomic::{
    append_lines, is_tmp, read_json, tmp_base, tmp_name, to_json_bytes, write_atomic, write_atomic_as, write_atomic_synced_if,
};
pub use layout::{
    decode_ids, member_name, member_span, npy_header, npy_header_into, npy_header_shaped, npy_stride, parse_npy_ids, write_member_name,
    Blocking, DEFAULT_BLOCK_SIZE, MAX_BLOCK_SIZE, MAX_SEQLEN, TAR_BLOCK, ZSTD_LEVEL,
};
pub use manifest::ManifestLine;
pub use meta::{
    BinInfo, Dtype, ErrorPolicy, FileSummary, Format, InputFile, InputKind, Metadata, Packing, PackingFigures, Recipe, Status, Tail,
    TokenizerInfo, Totals, FORMAT_VERSION, VERSION,
};
pub use names::{bin_dir, is_data, is_ours, shard_path, shard_stem, LOCK_NAME, MANIFEST_NAME, META_NAME, WORK_NAME};

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
