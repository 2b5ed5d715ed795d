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

/// Buffers of batches given back. A cache owns one pool, shared by its readers one after the
/// other: a new single pass fills the buffers the last one freed instead of faulting in new
/// pages, which with two read threads cost as much as the pass itself on a small cache. It
/// holds at most as many buffers as the readers reading now keep in flight (holding more would
/// only hold memory: a shallow reader after a deep one must not keep the deep one's) and, when
/// none is reading, as many as the last ones had in flight.
pub struct BufferPool {
    /// Buffers the readers reading now keep in flight, in all (`Reservation`s).
    reserved: AtomicUsize,
    /// `reserved` before it last fell to 0: what is kept while no reader reads.
    idle: AtomicUsize,
    /// Per process: a child forked while a parent's thread held the lock starts empty.
    free: PerProcess<Mutex<Vec<Batch>>>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferPool(keep {})", self.keep())
    }
}

/// One reader's share of a pool's `reserved`, given back when the reader is dropped.
#[derive(Debug, Default)]
pub struct Reservation(AtomicUsize);

impl BufferPool {
    pub fn new() -> BufferPool {
        BufferPool { reserved: AtomicUsize::new(0), idle: AtomicUsize::new(0), free: PerProcess::new() }
    }

    /// Buffers held at most: what the readers reading keep in flight, or, while none reads,
    /// what the last ones kept; never fewer than one batch being read while the consumer holds
    /// the previous one.
    fn keep(&self) -> usize {
        match self.reserved.load(Ordering::Relaxed) {
            0 => self.idle.load(Ordering::Relaxed),
            n => n,
        }
        .max(2)
    }

    /// The reader holding `r` keeps `n` buffers in flight now (0: it is done).
    pub fn reserve(&self, r: &Reservation, n: usize) {
        let old = r.0.swap(n, Ordering::Relaxed);
        if n >= old {
            self.reserved.fetch_add(n - old, Ordering::Relaxed);
        } else {
            let before = self.reserved.fetch_sub(old - n, Ordering::Relaxed);
            if before == old - n {
                self.idle.store(before, Ordering::Relaxed);
            }
        }
        let keep = self.keep();
        self.free().truncate(keep);
    }

    /// The reader holding `r` reads on the caller's thread: one batch being filled, one held.
    pub fn reserve_unless_reading_ahead(&self, r: &Reservation) {
        if r.0.load(Ordering::Relaxed) == 0 {
            self.reserve(r, 2);
        }
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
        if free.len() < self.keep() {
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
        let (a, b) = (Reservation::default(), Reservation::default());
        pool.reserve(&a, 3);
        pool.reserve(&b, 1);
        pool.reserve(&a, 4);
        for _ in 0..6 {
            pool.give(Batch::I64(vec![0; 4]));
        }
        assert_eq!(pool.free().len(), 5, "what both readers keep in flight");
        pool.reserve(&a, 0);
        assert_eq!(pool.free().len(), 2, "a reader done: the one still reading keeps one in flight");
        for _ in 0..6 {
            pool.give(Batch::I64(vec![0; 4]));
        }
        assert_eq!(pool.free().len(), 2);
        pool.reserve(&b, 0);
        assert_eq!(pool.free().len(), 2, "the last reader kept one in flight: two are held");
        // A deep reader, done, then a shallow one: the shallow one keeps its own depth only.
        pool.reserve(&a, 9);
        for _ in 0..9 {
            pool.give(Batch::I64(vec![0; 4]));
        }
        pool.reserve(&a, 0);
        assert_eq!(pool.free().len(), 9, "nobody reads: held for the next reader");
        pool.reserve_unless_reading_ahead(&b);
        assert_eq!(pool.free().len(), 2, "a reader without read-ahead needs two");
        pool.reserve_unless_reading_ahead(&b);
        pool.reserve(&b, 0);
        assert_eq!(pool.free().len(), 2);
        assert_eq!(pool.reserved.load(Ordering::Relaxed), 0);
        // Single passes one after the other fill the same buffers.
        let c = Reservation::default();
        pool.reserve(&c, 8);
        let held: Vec<Vec<i64>> = (0..8).map(|_| pool.take(4)).collect();
        let ptrs: Vec<*const i64> = held.iter().map(|v| v.as_ptr()).collect();
        for v in held {
            pool.give(Batch::I64(v));
        }
        pool.reserve(&c, 0);
        let d = Reservation::default();
        pool.reserve(&d, 8);
        let again: Vec<Vec<i64>> = (0..8).map(|_| pool.take(4)).collect();
        assert!(again.iter().all(|v| ptrs.contains(&v.as_ptr())), "the next pass reuses all eight");
        for v in again {
            pool.give(Batch::I64(v));
        }
        pool.reserve(&d, 3);
        assert_eq!(pool.free().len(), 3, "its reader keeps fewer in flight");
        pool.reserve(&d, 0);
        assert_eq!(pool.free().len(), 3, "and is done: they wait for the next one");
    }
}
