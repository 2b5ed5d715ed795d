//! A build's lease in an object store: what stands in for the build lock (`format::lock`,
//! which needs a file system) when the output is a prefix in a store.
//!
//! The driver of a build into a store writes `OUTPUT/.tokshuf-lock` when it starts, rewrites it
//! every sixth of the lease time while it runs (a thread of its own), and removes it when the
//! cache is complete. A reader following the build takes a lease that has not been renewed for
//! the lease time as a build that died; a second build refuses to start while a live lease is
//! there (unless its holder ran on the same machine and is gone: a killed driver run again
//! where it ran resumes at once). The lease time is `TOKSHUF_REMOTE_LEASE` seconds (default
//! 60); it relies on the machines' clocks agreeing to well within that. Stores offer no lock:
//! two builds started within the same few seconds are not told apart.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{delete, get, put_bytes, Location};
use crate::error::{Error, Result};
use crate::format::lock::BuildState;

/// What the lease object holds.
#[derive(Serialize, Deserialize, Debug)]
struct Record {
    host: String,
    pid: u32,
    /// When it was last written, in milliseconds since the Unix epoch.
    renewed_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How long a lease lasts without renewal.
pub fn lease_time() -> Duration {
    let s = std::env::var("TOKSHUF_REMOTE_LEASE").ok().and_then(|v| v.trim().parse::<f64>().ok());
    Duration::from_secs_f64(s.filter(|s| s.is_finite() && *s > 0.0).unwrap_or(60.0))
}

fn read(loc: &Location) -> Result<Option<Record>> {
    let Some(bytes) = get(loc)? else { return Ok(None) };
    Ok(serde_json::from_slice(&bytes).ok())
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string()
}

/// Process `pid` of machine `host` ran here and is gone (and is not this one). A process of
/// another user answers EPERM: it exists.
fn gone_here(host: &str, pid: u32) -> bool {
    // SAFETY: kill with signal 0 only asks whether the process exists.
    host == hostname() && pid != std::process::id() && unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 && {
        std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
}

/// `HOST-PID` of this process, for names of files and folders it alone writes (`tag_gone`).
pub(crate) fn tag() -> String {
    format!("{}-{}", hostname(), std::process::id())
}

/// Whether `tag` (as `tag` makes it) names a process of this machine that is gone: what it
/// left is garbage. A process of another machine sharing the folder is never taken for gone.
pub(crate) fn tag_gone(tag: &str) -> bool {
    tag.rsplit_once('-').is_some_and(|(host, pid)| pid.parse().is_ok_and(|pid| gone_here(host, pid)))
}

/// The holder ran on this machine and its process is gone: a driver killed here, run again
/// here, need not wait for its lease to go stale.
fn died_here(r: &Record) -> bool {
    gone_here(&r.host, r.pid)
}

/// Write the lease as renewed now, or (`live` false) as given up: stale at once.
fn write(loc: &Location, live: bool) -> Result<()> {
    let record = Record { host: hostname(), pid: std::process::id(), renewed_ms: if live { now_ms() } else { 0 } };
    put_bytes(serde_json::to_vec(&record).unwrap_or_default(), loc)
}

/// Milliseconds since the lease at `loc` was renewed, and who holds it; None without one.
fn age(loc: &Location) -> Result<Option<(u64, Record)>> {
    Ok(read(loc)?.map(|r| (now_ms().saturating_sub(r.renewed_ms), r)))
}

/// Is a build renewing the lease at `loc`? Unknown when there is none (a build that keeps no
/// lease, or none yet) or the store cannot be asked.
pub fn state(loc: &Location) -> BuildState {
    match age(loc) {
        Ok(Some((ms, _))) if ms > lease_time().as_millis() as u64 => BuildState::NotRunning,
        Ok(Some(_)) => BuildState::Running,
        Ok(None) | Err(_) => BuildState::Unknown,
    }
}

/// A lease held by this process, renewed until it is released or dropped.
pub struct Lease {
    loc: Location,
    stop: Arc<(Mutex<bool>, Condvar)>,
    renewer: Option<JoinHandle<()>>,
    released: bool,
}

impl Lease {
    /// Take the lease at `loc` for the build into `output`: refused while another build
    /// renews it.
    pub fn take(loc: Location, output: &str) -> Result<Lease> {
        if let Some((ms, r)) = age(&loc)? {
            if ms <= lease_time().as_millis() as u64 && !died_here(&r) {
                return Err(Error::OutputExists(format!(
                    "{output}: another tokshuf build is writing into this prefix (process {} on {}, lease renewed {:.0} s ago); \
                     wait for it to finish or stop it",
                    r.pid,
                    r.host,
                    ms as f64 / 1000.0
                )));
            }
        }
        write(&loc, true)?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let (l, s) = (loc.clone(), stop.clone());
        let every = lease_time() / 6;
        let renewer = std::thread::Builder::new()
            .name("tokshuf-lease".into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !*stopped {
                    stopped = cv.wait_timeout(stopped, every).unwrap_or_else(|e| e.into_inner()).0;
                    if !*stopped {
                        // A failed renewal is retried at the next turn; a lease that goes
                        // stale meanwhile only makes followers give up early.
                        let _ = write(&l, true);
                    }
                }
            })
            .map_err(|e| Error::Config(format!("cannot start a thread: {e}")))?;
        Ok(Lease { loc, stop, renewer: Some(renewer), released: false })
    }

    fn stop_renewing(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
    }

    /// The cache is complete: stop renewing and remove the lease.
    pub fn release(mut self) -> Result<()> {
        self.stop_renewing();
        self.released = true;
        delete(&self.loc)
    }
}

impl Drop for Lease {
    /// A build that stops without completing (an error, Ctrl-C) marks its lease stale: its
    /// followers learn at once that it stopped, and the same build run again starts at once.
    /// (A build killed outright leaves a lease that goes stale by itself.)
    fn drop(&mut self) {
        self.stop_renewing();
        if !self.released {
            let _ = write(&self.loc, false);
        }
    }
}
