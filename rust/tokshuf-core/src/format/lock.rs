//! The build lock: a running build holds an exclusive `flock` on `OUTPUT/.tokshuf-lock` for its
//! whole run, and removes the file when the cache is complete.
//!
//! Two uses: a second build into the same folder is refused (`OutputExists`) instead of two
//! processes writing the same files, and a reader following a build (follow mode) can tell a
//! running build from a dead one without guessing from timestamps: the kernel drops the lock
//! when the process dies, however it dies.
//!
//! A reader only *tests* the lock (a shared lock taken and dropped at once); a build starting at
//! that very moment retries for a short while before it reports a conflict.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

use super::LOCK_NAME;

/// Held by a running build.
#[derive(Debug)]
pub struct BuildLock {
    file: File,
    path: PathBuf,
    /// This run created the file (a build refused by `resume::prepare` removes it again).
    pub created: bool,
}

fn flock(f: &File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain syscall on a file descriptor we own.
    let r = unsafe { libc::flock(f.as_raw_fd(), op) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn would_block(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EWOULDBLOCK) || e.raw_os_error() == Some(libc::EAGAIN)
}

/// File systems without flock (some network mounts) get no lock rather than no build.
fn unsupported(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOLCK) | Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS))
}

impl BuildLock {
    /// Take the lock of the build into `output` (created if needed).
    pub fn acquire(output: &Path) -> Result<BuildLock> {
        std::fs::create_dir_all(output).map_err(|e| Error::io(output, e))?;
        let path = output.join(LOCK_NAME);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let created = !path.exists();
            let file =
                OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|e| Error::io(&path, e))?;
            match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => {}
                Err(e) if unsupported(&e) => return Ok(BuildLock { file, path, created }),
                // A follow reader testing the lock holds it (shared) for microseconds.
                Err(e) if would_block(&e) && attempt < 50 => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) if would_block(&e) => {
                    return Err(Error::OutputExists(format!(
                        "{}: another tokshuf build is writing into this folder (it holds {LOCK_NAME}); wait for it to finish or stop it",
                        output.display()
                    )))
                }
                Err(e) => return Err(Error::io(&path, e)),
            }
            // The holder before us may have removed the file (build complete) after we opened
            // it: then we locked an orphan; lock the file that is there now instead.
            let same = match (file.metadata(), std::fs::metadata(&path)) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            };
            if same {
                return Ok(BuildLock { file, path, created });
            }
        }
    }

    /// The cache is complete (or the build was refused): remove the file, then drop the lock.
    pub fn remove(self) -> Result<()> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&self.path, e)),
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

/// What a follow reader learns from the lock of `output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildState {
    Running,
    NotRunning,
    /// The file system does not support locks: the reader can only wait (and time out).
    Unknown,
}

/// Is a build holding the lock of `output` right now?
pub fn build_state(output: &Path) -> BuildState {
    let path = output.join(LOCK_NAME);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BuildState::NotRunning,
        Err(_) => return BuildState::Unknown,
    };
    match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
        Ok(()) => {
            let _ = flock(&file, libc::LOCK_UN);
            BuildState::NotRunning
        }
        Err(e) if would_block(&e) => BuildState::Running,
        Err(_) => BuildState::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_and_state_follows_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c");
        assert_eq!(build_state(&out), BuildState::NotRunning);
        let lock = BuildLock::acquire(&out).unwrap();
        assert!(lock.created);
        assert_eq!(build_state(&out), BuildState::Running);
        let e = BuildLock::acquire(&out).unwrap_err();
        assert!(matches!(e, Error::OutputExists(_)), "{e}");
        drop(lock);
        // Released (process died): the file stays, nobody holds it.
        assert_eq!(build_state(&out), BuildState::NotRunning);
        let again = BuildLock::acquire(&out).unwrap();
        assert!(!again.created);
        again.remove().unwrap();
        assert!(!out.join(LOCK_NAME).exists());
    }
}
