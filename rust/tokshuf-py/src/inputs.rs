//! Bindings that expose the input parser on its own, for tests and fuzzing of bad lines.

use pyo3::prelude::*;

use tokshuf_core::build::input::{self, Line};

/// Classify one input line (without its newline) as the builder does: `("text", text)`,
/// `("blank", None)` or `(reason, message)` with a reason as counted under `skipped`.
#[pyfunction]
#[pyo3(signature = (line, key="text"))]
fn parse_line(line: &[u8], key: &str) -> (String, Option<String>) {
    match input::parse_line(line, key) {
        Line::Text(t) => ("text".into(), Some(t.into_owned())),
        Line::Blank => ("blank".into(), None),
        Line::Bad(reason, msg) => (reason.name().into(), Some(msg)),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_line, m)?)
}
