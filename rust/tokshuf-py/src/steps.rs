//! `BuildSteps`: the build's steps one by one (`tokshuf_core::steps`), for the Ray engine.
//! Heavy steps run with the GIL released; results cross as JSON strings (small: summaries,
//! manifest lines).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

use tokshuf_core::meta::{BuildOptions, ErrorPolicy, Format, ManifestLine, Tail};
use tokshuf_core::steps::{Begun, Driver, Steps};
use tokshuf_core::tokenizer::Backend;
use tokshuf_core::Error;

use crate::{parse, run_detached, to_pyerr};

#[pyclass(module = "tokshuf._core")]
struct BuildSteps {
    inner: Arc<Steps>,
    driver: Mutex<Option<Driver>>,
}

fn json_arg(py: Python<'_>, text: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| to_pyerr(py, Error::Config(format!("bad JSON argument: {e}"))))
}

fn no_driver(py: Python<'_>) -> PyErr {
    to_pyerr(py, Error::Config("internal error: build steps used before begin() (please report)".into()))
}

#[pymethods]
impl BuildSteps {
    /// Same arguments as `build_cache`; loads the tokenizer and reads the inputs' sizes only.
    #[new]
    #[pyo3(signature = (inputs, output, tokenizer, seqlen, chunk_size, num_local_cells, local_cell_dir,
        seed, text_key, format, tail, eot_id, pad_id, bos, bos_id, allow_special_tokens,
        shuffle, memory_limit, errors, overwrite, tokenizer_backend="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        inputs: Vec<PathBuf>,
        output: PathBuf,
        tokenizer: String,
        seqlen: u32,
        chunk_size: u32,
        num_local_cells: Option<u64>,
        local_cell_dir: Option<PathBuf>,
        seed: u64,
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
        overwrite: bool,
        tokenizer_backend: &str,
    ) -> PyResult<Self> {
        let opts = BuildOptions {
            inputs,
            output,
            tokenizer,
            seqlen,
            chunk_size,
            num_local_cells,
            local_cell_dir,
            seed,
            threads: 1,
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
            progress: false,
            overwrite,
        };
        let inner = run_detached(py, move |_| Steps::open(opts))?;
        Ok(BuildSteps { inner: Arc::new(inner), driver: Mutex::new(None) })
    }

    #[getter]
    fn work(&self) -> String {
        self.inner.work().to_string_lossy().into_owned()
    }
    fn input_sizes(&self) -> Vec<u64> {
        self.inner.input_sizes()
    }
    fn files_done(&self) -> Vec<usize> {
        self.inner.files_done()
    }

    /// Driver: lock, start or resume. Returns tokshuf.json if the cache is already complete,
    /// else None; `listed` then says how many chunks a killed run finished.
    fn begin(&self, py: Python<'_>, build: &str) -> PyResult<Option<String>> {
        let build = json_arg(py, build)?;
        let steps = self.inner.clone();
        match run_detached(py, move |_| steps.begin(&build))? {
            Begun::Complete(meta) => Ok(Some(meta.to_string())),
            Begun::Started(driver) => {
                *self.driver.lock().map_err(|_| no_driver(py))? = Some(driver);
                Ok(None)
            }
        }
    }
    #[getter]
    fn listed(&self, py: Python<'_>) -> PyResult<u64> {
        let guard = self.driver.lock().map_err(|_| no_driver(py))?;
        guard.as_ref().map(|d| d.listed).ok_or_else(|| no_driver(py))
    }

    /// Stage 1 of `files` on `threads` threads; their summaries as JSON strings.
    fn stage1(&self, py: Python<'_>, files: Vec<usize>, threads: usize) -> PyResult<Vec<String>> {
        let steps = self.inner.clone();
        let summaries = run_detached(py, move |cancel| steps.stage1(&files, threads, &cancel))?;
        Ok(summaries.iter().map(|s| serde_json::to_string(s).unwrap_or_default()).collect())
    }

    /// Driver: stitch, plan the chunks, publish the plan. Returns the number of chunks.
    fn plan_chunks(&self, py: Python<'_>, threads: usize, build: &str) -> PyResult<u64> {
        let build = json_arg(py, build)?;
        let steps = self.inner.clone();
        run_detached(py, move |_| steps.plan_chunks(threads, &build))
    }

    /// Write chunks `first..last`; their manifest lines as JSON strings.
    fn stage2(&self, py: Python<'_>, first: u64, last: u64, threads: usize) -> PyResult<Vec<String>> {
        let steps = self.inner.clone();
        let lines = run_detached(py, move |cancel| {
            let plan = steps.chunk_plan()?;
            steps.stage2(&plan, first, last, threads, &cancel)
        })?;
        Ok(lines.iter().map(|l| serde_json::to_string(l).unwrap_or_default()).collect())
    }

    /// Driver: list chunks `first, first+1, ...` in the manifest.
    fn add_lines(&self, py: Python<'_>, first: u64, lines: Vec<String>) -> PyResult<()> {
        let lines: Vec<ManifestLine> = lines
            .iter()
            .map(|l| serde_json::from_str(l).map_err(|e| to_pyerr(py, Error::Config(format!("bad manifest line: {e}")))))
            .collect::<PyResult<_>>()?;
        let mut guard = self.driver.lock().map_err(|_| no_driver(py))?;
        let driver = guard.as_mut().ok_or_else(|| no_driver(py))?;
        self.inner.add_lines(driver, first, lines).map_err(|e| to_pyerr(py, e))
    }

    /// Driver: final manifest and tokshuf.json (with `build`); returns tokshuf.json.
    fn finish(&self, py: Python<'_>, build: &str) -> PyResult<String> {
        let build = json_arg(py, build)?;
        let driver = self.driver.lock().map_err(|_| no_driver(py))?.take().ok_or_else(|| no_driver(py))?;
        let steps = self.inner.clone();
        run_detached(py, move |_| steps.finish(driver, &build)).map(|m| m.to_string())
    }

    /// Driver: give up (after an error): releases the build lock; the work stays for a resume.
    fn release(&self) {
        if let Ok(mut guard) = self.driver.lock() {
            guard.take();
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BuildSteps>()
}
