//! Where a build keeps its output and its work: a local folder (for the Ray engine, on storage
//! every machine mounts at the same path) or a prefix in an object store. One small API over
//! both, so the steps a cluster runs (`driver`) and the resume rules (`resume`) do not care
//! which: small files are read and written whole; large ones are produced in a local file and
//! then published, renamed into place or uploaded as one whole object, and read back by byte
//! range. Either way a name holds nothing or its final bytes, never a part.

use std::fmt;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::format;
use crate::storage::{self, lease, Location, RemoteUrl};

#[derive(Clone, Debug)]
pub enum Place {
    Dir(PathBuf),
    /// A prefix in an object store, and the local folder its files are produced in before
    /// they are uploaded (`local_cell_dir`, else the system's temporary folder).
    Store {
        url: RemoteUrl,
        scratch: PathBuf,
    },
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Dir(p) => write!(f, "{}", p.display()),
            Place::Store { url, .. } => write!(f, "{url}"),
        }
    }
}

impl Place {
    /// `path` (a local path or an object-store URL); `scratch` is where a store's files are
    /// produced before upload.
    pub fn new(path: &Path, scratch: &Path) -> Result<Place> {
        // A name that is not UTF-8 cannot be a URL, and a lossy copy would name another folder.
        let Some(text) = path.to_str() else { return Ok(Place::Dir(path.to_path_buf())) };
        Ok(match Location::parse(text)? {
            Location::Local(p) => Place::Dir(p),
            Location::Remote(url) => Place::Store { url, scratch: scratch.to_path_buf() },
        })
    }

    pub fn is_store(&self) -> bool {
        matches!(self, Place::Store { .. })
    }

    /// The local folder, for a `Dir`.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Place::Dir(p) => Some(p),
            Place::Store { .. } => None,
        }
    }

    /// The sub-folder (sub-prefix) `name`.
    pub fn child(&self, name: &str) -> Place {
        match self {
            Place::Dir(p) => Place::Dir(p.join(name)),
            Place::Store { url, scratch } => Place::Store { url: url.join(name), scratch: scratch.clone() },
        }
    }

    pub fn location(&self, name: &str) -> Location {
        match self {
            Place::Dir(p) => Location::Local(p.join(name)),
            Place::Store { url, .. } => Location::Remote(url.join(name)),
        }
    }

    /// The whole file `name`, or None when there is none.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Place::Dir(p) => match std::fs::read(p.join(name)) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io(p.join(name), e)),
            },
            Place::Store { .. } => storage::get(&self.location(name)),
        }
    }

    /// The JSON file `name`, or None when there is none; unreadable JSON is a corrupt file.
    pub fn read_json<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        match self.read(name)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::corrupt(self.location(name).to_string(), format!("unreadable JSON: {e}"))),
        }
    }

    /// Replace `name` with `data` as a whole; `label` names the write for the test hooks.
    pub fn write(&self, name: &str, data: &[u8], label: &str) -> Result<()> {
        match self {
            Place::Dir(p) => {
                std::fs::create_dir_all(p).map_err(|e| Error::io(p, e))?;
                format::write_atomic_as(&p.join(name), data, label)
            }
            Place::Store { .. } => storage::put_bytes(data.to_vec(), &self.location(name)),
        }
    }

    /// Size of `name`, or None when there is none.
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        storage::stat(&self.location(name))
    }

    /// Names directly in this folder (for a store: the first key segment under the prefix).
    pub fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = match self {
            Place::Dir(p) => match std::fs::read_dir(p) {
                Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned())).collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(Error::io(p, e)),
            },
            Place::Store { url, .. } => {
                let prefix = if url.key.is_empty() { String::new() } else { format!("{}/", url.key) };
                self.keys()?
                    .iter()
                    .filter_map(|k| k.strip_prefix(&prefix))
                    .map(|rest| rest.split('/').next().unwrap_or("").to_string())
                    .collect()
            }
        };
        names.retain(|n| !n.is_empty());
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Every key under a store's prefix.
    fn keys(&self) -> Result<Vec<String>> {
        let Place::Store { url, .. } = self else { return Ok(Vec::new()) };
        let prefix = format!("{}/", url.key);
        Ok(storage::list(&url.to_string())?
            .into_iter()
            .filter_map(|e| match e.location {
                Location::Remote(r) if url.key.is_empty() || r.key.starts_with(&prefix) => Some(r.key),
                _ => None,
            })
            .collect())
    }

    /// Remove `name` (a file, or a folder and what it holds); one already gone is fine.
    pub fn remove(&self, name: &str) -> Result<()> {
        match self {
            Place::Dir(p) => remove_tree(&p.join(name)),
            Place::Store { .. } => self.child(name).remove_all(),
        }
    }

    /// Remove this folder (prefix) and everything in it.
    pub fn remove_all(&self) -> Result<()> {
        match self {
            Place::Dir(p) => remove_tree(p),
            Place::Store { url, .. } => {
                // One object named like the prefix, and everything under it.
                storage::delete(&Location::Remote(url.clone()))?;
                for key in self.keys()? {
                    storage::delete(&Location::Remote(RemoteUrl { key, ..url.clone() }))?;
                }
                Ok(())
            }
        }
    }

    /// Stream bytes `range` of `name`.
    pub fn open_range(&self, name: &str, range: Range<u64>) -> Result<Box<dyn Read + Send>> {
        storage::open_range(&self.location(name), range)
    }

    /// A local file to produce `name` in before `publish`: beside it in a folder (so the
    /// rename is atomic), in the scratch folder for a store. Every call gets its own name.
    pub fn staging(&self, name: &str) -> Result<PathBuf> {
        let dir = match self {
            Place::Dir(p) => p,
            Place::Store { scratch, .. } => scratch,
        };
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        Ok(format::tmp_name(&dir.join(name)))
    }

    /// Make the finished local file `staged` the file `name`: renamed into a folder (the
    /// producer fsynced it), or uploaded as one whole object and then removed.
    pub fn publish(&self, staged: &Path, name: &str) -> Result<()> {
        match self {
            Place::Dir(p) => std::fs::rename(staged, p.join(name)).map_err(|e| Error::io(p.join(name), e)),
            Place::Store { .. } => {
                let put = storage::put_file(staged, &self.location(name));
                let _ = std::fs::remove_file(staged);
                put
            }
        }
    }

    /// A fresh, empty local folder for one step's own files (removed when dropped), under the
    /// scratch folder of a store, or inside a local folder.
    pub fn scratch_dir(&self) -> Result<tempfile::TempDir> {
        let base = match self {
            Place::Dir(p) => p,
            Place::Store { scratch, .. } => scratch,
        };
        std::fs::create_dir_all(base).map_err(|e| Error::io(base, e))?;
        sweep_scratch(base);
        let prefix = format!("{SCRATCH}{}-", lease::tag());
        tempfile::Builder::new().prefix(&prefix).tempdir_in(base).map_err(|e| Error::io(base, e))
    }
}

