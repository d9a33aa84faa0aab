//! The tool's one reader of `/proc`: paths, whole files, and the fields of `/proc/<pid>/stat` the
//! tool uses (state, parent, controlling terminal), parsed in one place because the command name in
//! parentheses may contain anything, spaces and parentheses included.

use crate::ControlError;
use std::path::PathBuf;

/// `/proc/<pid>/<rest>`.
pub fn path(pid: u32, rest: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{rest}"))
}

/// The whole of `/proc/<pid>/<rest>` as text.
pub fn read(pid: u32, rest: &str) -> Result<String, ControlError> {
    let path = path(pid, rest);
    std::fs::read_to_string(&path).map_err(|source| ControlError::Proc { pid, path, source })
}

/// `pid`'s PID in its own namespace: the last field of `NSpid:` in `/proc/<pid>/status` (`pid`
/// itself on a kernel without the field).
pub fn ns_pid(pid: u32) -> Option<u32> {
    let status = read(pid, "status").ok()?;
    Some(ns_pid_in(&status).unwrap_or(pid))
}

/// The namespace PID in the text of a `status` file.
pub fn ns_pid_in(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// The fields of `/proc/<pid>/stat` the tool reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `T` (stopped), `t` (traced), `Z` (zombie), `X` (dead), ...
    pub state: char,
    pub ppid: u32,
    /// Controlling terminal (0: none).
    pub tty_nr: i64,
    pub num_threads: u64,
    /// Clock ticks after boot at which the process started: with the PID, names one process for
    /// the life of the machine.
    pub start_time: u64,
}

impl Stat {
    /// Exited: a zombie nobody reaped yet, or dead.
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    /// Stopped by a signal (SIGSTOP, or CRIU's freeze of a dump it did not finish) or by a tracer.
    pub fn stopped(&self) -> bool {
        matches!(self.state, 'T' | 't')
    }
}

/// Parses the text of `/proc/<pid>/stat`: `pid (comm) state ppid pgrp session tty_nr ...`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let after_name = text.get(text.rfind(')')? + 1..)?;
    // Field 3 of proc(5) (the state) is the first here.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        state: field(3)?.chars().next()?,
        ppid: field(4)?.parse().ok()?,
        tty_nr: field(7)?.parse().ok()?,
        num_threads: field(20)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
    })
}

/// `/proc/<pid>/stat`, or `None` when the process is gone (or the file unreadable).
pub fn stat(pid: u32) -> Option<Stat> {
    std::fs::read_to_string(path(pid, "stat"))
        .ok()
        .as_deref()
        .and_then(parse_stat)
}

/// Whether a process has exited (gone, or a zombie nobody reaped yet).
pub fn exited(pid: u32) -> bool {
    stat(pid).is_none_or(|s| s.exited())
}

/// What the capture and rebuild read of the group's processes in `/proc`: the seam in front of
/// it, so that their handling of a process that exits or stops half way is unit-tested.
pub trait Procs: Sync {
    /// [`stat`] of `pid`.
    fn stat(&self, pid: u32) -> Option<Stat>;

    /// [`exited`] of `pid`.
    fn exited(&self, pid: u32) -> bool {
        self.stat(pid).is_none_or(|s| s.exited())
    }
}

/// The real `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Proc;

impl Procs for Proc {
    fn stat(&self, pid: u32) -> Option<Stat> {
        stat(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_any_command_name() {
        let s = parse_stat(
            "42 (a) b (c)) T 7 42 42 34817 -1 4194560 0 0 0 0 0 0 0 0 20 0 3 0 123456 8192 1",
        )
        .unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'T',
                ppid: 7,
                tty_nr: 34817,
                num_threads: 3,
                start_time: 123456,
            }
        );
        assert!(s.stopped() && !s.exited());
        assert_eq!(parse_stat("42 (x"), None);
        assert_eq!(parse_stat(""), None);
        let me = stat(std::process::id()).unwrap();
        assert!(!me.exited() && !me.stopped());
    }

    #[test]
    fn zombies_and_reaped_processes_have_exited() {
        assert!(!exited(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: a zombie once it is done, which counts as exited.
        while stat(pid).is_some_and(|s| s.state != 'Z') {
            std::thread::yield_now();
        }
        assert!(exited(pid));
        child.wait().unwrap();
        assert!(exited(pid));
    }
}
