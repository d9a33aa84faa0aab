//! Framed Unix-socket transport of cuinterpose: bounded frames carrying at most one descriptor, plus
//! the few file operations the project's on-disk formats need ([`files`]).
//!
//! A frame is a [`protocol::FrameHeader`] (12 bytes) and a body of at most
//! [`protocol::message::MAX_BODY_LEN`] bytes. The receiver reads the header completely and validates
//! it before it reads, or allocates room for, the body. Descriptors travel only by SCM_RIGHTS,
//! at most one per frame and only on a response that carries one
//! ([`protocol::Response::carries_fd`]); they are received close-on-exec and owned ([`std::os::fd::OwnedFd`]) from the moment they arrive, so a refused frame closes them.
//!
//! Every socket is close-on-exec, every send uses `MSG_NOSIGNAL` (a dead peer gives `EPIPE`, never a
//! `SIGPIPE` in the application that loaded the shim), `EINTR` is retried, and blocking operations are
//! bounded by the timeouts the caller sets. After an error that consumed or sent part of a frame the
//! [`Connection`] refuses further use ([`TransportError::Broken`]): the stream is out of step and a
//! descriptor may already have been delivered, so the only safe continuation is a new connection.

#![deny(unsafe_code)]

mod connection;
mod error;
pub mod files;
mod listener;
mod peer;

pub use connection::Connection;
pub use error::TransportError;
pub use listener::{Listener, remove_stale_socket};
pub use peer::{PeerCred, peer_allowed};

/// Longest socket path [`Listener::bind`] and [`Connection::connect`] accept, in bytes: `sun_path` is
/// 108 bytes and holds a terminating NUL.
pub const MAX_SOCKET_PATH_LEN: usize = 107;
