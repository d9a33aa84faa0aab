//! Multicast objects: the tracked calls (`cuMulticastCreate`, POSIX-descriptor export and import
//! through tickets, `cuMulticastAddDevice`, `cuMulticastBindMem`/`BindAddr` and their `_v2`,
//! `cuMulticastUnbind`; `cuMemMap` of a multicast handle is an ordinary mapping record) and the
//! capture's steps for them (Release, and the four rebuild steps after Import). What the shim
//! records of each object, what INSPECT reports and what refuses a capture are the registry's
//! (`registry::multicast`).
//!
//! The multicast calls run without the state lock around the driver call: a bind or a map can wait
//! for the whole team on the real driver (the last device added in another process). Each records
//! what succeeded afterwards, under the lock.
//!
//! The team is the object's, shared by every holder, so completeness (`numDevices` devices added
//! over the group) is a group-wide check the tool makes on the records (`control::group`); a
//! process reports the devices IT added, by its local ordinals.
//!
//! State: none of its own. A multicast object is a record of the registry (`Kind::Multicast`), so
//! its calls and capture steps are methods of [`Tracking`].

use crate::capture::{PhaseError, check};
use crate::log::log_warn;
use crate::registry::multicast::{Binding, McInfo, Target};
use crate::registry::{Kind, Mapping, UNKNOWN_PROPS, VHandle};
use crate::track::{Tracked, Tracking};
use cuda::{CudaError, DriverHandle};
use cuda_abi::*;
use protocol::MulticastStep;
use protocol::record::Phase;

fn code(e: CudaError) -> CUresult {
    e.result
}

impl Tracking {
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
    pub(crate) fn with_multicast(&self, handle: VHandle, change: impl FnOnce(&mut McInfo)) {
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

impl Tracking {
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
