//! Fork safety for the reader's mutable state.

use std::sync::atomic::{AtomicPtr, Ordering};

/// A value that belongs to one process: after a fork the child gets a fresh one, never touching
/// the parent's (whose locks may have been held by threads that do not exist in the child).
/// Replaced slots are leaked on purpose: at most one per fork.
pub struct PerProcess<T> {
    ptr: AtomicPtr<(u32, T)>,
}

impl<T> PerProcess<T> {
    pub fn new() -> Self {
        PerProcess { ptr: AtomicPtr::new(std::ptr::null_mut()) }
    }
    pub fn get(&self, make: impl FnOnce() -> T) -> &T {
        let pid = std::process::id();
        let cur = self.ptr.load(Ordering::Acquire);
        // SAFETY: non-null pointers come from Box::into_raw below and are freed only in Drop.
        if !cur.is_null() && unsafe { (*cur).0 } == pid {
            return unsafe { &(*cur).1 };
        }
        let fresh = Box::into_raw(Box::new((pid, make())));
        match self.ptr.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => unsafe { &(*fresh).1 },
            Err(other) => {
                // Another thread of this process installed one first.
                drop(unsafe { Box::from_raw(fresh) });
                unsafe { &(*other).1 }
            }
        }
    }
}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let p = *self.ptr.get_mut();
        if !p.is_null() && unsafe { (*p).0 } == std::process::id() {
            drop(unsafe { Box::from_raw(p) });
        }
    }
}
