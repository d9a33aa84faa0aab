//! The virtual legacy IPC handle: what an application receives from `cuIpcGetMemHandle` on memory
//! the shim owns (`cuMemAlloc` made on VMM), instead of the driver's `CUipcMemHandle`.
//!
//! Its 64 bytes are the size of a `CUipcMemHandle`, so they travel wherever the application sends
//! the driver's handle (PyTorch pickles it, CuPy hands out the bytes). An opener's shim recognises
//! the magic and the checksum, then asks the creator (by its namespace PID) for the allocation's
//! descriptor by allocation ID, as for a ticket. The handle names no driver object, so it stays
//! valid across checkpoint and restore, where the driver's handles do not.
//!
//! Layout, little endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `CUIIPCMH` |
//! | 8 | 2 | version (1) |
//! | 10 | 2 | reserved, zero |
//! | 12 | 4 | creator's namespace PID |
//! | 16 | 16 | allocation ID |
//! | 32 | 8 | offset of the exported pointer within the allocation |
//! | 40 | 8 | requested size (what `cuMemAlloc` was asked for) |
//! | 48 | 8 | backing size (the allocation as created, rounded to the granularity) |
//! | 56 | 4 | CRC-32 (IEEE) of bytes 0..56 |
//! | 60 | 4 | reserved, zero |
//!
//! Decoding is strict, as for the ticket: reserved bytes zero, checksum matching, and the sizes
//! consistent (`offset < requested <= backing`), so that there is exactly one encoding of a handle
//! and a driver's own handle is never taken for one of ours.

use crate::ProtocolError;
use crate::fixed::{Frame, id_at, u32_at, u64_at};
use crate::record::AllocationId;

/// First eight bytes of every virtual IPC handle.
pub const IPC_MAGIC: [u8; 8] = *b"CUIIPCMH";
/// The layout this build writes and accepts.
pub const IPC_VERSION: u16 = 1;
/// Exact length of an encoded handle: that of `CUipcMemHandle`.
pub const IPC_HANDLE_LEN: usize = 64;

/// Bytes covered by the checksum.
const CRC_COVERS: usize = 56;

/// The handle's frame: magic, version, reserved bytes, checksum.
const FRAME: Frame<IPC_HANDLE_LEN> = Frame {
    magic: IPC_MAGIC,
    version: IPC_VERSION,
    crc_at: CRC_COVERS,
    reserved: &[10..12, 60..64],
};

/// What a virtual IPC handle names: a pointer into an owned allocation of its creator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpcHandle {
    /// `getpid()` of the creating process inside its own PID namespace: locates its control socket.
    pub creator_ns_pid: u32,
    /// The creator's ID of the allocation.
    pub id: AllocationId,
    /// Offset of the pointer given to `cuIpcGetMemHandle` from the allocation's base.
    pub offset: u64,
    /// Bytes the application asked `cuMemAlloc` for.
    pub requested: u64,
    /// Bytes of the allocation as created (what an opener imports and maps).
    pub backing: u64,
}

impl IpcHandle {
    /// The 64 bytes of this handle.
    pub fn encode(&self) -> [u8; IPC_HANDLE_LEN] {
        FRAME.encode(|out| {
            out[12..16].copy_from_slice(&self.creator_ns_pid.to_le_bytes());
            out[16..32].copy_from_slice(&self.id.0);
            out[32..40].copy_from_slice(&self.offset.to_le_bytes());
            out[40..48].copy_from_slice(&self.requested.to_le_bytes());
            out[48..56].copy_from_slice(&self.backing.to_le_bytes());
        })
    }

    /// Whether `bytes` start with the magic: a handle of ours (well-formed or not), as opposed to
    /// a driver's handle, which goes to the driver.
    pub fn is_ours(bytes: &[u8]) -> bool {
        bytes.get(..8) == Some(&IPC_MAGIC[..])
    }

