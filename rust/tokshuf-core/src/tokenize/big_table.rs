//! Fixed-size tables of many megabytes read at random (the memo, the token table), on huge
//! pages where the kernel gives them.
//!
//! Every lookup in such a table lands on a page of its own: with 4 KiB pages a thread's
//! memo and token table span more pages than the TLB holds, so most lookups also walk the
//! page tables. The table is aligned to 2 MiB and marked `MADV_HUGEPAGE` before its pages
//! are first written, so that Linux (whose default is often `madvise` only) backs it with
//! 2 MiB pages. Elsewhere, or when the kernel declines, it is an ordinary allocation.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ops::{Deref, DerefMut};
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

#[cfg(test)]
mod tests {
    use super::*;

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
