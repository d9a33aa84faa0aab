//! Multicast objects: bookkeeping (devices, bindings) plus a memfd backing so a multicast
//! handle can be mapped with `cuMemMap` and shared like an allocation. Writes through a multicast
//! mapping land in that backing only; the fake does not broadcast them to the bound memory.
//! Multicast is only ever exercised on this fake (never on a real GPU).
//!
//! Errors: multicast disabled (`FAKE_CUDA_MULTICAST=0`): `CUDA_ERROR_NOT_SUPPORTED`; a device
//! that does not exist: `CUDA_ERROR_INVALID_DEVICE`; everything else invalid (sizes, offsets,
//! unknown or non-multicast handles, a device added twice or beyond `numDevices`, a binding of
//! memory on a device not added, overlapping bindings, an unbind matching no binding):
//! `CUDA_ERROR_INVALID_VALUE`.

use std::ffi::c_ulonglong;

use cuda_abi::{
    CUdevice, CUdeviceptr, CUmemGenericAllocationHandle, CUmulticastObjectProp, CUresult,
};

use crate::memory::vmm::check_handle_types;
use crate::memory::{Backing, BackingKind, GRANULARITY, Object, Origin, Trailer, new_handle};
use crate::state::{self, Driver};
use crate::{Res, read_in, write_out};

/// One binding of memory to a multicast object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Binding {
    pub device: usize,
    pub mc_offset: u64,
    pub size: u64,
    pub mem: u64,
    pub mem_offset: u64,
}

#[derive(Debug)]
pub(crate) struct Multicast {
    pub num_devices: u32,
    pub devices: Vec<usize>,
    pub bindings: Vec<Binding>,
}

impl Multicast {
    pub(crate) fn new(num_devices: u32) -> Multicast {
        Multicast {
            num_devices,
            devices: Vec::new(),
            bindings: Vec::new(),
        }
    }
}

fn aligned(v: u64) -> bool {
    v.is_multiple_of(GRANULARITY)
}

