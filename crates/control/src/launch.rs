//! Starting a workload as the root of a new PID namespace, as a container runtime would, so that
//! CRIU can restore the tree later with the same PIDs (`cuinterpose run --pid-namespace`); and
//! ending a tree the tool restored.
//!
//! The launcher unshares the PID namespace and spawns the command, which becomes PID 1 of it. The
//! launcher stays as its parent (as `unshare --fork --pid` does): it forwards SIGINT, SIGTERM and
//! SIGHUP and exits with the workload's status.
//!
//! The workload also starts a new session (`setsid`): CRIU refuses a tree whose session leader is
//! outside its PID namespace ("A session leader of ... is outside of its pid namespace"), and a
//! new session has no controlling terminal, so CRIU needs no `--shell-job` and the restored tree
//! does not depend on the terminal the launcher ran on. Terminal signals reach the workload
//! through the launcher's forwarding instead.
//!
//! The init of a PID namespace only receives signals it has a handler for: the kernel drops a
//! SIGTERM whose default action would end it. So a forwarded signal the workload does not catch
//! (`SigCgt` in `/proc/<pid>/status`) becomes SIGKILL, which is what its default action (ending
//! the process) would have done outside a namespace.

#![allow(unsafe_code)] // unshare(2), setsid(2) before exec, a signal handler, poll(2) on a pidfd

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Why the workload could not be started in its own namespace, or a tree not ended.
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
    #[error("setting up signal forwarding: {0}")]
    Signals(std::io::Error),
    #[error("killing pid {pid}: {source}")]
    Kill { pid: u32, source: std::io::Error },
    #[error("continuing pid {pid} (SIGCONT): {source}")]
    Continue { pid: u32, source: std::io::Error },
    #[error("continuing the tree under pid {pid}: {source}")]
    ContinueTree {
        pid: u32,
        source: Box<crate::ControlError>,
    },
    #[error("pid {pid} was still alive after {seconds} s")]
    StillAlive { pid: u32, seconds: u64 },
}

/// Write end of the signal pipe, for the handler (-1: none).
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = signal as u8;
        // SAFETY: write(2) is async-signal-safe; `byte` lives for the call. A full pipe drops the
        // signal number, which only happens with more than a pipe's worth of pending signals.
        unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
    }
}

/// Whether `pid` has a handler for `signal` (`SigCgt:` of `/proc/<pid>/status`).
fn catches(pid: u32, signal: i32) -> bool {
    crate::procfs::read(pid, "status")
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| signal > 0 && mask & (1u64 << (signal - 1)) != 0)
}

/// Forwards every signal number read from `pipe` to `child` (see the module comment).
fn forward_signals(pipe: OwnedFd, child: u32) {
    let mut file = std::fs::File::from(pipe);
    let mut byte = [0u8; 1];
    while std::io::Read::read_exact(&mut file, &mut byte).is_ok() {
        let signal = i32::from(byte[0]);
        let sent = if catches(child, signal) {
            signal
        } else {
            libc::SIGKILL
        };
        // SAFETY: kill(2) on our own child's PID; a child already gone gives ESRCH, harmless.
        unsafe { libc::kill(child as libc::pid_t, sent) };
    }
}

/// In the child, already PID 1 of its new PID namespace: a mount namespace of its own with a fresh
/// `/proc`, so that `/proc` agrees with `getpid()` inside. The NVIDIA driver needs that (without it
/// `cuInit` fails with CUDA_ERROR_OPERATING_SYSTEM, seen on r580); container runtimes do the same.
/// Mounts are made slaves of the host's, so CRIU can tell them apart as external (`--ext-mount-map
/// auto`). Descriptors opened before the namespace refer to the host's mounts, which CRIU cannot
/// name from inside: standard input, output and error that are files are opened again by path, and
/// every other inherited descriptor is closed at exec.
///
/// # Safety
/// Only for a `pre_exec` closure: it makes system calls only and uses stack buffers.
unsafe fn enter_private_proc() -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: a system call without pointers.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    // SAFETY: constant NUL-terminated strings; no data argument.
    check(unsafe {
        libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: as above.
    check(unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    })?;
    for fd in 0..3 {
        // SAFETY: `fd` is a small descriptor number; the buffers live on this stack frame.
        unsafe { reopen_by_path(fd)? };
    }
    // SAFETY: marks descriptors 3 and up close-on-exec (std's own error pipe keeps working).
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    } as libc::c_int)
}

