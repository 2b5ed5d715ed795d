//! Publishing files by rename: nothing a reader or a resumed build can see is ever half written.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Append whole lines `data` to `file`, which holds `len` bytes of whole lines. If the write
/// fails (a full disk), the part of `data` written is taken back, so the file stays whole
/// lines: a reader never sees a torn one, and the same lines may be appended again later.
pub fn append_lines(file: &mut std::fs::File, len: u64, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    crate::testhook::charge(data.len()).and_then(|_| file.write_all(data)).inspect_err(|_| {
        let _ = file.set_len(len);
    })
}

/// Write `data` to `path` through a temporary name in the same folder, fsynced, then renamed.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_atomic_as(path, data, &path.file_name().unwrap_or_default().to_string_lossy())
}

/// `write_atomic`, naming the write `name` for the test hooks (`testhook`).
pub fn write_atomic_as(path: &Path, data: &[u8], name: &str) -> Result<()> {
    write_renamed(path, data, name, true)
}

/// `write_atomic`, with the fsync only if `sync`: without it, after a power cut the file may be
/// missing, empty or partly written, so only for files whose reader treats an unreadable one as
/// never written.
pub fn write_atomic_synced_if(path: &Path, data: &[u8], sync: bool) -> Result<()> {
    write_renamed(path, data, &path.file_name().unwrap_or_default().to_string_lossy(), sync)
}

fn write_renamed(path: &Path, data: &[u8], name: &str, sync: bool) -> Result<()> {
    use std::io::Write;
    let tmp = tmp_name(path);
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let (head, rest) = data.split_at(data.len() / 2);
    let written = crate::testhook::charge(head.len())
        .and_then(|_| f.write_all(head))
        .map(|_| crate::testhook::point(&format!("atomic_partial:{name}")))
        .and_then(|_| crate::testhook::charge(rest.len()))
        .and_then(|_| f.write_all(rest))
        .and_then(|_| if sync { f.sync_all() } else { Ok(()) });
    if let Err(e) = written {
        drop(f);
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    crate::testhook::point(&format!("atomic:{name}"));
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// A temporary name beside `path` that no other writer shares: `NAME.tmp.TAG`, where TAG is
/// unique to this process and call. Two writers of one file (a task Ray declared lost that is
/// still running, and its retry; a build and a zombie of a killed driver) each write their own
/// temporary file and rename it into place: the rename is atomic and both hold the same bytes,
/// so whichever lands last changes nothing, and neither can truncate the other's file.
pub fn tmp_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!("{TMP_MARK}{}", writer_tag()));
    path.with_file_name(name)
}

/// What a temporary name holds after the final name (see `is_tmp`).
const TMP_MARK: &str = ".tmp.";

/// 16 hex digits unique to this process and call: the process's nonce (its pid and start time
/// mixed, so processes of other hosts differ too) and a per-process counter, mixed again.
fn writer_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static NONCE: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nonce = *NONCE.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        crate::hash::mix64(now ^ ((std::process::id() as u64) << 40))
    });
    // A forked child keeps the parent's nonce: the pid in the tag tells them apart.
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}", crate::hash::mix64(nonce ^ crate::hash::mix64(n ^ ((std::process::id() as u64) << 32))))
}

/// True for a temporary file a writer left (killed before its rename): `NAME.tmp.TAG`, or the
/// plain `NAME.tmp` of earlier versions.
pub fn is_tmp(name: &str) -> bool {
    tmp_base(name).is_some()
}

/// The final name a temporary file was written for (`shard_00000001.tar` for
/// `shard_00000001.tar.tmp.0123456789abcdef`).
pub fn tmp_base(name: &str) -> Option<&str> {
    if let Some((base, tag)) = name.rsplit_once(TMP_MARK) {
        if tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some(base);
        }
    }
    name.strip_suffix(".tmp")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_writer_gets_its_own_temporary_name() {
        let p = Path::new("/cache/shard_00000001.tar");
        let names: std::collections::HashSet<PathBuf> = (0..1000).map(|_| tmp_name(p)).collect();
        assert_eq!(names.len(), 1000);
        for n in &names {
            let name = n.file_name().unwrap().to_str().unwrap();
            assert_eq!(n.parent(), p.parent());
            assert_eq!(tmp_base(name), Some("shard_00000001.tar"));
            assert!(is_tmp(name));
        }
        assert_eq!(tmp_base("tokshuf.json.tmp"), Some("tokshuf.json"));
        assert_eq!(tmp_base("a.tmp.xyz"), None);
        assert_eq!(tmp_base("shard_00000001.tar"), None);
    }
}
