//! Writing manifest.jsonl while a build runs.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::resume;
use crate::error::{Error, Result};
use crate::format::{self, ManifestLine, MANIFEST_NAME};
use crate::testhook;

/// manifest.jsonl, kept a prefix of the final manifest while the build runs: a line is
/// appended, in chunk order, once its chunk and every earlier one are written.
pub struct Manifest {
    path: PathBuf,
    file: Option<File>,
    pub lines: Vec<ManifestLine>,
    pending: BTreeMap<u64, ManifestLine>,
}

impl Manifest {
    /// Start the manifest, keeping the lines of a killed run whose shards are there.
    pub fn open(out: &Path, fresh: bool) -> Result<Self> {
        let path = out.join(MANIFEST_NAME);
        let mut lines = if fresh { Vec::new() } else { resume::manifest_prefix(out) };
        let valid = lines
            .iter()
            .enumerate()
            .take_while(|(k, l)| {
                l.shard == format::shard_stem(*k as u64)
                    && std::fs::metadata(out.join(format!("{}.tar", l.shard))).is_ok_and(|m| Some(m.len()) == l.bytes)
            })
            .count();
        lines.truncate(valid);
        format::write_atomic_as(&path, &manifest_text(&lines), "manifest.jsonl[prefix]")?;
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| Error::io(&path, e))?;
        Ok(Manifest { path, file: Some(file), lines, pending: BTreeMap::new() })
    }

    pub fn add(&mut self, chunk: u64, line: ManifestLine) -> Result<()> {
        if chunk < self.lines.len() as u64 {
            return Ok(());
        }
        self.pending.insert(chunk, line);
        let start = self.lines.len();
        while let Some(l) = self.pending.remove(&(self.lines.len() as u64)) {
            self.lines.push(l);
        }
        if self.lines.len() > start {
            let data = manifest_text(&self.lines[start..]);
            if let Some(f) = self.file.as_mut() {
                testhook::charge(data.len()).and_then(|_| f.write_all(&data)).map_err(|e| Error::io(&self.path, e))?;
            }
        }
        Ok(())
    }

    /// Stop appending (the final manifest is written whole by `steps::finalize`, so no torn
    /// line of any run can survive).
    pub fn close(&mut self) {
        self.file = None;
    }
}

pub fn manifest_text(lines: &[ManifestLine]) -> Vec<u8> {
    let mut text = Vec::new();
    for line in lines {
        text.extend_from_slice(serde_json::to_string(line).unwrap_or_default().as_bytes());
        text.push(b'\n');
    }
    text
}