    /// Decodes exactly [`IPC_HANDLE_LEN`] bytes. Refuses, in this order: a wrong length, a bad
    /// magic, another version, a nonzero reserved byte, a checksum mismatch, inconsistent sizes.
    pub fn decode(bytes: &[u8]) -> Result<IpcHandle, ProtocolError> {
        let b = FRAME.check(bytes)?;
        let handle = IpcHandle {
            creator_ns_pid: u32_at(b, 12),
            id: id_at(b, 16),
            offset: u64_at(b, 32),
            requested: u64_at(b, 40),
            backing: u64_at(b, 48),
        };
        if handle.offset >= handle.requested || handle.requested > handle.backing {
            return Err(ProtocolError::Inconsistent(format!(
                "IPC handle offset {} / requested {} / backing {} bytes",
                handle.offset, handle.requested, handle.backing
            )));
        }
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IpcHandle {
        IpcHandle {
            creator_ns_pid: 41,
            id: AllocationId(*b"0123456789abcdef"),
            offset: 0x10,
            requested: 3 << 20,
            backing: 4 << 20,
        }
    }

    /// Rewrites the checksum after a deliberate change, so that the check under test is the one
    /// that refuses.
    fn fix_crc(bytes: &mut [u8; IPC_HANDLE_LEN]) {
        let crc = crc32fast::hash(&bytes[..CRC_COVERS]);
        bytes[56..60].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn round_trip() {
        for handle in [
            sample(),
            IpcHandle {
                creator_ns_pid: u32::MAX,
                id: AllocationId([0xff; 16]),
                offset: u64::MAX - 1,
                requested: u64::MAX,
                backing: u64::MAX,
            },
            IpcHandle {
                creator_ns_pid: 0,
                id: AllocationId([0; 16]),
                offset: 0,
                requested: 1,
                backing: 1,
            },
        ] {
            let bytes = handle.encode();
            assert!(IpcHandle::is_ours(&bytes));
            assert_eq!(IpcHandle::decode(&bytes), Ok(handle));
        }
    }

    #[test]
    fn layout_is_the_documented_one() {
        let bytes = sample().encode();
        assert_eq!(&bytes[0..8], b"CUIIPCMH");
        assert_eq!(&bytes[8..10], &[1, 0]);
        assert_eq!(&bytes[10..12], &[0, 0]);
        assert_eq!(&bytes[12..16], &41u32.to_le_bytes());
        assert_eq!(&bytes[16..32], b"0123456789abcdef");
        assert_eq!(&bytes[32..40], &0x10u64.to_le_bytes());
        assert_eq!(&bytes[40..48], &(3u64 << 20).to_le_bytes());
        assert_eq!(&bytes[48..56], &(4u64 << 20).to_le_bytes());
        assert_eq!(&bytes[56..60], &crc32fast::hash(&bytes[..56]).to_le_bytes());
        assert_eq!(&bytes[60..64], &[0, 0, 0, 0]);
    }

    #[test]
    fn a_driver_handle_is_not_ours() {
        // The fake driver's handles start with their own magic; an all-zero handle is nothing.
        let mut fake = [0u8; IPC_HANDLE_LEN];
        fake[..8].copy_from_slice(b"FAKEIPC1");
        assert!(!IpcHandle::is_ours(&fake));
        assert!(!IpcHandle::is_ours(&[0; IPC_HANDLE_LEN]));
        assert_eq!(IpcHandle::decode(&fake), Err(ProtocolError::BadMagic));
    }

    #[test]
    fn refuses_every_truncation_and_trailing_bytes() {
        let bytes = sample().encode();
        for len in 0..IPC_HANDLE_LEN {
            assert_eq!(
                IpcHandle::decode(&bytes[..len]),
                Err(ProtocolError::Truncated {
                    expected: IPC_HANDLE_LEN,
                    got: len
                }),
                "length {len}"
            );
        }
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(
            IpcHandle::decode(&long),
            Err(ProtocolError::TrailingBytes(1))
        );
    }

    #[test]
    fn refuses_other_versions() {
        for version in [0u16, 2, 0x100, u16::MAX] {
            let mut bytes = sample().encode();
            bytes[8..10].copy_from_slice(&version.to_le_bytes());
            fix_crc(&mut bytes);
            assert_eq!(
                IpcHandle::decode(&bytes),
                Err(ProtocolError::VersionMismatch {
                    ours: IPC_VERSION,
                    theirs: version
                })
            );
        }
    }

    #[test]
    fn refuses_each_nonzero_reserved_byte() {
        for offset in [10, 11, 60, 61, 62, 63] {
            let mut bytes = sample().encode();
            bytes[offset] = 0x80;
            fix_crc(&mut bytes);
            assert_eq!(
                IpcHandle::decode(&bytes),
                Err(ProtocolError::Reserved { offset }),
                "offset {offset}"
            );
        }
    }

    #[test]
    fn refuses_inconsistent_sizes() {
        for (offset, requested, backing) in [(5, 5, 8), (9, 8, 8), (0, 9, 8), (0, 0, 0)] {
            let handle = IpcHandle {
                offset,
                requested,
                backing,
                ..sample()
            };
            assert!(
                matches!(
                    IpcHandle::decode(&handle.encode()),
                    Err(ProtocolError::Inconsistent(_))
                ),
                "{offset}/{requested}/{backing}"
            );
        }
    }

    #[test]
    fn every_single_byte_change_is_refused() {
        let good = sample().encode();
        for offset in 0..IPC_HANDLE_LEN {
            for value in 0..=255u8 {
                if value == good[offset] {
                    continue;
                }
                let mut bytes = good;
                bytes[offset] = value;
                assert!(
                    IpcHandle::decode(&bytes).is_err(),
                    "offset {offset} value {value:#x} was accepted"
                );
            }
        }
    }
}
