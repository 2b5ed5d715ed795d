//! Uploads of a local file as one whole object. Small files go in one PUT; larger ones as a
//! multipart upload whose parts are retried one by one and which is either completed or
//! aborted, so the object is never visible half-written.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};

use super::client::{block_on, runtime, Client};
use super::retrying;
use crate::error::{Error, Result};

/// `data` as one whole object: one PUT when it fits a part, else a multipart upload from a
/// temporary file.
pub(super) fn put_bytes(client: &Client, data: Vec<u8>, path: ObjPath, url: &str) -> Result<()> {
    if data.len() > client.settings.part_size {
        let tmp = tempfile::NamedTempFile::new().map_err(|e| Error::io(std::env::temp_dir(), e))?;
        std::fs::write(tmp.path(), &data).map_err(|e| Error::io(tmp.path(), e))?;
        return put_file(client, tmp.path(), path, url);
    }
    let payload = PutPayload::from(Bytes::from(data));
    let store = client.store.clone();
    block_on(retrying(client.settings.clone(), url.to_string(), "upload".into(), move || {
        let (store, p, payload) = (store.clone(), path.clone(), payload.clone());
        async move { store.put(&p, payload).await.map(|_| ()) }
    }))?
}

pub(super) fn put_file(client: &Client, local: &Path, path: ObjPath, url: &str) -> Result<()> {
    let rt = runtime()?;
    let mut file = File::open(local).map_err(|e| Error::io(local, e))?;
    let size = file.metadata().map_err(|e| Error::io(local, e))?.len();
    let part = client.settings.part_size as u64;
    if size <= part {
        let data = read_exact(&mut file, local, size)?;
        let payload = PutPayload::from(data);
        let (store, p) = (client.store.clone(), path.clone());
        block_on(retrying(client.settings.clone(), url.to_string(), "upload".into(), move || {
            let (store, p, payload) = (store.clone(), p.clone(), payload.clone());
            async move { store.put(&p, payload).await.map(|_| ()) }
        }))??;
        return Ok(());
    }

    let mp = client.multipart.clone();
    let (m, p) = (mp.clone(), path.clone());
    let id = block_on(retrying(client.settings.clone(), url.to_string(), "start a multipart upload".into(), move || {
        let (m, p) = (m.clone(), p.clone());
        async move { m.create_multipart(&p).await }
    }))??;

    let parts = upload_parts(client, &mut file, local, size, &path, &id, url);
    let outcome = parts.and_then(|parts| {
        let (m, p, i) = (mp.clone(), path.clone(), id.clone());
        block_on(retrying(client.settings.clone(), url.to_string(), "complete a multipart upload".into(), move || {
            let (m, p, i, parts) = (m.clone(), p.clone(), i.clone(), parts.clone());
            async move { m.complete_multipart(&p, &i, parts).await.map(|_| ()) }
        }))?
    });
    // A completion whose reply was lost is retried and then finds no such upload: the object
    // is there, whole, if it has the file's size.
    let outcome = match outcome {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => match super::head_remote(client, &path, url) {
            Ok(Some(n)) if n == size => Ok(()),
            _ => Err(Error::Remote { url: url.to_string(), reason: "the multipart upload vanished before it completed".into() }),
        },
        other => other,
    };
    if let Err(e) = outcome {
        // Best effort: an upload left open is invisible, but it holds storage until the
        // bucket's lifecycle rules remove it.
        let (m, p, i) = (mp.clone(), path.clone(), id.clone());
        // Not given up on an interrupt: it is what tidies up after one.
        let _ = rt.block_on(retrying(client.settings.clone(), url.to_string(), "abort a multipart upload".into(), move || {
            let (m, p, i) = (m.clone(), p.clone(), i.clone());
            async move { m.abort_multipart(&p, &i).await }
        }));
        return Err(e);
    }
    Ok(())
}

/// Upload every part, a bounded number at once (memory: parallelism x part size).
fn upload_parts(
    client: &Client,
    file: &mut File,
    local: &Path,
    size: u64,
    path: &ObjPath,
    id: &str,
    url: &str,
) -> Result<Vec<object_store::multipart::PartId>> {
    let rt = runtime()?;
    let part = client.settings.part_size as u64;
    let count = size.div_ceil(part);
    let mut done = Vec::with_capacity(count as usize);
    let mut running = VecDeque::new();
    for idx in 0..count {
        let len = part.min(size - idx * part);
        let data = read_exact(file, local, len)?;
        let (m, p, i) = (client.multipart.clone(), path.clone(), id.to_string());
        let payload = PutPayload::from(data);
        let what = format!("upload part {} of {count}", idx + 1);
        running.push_back(rt.spawn(retrying(client.settings.clone(), url.to_string(), what, move || {
            let (m, p, i, payload) = (m.clone(), p.clone(), i.clone(), payload.clone());
            async move { m.put_part(&p, &i, idx as usize, payload).await }
        })));
        if running.len() >= client.settings.upload_parallelism {
            done.push(join(running.pop_front(), url)?);
        }
    }
    while !running.is_empty() {
        done.push(join(running.pop_front(), url)?);
    }
    Ok(done)
}

fn join<T>(handle: Option<tokio::task::JoinHandle<Result<T>>>, url: &str) -> Result<T> {
    let Some(handle) = handle else {
        return Err(Error::Remote { url: url.to_string(), reason: "internal: no upload running".into() });
    };
    block_on(handle)?.map_err(|e| Error::Remote { url: url.to_string(), reason: format!("an upload task failed: {e}") })?
}

fn read_exact(file: &mut File, local: &Path, len: u64) -> Result<Bytes> {
    let mut data = Vec::with_capacity(len as usize);
    (&mut *file).take(len).read_to_end(&mut data).map_err(|e| Error::io(local, e))?;
    if data.len() as u64 != len {
        return Err(Error::io(local, std::io::Error::other("the file shrank while it was being uploaded")));
    }
    Ok(Bytes::from(data))
}
