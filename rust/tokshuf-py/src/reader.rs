//! Bindings of the reader: `Cache`, `ReaderCore` (one rank's batches over a `Source`) and
//! `Prefetcher`. Batches are assembled with the GIL released and handed to NumPy without a copy.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use numpy::ndarray::{Array2, ArrayView2};
use numpy::{PyArray, PyArray2};
use pyo3::prelude::*;

use tokshuf_core::read::buffers::BufferPool;
use tokshuf_core::read::cache::{Cache, Id};
use tokshuf_core::read::order::{OrderOptions, Source};
use tokshuf_core::read::reader::{Batch, BatchSpec, Next, OutDtype, Prefetcher};
use tokshuf_core::read::unpacked::{UnpackedBatch, UnpackedSpec};
use tokshuf_core::Error;

use crate::{run_detached, to_pyerr};

pub(crate) fn to_numpy<'py>(py: Python<'py>, rows: usize, seqlen: usize, batch: Batch) -> PyResult<Bound<'py, PyAny>> {
    fn arr<'py, T: numpy::Element>(py: Python<'py>, shape: (usize, usize), v: Vec<T>) -> PyResult<Bound<'py, PyAny>> {
        let a = Array2::from_shape_vec(shape, v).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        let out: Bound<'py, PyArray2<T>> = PyArray::from_owned_array(py, a);
        Ok(out.into_any())
    }
    let shape = (rows, seqlen);
    match batch {
        Batch::U16(v) => arr(py, shape, v),
        Batch::U32(v) => arr(py, shape, v),
        Batch::I32(v) => arr(py, shape, v),
        Batch::I64(v) => arr(py, shape, v),
    }
}

/// The owner of a batch's buffer: the base object of the batch's NumPy array. When NumPy frees
/// the array (and every view of it), the buffer goes back to its reader's pool.
#[pyclass(frozen, module = "tokshuf._core")]
struct PooledBatch {
    batch: Option<Batch>,
    pool: Arc<BufferPool>,
}

impl Drop for PooledBatch {
    fn drop(&mut self) {
        if let Some(b) = self.batch.take() {
            self.pool.give(b);
        }
    }
}

/// `to_numpy` for a batch whose buffer returns to `pool` when the array is freed.
pub(crate) fn to_numpy_pooled<'py>(
    py: Python<'py>,
    rows: usize,
    seqlen: usize,
    batch: Batch,
    pool: &Arc<BufferPool>,
) -> PyResult<Bound<'py, PyAny>> {
    fn arr<'py, T: numpy::Element>(owner: &Bound<'py, PooledBatch>, shape: (usize, usize), v: &[T]) -> PyResult<Bound<'py, PyAny>> {
        let view = ArrayView2::from_shape(shape, v).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        // SAFETY: the buffer belongs to `owner`, which becomes the array's base object, and is
        // neither changed nor moved until `owner` is dropped (its heap block never moves).
        let out: Bound<'py, PyArray2<T>> = unsafe { PyArray2::borrow_from_array(&view, owner.clone().into_any()) };
        Ok(out.into_any())
    }
    let owner = Bound::new(py, PooledBatch { batch: Some(batch), pool: pool.clone() })?;
    let shape = (rows, seqlen);
    match owner.get().batch.as_ref() {
        Some(Batch::U16(v)) => arr(&owner, shape, v),
        Some(Batch::U32(v)) => arr(&owner, shape, v),
        Some(Batch::I32(v)) => arr(&owner, shape, v),
        Some(Batch::I64(v)) => arr(&owner, shape, v),
        None => Err(pyo3::exceptions::PyRuntimeError::new_err("internal error: a batch without a buffer")),
    }
}

/// An opened, validated cache (`tokshuf.Cache` wraps it).
#[pyclass(frozen, module = "tokshuf._core", name = "Cache")]
pub struct PyCache {
    pub inner: Arc<Cache>,
}

