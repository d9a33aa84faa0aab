//! What a shim reports about its process: the records an INSPECT returns, which the tool checks and
//! which `cuinterpose.state` stores so that a resume or a restore rebuilds exactly what was captured.
//!
//! Addresses and sizes are `u64` whatever the host's pointer width; device ordinals are the
//! process-local ordinals the application used (`CUdevice`), so a device is identified across
//! processes by (namespace PID, ordinal), never by ordinal alone.
//!
//! These types are encoded with postcard in control frames and in the state file: field and variant
//! order is the wire format ([`Phase`] says how it is guarded).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A random 128-bit identity given to an allocation by the shim of the process that created it. It
/// names the allocation in tickets, in peer fd requests and in the state file, and stays the same
/// across suspend, resume, checkpoint and restore, while the driver's handles change.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AllocationId(pub [u8; 16]);

impl fmt::Display for AllocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for AllocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// The phase a shim is in.
///
/// postcard encodes a variant as its index in declaration order (a varint), so the order of the
/// variants is the wire format, here and in every enum of this crate: append only, and bump
/// [`crate::message::PROTOCOL_VERSION`] and [`crate::state::STATE_VERSION`] when adding one.
/// `tests/wire_format.rs` pins the encoded bytes of each variant against golden files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Normal operation: tracked calls go to the driver.
    Running,
    /// Tracked memory calls are held; contexts synchronised.
    Frozen,
    /// Shared bytes are in host carriers.
    Saved,
    /// Imports and shared allocations are released; only private memory is left for native checkpoint.
    Released,
    /// Shared allocations are recreated and refilled (creators).
    Loaded,
    /// Imports are mapped again (importers); ready to thaw.
    Imported,
}

/// `CUmemAllocationProp` as recorded, enum fields as integers (unknown values are kept, not rejected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationProps {
    pub allocation_type: u32,
    pub requested_handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
}

/// Where an application mapping's backing comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Backing {
    /// An allocation this process created (`cuMemCreate`).
    Created(AllocationId),
    /// An allocation another process created, imported through a ticket.
    Imported(AllocationId),
    /// An allocation imported natively from a descriptor that was not a ticket (a process without
    /// the shim exported it); `serial` is the shim's local number for it.
    Foreign { serial: u64 },
    /// A multicast object (created here or imported through a ticket), by its ID.
    Multicast(AllocationId),
}

/// An allocation created in this process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    pub id: AllocationId,
    pub size: u64,
    pub props: AllocationProps,
    /// Exported at least once (sticky): its bytes are saved to a host carrier on capture.
    pub shared: bool,
    /// Virtual handles the application holds for it (created or retained, not yet released).
    pub live_handles: u32,
}

/// An allocation imported into this process through a ticket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportRecord {
    pub id: AllocationId,
    /// Namespace PID of the creator, as the ticket names it.
    pub creator_ns_pid: u32,
    pub size: u64,
    pub props: AllocationProps,
    pub live_handles: u32,
}

/// One access descriptor in effect on a mapping (merged per location, last writer wins).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRecord {
    pub location_type: u32,
    pub location_id: i32,
    pub flags: u32,
}

/// A live `cuMemMap` of (part of) an allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappingRecord {
    pub address: u64,
    pub size: u64,
    /// Offset into the allocation.
    pub offset: u64,
    pub backing: Backing,
    pub access: Vec<AccessRecord>,
}

/// A multicast object this process holds, created here (`creator_ns_pid` is its own) or imported
/// through a ticket. The team is the object's, shared by every holder: `devices` are the ones
/// THIS process added (its local ordinals), so the team is the union over the group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MulticastRecord {
    pub id: AllocationId,
    pub creator_ns_pid: u32,
    /// `CUmulticastObjectProp` as requested by the creator (an importer reports the creator's).
    pub size: u64,
    pub num_devices: u32,
    pub handle_types: u64,
    pub flags: u64,
    /// The recommended granularity the creator's driver reported for these properties.
    pub granularity: u64,
    /// Exported as a POSIX descriptor at least once (sticky; creators only).
    pub shared: bool,
    /// Devices this process added with `cuMulticastAddDevice`, in the order added.
    pub devices: Vec<i32>,
    /// Bindings this process made and has not unbound, by device then offset.
    pub bindings: Vec<MulticastBinding>,
    pub live_handles: u32,
}

/// One live `cuMulticastBindMem`/`cuMulticastBindAddr` of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MulticastBinding {
    /// The member's device (local ordinal): the `_v2` argument, else the memory's location.
    pub device: i32,
    pub mc_offset: u64,
    pub size: u64,
    pub flags: u64,
    pub target: BindTarget,
}

/// What a multicast binding binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BindTarget {
    /// `cuMulticastBindMem`: an allocation and an offset into it; `None` for memory the shim
    /// does not know (released by the application while bound, or not made through it).
    Memory {
        backing: Option<Backing>,
        offset: u64,
    },
    /// `cuMulticastBindAddr`: the memory mapped at an address of this process.
    Address { address: u64 },
}

/// A live `cuMemAddressReserve`. Kept across capture: the addresses must stay the application's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationRecord {
    pub address: u64,
    pub size: u64,
    pub alignment: u64,
    pub flags: u64,
}

