//! The formats cuinterpose speaks and stores, with no I/O: control-socket messages and their frames,
//! the records a shim reports, the ticket (virtual shareable handle) codec, and the state-file and
//! manifest formats. Every format starts with a magic and a version; every decoder is bounded and
//! returns [`ProtocolError`] on any input, never panics (the fuzz targets in `fuzz/` hold it to that).

#![forbid(unsafe_code)]

pub mod message;
pub mod record;

pub use message::{ErrorCode, FrameHeader, HelloReply, Request, Response};
pub use record::*;

/// Why bytes could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("bad magic: not a cuinterpose frame or file")]
    BadMagic,
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    VersionMismatch { ours: u16, theirs: u16 },
    #[error("length {length} exceeds the limit of {limit} bytes")]
    TooLarge { length: u64, limit: u64 },
    #[error("truncated: expected {expected} bytes, got {got}")]
    Truncated { expected: usize, got: usize },
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    #[error("header says kind {header:#x}, body is kind {body:#x}")]
    KindMismatch { header: u16, body: u16 },
    #[error("checksum mismatch")]
    Checksum,
    #[error("malformed: {0}")]
    Malformed(String),
}
