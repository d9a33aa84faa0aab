//! The process hooks the runtime needs and that only C can install: the `pthread_atfork` child
//! handler and the `atexit` removal of the control socket. Registered from the `cuInit` hook,
//! never from a library constructor.

#![allow(unsafe_code)] // registers C callbacks with glibc

use core::sync::atomic::{AtomicBool, Ordering};

static FORK_HANDLER: AtomicBool = AtomicBool::new(false);
static SOCKET_REMOVAL: AtomicBool = AtomicBool::new(false);

extern "C" fn fork_child() {
    // Only atomics there: the child has one thread and the parent's locks may be held.
    shim_runtime::instance::fork_child();
}

extern "C" fn remove_socket() {
    shim_runtime::instance::remove_socket_at_exit();
}

/// Registers the fork child handler once, before the runtime starts (so no child forked while it
/// starts inherits it as running).
pub(crate) fn register_fork_handler() {
    if FORK_HANDLER.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: registers a handler that only touches atomics; no prepare or parent handlers.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(fork_child)) };
    if rc != 0 {
        shim_runtime::log::write(
            shim_runtime::log::Level::Error,
            format_args!("pthread_atfork failed ({rc}); a forked child would inherit the runtime"),
        );
    }
}

/// Registers the socket's removal at exit once, after the runtime bound it.
pub(crate) fn register_socket_removal() {
    if SOCKET_REMOVAL.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: registers a handler that only reads a set-once static and unlinks a file.
    if unsafe { libc::atexit(remove_socket) } != 0 {
        shim_runtime::log::write(
            shim_runtime::log::Level::Warn,
            format_args!("atexit failed; the control socket stays after exit"),
        );
    }
}
