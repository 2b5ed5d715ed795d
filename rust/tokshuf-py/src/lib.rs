//! `tokshuf._core`: the thin PyO3 layer over `tokshuf-core`. It converts arguments, runs the
//! heavy work with the GIL released (checking for Ctrl-C while it waits), and turns core
//! errors into the exception classes of `tokshuf.exceptions`. No logic of its own.

mod blend;
mod errors;
mod fasttok;
mod inputs;
mod options;
mod progress;
mod reader;
mod status;
mod steps;
mod storage;
mod unpacked;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use tokshuf_core::build::BuildOptions;
use tokshuf_core::error::Error;
use tokshuf_core::tokenize::Backend;

pub use errors::to_pyerr;

/// Run `work` on its own thread with the GIL released; poll for Ctrl-C, and on it ask the
/// work to stop (it checks `cancel`; object-store requests in flight give up) and wait for it
/// to wind down.
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
                return result.map_err(to_pyerr);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    cancel.store(true, Ordering::Relaxed);
                    tokshuf_core::storage::client::interrupt();
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

/// Build a cache from keyword options (those of `tokshuf.build_cache`); returns tokshuf.json
/// as a JSON string.
#[pyfunction]
#[pyo3(signature = (**options))]
fn build_cache(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let opts: BuildOptions = options::build_options(options)?;
    let meta = run_detached(py, move |cancel| tokshuf_core::build::build(&opts, cancel))?;
    Ok(String::from_utf8_lossy(&meta.to_bytes()).into_owned())
}

/// A tokenizer as tokshuf loads it: `encode` gives exactly the ids a build writes.
#[pyclass(frozen, module = "tokshuf._core")]
struct Tokenizer {
    inner: tokshuf_core::tokenize::Tokenizer,
}

#[pymethods]
impl Tokenizer {
    #[new]
    #[pyo3(signature = (spec, allow_special_tokens=false, backend="auto"))]
    fn new(py: Python<'_>, spec: PathBuf, allow_special_tokens: bool, backend: &str) -> PyResult<Self> {
        let backend = Backend::parse(backend).map_err(to_pyerr)?;
        let spec = options::spec_text(spec)?;
        // The same load as a build's: a build after it in this process does not load it again.
        let inner = run_detached(py, move |_| tokshuf_core::tokenize::Tokenizer::load_shared(&spec, allow_special_tokens, backend))?;
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
    fn encode(&self, py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<Vec<u32>> {
        let text = utf8(text)?;
        py.detach(|| self.inner.encode(&text)).map_err(to_pyerr)
    }
    /// Ids of many texts, encoded on `threads` threads (0 = all cores).
    #[pyo3(signature = (texts, threads=0))]
    fn encode_batch(&self, py: Python<'_>, texts: Vec<Bound<'_, PyString>>, threads: usize) -> PyResult<Vec<Vec<u32>>> {
        let texts = texts.iter().map(|t| utf8(t).map(|s| s.into_owned())).collect::<PyResult<Vec<String>>>()?;
        let tok = self.inner.clone();
        run_detached(py, move |_| tok.encode_batch(&texts, threads))
    }
    fn decode(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<String> {
        py.detach(|| self.inner.encoder.decode(&ids)).map_err(|e| to_pyerr(Error::Tokenizer(e)))
    }
}

/// A str's UTF-8. One holding a lone surrogate has none: an `InputError`, as a line of a
/// build's input holding one is.
fn utf8<'a>(text: &'a Bound<'_, PyString>) -> PyResult<std::borrow::Cow<'a, str>> {
    text.to_cow()
        .map_err(|_| errors::InputError::new_err("text holds a lone surrogate: it is not Unicode text, so it has no UTF-8 to tokenize"))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("_MAX_EXAMPLE", tokshuf_core::read::reader::MAX_EXAMPLE)?;
    m.add_function(wrap_pyfunction!(build_cache, m)?)?;
    m.add_class::<Tokenizer>()?;
    blend::register(m)?;
    reader::register(m)?;
    status::register(m)?;
    inputs::register(m)?;
    fasttok::register(m)?;
    progress::register(m)?;
    storage::register(m)?;
    steps::register(m)?;
    unpacked::register(m)?;
    Ok(())
}
