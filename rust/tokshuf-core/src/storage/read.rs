//! Streaming reads of one object: a blocking `Read` over an HTTP body that survives dropped
//! connections, stalls and throttling by asking again for the bytes it still lacks (a range
//! request from its offset), and never mistakes a cut-short body for the end of the object.

use std::io::Read;
use std::ops::Range;

use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt};
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange};

use super::client::Client;
use super::{is_transient, map_err};
use crate::error::{Error, Result};

/// Bytes `range` of one object, streamed. `size` and `etag` pin the object version: every
/// re-request asks for the same version (If-Match), so a resumed read cannot splice two.
pub struct RemoteReader {
    client: Client,
    path: ObjPath,
    url: String,
    pos: u64,
    end: u64,
    etag: Option<String>,
    stream: Option<BoxStream<'static, object_store::Result<Bytes>>>,
    buf: Bytes,
    /// Failures since bytes last arrived.
    failures: usize,
    last_failure: String,
    /// Interrupts counted when the read began (`client::epoch`): one since gives up.
    since: u64,
}

impl RemoteReader {
    /// Open `range` of the object (the whole object when `None`). The first request is
    /// made here, so a missing object or refused credentials fail at open.
    pub(super) fn open(client: Client, path: ObjPath, url: String, range: Option<Range<u64>>) -> Result<RemoteReader> {
        let mut r = RemoteReader {
            client,
            path,
            url,
            pos: range.as_ref().map_or(0, |r| r.start),
            end: range.as_ref().map_or(u64::MAX, |r| r.end),
            etag: None,
            stream: None,
            buf: Bytes::new(),
            failures: 0,
            last_failure: String::new(),
            since: super::client::epoch(),
        };
        if r.pos < r.end {
            r.request()?;
        }
        Ok(r)
    }

    /// Where the range ends: for a whole object, once opened, its size.
    pub fn size(&self) -> u64 {
        self.end
    }

    /// True when the range holds no bytes (an empty object).
    pub fn is_empty(&self) -> bool {
        self.pos >= self.end && self.buf.is_empty()
    }

    /// (Re)issue the GET for `pos..end`, retrying transient failures.
    fn request(&mut self) -> Result<()> {
        loop {
            // The first request of a whole object asks for no range: a range on an empty
            // object is unsatisfiable.
            let range = match (self.pos, self.end) {
                (0, u64::MAX) => None,
                (pos, u64::MAX) => Some(GetRange::Offset(pos)),
                (pos, end) => Some(GetRange::Bounded(pos..end)),
            };
            let opts = GetOptions { range, if_match: self.etag.clone(), ..Default::default() };
            let store = self.client.store.clone();
            let path = self.path.clone();
            match super::client::block_on_since(self.since, async move { store.get_opts(&path, opts).await })? {
                Ok(got) => {
                    // An object shorter than the range asked for: the store sends what there
                    // is, and the caller sees a short read rather than a retried truncation.
                    self.end = self.end.min(got.meta.size).min(got.range.end);
                    if self.etag.is_none() {
                        self.etag = got.meta.e_tag.clone();
                    }
                    if got.range.start != self.pos {
                        return Err(Error::Remote {
                            url: self.url.clone(),
                            reason: format!("asked for bytes from {} but the store sent from {}", self.pos, got.range.start),
                        });
                    }
                    self.stream = Some(got.into_stream());
                    return Ok(());
                }
                Err(object_store::Error::Precondition { .. }) => {
                    return Err(Error::Remote {
                        url: self.url.clone(),
                        reason: format!("the object changed while it was being read (at byte {})", self.pos),
                    })
                }
                Err(e) if is_transient(&e) => self.failed(super::redact(&e.to_string()))?,
                Err(e) => return Err(map_err(&self.url, e, self.failures)),
            }
        }
    }

    /// Count one failure without progress; wait, or give up when the tries are spent.
    fn failed(&mut self, why: String) -> Result<()> {
        self.stream = None;
        self.failures += 1;
        self.last_failure = why;
        if self.failures > self.client.settings.retries {
            return Err(Error::Remote {
                url: self.url.clone(),
                reason: format!("gave up at byte {} of {} after {} tries: {}", self.pos, self.end, self.failures, self.last_failure),
            });
        }
        super::client::sleep_since(self.since, self.client.settings.delay(self.failures))
    }

    fn fill(&mut self) -> Result<()> {
        while self.buf.is_empty() && self.pos < self.end {
            if self.stream.is_none() {
                self.request()?;
            }
            let Some(stream) = self.stream.as_mut() else { continue };
            match super::client::block_on_since(self.since, stream.next())? {
                Some(Ok(b)) if b.is_empty() => {}
                Some(Ok(mut b)) => {
                    let room = self.end - self.pos;
                    if b.len() as u64 > room {
                        // More than asked for: the store ignored the range. Use what was asked.
                        b.truncate(room as usize);
                    }
                    self.pos += b.len() as u64;
                    self.buf = b;
                    self.failures = 0;
                }
                Some(Err(e)) if is_transient(&e) || is_body_error(&e) => self.failed(super::redact(&e.to_string()))?,
                Some(Err(e)) => return Err(map_err(&self.url, e, self.failures)),
                // The body ended before the bytes the store promised: a truncated response,
                // not the end of the object.
                None => self.failed(format!("response body ended early at byte {} of {}", self.pos, self.end))?,
            }
        }
        Ok(())
    }
}

/// A failure reading a body after the response began (connection reset, decode error).
fn is_body_error(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { .. })
}

impl Read for RemoteReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.buf.is_empty() {
            self.fill().map_err(std::io::Error::other)?;
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        let _ = self.buf.split_to(n);
        Ok(n)
    }
}
