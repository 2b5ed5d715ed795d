//! A one-line progress display per stage on stderr (only when asked for and stderr is a
//! terminal), and nothing at all otherwise.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Instant;

pub struct Progress {
    enabled: bool,
    state: Mutex<State>,
}

struct State {
    stage: String,
    total: u64,
    done: u64,
    bytes: u64,
    tokens: u64,
    started: Instant,
    last_draw: Instant,
}

impl Progress {
    pub fn new(enabled: bool) -> Self {
        let now = Instant::now();
        Progress {
            enabled: enabled && std::io::stderr().is_terminal(),
            state: Mutex::new(State { stage: String::new(), total: 0, done: 0, bytes: 0, tokens: 0, started: now, last_draw: now }),
        }
    }

    /// Begin a stage of `total` units (files or chunks).
    pub fn stage(&self, name: &str, total: u64) {
        if let Ok(mut s) = self.state.lock() {
            if self.enabled && !s.stage.is_empty() {
                eprintln!();
            }
            *s = State { stage: name.to_string(), total, done: 0, bytes: 0, tokens: 0, started: Instant::now(), last_draw: Instant::now() };
        }
        self.draw(true);
    }

    pub fn advance(&self, units: u64, bytes: u64, tokens: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.done += units;
            s.bytes += bytes;
            s.tokens += tokens;
        }
        self.draw(false);
    }

    pub fn end(&self) {
        self.draw(true);
        if self.enabled {
            eprintln!();
        }
    }

    fn draw(&self, force: bool) {
        if !self.enabled {
            return;
        }
        let Ok(mut s) = self.state.lock() else { return };
        if !force && s.last_draw.elapsed().as_millis() < 200 {
            return;
        }
        s.last_draw = Instant::now();
        let secs = s.started.elapsed().as_secs_f64().max(1e-3);
        let eta = if s.done > 0 && s.total > s.done {
            format!(", ETA {:.0}s", secs / s.done as f64 * (s.total - s.done) as f64)
        } else {
            String::new()
        };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{}: {}/{} | {:.1} MB/s | {:.2} Mtok/s | {:.0}s{}   ",
            s.stage,
            s.done,
            s.total,
            s.bytes as f64 / 1e6 / secs,
            s.tokens as f64 / 1e6 / secs,
            secs,
            eta
        );
        let _ = err.flush();
    }
}
