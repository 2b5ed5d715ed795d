//! `BuildSteps`: the build's steps one call at a time (`tokshuf_core::build::driver`), for the
//! Ray engine. Heavy steps run with the GIL released; results cross as JSON strings (small:
//! summaries, manifest lines). Conversion only.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use tokshuf_core::build::driver::{Begun, Driver, Shipped, Steps};
use tokshuf_core::format::ManifestLine;
use tokshuf_core::Error;

use crate::{options, run_detached, to_pyerr};

#[pyclass(module = "tokshuf._core")]
struct BuildSteps {
    inner: Arc<Steps>,
    driver: Mutex<Option<Driver>>,
}

fn json_arg(text: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| to_pyerr(Error::Config(format!("bad JSON argument: {e}"))))
}

fn parse_lines(lines: &[String]) -> PyResult<Vec<ManifestLine>> {
    lines.iter().map(|l| serde_json::from_str(l).map_err(|e| to_pyerr(Error::Config(format!("bad manifest line: {e}"))))).collect()
}

fn no_driver() -> PyErr {
    to_pyerr(Error::Config("internal error: build steps used before begin() (please report)".into()))
}

#[pymethods]
impl BuildSteps {
    /// The options of `build_cache`, as keyword arguments; loads the tokenizer (once per
    /// process) and lists and sizes the inputs, nothing else. `recipe`: the driver's
    /// (`recipe_json`), so a task does not list the inputs again.
    #[new]
    #[pyo3(signature = (recipe=None, **options))]
    fn new(py: Python<'_>, recipe: Option<&str>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let opts = options::build_options(options)?;
        let recipe: Option<Shipped> =
            recipe.map(|r| serde_json::from_str(r).map_err(|e| to_pyerr(Error::Config(format!("bad recipe: {e}"))))).transpose()?;
        let inner = run_detached(py, move |_| Steps::open(opts, recipe))?;
        Ok(BuildSteps { inner: Arc::new(inner), driver: Mutex::new(None) })
    }

