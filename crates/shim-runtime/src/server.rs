//! The control socket: a listener thread, one short-lived thread per connection, and one control
//! worker thread for the capture phases.
//!
//! - Every connection's peer is checked with `SO_PEERCRED` (same uid or root) before anything is
//!   read; a refused peer gets `Error Denied` and the connection is closed.
//! - `GetFd` is served on the connection's thread from the export cache, never taking the state
//!   lock and never waiting for the control worker: a peer's import cannot wait behind a
//!   coordinator command, so two processes importing from each other cannot deadlock.
//! - `Hello` and `Inspect` are answered on the connection's thread too (Inspect takes the state
//!   lock briefly).
//! - Phase requests go to the control worker through a bounded queue; a full queue is refused
//!   before anything changes.
//! - A malformed or oversized frame closes that connection (after one log line); the process goes on.
//!   A frame of another protocol version is first answered with `Error Denied` in this build's
//!   version, so that the other side reports the version mismatch.
//! - The peer descriptor service, which the application's own imports depend on, is never starved
//!   by other connections: a connection must send its first request within [`FIRST_REQUEST`];
//!   a peer connection (GetFd only) is closed after [`PEER_IDLE`] without a request and after
//!   [`PEER_REQUESTS`] requests; the others (the tool, or anyone else) are at most
//!   [`MAX_TOOL_CONNECTIONS`] at a time and closed after [`TOOL_IDLE`] without a request (the
//!   tool connects again when it has been idle long: control::group). A refused connection gets
//!   an `Error` answer that says why.
//! - All threads run with every signal blocked, so they never take a signal meant for the
//!   application's own handlers or `sigwait` threads.
//!
//! State: the runtime's [`crate::lease::ServerState`] (connections, the capture lease, HELLO's
//! identity); the phases it queues run on the runtime's jobs, and so does what a lost lease
//! undoes (`Capture::lease_lost`, phases.rs).

use crate::lease::Identity;
use crate::log::{log_debug, log_info, log_warn};
use crate::runtime::Runtime;
use crate::threads::spawn_quiet;
use protocol::record::AllocationId;
use protocol::{ErrorCode, HelloReply, ProtocolError, Request, Response};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::Duration;
use transport::{Connection, Listener, TransportError};

/// Connections served at once (one thread each); more are refused at accept.
const MAX_CONNECTIONS: usize = 128;
/// Of those, connections that asked anything but GetFd.
const MAX_TOOL_CONNECTIONS: usize = 8;
/// How long a new connection may take to send its first request.
const FIRST_REQUEST: Duration = Duration::from_secs(2);
/// How long a peer connection may stay without a request (an importer asks at once).
const PEER_IDLE: Duration = Duration::from_secs(2);
/// Requests one peer connection may make before it is closed (an importer makes one).
const PEER_REQUESTS: usize = 64;
/// How long a tool connection may stay without a request (the tool connects again after
/// `control::group::RECONNECT_AFTER` of its own silence, which is shorter).
const TOOL_IDLE: Duration = Duration::from_secs(30);
/// Phase requests waiting for the control worker.
const QUEUE: usize = 4;

/// Why the runtime could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind the control socket: {0}")]
    Bind(#[from] TransportError),
    #[error("cannot start the {0} thread: {1}")]
    Spawn(&'static str, io::Error),
}

/// What the control worker does, in the order it was queued.
enum Work {
    /// A phase request and where its answer goes.
    Phase {
        request: Request,
        /// The data file of SaveTo and LoadFrom.
        file: Option<std::os::fd::OwnedFd>,
        reply: mpsc::Sender<Response>,
    },
    /// The connection holding the capture ended (lease.rs).
    LeaseLost,
}

/// The file mapped at `address` in this process (`/proc/self/maps`: what `dladdr` would name,
/// resolved by the kernel).
fn mapped_file(address: usize) -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let mut fields = line.split_ascii_whitespace();
        let (from, to) = fields.next()?.split_once('-')?;
        let from = usize::from_str_radix(from, 16).ok()?;
        let to = usize::from_str_radix(to, 16).ok()?;
        // perms, offset, device, inode, then the path (which may hold spaces).
        let path = fields.nth(4)?;
        (from <= address && address < to && path.starts_with('/')).then(|| {
            let start = line.find(path).unwrap_or(0);
            std::path::PathBuf::from(line.get(start..).unwrap_or(path))
        })
    })
}

