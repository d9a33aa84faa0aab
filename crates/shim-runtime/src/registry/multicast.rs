//! The registry's records of multicast objects: what the shim knows of each ([`McInfo`], held
//! by its object as [`Kind::Multicast`]), its bindings, the records INSPECT reports of them and
//! what about them refuses a capture. Pure bookkeeping, like the rest of the registry; the tracked
//! multicast calls are in the runtime's `multicast.rs`.

use super::{Kind, Registry, VHandle};
use cuda_abi::{CUmulticastObjectProp, handle_type};
use protocol::record::{
    AllocationId, Backing, BindTarget, Blocker, MulticastBinding, MulticastRecord,
};

/// What the shim knows of one multicast object in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McInfo {
    pub id: AllocationId,
    /// `None`: created here; else the namespace PID of the creator its ticket named.
    pub creator: Option<u32>,
    pub size: u64,
    /// The creator's requested properties; zero in an importer (the creator's record has them).
    pub num_devices: u32,
    pub handle_types: u64,
    pub flags: u64,
    pub granularity: u64,
    /// Exported as a POSIX descriptor at least once (sticky; creators only).
    pub shared: bool,
    /// Handle types other than POSIX descriptors it was exported as: refusals.
    pub unsupported_exports: Vec<u32>,
    /// Devices this process added, in order.
    pub devices: Vec<i32>,
    /// How many of `devices` are in the team of the driver object the shim holds now: all of
    /// them while running, none after a capture released it, until the AddDevices step.
    pub added: usize,
    /// Live bindings this process made, in order.
    pub bindings: Vec<Binding>,
}

/// One live binding, as the application made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub device: i32,
    pub mc_offset: u64,
    pub size: u64,
    pub flags: u64,
    pub target: Target,
    /// Made with the `_v2` entry point (an explicit device): replayed the same way.
    pub v2: bool,
    /// Bound in the driver object held now (false between a capture's Release and the Bind step).
    pub live: bool,
}

/// What a binding binds, in the shim's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// An allocation by the application's virtual handle, and an offset into it.
    Memory { handle: VHandle, offset: u64 },
    /// The memory mapped at an address.
    Address { address: u64 },
}

impl McInfo {
    /// A multicast object created here with `prop`.
    pub fn created(id: AllocationId, prop: &CUmulticastObjectProp, granularity: u64) -> McInfo {
        McInfo {
            id,
            creator: None,
            size: prop.size as u64,
            num_devices: prop.numDevices,
            handle_types: prop.handleTypes,
            flags: prop.flags,
            granularity,
            shared: false,
            unsupported_exports: Vec::new(),
            devices: Vec::new(),
            added: 0,
            bindings: Vec::new(),
        }
    }

    /// A multicast object imported through a ticket naming `creator`.
    pub fn imported(id: AllocationId, creator: u32, size: u64) -> McInfo {
        McInfo {
            id,
            creator: Some(creator),
            size,
            num_devices: 0,
            handle_types: 0,
            flags: 0,
            granularity: 0,
            shared: false,
            unsupported_exports: Vec::new(),
            devices: Vec::new(),
            added: 0,
            bindings: Vec::new(),
        }
    }
}

/// Where a binding's bytes come from, resolved against the registry: the record's target and
/// whether the shim owns that memory and the binding lies inside it.
enum Resolved {
    Owned(BindTarget),
    NotOwned(BindTarget),
    OutOfBounds(BindTarget),
}

/// The backing record of an object the shim owns and rebuilds (created or ticket-imported).
fn owned_backing(reg: &Registry, handle: VHandle) -> Option<(Backing, u64)> {
    let o = reg.get(handle)?;
    match &o.kind {
        Kind::Created { id, .. } => Some((Backing::Created(*id), o.size)),
        Kind::Imported { id, .. } => Some((Backing::Imported(*id), o.size)),
        _ => None,
    }
}