#[pymethods]
impl PyCache {
    /// `follow`: open a cache whose build is still running (waits for what it needs, at most
    /// `timeout` seconds per wait; see tokshuf_core::read::follow).
    /// A `path` that is an object-store URL opens a remote cache: shards are kept under
    /// `cache_dir` within `cache_limit` bytes, `downloads` fetched at once.
    #[new]
    #[pyo3(signature = (path, check_files=true, follow=false, timeout=None, cache_dir=None, cache_limit=None, downloads=4))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        check_files: bool,
        follow: bool,
        timeout: Option<f64>,
        cache_dir: Option<PathBuf>,
        cache_limit: Option<u64>,
        downloads: usize,
    ) -> PyResult<Self> {
        let timeout = tokshuf_core::read::follow::timeout(timeout).map_err(to_pyerr)?;
        let url = path.to_str().filter(|s| tokshuf_core::storage::Location::is_url(s)).map(str::to_string);
        let inner = run_detached(py, move |cancel| {
            if let Some(url) = url {
                let dir = cache_dir.unwrap_or_else(|| std::env::temp_dir().join("tokshuf-remote-cache"));
                let limit = cache_limit.unwrap_or(u64::MAX);
                if follow {
                    tokshuf_core::read::remote::open_remote_follow(&url, &dir, limit, downloads, timeout, &cancel)
                } else {
                    tokshuf_core::read::remote::open_remote(&url, &dir, limit, downloads)
                }
            } else if follow {
                tokshuf_core::read::follow::open(&path, check_files, timeout, &cancel)
            } else {
                Cache::open_with(&path, check_files)
            }
        })?;
        Ok(PyCache { inner: Arc::new(inner) })
    }
    /// A remote cache: download these chunks ahead, in this order (no-op for a local cache).
    fn prefetch_chunks(&self, order: Vec<u64>) {
        self.inner.prefetch_chunks(&order);
    }
    /// Opened in follow mode on a build that was not complete yet.
    #[getter]
    fn following(&self) -> bool {
        self.inner.is_following()
    }
    #[getter]
    fn recipe_fingerprint(&self) -> &str {
        &self.inner.recipe_fingerprint
    }
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.root.clone()
    }
    #[getter]
    fn metadata_json(&self) -> String {
        self.inner.meta.raw.to_string()
    }
    #[getter]
    fn fingerprint(&self) -> &str {
        &self.inner.fingerprint
    }
    #[getter]
    fn seqlen(&self) -> usize {
        self.inner.seqlen()
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.inner.meta.dtype {
            tokshuf_core::format::Dtype::Uint16 => "uint16",
            tokshuf_core::format::Dtype::Uint32 => "uint32",
        }
    }
    #[getter]
    fn format(&self) -> &'static str {
        self.inner.meta.format.name()
    }
    #[getter]
    fn chunk_size(&self) -> u64 {
        self.inner.meta.chunk_size
    }
    /// Contexts per tar member (1 but for the block formats).
    #[getter]
    fn block_size(&self) -> u64 {
        self.inner.layout.block_size()
    }
    /// (Following a build: waits for the chunk plan.)
    #[getter]
    fn chunk_sizes(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        final_sizes(py, &self.inner)
    }
    /// (Following a streaming build: waits for the plan or 64 chunks.)
    #[getter]
    fn default_ideal_readers(&self, py: Python<'_>) -> PyResult<u64> {
        waiting(py, &self.inner, |c, cancel| c.wait_default_ideal_readers(cancel))
    }
    /// (Following a build: waits for the chunk plan.)
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(final_sizes(py, &self.inner)?.iter().sum::<u64>() as usize)
    }
    /// Contexts by global index (manifest order) as a `(len(indices), seqlen)` array.
    fn get<'py>(&self, py: Python<'py>, indices: Vec<u64>, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
        let dt: OutDtype = dtype.parse().map_err(to_pyerr)?;
        let cache = self.inner.clone();
        if cache.is_following() {
            return self.get_following(py, indices, dt);
        }
        let n = cache.len();
        if let Some(bad) = indices.iter().find(|&&i| i >= n) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("context {bad} out of range (cache holds {n})")));
        }
        let rows = indices.len();
        let seqlen = cache.seqlen();
        let batch = py
            .detach(move || -> tokshuf_core::Result<Batch> {
                let locs: Vec<(u64, u64)> = indices.iter().filter_map(|&i| cache.global_to_local(i)).collect();
                let locs = &locs[..];
                fn fill<T: Id>(c: &Cache, l: &[(u64, u64)], rows: usize) -> tokshuf_core::Result<Vec<T>> {
                    let n = rows * c.seqlen();
                    let mut out = Vec::with_capacity(n);
                    c.read_many(l, &mut out.spare_capacity_mut()[..n])?;
                    // SAFETY: read_many wrote all n elements.
                    unsafe { out.set_len(n) };
                    Ok(out)
                }
                Ok(match dt {
                    OutDtype::U16 => Batch::U16(fill(&cache, locs, rows)?),
                    OutDtype::U32 => Batch::U32(fill(&cache, locs, rows)?),
                    OutDtype::I32 => Batch::I32(fill(&cache, locs, rows)?),
                    OutDtype::I64 => Batch::I64(fill(&cache, locs, rows)?),
                })
            })
            .map_err(to_pyerr)?;
        to_numpy(py, rows, seqlen, batch)
    }
}

