//! Finding the processes of a workload through `/proc`, never through their environment (setproctitle
//! overwrites `/proc/<pid>/environ`, prior-art §8.1 item 7): the process tree under a root, which of
//! them map the CUDA driver and the shim, their namespace PIDs, and the shim's control socket, found
//! among the process's own descriptors and reached through `/proc/<pid>/root`.

use crate::procfs::{Proc, Procs};
use crate::{ControlError, procfs};
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

/// File name of the interposer library as mapped in a process.
pub const SHIM_LIBRARY: &str = "libcuinterpose.so";

/// One process as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProcessInfo {
    pub host_pid: u32,
    /// The PID the process sees for itself (last `NSpid:` field).
    pub ns_pid: u32,
    /// Inode of its PID namespace; namespace PIDs are only comparable within one.
    pub pid_namespace: u64,
    pub command: String,
    /// Path of the mapped CUDA driver library, if any.
    pub driver: Option<PathBuf>,
    /// Path of the mapped shim library, if any.
    pub shim: Option<PathBuf>,
    /// The shim's listening control socket, as a path this process (the tool) can connect to.
    pub control_socket: Option<PathBuf>,
}

impl ProcessInfo {
    pub fn is_cuda(&self) -> bool {
        self.driver.is_some()
    }

    /// `pid 1234 (ns 5) python3 train.py`, for messages.
    pub fn label(&self) -> String {
        let mut command = self.command.clone();
        if command.len() > 60 {
            command.truncate(57);
            command.push_str("...");
        }
        if self.ns_pid == self.host_pid {
            format!("pid {} ({command})", self.host_pid)
        } else {
            format!("pid {} [ns pid {}] ({command})", self.host_pid, self.ns_pid)
        }
    }
}

/// What the tool reads of a process tree in `/proc` ([`process_tree`], [`describe`]) beside the
/// reads of each process ([`Procs`]): the seam in front of them, so that what is decided from
/// them (a group's members, the processes a resume continues, the workload's namespace root) is
/// unit-tested on a scripted machine; [`Proc`] is the real one.
pub(crate) trait ProcessTree: Procs {
    /// [`process_tree`] under `root`.
    fn tree(&self, root: u32) -> Result<Vec<u32>, ControlError>;
    /// [`describe`] of `pid`.
    fn describe(&self, pid: u32) -> Result<ProcessInfo, ControlError>;
}

impl ProcessTree for Proc {
    fn tree(&self, root: u32) -> Result<Vec<u32>, ControlError> {
        process_tree(root)
    }

    fn describe(&self, pid: u32) -> Result<ProcessInfo, ControlError> {
        describe(pid)
    }
}

/// `root` and all its descendants, root first, then in PID order.
pub fn process_tree(root: u32) -> Result<Vec<u32>, ControlError> {
    // Parent links of every process; /proc/<pid>/task/*/children needs CONFIG_PROC_CHILDREN.
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let entries = fs::read_dir("/proc").map_err(|source| ControlError::Proc {
        pid: 0,
        path: PathBuf::from("/proc"),
        source,
    })?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit while we look; it is simply not part of the tree any more.
        if let Some(stat) = procfs::stat(pid) {
            children.entry(stat.ppid).or_default().push(pid);
        }
    }
    if !procfs::path(root, "stat").exists() {
        return Err(ControlError::NoSuchProcess(root));
    }
    let mut tree = vec![root];
    let mut seen = HashSet::from([root]);
    let mut next = 0;
    while let Some(&pid) = tree.get(next) {
        next += 1;
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(child) {
                tree.push(child);
            }
        }
    }
    tree[1..].sort_unstable();
    Ok(tree)
}

// Read in procfs, where the real side of the `Procs` seam lives; the tool's callers find it here.
pub use crate::procfs::pid_namespace;

/// Everything the tool needs to know about one process.
pub fn describe(pid: u32) -> Result<ProcessInfo, ControlError> {
    let status = procfs::read(pid, "status")?;
    let ns_pid = procfs::ns_pid_in(&status).unwrap_or(pid);
    let pid_namespace = pid_namespace(pid).unwrap_or(0);
    let command = fs::read(procfs::path(pid, "cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let maps = procfs::read(pid, "maps")?;
    let mut driver = None;
    let mut shim = None;
    for path in mapped_files(&maps) {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if driver.is_none() && name.starts_with("libcuda.so") {
            driver = Some(path.clone());
        }
        if shim.is_none() && name == SHIM_LIBRARY {
            shim = Some(path.clone());
        }
    }
    let control_socket = if shim.is_some() {
        control_socket(pid, ns_pid)?
    } else {
        None
    };
    Ok(ProcessInfo {
        host_pid: pid,
        ns_pid,
        pid_namespace,
        command,
        driver,
        shim,
        control_socket,
    })
}

fn mapped_files(maps: &str) -> impl Iterator<Item = PathBuf> + '_ {
    maps.lines().filter_map(|line| {
        // address perms offset dev inode path
        let path = line.splitn(6, char::is_whitespace).nth(5)?.trim_start();
        path.starts_with('/')
            .then(|| PathBuf::from(path.trim_end_matches(" (deleted)")))
    })
}

/// The shim's listening socket among the process's descriptors: `/proc/<pid>/fd` names socket inodes,
/// `/proc/<pid>/net/unix` gives their bound paths. Returned as a path under `/proc/<pid>/root`.
///
/// The shim names it `cuinterpose-<pid namespace inode>-<ns pid>.sock`; the inode is the one of
/// the namespace the shim started in (a restored process keeps its name), so any inode is taken.
/// Only a socket file owned by the process's own user is used: the tool never talks to a
/// socket someone else put there.
pub fn control_socket(pid: u32, ns_pid: u32) -> Result<Option<PathBuf>, ControlError> {
    let suffix = format!("-{ns_pid}.sock");
    let uid = effective_uid(pid)?;
    Ok(listening_sockets(pid)?
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| {
                    n.strip_prefix("cuinterpose-")?
                        .strip_suffix(suffix.as_str())
                })
                .is_some_and(|inode| !inode.is_empty() && inode.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|p| reach_inside(pid, &p))
        .find(|p| {
            use std::os::unix::fs::MetadataExt;
            fs::symlink_metadata(p).is_ok_and(|m| m.uid() == uid)
        }))
}

