//! The process-global runtime instance and its start after the first successful `cuInit`.
//!
//! Start: the first `cuInit` that succeeds reads the configuration once ([`ShimConfig`]: control
//! directory, log level, carrier mode), binds `<dir>/cuinterpose-<pid ns inode>-<getpid()>.sock`
//! and starts the listener and the control worker (with every signal blocked; `server.rs`). Never
//! in a library constructor. If the socket cannot be bound the runtime stays off: every call
//! passes straight through, the application works as without the shim, and the tool (finding no
//! socket) refuses to capture it.
//!
//! Fork: a `pthread_atfork` child handler (registered by the shim before the start, calling
//! [`fork_child`], which touches only atomics) turns the runtime off in the child. A child forked
//! before the runtime started starts its own at its own `cuInit`. A child forked after it must
//! exec or exit, as CUDA itself requires: its tracked calls return `CUDA_ERROR_NOT_INITIALIZED`
//! without reaching the driver (the handles it inherited are the parent's virtual handles), and
//! it never binds, unlinks or serves the parent's socket.
//!
//! State: the instance ([`active`]) and the socket file to remove at exit, process globals read
//! with one atomic load.

use crate::Real;
use crate::config::{Config, ShimConfig, own_pid_namespace};
use crate::log::{log_error, log_info, log_warn};
use crate::runtime::Runtime;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

const OFF: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
const FORKED: u8 = 3;
const DISABLED: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(OFF);
/// Set once, before RUNNING is published; never released (it lives as long as the process).
/// Reading it is one atomic load, so a forked child never waits on a lock here.
static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
/// The process's socket file, for removal at exit: path, owner PID, device and inode.
static SOCKET_FILE: OnceLock<(PathBuf, u32, u64, u64)> = OnceLock::new();

/// Removes our socket file at exit, only in the process that bound it and only if the file is
/// still the one it bound (a forked child that exits, or a file replaced since, is left alone).
/// The shim registers it with `atexit` when [`start_after_init`] says a socket was bound.
pub fn remove_socket_at_exit() {
    let Some((path, owner, dev, ino)) = SOCKET_FILE.get() else {
        return;
    };
    if rustix::process::getpid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs()
        != *owner
    {
        return;
    }
    if let Ok(st) = rustix::fs::lstat(path)
        && (st.st_dev, st.st_ino) == (*dev, *ino)
        && let Err(e) = rustix::fs::unlink(path)
    {
        log_error!("cannot remove the control socket {}: {e}", path.display());
    }
}

/// What a hook finds.
#[derive(Debug)]
pub enum Active {
    /// No runtime (before `cuInit`, or it could not start): pass through.
    Off,
    Running(&'static Runtime),
    /// A child forked after the runtime started: tracked calls are refused.
    Forked,
}

pub fn active() -> Active {
    match STATE.load(Ordering::Acquire) {
        RUNNING => match RUNTIME.get() {
            Some(rt) => Active::Running(rt),
            None => Active::Off,
        },
        FORKED => Active::Forked,
        _ => Active::Off,
    }
}

/// The `pthread_atfork` child handler's work (the shim registers it before the runtime starts).
pub fn fork_child() {
    // Only atomics here: the child has one thread and the parent's locks may be held.
    let state = STATE.load(Ordering::Relaxed);
    if state == RUNNING || state == STARTING {
        STATE.store(FORKED, Ordering::Relaxed);
    }
}

/// Starts the process's runtime once, after a successful `cuInit`. Concurrent first callers wait
/// for the one that starts it (an atomic, not a lock, so that a child forked in the middle cannot
/// inherit a held lock). Returns true to the caller that bound the control socket (which then
/// registers [`remove_socket_at_exit`]).
pub fn start_after_init(real: &Real) -> bool {
    match STATE.compare_exchange(OFF, STARTING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(STARTING) => {
            while STATE.load(Ordering::Acquire) == STARTING {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            return false;
        }
        Err(_) => return false,
    }
    let (settings, invalid) = ShimConfig::from_env();
    crate::log::set_max_level(settings.log_level);
    for problem in &invalid {
        log_warn!("{problem}");
    }
    let control_dir = match settings.control_dir {
        Some(dir) => dir,
        None => {
            let dir = transport::files::default_private_dir();
            // Made private here (its parent too, where it is ours to make): nobody else can take
            // a name in it.
            if let Err(e) = dir
                .parent()
                .filter(|p| !p.exists())
                .map_or(Ok(()), transport::files::ensure_private_dir)
                .and_then(|()| transport::files::ensure_private_dir(&dir))
            {
                log_error!(
                    "runtime not started: CUDA calls of this process are NOT tracked and it cannot \
                     be checkpointed: {e}"
                );
                let _ =
                    STATE.compare_exchange(STARTING, DISABLED, Ordering::AcqRel, Ordering::Acquire);
                return false;
            }
            dir
        }
    };
    let ns_pid = rustix::process::getpid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs();
    let runtime = Runtime::new(
        *real,
        Config {
            control_dir,
            ns_pid,
            copy: settings.copy,
            pid_namespace: own_pid_namespace(),
            alloc: settings.alloc,
        },
    );
    match runtime.serve() {
        Ok(()) => {
            log_info!(
                "runtime started, control socket {}",
                runtime.config().socket_of(ns_pid).display()
            );
            let path = runtime.config().socket_of(ns_pid);
            let recorded = rustix::fs::lstat(&path).is_ok_and(|st| {
                SOCKET_FILE
                    .set((path, ns_pid, st.st_dev, st.st_ino))
                    .is_ok()
            });
            if RUNTIME.set(runtime).is_err() {
                log_error!("a second runtime was started; the first one stays");
            }
            // Fails only if a fork handler moved STARTING to FORKED, and that is the state to keep.
            let _ = STATE.compare_exchange(STARTING, RUNNING, Ordering::AcqRel, Ordering::Acquire);
            recorded
        }
        Err(e) => {
            // Loud on purpose: the application runs on, but nothing of it is tracked, and the
            // tool (finding no control socket among its descriptors) refuses to capture it.
            log_error!(
                "runtime not started: CUDA calls of this process are NOT tracked and it cannot be \
                 checkpointed (`cuinterpose inspect` shows it): {e}"
            );
            let _ = STATE.compare_exchange(STARTING, DISABLED, Ordering::AcqRel, Ordering::Acquire);
            false
        }
    }
}