impl PyCache {
    /// `get` on a cache following a build: waits for the plan, then for each shard read.
    fn get_following<'py>(&self, py: Python<'py>, indices: Vec<u64>, dt: OutDtype) -> PyResult<Bound<'py, PyAny>> {
        let sizes = final_sizes(py, &self.inner)?;
        let n: u64 = sizes.iter().sum();
        if let Some(bad) = indices.iter().find(|&&i| i >= n) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("context {bad} out of range (cache holds {n})")));
        }
        let source = Arc::new(tokshuf_core::read::order::SinglePass::new(&sizes));
        let spec = BatchSpec::new(vec![self.inner.clone()], source, 1, 0, 1, dt, false).map_err(to_pyerr)?;
        let rows = indices.len();
        let seqlen = self.inner.seqlen();
        let batch = run_detached(py, move |cancel| {
            let mut parts = Vec::with_capacity(indices.len());
            for &i in &indices {
                parts.push(spec.assemble_wait(i, &cancel)?.1);
            }
            Ok(concat(parts))
        })?;
        to_numpy(py, rows, seqlen, batch)
    }
}

fn concat(parts: Vec<Batch>) -> Batch {
    fn cat<T: Clone>(parts: impl Iterator<Item = Vec<T>>) -> Vec<T> {
        parts.flatten().collect()
    }
    match parts.first() {
        Some(Batch::U16(_)) => Batch::U16(cat(parts.into_iter().filter_map(|b| if let Batch::U16(v) = b { Some(v) } else { None }))),
        Some(Batch::U32(_)) => Batch::U32(cat(parts.into_iter().filter_map(|b| if let Batch::U32(v) = b { Some(v) } else { None }))),
        Some(Batch::I64(_)) => Batch::I64(cat(parts.into_iter().filter_map(|b| if let Batch::I64(v) = b { Some(v) } else { None }))),
        _ => Batch::I32(cat(parts.into_iter().filter_map(|b| if let Batch::I32(v) = b { Some(v) } else { None }))),
    }
}

/// `f` on the cache: on another thread, checking for Ctrl-C, when it may wait for a build.
fn waiting<T: Send + 'static>(
    py: Python<'_>,
    c: &Arc<Cache>,
    f: impl FnOnce(&Cache, &std::sync::atomic::AtomicBool) -> tokshuf_core::Result<T> + Send + 'static,
) -> PyResult<T> {
    if !c.may_wait() {
        return f(c, &std::sync::atomic::AtomicBool::new(false)).map_err(to_pyerr);
    }
    let c = c.clone();
    run_detached(py, move |cancel| f(&c, &cancel))
}

/// Chunk sizes of the whole cache (following a build: waits for the plan).
fn final_sizes(py: Python<'_>, c: &Arc<Cache>) -> PyResult<Vec<u64>> {
    waiting(py, c, |c, cancel| c.wait_sizes(cancel))
}

