//! The caller's side of `cuCheckpointProcess*`: finds the target's agent socket through
//! `/proc/<pid>/fd` and `/proc/<pid>/net/unix` (a listening socket named
//! `agent-<ns pid>-<start token at cuInit>.sock`),
//! connects through `/proc/<pid>/root<path>` (so it works across mount namespaces), sends one
//! request and reads the response.
//!
//! A pid with no agent (no such process, not ours to inspect, or never initialised the fake) is
//! `CUDA_ERROR_INVALID_VALUE`; a connection that breaks off is `CUDA_ERROR_OPERATING_SYSTEM`.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use cuda_abi::CUresult;

use super::wire::{Request, Response};
use crate::Res;

/// `__SO_ACCEPTCON` in the Flags column of `/proc/net/unix`: a listening socket.
const ACCEPTCON: u32 = 0x0001_0000;
/// Longest socket path the kernel accepts (sun_path less the NUL).
const MAX_SUN_PATH: usize = 107;
/// How long a reply may take: a checkpoint may wait out a lock timeout, then copy memory.
const REPLY_TIMEOUT: Duration = Duration::from_secs(600);

/// The socket inodes among `pid`'s descriptors.
fn socket_inodes(pid: i32) -> Option<HashSet<u64>> {
    let mut out = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let link = link.to_string_lossy();
        if let Some(ino) = link
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|s| s.parse().ok())
        {
            out.insert(ino);
        }
    }
    Some(out)
}

/// `pid`'s pid in its own namespace (the last field of `NSpid:` in `/proc/<pid>/status`).
fn ns_pid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// The path of `pid`'s listening agent socket, as its own mount namespace names it. The name
/// must carry the target's own namespace pid: a child forked after `cuInit` inherits its
/// parent's listening socket, and must not be taken for its parent. The token after it (the
/// start token at the target's cuInit, which only keeps socket names of different PID
/// namespaces apart) is not checked: it stays what it was through a restore.
pub(crate) fn find_agent(pid: i32) -> Option<PathBuf> {
    let own_prefix = format!("agent-{}-", ns_pid(pid)?);
    let inodes = socket_inodes(pid)?;
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).ok()?;
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (Some(flags), Some(inode), Some(path)) = (cols.get(3), cols.get(6), cols.get(7)) else {
            continue;
        };
        let (Ok(flags), Ok(inode)) = (u32::from_str_radix(flags, 16), inode.parse::<u64>()) else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or_default();
        let own = name
            .strip_prefix(&own_prefix)
            .and_then(|rest| rest.strip_suffix(".sock"))
            .is_some_and(|token| !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()));
        if flags & ACCEPTCON != 0 && inodes.contains(&inode) && own {
            return Some(PathBuf::from(path));
        }
    }
    None
}

fn connect(pid: i32, path: &std::path::Path) -> Res<UnixStream> {
    let via_root = PathBuf::from(format!("/proc/{pid}/root{}", path.display()));
    let target = if via_root.as_os_str().len() <= MAX_SUN_PATH {
        via_root
    } else {
        // Too long for sun_path: the same mount namespace is the only way left.
        path.to_owned()
    };
    UnixStream::connect(&target).map_err(|_| CUresult::ERROR_INVALID_VALUE)
}

/// The restore thread of `pid` (its agent thread), as this process names it: found by its name
/// in `/proc/<pid>/task`, without asking the agent, which cannot answer while the process is
/// stopped (the thread is what a caller lets run for a restore).
pub(crate) fn restore_thread(pid: i32) -> Res<i32> {
    if pid <= 0 || find_agent(pid).is_none() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
    tasks
        .flatten()
        .find_map(|entry| {
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            (comm.trim_end() == super::agent::AGENT_THREAD_NAME)
                .then(|| entry.file_name().to_str()?.parse().ok())?
        })
        .ok_or(CUresult::ERROR_INVALID_VALUE)
}

/// Sends `request` to `pid`'s agent and returns its reply.
fn call(pid: i32, request: &Request) -> Res<Response> {
    if pid <= 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let path = find_agent(pid).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let mut stream = connect(pid, &path)?;
    let io = |_| CUresult::ERROR_OPERATING_SYSTEM;
    stream
        .set_write_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
    stream.write_all(&request.encode()).map_err(io)?;
    Response::read_from(&mut stream).map_err(io)
}

/// Sends `request` and turns the reply into a driver result.
pub(crate) fn call_result(pid: i32, request: &Request) -> Res<u64> {
    let response = call(pid, request)?;
    if response.result == 0 {
        Ok(response.value)
    } else {
        Err(CUresult(response.result))
    }
}
