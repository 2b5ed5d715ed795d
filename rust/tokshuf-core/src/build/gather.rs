//! Stage 2's reads: a chunk's contexts, in the chunk's (shuffled) order, from the spills.
//!
//! A chunk's contexts lie all over the spills: at scale, one in a hundred contexts of every
//! spill, once the build has more than a hundred chunks. While the spills are in the page
//! cache any order of reads costs the same; once a large build has pushed them out, each read
//! is a random 4 KiB read from disk, one at a time, and stage 2 runs at the disk's random-read
//! speed rather than its sequential speed. So the reads of a window of contexts (up to a chunk,
//! as `memory_limit` allows) are first announced to the kernel (`POSIX_FADV_WILLNEED`, which
//! queues them all without waiting, so the disk sees a deep queue instead of one read at a
//! time). They are then made a few at a time (`BUFFER_BYTES`), in spill order, into a buffer
//! from which the chunk is written in its own order. The buffer stays in cache while it is
//! filled and copied out, and the shard's writing (paced by the disk) alternates with reading,
//! rather than following the read of a whole chunk.

use std::collections::HashMap;
use std::fs::File;

use super::cells::POS_BITS;
use super::spills::Spills;
use crate::error::Result;

/// Bytes between two reads below which the gap is read rather than skipped: about what a disk
/// reads sequentially in the time of one random read.
const MERGE_GAP: u64 = 256 << 10;

/// Bytes of contexts read into the buffer at a time: well inside L2 and L3.
const BUFFER_BYTES: usize = 2 << 20;

/// Reads contexts `ids[i]` for i = 0, 1, 2, ... (in that order), announcing `window` of them
/// at a time.
pub struct Gather<'a> {
    spills: &'a Spills,
    ids: &'a [u64],
    window: usize,
    /// Contexts read into `buf` at a time.
    batch: usize,
    /// Contexts `..announced` have been announced.
    announced: usize,
    context_bytes: usize,
    /// Contexts `first..first + loaded` are in `buf`, in chunk order.
    first: usize,
    loaded: usize,
    buf: Vec<u8>,
    order: Vec<usize>,
    open: HashMap<usize, File>,
}

impl<'a> Gather<'a> {
    pub fn new(spills: &'a Spills, ids: &'a [u64], window: usize) -> Self {
        Self::with_buffer(spills, ids, window, BUFFER_BYTES)
    }

    fn with_buffer(spills: &'a Spills, ids: &'a [u64], window: usize, buffer_bytes: usize) -> Self {
        let window = window.clamp(1, ids.len().max(1));
        let context_bytes = spills.context_bytes() as usize;
        let batch = (buffer_bytes / context_bytes.max(1)).clamp(1, window);
        Gather {
            spills,
            ids,
            window,
            batch,
            announced: 0,
            context_bytes,
            first: 0,
            loaded: 0,
            buf: Vec::new(),
            order: Vec::with_capacity(batch),
            open: HashMap::new(),
        }
    }

    /// Context `ids[i]` into `out`.
    pub fn read(&mut self, i: usize, out: &mut [u8]) -> Result<()> {
        if !(self.first..self.first + self.loaded).contains(&i) {
            self.load(i)?;
        }
        let at = (i - self.first) * self.context_bytes;
        out.copy_from_slice(&self.buf[at..at + self.context_bytes]);
        Ok(())
    }

    fn load(&mut self, first: usize) -> Result<()> {
        let n = self.batch.min(self.ids.len() - first);
        if first + n > self.announced {
            let end = (first + self.window).min(self.ids.len());
            let mut window = self.ids[first.max(self.announced)..end].to_vec();
            // Packed ids sort by (file, position): spill order.
            window.sort_unstable();
            if window.len() > 1 {
                self.announce(&window)?;
            }
            self.announced = end;
        }
        let ids = &self.ids[first..first + n];
        let cb = self.context_bytes;
        self.buf.resize(n * cb, 0);
        self.order.clear();
        self.order.extend(0..n);
        self.order.sort_unstable_by_key(|&j| ids[j]);
        for &j in &self.order {
            self.spills.read(&mut self.open, ids[j], &mut self.buf[j * cb..(j + 1) * cb])?;
        }
        self.first = first;
        self.loaded = n;
        Ok(())
    }

    /// Tell the kernel every read of a window at once (`sorted`: its ids in spill order).
    /// Reads less than `MERGE_GAP` apart are announced as one range, gap included: reading the
    /// gap costs the disk less than another request, and a dense window then reads its spills
    /// front to back.
    fn announce(&mut self, sorted: &[u64]) -> Result<()> {
        let gap = MERGE_GAP.div_ceil(self.context_bytes as u64);
        let mut run: Option<(u64, u64)> = None; // (first id, contexts up to the last one read)
        for &id in sorted {
            run = match run {
                // Ids of one file differ in their low bits only (`cells::pack`).
                Some((start, len)) if id >= start + len && id - (start + len) <= gap && (id ^ start) >> POS_BITS == 0 => {
                    Some((start, id - start + 1))
                }
                Some((start, len)) => {
                    self.spills.will_need(&mut self.open, start, len)?;
                    Some((id, 1))
                }
                None => Some((id, 1)),
            };
        }
        if let Some((start, len)) = run {
            self.spills.will_need(&mut self.open, start, len)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::cells::{pack, unpack};
    use crate::build::stage1::spill_path;

    #[test]
    fn returns_each_context_in_the_order_asked_whatever_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let (cb, counts) = (6usize, [5u64, 0, 9, 3]);
        let context = |f: usize, p: u64| -> Vec<u8> { (0..cb).map(|k| (f * 100 + p as usize * 7 + k) as u8).collect() };
        for (f, &n) in counts.iter().enumerate() {
            let data: Vec<u8> = (0..n).flat_map(|p| context(f, p)).collect();
            std::fs::write(spill_path(dir.path(), f), data).unwrap();
        }
        let spills = Spills::open(dir.path(), counts.len(), cb as u64).unwrap();
        // Every context once, in a scrambled order, as a chunk holds them.
        let mut ids: Vec<u64> = counts.iter().enumerate().flat_map(|(f, &n)| (0..n).map(move |p| pack(f, p))).collect();
        let mut x = 12345u64;
        for i in (1..ids.len()).rev() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ids.swap(i, (x >> 33) as usize % (i + 1));
        }
        for window in [1, 2, 5, ids.len(), 1000] {
            for buffer in [cb, 3 * cb, 1 << 20] {
                let mut g = Gather::with_buffer(&spills, &ids, window, buffer);
                let mut out = vec![0u8; cb];
                for (i, &id) in ids.iter().enumerate() {
                    g.read(i, &mut out).unwrap();
                    let (f, p) = unpack(id);
                    assert_eq!(out, context(f, p), "window {window}, buffer {buffer}, context {i}");
                }
            }
        }
    }
}
