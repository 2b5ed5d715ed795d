//! One error type for the whole core. The bindings map each variant to one Python exception
//! class, so they never have to parse messages.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input line (or the stream around it) that cannot be used.
    #[error("{path}:{line}: {reason}")]
    BadInput { path: PathBuf, line: u64, reason: String, kind: SkipReason },
    /// Operating-system level failure on a path (not found, permission, disk full...).
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// No space left on the device holding `path`. Nothing published is harmed: free space
    /// and run the same build again to resume.
    #[error("{path}: no space left on device; free some space and run the same build again to resume it")]
    DiskFull { path: PathBuf, source: std::io::Error },
    /// Options that do not make sense together, or a value out of range.
    #[error("{0}")]
    Config(String),
    /// The tokenizer cannot be found, loaded or used as asked.
    #[error("{0}")]
    Tokenizer(String),
    /// A cache on disk is not what its metadata says (truncated, altered, crafted).
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The output folder holds something this build must not overwrite or resume.
    #[error("{0}")]
    OutputExists(String),
    /// Follow mode: the cache is not complete and no build is running (it died or was stopped).
    #[error("{0}")]
    BuildNotRunning(String),
    /// Follow mode: what the reader waits for did not appear within its timeout.
    #[error("{0}")]
    FollowTimeout(String),
    /// An object store kept failing (retries spent) or refused a request.
    #[error("{url}: {reason}")]
    Remote { url: String, reason: String },
    /// The caller asked to stop (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        let path = path.as_ref().to_path_buf();
        if source.kind() == std::io::ErrorKind::StorageFull || source.raw_os_error() == Some(28) {
            return Error::DiskFull { path, source };
        }
        Error::Io { path, source }
    }
    pub fn corrupt(path: impl AsRef<Path>, reason: impl Into<String>) -> Self {
        Error::Corrupt { path: path.as_ref().to_path_buf(), reason: reason.into() }
    }

    /// The same error naming the objects under `url` where it named the files of `dir`, the
    /// local copy a remote cache's metadata is read from: the user knows the URL, and the copy's
    /// bytes are the store's. Errors of the local disk itself (`Io`, `DiskFull`) keep the path.
    pub fn naming_url(self, dir: &Path, url: &str) -> Self {
        let url = url.trim_end_matches('/');
        let path = |p: PathBuf| match p.strip_prefix(dir) {
            Ok(rel) if rel.as_os_str().is_empty() => PathBuf::from(url),
            Ok(rel) => PathBuf::from(format!("{url}/{}", rel.display())),
            Err(_) => p,
        };
        let text = |s: String| s.replace(&dir.display().to_string(), url);
        match self {
            Error::Corrupt { path: p, reason } => Error::Corrupt { path: path(p), reason: text(reason) },
            Error::BadInput { path: p, line, reason, kind } => Error::BadInput { path: path(p), line, reason: text(reason), kind },
            Error::Config(s) => Error::Config(text(s)),
            Error::OutputExists(s) => Error::OutputExists(text(s)),
            Error::BuildNotRunning(s) => Error::BuildNotRunning(text(s)),
            Error::FollowTimeout(s) => Error::FollowTimeout(text(s)),
            other => other,
        }
    }
}

/// Why an input line was skipped (or, under `errors="raise"`, why the build stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    InvalidJson,
    NotAnObject,
    MissingText,
    TextNotString,
    InvalidUtf8,
    CorruptStream,
    TokenizerFailed,
}

impl SkipReason {
    pub const ALL: [SkipReason; 7] = [
        SkipReason::InvalidJson,
        SkipReason::NotAnObject,
        SkipReason::MissingText,
        SkipReason::TextNotString,
        SkipReason::InvalidUtf8,
        SkipReason::CorruptStream,
        SkipReason::TokenizerFailed,
    ];
    pub fn name(self) -> &'static str {
        match self {
            SkipReason::InvalidJson => "invalid_json",
            SkipReason::NotAnObject => "not_an_object",
            SkipReason::MissingText => "missing_text",
            SkipReason::TextNotString => "text_not_string",
            SkipReason::InvalidUtf8 => "invalid_utf8",
            SkipReason::CorruptStream => "corrupt_stream",
            SkipReason::TokenizerFailed => "tokenizer_failed",
        }
    }
}
