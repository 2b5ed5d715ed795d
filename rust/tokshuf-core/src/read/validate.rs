//! The checks of opening a cache, strict and cheap: tokshuf.json, manifest.jsonl and every
//! shard's size; no shard data is read. Every check names the file it failed on
//! (`Error::Corrupt`), and nothing is ever opened by a name read from a file. They are separate
//! functions so that a reader following a running build can run them again on new shards.

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::chunk::Layout;
use super::manifest_line::fast_fields;
use crate::big_table::{read_file, FileBytes};
use crate::error::{Error, Result};
use crate::format::{self, shard_path, Dtype, Format, ManifestLine, Metadata, Status, MAX_BLOCK_SIZE, MAX_SEQLEN, META_NAME};

/// The fields of tokshuf.json the reader relies on, validated.
#[derive(Clone, Debug)]
pub struct CacheMeta {
    pub seqlen: u64,
    pub dtype: Dtype,
    pub format: Format,
    pub chunk_size: u64,
    pub num_chunks: u64,
    pub num_contexts: u64,
    pub shuffle: bool,
    pub chunk_sizes: Option<Vec<u64>>,
    pub ideal_readers: Option<u64>,
    /// Contexts per member (block formats).
    pub block_size: Option<u64>,
    pub status: Status,
    /// Members of their own lengths with `.idx` sidecars (one bin of an unpacked cache);
    /// `seqlen` is then the longest a member may be.
    pub ragged: bool,
    /// The whole document, as read.
    pub raw: Value,
}

/// One manifest line, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    pub size: u64,
    /// `bytes` from the manifest, if given.
    pub bytes: Option<u64>,
}

fn field_u64(path: &Path, v: &Value, key: &str) -> Result<u64> {
    v.get(key).and_then(Value::as_u64).ok_or_else(|| Error::corrupt(path, format!("{key:?} missing or not a non-negative integer")))
}

fn field_str<'a>(path: &Path, v: &'a Value, key: &str) -> Result<&'a str> {
    v.get(key).and_then(Value::as_str).ok_or_else(|| Error::corrupt(path, format!("{key:?} missing or not a string")))
}

/// Read and check tokshuf.json of a packed cache. `complete_only`: refuse a build still running.
pub fn read_meta(root: &Path, complete_only: bool) -> Result<CacheMeta> {
    let m = read_meta_any(root, complete_only)?;
    if m.raw.get("packing").and_then(Value::as_str) == Some("none") {
        return Err(Error::Config(format!(
            "{}: an unpacked (packing=\"none\") cache has no single example order of its own: read it with \
             tokshuf.Reader (which draws batches by length bin), its bins with tokshuf.UnpackedCache, or each bin_KK/ \
             folder with WebDataset (follow mode and blends do not take unpacked caches)",
            root.display()
        )));
    }
    Ok(m)
}

/// `read_meta` of any cache, an unpacked one included.
pub fn read_meta_any(root: &Path, complete_only: bool) -> Result<CacheMeta> {
    let path = root.join(META_NAME);
    if !root.is_dir() {
        return Err(Error::io(root, std::io::Error::new(std::io::ErrorKind::NotFound, "no such cache folder")));
    }
    let raw: Value = format::read_json(&path)?;
    if !raw.is_object() {
        return Err(Error::corrupt(&path, "not a JSON object"));
    }
    let version = field_u64(&path, &raw, "format_version")?;
    if version != format::FORMAT_VERSION as u64 {
        return Err(Error::corrupt(
            &path,
            format!("format_version {version} is not supported (this tokshuf reads {})", format::FORMAT_VERSION),
        ));
    }
    let status = field_str(&path, &raw, "status")?.to_string();
    if complete_only && status != "complete" {
        return Err(Error::corrupt(&path, format!("status is {status:?}: the build is not finished (run it again to resume)")));
    }
    let m: Metadata = serde_json::from_value(raw.clone()).map_err(|e| Error::corrupt(&path, format!("unreadable: {e}")))?;
    let (seqlen, dtype, format, chunk_size, shuffle, status) = (m.seqlen, m.dtype, m.format, m.chunk_size, m.shuffle, m.status);
    if seqlen == 0 || seqlen > MAX_SEQLEN {
        return Err(Error::corrupt(&path, format!("seqlen {seqlen} out of range 1..={MAX_SEQLEN}")));
    }
    if chunk_size == 0 || chunk_size > u32::MAX as u64 {
        return Err(Error::corrupt(&path, format!("chunk_size {chunk_size} out of range")));
    }
    // An unfinished build ("building", "streaming") has no chunk plan yet (follow mode).
    let planned = status.planned();
    let need = |v: Option<u64>, key: &str| v.ok_or_else(|| Error::corrupt(&path, format!("{key:?} missing or not a non-negative integer")));
    let num_chunks = if planned { need(m.num_chunks, "num_chunks")? } else { 0 };
    let num_contexts = if planned { need(m.num_contexts, "num_contexts")? } else { 0 };
    let chunk_sizes = m.chunk_sizes.flatten();
    let ideal_readers = match m.ideal_readers {
        Some(0) => return Err(Error::corrupt(&path, "ideal_readers is not a positive integer")),
        r => r,
    };
    let block_size = match (format.is_blocked(), m.block_size) {
        (true, Some(k)) if (1..=MAX_BLOCK_SIZE).contains(&k) => Some(k),
        (true, k) => {
            return Err(Error::corrupt(&path, format!("block_size {k:?} out of range 1..={MAX_BLOCK_SIZE} for format {}", format.name())))
        }
        (false, _) => None,
    };
    if !m.recipe.is_object() {
        return Err(Error::corrupt(&path, "\"recipe\" missing or not an object"));
    }
    Ok(CacheMeta {
        seqlen,
        dtype,
        format,
        chunk_size,
        num_chunks,
        num_contexts,
        shuffle,
        chunk_sizes,
        ideal_readers,
        block_size,
        status,
        ragged: false,
        raw,
    })
}

