//! Reading stage 1's spills (one file of fixed-size contexts per input file) by context id.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::cells::unpack;
use super::stage1;
use crate::error::{Error, Result};

/// Spill files of stage 1, read by position. Few files stay open; many are opened per use,
/// so no build needs a raised open-file limit.
pub struct Spills {
    paths: Vec<PathBuf>,
    open: Option<Vec<File>>,
    context_bytes: u64,
}

const KEEP_OPEN: usize = 256;

impl Spills {
    pub fn open(work: &Path, n: usize, context_bytes: u64) -> Result<Self> {
        let paths: Vec<PathBuf> = (0..n).map(|f| stage1::spill_path(work, f)).collect();
        let open = if n <= KEEP_OPEN {
            Some(paths.iter().map(|p| File::open(p).map_err(|e| Error::io(p, e))).collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        Ok(Spills { paths, open, context_bytes })
    }

    pub fn context_bytes(&self) -> u64 {
        self.context_bytes
    }

    /// Spill `f`, from the files kept open or from `cache` (a caller's own few open files).
    fn file<'a>(&'a self, cache: &'a mut HashMap<usize, File>, f: usize) -> Result<&'a File> {
        if let Some(files) = &self.open {
            return Ok(&files[f]);
        }
        if cache.len() >= KEEP_OPEN / 4 && !cache.contains_key(&f) {
            cache.clear();
        }
        Ok(match cache.entry(f) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(File::open(&self.paths[f]).map_err(|err| Error::io(&self.paths[f], err))?)
            }
        })
    }

    pub fn read(&self, cache: &mut HashMap<usize, File>, id: u64, buf: &mut [u8]) -> Result<()> {
        let (f, p) = unpack(id);
        let file = self.file(cache, f)?;
        file.read_exact_at(buf, p * self.context_bytes).map_err(|e| Error::io(&self.paths[f], e))
    }

    /// Announce a read of `n` contexts from `id` on: the kernel starts reading what is not in
    /// the page cache without waiting for it.
    pub fn will_need(&self, cache: &mut HashMap<usize, File>, id: u64, n: u64) -> Result<()> {
        let (f, p) = unpack(id);
        let file = self.file(cache, f)?;
        advise_will_need(file, p * self.context_bytes, n * self.context_bytes);
        Ok(())
    }
}

/// Unpacked builds: the examples of one length bin, read by id from the spills through each
/// file's positions for the bin (`stage1::pos_path`).
pub struct BinSpills {
    spills: Vec<PathBuf>,
    positions: Vec<PathBuf>,
    dtype_size: u64,
}

impl BinSpills {
    pub fn open(work: &Path, n: usize, bin: usize, dtype_size: u64) -> Self {
        BinSpills {
            spills: (0..n).map(|f| stage1::spill_path(work, f)).collect(),
            positions: (0..n).map(|f| stage1::pos_path(work, f, bin)).collect(),
            dtype_size,
        }
    }

    /// Example `id` of the bin into `buf` (resized to its bytes). `cache` keeps files open
    /// between calls of one thread.
    pub fn read(&self, cache: &mut HashMap<usize, (File, File)>, id: u64, buf: &mut Vec<u8>) -> Result<()> {
        let (f, p) = unpack(id);
        if cache.len() >= KEEP_OPEN / 4 && !cache.contains_key(&f) {
            cache.clear();
        }
        let (spill, pos) = match cache.entry(f) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let open = |p: &PathBuf| File::open(p).map_err(|err| Error::io(p, err));
                e.insert((open(&self.spills[f])?, open(&self.positions[f])?))
            }
        };
        let mut entry = [0u8; stage1::POS_BYTES as usize];
        pos.read_exact_at(&mut entry, p * stage1::POS_BYTES).map_err(|e| Error::io(&self.positions[f], e))?;
        let at = u64::from_le_bytes(entry[..8].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(entry[8..].try_into().unwrap_or_default());
        buf.resize((len * self.dtype_size) as usize, 0);
        spill.read_exact_at(buf, at).map_err(|e| Error::io(&self.spills[f], e))
    }
}

#[cfg(target_os = "linux")]
fn advise_will_need(file: &File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a valid descriptor and plain integers; advice only, its result does not matter.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), offset as i64, len as i64, libc::POSIX_FADV_WILLNEED) };
}

#[cfg(not(target_os = "linux"))]
fn advise_will_need(_: &File, _: u64, _: u64) {}
