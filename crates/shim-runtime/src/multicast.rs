//! Multicast objects: what the shim records of each (`cuMulticastCreate`, POSIX-descriptor export
//! and import through tickets, `cuMulticastAddDevice`, `cuMulticastBindMem`/`BindAddr` and their
//! `_v2`, `cuMulticastUnbind`; `cuMemMap` of a multicast handle is an ordinary mapping record), the
//! records INSPECT reports, and what refuses a capture.
//!
//! The multicast calls run without the state lock around the driver call: a bind or a map can wait
//! for the whole team on the real driver (the last device added in another process). Each records
//! what succeeded afterwards, under the lock.
//!
//! The team is the object's, shared by every holder, so completeness (`numDevices` devices added
//! over the group) is a group-wide check the tool makes on the records (`control::group`); a
//! process reports the devices IT added, by its local ordinals.

use crate::log::log_warn;
use crate::phases::{PhaseError, check};
use crate::registry::{Kind, Mapping, Registry, UNKNOWN_PROPS, VHandle};
use crate::runtime::Runtime;
use crate::track::Tracked;
use cuda::{CudaError, DriverHandle};
use cuda_abi::*;
use protocol::MulticastStep;
use protocol::record::{
    AllocationId, Backing, BindTarget, Blocker, MulticastBinding, MulticastRecord, Phase,
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

fn code(e: CudaError) -> CUresult {
    e.result
}

impl Runtime {
    /// `cuMulticastCreate`. The recommended granularity is asked of the driver for the record
    /// (this runs only because the application itself made a multicast object).
    pub fn multicast_create(&self, prop: &CUmulticastObjectProp) -> Tracked<VHandle> {
        let _pass = self.gate.enter();
        let got = self.real.multicast_create(prop).map_err(code)?;
        let granularity = match self
            .real
            .multicast_granularity(prop, granularity_flags::RECOMMENDED)
        {
            Ok(g) => g as u64,
            Err(e) => {
                log_warn!("cuMulticastGetGranularity for the record failed: {e}");
                0
            }
        };
        let id = match crate::fdutil::random_id() {
            Ok(id) => id,
            Err(e) => {
                log_warn!("cuMulticastCreate: no random object id ({e}); object undone");
                if let Err(e) = self.real.mem_release(got) {
                    log_warn!("cuMulticastCreate: the object was not released: {e}");
                }
                return Err(CUresult::ERROR_OPERATING_SYSTEM);
            }
        };
        let size = prop.size as u64;
        let info = McInfo::created(id, prop, granularity);
        Ok(self
            .lock()
            .insert(Kind::Multicast(Box::new(info)), size, UNKNOWN_PROPS, got))
    }

    /// The driver handle of a multicast object (translation only; the call runs unlocked).
    fn multicast_real(&self, handle: VHandle) -> Tracked<DriverHandle> {
        let reg = self.lock();
        reg.get(handle)
            .filter(|o| matches!(o.kind, Kind::Multicast(_)))
            .and_then(|o| o.real)
            .ok_or(CUresult::ERROR_INVALID_VALUE)
    }

    /// Records a change to a multicast object that the driver accepted.
    fn with_multicast(&self, handle: VHandle, change: impl FnOnce(&mut McInfo)) {
        if let Some(Kind::Multicast(info)) = self.lock().get_mut(handle).map(|o| &mut o.kind) {
            change(info);
        }
    }

    /// `cuMulticastAddDevice`.
    pub fn multicast_add_device(&self, handle: VHandle, dev: CUdevice) -> Tracked {
        let _pass = self.gate.enter();
        let real = self.multicast_real(handle)?;
        self.real.multicast_add_device(real, dev).map_err(code)?;
        self.lock().note_device(dev);
        self.with_multicast(handle, |info| {
            info.devices.push(dev);
            info.added = info.devices.len();
        });
        Ok(())
    }

    /// Translates the (multicast, memory) pair of a bind, with the memory's device (what a
    /// binding without a device argument binds).
    fn bind_pair(&self, mc: VHandle, mem: VHandle) -> Tracked<(DriverHandle, DriverHandle, i32)> {
        let mc = self.multicast_real(mc)?;
        let reg = self.lock();
        let o = reg.get(mem).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let real = o.real.ok_or(CUresult::ERROR_INVALID_VALUE)?;
        Ok((mc, real, o.props.location_id))
    }

    fn record_binding(&self, mc: VHandle, binding: Binding) {
        self.with_multicast(mc, |info| info.bindings.push(binding));
    }

    /// `cuMulticastBindMem`.
    pub fn multicast_bind_mem(
        &self,
        mc: VHandle,
        mc_offset: usize,
        mem: VHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> Tracked {
        let _pass = self.gate.enter();
        let (mc_real, mem_real, device) = self.bind_pair(mc, mem)?;
        self.real
            .multicast_bind_mem(mc_real, mc_offset, mem_real, mem_offset, size, flags)
            .map_err(code)?;
        self.record_binding(
            mc,
            Binding {
                device,
                mc_offset: mc_offset as u64,
                size: size as u64,
                flags,
                target: Target::Memory {
                    handle: mem,
                    offset: mem_offset as u64,
                },
                v2: false,
                live: true,
            },
        );
        Ok(())
    }

    /// `cuMulticastBindMem_v2`.
    #[allow(clippy::too_many_arguments)]
    pub fn multicast_bind_mem_v2(
        &self,
        mc: VHandle,
        dev: CUdevice,
        mc_offset: usize,
        mem: VHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> Tracked {
        let _pass = self.gate.enter();
        let (mc_real, mem_real, _) = self.bind_pair(mc, mem)?;
        self.real
            .multicast_bind_mem_v2(mc_real, dev, mc_offset, mem_real, mem_offset, size, flags)
            .map_err(code)?;
        self.record_binding(
            mc,
            Binding {
                device: dev,
                mc_offset: mc_offset as u64,
                size: size as u64,
                flags,
                target: Target::Memory {
                    handle: mem,
                    offset: mem_offset as u64,
                },
                v2: true,
                live: true,
            },
        );
        Ok(())
    }

    /// The device of the memory mapped at `ptr` (what `cuMulticastBindAddr` binds), as recorded.
    fn device_at(&self, ptr: CUdeviceptr) -> i32 {
        let reg = self.lock();
        reg.mapping_at(ptr)
            .and_then(|h| reg.get(h))
            .map_or(0, |o| o.props.location_id)
    }

    /// `cuMulticastBindAddr`.
    pub fn multicast_bind_addr(
        &self,
        mc: VHandle,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: u64,
    ) -> Tracked {
        let _pass = self.gate.enter();
        let real = self.multicast_real(mc)?;
        self.real
            .multicast_bind_addr(real, mc_offset, ptr, size, flags)
            .map_err(code)?;
        let device = self.device_at(ptr);
        self.record_binding(
            mc,
            Binding {
                device,
                mc_offset: mc_offset as u64,
                size: size as u64,
                flags,
                target: Target::Address { address: ptr },
                v2: false,
                live: true,
            },
        );
        Ok(())
    }

    /// `cuMulticastBindAddr_v2`.
    pub fn multicast_bind_addr_v2(
        &self,
        mc: VHandle,
        dev: CUdevice,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: u64,
    ) -> Tracked {
        let _pass = self.gate.enter();
        let real = self.multicast_real(mc)?;
        self.real
            .multicast_bind_addr_v2(real, dev, mc_offset, ptr, size, flags)
            .map_err(code)?;
        self.record_binding(
            mc,
            Binding {
                device: dev,
                mc_offset: mc_offset as u64,
                size: size as u64,
                flags,
                target: Target::Address { address: ptr },
                v2: true,
                live: true,
            },
        );
        Ok(())
    }

    /// `cuMulticastUnbind`: the driver unbinds the binding of `dev` at exactly this offset and
    /// size, and so does the record.
    pub fn multicast_unbind(
        &self,
        mc: VHandle,
        dev: CUdevice,
        mc_offset: usize,
        size: usize,
    ) -> Tracked {
        let _pass = self.gate.enter();
        let real = self.multicast_real(mc)?;
        self.real
            .multicast_unbind(real, dev, mc_offset, size)
            .map_err(code)?;
        self.with_multicast(mc, |info| {
            if let Some(at) = info.bindings.iter().position(|b| {
                b.device == dev && b.mc_offset == mc_offset as u64 && b.size == size as u64
            }) {
                info.bindings.remove(at);
            }
        });
        Ok(())
    }
}

/// One multicast object as a capture or rebuild step sees it.
struct Item {
    handle: VHandle,
    info: McInfo,
    real: Option<DriverHandle>,
    mappings: Vec<(u64, Mapping)>,
}

impl Runtime {
    /// The multicast objects of the process, by handle.
    fn multicast_items(&self) -> Vec<Item> {
        let reg = self.lock();
        let mut v: Vec<Item> = reg
            .objects()
            .filter_map(|(handle, o)| match &o.kind {
                Kind::Multicast(info) => Some(Item {
                    handle,
                    info: (**info).clone(),
                    real: o.real,
                    mappings: reg.mappings_of(handle),
                }),
                _ => None,
            })
            .collect();
        v.sort_by_key(|i| i.handle);
        v
    }

    /// Release's multicast part, first in Release (after Save has copied the members' bytes, and
    /// before any member is released): per object, its cached export is closed, its mappings are
    /// unmapped, its bindings unbound and its driver handle released. Each step is recorded as it
    /// is done, so a failure half way leaves exactly the rest for the rebuild steps to skip.
    pub(crate) fn release_multicasts(&self) -> Result<u64, PhaseError> {
        for item in self.multicast_items() {
            let id = item.info.id;
            if item.info.creator.is_none() {
                self.exports.remove(&id);
            }
            for (address, m) in item.mappings.iter().filter(|(_, m)| m.mapped) {
                check(
                    || format!("multicast mapping at {address:#x}"),
                    self.real.mem_unmap(*address, m.size as usize),
                )?;
                self.lock().set_mapped(*address, false);
            }
            let Some(real) = item.real else { continue };
            for (index, b) in item.info.bindings.iter().enumerate() {
                if !b.live {
                    continue;
                }
                check(
                    || format!("multicast object {id} on device {}", b.device),
                    self.real.multicast_unbind(
                        real,
                        b.device,
                        b.mc_offset as usize,
                        b.size as usize,
                    ),
                )?;
                self.with_multicast(item.handle, |info| {
                    if let Some(b) = info.bindings.get_mut(index) {
                        b.live = false;
                    }
                });
            }
            check(
                || format!("multicast object {id}"),
                self.real.mem_release(real),
            )?;
            let mut reg = self.lock();
            reg.set_real(item.handle, None);
            if let Some(Kind::Multicast(info)) = reg.get_mut(item.handle).map(|o| &mut o.kind) {
                info.added = 0;
            }
        }
        Ok(0)
    }

    /// One step of the multicast rebuild ([`MulticastStep`]), after Import. Each step does only
    /// what is not live, so the tool may send the steps again after a failure.
    pub(crate) fn multicast_step(&self, step: MulticastStep) -> Result<u64, PhaseError> {
        let phase = self.lock().phase();
        if phase != Phase::Imported {
            return Err(PhaseError::WrongPhase {
                request: step.name(),
                phase,
            });
        }
        for item in self.multicast_items() {
            match step {
                MulticastStep::Create => self.recreate(&item)?,
                MulticastStep::Import => self.reimport(&item)?,
                MulticastStep::AddDevices => self.add_devices_again(&item)?,
                MulticastStep::Bind => self.bind_again(&item)?,
            }
        }
        Ok(0)
    }

    /// Create: a multicast object created here is created again with its recorded properties,
    /// and exported into the export cache if it was shared (its importers fetch it next).
    fn recreate(&self, item: &Item) -> Result<(), PhaseError> {
        let info = &item.info;
        if info.creator.is_some() {
            return Ok(());
        }
        let (real, fresh) = match item.real {
            Some(real) => (real, false),
            None => {
                let prop = CUmulticastObjectProp {
                    numDevices: info.num_devices,
                    size: info.size as usize,
                    handleTypes: info.handle_types,
                    flags: info.flags,
                };
                let made = check(
                    || format!("multicast object {}", info.id),
                    self.real.multicast_create(&prop),
                )?;
                (made, true)
            }
        };
        if info.shared && !self.exports.contains(&info.id) {
            match check(
                || format!("multicast object {}", info.id),
                self.real.mem_export_fd(real, 0),
            ) {
                Ok(fd) => self.exports.insert(info.id, fd),
                Err(e) => {
                    if fresh {
                        self.release_unpublished([real]);
                    }
                    return Err(e);
                }
            }
        }
        self.publish(item.handle, real, fresh);
        Ok(())
    }

    /// Import: a multicast object imported through a ticket is fetched again from its creator
    /// (which has created and exported it in the Create step) and imported.
    fn reimport(&self, item: &Item) -> Result<(), PhaseError> {
        let (Some(creator), None) = (item.info.creator, item.real) else {
            return Ok(());
        };
        let id = item.info.id;
        let fd = self.fetch_fd(creator, id)?;
        let got = check(
            || format!("multicast object {id} of {creator}"),
            self.real.mem_import_fd(std::os::fd::AsFd::as_fd(&fd)),
        )?;
        drop(fd);
        self.publish(item.handle, got, true);
        Ok(())
    }

    /// Points the application's handle at a rebuilt driver object (whose team is empty).
    fn publish(&self, handle: VHandle, real: DriverHandle, fresh: bool) {
        let mut reg = self.lock();
        reg.set_real(handle, Some(real));
        if fresh && let Some(Kind::Multicast(info)) = reg.get_mut(handle).map(|o| &mut o.kind) {
            info.added = 0;
        }
    }

    /// AddDevices: the devices this process had added, in their order.
    fn add_devices_again(&self, item: &Item) -> Result<(), PhaseError> {
        let Some(real) = item.real else {
            return Err(PhaseError::NotRebuilt(format!(
                "multicast object {} is not rebuilt; send the Create and Import steps first",
                item.info.id
            )));
        };
        for &dev in item.info.devices.iter().skip(item.info.added) {
            check(
                || format!("multicast object {} on device {dev}", item.info.id),
                self.real.multicast_add_device(real, dev),
            )?;
            self.with_multicast(item.handle, |info| info.added += 1);
        }
        Ok(())
    }

    /// Bind: every binding again (the members are rebuilt by Load and Import, and the team is
    /// complete in every process), then the multicast mappings at their addresses with their
    /// access.
    fn bind_again(&self, item: &Item) -> Result<(), PhaseError> {
        let id = item.info.id;
        let Some(real) = item
            .real
            .filter(|_| item.info.added == item.info.devices.len())
        else {
            return Err(PhaseError::NotRebuilt(format!(
                "multicast object {id} has not its devices added; send the AddDevices step first"
            )));
        };
        for (index, b) in item.info.bindings.iter().enumerate() {
            if b.live {
                continue;
            }
            let (mc_offset, size) = (b.mc_offset as usize, b.size as usize);
            let what = || format!("multicast object {id} on device {}", b.device);
            match b.target {
                Target::Memory { handle, offset } => {
                    let Some(mem) = self.lock().real_of(handle) else {
                        return Err(PhaseError::NotRebuilt(format!(
                            "memory bound to multicast object {id} is not rebuilt"
                        )));
                    };
                    let offset = offset as usize;
                    let bound = if b.v2 {
                        self.real.multicast_bind_mem_v2(
                            real, b.device, mc_offset, mem, offset, size, b.flags,
                        )
                    } else {
                        self.real
                            .multicast_bind_mem(real, mc_offset, mem, offset, size, b.flags)
                    };
                    check(what, bound)?;
                }
                Target::Address { address } => {
                    let bound = if b.v2 {
                        self.real.multicast_bind_addr_v2(
                            real, b.device, mc_offset, address, size, b.flags,
                        )
                    } else {
                        self.real
                            .multicast_bind_addr(real, mc_offset, address, size, b.flags)
                    };
                    check(what, bound)?;
                }
            }
            self.with_multicast(item.handle, |info| {
                if let Some(b) = info.bindings.get_mut(index) {
                    b.live = true;
                }
            });
        }
        let unmapped: Vec<(u64, Mapping)> = item
            .mappings
            .iter()
            .filter(|(_, m)| !m.mapped)
            .cloned()
            .collect();
        let mapped = self.map_recorded(real, &unmapped)?;
        let mut reg = self.lock();
        for address in mapped {
            reg.set_mapped(address, true);
        }
        Ok(())
    }

    /// Multicast objects a capture released and the rebuild steps have not brought back whole:
    /// what keeps Thaw from letting the application run.
    pub(crate) fn multicasts_not_rebuilt(&self) -> Vec<String> {
        self.multicast_items()
            .into_iter()
            .filter(|item| {
                let info = &item.info;
                item.real.is_none()
                    || info.added < info.devices.len()
                    || info.bindings.iter().any(|b| !b.live)
                    || item.mappings.iter().any(|(_, m)| !m.mapped)
                    || (info.creator.is_none() && info.shared && !self.exports.contains(&info.id))
            })
            .map(|item| format!("multicast object {}", item.info.id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use cuda::DriverHandle;
    use protocol::record::AllocationProps;

    fn props(device: i32) -> AllocationProps {
        AllocationProps {
            allocation_type: 1,
            requested_handle_types: 1,
            location_type: location_type::DEVICE,
            location_id: device,
            ..UNKNOWN_PROPS
        }
    }

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
