//! What the fixed-length records share (the ticket, `ticket.rs`, and the virtual legacy IPC handle,
//! `ipc.rs`): an exact length, a magic and a little-endian version first, reserved bytes that must
//! be zero, and a CRC-32 (IEEE) of the bytes before it. Each record keeps its own layout and its own
//! field checks; the frame around them is written and checked here once, in one order of refusals:
//! a wrong length, a bad magic, another version, a nonzero reserved byte, a checksum mismatch.

use crate::ProtocolError;
use crate::record::AllocationId;

/// The frame of one fixed-length record: its magic and version at offsets 0 and 8, the CRC of
/// `..crc_at` at `crc_at`, and the reserved byte ranges.
pub(crate) struct Frame<const N: usize> {
    pub magic: [u8; 8],
    pub version: u16,
    pub crc_at: usize,
    pub reserved: &'static [core::ops::Range<usize>],
}

impl<const N: usize> Frame<N> {
    /// A record of this frame whose fields `fill` writes (it must leave the frame's bytes alone):
    /// the magic, the version and the checksum written around them, reserved bytes zero.
    pub fn encode(&self, fill: impl FnOnce(&mut [u8; N])) -> [u8; N] {
        let mut out = [0u8; N];
        fill(&mut out);
        out[0..8].copy_from_slice(&self.magic);
        out[8..10].copy_from_slice(&self.version.to_le_bytes());
        let crc = crc32fast::hash(&out[..self.crc_at]);
        out[self.crc_at..self.crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// `bytes` as a record of this frame, once its length, magic, version, reserved bytes and
    /// checksum are right; its fields are the caller's to check.
    pub fn check<'b>(&self, bytes: &'b [u8]) -> Result<&'b [u8; N], ProtocolError> {
        let Ok(b) = <&[u8; N]>::try_from(bytes) else {
            return Err(if bytes.len() < N {
                ProtocolError::Truncated {
                    expected: N,
                    got: bytes.len(),
                }
            } else {
                ProtocolError::TrailingBytes(bytes.len() - N)
            });
        };
        if b[0..8] != self.magic {
            return Err(ProtocolError::BadMagic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != self.version {
            return Err(ProtocolError::VersionMismatch {
                ours: self.version,
                theirs: version,
            });
        }
        if let Some(offset) = self
            .reserved
            .iter()
            .flat_map(Clone::clone)
            .find(|&i| b[i] != 0)
        {
            return Err(ProtocolError::Reserved { offset });
        }
        if u32_at(b, self.crc_at) != crc32fast::hash(&b[..self.crc_at]) {
            return Err(ProtocolError::Checksum);
        }
        Ok(b)
    }
}

/// The little-endian `u32` at `at`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

/// The little-endian `u64` at `at`.
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// The allocation ID at `at` (16 bytes).
pub(crate) fn id_at(b: &[u8], at: usize) -> AllocationId {
    let mut id = [0u8; 16];
    id.copy_from_slice(&b[at..at + 16]);
    AllocationId(id)
}
