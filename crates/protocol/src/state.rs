//! `cuinterpose.state`: the captured topology of a group of processes (who created and imported
//! what, mapped where, saved in which carrier), which resume and restore rebuild from.
//!
//! Layout, little endian: a 24-byte header, then the body.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `CUISTATE` |
//! | 8 | 2 | format version ([`STATE_VERSION`]) |
//! | 10 | 2 | flags: none are defined, all must be zero |
//! | 12 | 8 | body length in bytes, at most [`MAX_STATE_BODY_LEN`] |
//! | 20 | 4 | CRC-32 (IEEE) of the body |
//! | 24 | n | body: [`GroupState`] in postcard |
//!
//! The body is postcard rather than JSON: it holds the same [`ProcessRecord`]s the control socket
//! carries, so one encoding of those types is written, read and fuzzed; a process with tens of
//! thousands of mappings stays a few megabytes and decodes in milliseconds; postcard refuses what
//! JSON would let slide (a `bool` that is 2, an enum tag out of range, a missing field cannot exist).
//! People read the checkpoint's `manifest.json`, which is JSON and records this file's SHA-256.
//!
//! Decoding is strict and canonical: the body must be exactly the bytes [`encode`] writes for the
//! value it decodes to (postcard alone would accept over-long integers), and the value must pass
//! [`GroupState::validate`]. So a state file that decodes at all re-encodes to itself byte for byte.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ProtocolError;
use crate::record::{AllocationId, ProcessRecord};

/// File name of the state file in a checkpoint directory.
pub const STATE_FILE_NAME: &str = "cuinterpose.state";
/// First eight bytes of a state file.
pub const STATE_MAGIC: [u8; 8] = *b"CUISTATE";
/// The state format this build writes and reads. Bumped on any change of the layout or of a type
/// in the body (records included), or of what it means; older files are refused, not migrated
/// (3: every allocation a process created has a carrier, private ones too).
pub const STATE_VERSION: u16 = 4;
/// Length of the header before the body.
pub const STATE_HEADER_LEN: usize = 24;
/// Largest body accepted: bounds what a reader allocates before the checksum is known. A group of
/// processes with a million mappings between them stays far below it.
pub const MAX_STATE_BODY_LEN: u64 = 256 << 20;
/// Largest state file accepted (header and largest body): the limit to read it with.
pub const MAX_STATE_FILE_LEN: u64 = STATE_HEADER_LEN as u64 + MAX_STATE_BODY_LEN;

/// The captured topology of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    /// When the capture was taken, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Version of the tool that took it.
    pub tool_version: String,
    /// Whether the native checkpoint was taken after the shims released their memory: what
    /// resume (and resume after a fault) must undo.
    pub mode: SuspendMode,
    /// Every process of the group, each once.
    pub participants: Vec<ParticipantState>,
}

/// How a group was suspended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SuspendMode {
    /// The shims released their memory, then the driver checkpointed every process natively
    /// (lock, checkpoint): resume restores and unlocks natively before the shims rebuild.
    #[default]
    Native,
    /// The shims released their memory and nothing native was done (`suspend --keep-contexts`):
    /// contexts, modules, streams and memory the shim does not own stay resident on the GPU, and
    /// resume makes no native call either. Never written by a checkpoint to disk.
    KeepContexts,
}

/// One process of a captured group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParticipantState {
    /// PID in the tool's (host) PID namespace at capture.
    pub host_pid: u32,
    /// PID in the process's own PID namespace; what tickets and socket names use.
    pub ns_pid: u32,
    /// SHA-256 (64 lower-case hex digits) of the shim library the process had mapped.
    pub shim_sha256: String,
    /// What the shim reported at capture, after Save.
    pub record: ProcessRecord,
    /// The host carriers holding the bytes of the allocations this process created, shared or
    /// private.
    pub carriers: Vec<CarrierInfo>,
}

/// A host carrier: the saved bytes of one created allocation, held in its creator's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarrierInfo {
    /// The allocation whose bytes it holds.
    pub id: AllocationId,
    /// How many bytes it holds.
    pub bytes: u64,
}

