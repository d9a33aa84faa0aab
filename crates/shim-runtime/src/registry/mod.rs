//! The process's record of tracked CUDA memory: the objects behind the virtual handles the
//! application holds, their mappings and access, the application's VA reservations, and what blocks
//! a checkpoint. Pure bookkeeping: no driver calls, no I/O; the runtime calls the driver and then
//! tells the registry what happened.
//!
//! Model: one [`Object`] per allocation per process (created, imported through a ticket, imported
//! natively, a multicast object, or an untracked allocation found by a retain), named by ONE virtual
//! handle that every create, import and retain of it returns, with a count of the application's
//! references. The object holds exactly one driver reference (`real`) for as long as it exists, and
//! it exists while the application holds a reference or a mapping of it; so driver memory is freed
//! at the same moment as without the shim (when the last of the handles and mappings goes).

pub mod multicast;

use cuda_abi::CUmemAllocationProp;
use multicast::McInfo;
use protocol::record::{
    AccessRecord, AllocationId, AllocationProps, AllocationRecord, Backing, Blocker, ImportRecord,
    MappingRecord, Phase, ProcessRecord, ReservationRecord,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Top 16 bits of every virtual handle. Canonical user-space pointers (which the driver's handles
/// resemble) have zeros there, so a virtual handle is never mistaken for a driver value in a log.
pub const HANDLE_TAG: u64 = 0xc1a5 << 48;
const HANDLE_COUNTER_MASK: u64 = (1 << 48) - 1;

/// A virtual allocation handle, as the application sees it. Never 0.
pub type VHandle = cuda::VirtualHandle;
use cuda::DriverHandle;

/// What an object is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Created here by `cuMemCreate`.
    Created {
        id: AllocationId,
        /// Exported as a POSIX descriptor at least once (sticky): peers may import it, so it is
        /// exported again into the cache when capture rebuilds it.
        shared: bool,
        /// Handle types other than POSIX descriptors it was exported as (FABRIC...): blockers.
        unsupported_exports: Vec<u32>,
    },
    /// Imported through a ticket naming another process's allocation.
    Imported {
        id: AllocationId,
        creator_ns_pid: u32,
    },
    /// Imported natively: a POSIX descriptor that was not a ticket (`handle_type` POSIX), or a
    /// shareable handle of another type.
    Foreign { serial: u64, handle_type: u32 },
    /// An allocation the shim did not see being made, found by `cuMemRetainAllocationHandle` (for
    /// example memory of `cuMemAlloc`). Private: native checkpoint handles it.
    Native,
    /// A multicast object, created here or imported through a ticket.
    Multicast(Box<McInfo>),
}

/// One allocation of the process.
#[derive(Clone, Debug)]
pub struct Object {
    pub kind: Kind,
    pub size: u64,
    pub props: AllocationProps,
    /// References the application holds (creates, imports and retains not yet released).
    pub refs: u32,
    /// Mapping records backed by this object.
    pub mappings: u32,
    /// The shim's one driver reference; `None` while a capture has released it.
    pub real: Option<DriverHandle>,
    /// Offset of the object's bytes in the host carrier, once saved.
    pub carrier: Option<u64>,
}

impl Object {
    pub fn id(&self) -> Option<AllocationId> {
        match &self.kind {
            Kind::Created { id, .. } | Kind::Imported { id, .. } => Some(*id),
            Kind::Multicast(info) => Some(info.id),
            _ => None,
        }
    }

    /// A created allocation that was exported as a POSIX descriptor (peers may import it).
    pub fn is_shared_creation(&self) -> bool {
        matches!(self.kind, Kind::Created { shared: true, .. })
    }

    /// An allocation this process created, shared or private: capture saves its bytes to the
    /// carrier, releases it and rebuilds it.
    pub fn is_creation(&self) -> bool {
        matches!(self.kind, Kind::Created { .. })
    }

    /// What capture releases and rebuilds: every creation and every ticket import.
    pub fn is_captured(&self) -> bool {
        self.is_creation() || matches!(self.kind, Kind::Imported { .. })
    }
}

/// A live `cuMemMap` (or the part of one that is left after a partial unmap or access change).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub size: u64,
    pub offset: u64,
    pub handle: VHandle,
    /// Merged per location, sorted by location; PROT_NONE grants are dropped (same as absent).
    pub access: Vec<AccessRecord>,
    /// False while a capture has unmapped it.
    pub mapped: bool,
}

