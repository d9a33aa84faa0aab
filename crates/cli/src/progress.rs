//! Progress bars for long phases, and a line per phase that moved bytes with its rate, drawn only
//! on a terminal.

use control::capture::{PhaseTiming, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;

/// One bar per phase that moves bytes; nothing when stderr is not a terminal or output is JSON.
#[derive(Debug)]
pub struct Bars {
    enabled: bool,
    current: Mutex<Option<ProgressBar>>,
}

impl Bars {
    pub fn new(wanted: bool) -> Bars {
        Bars {
            enabled: wanted && std::io::stderr().is_terminal(),
            current: Mutex::new(None),
        }
    }
}

impl Progress for Bars {
    fn phase_started(&self, name: &'static str, total_bytes: Option<u64>) {
        let Some(total) = total_bytes.filter(|_| self.enabled) else {
            return;
        };
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{msg:>8} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(name);
        if let Ok(mut current) = self.current.lock() {
            *current = Some(bar);
        }
    }

    fn advance(&self, bytes: u64) {
        if let Ok(current) = self.current.lock()
            && let Some(bar) = current.as_ref()
        {
            bar.inc(bytes);
        }
    }

    fn phase_finished(&self, timing: &PhaseTiming) {
        if let Ok(mut current) = self.current.lock()
            && let Some(bar) = current.take()
        {
            bar.finish_and_clear();
        }
        // What the bar showed, kept on the terminal: each phase that moved bytes, its rate.
        if let Some(rate) = timing.gigabytes_per_second().filter(|_| self.enabled) {
            eprintln!(
                "{:>16} {} in {:.1} ms, {rate:.2} GB/s",
                timing.name,
                crate::output::bytes(timing.bytes),
                timing.millis
            );
        }
    }
}