fn resolve(reg: &Registry, b: &Binding) -> Resolved {
    match b.target {
        Target::Memory { handle, offset } => {
            // A handle the registry no longer holds names memory the application released while
            // bound (the driver keeps it alive): the shim cannot rebuild it.
            let Some((backing, size)) = owned_backing(reg, handle) else {
                let backing = reg.get(handle).and_then(|o| match o.kind {
                    Kind::Foreign { serial, .. } => Some(Backing::Foreign { serial }),
                    _ => None,
                });
                return Resolved::NotOwned(BindTarget::Memory { backing, offset });
            };
            let target = BindTarget::Memory {
                backing: Some(backing),
                offset,
            };
            if offset.checked_add(b.size).is_none_or(|end| end > size) {
                Resolved::OutOfBounds(target)
            } else {
                Resolved::Owned(target)
            }
        }
        Target::Address { address } => {
            let target = BindTarget::Address { address };
            let Some((start, m)) = reg.mapping_containing(address) else {
                return Resolved::NotOwned(target);
            };
            if owned_backing(reg, m.handle).is_none() {
                return Resolved::NotOwned(target);
            }
            // Replayed by address, so the range must lie in the one mapping found here.
            let end = start.saturating_add(m.size);
            if address.checked_add(b.size).is_none_or(|e| e > end) {
                Resolved::OutOfBounds(target)
            } else {
                Resolved::Owned(target)
            }
        }
    }
}

/// The INSPECT record of one multicast object.
pub fn record(reg: &Registry, ns_pid: u32, info: &McInfo, refs: u32) -> MulticastRecord {
    let mut bindings: Vec<MulticastBinding> = info
        .bindings
        .iter()
        .map(|b| MulticastBinding {
            device: b.device,
            mc_offset: b.mc_offset,
            size: b.size,
            flags: b.flags,
            target: match resolve(reg, b) {
                Resolved::Owned(t) | Resolved::NotOwned(t) | Resolved::OutOfBounds(t) => t,
            },
        })
        .collect();
    bindings.sort_by_key(|b| (b.device, b.mc_offset));
    MulticastRecord {
        id: info.id,
        creator_ns_pid: info.creator.unwrap_or(ns_pid),
        size: info.size,
        num_devices: info.num_devices,
        handle_types: info.handle_types,
        flags: info.flags,
        granularity: info.granularity,
        shared: info.shared,
        devices: info.devices.clone(),
        bindings,
        live_handles: refs,
    }
}