/// What became of an object whose last reference or mapping went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dead {
    pub handle: VHandle,
    /// The driver reference the shim must release now.
    pub real: Option<DriverHandle>,
    /// The ID of an allocation or multicast object created here (its export cache entry goes
    /// with it).
    pub created_id: Option<AllocationId>,
}

/// The registry. The runtime keeps it behind its one state lock.
#[derive(Debug, Default)]
pub struct Registry {
    objects: HashMap<VHandle, Object>,
    by_id: HashMap<AllocationId, VHandle>,
    by_real: HashMap<DriverHandle, VHandle>,
    mappings: BTreeMap<u64, Mapping>,
    reservations: BTreeMap<u64, ReservationRecord>,
    /// Addresses handed to `cuIpcGetMemHandle`, until freed.
    ipc_exports: BTreeSet<u64>,
    /// Addresses returned by `cuIpcOpenMemHandle`, with the number of opens not yet closed.
    ipc_imports: BTreeMap<u64, u32>,
    /// Device ordinals the process used (allocation locations, access grants): what Freeze syncs.
    devices: BTreeSet<i32>,
    next_handle: u64,
    next_serial: u64,
    pub phase: Option<Phase>,
}

/// Records props as integers (unknown enum values kept).
pub fn record_props(p: &CUmemAllocationProp) -> AllocationProps {
    AllocationProps {
        allocation_type: p.type_,
        requested_handle_types: p.requestedHandleTypes,
        location_type: p.location.type_,
        location_id: p.location.id,
        compression_type: p.allocFlags.compressionType,
        gpu_direct_rdma_capable: p.allocFlags.gpuDirectRDMACapable,
        usage: p.allocFlags.usage,
    }
}

/// The driver struct for recorded props (for re-creating an allocation).
pub fn driver_props(p: &AllocationProps) -> CUmemAllocationProp {
    let mut out = CUmemAllocationProp {
        type_: p.allocation_type,
        requestedHandleTypes: p.requested_handle_types,
        ..CUmemAllocationProp::default()
    };
    out.location.type_ = p.location_type;
    out.location.id = p.location_id;
    out.allocFlags.compressionType = p.compression_type;
    out.allocFlags.gpuDirectRDMACapable = p.gpu_direct_rdma_capable;
    out.allocFlags.usage = p.usage;
    out
}

/// Props of something whose props are not known (yet).
pub const UNKNOWN_PROPS: AllocationProps = AllocationProps {
    allocation_type: 0,
    requested_handle_types: 0,
    location_type: 0,
    location_id: 0,
    compression_type: 0,
    gpu_direct_rdma_capable: 0,
    usage: 0,
};

