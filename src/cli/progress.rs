//! Progress on long runs (a registry sweep, a large plan), on standard error and only on a
//! terminal: piped or redirected output, and CI logs, get none of it.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar or a spinner that draws only when standard error is a terminal.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A bar counting `total` items of `what`; nothing when standard error is not a terminal or
    /// there is nothing to count.
    pub fn bar(total: usize, what: &str) -> Progress {
        if total == 0 || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(what.to_string());
        Progress(Some(bar))
    }

    /// A spinner saying what runs (work that cannot count its steps, like the planner's search).
    pub fn spinner(what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress(Some(bar))
    }

    pub fn advance(&self, n: usize) {
        if let Some(b) = &self.0 {
            b.inc(n as u64);
        }
    }

    /// Clear it from the terminal (the command's own output follows).
    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
