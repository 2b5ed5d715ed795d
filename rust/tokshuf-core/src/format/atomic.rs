//! Publishing files by rename: nothing a reader or a resumed build can see is ever half written.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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