/// One rank's batches over an example source. Stateless: batches are addressed by their first
/// global example; the Python `Reader` keeps the position.
#[pyclass(frozen, module = "tokshuf._core")]
pub struct ReaderCore {
    pub spec: Arc<BatchSpec>,
}

impl ReaderCore {
    /// For other sources (blends): wrap a source over `caches` in a reader.
    #[allow(clippy::too_many_arguments)]
    pub fn from_source(
        caches: Vec<Arc<Cache>>,
        source: Arc<dyn Source>,
        batch_size: u64,
        rank: u64,
        world_size: u64,
        dtype: &str,
        drop_last: bool,
    ) -> PyResult<Self> {
        let dt: OutDtype = dtype.parse().map_err(to_pyerr)?;
        let spec = BatchSpec::new(caches, source, batch_size, rank, world_size, dt, drop_last).map_err(to_pyerr)?;
        Ok(ReaderCore { spec: Arc::new(spec) })
    }
}

#[pymethods]
impl ReaderCore {
    #[new]
    #[pyo3(signature = (cache, batch_size, rank, world_size, ideal_readers, seed, reshuffle, single_pass, drop_last, dtype))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        cache: &PyCache,
        batch_size: u64,
        rank: u64,
        world_size: u64,
        ideal_readers: u64,
        seed: u64,
        reshuffle: bool,
        single_pass: bool,
        drop_last: bool,
        dtype: &str,
    ) -> PyResult<Self> {
        let c = cache.inner.clone();
        let opts = OrderOptions { ideal_readers, seed, reshuffle };
        let source = c.source(opts, single_pass).map_err(to_pyerr)?;
        Self::from_source(vec![c], source, batch_size, rank, world_size, dtype, drop_last)
    }

    /// This rank's slice of the global batch starting at example `first`.
    /// (Following a build: waits for what it needs, Ctrl-C stops the wait.)
    fn batch<'py>(&self, py: Python<'py>, first: u64) -> PyResult<Bound<'py, PyAny>> {
        let spec = self.spec.clone();
        let (rows, b) = if spec.follows() {
            run_detached(py, move |cancel| spec.assemble_wait(first, &cancel))?
        } else {
            py.detach(move || spec.assemble(first)).map_err(to_pyerr)?
        };
        to_numpy_pooled(py, rows, self.spec.seqlen, b, &self.spec.buffers)
    }

    /// Does a batch start at example `first`? (A single pass following a build may wait to
    /// learn where it ends.)
    fn has_batch(&self, py: Python<'_>, first: u64) -> PyResult<bool> {
        let spec = self.spec.clone();
        if !spec.end_pending {
            return Ok(spec.has_batch(first));
        }
        run_detached(py, move |cancel| spec.has_batch_wait(first, &cancel))
    }

    /// (component, chunk, index in tar order) of global example `i`.
    fn locate(&self, py: Python<'_>, i: u64) -> PyResult<(usize, u64, u64)> {
        if i >= tokshuf_core::read::reader::MAX_EXAMPLE || self.spec.source.num_examples().is_some_and(|n| i >= n) {
            return Err(to_pyerr(Error::Config(format!("example {i} out of range"))));
        }
        let l = if self.spec.follows() {
            let spec = self.spec.clone();
            run_detached(py, move |cancel| {
                if spec.end_pending && spec.source.wait_len(i + 1, &cancel)?.is_some_and(|n| i >= n) {
                    return Err(Error::Config(format!("example {i} out of range")));
                }
                spec.source.locate_wait(i, &cancel)
            })?
        } else {
            self.spec.source.locate(i)
        };
        Ok((l.component, l.chunk, l.index))
    }

    /// Number of examples of a finite source (None when endless).
    #[getter]
    fn num_examples(&self) -> Option<u64> {
        self.spec.source.num_examples()
    }
    /// Batches start at examples below this (None when endless).
    #[getter]
    fn end(&self) -> Option<u64> {
        self.spec.end
    }
    /// A single pass following a build whose end is not known yet (see `has_batch`).
    #[getter]
    fn end_pending(&self) -> bool {
        self.spec.end_pending
    }
    #[getter]
    fn seqlen(&self) -> usize {
        self.spec.seqlen
    }
    /// What defines the sequence besides the caches (order version and options).
    #[getter]
    fn source_description(&self) -> String {
        self.spec.source.describe()
    }

    /// Start read-ahead of the batches at examples `first + k * every * batch_size` (threads
    /// start now, not before).
    #[pyo3(signature = (first, threads, depth, every=1))]
    fn prefetch(&self, first: u64, threads: usize, depth: usize, every: u64) -> PyResult<PyPrefetcher> {
        let p = Prefetcher::start(self.spec.clone(), first, every, threads, depth).map_err(to_pyerr)?;
        Ok(PyPrefetcher { inner: Mutex::new(Some(Ahead::Packed(p))), seqlen: self.spec.seqlen, buffers: self.spec.buffers.clone() })
    }
}

