//! The ticket: what an application receives from `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`
//! instead of the driver's descriptor (a "virtual shareable handle").
//!
//! The shim writes these 48 bytes into a sealed memfd. An importer's shim recognises a ticket by the
//! seals, the size and the magic, then decodes it here and asks the creator (found by its namespace
//! PID) for the real descriptor by allocation ID. The ticket is ordinary process memory to CRIU, so it
//! stays valid across checkpoint and restore while the driver's descriptors do not.
//!
//! Layout, little endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `CUITICKT` |
//! | 8 | 2 | version (2) |
//! | 10 | 1 | kind: 0 an allocation (`cuMemCreate`), 1 a multicast object (`cuMulticastCreate`) |
//! | 11 | 1 | reserved, zero |
//! | 12 | 4 | creator's namespace PID |
//! | 16 | 16 | allocation ID |
//! | 32 | 8 | allocation size in bytes |
//! | 40 | 4 | CRC-32 (IEEE) of bytes 0..40 |
//! | 44 | 4 | reserved, zero |
//!
//! Version 2 added the kind: an importer must know before it imports whether the ticket names a
//! multicast object, whose rebuild is a group-wide sequence of its own.
//!
//! Decoding is strict: every reserved byte must be zero, the kind 0 or 1, and the checksum must match, so that a
//! reader and a writer can only agree on one encoding of a ticket (the prior design's writer and
//! reader disagreed about reserved fields and nobody noticed).

use crate::ProtocolError;
use crate::fixed::{Frame, id_at, u32_at, u64_at};
use crate::record::AllocationId;

/// First eight bytes of every ticket.
pub const TICKET_MAGIC: [u8; 8] = *b"CUITICKT";
/// The ticket layout this build writes and accepts.
pub const TICKET_VERSION: u16 = 2;
/// Exact length of an encoded ticket (and of the memfd holding it).
pub const TICKET_LEN: usize = 48;

/// Bytes covered by the checksum.
const CRC_COVERS: usize = 40;

/// The ticket's frame: magic, version, reserved bytes, checksum.
const FRAME: Frame<TICKET_LEN> = Frame {
    magic: TICKET_MAGIC,
    version: TICKET_VERSION,
    crc_at: CRC_COVERS,
    reserved: &[11..12, 44..48],
};

/// What a ticket names: an allocation by its creator and its ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    /// `getpid()` of the creating process inside its own PID namespace; it locates the creator's
    /// control socket.
    pub creator_ns_pid: u32,
    /// The creator's ID of the allocation.
    pub id: AllocationId,
    /// Size of the allocation in bytes, as created.
    pub size: u64,
    /// The ID names a multicast object, not an allocation.
    pub multicast: bool,
}

impl Ticket {
    /// The 48 bytes of this ticket.
    pub fn encode(&self) -> [u8; TICKET_LEN] {
        FRAME.encode(|out| {
            out[10] = u8::from(self.multicast);
            out[12..16].copy_from_slice(&self.creator_ns_pid.to_le_bytes());
            out[16..32].copy_from_slice(&self.id.0);
            out[32..40].copy_from_slice(&self.size.to_le_bytes());
        })
    }