impl GroupState {
    /// Checks that the state describes a group that can be rebuilt:
    ///
    /// - at least one participant; host and namespace PIDs nonzero and unique in the group;
    /// - each record is of its participant's namespace PID, each shim digest is well formed;
    /// - each participant has exactly one carrier per shared allocation it created and no other,
    ///   none holding more bytes than the allocation has;
    /// - each import names a creator in the group that created a shared allocation of that ID and
    ///   size;
    /// - each multicast object appears once per participant, and one imported names a creator in
    ///   the group that created and shared a multicast object of that ID and size.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        if self.participants.is_empty() {
            return inconsistent("the group has no participants".into());
        }
        let mut host_pids = BTreeSet::new();
        let mut created: BTreeMap<u32, Created> = BTreeMap::new();
        for p in &self.participants {
            if !host_pids.insert(p.host_pid) {
                return inconsistent(format!("host pid {} appears twice", p.host_pid));
            }
            if created.insert(p.ns_pid, p.validated_creations()?).is_some() {
                return inconsistent(format!("namespace pid {} appears twice", p.ns_pid));
            }
        }
        let multicasts = self.created_multicasts()?;
        for p in &self.participants {
            p.check_imports(&created, &multicasts)?;
        }
        Ok(())
    }

    /// The multicast objects each participant created, by namespace PID; an object listed twice
    /// by one participant is refused.
    fn created_multicasts(&self) -> Result<BTreeMap<u32, Created>, ProtocolError> {
        let mut multicasts: BTreeMap<u32, Created> = BTreeMap::new();
        for p in &self.participants {
            let mut seen = BTreeSet::new();
            for m in &p.record.multicasts {
                if !seen.insert(m.id) {
                    return inconsistent(format!(
                        "participant {}: multicast object {:?} appears twice",
                        p.ns_pid, m.id
                    ));
                }
                if m.creator_ns_pid == p.ns_pid {
                    multicasts
                        .entry(p.ns_pid)
                        .or_default()
                        .insert(m.id, (m.size, m.shared));
                }
            }
        }
        Ok(multicasts)
    }
}

/// What one participant created: allocation (or multicast object) ID -> (size, shared).
type Created = BTreeMap<AllocationId, (u64, bool)>;

fn inconsistent<T>(message: String) -> Result<T, ProtocolError> {
    Err(ProtocolError::Inconsistent(message))
}

impl ParticipantState {
    /// Its identity and its own allocations checked (each once, each with one carrier holding no
    /// more than the allocation): what it created.
    fn validated_creations(&self) -> Result<Created, ProtocolError> {
        if self.host_pid == 0 || self.ns_pid == 0 {
            return inconsistent(format!(
                "participant with pid 0 (host {}, namespace {})",
                self.host_pid, self.ns_pid
            ));
        }
        if self.record.ns_pid != self.ns_pid {
            return inconsistent(format!(
                "participant {} holds the record of namespace pid {}",
                self.ns_pid, self.record.ns_pid
            ));
        }
        if !crate::is_sha256_hex(&self.shim_sha256) {
            return inconsistent(format!(
                "participant {}: shim sha-256 {:?} is not 64 lower-case hex digits",
                self.ns_pid, self.shim_sha256
            ));
        }
        let mut allocations = BTreeMap::new();
        for a in &self.record.allocations {
            if allocations.insert(a.id, (a.size, a.shared)).is_some() {
                return inconsistent(format!(
                    "participant {}: allocation {:?} appears twice",
                    self.ns_pid, a.id
                ));
            }
        }
        let mut carried = BTreeSet::new();
        for c in &self.carriers {
            match allocations.get(&c.id) {
                Some(&(size, _)) if c.bytes <= size => {}
                Some(&(size, _)) => {
                    return inconsistent(format!(
                        "participant {}: carrier of {:?} holds {} bytes, the allocation has {size}",
                        self.ns_pid, c.id, c.bytes
                    ));
                }
                _ => {
                    return inconsistent(format!(
                        "participant {}: carrier of {:?}, which is not an allocation it created",
                        self.ns_pid, c.id
                    ));
                }
            }
            if !carried.insert(c.id) {
                return inconsistent(format!(
                    "participant {}: two carriers of {:?}",
                    self.ns_pid, c.id
                ));
            }
        }
        if let Some(id) = allocations.keys().find(|id| !carried.contains(*id)) {
            return inconsistent(format!(
                "participant {}: allocation {id:?} has no carrier",
                self.ns_pid
            ));
        }
        Ok(allocations)
    }

