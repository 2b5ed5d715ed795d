//! Batch buffers handed back for reuse.
//!
//! A batch is a few MiB, allocated on a read-ahead thread and freed on the consumer's. glibc's
//! malloc serves such sizes with fresh mappings or trims them off its heaps when they are
//! freed, so without reuse nearly every batch comes back from the kernel as new pages, faulted
//! in and zeroed one by one: that costs about as much as filling the batch. A reader's
//! batches all have one shape, so the buffer of a batch the consumer is done with (the
//! bindings hand it back when its NumPy array is freed) is simply filled again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::per_process::PerProcess;
use super::reader::Batch;

/// Output element types that a `Batch` holds.
pub trait Element: Sized {
    fn into_batch(v: Vec<Self>) -> Batch;
    fn from_batch(b: Batch) -> Result<Vec<Self>, Batch>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            fn into_batch(v: Vec<Self>) -> Batch {
                Batch::$variant(v)
            }
            fn from_batch(b: Batch) -> Result<Vec<Self>, Batch> {
                match b {
                    Batch::$variant(v) => Ok(v),
                    other => Err(other),
                }
            }
        }
    };
}
element!(u16, U16);
element!(u32, U32);
element!(i32, I32);
element!(i64, I64);

/// Buffers of batches given back, at most `keep` of them (as many as read-ahead keeps in
/// flight: holding more would only hold memory).
pub struct BufferPool {
    keep: AtomicUsize,
    /// Per process: a child forked while a parent's thread held the lock starts empty.
    free: PerProcess<Mutex<Vec<Batch>>>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferPool(keep {})", self.keep.load(Ordering::Relaxed))
    }
}

impl BufferPool {
    /// Enough for one batch being read while the consumer holds the previous one.
    pub fn new() -> BufferPool {
        BufferPool { keep: AtomicUsize::new(2), free: PerProcess::new() }
    }

    /// Keep up to `n` buffers (never fewer than 2).
    pub fn keep(&self, n: usize) {
        self.keep.store(n.max(2), Ordering::Relaxed);
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<Batch>> {
        self.free.get(|| Mutex::new(Vec::new())).lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty vector with room for `n` elements: a buffer given back, else a new one.
    pub fn take<T: Element>(&self, n: usize) -> Vec<T> {
        let mut free = self.free();
        while let Some(b) = free.pop() {
            match T::from_batch(b) {
                Ok(mut v) => {
                    drop(free);
                    v.clear();
                    v.reserve(n);
                    return v;
                }
                // A buffer of another element type (never with one reader's batches): drop it.
                Err(_) => continue,
            }
        }
        Vec::with_capacity(n)
    }

    /// A batch the consumer is done with.
    pub fn give(&self, b: Batch) {
        let mut free = self.free();
        if free.len() < self.keep.load(Ordering::Relaxed) {
            free.push(b);
        }
    }
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_up_to_keep() {
        let pool = BufferPool::new();
        let mut v: Vec<u16> = pool.take(1000);
        v.extend(0..1000);
        let ptr = v.as_ptr();
        pool.give(Batch::U16(v));
        let again: Vec<u16> = pool.take(500);
        assert_eq!((again.as_ptr(), again.len()), (ptr, 0), "the same buffer, emptied");
        let wider: Vec<i64> = pool.take(10);
        assert!(wider.capacity() >= 10);
        for _ in 0..5 {
            pool.give(Batch::I64(vec![0; 4]));
        }
        assert_eq!(pool.free().len(), 2, "at most `keep` buffers are held");
        pool.keep(4);
        for _ in 0..5 {
            pool.give(Batch::I64(vec![0; 4]));
        }
        assert_eq!(pool.free().len(), 4);
    }
}
