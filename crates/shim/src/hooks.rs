//! The FFI boundary: one hook per wrapped entry point, with the driver's C arguments. A hook
//! dispatches (no runtime: the driver's own function; a forked child: refused), reads the
//! application's input pointers, calls the runtime's tracked call with Rust values, and writes
//! what it returns through the application's out-pointers, only on success.
//!
//! A null pointer the runtime would need is never read: such a call goes to the driver unchanged
//! (which reports it with its own code) and nothing is recorded, as the driver did nothing.

#![allow(unsafe_code)] // reads and writes the application's pointers
#![allow(clippy::too_many_arguments)]
#![allow(non_snake_case)] // hooks carry the driver's symbol names

use core::ffi::{c_int, c_uint, c_ulonglong, c_void};
use cuda::{DriverTable, ForeignPtr, VirtualHandle};
use cuda_abi::{
    CUcontext, CUdevice, CUdeviceptr, CUipcMemHandle, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmulticastObjectProp, CUresult, CUstream, handle_type,
};
use shim_runtime::owned_alloc::PointerValue;
use shim_runtime::runtime::{Active, Runtime, active};
use shim_runtime::track::{ExportTo, Tracked};
use shim_runtime::unowned::UnownedKind;
use std::os::fd::{BorrowedFd, IntoRawFd};

/// Dispatch: the runtime's tracked call, the driver (no runtime), or a refusal (forked child).
macro_rules! dispatch {
    ($real:ident . $pfn:ident ( $($arg:expr),* ), |$rt:ident| $tracked:expr) => {
        match active() {
            Active::Running($rt) => $tracked,
            // SAFETY: the caller's arguments, unchanged, under the caller's contract.
            Active::Off => unsafe { ($real.$pfn)($($arg),*) },
            Active::Forked => CUresult::ERROR_NOT_INITIALIZED,
        }
    };
}

/// The C result of a tracked call, after `write` stored its value.
fn answer<T>(r: Tracked<T>, write: impl FnOnce(T)) -> CUresult {
    match r {
        Ok(value) => {
            write(value);
            CUresult::SUCCESS
        }
        Err(code) => code,
    }
}

fn done(r: Tracked) -> CUresult {
    answer(r, |()| {})
}

pub(crate) unsafe fn cuInit(real: &'static DriverTable, flags: c_uint) -> CUresult {
    // SAFETY: no pointers.
    let r = unsafe { (real.cuInit)(flags) };
    if r.is_success() {
        crate::process::register_fork_handler();
        if shim_runtime::runtime::start_after_init(real) {
            crate::process::register_socket_removal();
        }
    }
    r
}

pub(crate) unsafe fn cuMemCreate(
    real: &'static DriverTable,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(real.cuMemCreate(handle, size, prop, flags), |rt| {
        // SAFETY: the driver's contract: `prop` is null or a readable property struct.
        let Some(p) = (unsafe { prop.as_ref() }) else {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuMemCreate)(handle, size, prop, flags) };
        };
        if handle.is_null() {
            // SAFETY: as above.
            return unsafe { (real.cuMemCreate)(handle, size, prop, flags) };
        }
        // SAFETY: `handle` is non-null and writable (the driver's contract).
        answer(rt.mem_create(size, p, flags), |vh| unsafe {
            handle.write(vh.0)
        })
    })
}

pub(crate) unsafe fn cuMemRelease(
    real: &'static DriverTable,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    dispatch!(real.cuMemRelease(handle), |rt| done(
        rt.mem_release(VirtualHandle(handle))
    ))
}

pub(crate) unsafe fn cuMemAddressReserve(
    real: &'static DriverTable,
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(
        real.cuMemAddressReserve(ptr, size, alignment, addr, flags),
        |rt| {
            if ptr.is_null() {
                // SAFETY: as the caller gave them; the driver reports the null.
                return unsafe { (real.cuMemAddressReserve)(ptr, size, alignment, addr, flags) };
            }
            answer(rt.mem_address_reserve(size, alignment, addr, flags), |va| {
                // SAFETY: non-null and writable (the driver's contract).
                unsafe { ptr.write(va) }
            })
        }
    )
}

pub(crate) unsafe fn cuMemAddressFree(
    real: &'static DriverTable,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    dispatch!(real.cuMemAddressFree(ptr, size), |rt| done(
        rt.mem_address_free(ptr, size)
    ))
}

pub(crate) unsafe fn cuMemMap(
    real: &'static DriverTable,
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(real.cuMemMap(ptr, size, offset, handle, flags), |rt| done(
        rt.mem_map(ptr, size, offset, VirtualHandle(handle), flags)
    ))
}

