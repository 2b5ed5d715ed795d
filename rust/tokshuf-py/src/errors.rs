//! Every core error variant becomes its `tokshuf.exceptions` class: an exhaustive match, so a
//! new variant does not compile until it is mapped here.

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::PyErr;

use tokshuf_core::Error;

pyo3::import_exception!(tokshuf.exceptions, InputError);
pyo3::import_exception!(tokshuf.exceptions, InputNotFoundError);
pyo3::import_exception!(tokshuf.exceptions, TokshufIOError);
pyo3::import_exception!(tokshuf.exceptions, TokshufPermissionError);
pyo3::import_exception!(tokshuf.exceptions, DiskFullError);
pyo3::import_exception!(tokshuf.exceptions, ConfigError);
pyo3::import_exception!(tokshuf.exceptions, TokenizerError);
pyo3::import_exception!(tokshuf.exceptions, CacheCorruptError);
pyo3::import_exception!(tokshuf.exceptions, OutputExistsError);
pyo3::import_exception!(tokshuf.exceptions, BuildNotRunningError);
pyo3::import_exception!(tokshuf.exceptions, FollowTimeoutError);

/// The Python exception for `err`, with the core's message.
pub fn to_pyerr(err: Error) -> PyErr {
    let msg = err.to_string();
    match &err {
        Error::BadInput { .. } => InputError::new_err(msg),
        Error::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => InputNotFoundError::new_err(msg),
            std::io::ErrorKind::PermissionDenied => TokshufPermissionError::new_err(msg),
            _ => TokshufIOError::new_err(msg),
        },
        Error::DiskFull { .. } => DiskFullError::new_err(msg),
        Error::Config(_) => ConfigError::new_err(msg),
        Error::Tokenizer(_) => TokenizerError::new_err(msg),
        Error::Corrupt { .. } => CacheCorruptError::new_err(msg),
        Error::OutputExists(_) => OutputExistsError::new_err(msg),
        Error::BuildNotRunning(_) => BuildNotRunningError::new_err(msg),
        Error::FollowTimeout(_) => FollowTimeoutError::new_err(msg),
        Error::Interrupted => PyKeyboardInterrupt::new_err("interrupted"),
    }
}