/// SHA-256 (hex) of the file holding this code: the shim library in a CUDA process.
fn own_file_sha256() -> String {
    use sha2::Digest;
    let anchor = own_file_sha256 as fn() -> String as usize;
    let Some(path) = mapped_file(anchor) else {
        log_warn!("no mapped file holds the shim's code; HELLO reports no hash");
        return String::new();
    };
    let path = path.display().to_string();
    let mut hasher = sha2::Sha256::new();
    let result = std::fs::File::open(&path).and_then(|mut f| io::copy(&mut f, &mut hasher));
    match result {
        Ok(_) => hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        Err(e) => {
            log_warn!("cannot hash {path}: {e}; HELLO reports no hash");
            String::new()
        }
    }
}

impl Runtime {
    /// Binds the control socket and starts the listener and the control worker.
    pub fn serve(self: &Arc<Self>) -> Result<(), ServeError> {
        let listener =
            Listener::bind(&self.tracking.config.socket_of(self.tracking.config.ns_pid))?;
        let (tx, rx) = mpsc::sync_channel::<Work>(QUEUE);
        let worker = self.clone();
        spawn_quiet("cuinterpose-ctl", move || {
            for work in rx {
                match work {
                    Work::Phase {
                        request,
                        file,
                        reply,
                    } => {
                        let _ = reply.send(worker.run_phase(request, file));
                    }
                    Work::LeaseLost => worker.capture.lease_lost(&worker.tracking, &worker.drain),
                }
            }
        })
        .map_err(|e| ServeError::Spawn("control worker", e))?;
        let server = self.clone();
        spawn_quiet("cuinterpose-srv", move || server.listen(listener, tx))
            .map_err(|e| ServeError::Spawn("listener", e))?;
        Ok(())
    }

    pub fn hello(&self) -> HelloReply {
        let (carrier_pinned_bytes, carrier_helper) = {
            let control = self.capture.control();
            (
                control.carrier.pinned() as u64,
                control
                    .helper_copy
                    .as_ref()
                    .map(crate::capture::HelperCopy::hold),
            )
        };
        HelloReply {
            shim_version: env!("CARGO_PKG_VERSION").to_string(),
            ns_pid: self.tracking.config.ns_pid,
            shim_sha256: self
                .server
                .identity
                .get()
                .map(|i| i.shim_sha256.clone())
                .unwrap_or_default(),
            driver_version: self.server.driver_version,
            carrier_pinned_bytes,
            carrier_helper,
        }
    }

