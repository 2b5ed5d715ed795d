//! The storage layer (`tokshuf_core::storage`) for Python: the tests drive it against a
//! loopback S3 server, the CLI reads and writes DCLM dataset records through it (local or
//! remote alike). Not public API: the names start with `_storage`.

use std::io::Read;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use tokshuf_core::storage::{self, Location};

use crate::to_pyerr;

/// `[(url_or_path, size), ...]` under a prefix or matching a glob, sorted by key.
#[pyfunction]
fn _storage_list(py: Python<'_>, pattern: String) -> PyResult<Vec<(String, u64)>> {
    py.detach(|| storage::list(&pattern)).map(|v| v.into_iter().map(|e| (e.location.to_string(), e.size)).collect()).map_err(to_pyerr)
}

/// The whole object read through the streaming reader; `decompress` wraps it in the
/// decoder its name asks for (multi-member gzip, multi-frame zstd).
#[pyfunction]
#[pyo3(signature = (url, decompress=false))]
fn _storage_read<'py>(py: Python<'py>, url: String, decompress: bool) -> PyResult<Bound<'py, PyBytes>> {
    let data = py
        .detach(|| -> tokshuf_core::Result<Vec<u8>> {
            let loc = Location::parse(&url)?;
            let mut r = storage::open(&loc)?;
            if decompress {
                r = Box::new(tokshuf_core::build::input::decode(&loc.file_name(), r, None, tokshuf_core::build::input::BUFFER)?.reader);
            }
            let mut out = Vec::new();
            r.read_to_end(&mut out).map_err(|e| storage::unwrap_io(&loc, e))?;
            Ok(out)
        })
        .map_err(to_pyerr)?;
    Ok(PyBytes::new(py, &data))
}

/// Bytes `start..end` of an object.
#[pyfunction]
fn _storage_get_range<'py>(py: Python<'py>, url: String, start: u64, end: u64) -> PyResult<Bound<'py, PyBytes>> {
    let data = py.detach(|| storage::get_range(&Location::parse(&url)?, start..end)).map_err(to_pyerr)?;
    Ok(PyBytes::new(py, &data))
}

/// Upload a local file as the whole object `url`.
#[pyfunction]
fn _storage_put(py: Python<'_>, path: PathBuf, url: String) -> PyResult<()> {
    py.detach(|| storage::put_file(&path, &Location::parse(&url)?)).map_err(to_pyerr)
}

/// Size of an object (`InputNotFoundError` when there is none).
#[pyfunction]
fn _storage_head(py: Python<'_>, url: String) -> PyResult<u64> {
    py.detach(|| storage::head(&Location::parse(&url)?)).map_err(to_pyerr)
}

/// A path or URL as tokshuf takes it (`Location::parse`): a URL of a store as given,
/// `file://PATH` as PATH, a local path as given; another scheme is a `ConfigError`.
#[pyfunction]
fn _storage_location(path: PathBuf) -> PyResult<std::ffi::OsString> {
    // A name that is not UTF-8 is no URL: a local path, kept byte for byte.
    let Some(text) = path.to_str() else { return Ok(path.into_os_string()) };
    match Location::parse(text).map_err(to_pyerr)? {
        Location::Local(p) => Ok(p.into_os_string()),
        Location::Remote(_) => Ok(path.into_os_string()),
    }
}

/// Delete an object (one already gone is fine).
#[pyfunction]
fn _storage_delete(py: Python<'_>, url: String) -> PyResult<()> {
    py.detach(|| storage::delete(&Location::parse(&url)?)).map_err(to_pyerr)
}

/// Upload the complete local cache `local` to `url` (shards, then manifest, then tokshuf.json
/// last); returns (uploaded, skipped) shard names.
#[pyfunction]
#[pyo3(signature = (local, url, overwrite=false))]
fn _storage_publish(py: Python<'_>, local: PathBuf, url: String, overwrite: bool) -> PyResult<(Vec<String>, Vec<String>)> {
    py.detach(|| storage::publish::publish(&local, &Location::parse(&url)?, overwrite)).map(|p| (p.uploaded, p.skipped)).map_err(to_pyerr)
}

/// Refuse an output prefix that holds foreign objects or that another build is writing into;
/// lists it, so a wrong bucket or refused credentials show before a build starts.
#[pyfunction]
fn _storage_check_output(py: Python<'_>, url: String) -> PyResult<()> {
    py.detach(|| storage::publish::check_output(&Location::parse(&url)?)).map_err(to_pyerr)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_storage_check_output, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_list, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_location, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_read, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_get_range, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_put, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_head, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_delete, m)?)?;
    m.add_function(wrap_pyfunction!(_storage_publish, m)?)
}
