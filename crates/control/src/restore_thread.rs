//! Native restore of a process whose threads are all stopped but one.
//!
//! A process that CRIU brought back holds none of the mappings the driver makes for it (pinned
//! host memory, UVM) until the driver's restore, and a thread that touches one first crashes it:
//! measured on r580, the main thread of a JAX loop died of SIGSEGV in a device-to-host copy right
//! after CRIU's restore, before the tool had restored it natively. So a checkpoint's tree comes
//! back stopped (`criu restore --leave-stopped`) and each of its CUDA processes is restored with
//! only the driver's *restore thread* running (`cuCheckpointProcessGetRestoreThreadId`), as
//! CRIU's own CUDA plugin does: the tool attaches to that one thread (`PTRACE_SEIZE`), which
//! takes it out of the group stop under ptrace, lets it run (`PTRACE_CONT`), has the driver
//! restore the process, stops the thread again (`PTRACE_INTERRUPT`) and detaches, which puts it
//! back into the group stop. The caller continues the tree (SIGCONT) once every process is
//! restored. A tool killed in between leaves nothing traced: the kernel detaches a dead tracer's
//! tracees, and the group stop holds them.

use crate::ControlError;
use crate::native::{NativeCheckpoint, ProcessState};
use cuda_abi::CUuuid;
use nix::sys::ptrace;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// How long a traced thread may take to report that it stopped.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Restores `pid` natively if it is checkpointed, with only its restore thread running: `pid`
/// must be stopped (state `T`). Returns the native state it is left in (`Locked` after a
/// restore; whatever it was otherwise, untouched).
pub fn restore_stopped(
    driver: &dyn NativeCheckpoint,
    pid: u32,
    pairs: &[(CUuuid, CUuuid)],
) -> Result<ProcessState, ControlError> {
    let named = driver.restore_thread(pid)?;
    let tid = host_tid(pid, named).ok_or_else(|| ControlError::RestoreThread {
        pid,
        tid: named,
        what: "no such thread in /proc",
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let running = Running::start(pid, tid)?;
    let restored = driver.state(pid).and_then(|state| match state {
        ProcessState::Checkpointed => driver.restore(pid, pairs).map(|()| ProcessState::Locked),
        other => Ok(other),
    });
    let stopped = running.stop();
    let state = restored?;
    stopped?;
    tracing::debug!(
        pid,
        tid,
        ?state,
        "restored with only its restore thread running"
    );
    Ok(state)
}

/// The host TID of thread `tid` of `pid`, `tid` named in the process's own PID namespace (as
/// its threads see themselves: the last field of `NSpid:`) or in this one.
fn host_tid(pid: u32, tid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(crate::procfs::path(pid, "task")).ok()?;
    let mut by_host = None;
    for entry in tasks.flatten() {
        let Some(host) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        if crate::procfs::ns_pid_in(&status) == Some(tid) {
            return Some(host);
        }
        if host == tid {
            by_host = Some(host);
        }
    }
    by_host
}

/// A restore thread taken out of its group stop: [`Running::stop`] puts it back.
#[derive(Debug)]
struct Running {
    pid: u32,
    tid: u32,
    detached: bool,
}

impl Running {
    fn start(pid: u32, tid: u32) -> Result<Running, ControlError> {
        let error = |what: &'static str| {
            move |e: nix::errno::Errno| ControlError::RestoreThread {
                pid,
                tid,
                what,
                source: std::io::Error::from(e),
            }
        };
        let thread = Pid::from_raw(tid as i32);
        ptrace::seize(thread, ptrace::Options::empty()).map_err(error("PTRACE_SEIZE"))?;
        let mut running = Running {
            pid,
            tid,
            detached: false,
        };
        // Seized in its group stop, the thread reports a ptrace stop; only then may it be let run.
        running.wait_stopped()?;
        ptrace::cont(thread, None).map_err(error("PTRACE_CONT"))?;
        Ok(running)
    }

    /// Stops the thread again and detaches: it rejoins the group stop.
    fn stop(mut self) -> Result<(), ControlError> {
        let thread = Pid::from_raw(self.tid as i32);
        let result = ptrace::interrupt(thread)
            .map_err(|e| self.error("PTRACE_INTERRUPT", e))
            .and_then(|()| self.wait_stopped())
            .and_then(|()| {
                ptrace::detach(thread, None).map_err(|e| self.error("PTRACE_DETACH", e))
            });
        self.detached = result.is_ok();
        result
    }

    fn error(&self, what: &'static str, e: nix::errno::Errno) -> ControlError {
        ControlError::RestoreThread {
            pid: self.pid,
            tid: self.tid,
            what,
            source: std::io::Error::from(e),
        }
    }

    /// Waits (bounded) until the traced thread reports a stop.
    fn wait_stopped(&mut self) -> Result<(), ControlError> {
        let thread = Pid::from_raw(self.tid as i32);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match waitpid(thread, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Stopped(..) | WaitStatus::PtraceEvent(..)) => return Ok(()),
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                    self.detached = true; // nothing left to detach from
                    return Err(self.error("waiting for it to stop", nix::errno::Errno::ESRCH));
                }
                Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                Ok(_) => {
                    return Err(self.error("waiting for it to stop", nix::errno::Errno::ETIMEDOUT));
                }
                Err(e) => return Err(self.error("waiting for it to stop", e)),
            }
        }
    }
}

impl Drop for Running {
    /// A failure half-way: let go of the thread whatever its state (the kernel puts a detached
    /// thread of a stopped process back into its group stop).
    fn drop(&mut self) {
        if !self.detached {
            let thread = Pid::from_raw(self.tid as i32);
            let _ = ptrace::interrupt(thread);
            let _ = self.wait_stopped();
            if let Err(e) = ptrace::detach(thread, None) {
                tracing::warn!(pid = self.pid, tid = self.tid, error = %e, "detaching the restore thread");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_found_by_its_host_tid_in_this_namespace() {
        let pid = std::process::id();
        assert_eq!(host_tid(pid, pid), Some(pid));
        assert_eq!(host_tid(pid, u32::MAX), None);
    }
}
