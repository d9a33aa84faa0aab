//! Starting a workload as the root of a new PID namespace, as a container runtime would, so that
//! CRIU can restore the tree later with the same PIDs (`cuinterpose run --pid-namespace`).
//!
//! The launcher unshares the PID namespace and spawns the command, which becomes PID 1 of it. The
//! launcher stays as its parent (as `unshare --fork --pid` does): it forwards SIGINT, SIGTERM and
//! SIGHUP and exits with the workload's status.

#![allow(unsafe_code)] // unshare(2) and a signal-forwarding handler; each block says why it is sound

use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

/// Why the workload could not be started in its own namespace.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("creating a PID namespace (needs root or CAP_SYS_ADMIN): {0}")]
    Unshare(std::io::Error),
    #[error("starting {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("waiting for the workload: {0}")]
    Wait(std::io::Error),
}

/// PID of the namespace's init, for the signal handler.
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let child = CHILD.load(Ordering::Relaxed);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; `child` is our own child's PID.
        unsafe { libc::kill(child, signal) };
    }
}

/// Runs `command` as PID 1 of a new PID namespace and waits for it.
pub fn run_in_pid_namespace(mut command: Command) -> Result<ExitStatus, LaunchError> {
    // SAFETY: CLONE_NEWPID only changes the namespace of children created from now on; this process
    // keeps its own PID and memory, so no Rust invariant is affected.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        return Err(LaunchError::Unshare(std::io::Error::last_os_error()));
    }
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .spawn()
        .map_err(|source| LaunchError::Spawn { program, source })?;
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `forward` only calls async-signal-safe functions and reads an atomic.
        unsafe {
            libc::signal(
                signal,
                forward as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
    child.wait().map_err(LaunchError::Wait)
}

/// The exit code a shell would show for `status` (128 + signal when killed).
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
