//! `tokshuf._core`: the thin PyO3 layer over `tokshuf-core`. It converts arguments, runs the
//! heavy work with the GIL released (checking for Ctrl-C while it waits), and turns core
//! errors into the exception classes of `tokshuf.exceptions`. No logic of its own.

mod blend;
mod reader;
mod status;
mod inputs;
mod fasttok;
mod steps;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

use tokshuf_core::meta::{BuildOptions, ErrorPolicy, Format, Tail};
use tokshuf_core::tokenizer::Backend;
use tokshuf_core::Error;


/// Raise `err` as the `tokshuf.exceptions` class it maps to.
fn to_pyerr(py: Python<'_>, err: Error) -> PyErr {
    if matches!(err, Error::Interrupted) {
        return pyo3::exceptions::PyKeyboardInterrupt::new_err("interrupted");
    }
    let class = py
        .import("tokshuf.exceptions")
        .and_then(|m| m.getattr(err.kind()))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(class) => PyErr::from_type(class, err.to_string()),
        Err(e) => e,
    }
}

/// Run `work` on its own thread with the GIL released; poll for Ctrl-C, and on it ask the
/// work to stop (it checks `cancel`) and wait for it to wind down.
fn run_detached<T: Send + 'static>(
    py: Python<'_>,
    work: impl FnOnce(Arc<AtomicBool>) -> tokshuf_core::Result<T> + Send + 'static,
) -> PyResult<T> {
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let c = cancel.clone();
    let handle = std::thread::Builder::new()
        .name("tokshuf-main".into())
        .spawn(move || {
            let _ = tx.send(work(c));
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
    loop {
        match py.detach(|| rx.recv_timeout(Duration::from_millis(50))) {
            Ok(result) => {
                let _ = py.detach(|| handle.join());
                return result.map_err(|e| to_pyerr(py, e));
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    cancel.store(true, Ordering::Relaxed);
                    let _ = py.detach(|| handle.join());
                    return Err(interrupt);
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                let _ = py.detach(|| handle.join());
                return Err(PyRuntimeError::new_err("tokshuf internal error: worker thread panicked (please report)"));
            }
        }
    }
}

fn parse<T>(name: &str, value: &str, table: &[(&str, T)]) -> PyResult<T>
where
    T: Copy,
{
    table.iter().find(|(k, _)| *k == value).map(|(_, v)| *v).ok_or_else(|| {
        let known: Vec<&str> = table.iter().map(|(k, _)| *k).collect();
        Python::attach(|py| to_pyerr(py, Error::Config(format!("{name}={value:?}: expected one of {known:?}"))))
    })
}

/// Build a cache; returns tokshuf.json as a JSON string. Arguments are validated in Python.
#[pyfunction]
#[pyo3(signature = (inputs, output, tokenizer, seqlen, chunk_size, num_local_cells, local_cell_dir,
    seed, threads, text_key, format, tail, eot_id, pad_id, bos, bos_id, allow_special_tokens,
    shuffle, memory_limit, errors, progress, overwrite, tokenizer_backend="auto"))]
