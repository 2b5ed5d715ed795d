//! The hooks themselves. All are inert unless their environment
//! variable is set; they are read once at the start of each build (`init`).
//!
//! - `TOKSHUF_TEST_TRACE=FILE`: append `NAME\n` to FILE each time the build reaches a named
//!   point (see the `point` calls under `build/`).
//! - `TOKSHUF_TEST_PAUSE=NAME[:N]`: the N-th time (default 1) point NAME (or, for `PREFIX*`,
//!   any point whose name starts with PREFIX) is reached, append
//!   `paused NAME\n` to the trace file and sleep for good, so a test can SIGKILL the build at
//!   exactly that point.
//! - `TOKSHUF_TEST_GATE=NAME:FILE`: the first time point NAME is reached, append `gate NAME\n`
//!   to the trace file and wait until FILE exists (a test starts a follow reader meanwhile).
//! - `TOKSHUF_TEST_SLOW=PREFIX:MS[,PREFIX:MS...]`: sleep MS milliseconds at every point whose
//!   name starts with PREFIX (a slow build, for follow-mode tests).
//! - `TOKSHUF_TEST_FAIL_AFTER_BYTES=N`: once N bytes of build output (spills, shards, metadata)
//!   have been written, every further write fails with ENOSPC, as on a full disk.
//!
//! Not a user feature: names and behaviour may change with any release.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

static ENABLED: AtomicBool = AtomicBool::new(false);
static BUDGET_ON: AtomicBool = AtomicBool::new(false);
static BUDGET: AtomicI64 = AtomicI64::new(0);
static STATE: Mutex<Option<State>> = Mutex::new(None);

struct State {
    trace: Option<std::path::PathBuf>,
    pause: Option<(String, u64)>,
    seen_pause: u64,
    gate: Option<(String, std::path::PathBuf)>,
    slow: Vec<(String, u64)>,
}

/// Read the hook variables (once per build).
pub fn init() {
    let trace = std::env::var_os("TOKSHUF_TEST_TRACE").map(Into::into);
    let pause = std::env::var("TOKSHUF_TEST_PAUSE").ok().map(|s| match s.rsplit_once(':') {
        Some((name, n)) if n.parse::<u64>().is_ok() => (name.to_string(), n.parse().unwrap_or(1)),
        _ => (s, 1),
    });
    let budget = std::env::var("TOKSHUF_TEST_FAIL_AFTER_BYTES").ok().and_then(|s| s.parse::<i64>().ok());
    let gate = std::env::var("TOKSHUF_TEST_GATE").ok().and_then(|s| s.split_once(':').map(|(n, f)| (n.to_string(), f.into())));
    let slow: Vec<(String, u64)> = std::env::var("TOKSHUF_TEST_SLOW")
        .ok()
        .map(|s| s.split(',').filter_map(|p| p.rsplit_once(':').and_then(|(n, ms)| Some((n.to_string(), ms.parse().ok()?)))).collect())
        .unwrap_or_default();
    ENABLED.store(trace.is_some() || pause.is_some() || gate.is_some() || !slow.is_empty(), Ordering::SeqCst);
    BUDGET_ON.store(budget.is_some(), Ordering::SeqCst);
    BUDGET.store(budget.unwrap_or(0), Ordering::SeqCst);
    if let Ok(mut s) = STATE.lock() {
        *s = Some(State { trace, pause, seen_pause: 0, gate, slow });
    }
}

/// The build reached point `name`.
pub fn point(name: &str) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let (trace, pause_here, gate, slow_ms) = {
        let Ok(mut guard) = STATE.lock() else { return };
        let Some(s) = guard.as_mut() else { return };
        let gate = if s.gate.as_ref().is_some_and(|(n, _)| n == name) { s.gate.take().map(|(_, f)| f) } else { None };
        let slow_ms: u64 = s.slow.iter().filter(|(p, _)| name.starts_with(p.as_str())).map(|(_, ms)| *ms).sum();
        let matches = s.pause.as_ref().is_some_and(|(p, _)| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => p == name,
        });
        let pause_here = matches && {
            s.seen_pause += 1;
            s.pause.as_ref().is_some_and(|(_, k)| *k == s.seen_pause)
        };
        (s.trace.clone(), pause_here, gate, slow_ms)
    };
    if slow_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(slow_ms));
    }
    if let Some(file) = gate {
        if let Some(path) = &trace {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = f.write_all(format!("gate {name}\n").as_bytes());
            }
        }
        while !file.exists() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    if let Some(path) = &trace {
        let line = if pause_here { format!("{name}\npaused {name}\n") } else { format!("{name}\n") };
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all(line.as_bytes());
        }
    }
    if pause_here {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Account for `n` bytes about to be written; fails like a full disk once the budget is spent.
#[inline]
pub fn charge(n: usize) -> std::io::Result<()> {
    if BUDGET_ON.load(Ordering::Relaxed) && BUDGET.fetch_sub(n as i64, Ordering::SeqCst) < n as i64 {
        return Err(std::io::Error::from_raw_os_error(28));
    }
    Ok(())
}
