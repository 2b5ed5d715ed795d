//! `build_status`: progress of a build, finished or not (behind `python -m tokshuf status`).

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::to_pyerr;

/// Progress of the build in `output` as a JSON string (see `tokshuf_core::build::resume::status`).
#[pyfunction]
#[pyo3(signature = (output, local_cell_dir=None))]
fn build_status(py: Python<'_>, output: PathBuf, local_cell_dir: Option<PathBuf>) -> PyResult<String> {
    py.detach(|| tokshuf_core::build::resume::status(&output, local_cell_dir.as_deref())).map(|v| v.to_string()).map_err(to_pyerr)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(build_status, m)?)
}