const SCRATCH: &str = "tokshuf-scratch-";

/// Remove the scratch folders in `base` of processes of this machine that are gone. A folder
/// is named for its machine and process: a worker killed (for memory, say) never removes its
/// own, and on a long build such leftovers (a task's share of the spills) would fill the disk.
/// A folder of another machine sharing `base` is never touched.
fn sweep_scratch(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // SCRATCH, the tag, then tempfile's random letters.
        let tag = name.strip_prefix(SCRATCH).and_then(|r| r.rsplit_once('-')).map(|(tag, _)| tag);
        if tag.is_some_and(lease::tag_gone) {
            let _ = remove_tree(&entry.path());
        }
    }
}

/// Remove a file, or a folder and what it holds; one already gone is fine.
pub fn remove_tree(p: &Path) -> Result<()> {
    let r = match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(md) if md.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
    };
    r.map_err(|e| Error::io(p, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_place_reads_writes_publishes_and_lists() {
        let t = tempfile::tempdir().unwrap();
        let place = Place::new(&t.path().join("out"), t.path()).unwrap();
        assert_eq!(place.read("a").unwrap(), None);
        assert!(place.names().unwrap().is_empty());
        place.write("a", b"hello", "a").unwrap();
        assert_eq!(place.read("a").unwrap().as_deref(), Some(&b"hello"[..]));
        let staged = place.staging("b").unwrap();
        assert_ne!(staged, place.staging("b").unwrap());
        std::fs::write(&staged, b"0123456789").unwrap();
        place.publish(&staged, "b").unwrap();
        assert!(!staged.exists());
        let mut got = String::new();
        place.open_range("b", 2..5).unwrap().read_to_string(&mut got).unwrap();
        assert_eq!(got, "234");
        assert_eq!(place.size("b").unwrap(), Some(10));
        place.child("w").write("x", b"1", "x").unwrap();
        assert_eq!(place.names().unwrap(), ["a", "b", "w"]);
        place.remove("w").unwrap();
        place.remove("a").unwrap();
        assert_eq!(place.names().unwrap(), ["b"]);
        place.remove_all().unwrap();
        assert!(!t.path().join("out").exists());
    }

    /// A scratch folder left by a process of this machine that is gone (a worker killed) is
    /// removed by the next one made there; live processes' and other machines' are kept.
    #[test]
    fn scratch_folders_of_dead_processes_are_swept() {
        let t = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let host = lease::hostname();
        let names = [
            format!("{SCRATCH}{host}-{dead}-abc"),
            format!("{SCRATCH}{host}-{}-abc", std::process::id()),
            format!("{SCRATCH}{host}x-{dead}-abc"),
            format!("{SCRATCH}abc"),
        ];
        for n in &names {
            std::fs::create_dir_all(t.path().join(n).join("cells")).unwrap();
        }
        let place = Place::new(t.path(), t.path()).unwrap();
        let fresh = place.scratch_dir().unwrap();
        assert!(!t.path().join(&names[0]).exists(), "a dead process's folder is removed");
        assert!(names[1..].iter().all(|n| t.path().join(n).exists()), "the others are kept");
        assert!(fresh.path().file_name().unwrap().to_string_lossy().starts_with(&format!("{SCRATCH}{host}-{}-", std::process::id())));
    }
}
