//! The documents of one best-fit window (`pack`), held until the window is full and packed.
//!
//! Ids are kept in memory up to a budget (`Stage1Config::window_bytes`: `pack_window`
//! contexts, or as much as the longest line a build holds if more, which follows
//! `memory_limit`), the amount the build's memory accounting counts. Long documents would
//! otherwise hold the window far past that (1,100 documents of 512 KiB held 715–758 MiB with
//! `memory_limit=64M`, `benches/memory_bench.py`), so once the budget is spent the rest of the
//! window goes to an unnamed temporary file in the work folder (gone with the process, whatever
//! happens to it), in the spill's dtype, read back piece by piece as contexts are written.
//! Where the ids wait never changes the contexts.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::build::stage1::encode_ids;
use crate::error::{Error, Result};
use crate::format::{decode_ids, Dtype};

pub(super) struct DocWindow {
    /// Where each document starts: in `ids` for the first `in_memory`, in the file after.
    starts: Vec<u64>,
    lens: Vec<usize>,
    in_memory: usize,
    ids: Vec<u32>,
    budget: usize,
    dir: PathBuf,
    /// The overflow file, its ids as the spill stores them, and the ids written to it.
    dtype: Dtype,
    file: Option<BufWriter<File>>,
    file_ids: u64,
    bytes: Vec<u8>,
}

impl DocWindow {
    /// A window holding up to `budget` ids in memory, its overflow (ids of `dtype`) in `dir`.
    pub(super) fn new(budget: usize, dtype: Dtype, dir: &Path) -> DocWindow {
        DocWindow {
            starts: Vec::new(),
            lens: Vec::new(),
            in_memory: 0,
            ids: Vec::new(),
            budget,
            dir: dir.to_path_buf(),
            dtype,
            file: None,
            file_ids: 0,
            bytes: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.lens.len()
    }

    pub(super) fn lens(&self) -> &[usize] {
        &self.lens
    }

    pub(super) fn push(&mut self, doc: &[u32]) -> Result<()> {
        if self.file_ids == 0 && self.ids.len() + doc.len() <= self.budget {
            self.starts.push(self.ids.len() as u64);
            self.ids.extend_from_slice(doc);
            self.in_memory += 1;
        } else {
            let file = match &mut self.file {
                Some(f) => f,
                None => {
                    let f = tempfile::tempfile_in(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
                    self.file.insert(BufWriter::with_capacity(1 << 20, f))
                }
            };
            self.starts.push(self.file_ids);
            encode_ids(self.dtype, doc, &mut self.bytes);
            crate::testhook::charge(self.bytes.len()).and_then(|_| file.write_all(&self.bytes)).map_err(|e| Error::io(&self.dir, e))?;
            self.file_ids += doc.len() as u64;
        }
        self.lens.push(doc.len());
        Ok(())
    }

    /// Append ids `start..end` of document `doc` to `out`.
    pub(super) fn piece(&mut self, doc: usize, start: usize, end: usize, out: &mut Vec<u32>) -> Result<()> {
        let at = self.starts[doc] as usize;
        if doc < self.in_memory {
            out.extend_from_slice(&self.ids[at + start..at + end]);
            return Ok(());
        }
        let file = self.file.as_mut().expect("documents past the budget are in the file");
        file.flush().map_err(|e| Error::io(&self.dir, e))?;
        let size = self.dtype.size();
        self.bytes.resize((end - start) * size, 0);
        file.get_ref().read_exact_at(&mut self.bytes, ((at + start) * size) as u64).map_err(|e| Error::io(&self.dir, e))?;
        out.extend(decode_ids(self.dtype, &self.bytes));
        Ok(())
    }

    /// Empty the window for the next one.
    pub(super) fn clear(&mut self) {
        self.starts.clear();
        self.lens.clear();
        self.in_memory = 0;
        self.ids.clear();
        // The next window past the budget gets a new file; what this one buffered is dropped
        // unwritten.
        if let Some(f) = self.file.take() {
            drop(f.into_parts());
        }
        self.file_ids = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces read back equal the documents pushed, in memory and past the budget, over
    /// several windows, for either dtype of the spill.
    #[test]
    fn pieces_equal_the_documents_wherever_they_wait() {
        let dir = tempfile::tempdir().unwrap();
        for dtype in [Dtype::Uint16, Dtype::Uint32] {
            let mut w = DocWindow::new(100, dtype, dir.path());
            for round in 0..3u32 {
                // Ids differ by round, document and position, and fit either dtype.
                let docs: Vec<Vec<u32>> =
                    (0..12u32).map(|d| (0..(d * 7 + round) % 50 + 1).map(|i| round * 1000 + d * 50 + i).collect()).collect();
                for d in &docs {
                    w.push(d).unwrap();
                }
                assert!(w.file_ids > 0 && w.in_memory > 0, "both kinds of document");
                assert_eq!(w.lens(), docs.iter().map(Vec::len).collect::<Vec<_>>());
                for (k, d) in docs.iter().enumerate().rev() {
                    for (s, e) in [(0, d.len()), (d.len() / 3, d.len() / 2 + 1)] {
                        let mut out = vec![7];
                        w.piece(k, s, e, &mut out).unwrap();
                        assert_eq!(out[1..], d[s..e], "{dtype:?} round {round} doc {k} {s}..{e}");
                    }
                }
                w.clear();
                assert_eq!(w.len(), 0);
            }
        }
    }
}
