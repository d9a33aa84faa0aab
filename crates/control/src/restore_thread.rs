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
use crate::procfs::Procs;
use cuda_abi::CUuuid;
use nix::sys::ptrace;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// How long a traced thread may take to report that it stopped.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Restores `pid` natively if it is checkpointed, with only its restore thread running: `pid`
/// must be stopped (state `T`). Its threads are read in `procs`. Returns the native state it is
/// left in (`Locked` after a restore; whatever it was otherwise, untouched).
pub fn restore_stopped(
    driver: &dyn NativeCheckpoint,
    procs: &dyn Procs,
    pid: u32,
    pairs: &[(CUuuid, CUuuid)],
) -> Result<ProcessState, ControlError> {
    let named = driver.restore_thread(pid)?;
    let tid = host_tid(procs, pid, named).ok_or_else(|| ControlError::RestoreThread {
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
/// its threads see themselves: the last field of `NSpid:`) or in this one. The driver names it
/// as the process sees it, so a thread whose own TID matches wins over one whose host TID
/// happens to be the same number (a restored process's TIDs are those it had, in its namespace).
fn host_tid(procs: &dyn Procs, pid: u32, tid: u32) -> Option<u32> {
    let threads = procs.threads(pid);
    threads
        .iter()
        .find(|t| t.own == Some(tid))
        .or_else(|| threads.iter().find(|t| t.host == tid))
        .map(|t| t.host)
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
    use crate::fakes::{Log, Machine, Native, cuda_process};
    use crate::procfs::{Proc, Thread};

    #[test]
    fn a_thread_is_found_by_its_host_tid_in_this_namespace() {
        let pid = std::process::id();
        assert_eq!(host_tid(&Proc, pid, pid), Some(pid));
        assert_eq!(host_tid(&Proc, pid, u32::MAX), None);
    }

    /// A restored process in a PID namespace of its own: host pid 5000, its threads host 5000,
    /// 5001, 5002, which it sees as 1, 7, 8.
    fn restored() -> Machine {
        let own = |host, own| Thread {
            host,
            own: Some(own),
        };
        Machine {
            processes: vec![(cuda_process(5000), Some('T'), false)],
            threads: vec![(5000, vec![own(5000, 1), own(5001, 7), own(5002, 8)])],
            ..Machine::default()
        }
    }

    #[test]
    fn the_restore_thread_is_found_by_the_tid_its_process_sees() {
        let machine = restored();
        assert_eq!(host_tid(&machine, 5000, 7), Some(5001));
        assert_eq!(host_tid(&machine, 5000, 1), Some(5000));
        // Named by its host TID (a process in the tool's namespace sees those).
        assert_eq!(host_tid(&machine, 5000, 5002), Some(5002));
        // Not a thread of this process, or the process is gone.
        assert_eq!(host_tid(&machine, 5000, 9), None);
        assert_eq!(host_tid(&machine, 4999, 7), None);
    }

    #[test]
    fn a_thread_whose_own_tid_matches_wins_over_a_host_tid_of_the_same_number() {
        // Its thread 7 has host TID 5001; another thread's host TID is 7.
        let machine = Machine {
            processes: vec![(cuda_process(5000), Some('T'), false)],
            threads: vec![(
                5000,
                vec![
                    Thread {
                        host: 7,
                        own: Some(3),
                    },
                    Thread {
                        host: 5001,
                        own: Some(7),
                    },
                ],
            )],
            ..Machine::default()
        };
        assert_eq!(host_tid(&machine, 5000, 7), Some(5001));
    }

    /// A restore thread the driver names that `/proc` does not list fails before anything is
    /// traced or restored, naming the process and the thread.
    #[test]
    fn a_restore_thread_not_in_proc_fails_before_the_native_restore() {
        let log = Log::default();
        // The fake driver names the process's own pid (6000) as its restore thread; the
        // process's one thread is 6001 on the host and 1 in its namespace.
        let driver = Native::new(&log);
        let machine = Machine {
            processes: vec![(cuda_process(6000), Some('T'), false)],
            threads: vec![(
                6000,
                vec![Thread {
                    host: 6001,
                    own: Some(1),
                }],
            )],
            ..Machine::default()
        };
        let error = restore_stopped(&driver, &machine, 6000, &[]).unwrap_err();
        let ControlError::RestoreThread { pid, tid, what, .. } = &error else {
            panic!("{error}");
        };
        assert_eq!((*pid, *tid, *what), (6000, 6000, "no such thread in /proc"));
        assert!(log.native().is_empty(), "{:?}", log.native());
    }
}
