//! `BuildOptions` from the keyword arguments of `tokshuf.build_cache`. Conversion only: what a
//! value must be is checked once, in the core (`BuildOptions::validate`, the recipe).

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple};

use tokshuf_core::build::BuildOptions;
use tokshuf_core::format::InputKind;
use tokshuf_core::tokenize::Backend;
use tokshuf_core::Error;

use crate::to_pyerr;

/// `key`'s value converted to `T`, None when absent or None; a value of the wrong type or range
/// is a `ConfigError` naming the option.
fn get<T>(d: &Bound<'_, PyDict>, key: &str, what: &str) -> PyResult<Option<T>>
where
    T: for<'a, 'py> FromPyObject<'a, 'py>,
{
    let Some(v) = d.get_item(key)? else { return Ok(None) };
    if v.is_none() {
        return Ok(None);
    }
    // A bool is an int to Python, but never a count or an id here (nor in a list of them).
    let in_list = (v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>())
        && v.try_iter().is_ok_and(|mut items| items.any(|x| x.is_ok_and(|x| x.is_instance_of::<PyBool>())));
    let wrong_bool = what != BOOL && (v.is_instance_of::<PyBool>() || in_list);
    v.extract::<T>().ok().filter(|_| !wrong_bool).map(Some).ok_or_else(|| {
        let shown = v.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
        to_pyerr(Error::Config(format!("{key} must be {what}, not {shown}")))
    })
}

const BOOL: &str = "True or False";

/// A tokenizer spec given as a str or a path object.
pub fn spec_text(spec: PathBuf) -> PyResult<String> {
    spec.into_os_string()
        .into_string()
        .map_err(|s| to_pyerr(Error::Tokenizer(format!("{}: the tokenizer path is not UTF-8", s.to_string_lossy()))))
}

fn choice<T: std::str::FromStr<Err = Error>>(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<T>> {
    get::<String>(d, key, "a string")?.map(|s| s.parse::<T>().map_err(to_pyerr)).transpose()
}

pub fn build_options(d: Option<&Bound<'_, PyDict>>) -> PyResult<BuildOptions> {
    let Some(d) = d else { return Err(to_pyerr(Error::Config("no options given".into()))) };
    let inputs: Vec<PathBuf> = get(d, "inputs", "a list of paths")?.unwrap_or_default();
    let output: PathBuf = get(d, "output", "a path")?.ok_or_else(|| to_pyerr(Error::Config("output is required".into())))?;
    let mut o = BuildOptions::new(inputs, output);
    let uint = "a positive integer";
    if let Some(v) = get(d, "tokenizer", "a spec string or a path")? {
        o.tokenizer = spec_text(v)?;
    }
    if let Some(v) = get(d, "seqlen", uint)? {
        o.seqlen = v;
    }
    if let Some(v) = get(d, "chunk_size", uint)? {
        o.chunk_size = v;
    }
    o.num_local_cells = get::<u64>(d, "num_local_cells", uint)?;
    o.local_cell_dir = get(d, "local_cell_dir", "a path")?;
    if let Some(v) = get(d, "seed", "an integer in [0, 2**64)")? {
        o.seed = v;
    }
    o.threads = get(d, "threads", uint)?;
    if let Some(v) = get(d, "text_key", "a string")? {
        o.text_key = v;
    }
    if let Some(v) = choice(d, "format")? {
        o.format = v;
    }
    if let Some(v) = choice(d, "tail")? {
        o.tail = v;
    }
    o.eot_id = get(d, "eot_id", "a token id")?;
    o.pad_id = get(d, "pad_id", "a token id")?;
    o.bos_id = get(d, "bos_id", "a token id")?;
    for (key, field) in [
        ("bos", &mut o.bos),
        ("allow_special_tokens", &mut o.allow_special_tokens),
        ("shuffle", &mut o.shuffle),
        ("progress", &mut o.progress),
        ("overwrite", &mut o.overwrite),
    ] {
        if let Some(v) = get(d, key, BOOL)? {
            *field = v;
        }
    }
    if let Some(v) = get::<String>(d, "tokenizer_backend", "a string")? {
        o.tokenizer_backend = Backend::parse(&v).map_err(to_pyerr)?;
    }
    o.memory_limit = get(d, "memory_limit", "a number of bytes")?;
    if let Some(v) = choice(d, "errors")? {
        o.errors = v;
    }
    if let Some(v) = choice(d, "packing")? {
        o.packing = v;
    }
    o.pack_window = get(d, "pack_window", uint)?;
    o.bins = get(d, "bins", "a list of positive integers")?;
    o.bin_size = get(d, "bin_size", uint)?;
    o.block_size = get(d, "block_size", uint)?;
    if get(d, "shuffle_only", BOOL)?.unwrap_or(false) {
        o.input_kind = InputKind::Shards;
    }
    for key in d.keys() {
        let key: String = key.extract()?;
        if !KNOWN.contains(&key.as_str()) {
            return Err(to_pyerr(Error::Config(format!("unknown build option {key:?}"))));
        }
    }
    Ok(o)
}

const KNOWN: [&str; 29] = [
    "inputs",
    "output",
    "tokenizer",
    "seqlen",
    "chunk_size",
    "num_local_cells",
    "local_cell_dir",
    "seed",
    "threads",
    "text_key",
    "format",
    "tail",
    "eot_id",
    "pad_id",
    "bos",
    "bos_id",
    "allow_special_tokens",
    "shuffle",
    "memory_limit",
    "errors",
    "progress",
    "overwrite",
    "tokenizer_backend",
    "packing",
    "pack_window",
    "bins",
    "bin_size",
    "block_size",
    "shuffle_only",
];
