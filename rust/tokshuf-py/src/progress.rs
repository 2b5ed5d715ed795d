//! `Progress`: the core's build progress bars, for engines driven from Python (the Ray driver
//! advances them as tasks finish), so every engine draws the same bars.

use pyo3::prelude::*;

use tokshuf_core::build::progress::Progress as Bars;

#[pyclass(frozen, module = "tokshuf._core")]
struct Progress {
    inner: Bars,
}

#[pymethods]
impl Progress {
    /// Bars on stderr when `enabled` and stderr is a terminal; otherwise a no-op.
    #[new]
    #[pyo3(signature = (enabled=true))]
    fn new(enabled: bool) -> Self {
        Progress { inner: Bars::new(enabled) }
    }
    /// End the current stage (its final state stays on screen) and begin `name`.
    fn stage(&self, name: &str, total: u64, unit: &str) {
        self.inner.stage(name, total, unit);
    }
    /// `units` more done, accounting for `bytes` of input and `tokens`.
    #[pyo3(signature = (units, bytes=0, tokens=0))]
    fn advance(&self, units: u64, bytes: u64, tokens: u64) {
        self.inner.advance(units, bytes, tokens);
    }
    /// Leave the current stage's final state on its own line.
    fn end(&self) {
        self.inner.end();
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Progress>()
}
