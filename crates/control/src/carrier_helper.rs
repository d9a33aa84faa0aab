//! Finding or starting the carrier helper of a control directory (`suspend --carrier helper`).
//!
//! The helper (`cuinterpose carrier-helper`, shim-runtime's `carrier_helper`) is a process that is
//! never checkpointed and keeps the group's carriers pinned across cycles; the shims reach it at
//! [`CARRIER_HELPER_SOCKET`] in their control directory. The tool starts one for a directory
//! where none answers, before anything of the group changes, in a process group of its own (a
//! terminal's signals to the tool do not reach it), its output appended to
//! `cuinterpose-carrier.log` beside the socket; it outlives the tool and exits by itself once it
//! has held no carrier for a while (the processes that saved through it have all exited or given
//! their carriers back).

use crate::ControlError;
use protocol::message::CARRIER_HELPER_SOCKET;
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