    fn listen(self: Arc<Self>, mut listener: Listener, jobs: SyncSender<Work>) {
        // Hashed here, once, off the application's thread and outside any lock.
        self.server.identity.get_or_init(|| Identity {
            shim_sha256: own_file_sha256(),
        });
        let mut failures = 0u32;
        loop {
            let conn = match listener.accept() {
                Ok(conn) => {
                    failures = 0;
                    conn
                }
                Err(e) => {
                    failures += 1;
                    log_warn!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(
                        10u64.saturating_mul(u64::from(failures.min(100))),
                    ));
                    // After a CRIU restore a broken listening socket is bound again.
                    if failures.is_multiple_of(5) {
                        let path = listener.path().to_path_buf();
                        drop(listener);
                        listener = loop {
                            match Listener::bind(&path) {
                                Ok(l) => break l,
                                Err(e) => {
                                    log_warn!("rebinding {} failed: {e}", path.display());
                                    std::thread::sleep(Duration::from_secs(1));
                                }
                            }
                        };
                    }
                    continue;
                }
            };
            if self.server.connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                self.server.connections.fetch_sub(1, Ordering::AcqRel);
                log_warn!("too many control connections; one refused");
                refuse(
                    conn,
                    format!("busy: {MAX_CONNECTIONS} connections are open on this control socket"),
                );
                continue;
            }
            let rt = self.clone();
            let jobs = jobs.clone();
            let spawned = spawn_quiet("cuinterpose-conn", move || {
                rt.converse(conn, jobs);
                rt.server.connections.fetch_sub(1, Ordering::AcqRel);
            });
            if let Err(e) = spawned {
                self.server.connections.fetch_sub(1, Ordering::AcqRel);
                log_warn!("cannot start a connection thread: {e}");
            }
        }
    }

    /// Serves one connection; a capture lease it took is given back when it ends (lease.rs).
    fn converse(&self, conn: Connection, jobs: SyncSender<Work>) {
        let connection = self.server.next_connection.fetch_add(1, Ordering::Relaxed);
        self.serve_connection(conn, connection, &jobs);
        self.server.lease.give_back(connection, || {
            // Blocks while the queue is full: the worker finishes its phase first anyway.
            let _ = jobs.send(Work::LeaseLost);
        });
    }

    fn serve_connection(&self, mut conn: Connection, connection: u64, jobs: &SyncSender<Work>) {
        if let Err(e) = conn.check_peer() {
            log_warn!("control socket: {e}");
            let _ = conn.set_timeout(Some(Duration::from_secs(1)));
            let _ = conn.send_response(
                &Response::Error {
                    code: ErrorCode::Denied,
                    message: e.to_string(),
                },
                None,
            );
            return;
        }
        if conn.set_timeout(Some(FIRST_REQUEST)).is_err() {
            return;
        }
        // Set by the first request: a peer's GetFd, or anything else (a tool).
        let mut class: Option<Class<'_>> = None;
        let mut served = 0usize;
        loop {
            let (request, file) = match conn.recv_request_with_fd() {
                Ok(r) => r,
                Err(TransportError::Closed) => return,
                Err(e @ TransportError::Protocol(ProtocolError::VersionMismatch { .. })) => {
                    // A tool (or peer shim) of another version: answered in ours, so that it
                    // names the mismatch instead of a connection closed without a word.
                    log_warn!("control socket: refusing a peer: {e}");
                    if let Err(e) = conn.refuse_version() {
                        log_debug!("control socket: cannot answer the refused peer: {e}");
                    }
                    return;
                }
                Err(TransportError::Timeout) => {
                    log_debug!("control socket: closing an idle connection");
                    return;
                }
                Err(e) => {
                    log_warn!("control socket: dropping a connection: {e}");
                    return;
                }
            };
            if class.is_none() {
                let peer = matches!(request, Request::GetFd { .. });
                let admitted = if peer {
                    Some(Class::Peer)
                } else {
                    ToolSlot::take(&self.server.tool_connections)
                        .map(|slot| Class::Tool { _slot: slot })
                };
                let Some(admitted) = admitted else {
                    log_warn!("too many tool connections; one refused");
                    refuse(
                        conn,
                        format!(
                            "busy: {MAX_TOOL_CONNECTIONS} tool connections are open on this \
                             control socket"
                        ),
                    );
                    return;
                };
                let idle = if peer { PEER_IDLE } else { TOOL_IDLE };
                if conn.set_timeout(Some(idle)).is_err() {
                    return;
                }
                class = Some(admitted);
            }
            served += 1;
            if matches!(class, Some(Class::Peer)) && served > PEER_REQUESTS {
                log_warn!("a peer connection made {PEER_REQUESTS} requests; closed");
                return;
            }
            let (response, fd) = match request {
                Request::GetFd { id } => self.answer_get_fd(id),
                Request::Hello { .. } => (Response::Hello(self.hello()), None),
                Request::Inspect => (Response::Records(self.inspect()), None),
                request => (
                    self.leased_phase(&conn, connection, jobs, request, file),
                    None,
                ),
            };
            if let Err(e) = conn.send_response(&response, fd.as_ref().map(|f| f.as_fd())) {
                log_warn!("control socket: reply not sent: {e}");
                return;
            }
        }
    }

    /// A peer's `GetFd`: a duplicate of the cached descriptor of `id`, or why there is none.
    fn answer_get_fd(&self, id: AllocationId) -> (Response, Option<OwnedFd>) {
        match self.tracking.exports.lease(&id) {
            Some(Ok(fd)) => (Response::Fd { id }, Some(fd)),
            Some(Err(e)) => (
                Response::Error {
                    code: ErrorCode::Internal,
                    message: format!("cannot duplicate the descriptor of {id}: {e}"),
                },
                None,
            ),
            None => {
                log_debug!("GetFd for unknown allocation {id}");
                (
                    Response::Error {
                        code: ErrorCode::NotFound,
                        message: format!("allocation {id} is not exported here"),
                    },
                    None,
                )
            }
        }
    }

    /// Runs a phase request under this connection's capture lease (lease.rs): taken first (a
    /// request while another connection holds it is refused, nothing changed), kept while the
    /// process is in a capture, given back once it is out of it. A connection holding the lease is
    /// never closed for idleness: its end would undo the capture.
    fn leased_phase(
        &self,
        conn: &Connection,
        connection: u64,
        jobs: &SyncSender<Work>,
        request: Request,
        file: Option<std::os::fd::OwnedFd>,
    ) -> Response {
        match self.server.lease.take(connection, conn.as_fd()) {
            Err(message) => {
                return Response::Error {
                    code: ErrorCode::Busy,
                    message,
                };
            }
            Ok(crate::lease::Taken::Now { previous_gone }) => {
                if previous_gone {
                    log_info!(
                        "the connection holding the capture had hung up; its capture is lost"
                    );
                    let _ = jobs.send(Work::LeaseLost);
                }
                let _ = conn.set_timeout(None);
            }
            Ok(crate::lease::Taken::Already) => {}
        }
        let (tx, rx) = mpsc::channel();
        let work = Work::Phase {
            request,
            file,
            reply: tx,
        };
        let response = match jobs.try_send(work) {
            Ok(()) => rx.recv().unwrap_or_else(|_| Response::Error {
                code: ErrorCode::Internal,
                message: "the control worker is gone".into(),
            }),
            Err(TrySendError::Full(_)) => Response::Error {
                code: ErrorCode::Internal,
                message: "busy: phase requests are queued already".into(),
            },
            Err(TrySendError::Disconnected(_)) => Response::Error {
                code: ErrorCode::Internal,
                message: "the control worker is gone".into(),
            },
        };
        if !self.capture.in_capture(&self.tracking, &self.drain)
            && self.server.lease.give_back(connection, || {})
        {
            let _ = conn.set_timeout(Some(TOOL_IDLE));
        }
        response
    }
}

/// What a connection turned out to be by its first request.
enum Class<'a> {
    Peer,
    /// Holds its place until the connection ends.
    Tool {
        _slot: ToolSlot<'a>,
    },
}

/// One of the [`MAX_TOOL_CONNECTIONS`] places, given back on drop.
struct ToolSlot<'a>(&'a AtomicUsize);

impl<'a> ToolSlot<'a> {
    fn take(count: &'a AtomicUsize) -> Option<ToolSlot<'a>> {
        if count.fetch_add(1, Ordering::AcqRel) >= MAX_TOOL_CONNECTIONS {
            count.fetch_sub(1, Ordering::AcqRel);
            None
        } else {
            Some(ToolSlot(count))
        }
    }
}

impl Drop for ToolSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answers a connection that is not served with why, briefly (a peer that does not read cannot
/// hold the thread), and closes it.
fn refuse(mut conn: Connection, message: String) {
    let _ = conn.set_timeout(Some(Duration::from_millis(200)));
    let _ = conn.send_response(
        &Response::Error {
            code: ErrorCode::Internal,
            message,
        },
        None,
    );
}