/// `name` is `shard_{k:08}` (compared without formatting a string per line).
fn is_stem(name: &[u8], k: u64) -> bool {
    stem_number(name) == Some(k)
}

/// c, for the name `shard_{c:08}` exactly (no other spelling of the number).
fn stem_number(name: &[u8]) -> Option<u64> {
    let digits = name.strip_prefix(b"shard_")?;
    if digits.len() < 8 || (digits.len() > 8 && digits[0] == b'0') || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |v, &d| v.checked_mul(10)?.checked_add((d - b'0') as u64))
}

/// Parse manifest lines starting at line number `first` (0-based; follow mode appends).
/// Line k must name `shard_{k:08}`: nothing is ever opened by a name read from a file.
pub fn parse_manifest(path: &Path, text: &[u8], first: u64, chunk_size: u64) -> Result<Vec<ChunkEntry>> {
    if !text.is_empty() && !text.ends_with(b"\n") {
        return Err(Error::corrupt(path, "last line is not newline-terminated (truncated?)"));
    }
    let mut out = Vec::with_capacity(text.len() / 100);
    if text.is_empty() {
        return Ok(out);
    }
    let body = &text[..text.len() - 1];
    let mut starts = std::iter::once(0).chain(memchr::memchr_iter(b'\n', body).map(|k| k + 1));
    let mut next = starts.next();
    let lines = std::iter::from_fn(|| {
        let a = next?;
        next = starts.next();
        Some(&body[a..next.map_or(body.len(), |b| b - 1)])
    });
    for (k, line) in lines.enumerate() {
        let lineno = first + k as u64;
        if line.is_empty() {
            return Err(Error::corrupt(path, format!("line {}: empty line", lineno + 1)));
        }
        let (num_sequences, bytes) = match fast_fields(line) {
            Some(f) if is_stem(f.shard, lineno) => (f.num_sequences, f.bytes),
            _ => {
                let raw: ManifestLine =
                    serde_json::from_slice(line).map_err(|e| Error::corrupt(path, format!("line {}: {e}", lineno + 1)))?;
                let want = format::shard_stem(lineno);
                if raw.shard != want {
                    return Err(Error::corrupt(
                        path,
                        format!(
                            "line {}: shard {:?} is not {want:?} (shards must be named shard_NNNNNNNN in manifest order)",
                            lineno + 1,
                            raw.shard
                        ),
                    ));
                }
                (raw.num_sequences, raw.bytes)
            }
        };
        if num_sequences == 0 || num_sequences > chunk_size {
            return Err(Error::corrupt(path, format!("line {}: num_sequences {num_sequences} out of range 1..={chunk_size}", lineno + 1)));
        }
        out.push(ChunkEntry { size: num_sequences, bytes });
    }
    Ok(out)
}

/// The bytes of a manifest, read whole (on huge pages when it is large: 16 MB for 100,000
/// chunks).
pub(super) fn read_manifest_text(path: &Path) -> Result<FileBytes> {
    read_file(path).map_err(|e| Error::corrupt(path, format!("cannot read: {e}")))
}

/// `parse_manifest` of a whole manifest, in parts on a few threads when it is large.
pub fn parse_manifest_all(path: &Path, text: &[u8], chunk_size: u64) -> Result<Vec<ChunkEntry>> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
    if text.len() < (1 << 20) || threads == 1 || !text.ends_with(b"\n") {
        return parse_manifest(path, text, 0, chunk_size);
    }
    // Cut after newlines, so every part is whole lines; number each part's first line.
    let mut cuts = vec![0usize];
    for t in 1..threads {
        let at = (text.len() * t / threads).max(*cuts.last().unwrap_or(&0));
        let next = text[at..].iter().position(|&b| b == b'\n').map_or(text.len(), |k| at + k + 1);
        cuts.push(next);
    }
    cuts.push(text.len());
    cuts.dedup();
    let mut firsts = vec![0u64];
    for w in cuts.windows(2).take(cuts.len().saturating_sub(2)) {
        let lines = memchr::memchr_iter(b'\n', &text[w[0]..w[1]]).count() as u64;
        firsts.push(firsts.last().copied().unwrap_or(0) + lines);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = cuts
            .windows(2)
            .zip(&firsts)
            .map(|(w, &first)| {
                let part = &text[w[0]..w[1]];
                s.spawn(move || parse_manifest(path, part, first, chunk_size))
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.extend(h.join().unwrap_or_else(|_| Err(Error::Config("manifest parser thread panicked".into())))?);
        }
        Ok(out)
    })
}

