//! The formats cuinterpose speaks and stores, with no I/O: control-socket messages and their frames,
//! the records a shim reports, the ticket (virtual shareable handle) and virtual legacy IPC handle
//! codecs, and the state-file and
//! manifest formats (the manifest behind the default feature `manifest`, which the shim leaves off
//! so that it links no JSON). Every format starts with a magic and a version; every decoder is
//! bounded and returns [`ProtocolError`] on any input, never panics (the fuzz targets in `fuzz/`
//! hold it to that). `tests/wire_format.rs` pins the bytes of each against golden files.

#![forbid(unsafe_code)]

mod fixed;
pub mod ipc;
#[cfg(feature = "manifest")]
pub mod manifest;
pub mod message;
pub mod record;
pub mod state;
pub mod ticket;

pub use message::{ErrorCode, FrameHeader, HelloReply, MulticastStep, Request, Response};
pub use record::*;

/// Why bytes could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    /// The bytes do not start with the magic of the format that was expected.
    #[error("bad magic: not a cuinterpose frame or file")]
    BadMagic,
    /// The format's version is not the one this build speaks; old artifacts are refused, not
    /// migrated.
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    VersionMismatch {
        /// The version this build speaks.
        ours: u16,
        /// The version the bytes carry.
        theirs: u16,
    },
    /// A length field or the input exceeds the format's named limit.
    #[error("length {length} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The length that was announced or found.
        length: u64,
        /// The limit of the format.
        limit: u64,
    },
    /// The input ends before the format says it does.
    #[error("truncated: expected {expected} bytes, got {got}")]
    Truncated {
        /// Bytes the format needs.
        expected: usize,
        /// Bytes that were there.
        got: usize,
    },
    /// The input goes on after the end of the message.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A frame's header names another message kind than its body holds.
    #[error("header says kind {header:#x}, body is kind {body:#x}")]
    KindMismatch {
        /// Kind in the header.
        header: u16,
        /// Kind of the decoded body.
        body: u16,
    },
    /// The checksum does not match the bytes it covers.
    #[error("checksum mismatch")]
    Checksum,
    /// A field that is reserved (must be zero) is not zero.
    #[error("reserved byte at offset {offset} is nonzero")]
    Reserved {
        /// Offset of the first nonzero reserved byte from the start of the input.
        offset: usize,
    },
    /// The body does not decode as the format's type.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A JSON document names another format than the one expected (or none).
    #[error("not a {expected} document (format {found:?})")]
    WrongFormat {
        /// The format that was expected.
        expected: &'static str,
        /// What the document's `format` field says, empty when it has none.
        found: String,
    },
    /// A manifest of another version; old checkpoints are refused, not migrated.
    #[error("manifest version {theirs} is not {ours}: recreate the checkpoint with this version")]
    ManifestVersion {
        /// The version this build writes and reads.
        ours: u32,
        /// The version in the document.
        theirs: u32,
    },
    /// The content decodes but contradicts itself (or a file it describes).
    #[error("inconsistent: {0}")]
    Inconsistent(String),
    /// A file's SHA-256 is not the one recorded for it.
    #[error("sha-256 of {what} is {found}, expected {expected}")]
    DigestMismatch {
        /// Which file.
        what: String,
        /// The digest that was recorded (hex).
        expected: String,
        /// The digest of the bytes at hand (hex).
        found: String,
    },
}

/// Whether `s` is a SHA-256 digest as this project writes them: 64 lower-case hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
