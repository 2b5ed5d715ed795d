//! Bindings of unpacked caches (`packing="none"`): `UnpackedCache` and `UnpackedReaderCore`,
//! whose batches are `(ids, lengths, bin, global_tokens)` tuples.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use numpy::ndarray::Array2;
use numpy::{PyArray, PyArray1};
use pyo3::prelude::*;

use tokshuf_core::read::buffers::BufferPool;
use tokshuf_core::read::order::OrderOptions;
use tokshuf_core::read::reader::{OutDtype, Prefetcher};
use tokshuf_core::read::unpacked::{PadTo, Unpacked, UnpackedBatch, UnpackedSpec};

use crate::reader::{to_numpy_pooled, Ahead, PyPrefetcher};
use crate::to_pyerr;

/// `(ids (rows, width), lengths (rows,) int32, mask (rows, width) bool, bin, global_tokens)`.
pub(crate) fn to_python<'py>(py: Python<'py>, b: UnpackedBatch, pool: &Arc<BufferPool>) -> PyResult<Bound<'py, PyAny>> {
    let ids = to_numpy_pooled(py, b.rows, b.width, b.ids, pool)?;
    let lengths = PyArray1::from_vec(py, b.lengths.into_iter().map(|n| n as i32).collect()).into_any();
    let mask = Array2::from_shape_vec((b.rows, b.width), b.mask).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    let mask = PyArray::from_owned_array(py, mask).into_any();
    Ok((ids, lengths, mask, b.bin, b.global_tokens).into_pyobject(py)?.into_any())
}

/// An opened, validated unpacked cache (`tokshuf.UnpackedCache` wraps it).
#[pyclass(frozen, module = "tokshuf._core", name = "UnpackedCache")]
pub struct PyUnpacked {
    inner: Arc<Unpacked>,
}

#[pymethods]
impl PyUnpacked {
    #[new]
    #[pyo3(signature = (path, check_files=true))]
    fn new(py: Python<'_>, path: PathBuf, check_files: bool) -> PyResult<Self> {
        let inner = py.detach(move || Unpacked::open(&path, check_files)).map_err(to_pyerr)?;
        Ok(PyUnpacked { inner: Arc::new(inner) })
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
    fn default_ideal_readers(&self) -> u64 {
        self.inner.default_ideal_readers()
    }
    /// Each bin's upper bound.
    #[getter]
    fn bounds(&self) -> Vec<u64> {
        self.inner.infos.iter().map(|b| b.max_len).collect()
    }
    /// Each bin's chunk sizes.
    #[getter]
    fn chunk_sizes(&self) -> Vec<Vec<u64>> {
        self.inner.bins.iter().map(|b| b.sizes()).collect()
    }
    /// Lengths of the examples of bin `bin`, in manifest order (reads every member header).
    fn lengths<'py>(&self, py: Python<'py>, bin: usize) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let cache = self.inner.bins.get(bin).cloned().ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("no bin {bin}")))?;
        let lens = py
            .detach(move || -> tokshuf_core::Result<Vec<u32>> {
                let mut out = Vec::with_capacity(cache.len() as usize);
                for (c, e) in cache.chunks.iter().enumerate() {
                    for i in 0..e.size {
                        out.push(cache.example_len(c as u64, i)? as u32);
                    }
                }
                Ok(out)
            })
            .map_err(to_pyerr)?;
        Ok(PyArray1::from_vec(py, lens))
    }
    /// Example `index` (manifest order) of chunk `chunk` of bin `bin`, as a 1-D array.
    fn example<'py>(&self, py: Python<'py>, bin: usize, chunk: u64, index: u64) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let cache = self.inner.bins.get(bin).ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("no bin {bin}")))?;
        if cache.entry(chunk).is_none_or(|e| index >= e.size) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("no example {index} in chunk {chunk} of bin {bin}")));
        }
        let mut out = vec![0i64; cache.seqlen()];
        let n = cache.read_ragged(chunk, index, &mut out).map_err(to_pyerr)?;
        out.truncate(n);
        Ok(PyArray1::from_vec(py, out))
    }
}

/// One rank's batches of an unpacked cache (stateless: batches are addressed by their first
/// global example, a multiple of the batch size).
#[pyclass(frozen, module = "tokshuf._core")]
pub struct UnpackedReaderCore {
    spec: Arc<UnpackedSpec>,
}

#[pymethods]
impl UnpackedReaderCore {
    #[new]
    #[pyo3(signature = (cache, batch_size, rank, world_size, ideal_readers, seed, reshuffle, dtype, pad_to))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        cache: &PyUnpacked,
        batch_size: u64,
        rank: u64,
        world_size: u64,
        ideal_readers: u64,
        seed: u64,
        reshuffle: bool,
        dtype: &str,
        pad_to: &str,
    ) -> PyResult<Self> {
        let dt: OutDtype = dtype.parse().map_err(to_pyerr)?;
        let pad: PadTo = pad_to.parse().map_err(to_pyerr)?;
        let opts = OrderOptions { ideal_readers, seed, reshuffle };
        let spec = UnpackedSpec::new(cache.inner.clone(), opts, batch_size, rank, world_size, dt, pad).map_err(to_pyerr)?;
        Ok(UnpackedReaderCore { spec: Arc::new(spec) })
    }

    /// This rank's slice of the global batch starting at example `first`:
    /// `(ids, lengths, bin, global_tokens)`.
    fn batch<'py>(&self, py: Python<'py>, first: u64) -> PyResult<Bound<'py, PyAny>> {
        let spec = self.spec.clone();
        let b = py.detach(move || spec.assemble(first)).map_err(to_pyerr)?;
        to_python(py, b, &self.spec.cache.buffers)
    }

    /// (bin, chunk, index in tar order) of global example `i`.
    fn locate(&self, i: u64) -> PyResult<(usize, u64, u64)> {
        let (k, l) = self.spec.locate(i).map_err(to_pyerr)?;
        Ok((k, l.chunk, l.index))
    }

    /// (bin, the bin's own batch counter) of global batch `b`.
    fn bin_of(&self, b: u64) -> (usize, u64) {
        self.spec.bin_of(b)
    }

    #[getter]
    fn num_examples(&self) -> Option<u64> {
        None
    }
    #[getter]
    fn end(&self) -> Option<u64> {
        None
    }
    #[getter]
    fn end_pending(&self) -> bool {
        false
    }
    #[getter]
    fn seqlen(&self) -> usize {
        self.spec.cache.seqlen()
    }
    #[getter]
    fn source_description(&self) -> String {
        self.spec.describe()
    }

    /// Start read-ahead of the batches at examples `first + k * every * batch_size`.
    #[pyo3(signature = (first, threads, depth, every=1))]
    fn prefetch(&self, first: u64, threads: usize, depth: usize, every: u64) -> PyResult<PyPrefetcher> {
        let p = Prefetcher::start(self.spec.clone(), first, every, threads, depth).map_err(to_pyerr)?;
        Ok(PyPrefetcher {
            inner: Mutex::new(Some(Ahead::Unpacked(p))),
            seqlen: self.spec.cache.seqlen(),
            buffers: self.spec.cache.buffers.clone(),
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyUnpacked>()?;
    m.add_class::<UnpackedReaderCore>()?;
    Ok(())
}
