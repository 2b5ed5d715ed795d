//! The build's progress bars (indicatif), one line per stage on stderr, shared by every engine
//! (the Ray driver reaches them through the bindings).
//!
//! What a user sees: each stage ends with its final state left on screen (the bar abandoned,
//! not cleared, so "tokenize 3/3" stays), a redraw clears the whole line first, and the line is
//! ended whatever stops the build (an error, Ctrl-C: `Drop`), so a message printed after it
//! starts on a line of its own. When stderr is not a terminal (a log file, a pipe) nothing is
//! drawn at all: indicatif hides its stderr target there.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the elapsed time and ETA are redrawn while nothing advances (a stage-1 file can
/// take minutes, a Ray task longer).
const TICK: Duration = Duration::from_millis(500);

pub struct Progress {
    enabled: bool,
    stage: Mutex<Option<Stage>>,
}

struct Stage {
    bar: ProgressBar,
    unit: String,
    bytes: u64,
    tokens: u64,
    started: Instant,
}

impl Stage {
    /// Draw the last state and leave it (abandon: the position stays what it is, where
    /// indicatif's `finish` would show the bar full).
    fn finish(self) {
        self.bar.set_style(style(FINAL));
        self.bar.set_message(self.message());
        self.bar.abandon();
    }

    fn message(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        format!("{} | {:.1} MB/s | {:.2} Mtok/s", self.unit, self.bytes as f64 / 1e6 / secs, self.tokens as f64 / 1e6 / secs)
    }
}

const TEMPLATE: &str = "{prefix:<8} [{bar:30}] {pos}/{len} {msg} | {elapsed}, ETA {eta}";
/// A stage's last state: how long it took, no ETA.
const FINAL: &str = "{prefix:<8} [{bar:30}] {pos}/{len} {msg} | {elapsed}";

fn style(template: &str) -> ProgressStyle {
    // Constant templates: failing to parse one is a bug the unit test catches.
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> ")
}

impl Progress {
    /// Bars on stderr if `enabled` and stderr is a terminal; otherwise every call does nothing.
    pub fn new(enabled: bool) -> Self {
        let enabled = enabled && !ProgressDrawTarget::stderr().is_hidden();
        Progress { enabled, stage: Mutex::new(None) }
    }

    /// End the current stage, if any, and begin `name` of `total` units (`unit`: files, chunks).
    pub fn stage(&self, name: &str, total: u64, unit: &str) {
        if !self.enabled {
            return;
        }
        let Ok(mut cur) = self.stage.lock() else { return };
        if let Some(old) = cur.take() {
            old.finish();
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
            .with_style(style(TEMPLATE))
            .with_prefix(name.to_string());
        let stage = Stage { bar, unit: unit.to_string(), bytes: 0, tokens: 0, started: Instant::now() };
        stage.bar.set_message(stage.message());
        stage.bar.enable_steady_tick(TICK);
        *cur = Some(stage);
    }

    /// `units` more done, with the input `bytes` and `tokens` they account for.
    pub fn advance(&self, units: u64, bytes: u64, tokens: u64) {
        if !self.enabled {
            return;
        }
        let Ok(mut cur) = self.stage.lock() else { return };
        if let Some(s) = cur.as_mut() {
            s.bytes += bytes;
            s.tokens += tokens;
            s.bar.set_message(s.message());
            s.bar.inc(units);
        }
    }

    /// Leave the current stage's final state on its own line.
    pub fn end(&self) {
        let Ok(mut cur) = self.stage.lock() else { return };
        if let Some(s) = cur.take() {
            s.finish();
        }
    }
}

impl Drop for Progress {
    /// A build stopped by an error or Ctrl-C still ends its line.
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
        assert!(ProgressStyle::with_template(FINAL).is_ok());
    }

    #[test]
    fn disabled_progress_does_nothing() {
        let p = Progress::new(false);
        p.stage("tokenize", 3, "files");
        p.advance(1, 10, 10);
        assert!(p.stage.lock().unwrap().is_none());
        p.end();
    }
}