pub(crate) unsafe fn cuMemUnmap(
    real: &'static DriverTable,
    ptr: CUdeviceptr,
    size: usize,
) -> CUresult {
    dispatch!(real.cuMemUnmap(ptr, size), |rt| done(
        rt.mem_unmap(ptr, size)
    ))
}

pub(crate) unsafe fn cuMemSetAccess(
    real: &'static DriverTable,
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    dispatch!(real.cuMemSetAccess(ptr, size, desc, count), |rt| {
        if desc.is_null() {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuMemSetAccess)(ptr, size, desc, count) };
        }
        // SAFETY: the driver's contract: `desc` points at `count` readable descriptors.
        let descs = unsafe { core::slice::from_raw_parts(desc, count) };
        done(rt.mem_set_access(ptr, size, descs))
    })
}

pub(crate) unsafe fn cuMemRetainAllocationHandle(
    real: &'static DriverTable,
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    dispatch!(real.cuMemRetainAllocationHandle(handle, addr), |rt| {
        if handle.is_null() {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuMemRetainAllocationHandle)(handle, addr) };
        }
        // `addr` is a device address in a `void*`, never dereferenced.
        answer(rt.mem_retain_any(addr as usize as CUdeviceptr), |vh| {
            // SAFETY: non-null and writable (the driver's contract).
            unsafe { handle.write(vh.0) }
        })
    })
}

pub(crate) unsafe fn cuMemGetAllocationPropertiesFromHandle(
    real: &'static DriverTable,
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    dispatch!(
        real.cuMemGetAllocationPropertiesFromHandle(prop, handle),
        |rt| {
            if prop.is_null() {
                // The handle is the application's virtual one: translate it, let the driver report.
                return match rt.driver_handle(VirtualHandle(handle)) {
                    // SAFETY: the caller's out-pointer with the driver's handle.
                    Some(h) => unsafe {
                        (real.cuMemGetAllocationPropertiesFromHandle)(prop, h.raw())
                    },
                    None => CUresult::ERROR_INVALID_VALUE,
                };
            }
            answer(rt.mem_get_props(VirtualHandle(handle)), |p| {
                // SAFETY: non-null and writable (the driver's contract).
                unsafe { prop.write(p) }
            })
        }
    )
}

pub(crate) unsafe fn cuMemExportToShareableHandle(
    real: &'static DriverTable,
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: u32,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(
        real.cuMemExportToShareableHandle(shareable, handle, handle_type, flags),
        |rt| {
            let to = if handle_type == handle_type::POSIX_FILE_DESCRIPTOR && !shareable.is_null() {
                ExportTo::Descriptor
            } else {
                // SAFETY: the application's out-argument of this very call.
                ExportTo::Foreign(unsafe { ForeignPtr::new(shareable) })
            };
            answer(
                rt.mem_export(VirtualHandle(handle), handle_type, flags, to),
                |fd| {
                    if let Some(fd) = fd {
                        // SAFETY: a POSIX export's out-argument is a writable `int`, checked non-null.
                        unsafe { shareable.cast::<c_int>().write(fd.into_raw_fd()) }
                    }
                },
            )
        }
    )
}

pub(crate) unsafe fn cuMemImportFromShareableHandle(
    real: &'static DriverTable,
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: u32,
) -> CUresult {
    dispatch!(
        real.cuMemImportFromShareableHandle(handle, os_handle, handle_type),
        |rt| {
            if handle.is_null() {
                // SAFETY: as the caller gave them; the driver reports the null.
                return unsafe {
                    (real.cuMemImportFromShareableHandle)(handle, os_handle, handle_type)
                };
            }
            // For POSIX descriptors the OS handle is the descriptor's number.
            let fd = i32::try_from(os_handle as usize).ok().filter(|fd| *fd >= 0);
            let imported = match fd {
                Some(fd) if handle_type == handle_type::POSIX_FILE_DESCRIPTOR => {
                    // SAFETY: only borrowed for syscalls that report a closed descriptor as EBADF and
                    // for the driver's import; it is the application's and is never closed here.
                    rt.mem_import_fd(unsafe { BorrowedFd::borrow_raw(fd) })
                }
                // Other handle types (FABRIC...), or arguments the driver will refuse.
                // SAFETY: the application's OS handle of this very call.
                _ => rt.mem_import_other(unsafe { ForeignPtr::new(os_handle) }, handle_type),
            };
            // SAFETY: non-null and writable (the driver's contract).
            answer(imported, |vh| unsafe { handle.write(vh.0) })
        }
    )
}

