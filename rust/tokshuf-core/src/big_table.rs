//! Fixed-size tables of many megabytes read at random (the memo, the token table), and large
//! files read whole (a manifest), on huge pages where the kernel gives them.
//!
//! Every lookup in such a table lands on a page of its own: with 4 KiB pages a thread's
//! memo and token table span more pages than the TLB holds, so most lookups also walk the
//! page tables. The table is aligned to 2 MiB and marked `MADV_HUGEPAGE` before its pages
//! are first written, so that Linux (whose default is often `madvise` only) backs it with
//! 2 MiB pages. Elsewhere, or when the kernel declines, it is an ordinary allocation.
//!
//! A file read whole into fresh memory costs more in page faults than in copying: 4,000
//! faults for a 16 MB manifest, against 8 on huge pages.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::io::Read;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::ptr::NonNull;

const HUGE: usize = 2 << 20;

pub struct BigTable<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: it owns its elements like a `Box<[T]>`.
unsafe impl<T: Copy + Send> Send for BigTable<T> {}
unsafe impl<T: Copy + Sync> Sync for BigTable<T> {}

impl<T: Copy> BigTable<T> {
    /// `len` (at least 1) copies of `fill`.
    pub fn new(len: usize, fill: T) -> Self {
        assert!(len > 0 && std::mem::size_of::<T>() > 0);
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc(layout) } as *mut T;
        let Some(ptr) = NonNull::new(raw) else { handle_alloc_error(layout) };
        if layout.align() == HUGE {
            advise_huge(raw as *mut u8, layout.size());
        }
        for i in 0..len {
            // SAFETY: `i < len` elements were allocated; each is written once before any read.
            unsafe { raw.add(i).write(fill) };
        }
        BigTable { ptr, len }
    }

    /// Tables of at least one huge page start on a huge page boundary, others on a cache line.
    fn layout(len: usize) -> Layout {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("table size");
        let align = if bytes >= HUGE { HUGE } else { std::mem::align_of::<T>().max(64) };
        Layout::from_size_align(bytes, align).expect("table layout")
    }
}

#[cfg(target_os = "linux")]
fn advise_huge(p: *mut u8, len: usize) {
    // SAFETY: advice on memory this table owns; the result does not matter.
    unsafe { libc::madvise(p as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: *mut u8, _: usize) {}

impl<T: Copy> Deref for BigTable<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialized elements, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> DerefMut for BigTable<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> Drop for BigTable<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; `T: Copy` has no drop of its own.
        unsafe { dealloc(self.ptr.as_ptr() as *mut u8, Self::layout(self.len)) };
    }
}

/// The bytes of a whole file (`read_file`).
pub enum FileBytes {
    Huge(BigTable<u8>, usize),
    Plain(Vec<u8>),
}

impl Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Huge(table, len) => &table[..*len],
            FileBytes::Plain(v) => v,
        }
    }
}

/// `std::fs::read`, into a `BigTable` when the file is large.
pub fn read_file(path: &Path) -> std::io::Result<FileBytes> {
    let f = std::fs::File::open(path)?;
    let size = usize::try_from(f.metadata()?.len()).unwrap_or(usize::MAX);
    read_whole(f, size)
}

/// All of `f`, which said it holds `size` bytes.
fn read_whole(mut f: impl Read, size: usize) -> std::io::Result<FileBytes> {
    // One byte more than the file's size: a file that grew since is then read on to its end.
    let Some(room) = size.checked_add(1).filter(|_| size >= HUGE) else {
        let mut v = Vec::with_capacity(size.min(HUGE));
        f.read_to_end(&mut v)?;
        return Ok(FileBytes::Plain(v));
    };
    let mut table = BigTable::new(room, 0u8);
    let mut len = 0;
    while len < table.len() {
        match f.read(&mut table[len..]) {
            Ok(0) => return Ok(FileBytes::Huge(table, len)),
            Ok(k) => len += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut v = table.to_vec();
    f.read_to_end(&mut v)?;
    Ok(FileBytes::Plain(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_read_whole_is_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, HUGE - 1, HUGE, 3 * HUGE + 5] {
            let path = dir.path().join(format!("f{len}"));
            let bytes: Vec<u8> = (0..len).map(|k| (k * 7 + k / 4096) as u8).collect();
            std::fs::write(&path, &bytes).unwrap();
            let got = read_file(&path).unwrap();
            assert_eq!(matches!(got, FileBytes::Huge(..)), len >= HUGE, "{len}");
            assert!(*got == bytes[..], "{len}");
        }
        assert_eq!(read_file(&dir.path().join("missing")).err().map(|e| e.kind()), Some(std::io::ErrorKind::NotFound));
        // A file that shrank or grew between its size and its reading.
        let bytes: Vec<u8> = (0..2 * HUGE).map(|k| (k % 251) as u8).collect();
        for said in [HUGE, 2 * HUGE - 1, 2 * HUGE, 3 * HUGE] {
            assert!(*read_whole(&bytes[..], said).unwrap() == bytes[..], "{said}");
        }
    }

    #[test]
    fn holds_its_fill_and_what_is_written() {
        for len in [1usize, 1000, (3 << 20) / 8 + 5] {
            let mut t = BigTable::new(len, 7u64);
            assert_eq!(t.len(), len);
            assert!(t.iter().all(|&x| x == 7));
            t[len - 1] = 9;
            assert_eq!(t[len - 1], 9);
        }
    }
}