fn merge_access(list: &mut Vec<AccessRecord>, grant: AccessRecord) {
    list.retain(|a| (a.location_type, a.location_id) != (grant.location_type, grant.location_id));
    if grant.flags != cuda_abi::access_flags::PROT_NONE {
        list.push(grant);
        list.sort_by_key(|a| (a.location_type, a.location_id));
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            phase: Some(Phase::Running),
            ..Registry::default()
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase.unwrap_or(Phase::Running)
    }

    fn new_handle(&mut self) -> VHandle {
        loop {
            self.next_handle = (self.next_handle + 1) & HANDLE_COUNTER_MASK;
            let handle = cuda::VirtualHandle(HANDLE_TAG | self.next_handle);
            if self.next_handle != 0 && !self.objects.contains_key(&handle) {
                return handle;
            }
        }
    }

    /// A fresh local number for a foreign import.
    pub fn new_serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }

    /// Adds an object with one application reference and returns its virtual handle.
    pub fn insert(
        &mut self,
        kind: Kind,
        size: u64,
        props: AllocationProps,
        real: DriverHandle,
    ) -> VHandle {
        let handle = self.new_handle();
        let object = Object {
            kind,
            size,
            props,
            refs: 1,
            mappings: 0,
            real: Some(real),
            carrier: None,
        };
        if let Some(id) = object.id() {
            self.by_id.insert(id, handle);
        }
        // Only creations name a device of this process; an import's location is the creator's.
        if matches!(object.kind, Kind::Created { .. })
            && props.location_type == cuda_abi::location_type::DEVICE
        {
            self.devices.insert(props.location_id);
        }
        self.by_real.insert(real, handle);
        self.objects.insert(handle, object);
        handle
    }

    pub fn get(&self, handle: VHandle) -> Option<&Object> {
        self.objects.get(&handle)
    }

    pub fn get_mut(&mut self, handle: VHandle) -> Option<&mut Object> {
        self.objects.get_mut(&handle)
    }

    /// The driver handle behind a virtual one, if the object exists and is not released.
    pub fn real_of(&self, handle: VHandle) -> Option<DriverHandle> {
        self.objects.get(&handle).and_then(|o| o.real)
    }

    pub fn by_id(&self, id: &AllocationId) -> Option<VHandle> {
        self.by_id.get(id).copied()
    }

    pub fn by_real(&self, real: DriverHandle) -> Option<VHandle> {
        self.by_real.get(&real).copied()
    }

    /// One more application reference to an existing object (a repeated import or a retain).
    pub fn add_ref(&mut self, handle: VHandle) -> bool {
        match self.objects.get_mut(&handle) {
            Some(o) => {
                o.refs = o.refs.saturating_add(1);
                true
            }
            None => false,
        }
    }

    /// Whether dropping one application reference would end the object: the caller releases the
    /// driver reference first, and commits with [`Registry::drop_ref`] only if that worked.
    pub fn release_would_kill(&self, handle: VHandle) -> Option<bool> {
        let o = self.objects.get(&handle)?;
        Some(o.refs <= 1 && o.mappings == 0)
    }

    /// Drops one application reference. `None` if the handle is unknown or holds no reference.
    pub fn drop_ref(&mut self, handle: VHandle) -> Option<Option<Dead>> {
        let o = self.objects.get_mut(&handle)?;
        if o.refs == 0 {
            return None;
        }
        o.refs -= 1;
        Some(self.reap(handle))
    }

    /// Removes the object if nothing keeps it.
    fn reap(&mut self, handle: VHandle) -> Option<Dead> {
        let o = self.objects.get(&handle)?;
        if o.refs > 0 || o.mappings > 0 {
            return None;
        }
        let o = self.objects.remove(&handle)?;
        if let Some(id) = o.id()
            && self.by_id.get(&id) == Some(&handle)
        {
            self.by_id.remove(&id);
        }
        if let Some(real) = o.real
            && self.by_real.get(&real) == Some(&handle)
        {
            self.by_real.remove(&real);
        }
        let created_id = match &o.kind {
            Kind::Created { id, .. } => Some(*id),
            Kind::Multicast(info) if info.creator.is_none() => Some(info.id),
            _ => None,
        };
        Some(Dead {
            handle,
            real: o.real,
            created_id,
        })
    }

    /// Points an object at a new driver handle (rebuild), or at none (release).
    pub fn set_real(&mut self, handle: VHandle, real: Option<DriverHandle>) {
        let Some(o) = self.objects.get_mut(&handle) else {
            return;
        };
        if let Some(old) = o.real
            && self.by_real.get(&old) == Some(&handle)
        {
            self.by_real.remove(&old);
        }
        o.real = real;
        if let Some(new) = real {
            self.by_real.insert(new, handle);
        }
    }

    /// Records a successful `cuMemMap`. A stale record in the range (memory unmapped behind the
    /// shim's back cannot happen, but a record must never be left overlapping) is trimmed first.
    pub fn insert_mapping(
        &mut self,
        address: u64,
        size: u64,
        offset: u64,
        handle: VHandle,
    ) -> Vec<Dead> {
        let dead = self.remove_range(address, size);
        if let Some(o) = self.objects.get_mut(&handle) {
            o.mappings = o.mappings.saturating_add(1);
            if let Kind::Foreign { .. } = o.kind {
                o.size = o.size.max(offset.saturating_add(size));
            }
        }
        self.mappings.insert(
            address,
            Mapping {
                size,
                offset,
                handle,
                access: Vec::new(),
                mapped: true,
            },
        );
        dead
    }

    /// Addresses of mappings intersecting `[address, address + size)`.
    fn intersecting(&self, address: u64, size: u64) -> Vec<u64> {
        let end = address.saturating_add(size);
        let mut out = Vec::new();
        // The one mapping starting before `address` may reach into the range.
        if let Some((&start, m)) = self.mappings.range(..address).next_back()
            && start.saturating_add(m.size) > address
        {
            out.push(start);
        }
        out.extend(self.mappings.range(address..end).map(|(&a, _)| a));
        out
    }

    /// Splits the mapping at `start` so that `[address, address + size)` falls on record
    /// boundaries; returns the start of the piece inside the range.
    fn split(&mut self, start: u64, address: u64, size: u64) -> Option<u64> {
        let m = self.mappings.remove(&start)?;
        let end = start.saturating_add(m.size);
        let lo = start.max(address);
        let hi = end.min(address.saturating_add(size));
        let mut pieces = Vec::with_capacity(3);
        if lo > start {
            pieces.push((start, lo - start));
        }
        pieces.push((lo, hi.saturating_sub(lo)));
        if hi < end {
            pieces.push((hi, end - hi));
        }
        if let Some(o) = self.objects.get_mut(&m.handle) {
            o.mappings = o
                .mappings
                .saturating_add(u32::try_from(pieces.len() - 1).unwrap_or(0));
        }
        for (piece, len) in pieces {
            self.mappings.insert(
                piece,
                Mapping {
                    size: len,
                    offset: m.offset.saturating_add(piece - start),
                    ..m.clone()
                },
            );
        }
        Some(lo)
    }

    /// Records a successful `cuMemUnmap`: every mapping in the range goes (partly covered ones
    /// keep the parts outside it). Returns the objects that died.
    pub fn remove_range(&mut self, address: u64, size: u64) -> Vec<Dead> {
        let mut dead = Vec::new();
        for start in self.intersecting(address, size) {
            let Some(inner) = self.split(start, address, size) else {
                continue;
            };
            if let Some(m) = self.mappings.remove(&inner) {
                if let Some(o) = self.objects.get_mut(&m.handle) {
                    o.mappings = o.mappings.saturating_sub(1);
                }
                dead.extend(self.reap(m.handle));
            }
        }
        dead
    }

    /// Records a successful `cuMemSetAccess`: merges the grants into every mapping in the range,
    /// splitting mappings the range covers only in part.
    pub fn set_access(&mut self, address: u64, size: u64, grants: &[AccessRecord]) {
        for start in self.intersecting(address, size) {
            let Some(inner) = self.split(start, address, size) else {
                continue;
            };
            if let Some(m) = self.mappings.get_mut(&inner) {
                for g in grants {
                    merge_access(&mut m.access, *g);
                }
            }
        }
        for g in grants {
            if g.location_type == cuda_abi::location_type::DEVICE {
                self.devices.insert(g.location_id);
            }
        }
    }

    /// The object mapped at `address`, if the shim tracks that mapping.
    pub fn mapping_at(&self, address: u64) -> Option<VHandle> {
        self.mapping_containing(address).map(|(_, m)| m.handle)
    }

    /// The mapping record containing `address`, with its start.
    pub fn mapping_containing(&self, address: u64) -> Option<(u64, &Mapping)> {
        let (&start, m) = self.mappings.range(..=address).next_back()?;
        (address < start.saturating_add(m.size)).then_some((start, m))
    }

    pub fn mappings(&self) -> impl Iterator<Item = (u64, &Mapping)> {
        self.mappings.iter().map(|(&a, m)| (a, m))
    }

    /// Mappings of one object, by address.
    pub fn mappings_of(&self, handle: VHandle) -> Vec<(u64, Mapping)> {
        self.mappings
            .iter()
            .filter(|(_, m)| m.handle == handle)
            .map(|(&a, m)| (a, m.clone()))
            .collect()
    }

    pub fn set_mapped(&mut self, address: u64, mapped: bool) {
        if let Some(m) = self.mappings.get_mut(&address) {
            m.mapped = mapped;
        }
    }

    pub fn objects(&self) -> impl Iterator<Item = (VHandle, &Object)> {
        self.objects.iter().map(|(&h, o)| (h, o))
    }

    pub fn devices(&self) -> Vec<i32> {
        self.devices.iter().copied().collect()
    }

    pub fn note_device(&mut self, device: i32) {
        self.devices.insert(device);
    }

    pub fn insert_reservation(&mut self, r: ReservationRecord) {
        self.reservations.insert(r.address, r);
    }

    pub fn remove_reservation(&mut self, address: u64) {
        self.reservations.remove(&address);
    }

    pub fn ipc_exported(&mut self, address: u64) {
        self.ipc_exports.insert(address);
    }

    /// `cuMemFree` of memory that was exported with legacy IPC ends that blocker.
    pub fn freed(&mut self, address: u64) {
        self.ipc_exports.remove(&address);
    }

    pub fn ipc_opened(&mut self, address: u64) {
        *self.ipc_imports.entry(address).or_insert(0) += 1;
    }

    pub fn ipc_closed(&mut self, address: u64) {
        if let Some(count) = self.ipc_imports.get_mut(&address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.ipc_imports.remove(&address);
            }
        }
    }

    /// Everything that blocks native checkpoint now, in a stable order.
    pub fn blockers(&self) -> Vec<Blocker> {
        let mut objects: Vec<(&VHandle, &Object)> = self.objects.iter().collect();
        objects.sort_by_key(|(h, _)| **h);
        let mut out = Vec::new();
        for (_, o) in objects {
            match &o.kind {
                Kind::Created {
                    id,
                    unsupported_exports,
                    ..
                } => out.extend(unsupported_exports.iter().map(|&handle_type| {
                    Blocker::UnsupportedExport {
                        id: *id,
                        handle_type,
                    }
                })),
                Kind::Foreign {
                    serial,
                    handle_type,
                } => out.push(
                    if *handle_type == cuda_abi::handle_type::POSIX_FILE_DESCRIPTOR {
                        Blocker::ForeignImport {
                            serial: *serial,
                            size: o.size,
                        }
                    } else {
                        Blocker::UnsupportedImport {
                            handle_type: *handle_type,
                            size: o.size,
                        }
                    },
                ),
                Kind::Multicast(info) => out.extend(multicast::blockers(self, info)),
                Kind::Imported { .. } | Kind::Native => {}
            }
        }
        out.extend(
            self.ipc_exports
                .iter()
                .map(|&address| Blocker::LegacyIpcExport { address }),
        );
        out.extend(
            self.ipc_imports
                .keys()
                .map(|&address| Blocker::LegacyIpcImport { address }),
        );
        out
    }

    /// The records INSPECT returns: the application's logical view, the same in every phase (a
    /// capture releases driver objects, not records), sorted so that two inspections compare equal.
    pub fn report(&self, ns_pid: u32, calls_in_flight: u32) -> ProcessRecord {
        let mut allocations = Vec::new();
        let mut imports = Vec::new();
        let mut multicasts = Vec::new();
        for o in self.objects.values() {
            match &o.kind {
                Kind::Created { id, shared, .. } => allocations.push(AllocationRecord {
                    id: *id,
                    size: o.size,
                    props: o.props,
                    shared: *shared,
                    live_handles: o.refs,
                }),
                Kind::Imported { id, creator_ns_pid } => imports.push(ImportRecord {
                    id: *id,
                    creator_ns_pid: *creator_ns_pid,
                    size: o.size,
                    props: o.props,
                    live_handles: o.refs,
                }),
                Kind::Multicast(info) => {
                    multicasts.push(multicast::record(self, ns_pid, info, o.refs));
                }
                _ => {}
            }
        }
        allocations.sort_by_key(|a| a.id);
        imports.sort_by_key(|a| a.id);
        multicasts.sort_by_key(|m| m.id);
        let mappings = self
            .mappings
            .iter()
            .filter_map(|(&address, m)| {
                let backing = match &self.objects.get(&m.handle)?.kind {
                    Kind::Created { id, .. } => Backing::Created(*id),
                    Kind::Imported { id, .. } => Backing::Imported(*id),
                    Kind::Foreign { serial, .. } => Backing::Foreign { serial: *serial },
                    Kind::Multicast(info) => Backing::Multicast(info.id),
                    // Native mappings are private: native checkpoint keeps them.
                    Kind::Native => return None,
                };
                Some(MappingRecord {
                    address,
                    size: m.size,
                    offset: m.offset,
                    backing,
                    access: m.access.clone(),
                })
            })
            .collect();
        ProcessRecord {
            ns_pid,
            phase: self.phase(),
            allocations,
            imports,
            mappings,
            reservations: self.reservations.values().copied().collect(),
            blockers: self.blockers(),
            calls_in_flight,
            multicasts,
            unowned: vec![], // counted outside the registry: the runtime's inspect fills it
            gate: Default::default(), // the gate is the runtime's: the runtime's inspect fills it
        }
    }
}

