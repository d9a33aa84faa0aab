//! The transport's one error type.

use std::io;
use std::path::PathBuf;

use protocol::ProtocolError;

/// Why a transport or file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A system call failed; `context` says which operation on what.
    #[error("{context}: {source}")]
    Io {
        /// The operation and its object, e.g. `connect to /tmp/cuinterpose-41.sock`.
        context: String,
        /// The error the system reported.
        source: io::Error,
    },
    /// The peer sent bytes that are not a valid frame, or a message was too large to send.
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    /// The peer closed the connection at a frame boundary.
    #[error("connection closed by the peer")]
    Closed,
    /// A blocking send, receive or connect ran past the connection's timeout.
    #[error("timed out waiting for the peer")]
    Timeout,
    /// The socket path does not fit in a Unix socket address.
    #[error(
        "socket path is {len} bytes, more than the {max} a unix socket address holds: {}",
        path.display()
    )]
    PathTooLong {
        /// The path that was refused.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// [`crate::MAX_SOCKET_PATH_LEN`].
        max: usize,
    },
    /// The socket path is taken by a live listener or by something that is not a stale socket of
    /// ours, and was left alone.
    #[error("socket path {} is in use: {reason}", path.display())]
    AddrInUse {
        /// The path that could not be bound.
        path: PathBuf,
        /// Why it was not reclaimed.
        reason: &'static str,
    },
    /// A descriptor arrived on a frame that must not carry one (any request, any response but
    /// those of [`protocol::Response::carries_fd`]); it was closed. Also returned when a caller
    /// tries to send one.
    #[error("a descriptor came with a frame that carries none")]
    UnexpectedFd,
    /// A response that carries a descriptor ([`protocol::Response::carries_fd`]) arrived without
    /// it, or a caller tried to send one without a descriptor.
    #[error("fd response without its descriptor")]
    MissingFd,
    /// The peer sent more than one descriptor, or more control data than fits; what arrived was
    /// closed.
    #[error("more than one descriptor, or truncated control data, on one frame")]
    TooManyFds,
    /// The peer's credentials are not allowed to use this socket (see [`crate::peer_allowed`]).
    #[error("peer pid {pid} uid {uid} is not allowed on this socket")]
    PeerDenied {
        /// The peer's PID as seen from this process (0 when it is in another PID namespace).
        pid: u32,
        /// The peer's effective UID.
        uid: u32,
    },
    /// An earlier error on this connection left part of a frame sent or received; the connection
    /// must be dropped.
    #[error("connection unusable after an earlier error")]
    Broken,
    /// A file is larger than the limit its reader accepts.
    #[error("{} is {size} bytes, more than the limit of {limit}", path.display())]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size (or at least this many bytes were found).
        size: u64,
        /// The limit.
        limit: u64,
    },
}

impl TransportError {
    /// An [`TransportError::Io`] from a context and an error.
    pub(crate) fn io(context: impl Into<String>, source: impl Into<io::Error>) -> TransportError {
        TransportError::Io {
            context: context.into(),
            source: source.into(),
        }
    }
}