/// The effective uid of a process (`Uid:` of `/proc/<pid>/status`, second field).
pub fn effective_uid(pid: u32) -> Result<u32, ControlError> {
    let status = procfs::read(pid, "status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| ControlError::Proc {
            pid,
            path: procfs::path(pid, "status"),
            source: std::io::Error::other("no Uid line"),
        })
}

/// Inodes of the sockets the process holds descriptors for.
pub fn socket_inodes(pid: u32) -> Result<HashSet<u64>, ControlError> {
    let fd_dir = procfs::path(pid, "fd");
    let entries = fs::read_dir(&fd_dir).map_err(|source| ControlError::Proc {
        pid,
        path: fd_dir,
        source,
    })?;
    Ok(entries
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()
                .and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        })
        .collect())
}

/// Inode of the process's network namespace; socket addresses are only comparable within one.
pub fn net_namespace(pid: u32) -> Result<u64, ControlError> {
    let path = procfs::path(pid, "ns/net");
    let link = fs::read_link(&path).map_err(|source| ControlError::Proc {
        pid,
        path: path.clone(),
        source,
    })?;
    link.to_str()
        .and_then(procfs::namespace_inode)
        .ok_or_else(|| ControlError::Proc {
            pid,
            path,
            source: std::io::Error::other(format!("unexpected link {}", link.display())),
        })
}

/// Paths of the listening Unix sockets the process holds, as the process names them.
pub fn listening_sockets(pid: u32) -> Result<Vec<PathBuf>, ControlError> {
    let inodes = socket_inodes(pid)?;
    let table = procfs::read(pid, "net/unix")?;
    Ok(parse_unix_table(&table)
        .filter(|s| s.listening && inodes.contains(&s.inode))
        .map(|s| s.path)
        .collect())
}

struct UnixSocketEntry {
    inode: u64,
    listening: bool,
    path: PathBuf,
}

/// `/proc/net/unix`: `Num RefCount Protocol Flags Type St Inode Path`; Flags has `__SO_ACCEPTCON`
/// (0x10000) for listening sockets. Abstract sockets (`@name`) are skipped.
fn parse_unix_table(table: &str) -> impl Iterator<Item = UnixSocketEntry> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
        let inode = fields.get(6)?.parse().ok()?;
        let path = fields.get(7)?;
        path.starts_with('/').then(|| UnixSocketEntry {
            inode,
            listening: flags & 0x10000 != 0,
            path: PathBuf::from(path),
        })
    })
}

/// A path as the process sees it, reached from here: `/proc/<pid>/root/<path>`.
pub fn reach_inside(pid: u32, path: &Path) -> PathBuf {
    let relative = path.strip_prefix("/").unwrap_or(path);
    procfs::path(pid, "root").join(relative)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppid_survives_odd_command_names() {
        let ppid = |stat: &str| procfs::parse_stat(stat).map(|s| s.ppid);
        assert_eq!(
            ppid("42 (a) b (c)) S 7 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99"),
            Some(7)
        );
        assert_eq!(ppid("garbage"), None);
    }

    #[test]
    fn unix_table_yields_listening_paths() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 4242 /tmp/cuinterpose-7.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 4343 /tmp/cuinterpose-7.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 4444 @abstract\n";
        let entries: Vec<_> = parse_unix_table(table).collect();
        assert_eq!(entries.len(), 2);
        assert!(entries[0].listening && entries[0].inode == 4242);
        assert!(!entries[1].listening);
    }

    #[test]
    fn this_process_is_described() {
        let me = std::process::id();
        let info = describe(me).unwrap();
        assert_eq!(info.host_pid, me);
        assert!(info.pid_namespace > 0);
        assert!(!info.is_cuda());
        assert!(process_tree(me).unwrap().starts_with(&[me]));
    }

    #[test]
    fn children_are_in_the_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let tree = process_tree(std::process::id()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(tree.contains(&child.id()));
    }

    #[test]
    fn inside_paths_go_through_proc_root() {
        assert_eq!(
            reach_inside(9, Path::new("/tmp/x.sock")),
            PathBuf::from("/proc/9/root/tmp/x.sock")
        );
    }
}