/// A device allocation's properties with a POSIX descriptor handle type, for the unit tests of
/// the registry and its multicast records.
#[cfg(test)]
fn props(device: i32) -> AllocationProps {
    AllocationProps {
        allocation_type: 1,
        requested_handle_types: 1,
        location_type: cuda_abi::location_type::DEVICE,
        location_id: device,
        ..UNKNOWN_PROPS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_abi::{access_flags, location_type};

    fn created(n: u8) -> Kind {
        Kind::Created {
            id: AllocationId([n; 16]),
            shared: false,
            unsupported_exports: Vec::new(),
        }
    }

    fn dh(raw: u64) -> DriverHandle {
        DriverHandle::from_raw(raw)
    }

    fn grant(device: i32, flags: u32) -> AccessRecord {
        AccessRecord {
            location_type: location_type::DEVICE,
            location_id: device,
            flags,
        }
    }

    #[test]
    fn handles_are_tagged_unique_and_never_zero() {
        let mut r = Registry::new();
        let a = r.insert(created(1), 1 << 21, props(0), dh(0x10));
        let b = r.insert(created(2), 1 << 21, props(0), dh(0x20));
        assert_ne!(a, b);
        for h in [a, b] {
            assert_ne!(h.0, 0);
            assert_eq!(h.0 & !HANDLE_COUNTER_MASK, HANDLE_TAG);
        }
        assert_eq!(r.real_of(a), Some(dh(0x10)));
        assert_eq!(r.by_real(dh(0x20)), Some(b));
        assert_eq!(r.by_id(&AllocationId([2; 16])), Some(b));
    }

    #[test]
    fn references_and_mappings_keep_an_object_alive() {
        let mut r = Registry::new();
        let h = r.insert(created(1), 4 << 20, props(0), dh(0x10));
        assert!(r.add_ref(h)); // a retain
        assert!(r.insert_mapping(0x1000_0000, 4 << 20, 0, h).is_empty());
        assert_eq!(r.release_would_kill(h), Some(false));
        assert_eq!(r.drop_ref(h), Some(None));
        assert_eq!(r.drop_ref(h), Some(None));
        // No reference left, but the mapping keeps it; a further release is refused.
        assert_eq!(r.drop_ref(h), None);
        assert!(r.get(h).is_some());
        let dead = r.remove_range(0x1000_0000, 4 << 20);
        assert_eq!(
            dead,
            vec![Dead {
                handle: h,
                real: Some(dh(0x10)),
                created_id: Some(AllocationId([1; 16]))
            }]
        );
        assert!(r.get(h).is_none());
        assert!(r.by_real(dh(0x10)).is_none());
        assert!(r.by_id(&AllocationId([1; 16])).is_none());
    }

    #[test]
    fn partial_unmap_keeps_the_rest_with_its_offset() {
        let mut r = Registry::new();
        let h = r.insert(created(1), 8 << 20, props(0), dh(0x10));
        r.insert_mapping(0x2000_0000, 6 << 20, 2 << 20, h);
        assert!(r.remove_range(0x2000_0000 + (2 << 20), 2 << 20).is_empty());
        let left: Vec<(u64, u64, u64)> = r.mappings().map(|(a, m)| (a, m.size, m.offset)).collect();
        assert_eq!(
            left,
            vec![
                (0x2000_0000, 2 << 20, 2 << 20),
                (0x2000_0000 + (4 << 20), 2 << 20, 6 << 20)
            ]
        );
        assert_eq!(r.get(h).map(|o| o.mappings), Some(2));
        assert_eq!(r.mapping_at(0x2000_0000 + (2 << 20)), None);
        assert_eq!(r.mapping_at(0x2000_0000 + (5 << 20)), Some(h));
    }

    #[test]
    fn unmap_of_several_mappings_at_once() {
        let mut r = Registry::new();
        let a = r.insert(created(1), 2 << 20, props(0), dh(0x10));
        let b = r.insert(created(2), 2 << 20, props(1), dh(0x20));
        r.insert_mapping(0x4000_0000, 2 << 20, 0, a);
        r.insert_mapping(0x4000_0000 + (2 << 20), 2 << 20, 0, b);
        r.drop_ref(a);
        let dead = r.remove_range(0x4000_0000, 4 << 20);
        assert_eq!(dead.len(), 1);
        assert!(r.get(a).is_none());
        assert_eq!(r.get(b).map(|o| (o.refs, o.mappings)), Some((1, 0)));
    }

    #[test]
    fn access_merges_per_location_and_splits_partial_ranges() {
        let mut r = Registry::new();
        let h = r.insert(created(1), 4 << 20, props(0), dh(0x10));
        r.insert_mapping(0x3000_0000, 4 << 20, 0, h);
        // One call per GPU, as PyTorch does, then one call with two descriptors.
        r.set_access(
            0x3000_0000,
            4 << 20,
            &[grant(0, access_flags::PROT_READWRITE)],
        );
        r.set_access(0x3000_0000, 4 << 20, &[grant(1, access_flags::PROT_READ)]);
        r.set_access(
            0x3000_0000,
            4 << 20,
            &[
                grant(1, access_flags::PROT_READWRITE),
                grant(2, access_flags::PROT_READ),
            ],
        );
        let all: Vec<_> = r.mappings().map(|(_, m)| m.access.clone()).collect();
        assert_eq!(
            all,
            vec![vec![
                grant(0, access_flags::PROT_READWRITE),
                grant(1, access_flags::PROT_READWRITE),
                grant(2, access_flags::PROT_READ)
            ]]
        );
        // Revoking device 2 on the upper half splits the mapping.
        r.set_access(
            0x3000_0000 + (2 << 20),
            2 << 20,
            &[grant(2, access_flags::PROT_NONE)],
        );
        let pieces: Vec<_> = r
            .mappings()
            .map(|(a, m)| (a, m.offset, m.access.len()))
            .collect();
        assert_eq!(
            pieces,
            vec![(0x3000_0000, 0, 3), (0x3000_0000 + (2 << 20), 2 << 20, 2)]
        );
        assert_eq!(r.get(h).map(|o| o.mappings), Some(2));
        assert_eq!(r.devices(), vec![0, 1, 2]);
    }

    #[test]
    fn an_allocation_mapped_twice_is_reported_twice() {
        let mut r = Registry::new();
        let h = r.insert(created(1), 2 << 20, props(0), dh(0x10));
        r.insert_mapping(0x5000_0000, 2 << 20, 0, h);
        r.insert_mapping(0x6000_0000, 2 << 20, 0, h);
        let rec = r.report(7, 0);
        assert_eq!(rec.mappings.len(), 2);
        assert!(
            rec.mappings
                .iter()
                .all(|m| m.backing == Backing::Created(AllocationId([1; 16])))
        );
        assert_eq!(rec.allocations.len(), 1);
        assert_eq!(rec.ns_pid, 7);
    }

    #[test]
    fn blockers_follow_what_is_live() {
        let mut r = Registry::new();
        let foreign = r.insert(
            Kind::Foreign {
                serial: 1,
                handle_type: cuda_abi::handle_type::POSIX_FILE_DESCRIPTOR,
            },
            0,
            props(0),
            dh(0x30),
        );
        r.insert_mapping(0x7000_0000, 2 << 20, 0, foreign);
        let fabric = r.insert(
            Kind::Foreign {
                serial: 2,
                handle_type: cuda_abi::handle_type::FABRIC,
            },
            0,
            props(0),
            dh(0x40),
        );
        let mc_prop = cuda_abi::CUmulticastObjectProp {
            numDevices: 2,
            size: 1 << 21,
            handleTypes: cuda_abi::handle_type::POSIX_FILE_DESCRIPTOR.into(),
            flags: 0,
        };
        let mut info = McInfo::created(AllocationId([5; 16]), &mc_prop, 1 << 21);
        info.devices = vec![0, 1];
        info.unsupported_exports = vec![cuda_abi::handle_type::FABRIC];
        let mc = r.insert(
            Kind::Multicast(Box::new(info)),
            1 << 21,
            UNKNOWN_PROPS,
            dh(0x50),
        );
        r.ipc_exported(0x9000);
        r.ipc_opened(0xa000);
        r.ipc_opened(0xa000);
        let b = r.blockers();
        assert_eq!(
            b,
            vec![
                Blocker::ForeignImport {
                    serial: 1,
                    size: 2 << 20
                },
                Blocker::UnsupportedImport {
                    handle_type: cuda_abi::handle_type::FABRIC,
                    size: 0
                },
                Blocker::MulticastHandleType {
                    id: AllocationId([5; 16]),
                    handle_types: u64::from(
                        cuda_abi::handle_type::POSIX_FILE_DESCRIPTOR
                            | cuda_abi::handle_type::FABRIC
                    )
                },
                Blocker::LegacyIpcExport { address: 0x9000 },
                Blocker::LegacyIpcImport { address: 0xa000 },
            ]
        );
        r.drop_ref(foreign);
        r.remove_range(0x7000_0000, 2 << 20);
        r.drop_ref(fabric);
        r.drop_ref(mc);
        r.freed(0x9000);
        r.ipc_closed(0xa000);
        assert_eq!(
            r.blockers(),
            vec![Blocker::LegacyIpcImport { address: 0xa000 }]
        );
        r.ipc_closed(0xa000);
        assert!(r.blockers().is_empty());
    }

    #[test]
    fn reports_are_stable_across_calls_and_rebuilds() {
        let mut r = Registry::new();
        let mut handles = Vec::new();
        for n in 0..20u8 {
            let h = r.insert(created(n), 2 << 20, props(0), dh(0x100 + u64::from(n)));
            r.insert_mapping(0x8000_0000 + (u64::from(n) << 21), 2 << 20, 0, h);
            handles.push(h);
        }
        let before = r.report(1, 0);
        // A rebuild points the objects at new driver handles; the records do not change.
        for (i, h) in handles.iter().enumerate() {
            r.set_real(*h, None);
            r.set_real(*h, Some(dh(0x9000 + i as u64)));
        }
        assert_eq!(r.report(1, 0), before);
        assert_eq!(r.by_real(dh(0x9000)), handles.first().copied());
        assert!(r.by_real(dh(0x100)).is_none());
    }
}
