//! A bound, listening control socket.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use crate::TransportError;
use crate::connection::{Connection, socket_addr};

/// Connections the kernel queues before `accept`; a full queue makes connecting peers wait (bounded
/// by their timeouts).
const BACKLOG: i32 = 128;

/// A listening `AF_UNIX` stream socket at a filesystem path, mode 0600, close-on-exec. Dropping it
/// removes the socket file if the path still names this socket.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file this listener created, so that drop never removes a
    /// file that someone else put at the path since.
    identity: (u64, u64),
}

/// What a connect probe of an existing socket file found.
enum Probe {
    /// Nothing listens: the file is stale.
    Refused,
    /// Something accepted or queued the connection, or its queue is full: it is alive.
    Alive,
    /// The file disappeared while probing.
    Gone,
}

impl Listener {
    /// Binds and listens at `path` with mode 0600.
    ///
    /// An existing file at `path` is removed only when [`remove_stale_socket`] finds it stale: a
    /// socket owned by this user on which a connect probe is refused (`ECONNREFUSED`: nobody
    /// listens), still the same file when removed; then the bind is retried once. A live listener, a full queue, a file that is not a
    /// socket, a symlink, another user's socket or any other probe result leaves the file alone and
    /// gives [`TransportError::AddrInUse`]. A path over [`crate::MAX_SOCKET_PATH_LEN`] bytes gives
    /// [`TransportError::PathTooLong`].
    ///
    /// Two processes reclaiming the same stale path at the same moment, or a probe landing between
    /// another process's bind and listen, can still remove a socket that was about to go live; the
    /// project names sockets by PID so that two live processes never share a path.
    pub fn bind(path: &Path) -> Result<Listener, TransportError> {
        let addr = socket_addr(path)?;
        let context = |what: &str| format!("{what} {}", path.display());
        let socket = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| TransportError::io(context("socket for"), e))?;
        // Linux creates the socket file with the socket inode's mode less the umask, so the file is
        // born 0600 and there is never a moment in which another user could connect. Changing the
        // umask instead would race with every other thread of the application.
        rustix::fs::fchmod(&socket, Mode::RUSR | Mode::WUSR)
            .map_err(|e| TransportError::io(context("fchmod socket for"), e))?;
        match rustix::net::bind(&socket, &addr) {
            Ok(()) => {}
            Err(Errno::ADDRINUSE) => {
                remove_stale(path, &addr)?;
                rustix::net::bind(&socket, &addr).map_err(|e| match e {
                    Errno::ADDRINUSE => TransportError::AddrInUse {
                        path: path.to_path_buf(),
                        reason: "taken again while it was being reclaimed",
                    },
                    e => TransportError::io(context("bind"), e),
                })?;
            }
            Err(e) => return Err(TransportError::io(context("bind"), e)),
        }
        // From here on the file at `path` is ours: remove it again if the listener cannot be made.
        let finish = || -> Result<(u64, u64), TransportError> {
            // Nothing can connect before `listen`, so setting the mode by path here cannot let
            // anyone in; it covers a filesystem that ignored the inode mode at bind.
            rustix::fs::chmod(path, Mode::RUSR | Mode::WUSR)
                .map_err(|e| TransportError::io(context("chmod"), e))?;
            let stat =
                rustix::fs::lstat(path).map_err(|e| TransportError::io(context("stat"), e))?;
            rustix::net::listen(&socket, BACKLOG)
                .map_err(|e| TransportError::io(context("listen on"), e))?;
            Ok((stat.st_dev, stat.st_ino))
        };
        let identity = match finish() {
            Ok(identity) => identity,
            Err(e) => {
                let _ = rustix::fs::unlink(path);
                return Err(e);
            }
        };
        Ok(Listener {
            listener: UnixListener::from(socket),
            path: path.to_path_buf(),
            identity,
        })
    }

    /// Waits for the next connection. The caller checks the peer ([`Connection::check_peer`])
    /// before reading from it.
    pub fn accept(&self) -> Result<Connection, TransportError> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => return Ok(Connection::from_stream(stream)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(TransportError::io(
                        format!("accept on {}", self.path.display()),
                        e,
                    ));
                }
            }
        }
    }

    /// The path this listener is bound to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Only our own socket file: after a restore or a reclaim by someone else the path may name
        // another process's socket.
        if let Ok(stat) = rustix::fs::lstat(&self.path)
            && (stat.st_dev, stat.st_ino) == self.identity
        {
            let _ = rustix::fs::unlink(&self.path);
        }
    }
}

/// Removes the socket file at `path` if it is stale, by the rules [`Listener::bind`] reclaims with:
/// the file is a socket (not a symlink or anything else), owned by this process's effective UID
/// (any owner when that is root), a non-blocking connect probe is refused (`ECONNREFUSED`), and it
/// is still the same file when removed. `Ok(true)`: removed; `Ok(false)`: no file there;
/// [`TransportError::AddrInUse`] names why a file was left alone. A restore uses it to clear the
/// socket paths CRIU is about to bind again.
pub fn remove_stale_socket(path: &Path) -> Result<bool, TransportError> {
    let addr = socket_addr(path)?;
    remove_stale(path, &addr)
}

fn remove_stale(path: &Path, addr: &SocketAddrUnix) -> Result<bool, TransportError> {
    let in_use = |reason| TransportError::AddrInUse {
        path: path.to_path_buf(),
        reason,
    };
    let before = match rustix::fs::lstat(path) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(TransportError::io(format!("stat {}", path.display()), e)),
    };
    if FileType::from_raw_mode(before.st_mode) != FileType::Socket {
        return Err(in_use("it is not a socket"));
    }
    let euid = rustix::process::geteuid();
    if before.st_uid != euid.as_raw() && !euid.is_root() {
        return Err(in_use("the socket belongs to another user"));
    }
    match probe(addr).map_err(|e| TransportError::io(format!("probe {}", path.display()), e))? {
        Probe::Alive => return Err(in_use("a live listener answers on it")),
        Probe::Gone => return Ok(false),
        Probe::Refused => {}
    }
    match rustix::fs::lstat(path) {
        Ok(now) if (now.st_dev, now.st_ino) == (before.st_dev, before.st_ino) => {}
        Ok(_) => return Err(in_use("it was replaced while being probed")),
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(TransportError::io(format!("stat {}", path.display()), e)),
    }
    match rustix::fs::unlink(path) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(TransportError::io(
            format!("remove stale socket {}", path.display()),
            e,
        )),
    }
}

/// A non-blocking connect: it never waits, whatever state the other side is in.
fn probe(addr: &SocketAddrUnix) -> std::io::Result<Probe> {
    let socket = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    loop {
        return match rustix::net::connect(&socket, addr) {
            Ok(()) | Err(Errno::AGAIN) | Err(Errno::INPROGRESS) => Ok(Probe::Alive),
            Err(Errno::CONNREFUSED) => Ok(Probe::Refused),
            Err(Errno::NOENT) => Ok(Probe::Gone),
            Err(Errno::INTR) => continue,
            Err(e) => Err(e.into()),
        };
    }
}
