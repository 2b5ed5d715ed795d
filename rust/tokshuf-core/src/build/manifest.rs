//! Writing manifest.jsonl while a build runs.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::place::Place;
use crate::error::{Error, Result};
use crate::format::{self, ManifestLine, MANIFEST_NAME};

/// Least time between two uploads of a growing manifest to an object store: each upload is
/// the whole object (stores cannot append), so a long manifest is not sent once per chunk.
const UPLOAD_EVERY: Duration = Duration::from_secs(1);

/// manifest.jsonl, kept a prefix of the final manifest while the build runs: a line is
/// listed, in chunk order, once its chunk and every earlier one are written.
pub struct Manifest {
    out: Place,
    sink: Sink,
    pub lines: Vec<ManifestLine>,
    pending: BTreeMap<u64, ManifestLine>,
}

enum Sink {
    /// A local file, appended to (None once closed or once an append failed).
    Append(Option<File>, PathBuf),
    /// An object, replaced whole: `uploaded` lines are in the store, the last upload at `at`.
    Upload { uploaded: usize, at: Instant },
}

impl Manifest {
    /// Start the manifest, keeping the lines of a killed run whose shards are there.
    pub fn open(out: &Place, fresh: bool) -> Result<Self> {
        let mut lines = if fresh { Vec::new() } else { prefix(&out.read(MANIFEST_NAME)?.unwrap_or_default()) };
        let mut valid = 0;
        for (k, l) in lines.iter().enumerate() {
            if l.shard != format::shard_stem(k as u64) || out.size(&format!("{}.tar", l.shard))? != l.bytes {
                break;
            }
            valid += 1;
        }
        lines.truncate(valid);
        out.write(MANIFEST_NAME, &manifest_text(&lines), "manifest.jsonl[prefix]")?;
        let sink = match out.dir() {
            Some(dir) => {
                let path = dir.join(MANIFEST_NAME);
                let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| Error::io(&path, e))?;
                Sink::Append(Some(file), path)
            }
            None => Sink::Upload { uploaded: lines.len(), at: Instant::now() },
        };
        Ok(Manifest { out: out.clone(), sink, lines, pending: BTreeMap::new() })
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
            match &mut self.sink {
                Sink::Append(file, path) => {
                    let data = manifest_text(&self.lines[start..]);
                    if let Some(f) = file.as_mut() {
                        let len = manifest_text(&self.lines[..start]).len() as u64;
                        if let Err(e) = format::append_lines(f, len, &data) {
                            // Nothing more is appended: a later line (a build drains its
                            // chunks in flight after an error) must not follow a gap.
                            *file = None;
                            return Err(Error::io(&*path, e));
                        }
                    }
                }
                Sink::Upload { .. } => self.upload(false)?,
            }
        }
        Ok(())
    }

    /// An object store's manifest: upload the lines listed since the last upload, if there
    /// are any and (unless `now`) the last upload is old enough. A local file is always current.
    pub fn upload(&mut self, now: bool) -> Result<()> {
        if let Sink::Upload { uploaded, at } = &mut self.sink {
            if self.lines.len() > *uploaded && (now || at.elapsed() >= UPLOAD_EVERY) {
                self.out.write(MANIFEST_NAME, &manifest_text(&self.lines), "manifest.jsonl[prefix]")?;
                (*uploaded, *at) = (self.lines.len(), Instant::now());
            }
        }
        Ok(())
    }

    /// Stop appending (the final manifest is written whole by `steps::finalize`, so no torn
    /// line of any run can survive).
    pub fn close(&mut self) {
        if let Sink::Append(file, ..) = &mut self.sink {
            *file = None;
        }
    }
}

/// Complete lines at the start of a manifest (a torn last line is not one).
pub fn prefix(bytes: &[u8]) -> Vec<ManifestLine> {
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    bytes[..end].split(|&b| b == b'\n').filter(|l| !l.is_empty()).map_while(|l| serde_json::from_slice(l).ok()).collect()
}

pub fn manifest_text(lines: &[ManifestLine]) -> Vec<u8> {
    let mut text = Vec::new();
    for line in lines {
        text.extend_from_slice(serde_json::to_string(line).unwrap_or_default().as_bytes());
        text.push(b'\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(chunk: u64) -> ManifestLine {
        ManifestLine { shard: format::shard_stem(chunk), num_sequences: 1, num_tokens: None, bytes: None, sha256: None }
    }

    /// An append that fails (here: a handle that cannot write) leaves the file as it was, and
    /// no later line is appended after the gap.
    #[test]
    fn a_failed_append_leaves_a_prefix_and_appends_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let out = Place::new(dir.path(), dir.path()).unwrap();
        let mut m = Manifest::open(&out, true).unwrap();
        m.add(0, line(0)).unwrap();
        let path = dir.path().join(MANIFEST_NAME);
        let before = std::fs::read(&path).unwrap();
        assert_eq!(prefix(&before).len(), 1);
        if let Sink::Append(file, ..) = &mut m.sink {
            *file = Some(File::open(&path).unwrap());
        }
        assert!(m.add(1, line(1)).is_err());
        assert!(matches!(m.sink, Sink::Append(None, ..)), "appending stops after a failure");
        m.add(2, line(2)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }
}
