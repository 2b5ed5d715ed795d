//! Bindings of `tokshuf_core::read::blend`: the `BlendSchedule` class (periodic weighted schedule,
//! O(1) lookup of blended examples, and the reader over a blend of caches). `tokshuf.Blend` in
//! Python wraps it.

use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use tokshuf_core::read::blend::{BlendSource, Schedule};
use tokshuf_core::read::order::{cache_source, OrderOptions, Source};
use tokshuf_core::Error;

use crate::reader::{PyCache, ReaderCore};
use crate::to_pyerr;

/// One period of a weighted blend (DESIGN §7). `weights` are positive numbers (normalised
/// here); `quantum` is the period D. Immutable and cheap to share between threads.
#[pyclass(frozen, module = "tokshuf._core")]
pub struct BlendSchedule {
    inner: Arc<Schedule>,
    weights: Vec<f64>,
}

/// (datasets, example indices) of a batch of blended indices.
type Located<'py> = (Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<u64>>);

fn config_err(msg: String) -> PyErr {
    to_pyerr(Error::Config(msg))
}

fn contiguous<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, what: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| config_err(format!("{what} must be a contiguous 1-D array")))
}

#[pymethods]
impl BlendSchedule {
    #[new]
    #[pyo3(signature = (weights, quantum=tokshuf_core::read::blend::DEFAULT_QUANTUM))]
    fn new(py: Python<'_>, weights: Vec<f64>, quantum: u64) -> PyResult<Self> {
        let w = weights.clone();
        let inner = py.detach(move || Schedule::new(&w, quantum)).map_err(to_pyerr)?;
        Ok(BlendSchedule { inner: Arc::new(inner), weights })
    }

