//! Batch assembly and read-ahead over a `Source` (DESIGN §6).
//!
//! A global batch is examples `[first, first + B)`; rank r of R takes `first + r + j R` for
//! j = 0 .. B/R (fewer at the end of a finite source). Batches are pure functions of `first`,
//! so read-ahead is only an optimisation: `Prefetcher` worker w assembles batches w, w + W, ...
//! into its own bounded channel and the consumer takes them round-robin, in order.
//! Nothing here is started at construction; callers start a prefetcher on first use and start
//! a new one after a fork (threads do not survive fork; see `Prefetcher::drop`).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::buffers::{BufferPool, Element, Reservation};
use crate::error::{Error, Result};
use crate::read::cache::{holds_ids, Cache, Id};
use crate::read::order::{Loc, Source};

/// Element type of the batches handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutDtype {
    U16,
    U32,
    I32,
    I64,
}

/// One rank's slice of one global batch: `rows x seqlen` ids, row-major.
#[derive(Debug)]
pub enum Batch {
    U16(Vec<u16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Batch {
    pub fn len(&self) -> usize {
        match self {
            Batch::U16(v) => v.len(),
            Batch::U32(v) => v.len(),
            Batch::I32(v) => v.len(),
            Batch::I64(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything that defines what a rank reads; immutable, shared with worker threads.
pub struct BatchSpec {
    pub caches: Vec<Arc<Cache>>,
    pub source: Arc<dyn Source>,
    pub batch_size: u64,
    pub rank: u64,
    pub world_size: u64,
    pub seqlen: usize,
    pub dtype: OutDtype,
    /// Batches start at `first < end` (for a finite source; `drop_last` lowers it).
    pub end: Option<u64>,
    /// A finite source whose length is not known yet (single pass following a build): the
    /// end is found by `has_batch_wait`.
    pub end_pending: bool,
    pub drop_last: bool,
    /// Buffers of batches the consumer gave back (the first cache's pool).
    pub buffers: Arc<BufferPool>,
    /// This reader's share of what `buffers` holds.
    reserved: Reservation,
}

impl Drop for BatchSpec {
    fn drop(&mut self) {
        self.buffers.reserve(&self.reserved, 0);
    }
}

/// Memory of one batch of `rows` rows of `width` ids while it is assembled, with the
/// bookkeeping of the `examples` it is drawn from (`None`: beyond u64).
pub fn batch_bytes(examples: u64, rows: u64, width: usize, dtype: OutDtype) -> Option<u64> {
    const PER_EXAMPLE: u64 = 64; // its index, `Loc` and read pair
    rows.checked_mul((width as u64).checked_mul(dtype.size() as u64)?)?.checked_add(examples.checked_mul(PER_EXAMPLE)?)
}

/// A cancel flag nobody sets.
static NEVER: AtomicBool = AtomicBool::new(false);

fn end_of(n: u64, batch_size: u64, drop_last: bool) -> u64 {
    if drop_last {
        n.saturating_sub(batch_size) + u64::from(n >= batch_size)
    } else {
        n
    }
}

/// Largest example index accepted: keeps every position computation inside u64.
pub const MAX_EXAMPLE: u64 = 1 << 62;

impl BatchSpec {
    pub fn new(
        caches: Vec<Arc<Cache>>,
        source: Arc<dyn Source>,
        batch_size: u64,
        rank: u64,
        world_size: u64,
        dtype: OutDtype,
        drop_last: bool,
    ) -> Result<BatchSpec> {
        if caches.is_empty() {
            return Err(Error::Config("no cache to read".into()));
        }
        let seqlen = caches[0].seqlen();
        if caches.iter().any(|c| c.seqlen() != seqlen) {
            return Err(Error::Config("all caches of a reader must have the same seqlen".into()));
        }
        if let Some(c) = caches.iter().find(|c| c.is_empty() && c.final_plan) {
            return Err(Error::Config(format!("{}: cache holds no contexts", c.root.display())));
        }
        if world_size == 0 || rank >= world_size {
            return Err(Error::Config(format!("rank {rank} out of range for world_size {world_size}")));
        }
        if batch_size == 0 || batch_size % world_size != 0 {
            return Err(Error::Config(format!("batch_size {batch_size} must be a positive multiple of world_size {world_size}")));
        }
        for c in &caches {
            holds_ids(dtype.size(), c.meta.dtype)?;
        }
        let rows = batch_size / world_size;
        crate::memory::check_fits(batch_bytes(rows, rows, seqlen, dtype), || {
            format!("a batch of {rows} rows of {seqlen} ids (batch_size {batch_size}, world_size {world_size})")
        })?;
        let end = source.num_examples().map(|n| end_of(n, batch_size, drop_last));
        let end_pending = source.len_pending();
        let buffers = caches[0].buffers.clone();
        let reserved = Reservation::default();
        Ok(BatchSpec { caches, source, batch_size, rank, world_size, seqlen, dtype, end, end_pending, drop_last, buffers, reserved })
    }

    /// Does any cache follow a running build (so reads may wait)?
    pub fn follows(&self) -> bool {
        self.caches.iter().any(|c| c.is_following())
    }

    /// `has_batch`, finding the end of a single pass that follows a build (may wait).
    pub fn has_batch_wait(&self, first: u64, cancel: &AtomicBool) -> Result<bool> {
        if !self.end_pending {
            return Ok(self.has_batch(first));
        }
        let need = if self.drop_last { first.saturating_add(self.batch_size) } else { first.saturating_add(1) };
        Ok(match self.source.wait_len(need, cancel)? {
            None => true,
            Some(n) => first < end_of(n, self.batch_size, self.drop_last),
        })
    }

    /// Does a batch start at `first`?
    pub fn has_batch(&self, first: u64) -> bool {
        self.end.is_none_or(|e| first < e)
    }

    /// Example indices of this rank's slice of the batch starting at `first`, below `stop`.
    fn examples(&self, first: u64, stop: u64) -> impl Iterator<Item = u64> + '_ {
        let per_rank = self.batch_size / self.world_size;
        (0..per_rank).map(move |j| first + self.rank + j * self.world_size).take_while(move |&i| i < stop)
    }

    fn check(&self, first: u64) -> Result<()> {
        if first.saturating_add(self.batch_size) > MAX_EXAMPLE {
            return Err(Error::Config(format!("example index {first} is too large (limit 2^62)")));
        }
        if !self.has_batch(first) {
            return Err(Error::Config(format!("no batch starts at example {first}: the single pass has ended")));
        }
        Ok(())
    }

    /// Assemble this rank's slice of the batch starting at example `first`.
    pub fn assemble(&self, first: u64) -> Result<(usize, Batch)> {
        self.assemble_wait(first, &NEVER)
    }

    /// `assemble`, waiting (follow mode) for the chunks it needs; `cancel` stops the wait.
    pub fn assemble_wait(&self, first: u64, cancel: &AtomicBool) -> Result<(usize, Batch)> {
        self.check(first)?;
        // A reader without read-ahead counts too (read-ahead reserved before its threads ran).
        self.buffers.reserve_unless_reading_ahead(&self.reserved);
        super::remote::prefetch_ahead(self, first);
        let full = first.saturating_add(self.batch_size);
        let stop = match self.source.wait_len(full, cancel)? {
            Some(n) => {
                if first >= end_of(n, self.batch_size, self.drop_last) {
                    return Err(Error::Config(format!("no batch starts at example {first}: the single pass has ended")));
                }
                n.min(full)
            }
            None => full,
        };
        let locs: Vec<Loc> = if self.follows() {
            self.examples(first, stop).map(|i| self.source.locate_wait(i, cancel)).collect::<Result<_>>()?
        } else {
            let examples: Vec<u64> = self.examples(first, stop).collect();
            let mut locs = Vec::with_capacity(examples.len());
            self.source.locate_many(&examples, &mut locs);
            locs
        };
        if self.follows() {
            let mut last = None;
            for l in &locs {
                if last != Some((l.component, l.chunk)) {
                    last = Some((l.component, l.chunk));
                    if let Some(c) = self.caches.get(l.component) {
                        c.wait_chunk(l.chunk, cancel)?;
                    }
                }
            }
        }
        let rows = locs.len();
        let batch = match self.dtype {
            OutDtype::U16 => Batch::U16(self.fill(&locs)?),
            OutDtype::U32 => Batch::U32(self.fill(&locs)?),
            OutDtype::I32 => Batch::I32(self.fill(&locs)?),
            OutDtype::I64 => Batch::I64(self.fill(&locs)?),
        };
        Ok((rows, batch))
    }

    fn fill<T: Id + Element>(&self, locs: &[Loc]) -> Result<Vec<T>> {
        let n = locs.len() * self.seqlen;
        let mut out: Vec<T> = self.buffers.take(n);
        let batch_bytes = n * std::mem::size_of::<T>();
        let rows = &mut out.spare_capacity_mut()[..n];
        // Each cache's rows in one call: in a blend they alternate with other caches' rows,
        // and a call per run of them lost the prefetching and the streamed stores of a whole
        // batch.
        let k = self.caches.len();
        let mut pairs: Vec<Vec<(u64, u64)>> = vec![Vec::new(); k];
        let mut dest: Vec<Vec<&mut [MaybeUninit<T>]>> = (0..k).map(|_| Vec::new()).collect();
        for (l, row) in locs.iter().zip(rows.chunks_exact_mut(self.seqlen)) {
            if l.component >= k {
                return Err(Error::Config(format!("source names component {} of {k}", l.component)));
            }
            pairs[l.component].push((l.chunk, l.index));
            dest[l.component].push(row);
        }
        for ((cache, pairs), rows) in self.caches.iter().zip(pairs).zip(dest) {
            if !pairs.is_empty() {
                cache.read_rows(&pairs, rows, batch_bytes)?;
            }
        }
        // SAFETY: `read_rows` wrote every element of every row, and the rows cover 0..n.
        unsafe { out.set_len(n) };
        Ok(out)
    }
}

/// What a `Prefetcher` assembles: batches addressed by their first global example.
pub trait Assemble: Send + Sync + 'static {
    type Out: Send + 'static;
    fn batch_size(&self) -> u64;
    /// `batch_bytes` of one batch.
    fn batch_bytes(&self) -> Option<u64>;
    /// The batch starting at example `first`, or None when none starts there (the end of a
    /// single pass). May wait (follow mode) until `cancel` is set.
    fn assemble_at(&self, first: u64, cancel: &AtomicBool) -> Result<Option<Self::Out>>;
    /// Read-ahead keeps up to `batches` batches in flight (those queued, being assembled and
    /// held by the consumer).
    fn in_flight(&self, _batches: usize) {}
}

impl Assemble for BatchSpec {
    type Out = (usize, Batch);
    fn batch_size(&self) -> u64 {
        self.batch_size
    }
    fn batch_bytes(&self) -> Option<u64> {
        let rows = self.batch_size / self.world_size;
        batch_bytes(rows, rows, self.seqlen, self.dtype)
    }
    fn assemble_at(&self, first: u64, cancel: &AtomicBool) -> Result<Option<(usize, Batch)>> {
        if !self.has_batch_wait(first, cancel)? {
            return Ok(None);
        }
        self.assemble_wait(first, cancel).map(Some)
    }
    fn in_flight(&self, batches: usize) {
        self.buffers.reserve(&self.reserved, batches);
    }
}

/// What a read-ahead worker sends: a batch and its first example, or the error that stopped it.
type Sent<O> = Result<(u64, O)>;

/// Read-ahead: `threads` workers assemble batches `first + k B` into bounded channels.
pub struct Prefetcher<A: Assemble = BatchSpec> {
    receivers: Vec<Receiver<Sent<A::Out>>>,
    next: u64,
    stop: Arc<AtomicBool>,
    pid: u32,
}

/// What the consumer gets from `Prefetcher::next`.
pub enum Next<O> {
    Batch(u64, O),
    End,
    Timeout,
}

impl<A: Assemble> Prefetcher<A> {
    /// Batches start at `first + k * every * B` for k = 0, 1, ... (`every` > 1 lets DataLoader
    /// worker w of W read every W-th batch). `depth`: batches held ready in all (at least one
    /// per thread).
    pub fn start(spec: Arc<A>, first: u64, every: u64, threads: usize, depth: usize) -> Result<Prefetcher<A>> {
        let every = every.max(1);
        crate::memory::check_threads(threads)?;
        let per_worker = depth.div_ceil(threads).max(1);
        let in_flight = threads.saturating_mul(per_worker + 1).saturating_add(2);
        crate::memory::check_fits(spec.batch_bytes().and_then(|b| b.checked_mul(in_flight as u64)), || {
            format!("reading ahead with {threads} threads and prefetch {depth} ({in_flight} batches in flight)")
        })?;
        spec.in_flight(in_flight);
        let stop = Arc::new(AtomicBool::new(false));
        let mut receivers = Vec::with_capacity(threads);
        for w in 0..threads {
            let (tx, rx) = crossbeam_channel::bounded(per_worker);
            let (spec, stop) = (spec.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("tokshuf-read-{w}"))
                .spawn(move || {
                    let mut k = w as u64;
                    while !stop.load(Ordering::Relaxed) {
                        let Some(at) =
                            k.checked_mul(every).and_then(|x| x.checked_mul(spec.batch_size())).and_then(|x| x.checked_add(first))
                        else {
                            break;
                        };
                        let r = match spec.assemble_at(at, &stop) {
                            Ok(None) => break,
                            Ok(Some(b)) => Ok((at, b)),
                            Err(e) => Err(e),
                        };
                        let failed = r.is_err();
                        if tx.send(r).is_err() || failed {
                            break;
                        }
                        k += threads as u64;
                    }
                })
                .map_err(|e| Error::Config(format!("cannot start a read-ahead thread: {e}")))?;
            receivers.push(rx);
        }
        Ok(Prefetcher { receivers, next: 0, stop, pid: std::process::id() })
    }

    /// The next batch in order, waiting at most `timeout` (so the caller can check signals).
    pub fn next(&mut self, timeout: std::time::Duration) -> Result<Next<A::Out>> {
        let rx = &self.receivers[(self.next % self.receivers.len() as u64) as usize];
        match rx.recv_timeout(timeout) {
            Ok(Ok((at, b))) => {
                self.next += 1;
                Ok(Next::Batch(at, b))
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(Next::Timeout),
            Err(RecvTimeoutError::Disconnected) => Ok(Next::End),
        }
    }
}

impl<A: Assemble> Drop for Prefetcher<A> {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // Forked child: the workers (and whatever locks they held) exist only in the parent.
            for rx in std::mem::take(&mut self.receivers) {
                std::mem::forget(rx);
            }
            return;
        }
        // Workers notice the flag or the closed channel after at most one batch, and exit.
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl OutDtype {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            OutDtype::U16 => 2,
            OutDtype::U32 | OutDtype::I32 => 4,
            OutDtype::I64 => 8,
        }
    }
}

impl std::str::FromStr for OutDtype {
    type Err = Error;
    fn from_str(name: &str) -> Result<Self> {
        Ok(match name {
            "uint16" => OutDtype::U16,
            "uint32" => OutDtype::U32,
            "int32" => OutDtype::I32,
            "int64" => OutDtype::I64,
            _ => return Err(Error::Config(format!("dtype={name:?}: expected int32, int64, uint16 or uint32"))),
        })
    }
}