#[allow(clippy::too_many_arguments)]
fn build_cache(
    py: Python<'_>,
    inputs: Vec<PathBuf>,
    output: PathBuf,
    tokenizer: String,
    seqlen: u32,
    chunk_size: u32,
    num_local_cells: Option<u64>,
    local_cell_dir: Option<PathBuf>,
    seed: u64,
    threads: usize,
    text_key: String,
    format: &str,
    tail: &str,
    eot_id: Option<u32>,
    pad_id: Option<u32>,
    bos: bool,
    bos_id: Option<u32>,
    allow_special_tokens: bool,
    shuffle: bool,
    memory_limit: u64,
    errors: &str,
    progress: bool,
    overwrite: bool,
    tokenizer_backend: &str,
) -> PyResult<String> {
    let opts = BuildOptions {
        inputs,
        output,
        tokenizer,
        seqlen,
        chunk_size,
        num_local_cells,
        local_cell_dir,
        seed,
        threads,
        text_key,
        format: parse("format", format, &[("npy", Format::Npy), ("json.gz", Format::JsonGz)])?,
        tail: parse("tail", tail, &[("stitch", Tail::Stitch), ("pad", Tail::Pad), ("drop", Tail::Drop)])?,
        eot_id,
        pad_id,
        bos,
        bos_id,
        allow_special_tokens,
        tokenizer_backend: Backend::parse(tokenizer_backend).map_err(|e| to_pyerr(py, e))?,
        shuffle,
        memory_limit,
        errors: parse("errors", errors, &[("raise", ErrorPolicy::Raise), ("skip", ErrorPolicy::Skip)])?,
        progress,
        overwrite,
    };
    let meta = run_detached(py, move |cancel| tokshuf_core::build::build(&opts, cancel))?;
    Ok(meta.to_string())
}

/// A tokenizer as tokshuf loads it: `encode` gives exactly the ids a build writes.
#[pyclass(frozen, module = "tokshuf._core")]
struct Tokenizer {
    inner: tokshuf_core::tokenizer::Tokenizer,
}

#[pymethods]
impl Tokenizer {
    #[new]
    #[pyo3(signature = (spec, allow_special_tokens=false, backend="auto"))]
    fn new(py: Python<'_>, spec: String, allow_special_tokens: bool, backend: &str) -> PyResult<Self> {
        let backend = Backend::parse(backend).map_err(|e| to_pyerr(py, e))?;
        let inner =
            run_detached(py, move |_| tokshuf_core::tokenizer::Tokenizer::load(&spec, allow_special_tokens, backend))?;
        Ok(Tokenizer { inner })
    }
    #[getter]
    fn spec(&self) -> &str {
        &self.inner.spec
    }
    #[getter]
    fn sha256(&self) -> &str {
        &self.inner.sha256
    }
    #[getter]
    fn vocab_size(&self) -> u32 {
        self.inner.vocab_size
    }
    #[getter]
    fn backend(&self) -> &str {
        self.inner.backend
    }
    #[getter]
    fn eot_id(&self) -> Option<u32> {
        self.inner.eot_id
    }
    #[getter]
    fn pad_id(&self) -> Option<u32> {
        self.inner.pad_id
    }
    #[getter]
    fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id
    }
    /// Ids of one text (no EOT/BOS added).
    fn encode(&self, py: Python<'_>, text: String) -> PyResult<Vec<u32>> {
        let mut out = Vec::new();
        let enc = &self.inner.encoder;
        py.detach(|| enc.encode_into(&text, &mut out))
            .map_err(|reason| to_pyerr(py, Error::Tokenizer(reason)))?;
        Ok(out)
    }
    /// Ids of many texts, encoded on `threads` threads (0 = all cores).
    #[pyo3(signature = (texts, threads=0))]
    fn encode_batch(&self, py: Python<'_>, texts: Vec<String>, threads: usize) -> PyResult<Vec<Vec<u32>>> {
        use rayon::prelude::*;
        let enc = self.inner.encoder.clone();
        run_detached(py, move |_| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| Error::Config(format!("cannot start threads: {e}")))?;
            pool.install(|| {
                texts
                    .par_iter()
                    .map(|t| {
                        let mut out = Vec::new();
                        enc.encode_into(t, &mut out).map(|_| out).map_err(Error::Tokenizer)
                    })
                    .collect()
            })
        })
    }
    fn decode(&self, py: Python<'_>, ids: Vec<u32>) -> String {
        py.detach(|| self.inner.encoder.decode(&ids))
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(build_cache, m)?)?;
    m.add_class::<Tokenizer>()?;
    blend::register(m)?;
    reader::register(m)?;
    status::register(m)?;
    inputs::register(m)?;
    fasttok::register(m)?;
    steps::register(m)?;
    Ok(())
}