pub(crate) unsafe fn cuDevicePrimaryCtxRetain(
    real: &'static DriverTable,
    ctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    dispatch!(real.cuDevicePrimaryCtxRetain(ctx, dev), |rt| {
        if ctx.is_null() {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuDevicePrimaryCtxRetain)(ctx, dev) };
        }
        // SAFETY: non-null and writable (the driver's contract).
        answer(rt.primary_ctx_retain(dev), |c| unsafe { ctx.write(c) })
    })
}

pub(crate) unsafe fn cuDevicePrimaryCtxReset_v2(
    real: &'static DriverTable,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: no pointers.
    dispatch!(real.cuDevicePrimaryCtxReset_v2(dev), |rt| done(
        rt.primary_ctx_reset(dev)
    ))
}

pub(crate) unsafe fn cuDevicePrimaryCtxRelease_v2(
    real: &'static DriverTable,
    dev: CUdevice,
) -> CUresult {
    dispatch!(real.cuDevicePrimaryCtxRelease_v2(dev), |rt| done(
        rt.primary_ctx_release(dev)
    ))
}

pub(crate) unsafe fn cuCtxDestroy_v2(real: &'static DriverTable, ctx: CUcontext) -> CUresult {
    // The context is a handle passed by value: never dereferenced here.
    dispatch!(real.cuCtxDestroy_v2(ctx), |rt| done(rt.ctx_destroy(ctx)))
}

pub(crate) unsafe fn cuCtxEnablePeerAccess(
    real: &'static DriverTable,
    peer: CUcontext,
    flags: c_uint,
) -> CUresult {
    dispatch!(real.cuCtxEnablePeerAccess(peer, flags), |rt| done(
        rt.ctx_enable_peer_access(peer, flags)
    ))
}

pub(crate) unsafe fn cuCtxDisablePeerAccess(
    real: &'static DriverTable,
    peer: CUcontext,
) -> CUresult {
    dispatch!(real.cuCtxDisablePeerAccess(peer), |rt| done(
        rt.ctx_disable_peer_access(peer)
    ))
}

pub(crate) unsafe fn cuMemAlloc_v2(
    real: &'static DriverTable,
    dptr: *mut CUdeviceptr,
    bytes: usize,
) -> CUresult {
    dispatch!(real.cuMemAlloc_v2(dptr, bytes), |rt| {
        if dptr.is_null() {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuMemAlloc_v2)(dptr, bytes) };
        }
        // SAFETY: non-null and writable (the driver's contract).
        answer(rt.mem_alloc(bytes), |p| unsafe { dptr.write(p) })
    })
}

pub(crate) unsafe fn cuMemFree_v2(real: &'static DriverTable, dptr: CUdeviceptr) -> CUresult {
    dispatch!(real.cuMemFree_v2(dptr), |rt| done(rt.mem_free_any(dptr)))
}

/// Memory the shim does not own: the driver's call, unchanged, then `note` with the allocated base
/// when it succeeded and the runtime runs (a forked child's calls go to the driver too: there is no
/// tracked state of its own to keep).
fn observe_alloc(
    r: CUresult,
    dptr: *mut CUdeviceptr,
    note: impl FnOnce(&Runtime, CUdeviceptr),
) -> CUresult {
    if r.is_success()
        && !dptr.is_null()
        && let Active::Running(rt) = active()
    {
        // SAFETY: the driver wrote the allocation's base through this non-null pointer.
        note(rt, unsafe { dptr.read() });
    }
    r
}

pub(crate) unsafe fn cuMemAllocPitch_v2(
    real: &'static DriverTable,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged, under the caller's contract.
    let r = unsafe { (real.cuMemAllocPitch_v2)(dptr, pitch, width, height, element_size) };
    observe_alloc(r, dptr, |rt, base| {
        // The driver refuses a null pitch pointer, so a success has one; counted as unpadded
        // rows if not.
        let pitch = if pitch.is_null() {
            width
        } else {
            // SAFETY: non-null, and the driver wrote the pitch through it as it succeeded.
            unsafe { pitch.read() }
        };
        let bytes = (pitch as u64).saturating_mul(height as u64);
        rt.note_unowned(UnownedKind::Pitched, base, bytes);
    })
}

pub(crate) unsafe fn cuMemAllocManaged(
    real: &'static DriverTable,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged, under the caller's contract.
    let r = unsafe { (real.cuMemAllocManaged)(dptr, bytes, flags) };
    observe_alloc(r, dptr, |rt, base| {
        rt.note_unowned(UnownedKind::Managed, base, bytes as u64)
    })
}

