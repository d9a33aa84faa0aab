//! A tiny logger for code that runs inside the application: one `write` per line to stderr, a fixed
//! prefix `cuinterpose[<pid>]: `, a level read once from `CUINTERPOSE_LOG`, and a rate limit so that
//! a misbehaving peer cannot flood the application's stderr.
//!
//! No subscriber, no allocation before the level check, no lock: the state is a few atomics, so a
//! log call is safe from any thread and in a forked child.

use std::io::Write;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Severity, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

/// 0 = off; otherwise the most verbose [`Level`] that is written. Warn until configured.
static MAX_LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Lines allowed per one-second window; the rest are counted and reported once.
const LINES_PER_SECOND: u32 = 50;
static WINDOW: AtomicU64 = AtomicU64::new(0);
static LINES_IN_WINDOW: AtomicU32 = AtomicU32::new(0);
static SUPPRESSED: AtomicU32 = AtomicU32::new(0);

/// Parses a `CUINTERPOSE_LOG` value: a level (`warn`), `off`, or a comma-separated filter list
/// in which items `cuinterpose=LEVEL` or `shim=LEVEL` count and other targets are ignored. The last
/// item that counts wins; `Ok(None)` when none counts (a filter meant for other targets), `Err`
/// with the first item that counts but names no level.
pub fn parse_filter(value: &str) -> Result<Option<u8>, String> {
    let mut result = None;
    for item in value.split(',').map(str::trim) {
        let level = match item.split_once('=') {
            Some((target, level)) => {
                let target = target.trim();
                if !(target.starts_with("cuinterpose") || target.starts_with("shim")) {
                    continue;
                }
                level.trim()
            }
            None => item,
        };
        let parsed = match level.to_ascii_lowercase().as_str() {
            "off" | "none" => 0,
            "error" => Level::Error as u8,
            "warn" | "warning" => Level::Warn as u8,
            "info" => Level::Info as u8,
            "debug" => Level::Debug as u8,
            "trace" => Level::Trace as u8,
            _ => return Err(item.to_string()),
        };
        result = Some(parsed);
    }
    Ok(result)
}

/// Sets the most verbose level written (from the shim runtime's `ShimConfig`, once, at runtime
/// start; from its arguments in the carrier helper).
pub fn set_max_level(level: u8) {
    MAX_LEVEL.store(level, Ordering::Relaxed);
}

/// Whether a line at `level` would be written (before rate limiting).
pub fn enabled(level: Level) -> bool {
    level as u8 <= MAX_LEVEL.load(Ordering::Relaxed)
}

/// Writes one line if the level and the rate limit allow it. Use the `log_*!` macros.
pub fn write(level: Level, args: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut suppressed_before = 0;
    if WINDOW.swap(now, Ordering::Relaxed) != now {
        LINES_IN_WINDOW.store(0, Ordering::Relaxed);
        suppressed_before = SUPPRESSED.swap(0, Ordering::Relaxed);
    }
    if LINES_IN_WINDOW.fetch_add(1, Ordering::Relaxed) >= LINES_PER_SECOND {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let pid = rustix::process::getpid().as_raw_nonzero();
    let mut line = String::with_capacity(128);
    use std::fmt::Write as _;
    if suppressed_before > 0 {
        let _ = writeln!(
            line,
            "cuinterpose[{pid}]: warn: {suppressed_before} log lines suppressed by the rate limit"
        );
    }
    let _ = writeln!(line, "cuinterpose[{pid}]: {}: {args}", level.name());
    // One write of the whole line, so that lines of several threads do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

// Exported (they reach the crate root) because the shim runtime logs through them too; the
// re-export below gives them their path here, `log::log_warn!`.
#[macro_export]
macro_rules! log_error { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_warn { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_debug { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($t)*)) } }
pub use crate::{log_debug, log_error, log_info, log_warn};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_levels_and_targets() {
        assert_eq!(parse_filter("debug"), Ok(Some(Level::Debug as u8)));
        assert_eq!(parse_filter("off"), Ok(Some(0)));
        assert_eq!(
            parse_filter("hyper=trace,cuinterpose=info"),
            Ok(Some(Level::Info as u8))
        );
        assert_eq!(parse_filter("hyper=trace"), Ok(None));
        assert_eq!(parse_filter("loud"), Err("loud".into()));
        assert_eq!(
            parse_filter("hyper=loud,shim=lots"),
            Err("shim=lots".into())
        );
        assert_eq!(
            parse_filter("warn,shim=error"),
            Ok(Some(Level::Error as u8))
        );
    }
}
