//! One capture at a time, held by the tool's connection.
//!
//! The first phase request of a tool connection takes this process's capture lease; the lease is
//! given back when the process is out of the capture again (gates open, phase Running) or when
//! the holding connection ends. While one connection holds it, a phase request on any other is
//! refused ([`protocol::ErrorCode::Busy`]): two tool runs can never act on one process at once,
//! whatever directory their run locks live in (the caller's `XDG_RUNTIME_DIR`, a container's
//! `/run`).
//!
//! A holding connection that ends (the tool exited or was killed; the kernel closes its socket
//! either way) loses the lease, and the control worker then runs `Capture::lease_lost` (phases.rs) after
//! whatever phase it is running: a capture that released nothing yet is undone (the process
//! thaws itself, so a tool killed right after Freeze leaves nothing frozen), and one that released
//! memory stays as it is for `cuinterpose resume`, which rebuilds it from the state file the
//! tool published before the release. A holder whose socket has hung up while its connection
//! thread has not yet noticed is treated as gone when another connection asks (a process
//! restored by CRIU wakes with such connections).
//!
//! State: [`Lease`], inside [`ServerState`], the control server's state (with its connection
//! counters and HELLO's identity).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Mutex, OnceLock};

/// Identity reported by HELLO.
#[derive(Clone, Debug)]
pub struct Identity {
    pub shim_sha256: String,
}

/// The control server's state (`server.rs` serves it): the connections open, the capture lease
/// and what HELLO reports.
#[derive(Debug)]
pub struct ServerState {
    pub(crate) identity: OnceLock<Identity>,
    pub(crate) driver_version: i32,
    /// Connections open.
    pub(crate) connections: AtomicUsize,
    /// Of those, the ones that asked something else than GetFd (the tool, or anyone posing as it):
    /// limited apart, so they can never take the peers' places (server.rs).
    pub(crate) tool_connections: AtomicUsize,
    /// Which tool connection holds the capture.
    pub(crate) lease: Lease,
    /// The numbering of connections (the lease names its holder by number).
    pub(crate) next_connection: AtomicU64,
}

impl ServerState {
    /// No connection yet, HELLO reporting `driver_version`.
    pub fn new(driver_version: i32) -> ServerState {
        ServerState {
            identity: OnceLock::new(),
            driver_version,
            connections: AtomicUsize::new(0),
            tool_connections: AtomicUsize::new(0),
            lease: Lease::default(),
            next_connection: AtomicU64::new(1),
        }
    }
}

/// The connection holding the capture, and a duplicate of its socket (to see whether its peer is
/// gone). The connection thread gives the lease back before it closes its own descriptor.
#[derive(Debug, Default)]
pub struct Lease {
    holder: Mutex<Option<Holder>>,
}

#[derive(Debug)]
struct Holder {
    connection: u64,
    socket: OwnedFd,
}

/// What taking the lease found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// This connection held it already.
    Already,
    /// Taken now; `previous_gone` when a holder whose peer had hung up was replaced (its capture
    /// must be treated as lost first).
    Now { previous_gone: bool },
}

impl Lease {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Holder>> {
        self.holder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the lease for `connection` (whose socket is `socket`), or says why not.
    pub fn take(&self, connection: u64, socket: BorrowedFd<'_>) -> Result<Taken, String> {
        let mut holder = self.lock();
        let previous_gone = match &*holder {
            Some(h) if h.connection == connection => return Ok(Taken::Already),
            Some(h) if !peer_gone(h.socket.as_fd()) => {
                return Err(
                    "busy: another cuinterpose run holds this process's capture; wait for it to \
                     finish (one run at a time acts on a process, whatever its environment)"
                        .into(),
                );
            }
            Some(_) => true,
            None => false,
        };
        let socket = socket
            .try_clone_to_owned()
            .map_err(|e| format!("cannot keep the connection's socket for the lease: {e}"))?;
        *holder = Some(Holder { connection, socket });
        Ok(Taken::Now { previous_gone })
    }

    /// Gives the lease back if `connection` holds it; runs `before` first, under the lease, so
    /// that nothing another connection queues can come before it. Returns whether it was held.
    pub fn give_back(&self, connection: u64, before: impl FnOnce()) -> bool {
        let mut holder = self.lock();
        if holder.as_ref().is_some_and(|h| h.connection == connection) {
            before();
            *holder = None;
            true
        } else {
            false
        }
    }
}

/// Whether the other end of a connected socket has closed (a zero-timeout poll reports a hang-up).
fn peer_gone(socket: BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&socket, PollFlags::RDHUP)];
    match poll(&mut fds, Some(&rustix::time::Timespec::default())) {
        Ok(_) => fds[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
        Err(_) => false,
    }
}