/// Opens `fd`'s file again by its path, with the same access mode, when it is a file on a
/// filesystem (not a pipe, socket or anonymous inode), and puts it at `fd`.
///
/// # Safety
/// Only for a `pre_exec` closure (see [`enter_private_proc`]).
unsafe fn reopen_by_path(fd: libc::c_int) -> std::io::Result<()> {
    let mut link = *b"/proc/self/fd/0\0";
    link[14] = b'0' + fd as u8;
    let mut path = [0u8; 4096];
    // SAFETY: `link` is NUL-terminated; `path` has room for len - 1 bytes and a NUL we add.
    let n = unsafe {
        libc::readlink(
            link.as_ptr().cast(),
            path.as_mut_ptr().cast(),
            path.len() - 1,
        )
    };
    if n <= 0 || path[0] != b'/' || path[..n as usize].ends_with(b" (deleted)") {
        return Ok(());
    }
    path[n as usize] = 0;
    // SAFETY: `fd` is open (readlink found it).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Ok(());
    }
    let flags = (flags & (libc::O_ACCMODE | libc::O_APPEND)) | libc::O_CLOEXEC;
    // SAFETY: `path` is NUL-terminated.
    let new = unsafe { libc::open(path.as_ptr().cast(), flags) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are ours; dup2 clears close-on-exec on `fd`.
    let r = unsafe { libc::dup2(new, fd) };
    // SAFETY: `new` was just opened and is no longer needed.
    unsafe { libc::close(new) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Makes the program `command` starts die with this process (SIGKILL when the tool's thread that
/// started it ends): CRIU, so that a tool killed during a dump or a restore leaves no CRIU working
/// on the tree behind the back of the next run (whose lock the dead tool's no longer blocks).
pub fn die_with_parent(command: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    let setup = move || {
        // SAFETY: a system call without pointers.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The parent may have died before the prctl: then nothing would deliver the signal.
        // A child spawned into a container's PID namespace (container.rs) sees its parent,
        // which is outside that namespace, as 0; orphaned, it would see the namespace's reaper.
        // SAFETY: a system call without arguments.
        let ppid = unsafe { libc::getppid() };
        if ppid != parent && ppid != 0 {
            return Err(std::io::Error::other("the tool exited while starting it"));
        }
        Ok(())
    };
    // SAFETY: `setup` runs in the forked child before exec and only makes system calls (prctl,
    // getppid) on values captured by copy: async-signal-safe, no allocation.
    unsafe { command.pre_exec(setup) };
}

/// Runs `command` as PID 1 of a new PID namespace, in a new session, and waits for it.
pub fn run_in_pid_namespace(mut command: Command) -> Result<ExitStatus, LaunchError> {
    let child_setup = || {
        // SAFETY: we are in the forked child before exec, the only place enter_private_proc is
        // for.
        unsafe { enter_private_proc() }?;
        rustix::process::setsid()
            .map(|_| ())
            .map_err(std::io::Error::from)
    };
    // SAFETY: `child_setup` runs in the forked child before exec and only makes system calls
    // (unshare, mount, readlink, fcntl, open, dup2, close, close_range, setsid) on stack buffers:
    // async-signal-safe, no allocation, nothing of the parent's memory touched.
    unsafe { command.pre_exec(child_setup) };
    // The forwarding thread starts before the unshare: once this process has unshared its PID
    // namespace for children, the kernel refuses to create threads in it (clone gives EINVAL).
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| LaunchError::Signals(e.into()))?;
    let (pid_tx, pid_rx) = std::sync::mpsc::channel::<u32>();
    std::thread::Builder::new()
        .name("signal-forward".into())
        .spawn(move || {
            if let Ok(pid) = pid_rx.recv() {
                forward_signals(read, pid);
            }
        })
        .map_err(LaunchError::Signals)?;
    // SAFETY: CLONE_NEWPID only changes the namespace of children created from now on; this process
    // keeps its own PID and memory, so no Rust invariant is affected.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        return Err(LaunchError::Unshare(std::io::Error::last_os_error()));
    }
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .spawn()
        .map_err(|source| LaunchError::Spawn { program, source })?;
    // The thread is waiting on the channel; it cannot have gone.
    let _ = pid_tx.send(child.id());
    // The write end stays open for the life of the process: the handler may run until exit.
    SIGNAL_PIPE.store(write.into_raw_fd(), Ordering::Relaxed);
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_signal` only calls write(2), async-signal-safe, and reads an atomic.
        unsafe {
            libc::signal(
                signal,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
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

/// SIGKILL to every process of the tree under `root` (descendants first, so none forks a new
/// one), then waits until `root` has exited. `root` need not be our child: the wait is a poll on
/// its pidfd, which becomes readable when the process exits. For the init of a PID namespace,
/// its exit means the kernel has killed everything else in it.
pub fn kill_tree(root: u32, timeout: Duration) -> Result<(), LaunchError> {
    let Some(root_pid) = rustix::process::Pid::from_raw(root as i32) else {
        return Err(LaunchError::Kill {
            pid: root,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        });
    };
    let pidfd = match rustix::process::pidfd_open(root_pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        // Already gone.
        Err(rustix::io::Errno::SRCH) => return Ok(()),
        Err(e) => {
            return Err(LaunchError::Kill {
                pid: root,
                source: e.into(),
            });
        }
    };
    let tree = crate::discovery::process_tree(root).unwrap_or_else(|_| vec![root]);
    for &pid in tree.iter().skip(1).rev() {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            // A descendant that is gone already is what we want.
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    // Through the pidfd, so a recycled PID is never hit.
    rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL).map_err(|e| {
        LaunchError::Kill {
            pid: root,
            source: e.into(),
        }
    })?;
    wait_pidfd(&pidfd, root, timeout)
}

/// Continues every process of the tree under `root` (SIGCONT): what a tree that CRIU left stopped
/// needs before it can run on. A process that is gone already is skipped.
pub fn continue_tree(root: u32) -> Result<(), LaunchError> {
    let tree = crate::discovery::process_tree(root).map_err(|e| LaunchError::ContinueTree {
        pid: root,
        source: Box::new(e),
    })?;
    continue_processes(&tree)
}

/// Sends SIGCONT to each process of `pids` (one that exited meanwhile is skipped).
pub fn continue_processes(pids: &[u32]) -> Result<(), LaunchError> {
    for &pid in pids {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            match rustix::process::kill_process(p, rustix::process::Signal::CONT) {
                Ok(()) | Err(rustix::io::Errno::SRCH) => {}
                Err(e) => {
                    return Err(LaunchError::Continue {
                        pid,
                        source: e.into(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Waits until process `pid` has exited (it need not be our child: a poll on its pidfd, which
/// becomes readable when the process exits). Returns at once if it is gone already.
pub fn wait_exit(pid: u32, timeout: Duration) -> Result<(), LaunchError> {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return Err(LaunchError::Kill {
            pid,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        });
    };
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => wait_pidfd(&fd, pid, timeout),
        Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(LaunchError::Kill {
            pid,
            source: e.into(),
        }),
    }
}

fn wait_pidfd(pidfd: &OwnedFd, pid: u32, timeout: Duration) -> Result<(), LaunchError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd on a descriptor we own, for the duration of the call.
        let n = unsafe { libc::poll(&mut poll, 1, millis) };
        if n > 0 {
            return Ok(());
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(LaunchError::Kill { pid, source: e });
            }
        }
        if left.is_zero() {
            return Err(LaunchError::StillAlive {
                pid,
                seconds: timeout.as_secs(),
            });
        }
    }
}
