//! Test hooks of the fast tokenizer: its pre-tokenizers and character classes, to be
//! compared with the reference regex engines from Python.

use pyo3::prelude::*;

use tokshuf_core::tokenize::nfc::NfcSafe;
use tokshuf_core::tokenize::pretok::{self, CharClasses, Engine, Pattern, PreTokenizer};
use tokshuf_core::Error;

fn engine(name: &str) -> PyResult<Engine> {
    match name {
        "fancy-regex" => Ok(Engine::FancyRegex),
        "onig" => Ok(Engine::Onig),
        _ => Err(pyo3::exceptions::PyValueError::new_err(format!("engine {name:?}: expected fancy-regex or onig"))),
    }
}

/// Pre-tokens of `text` under `pattern` as `engine` runs it (a pattern the fast backend
/// recognises for that engine); `None` if a position matches no alternative.
#[pyfunction]
fn _fast_pretokenize(py: Python<'_>, pattern: &str, engine_name: &str, text: &str) -> PyResult<Option<Vec<String>>> {
    let e = engine(engine_name)?;
    let p = Pattern::recognise(pattern, e)
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("pattern not recognised by the fast backend"))?;
    let pt = py.detach(|| PreTokenizer::new(p)).map_err(|e: Error| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let mut out = Vec::new();
    let ok = pt.split(text, |b| out.push(String::from_utf8_lossy(b).into_owned()));
    Ok(ok.ok().map(|_| out))
}

/// Code points in each character class of the fast backend's table (names: L, N, S, UP,
/// LO, NFC_SAFE, and fold_X for the `(?i)` folds of letter X).
#[pyfunction]
fn _fast_char_classes(py: Python<'_>) -> PyResult<Vec<(String, Vec<u32>)>> {
    let t = py.detach(CharClasses::shared).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let mut out: Vec<(String, Vec<u32>)> = [("L", pretok::L), ("N", pretok::N), ("S", pretok::S), ("UP", pretok::UP), ("LO", pretok::LO)]
        .iter()
        .map(|&(name, bit)| (name.to_string(), t.members(bit)))
        .collect();
    out.push(("NFC_SAFE".to_string(), py.detach(|| NfcSafe::shared().members())));
    for l in *b"stmdlver" {
        out.push((format!("fold_{}", l as char), t.fold_members(l)));
    }
    Ok(out)
}

/// The embedded `.tiktoken` ranks file of a tiktoken encoding, decompressed.
#[pyfunction]
fn _tiktoken_data<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let data = tokshuf_core::tokenize::tiktoken_data(name).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    Ok(pyo3::types::PyBytes::new(py, &data))
}

/// The tokenizer.json file a spec names, resolved as builds resolve it (for the Python
/// reference of `check-tokenizer`).
#[pyfunction]
fn _tokenizer_json_path(spec: &str) -> PyResult<String> {
    let path = tokshuf_core::tokenize::tokenizer_json_path(spec).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    Ok(path.to_string_lossy().into_owned())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_tiktoken_data, m)?)?;
    m.add_function(wrap_pyfunction!(_tokenizer_json_path, m)?)?;
    m.add_function(wrap_pyfunction!(_fast_pretokenize, m)?)?;
    m.add_function(wrap_pyfunction!(_fast_char_classes, m)?)?;
    Ok(())
}