/// Something live in the process that native checkpoint cannot survive and cuinterpose does not
/// (yet) rebuild. Any blocker in any participant refuses capture, naming the process and this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Blocker {
    /// A descriptor that was not a ticket was imported and is still held or mapped.
    ForeignImport { serial: u64, size: u64 },
    /// An allocation was exported with a handle type other than a POSIX descriptor (FABRIC, ...).
    UnsupportedExport { id: AllocationId, handle_type: u32 },
    /// A shareable handle of a type other than a POSIX descriptor was imported.
    UnsupportedImport { handle_type: u32, size: u64 },
    /// `cuIpcGetMemHandle` was called on memory of this process that is still allocated.
    LegacyIpcExport { address: u64 },
    /// A `cuIpcOpenMemHandle` mapping is open.
    LegacyIpcImport { address: u64 },
    /// A multicast object was created or exported with handle types other than POSIX descriptors.
    MulticastHandleType { id: AllocationId, handle_types: u64 },
    /// A multicast binding binds memory the shim does not rebuild (not a shared creation or a
    /// ticket import: private, foreign, or not mapped from tracked memory).
    MulticastForeignMemory {
        id: AllocationId,
        device: i32,
        mc_offset: u64,
    },
    /// A multicast binding reaches past its object or its member memory as the shim recorded them.
    MulticastOutOfBounds {
        id: AllocationId,
        device: i32,
        mc_offset: u64,
        size: u64,
    },
    /// A resolver handed out a submission entry point in an ABI the submission gate does not
    /// cover: work submitted through it could run while memory is released.
    UngatedSubmission { entry: String, count: u32 },
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocker::ForeignImport { serial, size } => write!(
                f,
                "holds a foreign import #{serial} ({size} bytes) from a process without the shim"
            ),
            Blocker::UnsupportedExport { id, handle_type } => write!(
                f,
                "exported allocation {id} with unsupported handle type {handle_type:#x}"
            ),
            Blocker::UnsupportedImport { handle_type, size } => write!(
                f,
                "imported a {size}-byte allocation with unsupported handle type {handle_type:#x}"
            ),
            Blocker::LegacyIpcExport { address } => {
                write!(f, "exported legacy CUDA IPC memory at {address:#x}")
            }
            Blocker::LegacyIpcImport { address } => {
                write!(f, "has legacy CUDA IPC memory open at {address:#x}")
            }
            Blocker::MulticastHandleType { id, handle_types } => write!(
                f,
                "holds multicast object {id} with handle types {handle_types:#x}, not only POSIX descriptors"
            ),
            Blocker::MulticastForeignMemory {
                id,
                device,
                mc_offset,
            } => write!(
                f,
                "bound memory the shim does not own to multicast object {id} (device {device}, offset {mc_offset:#x})"
            ),
            Blocker::MulticastOutOfBounds {
                id,
                device,
                mc_offset,
                size,
            } => write!(
                f,
                "has a binding of multicast object {id} out of bounds (device {device}, offset {mc_offset:#x}, {size} bytes)"
            ),
            Blocker::UngatedSubmission { entry, count } => write!(
                f,
                "resolved {entry} in an ABI the submission gate does not cover ({count} such \
                 lookups): its GPU work could run while memory is released"
            ),
        }
    }
}

/// A kind of device memory the shim does not own: the driver's checkpoint moves it (at 2-6 GB/s
/// on the H200, against the carriers' 35-55), and a keep-mode suspend leaves it resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum UnownedKind {
    /// `cuMemAlloc` made by the driver (`CUINTERPOSE_ALLOC=native`).
    DriverAlloc,
    /// `cuMemAllocPitch`.
    Pitched,
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemAllocAsync`: stream-ordered memory of the device's default pool (what a pool keeps
    /// reserved beyond its live allocations is not counted).
    StreamOrdered,
}

impl fmt::Display for UnownedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnownedKind::DriverAlloc => "cuMemAlloc by the driver",
            UnownedKind::Pitched => "cuMemAllocPitch",
            UnownedKind::Managed => "cuMemAllocManaged",
            UnownedKind::StreamOrdered => "cuMemAllocAsync",
        })
    }
}

/// The live allocations of one [`UnownedKind`] in a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnownedRecord {
    pub kind: UnownedKind,
    pub allocations: u64,
    /// Bytes the application asked for.
    pub bytes: u64,
}

/// Everything a shim reports about its process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// `getpid()` inside the process: its PID in its own PID namespace.
    pub ns_pid: u32,
    pub phase: Phase,
    pub allocations: Vec<AllocationRecord>,
    pub imports: Vec<ImportRecord>,
    pub mappings: Vec<MappingRecord>,
    pub reservations: Vec<ReservationRecord>,
    pub blockers: Vec<Blocker>,
    /// Tracked driver calls executing right now (a capture must see zero once frozen).
    pub calls_in_flight: u32,
    /// Multicast objects the process holds, by ID.
    pub multicasts: Vec<MulticastRecord>,
    /// Device memory the shim does not own, by kind (kinds with none left out). Not part of the
    /// topology a rebuild is verified against: these calls are not gated, so the application may
    /// change them while suspended.
    pub unowned: Vec<UnownedRecord>,
    /// The submission gate: whether it is closed, and what waits at it. Not part of the topology.
    pub gate: GateRecord,
}

/// How a process's submission gate stands (INSPECT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRecord {
    /// Closed by a capture: new GPU work waits.
    pub closed: bool,
    /// Application threads waiting at it now.
    pub waiting: u32,
    /// Submissions past it and not yet back from the driver.
    pub inside: u32,
}