/// A prefetcher of either kind of reader.
pub(crate) enum Ahead {
    Packed(Prefetcher<BatchSpec>),
    Unpacked(Prefetcher<UnpackedSpec>),
}

/// What a prefetcher handed out, before it becomes Python objects.
enum Got {
    Packed(usize, Batch),
    Unpacked(UnpackedBatch),
}

impl Ahead {
    fn next(&mut self, timeout: Duration) -> tokshuf_core::Result<Next<Got>> {
        Ok(match self {
            Ahead::Packed(p) => match p.next(timeout)? {
                Next::Batch(at, (rows, b)) => Next::Batch(at, Got::Packed(rows, b)),
                Next::End => Next::End,
                Next::Timeout => Next::Timeout,
            },
            Ahead::Unpacked(p) => match p.next(timeout)? {
                Next::Batch(at, b) => Next::Batch(at, Got::Unpacked(b)),
                Next::End => Next::End,
                Next::Timeout => Next::Timeout,
            },
        })
    }
}

/// Batches read ahead on background threads, handed out in order.
#[pyclass(frozen, module = "tokshuf._core", name = "Prefetcher")]
pub struct PyPrefetcher {
    pub(crate) inner: Mutex<Option<Ahead>>,
    pub(crate) seqlen: usize,
    /// Where batches' buffers go back to.
    pub(crate) buffers: Arc<BufferPool>,
}

#[pymethods]
impl PyPrefetcher {
    /// `(first example, batch)` of the next batch, or None at the end of a single pass. The
    /// batch is an array, or for an unpacked cache the tuple `UnpackedReaderCore.batch` gives.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<(u64, Bound<'py, PyAny>)>> {
        let taken = self.inner.try_lock().ok().and_then(|mut g| g.take());
        let Some(mut p) = taken else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("tokshuf: a Reader was used from two threads at once"));
        };
        loop {
            let (back, r) = py.detach(move || {
                let r = p.next(Duration::from_millis(50));
                (p, r)
            });
            p = back;
            match r {
                Ok(Next::Timeout) => {
                    // On Ctrl-C the prefetcher is dropped (its downloads in flight give up);
                    // the Reader starts a new one next time.
                    py.check_signals().inspect_err(|_| tokshuf_core::storage::client::interrupt())?;
                }
                Ok(Next::Batch(first, got)) => {
                    *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                    let out = match got {
                        Got::Packed(rows, b) => to_numpy_pooled(py, rows, self.seqlen, b, &self.buffers)?,
                        Got::Unpacked(b) => crate::unpacked::to_python(py, b, &self.buffers)?,
                    };
                    return Ok(Some((first, out)));
                }
                Ok(Next::End) => {
                    *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                    return Ok(None);
                }
                Err(e) => return Err(to_pyerr(e)),
            }
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCache>()?;
    m.add_class::<ReaderCore>()?;
    m.add_class::<PyPrefetcher>()?;
    Ok(())
}