    /// Rebuilt from (weights, quantum) when unpickled: the schedule is a pure function of them.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let me = slf.get();
        let args = (me.weights.clone(), me.inner.quantum()).into_pyobject(py)?;
        (slf.get_type(), args).into_pyobject(py)
    }

    fn __repr__(&self) -> String {
        format!("BlendSchedule(num_datasets={}, quantum={})", self.inner.num_datasets(), self.inner.quantum())
    }

    #[getter]
    fn num_datasets(&self) -> usize {
        self.inner.num_datasets()
    }
    #[getter]
    fn quantum(&self) -> u64 {
        self.inner.quantum()
    }
    /// The weights as given (not normalised).
    #[getter]
    fn weights(&self) -> Vec<f64> {
        self.weights.clone()
    }
    /// Integer shares q_i, summing to the quantum.
    #[getter]
    fn quanta(&self) -> Vec<u32> {
        self.inner.quanta().to_vec()
    }
    /// Datasets whose share rounded to 0 and were raised to one draw per period.
    #[getter]
    fn raised(&self) -> Vec<u32> {
        self.inner.raised().to_vec()
    }
    /// Normalised weights, w_i / sum(w).
    #[getter]
    fn requested(&self) -> Vec<f64> {
        self.inner.requested().to_vec()
    }
    /// Share each period delivers, q_i / D.
    #[getter]
    fn achieved(&self) -> Vec<f64> {
        self.inner.achieved()
    }
    /// Largest lag j*q_i/D - C_i(j) (samples) over the period; may exceed 1.
    #[getter]
    fn max_lag(&self) -> f64 {
        self.inner.max_lag()
    }
    /// Largest lead C_i(j) - j*q_i/D (samples) over the period; always < 1.
    #[getter]
    fn max_lead(&self) -> f64 {
        self.inner.max_lead()
    }

    /// The whole period as two uint32 arrays: dataset of draw j, and its count before draw j.
    fn period<'py>(&self, py: Python<'py>) -> (Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<u32>>) {
        let (ks, cs) = self.inner.period();
        (PyArray1::from_slice(py, ks), PyArray1::from_slice(py, cs))
    }

    /// Blended example m -> (dataset k, example index in k). With `sizes`, the index wraps
    /// modulo sizes[k] (single pass over finite datasets).
    #[pyo3(signature = (m, sizes=None))]
    fn locate(&self, m: u64, sizes: Option<Vec<u64>>) -> PyResult<(usize, u64)> {
        match sizes {
            None => Ok(self.inner.locate(m)),
            Some(s) => {
                self.inner.check_sizes(&s).map_err(to_pyerr)?;
                Ok(self.inner.locate_wrapped(m, &s))
            }
        }
    }

    /// Vectorised `locate`: uint64 array of blended indices -> (uint32 datasets, uint64
    /// example indices). Runs with the GIL released.
    #[pyo3(signature = (ms, sizes=None))]
    fn locate_many<'py>(
        &self,
        py: Python<'py>,
        ms: PyReadonlyArray1<'py, u64>,
        sizes: Option<PyReadonlyArray1<'py, u64>>,
    ) -> PyResult<Located<'py>> {
        let ms = contiguous(&ms, "ms")?;
        let sizes = match &sizes {
            Some(s) => {
                let s = contiguous(s, "sizes")?;
                self.inner.check_sizes(s).map_err(to_pyerr)?;
                Some(s)
            }
            None => None,
        };
        let inner = &self.inner;
        let (ks, es) = py.detach(|| {
            let mut ks = Vec::with_capacity(ms.len());
            let mut es = Vec::with_capacity(ms.len());
            for &m in ms {
                let (k, e) = match sizes {
                    None => inner.locate(m),
                    Some(s) => inner.locate_wrapped(m, s),
                };
                ks.push(k as u32);
                es.push(e);
            }
            (ks, es)
        });
        Ok((ks.into_pyarray(py), es.into_pyarray(py)))
    }

    /// Inverse of `locate`: the blended index at which dataset k's example e is drawn.
    fn position(&self, k: usize, e: u64) -> PyResult<u64> {
        if k >= self.inner.num_datasets() {
            let n = self.inner.num_datasets();
            return Err(config_err(format!("dataset {k} is not in a blend of {n}")));
        }
        self.inner.position(k, e).ok_or_else(|| config_err(format!("example {e} of dataset {k} is beyond 2**64 blended examples")))
    }

    /// Draws of each dataset among blended examples 0..m.
    fn counts(&self, py: Python<'_>, m: u64) -> Vec<u64> {
        let inner = &self.inner;
        py.detach(|| inner.counts(m))
    }

    /// A reader over the blend of `caches` (one per dataset, in order): blended example m is
    /// example e of cache k, `(k, e) = locate(m)`, and cache k places its example e in its own
    /// DESIGN §6 order with these options (or, in a single pass, in manifest order, wrapping).
    #[pyo3(signature = (caches, batch_size, rank, world_size, ideal_readers, seed, reshuffle, single_pass, drop_last, dtype))]
    #[allow(clippy::too_many_arguments)]
    fn reader_core(
        &self,
        py: Python<'_>,
        caches: Vec<PyRef<'_, PyCache>>,
        batch_size: u64,
        rank: u64,
        world_size: u64,
        ideal_readers: u64,
        seed: u64,
        reshuffle: bool,
        single_pass: bool,
        drop_last: bool,
        dtype: &str,
    ) -> PyResult<ReaderCore> {
        if ideal_readers == 0 {
            return Err(config_err("ideal_readers must be positive".into()));
        }
        let caches: Vec<_> = caches.iter().map(|c| c.inner.clone()).collect();
        if let Some(c) = caches.iter().find(|c| c.is_empty()) {
            return Err(config_err(format!("{}: cache holds no contexts", c.root.display())));
        }
        let opts = OrderOptions { ideal_readers, seed, reshuffle };
        let (schedule, cs) = (self.inner.clone(), caches.clone());
        let source = py
            .detach(move || {
                let orders = cs.iter().map(|c| cache_source(&c.sizes(), c.meta.chunk_size, c.order_block(), opts, single_pass)).collect();
                BlendSource::new(schedule, orders)
            })
            .map_err(to_pyerr)?;
        let source: Arc<dyn Source> = Arc::new(source);
        ReaderCore::from_source(caches, source, batch_size, rank, world_size, dtype, drop_last)
    }

    /// Shortest prefix of the blend that draws every example of every dataset at least once.
    fn cover_length(&self, sizes: Vec<u64>) -> PyResult<u64> {
        self.inner.cover_length(&sizes).map_err(to_pyerr)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlendSchedule>()?;
    Ok(())
}