    /// Every import and imported multicast object names a participant that created and shared
    /// it with that size.
    fn check_imports(
        &self,
        created: &BTreeMap<u32, Created>,
        multicasts: &BTreeMap<u32, Created>,
    ) -> Result<(), ProtocolError> {
        for m in (self.record.multicasts.iter()).filter(|m| m.creator_ns_pid != self.ns_pid) {
            match multicasts.get(&m.creator_ns_pid).and_then(|c| c.get(&m.id)) {
                Some(&(size, true)) if size == m.size => {}
                _ => {
                    return inconsistent(format!(
                        "participant {} imports multicast object {:?} ({} bytes), which participant {} did not create and share with that size",
                        self.ns_pid, m.id, m.size, m.creator_ns_pid
                    ));
                }
            }
        }
        for import in &self.record.imports {
            let Some(allocations) = created.get(&import.creator_ns_pid) else {
                return inconsistent(format!(
                    "participant {} imports {:?} from namespace pid {}, which is not in the group",
                    self.ns_pid, import.id, import.creator_ns_pid
                ));
            };
            match allocations.get(&import.id) {
                Some(&(size, true)) if size == import.size => {}
                _ => {
                    return inconsistent(format!(
                        "participant {} imports {:?} ({} bytes), which participant {} did not create and share with that size",
                        self.ns_pid, import.id, import.size, import.creator_ns_pid
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The bytes of a state file holding `state`: header and body. Writes whatever it is given;
/// [`decode`] refuses a state that does not pass [`GroupState::validate`], so writers validate
/// first.
pub fn encode(state: &GroupState) -> Vec<u8> {
    let body = encode_body(state);
    let mut out = Vec::with_capacity(STATE_HEADER_LEN + body.len());
    out.extend_from_slice(&STATE_MAGIC);
    out.extend_from_slice(&STATE_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn encode_body(state: &GroupState) -> Vec<u8> {
    // postcard into a Vec fails only for types serde cannot describe (maps with unknown length and
    // the like); these are plain structs, vectors and enums.
    postcard::to_stdvec(state).expect("postcard encodes plain data")
}

/// Decodes a whole state file. Refuses, in this order: a short header, a bad magic, another
/// version, nonzero flags, a body length over [`MAX_STATE_BODY_LEN`], a body shorter or longer than
/// announced, a checksum mismatch, a body that does not decode or has bytes left over, a body that
/// is not the canonical encoding of its value, and a state that fails [`GroupState::validate`].
pub fn decode(bytes: &[u8]) -> Result<GroupState, ProtocolError> {
    let Some((header, rest)) = bytes.split_first_chunk::<STATE_HEADER_LEN>() else {
        return Err(ProtocolError::Truncated {
            expected: STATE_HEADER_LEN,
            got: bytes.len(),
        });
    };
    let (magic, fields) = header.split_at(8);
    if magic != STATE_MAGIC {
        return Err(ProtocolError::BadMagic);
    }
    let u16_at = |i: usize| u16::from_le_bytes([fields[i], fields[i + 1]]);
    let version = u16_at(0);
    if version != STATE_VERSION {
        return Err(ProtocolError::VersionMismatch {
            ours: STATE_VERSION,
            theirs: version,
        });
    }
    if let Some(i) = fields[2..4].iter().position(|&b| b != 0) {
        return Err(ProtocolError::Reserved { offset: 10 + i });
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&fields[4..12]);
    let length = u64::from_le_bytes(length);
    if length > MAX_STATE_BODY_LEN {
        return Err(ProtocolError::TooLarge {
            length,
            limit: MAX_STATE_BODY_LEN,
        });
    }
    // Bounded by MAX_STATE_BODY_LEN just above, so this fits in usize and in memory.
    let length = length as usize;
    if rest.len() < length {
        return Err(ProtocolError::Truncated {
            expected: STATE_HEADER_LEN + length,
            got: bytes.len(),
        });
    }
    if rest.len() > length {
        return Err(ProtocolError::TrailingBytes(rest.len() - length));
    }
    let crc = u32::from_le_bytes([fields[12], fields[13], fields[14], fields[15]]);
    if crc != crc32fast::hash(rest) {
        return Err(ProtocolError::Checksum);
    }
    let (state, left): (GroupState, _) =
        postcard::take_from_bytes(rest).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    if !left.is_empty() {
        return Err(ProtocolError::TrailingBytes(left.len()));
    }
    if encode_body(&state) != rest {
        return Err(ProtocolError::Malformed(
            "body is not the canonical encoding of its value".into(),
        ));
    }
    state.validate()?;
    Ok(state)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::*;

    fn props() -> AllocationProps {
        AllocationProps {
            allocation_type: 1,
            requested_handle_types: 1,
            location_type: 1,
            location_id: 0,
            compression_type: 0,
            gpu_direct_rdma_capable: 0,
            usage: 0,
        }
    }

    fn record(ns_pid: u32) -> ProcessRecord {
        ProcessRecord {
            ns_pid,
            phase: Phase::Saved,
            allocations: vec![],
            imports: vec![],
            mappings: vec![],
            reservations: vec![],
            blockers: vec![],
            calls_in_flight: 0,
            multicasts: vec![],
            unowned: vec![],
            gate: Default::default(),
        }
    }

    /// Worker A (ns pid 41) creates a 2 MiB allocation mapped at 0x7000_0000_0000 and shares it;
    /// worker B (ns pid 42) imports it at 0x7100_0000_0000.
    pub(crate) fn two_workers() -> GroupState {
        let id = AllocationId([0xaa; 16]);
        let mut a = record(41);
        a.allocations.push(AllocationRecord {
            id,
            size: 2 << 20,
            props: props(),
            shared: true,
            live_handles: 1,
        });
        a.allocations.push(AllocationRecord {
            id: AllocationId([0xbb; 16]),
            size: 4096,
            props: props(),
            shared: false,
            live_handles: 1,
        });
        a.mappings.push(MappingRecord {
            address: 0x7000_0000_0000,
            size: 2 << 20,
            offset: 0,
            backing: Backing::Created(id),
            access: vec![AccessRecord {
                location_type: 1,
                location_id: 0,
                flags: 3,
            }],
        });
        a.reservations.push(ReservationRecord {
            address: 0x7000_0000_0000,
            size: 4 << 20,
            alignment: 0,
            flags: 0,
        });
        let mut b = record(42);
        b.imports.push(ImportRecord {
            id,
            creator_ns_pid: 41,
            size: 2 << 20,
            props: props(),
            live_handles: 1,
        });
        b.mappings.push(MappingRecord {
            address: 0x7100_0000_0000,
            size: 2 << 20,
            offset: 0,
            backing: Backing::Imported(id),
            access: vec![AccessRecord {
                location_type: 1,
                location_id: 1,
                flags: 3,
            }],
        });
        GroupState {
            created_unix_ms: 1_767_225_600_000,
            tool_version: "0.1.0".into(),
            mode: Default::default(),
            participants: vec![
                ParticipantState {
                    host_pid: 1041,
                    ns_pid: 41,
                    shim_sha256: "0f".repeat(32),
                    record: a,
                    carriers: vec![
                        CarrierInfo { id, bytes: 2 << 20 },
                        CarrierInfo {
                            id: AllocationId([0xbb; 16]),
                            bytes: 4096,
                        },
                    ],
                },
                ParticipantState {
                    host_pid: 1042,
                    ns_pid: 42,
                    shim_sha256: "0f".repeat(32),
                    record: b,
                    carriers: vec![],
                },
            ],
        }
    }

    fn with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
        let crc = crc32fast::hash(&bytes[STATE_HEADER_LEN..]);
        bytes[20..24].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    fn file_with_body(body: &[u8]) -> Vec<u8> {
        let mut bytes = encode(&two_workers())[..STATE_HEADER_LEN].to_vec();
        bytes[12..20].copy_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(body);
        with_crc(bytes)
    }

    #[test]
    fn round_trip_is_byte_exact() {
        let state = two_workers();
        state.validate().unwrap();
        let bytes = encode(&state);
        assert_eq!(&bytes[..8], b"CUISTATE");
        assert_eq!(decode(&bytes), Ok(state.clone()));
        assert_eq!(encode(&decode(&bytes).unwrap()), bytes);
    }

    #[test]
    fn refuses_every_truncation() {
        let bytes = encode(&two_workers());
        for len in 0..bytes.len() {
            let e = decode(&bytes[..len]).unwrap_err();
            assert!(
                matches!(e, ProtocolError::Truncated { got, .. } if got == len),
                "length {len}: {e}"
            );
        }
    }

    #[test]
    fn refuses_trailing_bytes_after_the_body() {
        let mut bytes = encode(&two_workers());
        bytes.push(0);
        assert_eq!(decode(&bytes), Err(ProtocolError::TrailingBytes(1)));
    }

    #[test]
    fn refuses_bad_magic_other_versions_and_flags() {
        let good = encode(&two_workers());
        for i in 0..8 {
            let mut bytes = good.clone();
            bytes[i] ^= 1;
            assert_eq!(decode(&bytes), Err(ProtocolError::BadMagic));
        }
        for version in [0u16, STATE_VERSION - 1, STATE_VERSION + 1, u16::MAX] {
            let mut bytes = good.clone();
            bytes[8..10].copy_from_slice(&version.to_le_bytes());
            assert_eq!(
                decode(&bytes),
                Err(ProtocolError::VersionMismatch {
                    ours: STATE_VERSION,
                    theirs: version
                })
            );
        }
        for offset in [10, 11] {
            let mut bytes = good.clone();
            bytes[offset] = 0x01;
            assert_eq!(decode(&bytes), Err(ProtocolError::Reserved { offset }));
        }
    }

    #[test]
    fn refuses_an_oversized_length_before_looking_further() {
        let mut bytes = encode(&two_workers());
        for length in [MAX_STATE_BODY_LEN + 1, u64::MAX] {
            bytes[12..20].copy_from_slice(&length.to_le_bytes());
            assert_eq!(
                decode(&bytes),
                Err(ProtocolError::TooLarge {
                    length,
                    limit: MAX_STATE_BODY_LEN
                })
            );
        }
    }

    #[test]
    fn refuses_any_flipped_body_or_crc_bit() {
        let good = encode(&two_workers());
        for offset in (20..good.len()).step_by(3) {
            let mut bytes = good.clone();
            bytes[offset] ^= 0x10;
            assert_eq!(
                decode(&bytes),
                Err(ProtocolError::Checksum),
                "offset {offset}"
            );
        }
    }

    #[test]
    fn refuses_bodies_that_do_not_decode() {
        let body = postcard::to_stdvec(&two_workers()).unwrap();
        // Cut short (with a matching length and checksum), garbage, and an extra byte inside.
        let e = decode(&file_with_body(&body[..body.len() - 1])).unwrap_err();
        assert!(matches!(e, ProtocolError::Malformed(_)), "{e}");
        let e = decode(&file_with_body(&[0xff; 40])).unwrap_err();
        assert!(matches!(e, ProtocolError::Malformed(_)), "{e}");
        let mut longer = body.clone();
        longer.push(7);
        assert_eq!(
            decode(&file_with_body(&longer)),
            Err(ProtocolError::TrailingBytes(1))
        );
        assert_eq!(decode(&file_with_body(&body)), Ok(two_workers()));
    }

    #[test]
    fn refuses_a_non_canonical_body() {
        // created_unix_ms is the first field: rewrite its varint over-long (one more byte with the
        // same value); postcard reads it, the canonical check does not let it through.
        let state = GroupState {
            created_unix_ms: 5,
            ..two_workers()
        };
        let body = postcard::to_stdvec(&state).unwrap();
        assert_eq!(body[0], 5);
        let mut overlong = vec![0x85, 0x00];
        overlong.extend_from_slice(&body[1..]);
        let (decoded, _): (GroupState, _) = postcard::take_from_bytes(&overlong).unwrap();
        assert_eq!(decoded, state);
        let e = decode(&file_with_body(&overlong)).unwrap_err();
        assert!(matches!(e, ProtocolError::Malformed(_)), "{e}");
    }

    fn refused(change: impl FnOnce(&mut GroupState)) -> String {
        let mut state = two_workers();
        change(&mut state);
        let Err(ProtocolError::Inconsistent(why)) = state.validate() else {
            panic!("accepted");
        };
        // decode refuses what validate refuses.
        assert_eq!(
            decode(&encode(&state)),
            Err(ProtocolError::Inconsistent(why.clone()))
        );
        why
    }

    #[test]
    fn refuses_inconsistent_groups() {
        assert!(refused(|s| s.participants.clear()).contains("no participants"));
        assert!(refused(|s| s.participants[0].host_pid = 0).contains("pid 0"));
        assert!(refused(|s| s.participants[1].ns_pid = 0).contains("pid 0"));
        assert!(refused(|s| s.participants[1].host_pid = 1041).contains("host pid 1041"));
        assert!(
            refused(|s| {
                s.participants[1].ns_pid = 41;
                s.participants[1].record.ns_pid = 41;
            })
            .contains("namespace pid 41 appears twice")
        );
        assert!(refused(|s| s.participants[0].record.ns_pid = 7).contains("record"));
        assert!(refused(|s| s.participants[0].shim_sha256 = "AB".repeat(32)).contains("sha-256"));
        assert!(refused(|s| s.participants[0].shim_sha256.truncate(63)).contains("sha-256"));
        assert!(refused(|s| s.participants[0].carriers.clear()).contains("no carrier"));
        // A private allocation has its carrier too.
        assert!(
            refused(|s| {
                s.participants[0].carriers.pop();
            })
            .contains("no carrier")
        );
        assert!(refused(|s| s.participants[0].carriers[0].bytes += 1).contains("holds"));
        assert!(
            refused(|s| {
                let extra = s.participants[0].carriers[0];
                s.participants[0].carriers.push(extra);
            })
            .contains("two carriers")
        );
        assert!(
            refused(|s| s.participants[0].carriers[0].id = AllocationId([0xcc; 16]))
                .contains("not an allocation it created")
        );
        assert!(
            refused(|s| {
                let dup = s.participants[0].record.allocations[0].clone();
                s.participants[0].record.allocations.push(dup);
            })
            .contains("appears twice")
        );
        assert!(
            refused(|s| s.participants[1].record.imports[0].creator_ns_pid = 99)
                .contains("not in the group")
        );
        assert!(
            refused(|s| s.participants[1].record.imports[0].size = 4096).contains("did not create")
        );
        assert!(
            refused(|s| s.participants[1].record.imports[0].id = AllocationId([0xbb; 16]))
                .contains("did not create")
        );
    }

    /// Worker 41 created and shared a multicast object, worker 42 imported it.
    fn with_multicast() -> GroupState {
        let mut s = two_workers();
        let mc = |creator_ns_pid| MulticastRecord {
            id: AllocationId([0xcc; 16]),
            creator_ns_pid,
            size: 4 << 20,
            num_devices: 2,
            handle_types: 1,
            flags: 0,
            granularity: 2 << 20,
            shared: creator_ns_pid == 41,
            devices: vec![0],
            bindings: vec![],
            live_handles: 1,
        };
        s.participants[0].record.multicasts.push(mc(41));
        s.participants[1].record.multicasts.push(mc(41));
        s
    }

    #[test]
    fn multicast_imports_need_their_creator_in_the_group() {
        let state = with_multicast();
        state.validate().unwrap();
        assert_eq!(decode(&encode(&state)), Ok(state.clone()));
        let refused = |change: fn(&mut GroupState)| {
            let mut s = with_multicast();
            change(&mut s);
            match s.validate() {
                Err(ProtocolError::Inconsistent(why)) => why,
                other => panic!("{other:?}"),
            }
        };
        assert!(
            refused(|s| s.participants[1].record.multicasts[0].creator_ns_pid = 99)
                .contains("did not create and share")
        );
        assert!(
            refused(|s| s.participants[0].record.multicasts[0].shared = false)
                .contains("did not create and share")
        );
        assert!(
            refused(|s| s.participants[1].record.multicasts[0].size = 2 << 20)
                .contains("with that size")
        );
        assert!(
            refused(|s| {
                let dup = s.participants[0].record.multicasts[0].clone();
                s.participants[0].record.multicasts.push(dup);
            })
            .contains("appears twice")
        );
    }
}