/// Check that chunk `c`'s shard exists with a plausible size; returns the size.
pub fn check_shard(root: &Path, c: u64, entry: &ChunkEntry, layout: &Layout) -> Result<u64> {
    let path = shard_path(root, c);
    let md = std::fs::symlink_metadata(&path).map_err(|e| Error::corrupt(&path, format!("shard missing or unreadable: {e}")))?;
    if !md.file_type().is_file() {
        return Err(Error::corrupt(&path, "not a regular file"));
    }
    let len = md.len();
    layout.check_size(&path, entry, len)?;
    Ok(len)
}

/// Hex sha256 of tokshuf.json's recipe: what a build was asked to make (known from its start).
pub fn recipe_fingerprint(raw: &Value) -> String {
    let mut h = Sha256::new();
    h.update(b"tokshuf-recipe-v1\0");
    h.update(serde_json::to_string(&raw["recipe"]).unwrap_or_default().as_bytes());
    crate::format::hex(&h.finalize())
}

/// Chunk number of a shard file name `shard_NNNNNNNN.tar` (as the builder writes it).
fn shard_number(name: &std::ffi::OsStr) -> Option<u64> {
    stem_number(name.as_encoded_bytes().strip_suffix(b".tar")?)
}

/// Check every shard of an unpacked cache's bin in `root` and its `.idx` sidecar's size (the
/// shards' own sizes are checked when each is first mapped, as for any cache).
pub fn check_shards_of(root: &Path, chunks: &[ChunkEntry]) -> Result<()> {
    check_shards(root, chunks)?;
    for (c, e) in chunks.iter().enumerate() {
        let path = format::idx::idx_path(root, c as u64);
        let len = std::fs::metadata(&path).map_err(|err| Error::corrupt(&path, format!("shard index missing or unreadable: {err}")))?.len();
        if len != format::idx::idx_len(e.size) {
            return Err(Error::corrupt(&path, format!("{len} bytes, expected {} for {} members", format::idx::idx_len(e.size), e.size)));
        }
    }
    Ok(())
}

/// Check that every shard exists as a regular file, from one directory listing (no `stat` per
/// shard: the listing's file types are enough). Sizes are checked when each shard is first
/// mapped (`Layout::open`), so opening a cache of 100,000 chunks costs one listing.
pub(super) fn check_shards(root: &Path, chunks: &[ChunkEntry]) -> Result<()> {
    check_listed(root, chunks, list_shards(root)?)
}

/// The shards in `root`'s listing: their numbers, and whether each is a regular file. (Needs
/// no manifest: `Cache::open` lists the folder while it parses the manifest.)
pub(super) fn list_shards(root: &Path) -> Result<Vec<(u64, bool)>> {
    let mut listed = Vec::new();
    for e in std::fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let e = e.map_err(|e| Error::io(root, e))?;
        if let Some(c) = shard_number(&e.file_name()) {
            let kind = e.file_type().map_err(|err| Error::corrupt(shard_path(root, c), format!("cannot stat shard: {err}")))?;
            listed.push((c, kind.is_file()));
        }
    }
    Ok(listed)
}

/// `check_shards` on a listing from `list_shards`.
pub(super) fn check_listed(root: &Path, chunks: &[ChunkEntry], listed: Vec<(u64, bool)>) -> Result<()> {
    let mut found = vec![false; chunks.len()];
    for (c, is_file) in listed {
        if let Some(slot) = found.get_mut(c as usize) {
            if !is_file {
                return Err(Error::corrupt(shard_path(root, c), "not a regular file"));
            }
            *slot = true;
        }
    }
    match found.iter().position(|&f| !f) {
        Some(c) => Err(Error::corrupt(shard_path(root, c as u64), "shard missing")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_canonical_shard_names_are_shards() {
        for c in [0, 1, 99_999_999, 100_000_000, 123_456_789_012] {
            let name = format::shard_stem(c) + ".tar";
            assert_eq!(shard_number(std::ffi::OsStr::new(&name)), Some(c), "{name}");
            assert!(is_stem(format::shard_stem(c).as_bytes(), c));
        }
        for name in [
            "shard_0000001.tar",
            "shard_000000001.tar",
            "shard_00000001.tar.tmp",
            "shard_00000001",
            "shard_0000000a.tar",
            "shard_+0000001.tar",
            "Shard_00000001.tar",
            "shard_99999999999999999999999.tar",
        ] {
            assert_eq!(shard_number(std::ffi::OsStr::new(name)), None, "{name}");
        }
        assert!(!is_stem(b"shard_00000001", 2));
    }
}