/// What about one multicast object refuses a capture, in a stable order: handle types other than
/// POSIX descriptors, then each binding of memory the shim does not own or out of bounds.
pub fn blockers(reg: &Registry, info: &McInfo) -> Vec<Blocker> {
    let mut out = Vec::new();
    let other_types = info.handle_types & !u64::from(handle_type::POSIX_FILE_DESCRIPTOR);
    let exported: u64 = info
        .unsupported_exports
        .iter()
        .fold(0, |acc, &t| acc | u64::from(t));
    if other_types | exported != 0 {
        out.push(Blocker::MulticastHandleType {
            id: info.id,
            handle_types: info.handle_types | exported,
        });
    }
    let mut bindings = info.bindings.clone();
    bindings.sort_by_key(|b| (b.device, b.mc_offset));
    for b in &bindings {
        let past_object = b
            .mc_offset
            .checked_add(b.size)
            .is_none_or(|e| e > info.size);
        match resolve(reg, b) {
            Resolved::NotOwned(_) => out.push(Blocker::MulticastForeignMemory {
                id: info.id,
                device: b.device,
                mc_offset: b.mc_offset,
            }),
            Resolved::OutOfBounds(_) => out.push(Blocker::MulticastOutOfBounds {
                id: info.id,
                device: b.device,
                mc_offset: b.mc_offset,
                size: b.size,
            }),
            Resolved::Owned(_) if past_object => out.push(Blocker::MulticastOutOfBounds {
                id: info.id,
                device: b.device,
                mc_offset: b.mc_offset,
                size: b.size,
            }),
            Resolved::Owned(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::props;
    use cuda::DriverHandle;

    fn mc_prop(handle_types: u64) -> CUmulticastObjectProp {
        CUmulticastObjectProp {
            numDevices: 2,
            size: 8 << 20,
            handleTypes: handle_types,
            flags: 0,
        }
    }

    fn created(n: u8) -> Kind {
        Kind::Created {
            id: AllocationId([n; 16]),
            shared: true,
            unsupported_exports: Vec::new(),
        }
    }

    fn binding(device: i32, mc_offset: u64, size: u64, target: Target) -> Binding {
        Binding {
            device,
            mc_offset,
            size,
            flags: 0,
            target,
            v2: false,
            live: true,
        }
    }

    #[test]
    fn records_and_refusals_follow_the_bindings() {
        let mut r = Registry::new();
        let mem = r.insert(created(1), 4 << 20, props(0), DriverHandle::from_raw(0x10));
        r.insert_mapping(0x4000_0000, 4 << 20, 0, mem);
        let native = r.insert(
            Kind::Native,
            2 << 20,
            props(1),
            DriverHandle::from_raw(0x20),
        );
        r.insert_mapping(0x5000_0000, 2 << 20, 0, native);
        let mut info = McInfo::created(
            AllocationId([9; 16]),
            &mc_prop(handle_type::POSIX_FILE_DESCRIPTOR.into()),
            2 << 20,
        );
        info.devices = vec![0, 1];
        // Owned, by memory and by address: nothing refuses.
        info.bindings = vec![
            binding(
                0,
                0,
                2 << 20,
                Target::Memory {
                    handle: mem,
                    offset: 2 << 20,
                },
            ),
            binding(
                0,
                2 << 20,
                2 << 20,
                Target::Address {
                    address: 0x4000_0000,
                },
            ),
        ];
        let id = info.id;
        assert_eq!(blockers(&r, &info), vec![]);
        let rec = record(&r, 7, &info, 1);
        assert_eq!(rec.creator_ns_pid, 7);
        assert_eq!(
            rec.bindings.iter().map(|b| b.target).collect::<Vec<_>>(),
            vec![
                BindTarget::Memory {
                    backing: Some(Backing::Created(AllocationId([1; 16]))),
                    offset: 2 << 20
                },
                BindTarget::Address {
                    address: 0x4000_0000
                },
            ]
        );
        // Memory the shim does not own; a range past its mapping; past the member; past the object.
        info.bindings = vec![
            binding(
                1,
                0,
                2 << 20,
                Target::Address {
                    address: 0x5000_0000,
                },
            ),
            binding(
                0,
                0,
                4 << 20,
                Target::Address {
                    address: 0x4000_0000 + (2 << 20),
                },
            ),
            binding(
                2,
                0,
                4 << 20,
                Target::Memory {
                    handle: mem,
                    offset: 2 << 20,
                },
            ),
            binding(
                3,
                6 << 20,
                4 << 20,
                Target::Memory {
                    handle: mem,
                    offset: 0,
                },
            ),
        ];
        assert_eq!(
            blockers(&r, &info),
            vec![
                Blocker::MulticastOutOfBounds {
                    id,
                    device: 0,
                    mc_offset: 0,
                    size: 4 << 20
                },
                Blocker::MulticastForeignMemory {
                    id,
                    device: 1,
                    mc_offset: 0
                },
                Blocker::MulticastOutOfBounds {
                    id,
                    device: 2,
                    mc_offset: 0,
                    size: 4 << 20
                },
                Blocker::MulticastOutOfBounds {
                    id,
                    device: 3,
                    mc_offset: 6 << 20,
                    size: 4 << 20
                },
            ]
        );
    }

    #[test]
    fn handle_types_other_than_posix_are_refused() {
        let r = Registry::new();
        let fabric = u64::from(handle_type::FABRIC);
        let posix = u64::from(handle_type::POSIX_FILE_DESCRIPTOR);
        let info = McInfo::created(AllocationId([3; 16]), &mc_prop(posix | fabric), 0);
        assert_eq!(
            blockers(&r, &info).first(),
            Some(&Blocker::MulticastHandleType {
                id: AllocationId([3; 16]),
                handle_types: posix | fabric
            })
        );
        let mut exported = McInfo::created(AllocationId([4; 16]), &mc_prop(posix), 0);
        assert_eq!(blockers(&r, &exported), vec![]);
        exported.unsupported_exports.push(handle_type::FABRIC);
        assert_eq!(
            blockers(&r, &exported).first(),
            Some(&Blocker::MulticastHandleType {
                id: AllocationId([4; 16]),
                handle_types: posix | fabric
            })
        );
    }
}