    /// Load the tokenizer of these options into this process for the tasks to come; its
    /// (sha256, backend).
    #[staticmethod]
    #[pyo3(signature = (**options))]
    fn warm(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<(String, String)> {
        let opts = options::build_options(options)?;
        run_detached(py, move |_| tokshuf_core::build::driver::warm(&opts))
    }

    /// The work folder: a path, or a URL for an output in an object store.
    #[getter]
    fn work(&self) -> String {
        self.inner.work()
    }
    /// The recipe as JSON, for `BuildSteps(recipe=...)` on other machines.
    #[getter]
    fn recipe_json(&self) -> String {
        serde_json::to_string(&self.inner.shipped()).unwrap_or_default()
    }
    fn input_sizes(&self) -> Vec<u64> {
        self.inner.input_sizes()
    }
    fn files_done(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        let steps = self.inner.clone();
        run_detached(py, move |_| steps.files_done())
    }

    /// Driver: lock, start or resume. Returns tokshuf.json if the cache is already complete,
    /// else None (then `listed` says how many chunks a killed run finished).
    fn begin(&self, py: Python<'_>, build: &str) -> PyResult<Option<String>> {
        let build = json_arg(build)?;
        let steps = self.inner.clone();
        match run_detached(py, move |_| steps.begin(&build))? {
            Begun::Complete(meta) => Ok(Some(String::from_utf8_lossy(&meta.to_bytes()).into_owned())),
            Begun::Started(driver) => {
                *self.driver.lock().map_err(|_| no_driver())? = Some(*driver);
                Ok(None)
            }
        }
    }
    #[getter]
    fn listed(&self) -> PyResult<u64> {
        let guard = self.driver.lock().map_err(|_| no_driver())?;
        guard.as_ref().map(|d| d.listed).ok_or_else(no_driver)
    }

    /// Stage 1 of `files` on `threads` threads; their summaries as JSON strings.
    fn stage1(&self, py: Python<'_>, files: Vec<usize>, threads: usize) -> PyResult<Vec<String>> {
        let steps = self.inner.clone();
        let summaries = run_detached(py, move |cancel| steps.stage1(&files, threads, &cancel))?;
        Ok(summaries.iter().map(|s| serde_json::to_string(s).unwrap_or_default()).collect())
    }

    /// Driver: stitch, plan the chunks, publish the plan. Returns the number of chunks.
    fn plan_chunks(&self, py: Python<'_>, threads: usize, build: &str) -> PyResult<u64> {
        let build = json_arg(build)?;
        let steps = self.inner.clone();
        run_detached(py, move |_| steps.plan_chunks(threads, &build))
    }

    /// Spills of the planned build, and whether they are regrouped before stage 2.
    fn spills(&self, py: Python<'_>) -> PyResult<(usize, bool)> {
        let steps = self.inner.clone();
        run_detached(py, move |_| steps.spills())
    }

    /// Unpacked builds, once planned: each bin's number of chunks; None for a packed build.
    fn bin_chunks(&self, py: Python<'_>) -> PyResult<Option<Vec<u64>>> {
        let steps = self.inner.clone();
        run_detached(py, move |_| steps.bin_chunks())
    }

    /// Rewrite the spills of `files` in cell order (shuffled builds), `threads` at once.
    fn regroup(&self, py: Python<'_>, files: Vec<usize>, threads: usize) -> PyResult<()> {
        let steps = self.inner.clone();
        run_detached(py, move |cancel| steps.regroup(&files, threads, &cancel))
    }

    /// Write chunks `first..last`; their manifest lines as JSON strings.
    fn stage2(&self, py: Python<'_>, first: u64, last: u64, threads: usize) -> PyResult<Vec<String>> {
        let steps = self.inner.clone();
        let lines = run_detached(py, move |cancel| steps.stage2(first..last, threads, &cancel))?;
        Ok(lines.iter().map(|l| serde_json::to_string(l).unwrap_or_default()).collect())
    }

    /// Unpacked builds: write chunks `first..last` of bin `bin`; their manifest lines as JSON.
    fn stage2_bin(&self, py: Python<'_>, bin: usize, first: u64, last: u64, threads: usize) -> PyResult<Vec<String>> {
        let steps = self.inner.clone();
        let lines = run_detached(py, move |cancel| steps.stage2_bin(bin, first..last, threads, &cancel))?;
        Ok(lines.iter().map(|l| serde_json::to_string(l).unwrap_or_default()).collect())
    }

    /// Driver, unpacked builds: the lines of chunks `first, first+1, ...` of bin `bin`.
    fn add_bin_lines(&self, py: Python<'_>, bin: usize, first: u64, lines: Vec<String>) -> PyResult<()> {
        let lines = parse_lines(&lines)?;
        let mut guard = self.driver.lock().map_err(|_| no_driver())?;
        let driver = guard.as_mut().ok_or_else(no_driver)?;
        py.detach(|| self.inner.add_bin_lines(driver, bin, first, lines)).map_err(to_pyerr)
    }

    /// Driver: list chunks `first, first+1, ...` in the manifest (written with the GIL
    /// released: in an object store that is an upload).
    fn add_lines(&self, py: Python<'_>, first: u64, lines: Vec<String>) -> PyResult<()> {
        let lines = parse_lines(&lines)?;
        let mut guard = self.driver.lock().map_err(|_| no_driver())?;
        let driver = guard.as_mut().ok_or_else(no_driver)?;
        py.detach(|| self.inner.add_lines(driver, first, lines)).map_err(to_pyerr)
    }

    /// Driver: bring a store's manifest up to date (at most once a second, unless `now`).
    #[pyo3(signature = (now=false))]
    fn upload_manifest(&self, py: Python<'_>, now: bool) -> PyResult<()> {
        let mut guard = self.driver.lock().map_err(|_| no_driver())?;
        let driver = guard.as_mut().ok_or_else(no_driver)?;
        py.detach(|| self.inner.upload_manifest(driver, now)).map_err(to_pyerr)
    }

    /// Driver: final manifest and tokshuf.json (with `build`); returns tokshuf.json.
    fn finish(&self, py: Python<'_>, build: &str) -> PyResult<String> {
        let build = json_arg(build)?;
        let driver = self.driver.lock().map_err(|_| no_driver())?.take().ok_or_else(no_driver)?;
        let steps = self.inner.clone();
        let meta = run_detached(py, move |_| steps.finish(driver, &build))?;
        Ok(String::from_utf8_lossy(&meta.to_bytes()).into_owned())
    }

    /// Driver: give up after an error; releases the build lock, the work stays for a resume.
    fn release(&self) {
        if let Ok(mut guard) = self.driver.lock() {
            guard.take();
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BuildSteps>()
}
