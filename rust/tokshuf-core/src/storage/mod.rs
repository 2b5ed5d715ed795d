//! Files in object stores and on local disk behind one blocking API (DESIGN.md section 10).
//!
//! - `list`: a prefix, recursively, sorted by key, or a glob on keys.
//! - `open`: a streaming `Read` (never the whole object in memory) that retries and resumes.
//! - `get_range`, `head`, `delete`, and `put_file` (a whole object: one PUT, or a multipart
//!   upload that is completed or aborted).
//!
//! Remote calls run on a small private tokio runtime (`client`), started on first use and
//! remade in a forked child. Credentials and endpoints come from the usual environment
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`); retries and timeouts from `TOKSHUF_REMOTE_*`
//! (docs/storage.md). Secrets never reach an error message: `redact` removes them.

pub mod client;
pub mod lease;
pub mod location;
pub mod publish;
pub mod read;
pub mod shard_cache;
mod upload;

use std::fs::File;
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use futures_util::stream::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};

pub use location::{glob_match, has_glob, Location, RemoteUrl, Scheme};
pub use read::RemoteReader;

use crate::error::{Error, Result};
use client::{client, Client, Settings};

/// One listed object or file: where it is and its size in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub location: Location,
    pub size: u64,
}

fn obj_path(url: &RemoteUrl) -> Result<ObjPath> {
    ObjPath::parse(&url.key).map_err(|e| Error::Config(format!("{url}: not a valid object key: {e}")))
}

/// True when retrying the whole request may help: a failure on the wire (connection reset,
/// timeout, reply cut short) that the client did not retry to the end itself. It retries the
/// store's retryable answers (5xx, throttling) and most wire failures already, and says so in
/// its message ("after N retries, max_retries: M"); retrying those again here would multiply
/// the tries. It stops early on some (a reply body cut short after a POST, which it cannot
/// tell from a request that took effect): every request tokshuf makes is idempotent (reads,
/// whole-object writes, deletes), so those are retried here.
pub(crate) fn is_transient(e: &object_store::Error) -> bool {
    let object_store::Error::Generic { .. } = e else { return false };
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut wire = false;
    while let Some(err) = cur {
        wire |= err.downcast_ref::<object_store::client::HttpError>().is_some();
        cur = err.source();
    }
    wire && !retried_to_the_end(&e.to_string())
}

/// The client's message says it used every retry it had ("after 4 retries, max_retries: 4").
fn retried_to_the_end(msg: &str) -> bool {
    let Some((before, after)) = msg.split_once(" retries, max_retries: ") else { return false };
    let done = before.rsplit(' ').next().and_then(|n| n.parse::<usize>().ok());
    let max = after.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse::<usize>().ok());
    matches!((done, max), (Some(d), Some(m)) if d >= m)
}

/// The tokshuf error for a store's answer: a missing object is "not found", refused
/// credentials a permission error, anything else a `Remote` error naming the URL.
pub(crate) fn map_err(url: &str, e: object_store::Error, retried: usize) -> Error {
    use std::io::{Error as IoError, ErrorKind};
    let msg = redact(&e.to_string());
    let path = PathBuf::from(url);
    match e {
        object_store::Error::NotFound { .. } => Error::io(path, IoError::new(ErrorKind::NotFound, "no such object")),
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
            Error::io(path, IoError::new(ErrorKind::PermissionDenied, msg))
        }
        // A listing's refusal comes back as a generic error that names the HTTP status.
        _ if msg.contains("403 Forbidden") || msg.contains("401 Unauthorized") => {
            Error::io(path, IoError::new(ErrorKind::PermissionDenied, msg))
        }
        _ if msg.contains("NoSuchBucket") => Error::io(path, IoError::new(ErrorKind::NotFound, "no such bucket")),
        _ if retried > 0 => Error::Remote { url: url.to_string(), reason: format!("gave up after {} tries: {msg}", retried + 1) },
        _ => Error::Remote { url: url.to_string(), reason: msg },
    }
}

/// Run one request, retrying wire failures with backoff.
pub(crate) async fn retrying<T, F, Fut>(settings: Settings, url: String, what: String, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if is_transient(&e) && tries < settings.retries => {
                tries += 1;
                tokio::time::sleep(settings.delay(tries)).await;
            }
            Err(e) => {
                return Err(match map_err(&url, e, tries) {
                    Error::Remote { url, reason } => Error::Remote { url, reason: format!("{what}: {reason}") },
                    other => other,
                })
            }
        }
    }
}

/// Remove the values of credential-like environment variables from `msg` (a store's error
/// body can echo an access key id; a signing failure must not print a secret).
pub fn redact(msg: &str) -> String {
    let mut out = msg.to_string();
    for (k, v) in std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))) {
        let credential = ["AWS_", "GOOGLE_", "AZURE_", "GCS_"].iter().any(|p| k.starts_with(p))
            && ["KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL", "SAS", "SIGNATURE"].iter().any(|w| k.contains(w));
        if credential && v.len() >= 4 && out.contains(&v) {
            out = out.replace(&v, "<redacted>");
        }
    }
    out
}

fn run<T>(url: &RemoteUrl, what: &str, op: impl AsyncOp<T>) -> Result<T> {
    let c = client(url)?;
    client::block_on(retrying(c.settings.clone(), url.to_string(), what.to_string(), move || op.call(c.store.clone())))?
}

/// A request that can be issued again (a closure over cloned arguments).
trait AsyncOp<T>: Send + 'static {
    type Fut: Future<Output = object_store::Result<T>> + Send;
    fn call(&self, store: std::sync::Arc<dyn ObjectStore>) -> Self::Fut;
}

impl<T, F, Fut> AsyncOp<T> for F
where
    F: Fn(std::sync::Arc<dyn ObjectStore>) -> Fut + Send + 'static,
    Fut: Future<Output = object_store::Result<T>> + Send,
{
    type Fut = Fut;
    fn call(&self, store: std::sync::Arc<dyn ObjectStore>) -> Fut {
        self(store)
    }
}

/// Size of the object at `path`, or `None` when there is none.
fn head_remote(c: &Client, path: &ObjPath, url: &str) -> Result<Option<u64>> {
    let (store, p) = (c.store.clone(), path.clone());
    let got = client::block_on(retrying(c.settings.clone(), url.to_string(), "head".into(), move || {
        let (store, p) = (store.clone(), p.clone());
        async move { store.head(&p).await }
    }))?;
    match got {
        Ok(meta) => Ok(Some(meta.size)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Size of the file or object, or `None` when it does not exist.
pub fn stat(loc: &Location) -> Result<Option<u64>> {
    match loc {
        Location::Local(p) => match std::fs::metadata(p) {
            Ok(md) if md.is_file() => Ok(Some(md.len())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(p, e)),
        },
        Location::Remote(u) => head_remote(&client(u)?, &obj_path(u)?, &u.to_string()),
    }
}

/// Size of the file or object; a missing one is an `InputNotFoundError`.
pub fn head(loc: &Location) -> Result<u64> {
    stat(loc)?.ok_or_else(|| Error::io(PathBuf::from(loc.to_string()), std::io::Error::from(std::io::ErrorKind::NotFound)))
}

/// Every object under a prefix (recursively) or matching a glob on keys, sorted by key.
/// A URL naming one object lists that object; nothing found is an empty list.
pub fn list(pattern: &str) -> Result<Vec<Entry>> {
    match Location::parse(pattern)? {
        Location::Local(p) => list_local(&p),
        Location::Remote(u) => list_remote(&u),
    }
}

fn list_remote(u: &RemoteUrl) -> Result<Vec<Entry>> {
    let glob = has_glob(&u.key).then(|| u.key.clone());
    let base = match &glob {
        Some(g) => location::glob_base(g).to_string(),
        None => u.key.clone(),
    };
    let prefix_url = RemoteUrl { key: base.clone(), ..u.clone() };
    let c = client(u)?;
    let prefix = if base.is_empty() { None } else { Some(obj_path(&prefix_url)?) };
    let mut out: Vec<Entry> = Vec::new();
    // A listing cut short resumes after the last key it got.
    let (mut tries, since) = (0, client::epoch());
    loop {
        let after = out.last().and_then(|e| match &e.location {
            Location::Remote(r) => Some(ObjPath::from(r.key.as_str())),
            Location::Local(_) => None,
        });
        let mut stream = match &after {
            Some(a) => c.store.list_with_offset(prefix.as_ref(), a),
            None => c.store.list(prefix.as_ref()),
        };
        let got: object_store::Result<()> = client::block_on_since(since, async {
            while let Some(item) = stream.next().await {
                let meta = item?;
                let key = meta.location.as_ref().to_string();
                out.push(Entry { location: Location::Remote(RemoteUrl { key, ..u.clone() }), size: meta.size });
            }
            Ok(())
        })?;
        match got {
            Ok(()) => break,
            Err(e) if is_transient(&e) && tries < c.settings.retries => {
                tries += 1;
                client::sleep_since(since, c.settings.delay(tries))?;
            }
            Err(e) => return Err(map_err(&prefix_url.to_string(), e, tries)),
        }
    }
    if let Some(g) = &glob {
        out.retain(|e| matches!(&e.location, Location::Remote(r) if glob_match(g, &r.key)));
    } else if out.is_empty() && !u.key.is_empty() {
        if let Some(size) = head_remote(&c, &obj_path(u)?, &u.to_string())? {
            out.push(Entry { location: Location::Remote(u.clone()), size });
        }
    }
    out.sort_by(|a, b| a.location.cmp(&b.location));
    out.dedup_by(|a, b| a.location == b.location);
    Ok(out)
}

fn list_local(p: &Path) -> Result<Vec<Entry>> {
    let s = p.to_string_lossy();
    let (root, glob) = if has_glob(&s) {
        let base = location::glob_base(&s);
        (
            PathBuf::from(if base.is_empty() && !s.starts_with('/') {
                "."
            } else if base.is_empty() {
                "/"
            } else {
                base
            }),
            Some(s.to_string()),
        )
    } else {
        (p.to_path_buf(), None)
    };
    let mut out = Vec::new();
    match std::fs::metadata(&root) {
        Ok(md) if md.is_file() && glob.is_none() => out.push(Entry { location: Location::Local(root.clone()), size: md.len() }),
        Ok(md) if md.is_dir() => walk(&root, &mut out)?,
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&root, e)),
    }
    if let Some(g) = glob {
        let g = g.trim_start_matches("./").to_string();
        out.retain(|e| match &e.location {
            Location::Local(f) => glob_match(&g, f.to_string_lossy().trim_start_matches("./")),
            Location::Remote(_) => false,
        });
    }
    out.sort_by_key(|a| a.location.to_string());
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<Entry>) -> Result<()> {
    for ent in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let ent = ent.map_err(|e| Error::io(dir, e))?;
        let path = ent.path();
        let md = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
        if md.is_dir() {
            walk(&path, out)?;
        } else if md.is_file() {
            out.push(Entry { location: Location::Local(path), size: md.len() });
        }
    }
    Ok(())
}

/// Stream a file or object from its start.
pub fn open(loc: &Location) -> Result<Box<dyn Read + Send>> {
    match loc {
        Location::Local(p) => Ok(Box::new(File::open(p).map_err(|e| Error::io(p, e))?)),
        Location::Remote(u) => Ok(Box::new(RemoteReader::open(client(u)?, obj_path(u)?, u.to_string(), None)?)),
    }
}

/// Stream bytes `range` of a file or object.
pub fn open_range(loc: &Location, range: Range<u64>) -> Result<Box<dyn Read + Send>> {
    match loc {
        Location::Local(p) => {
            let mut f = File::open(p).map_err(|e| Error::io(p, e))?;
            f.seek(SeekFrom::Start(range.start)).map_err(|e| Error::io(p, e))?;
            Ok(Box::new(f.take(range.end.saturating_sub(range.start))))
        }
        Location::Remote(u) => Ok(Box::new(RemoteReader::open(client(u)?, obj_path(u)?, u.to_string(), Some(range))?)),
    }
}

/// Bytes `range` of a file or object; fewer bytes than asked (the object is shorter) is an error.
pub fn get_range(loc: &Location, range: Range<u64>) -> Result<Vec<u8>> {
    let want = range.end.saturating_sub(range.start);
    let mut out = Vec::with_capacity(want.min(1 << 30) as usize);
    if want > 0 {
        open_range(loc, range.clone())?.read_to_end(&mut out).map_err(|e| unwrap_io(loc, e))?;
    }
    if out.len() as u64 != want {
        return Err(Error::Remote {
            url: loc.to_string(),
            reason: format!("asked for bytes {}..{} but the object ends at {}", range.start, range.end, range.start + out.len() as u64),
        });
    }
    Ok(out)
}

/// The whole file or object, or `None` when there is none. One request of the whole object:
/// a size asked for first could belong to another version of a file that is rewritten in
/// place (tokshuf.json, a lease), and the bytes read after it would splice the two.
pub fn get(loc: &Location) -> Result<Option<Vec<u8>>> {
    let mut out = Vec::new();
    match open(loc).and_then(|mut r| r.read_to_end(&mut out).map_err(|e| unwrap_io(loc, e))) {
        Ok(_) => Ok(Some(out)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The tokshuf error inside an I/O error raised by a `RemoteReader` (or the I/O error itself).
pub fn unwrap_io(loc: &Location, e: std::io::Error) -> Error {
    if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
        if let Ok(inner) = e.into_inner().expect("checked above").downcast::<Error>() {
            return *inner;
        }
        unreachable!("checked above");
    }
    Error::io(PathBuf::from(loc.to_string()), e)
}

/// Write the local file `local` as the whole object (or file) `dest`. Readers see the old
/// object or the new one, never a part: a local file is written beside and renamed.
pub fn put_file(local: &Path, dest: &Location) -> Result<()> {
    match dest {
        Location::Local(p) => {
            if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            }
            let tmp = crate::format::tmp_name(p);
            std::fs::copy(local, &tmp).map_err(|e| Error::io(&tmp, e))?;
            File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| Error::io(&tmp, e))?;
            std::fs::rename(&tmp, p).map_err(|e| Error::io(p, e))
        }
        Location::Remote(u) => upload::put_file(&client(u)?, local, obj_path(u)?, &u.to_string()),
    }
}

/// Write `data` as the whole object (or file) `dest`, replacing any: readers see the old
/// bytes or the new ones, never a part.
pub fn put_bytes(data: Vec<u8>, dest: &Location) -> Result<()> {
    match dest {
        Location::Local(p) => {
            if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            }
            crate::format::write_atomic(p, &data)
        }
        Location::Remote(u) => upload::put_bytes(&client(u)?, data, obj_path(u)?, &u.to_string()),
    }
}

/// Remove a file or object; one already gone is not an error.
pub fn delete(loc: &Location) -> Result<()> {
    match loc {
        Location::Local(p) => match std::fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(p, e)),
            _ => Ok(()),
        },
        Location::Remote(u) => {
            let path = obj_path(u)?;
            match run(u, "delete", move |s: std::sync::Arc<dyn ObjectStore>| {
                let p = path.clone();
                async move { s.delete(&p).await }
            }) {
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

/// An input file named by URL, decoded by its name and buffered, as `input::open` does for
/// local files. A failure of the store reaches the line reader as an I/O error wrapping the
/// tokshuf error (`unwrap_io` gets it back), so it is never taken for a corrupt stream.
pub fn open_input(url: &str, listed: Option<u64>, buffer: usize) -> Result<crate::build::input::Opened> {
    let loc = Location::parse(url)?;
    let Location::Remote(u) = &loc else {
        return Err(Error::Config(format!("{url}: not an object-store URL")));
    };
    let reader = RemoteReader::open(client(u)?, obj_path(u)?, u.to_string(), None)?;
    // The first request pinned the object's version (its ETag), so its size now is the size
    // of every byte that will be read.
    if let Some(n) = listed.filter(|&n| n != reader.size()) {
        return Err(crate::build::input::changed(url, n, reader.size()));
    }
    // An empty object holds no lines whatever its name says (as for local files).
    if reader.is_empty() {
        return Ok(crate::build::input::Opened::empty());
    }
    crate::build::input::decode(&loc.file_name(), Box::new(reader), None, buffer)
}

/// The tokshuf error carried by an I/O error from `RemoteReader`, if it is one.
pub fn remote_error(e: &std::io::Error) -> Option<&Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Error>())
}

/// Size of an input named by a local path or a URL.
pub fn input_size(path: &str) -> Result<u64> {
    head(&Location::parse(path)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn retries_used_up_are_told_from_retries_cut_short() {
        use super::retried_to_the_end as end;
        assert!(end("Error performing PUT http://h/k in 5s, after 4 retries, max_retries: 4, retry_timeout: 180s - x"));
        assert!(!end("Error performing POST http://h/b?delete in 25ms, after 1 retries, max_retries: 4, retry_timeout: 180s"));
        assert!(!end("connection reset"));
    }
}