pub(crate) unsafe fn cuMemAllocAsync(
    real: &'static DriverTable,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged, under the caller's contract.
    let r = unsafe { (real.cuMemAllocAsync)(dptr, bytes, stream) };
    observe_alloc(r, dptr, |rt, base| {
        rt.note_unowned(UnownedKind::StreamOrdered, base, bytes as u64)
    })
}

/// The per-thread-default-stream variant, which cudart resolves for `--default-stream per-thread`
/// programs: forwarded to the driver's own `_ptsz`, so stream 0 keeps its meaning.
pub(crate) unsafe fn cuMemAllocAsync_ptsz(
    real: &'static DriverTable,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged, under the caller's contract.
    let r = unsafe { (real.cuMemAllocAsync_ptsz)(dptr, bytes, stream) };
    observe_alloc(r, dptr, |rt, base| {
        rt.note_unowned(UnownedKind::StreamOrdered, base, bytes as u64)
    })
}

/// A free of memory the shim does not own, forgotten when the driver's call succeeded.
fn observe_free(r: CUresult, dptr: CUdeviceptr) -> CUresult {
    if r.is_success()
        && let Active::Running(rt) = active()
    {
        rt.note_unowned_freed(dptr);
    }
    r
}

pub(crate) unsafe fn cuMemFreeAsync(
    real: &'static DriverTable,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged, under the caller's contract.
    observe_free(unsafe { (real.cuMemFreeAsync)(dptr, stream) }, dptr)
}

pub(crate) unsafe fn cuMemFreeAsync_ptsz(
    real: &'static DriverTable,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, unchanged, under the caller's contract.
    observe_free(unsafe { (real.cuMemFreeAsync_ptsz)(dptr, stream) }, dptr)
}

pub(crate) unsafe fn cuMemGetAddressRange_v2(
    real: &'static DriverTable,
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    dispatch!(real.cuMemGetAddressRange_v2(base, size, dptr), |rt| {
        // Either out-pointer may be null (the driver then skips it).
        answer(rt.mem_address_range(dptr), |(b, s)| {
            // SAFETY: each is null or writable (the driver's contract).
            if let Some(out) = unsafe { base.as_mut() } {
                *out = b;
            }
            // SAFETY: as above.
            if let Some(out) = unsafe { size.as_mut() } {
                *out = s;
            }
        })
    })
}

/// Writes the shim's answer for one pointer attribute over the driver's.
///
/// # Safety
/// `data` is non-null and the driver just wrote this attribute's value there.
unsafe fn write_pointer_value(data: *mut c_void, value: PointerValue) {
    let bytes: &[u8] = match &value {
        PointerValue::Address(a) => &a.to_ne_bytes(),
        PointerValue::Size(s) => &s.to_ne_bytes(),
        PointerValue::True => &[1],
    };
    // SAFETY: the driver's out-pointer for an attribute of this width (8 bytes for an address or
    // a size; at least one for a boolean), which it wrote.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), data.cast::<u8>(), bytes.len()) };
}

pub(crate) unsafe fn cuPointerGetAttribute(
    real: &'static DriverTable,
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    dispatch!(real.cuPointerGetAttribute(data, attribute, ptr), |rt| {
        // The driver answers first (every attribute, with its own width and errors); the shim
        // corrects only what VMM answers differently from cuMemAlloc memory.
        // SAFETY: the caller's arguments, unchanged, under the caller's contract.
        let r = unsafe { (real.cuPointerGetAttribute)(data, attribute, ptr) };
        if r.is_success()
            && !data.is_null()
            && let Some(value) = rt.pointer_attribute(ptr, attribute)
        {
            // SAFETY: the driver succeeded, so `data` holds this attribute's value.
            unsafe { write_pointer_value(data, value) };
        }
        r
    })
}

pub(crate) unsafe fn cuPointerGetAttributes(
    real: &'static DriverTable,
    count: c_uint,
    attributes: *mut c_uint,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    dispatch!(
        real.cuPointerGetAttributes(count, attributes, data, ptr),
        |rt| {
            // SAFETY: the caller's arguments, unchanged, under the caller's contract.
            let r = unsafe { (real.cuPointerGetAttributes)(count, attributes, data, ptr) };
            if r.is_success() && !attributes.is_null() && !data.is_null() {
                let count = count as usize;
                // SAFETY: the driver's contract: `count` attributes, which it just read.
                let attributes = unsafe { core::slice::from_raw_parts(attributes, count) };
                // SAFETY: as above, `count` slots.
                let slots = unsafe { core::slice::from_raw_parts(data, count) };
                for (attribute, slot) in attributes.iter().zip(slots) {
                    if let (false, Some(value)) =
                        (slot.is_null(), rt.pointer_attribute(ptr, *attribute))
                    {
                        // SAFETY: the driver succeeded and filled every non-null slot.
                        unsafe { write_pointer_value(*slot, value) };
                    }
                }
            }
            r
        }
    )
}

