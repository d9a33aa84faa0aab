//! The checkpoint agent of a process: a thread started at the first successful `cuInit`,
//! listening on `$FAKE_CUDA_STATE_DIR/agent-<getpid()>-<start token>.sock` (mode 0600, close-on-exec), with
//! every signal blocked. Each connection carries one request from another process's
//! `cuCheckpointProcess*` call; peers must have our uid or be root. The agent thread is the
//! process's *restore thread* (`cuCheckpointProcessGetRestoreThreadId`): as on r580, where a
//! process CRIU restored stays stopped but for that thread until the driver's restore is done
//! (CRIU's CUDA plugin lets only it run), restore, unlock and state requests are served on the
//! agent thread itself, so they are answered while every other thread is stopped. A lock or a
//! checkpoint, which may wait, is served on a thread of its own (so a `GetState` query from a
//! peer's checkpoint is answered while a lock waits).

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use super::wire::{Op, Request, Response};
use super::{dispatch, gate};
use crate::os;

/// The agent thread's name (`/proc/<pid>/task/<tid>/comm`): how a caller finds the restore
/// thread of a process that cannot answer (client::restore_thread).
pub(crate) const AGENT_THREAD_NAME: &str = "fake-cuda-agent";
/// How long the agent thread waits for a connection's request before it drops it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Binds the socket (reclaiming a stale file only after a refused connect) and starts the thread.
pub(crate) fn start(path: &Path) -> io::Result<()> {
    if path.exists() {
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another live process answers on this agent socket",
                ));
            }
            Err(_) => std::fs::remove_file(path)?,
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    spawn_blocking_signals(AGENT_THREAD_NAME, move || {
        gate::mark_agent_thread();
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let Some((stream, request)) = receive(stream) else {
                continue;
            };
            if !matches!(request.op, Op::Lock | Op::Checkpoint) {
                answer(stream, &request);
                continue;
            }
            // A failure to start a connection thread drops that connection: the caller sees EOF.
            let _ = spawn_blocking_signals("fake-cuda-agent-conn", move || {
                gate::mark_agent_thread();
                answer(stream, &request);
            });
        }
    })
}

/// Spawns a named thread with every signal blocked (it inherits the mask it is created with),
/// restoring the caller's mask afterwards.
pub(crate) fn spawn_blocking_signals(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> io::Result<()> {
    // SAFETY: sigset_t is plain data; sigfillset initialises it completely below.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid sigset_t to fill.
    unsafe { libc::sigfillset(&mut all) };
    // SAFETY: as above, zeroed plain data that pthread_sigmask overwrites.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid set pointers; changes only this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) };
    let spawned = std::thread::Builder::new().name(name.to_owned()).spawn(f);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned.map(|_| ())
}

fn peer_allowed(stream: &UnixStream) -> bool {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred of `len` bytes into `cred`.
    let ret = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    ret == 0 && (cred.uid == os::getuid() || cred.uid == 0)
}

/// The request of an allowed peer, read on the agent thread.
fn receive(mut stream: UnixStream) -> Option<(UnixStream, Request)> {
    if !peer_allowed(&stream) {
        return None;
    }
    // A request arrives right after connect; a silent peer must not hold the agent thread.
    stream.set_read_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    let request = Request::read_from(&mut stream).ok()?;
    Some((stream, request))
}

fn answer(mut stream: UnixStream, request: &Request) {
    let (result, value) = match dispatch(request) {
        Ok(value) => (0, value),
        Err(code) => (code.0, 0),
    };
    // The caller may have given up; nothing to do about a failed reply.
    let _ = Response { result, value }.write_to(&mut stream);
}