fn enabled(d: &Driver) -> Res {
    if d.config.multicast {
        Ok(())
    } else {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
}

fn multicast_mut(d: &mut Driver, handle: u64) -> Res<(&mut Multicast, u64)> {
    let obj = d
        .mem
        .objects
        .get_mut(&handle)
        .filter(|o| o.handle_refs > 0)
        .ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let size = obj.backing.size;
    obj.multicast
        .as_mut()
        .map(|m| (m, size))
        .ok_or(CUresult::ERROR_INVALID_VALUE)
}

/// Validates multicast properties (shared by create and granularity).
fn check_prop(d: &Driver, prop: &CUmulticastObjectProp) -> Res<u32> {
    if prop.flags != 0 || prop.numDevices == 0 || prop.numDevices as usize > d.devices.len() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let types = u32::try_from(prop.handleTypes).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
    check_handle_types(d, types)?;
    Ok(types)
}

pub(crate) unsafe fn get_granularity(
    granularity: *mut usize,
    prop: *const CUmulticastObjectProp,
    option: u32,
) -> Res {
    if granularity.is_null() || option > 1 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a readable CUmulticastObjectProp (null refused).
    let prop = unsafe { read_in(prop) }?;
    state::with(|d| {
        enabled(d)?;
        check_prop(d, &prop).map(|_| ())
    })?;
    // SAFETY: checked non-null; the caller passes a writable size_t.
    unsafe { write_out(granularity, GRANULARITY as usize) }
}

pub(crate) unsafe fn create(
    handle: *mut CUmemGenericAllocationHandle,
    prop: *const CUmulticastObjectProp,
) -> Res {
    if handle.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a readable CUmulticastObjectProp (null refused).
    let prop = unsafe { read_in(prop) }?;
    let h = state::with(|d| {
        enabled(d)?;
        let types = check_prop(d, &prop)?;
        let size = prop.size as u64;
        if size == 0 || !aligned(size) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let h = new_handle(d);
        // For a multicast backing the trailer's device field carries numDevices.
        let trailer = Trailer {
            kind: BackingKind::Multicast,
            size,
            device: prop.numDevices,
            handle_types: types,
            creator_pid: d.pid as u32,
            alloc_id: h,
            creator_start: d.start_token,
        };
        let backing = Backing::create(trailer).map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        d.mem.objects.insert(
            h,
            Object {
                backing,
                origin: Origin::Created,
                device: 0,
                handle_types: types,
                alloc_flags: Default::default(),
                handle_refs: 1,
                users: 0,
                charged: 0,
                multicast: Some(Multicast::new(prop.numDevices)),
            },
        );
        Ok(h)
    })?;
    // SAFETY: checked non-null; the caller passes a writable handle.
    unsafe { write_out(handle, h) }
}

pub(crate) fn add_device(handle: CUmemGenericAllocationHandle, dev: CUdevice) -> Res {
    state::with(|d| {
        enabled(d)?;
        let device = d.device(dev)?;
        let (mc, _) = multicast_mut(d, handle)?;
        if mc.devices.contains(&device) || mc.devices.len() >= mc.num_devices as usize {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        mc.devices.push(device);
        Ok(())
    })
}

fn bind(
    d: &mut Driver,
    mc_handle: u64,
    mc_offset: u64,
    mem: u64,
    mem_offset: u64,
    size: u64,
) -> Res {
    if size == 0 || !aligned(mc_offset) || !aligned(mem_offset) || !aligned(size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let (device, mem_size) = {
        let obj = d
            .mem
            .objects
            .get(&mem)
            .filter(|o| o.handle_refs > 0 && o.multicast.is_none())
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        (obj.device, obj.backing.size)
    };
    if mem_offset.checked_add(size).is_none_or(|e| e > mem_size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let (mc, mc_size) = multicast_mut(d, mc_handle)?;
    if mc_offset.checked_add(size).is_none_or(|e| e > mc_size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if !mc.devices.contains(&device) {
        return Err(CUresult::ERROR_INVALID_DEVICE);
    }
    let overlaps = mc.bindings.iter().any(|b| {
        b.device == device && b.mc_offset < mc_offset + size && mc_offset < b.mc_offset + b.size
    });
    if overlaps {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    mc.bindings.push(Binding {
        device,
        mc_offset,
        size,
        mem,
        mem_offset,
    });
    if let Some(obj) = d.mem.objects.get_mut(&mem) {
        obj.users += 1;
    }
    Ok(())
}

pub(crate) fn bind_mem(
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> Res {
    if flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        enabled(d)?;
        bind(d, mc, mc_offset as u64, mem, mem_offset as u64, size as u64)
    })
}

pub(crate) fn bind_addr(
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    ptr: CUdeviceptr,
    size: usize,
    flags: c_ulonglong,
) -> Res {
    if flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        enabled(d)?;
        // The range must lie in one mapping piece: its handle and offset are what gets bound.
        let (&s, p) = d
            .mem
            .pieces
            .range(..=ptr)
            .next_back()
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let end = ptr
            .checked_add(size as u64)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if end > s + p.size {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let (mem, mem_offset) = (p.handle, p.offset + (ptr - s));
        bind(d, mc, mc_offset as u64, mem, mem_offset, size as u64)
    })
}

pub(crate) fn unbind(
    handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> Res {
    state::with(|d| {
        enabled(d)?;
        let device = d.device(dev)?;
        let (mc, _) = multicast_mut(d, handle)?;
        let at = mc
            .bindings
            .iter()
            .position(|b| {
                b.device == device && b.mc_offset == mc_offset as u64 && b.size == size as u64
            })
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let b = mc.bindings.remove(at);
        if let Some(obj) = d.mem.objects.get_mut(&b.mem) {
            obj.users = obj.users.saturating_sub(1);
        }
        crate::memory::collect(d, b.mem);
        Ok(())
    })
}