pub(crate) unsafe fn cuIpcGetMemHandle(
    real: &'static DriverTable,
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    dispatch!(real.cuIpcGetMemHandle(handle, dptr), |rt| {
        if handle.is_null() {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuIpcGetMemHandle)(handle, dptr) };
        }
        // SAFETY: non-null and writable (the driver's contract).
        answer(rt.ipc_get_mem_handle(dptr), |h| unsafe { handle.write(h) })
    })
}

pub(crate) unsafe fn cuIpcOpenMemHandle_v2(
    real: &'static DriverTable,
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    dispatch!(real.cuIpcOpenMemHandle_v2(dptr, handle, flags), |rt| {
        if dptr.is_null() {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuIpcOpenMemHandle_v2)(dptr, handle, flags) };
        }
        // SAFETY: non-null and writable (the driver's contract).
        answer(rt.ipc_open_mem_handle(handle, flags), |p| unsafe {
            dptr.write(p)
        })
    })
}

pub(crate) unsafe fn cuIpcCloseMemHandle(
    real: &'static DriverTable,
    dptr: CUdeviceptr,
) -> CUresult {
    dispatch!(real.cuIpcCloseMemHandle(dptr), |rt| done(
        rt.ipc_close_mem_handle(dptr)
    ))
}

pub(crate) unsafe fn cuMulticastCreate(
    real: &'static DriverTable,
    handle: *mut CUmemGenericAllocationHandle,
    prop: *const CUmulticastObjectProp,
) -> CUresult {
    dispatch!(real.cuMulticastCreate(handle, prop), |rt| {
        // SAFETY: the driver's contract: `prop` is null or readable.
        let (false, Some(p)) = (handle.is_null(), unsafe { prop.as_ref() }) else {
            // SAFETY: as the caller gave them; the driver reports the null.
            return unsafe { (real.cuMulticastCreate)(handle, prop) };
        };
        // SAFETY: non-null and writable (the driver's contract).
        answer(rt.multicast_create(p), |vh| unsafe { handle.write(vh.0) })
    })
}

pub(crate) unsafe fn cuMulticastAddDevice(
    real: &'static DriverTable,
    handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
) -> CUresult {
    dispatch!(real.cuMulticastAddDevice(handle, dev), |rt| done(
        rt.multicast_add_device(VirtualHandle(handle), dev)
    ))
}

pub(crate) unsafe fn cuMulticastBindMem(
    real: &'static DriverTable,
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(
        real.cuMulticastBindMem(mc, mc_offset, mem, mem_offset, size, flags),
        |rt| done(rt.multicast_bind_mem(
            VirtualHandle(mc),
            mc_offset,
            VirtualHandle(mem),
            mem_offset,
            size,
            flags
        ))
    )
}

pub(crate) unsafe fn cuMulticastBindMem_v2(
    real: &'static DriverTable,
    mc: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    mem: CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(
        real.cuMulticastBindMem_v2(mc, dev, mc_offset, mem, mem_offset, size, flags),
        |rt| done(rt.multicast_bind_mem_v2(
            VirtualHandle(mc),
            dev,
            mc_offset,
            VirtualHandle(mem),
            mem_offset,
            size,
            flags
        ))
    )
}

pub(crate) unsafe fn cuMulticastBindAddr(
    real: &'static DriverTable,
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    ptr: CUdeviceptr,
    size: usize,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(
        real.cuMulticastBindAddr(mc, mc_offset, ptr, size, flags),
        |rt| done(rt.multicast_bind_addr(VirtualHandle(mc), mc_offset, ptr, size, flags))
    )
}

pub(crate) unsafe fn cuMulticastBindAddr_v2(
    real: &'static DriverTable,
    mc: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    ptr: CUdeviceptr,
    size: usize,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(
        real.cuMulticastBindAddr_v2(mc, dev, mc_offset, ptr, size, flags),
        |rt| done(rt.multicast_bind_addr_v2(VirtualHandle(mc), dev, mc_offset, ptr, size, flags))
    )
}

pub(crate) unsafe fn cuMulticastUnbind(
    real: &'static DriverTable,
    mc: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> CUresult {
    dispatch!(real.cuMulticastUnbind(mc, dev, mc_offset, size), |rt| done(
        rt.multicast_unbind(VirtualHandle(mc), dev, mc_offset, size)
    ))
}
