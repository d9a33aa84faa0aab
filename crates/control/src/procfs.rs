//! The tool's one reader of `/proc`: paths, whole files, and the fields of `/proc/<pid>/stat` the
//! tool uses (state, parent, controlling terminal), parsed in one place because the command name in
//! parentheses may contain anything, spaces and parentheses included; a process's PID namespace,
//! root directory and threads. [`Procs`] is the seam in front of these reads for the capture's and
//! the rebuild's unit tests.

use crate::ControlError;
use std::os::unix::fs::MetadataExt;
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

/// A field of `/proc/meminfo` in bytes (`key` with its colon, e.g. `MemAvailable:`), `None`
/// where the file or the field cannot be read.
pub fn meminfo(key: &str) -> Option<u64> {
    meminfo_in(&std::fs::read_to_string("/proc/meminfo").ok()?, key)
}

/// A field of the text of a `meminfo` file, in bytes (the kernel writes kB).
fn meminfo_in(text: &str, key: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
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

/// The inode of the PID namespace process `pid` lives in (`None`: gone, or not readable).
pub fn pid_namespace(pid: u32) -> Option<u64> {
    std::fs::read_link(path(pid, "ns/pid"))
        .ok()
        .and_then(|l| namespace_inode(&l.to_string_lossy()))
}

/// `pid:[4026531836]` → 4026531836.
pub(crate) fn namespace_inode(link: &str) -> Option<u64> {
    link.rsplit_once('[')?.1.strip_suffix(']')?.parse().ok()
}

/// A root directory, known by the device and inode of its directory (comparable across mount
/// namespaces: a bind mount shows the same inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootDir {
    pub dev: u64,
    pub ino: u64,
}

impl std::fmt::Display for RootDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}, inode {}", self.dev, self.ino)
    }
}

/// The root directory of `pid` (`None`: this process).
pub fn root_dir(pid: Option<u32>) -> Result<RootDir, ControlError> {
    let path = match pid {
        Some(pid) => path(pid, "root"),
        None => "/".into(),
    };
    std::fs::metadata(&path)
        .map(|m| RootDir {
            dev: m.dev(),
            ino: m.ino(),
        })
        .map_err(|source| ControlError::Proc {
            pid: pid.unwrap_or_else(std::process::id),
            path,
            source,
        })
}

/// One thread of a process, as `/proc/<pid>/task` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thread {
    /// Its TID in the tool's PID namespace (the name of its `task` directory).
    pub host: u32,
    /// Its TID in its own PID namespace, as its threads see it: the last field of `NSpid:` in its
    /// `status` (the host TID for a process in the tool's namespace; `None`: unreadable).
    pub own: Option<u32>,
}

/// The threads of `pid` (none when it is gone or its `task` directory cannot be read).
pub fn threads(pid: u32) -> Vec<Thread> {
    let Ok(tasks) = std::fs::read_dir(path(pid, "task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|entry| {
            let host = entry.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            Some(Thread {
                host,
                own: ns_pid_in(&status),
            })
        })
        .collect()
}

/// What the capture and rebuild read of the group's processes in `/proc`: the seam in front of
/// it, so that their handling of a process that exits or stops half way, of a workload in a PID
/// namespace or a root of its own, and the lookup of a restore thread are unit-tested.
pub trait Procs: Sync {
    /// [`stat`] of `pid`.
    fn stat(&self, pid: u32) -> Option<Stat>;

    /// [`exited`] of `pid`.
    fn exited(&self, pid: u32) -> bool {
        self.stat(pid).is_none_or(|s| s.exited())
    }

    /// [`pid_namespace`] of `pid` (`None`: this process).
    fn pid_namespace(&self, pid: Option<u32>) -> Option<u64>;

    /// [`root_dir`] of `pid` (`None`: this process).
    fn root_dir(&self, pid: Option<u32>) -> Result<RootDir, ControlError>;

    /// [`threads`] of `pid`.
    fn threads(&self, pid: u32) -> Vec<Thread>;
}

/// The real `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Proc;

impl Procs for Proc {
    fn stat(&self, pid: u32) -> Option<Stat> {
        stat(pid)
    }

    fn pid_namespace(&self, pid: Option<u32>) -> Option<u64> {
        pid_namespace(pid.unwrap_or_else(std::process::id))
    }

    fn root_dir(&self, pid: Option<u32>) -> Result<RootDir, ControlError> {
        root_dir(pid)
    }

    fn threads(&self, pid: u32) -> Vec<Thread> {
        threads(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meminfo_field_is_read_in_bytes_and_only_by_its_whole_key() {
        let text = "MemTotal:       32768 kB\nMemAvailableX:     1 kB\nMemAvailable:   16384 kB\n";
        assert_eq!(meminfo_in(text, "MemAvailable:"), Some(16384 * 1024));
        assert_eq!(meminfo_in(text, "MemTotal:"), Some(32768 * 1024));
        assert_eq!(meminfo_in(text, "SwapFree:"), None);
        assert_eq!(meminfo_in("MemAvailable: lots kB\n", "MemAvailable:"), None);
        assert!(
            meminfo("MemTotal:").is_some_and(|b| b > 0),
            "this machine's own meminfo"
        );
    }

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
