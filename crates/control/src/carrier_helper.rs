//! Finding or starting the carrier helper of a control directory (`suspend --carrier helper`).
//!
//! The helper (`cuinterpose carrier-helper`, crates/copy's `carrier_helper`) is a process that is
//! never checkpointed and keeps the group's carriers pinned across cycles; the shims reach it at
//! [`CARRIER_HELPER_SOCKET`] in their control directory. The tool starts one for a directory
//! where none answers, before anything of the group changes, in a process group of its own (a
//! terminal's signals to the tool do not reach it), its output appended to
//! `cuinterpose-carrier.log` beside the socket; it outlives the tool and exits by itself once it
//! has held no carrier for a while (the processes that saved through it have all exited or given
//! their carriers back).

use crate::ControlError;
use crate::discovery::ProcessInfo;
use protocol::message::CARRIER_HELPER_SOCKET;
use protocol::message::HelperHold;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How the tool starts a helper where none runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperLaunch {
    /// The `cuinterpose` binary (it runs `carrier-helper`).
    pub program: PathBuf,
    /// The driver library the helper loads (`None`: `libcuda.so.1` from the search path).
    pub driver: Option<PathBuf>,
}

/// How long a started helper may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The helper's socket in `dir`, started with `launch` when nothing answers there.
pub fn ensure(dir: &Path, launch: &HelperLaunch) -> Result<PathBuf, ControlError> {
    let socket = dir.join(CARRIER_HELPER_SOCKET);
    if UnixStream::connect(&socket).is_ok() {
        return Ok(socket);
    }
    let failed = |message: String| ControlError::CarrierHelper {
        socket: socket.clone(),
        message,
    };
    let log_path = dir.join("cuinterpose-carrier.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| failed(format!("opening {}: {e}", log_path.display())))?;
    let stderr = log
        .try_clone()
        .map_err(|e| failed(format!("{}: {e}", log_path.display())))?;
    let mut command = Command::new(&launch.program);
    command.arg("carrier-helper").arg("--socket").arg(&socket);
    if let Some(driver) = &launch.driver {
        command.arg("--driver").arg(driver);
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .map_err(|e| failed(format!("starting {}: {e}", launch.program.display())))?;
    let start = Instant::now();
    loop {
        if UnixStream::connect(&socket).is_ok() {
            tracing::info!(pid = child.id(), socket = %socket.display(), "carrier helper started");
            return Ok(socket);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Another tool may have started one at the same moment (this one found the socket
            // live and left): the socket answers then.
            if UnixStream::connect(&socket).is_ok() {
                return Ok(socket);
            }
            return Err(failed(format!(
                "the helper exited ({status}) before it listened; {} says why",
                log_path.display()
            )));
        }
        if start.elapsed() > START_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed(format!(
                "the helper did not listen within {START_TIMEOUT:?}; {} says why",
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asks the helper at `socket` to make the carrier of process `pid` (its pid as the helper sees it,
/// the host's: the tool started the helper) `bytes` long and pin it now, ahead of the first Save
/// (`cuinterpose prepare`). Returns the bytes pinned (0 where the driver refused the
/// registration: the helper copies staged then) and the microseconds the pinning took.
pub fn prepare(socket: &Path, pid: u32, bytes: u64) -> Result<(u64, u64), ControlError> {
    let failed = |message: String| ControlError::CarrierHelper {
        socket: socket.to_path_buf(),
        message,
    };
    let mut connection = transport::Connection::connect(socket, START_TIMEOUT)
        .map_err(|e| failed(format!("connecting: {e}")))?;
    // Pinning many GiB takes as long as it takes (about 50 ms per GiB measured).
    connection
        .set_timeout(None)
        .map_err(|e| failed(e.to_string()))?;
    match connection.call(&protocol::Request::CarrierPrepare { pid, bytes }) {
        Ok((protocol::Response::Prepared { pinned, micros }, _)) => Ok((pinned, micros)),
        Ok((protocol::Response::Error { message, .. }, _)) => Err(failed(message)),
        Ok((other, _)) => Err(failed(format!("unexpected answer {other:?}"))),
        Err(e) => Err(failed(format!("preparing the carrier of pid {pid}: {e}"))),
    }
}

/// A carrier helper holding bytes of a group, as `inspect` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HelperStatus {
    /// Its pid, as it told the shims when they saved through it.
    pub pid: u32,
    /// Its socket (the tool's path to it).
    pub socket: PathBuf,
    /// It runs and answers at its socket.
    pub alive: bool,
    /// One line: alive, or gone and what that means for the bytes.
    pub health: String,
    /// Per process that saved through it: what it saved there and the copy it holds.
    pub processes: Vec<HelperClient>,
}

/// One process's bytes in a carrier helper.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HelperClient {
    pub process: String,
    pub allocations: u64,
    pub bytes: u64,
    /// Bytes of the helper's carrier the process holds a descriptor of (its own copy).
    pub held_bytes: u64,
}

impl HelperClient {
    /// Its bytes outlive the helper.
    pub fn holds_copy(&self) -> bool {
        self.held_bytes >= self.bytes
    }
}

/// The carrier helpers the shims given (each process with the hold its HELLO reports) saved
/// through in the cycle in progress, with their health.
pub fn statuses<'a>(
    shims: impl IntoIterator<Item = (&'a ProcessInfo, Option<&'a HelperHold>)>,
) -> Vec<HelperStatus> {
    use std::os::unix::fs::MetadataExt;
    // With the socket file's identity, where it still exists.
    let mut out: Vec<(Option<(u64, u64)>, HelperStatus)> = Vec::new();
    for (info, hold) in shims {
        let (Some(hold), Some(dir)) = (hold, info.control_socket.as_deref().and_then(Path::parent))
        else {
            continue;
        };
        let socket = dir.join(CARRIER_HELPER_SOCKET);
        // Each process names the socket through its own `/proc/PID/root`: one helper is one
        // socket file.
        let file = std::fs::metadata(&socket).ok().map(|m| (m.dev(), m.ino()));
        let client = HelperClient {
            process: info.label(),
            allocations: hold.allocations,
            bytes: hold.bytes,
            held_bytes: hold.held_bytes,
        };
        match out
            .iter_mut()
            .find(|(f, h)| h.pid == hold.helper_pid && (*f == file || h.socket == socket))
        {
            Some((_, h)) => h.processes.push(client),
            None => out.push((
                file,
                HelperStatus {
                    pid: hold.helper_pid,
                    alive: alive(hold.helper_pid, &socket),
                    socket,
                    health: String::new(),
                    processes: vec![client],
                },
            )),
        }
    }
    out.into_iter()
        .map(|(_, mut h)| {
            h.health = health(&h);
            h
        })
        .collect()
}

fn health(h: &HelperStatus) -> String {
    if h.alive {
        return "alive".into();
    }
    let lost: Vec<String> = h
        .processes
        .iter()
        .filter(|c| !c.holds_copy())
        .map(|c| {
            format!(
                "{}: {} allocation(s), {} bytes",
                c.process, c.allocations, c.bytes
            )
        })
        .collect();
    if lost.is_empty() {
        "gone: every process holds its own copy of what it saved there, and `resume` loads from it"
            .into()
    } else {
        format!(
            "gone, and these bytes are lost with it: {}; `cuinterpose end --pid <root>` ends \
             the group",
            lost.join("; ")
        )
    }
}

/// Whether the helper `pid` runs (not a zombie, a `carrier-helper` command) and is the one
/// answering at `socket` (a helper started later for the same directory is another one).
pub fn alive(pid: u32, socket: &Path) -> bool {
    let running = crate::procfs::stat(pid).is_some_and(|s| !s.exited())
        && std::fs::read(crate::procfs::path(pid, "cmdline"))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"carrier-helper"));
    running
        && transport::Connection::connect(socket, Duration::from_secs(5))
            .and_then(|c| c.peer())
            .is_ok_and(|peer| peer.pid == pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_that_cannot_start_is_an_error_naming_its_socket() {
        let dir = tempfile::tempdir().unwrap();
        let launch = HelperLaunch {
            program: dir.path().join("no-such-program"),
            driver: None,
        };
        let e = ensure(dir.path(), &launch).unwrap_err().to_string();
        assert!(e.contains(CARRIER_HELPER_SOCKET), "{e}");
        assert!(e.contains("no-such-program"), "{e}");
        // A program that exits at once: reported, with the log to read.
        let launch = HelperLaunch {
            program: PathBuf::from("/bin/false"),
            driver: None,
        };
        let e = ensure(dir.path(), &launch).unwrap_err().to_string();
        assert!(e.contains("exited"), "{e}");
        assert!(e.contains("cuinterpose-carrier.log"), "{e}");
    }

    #[test]
    fn a_live_socket_is_used_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join(CARRIER_HELPER_SOCKET);
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let launch = HelperLaunch {
            program: PathBuf::from("/bin/false"),
            driver: None,
        };
        assert_eq!(ensure(dir.path(), &launch).unwrap(), socket);
    }
}