    /// Decodes exactly [`TICKET_LEN`] bytes. Refuses, in this order: a wrong length, a bad magic,
    /// another version, a nonzero reserved byte, a checksum mismatch, an unknown kind.
    pub fn decode(bytes: &[u8]) -> Result<Ticket, ProtocolError> {
        let b = FRAME.check(bytes)?;
        if b[10] > 1 {
            return Err(ProtocolError::Malformed(format!(
                "ticket kind {} is neither an allocation (0) nor a multicast object (1)",
                b[10]
            )));
        }
        Ok(Ticket {
            creator_ns_pid: u32_at(b, 12),
            id: id_at(b, 16),
            size: u64_at(b, 32),
            multicast: b[10] == 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Ticket {
        Ticket {
            creator_ns_pid: 41,
            id: AllocationId(*b"0123456789abcdef"),
            size: 2 << 20,
            multicast: false,
        }
    }

    /// Rewrites the checksum after a deliberate change, so that the check under test is the one
    /// that refuses, not the checksum.
    fn fix_crc(bytes: &mut [u8; TICKET_LEN]) {
        let crc = crc32fast::hash(&bytes[..CRC_COVERS]);
        bytes[40..44].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn round_trip() {
        for ticket in [
            sample(),
            Ticket {
                creator_ns_pid: u32::MAX,
                id: AllocationId([0xff; 16]),
                size: u64::MAX,
                multicast: true,
            },
            Ticket {
                creator_ns_pid: 0,
                id: AllocationId([0; 16]),
                size: 0,
                multicast: false,
            },
        ] {
            let bytes = ticket.encode();
            assert_eq!(bytes.len(), TICKET_LEN);
            assert_eq!(bytes[..8], TICKET_MAGIC);
            assert_eq!(Ticket::decode(&bytes), Ok(ticket));
        }
    }

    #[test]
    fn layout_is_the_documented_one() {
        let bytes = sample().encode();
        assert_eq!(&bytes[0..8], b"CUITICKT");
        assert_eq!(&bytes[8..10], &[2, 0]);
        assert_eq!(&bytes[10..12], &[0, 0]);
        let multicast = Ticket {
            multicast: true,
            ..sample()
        }
        .encode();
        assert_eq!(&multicast[10..12], &[1, 0]);
        assert_eq!(&bytes[12..16], &41u32.to_le_bytes());
        assert_eq!(&bytes[16..32], b"0123456789abcdef");
        assert_eq!(&bytes[32..40], &(2u64 << 20).to_le_bytes());
        assert_eq!(&bytes[40..44], &crc32fast::hash(&bytes[..40]).to_le_bytes());
        assert_eq!(&bytes[44..48], &[0, 0, 0, 0]);
    }

    #[test]
    fn refuses_every_truncation() {
        let bytes = sample().encode();
        for len in 0..TICKET_LEN {
            assert_eq!(
                Ticket::decode(&bytes[..len]),
                Err(ProtocolError::Truncated {
                    expected: TICKET_LEN,
                    got: len
                }),
                "length {len}"
            );
        }
    }

    #[test]
    fn refuses_trailing_bytes() {
        let mut long = sample().encode().to_vec();
        long.push(0);
        assert_eq!(Ticket::decode(&long), Err(ProtocolError::TrailingBytes(1)));
        long.extend_from_slice(&[0; 100]);
        assert_eq!(
            Ticket::decode(&long),
            Err(ProtocolError::TrailingBytes(101))
        );
    }

    #[test]
    fn refuses_bad_magic_at_every_byte() {
        for i in 0..8 {
            let mut bytes = sample().encode();
            bytes[i] ^= 0x20;
            fix_crc(&mut bytes);
            assert_eq!(
                Ticket::decode(&bytes),
                Err(ProtocolError::BadMagic),
                "byte {i}"
            );
        }
    }

    #[test]
    fn refuses_other_versions() {
        for version in [0u16, 1, 3, 0x100, u16::MAX] {
            let mut bytes = sample().encode();
            bytes[8..10].copy_from_slice(&version.to_le_bytes());
            fix_crc(&mut bytes);
            assert_eq!(
                Ticket::decode(&bytes),
                Err(ProtocolError::VersionMismatch {
                    ours: TICKET_VERSION,
                    theirs: version
                })
            );
        }
    }

    #[test]
    fn refuses_each_nonzero_reserved_byte() {
        // Byte 11 is under the checksum, 44..48 are not; both must be refused as reserved,
        // whether or not the checksum was rewritten to match.
        for offset in [11, 44, 45, 46, 47] {
            for value in [1u8, 0x80, 0xff] {
                let mut bytes = sample().encode();
                bytes[offset] = value;
                fix_crc(&mut bytes);
                assert_eq!(
                    Ticket::decode(&bytes),
                    Err(ProtocolError::Reserved { offset }),
                    "offset {offset} value {value:#x}"
                );
            }
        }
    }

    #[test]
    fn refuses_an_unknown_kind() {
        for value in [2u8, 0x80, 0xff] {
            let mut bytes = sample().encode();
            bytes[10] = value;
            fix_crc(&mut bytes);
            assert!(
                matches!(Ticket::decode(&bytes), Err(ProtocolError::Malformed(_))),
                "kind {value:#x}"
            );
        }
    }

    #[test]
    fn refuses_a_flipped_bit_at_every_covered_or_crc_byte() {
        let good = sample().encode();
        for offset in (12..40).chain(40..44) {
            for bit in 0..8 {
                let mut bytes = good;
                bytes[offset] ^= 1 << bit;
                assert_eq!(
                    Ticket::decode(&bytes),
                    Err(ProtocolError::Checksum),
                    "offset {offset} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn every_single_byte_change_is_refused() {
        let good = sample().encode();
        for offset in 0..TICKET_LEN {
            for value in 0..=255u8 {
                if value == good[offset] {
                    continue;
                }
                let mut bytes = good;
                bytes[offset] = value;
                assert!(
                    Ticket::decode(&bytes).is_err(),
                    "offset {offset} value {value:#x} was accepted"
                );
            }
        }
    }
}
