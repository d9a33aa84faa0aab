//! The interposer's runtime: what happens inside the wrapped driver calls.
//!
//! `crates/shim` (the cdylib) owns interception: the exports, `dlsym`, the resolvers, and finding the
//! real driver entry points, which it hands over as a [`Real`] table. Every wrapped entry point lands
//! in the function of the same name in [`hooks`], with the driver's C signature plus the table.
//!
//! Before the runtime starts (the first successful `cuInit`), and if it cannot start, every hook
//! passes straight through. Once it runs, the hooks go to [`runtime::Runtime`]'s tracked calls
//! (`track.rs`); in a child forked after it started, tracked calls return
//! `CUDA_ERROR_NOT_INITIALIZED` (see [`runtime`]).
//!
//! Layout: `registry` (pure bookkeeping), `track` (the tracked calls), `gate` (Freeze's gate),
//! `exports` (the export cache), `fdutil` (tickets), `server` (control socket), `phases` (capture
//! and rebuild), `copy` (carriers and the copy engine), `config` (the environment, read once), `log`.

#![allow(non_snake_case)] // fields and hooks carry the driver's symbol names
#![allow(unsafe_code)] // calls through driver function pointers; each block says why it is sound
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod config;
pub mod copy;
pub mod exports;
pub mod fdutil;
pub mod gate;
pub mod log;
pub mod phases;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod track;

#[cfg(test)]
mod testdriver;
#[cfg(test)]
mod tests;

use core::ffi::{c_uint, c_ulonglong, c_void};
use cuda_abi::pfn::*;
use cuda_abi::*;

/// The real driver entry points the runtime calls: every wrapped function and the untracked ones
/// the runtime itself needs (copies, contexts, pinned memory). Resolved once by the interception
/// layer; an entry point the driver lacks is a function that returns `CUDA_ERROR_NOT_FOUND`.
#[derive(Debug, Clone, Copy)]
pub struct Real {
    pub cuInit: PFN_cuInit,
    pub cuMemCreate: PFN_cuMemCreate,
    pub cuMemRelease: PFN_cuMemRelease,
    pub cuMemAddressReserve: PFN_cuMemAddressReserve,
    pub cuMemAddressFree: PFN_cuMemAddressFree,
    pub cuMemMap: PFN_cuMemMap,
    pub cuMemUnmap: PFN_cuMemUnmap,
    pub cuMemSetAccess: PFN_cuMemSetAccess,
    pub cuMemRetainAllocationHandle: PFN_cuMemRetainAllocationHandle,
    pub cuMemGetAllocationPropertiesFromHandle: PFN_cuMemGetAllocationPropertiesFromHandle,
    pub cuMemExportToShareableHandle: PFN_cuMemExportToShareableHandle,
    pub cuMemImportFromShareableHandle: PFN_cuMemImportFromShareableHandle,
    pub cuMemFree_v2: PFN_cuMemFree_v2,
    pub cuIpcGetMemHandle: PFN_cuIpcGetMemHandle,
    pub cuIpcOpenMemHandle_v2: PFN_cuIpcOpenMemHandle_v2,
    pub cuIpcCloseMemHandle: PFN_cuIpcCloseMemHandle,
    pub cuMulticastCreate: PFN_cuMulticastCreate,
    pub cuMulticastAddDevice: PFN_cuMulticastAddDevice,
    pub cuMulticastBindMem: PFN_cuMulticastBindMem,
    pub cuMulticastBindMem_v2: PFN_cuMulticastBindMem_v2,
    pub cuMulticastBindAddr: PFN_cuMulticastBindAddr,
    pub cuMulticastBindAddr_v2: PFN_cuMulticastBindAddr_v2,
    pub cuMulticastUnbind: PFN_cuMulticastUnbind,
    pub cuDriverGetVersion: PFN_cuDriverGetVersion,
    pub cuDeviceGet: PFN_cuDeviceGet,
    pub cuDeviceGetCount: PFN_cuDeviceGetCount,
    pub cuDeviceGetUuid: PFN_cuDeviceGetUuid,
    pub cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain,
    pub cuDevicePrimaryCtxRelease_v2: PFN_cuDevicePrimaryCtxRelease_v2,
    pub cuCtxGetCurrent: PFN_cuCtxGetCurrent,
    pub cuCtxSetCurrent: PFN_cuCtxSetCurrent,
    pub cuCtxSynchronize: PFN_cuCtxSynchronize,
    pub cuMemcpyDtoH_v2: PFN_cuMemcpyDtoH_v2,
    pub cuMemcpyHtoD_v2: PFN_cuMemcpyHtoD_v2,
    pub cuMemcpyDtoHAsync_v2: PFN_cuMemcpyDtoHAsync_v2,
    pub cuMemcpyHtoDAsync_v2: PFN_cuMemcpyHtoDAsync_v2,
    pub cuStreamCreate: PFN_cuStreamCreate,
    pub cuStreamSynchronize: PFN_cuStreamSynchronize,
    pub cuStreamDestroy_v2: PFN_cuStreamDestroy_v2,
    pub cuMemHostAlloc: PFN_cuMemHostAlloc,
    pub cuMemFreeHost: PFN_cuMemFreeHost,
    pub cuMemHostRegister_v2: PFN_cuMemHostRegister_v2,
    pub cuMemHostUnregister: PFN_cuMemHostUnregister,
    pub cuMemGetAllocationGranularity: PFN_cuMemGetAllocationGranularity,
    pub cuMemGetInfo_v2: PFN_cuMemGetInfo_v2,
    pub cuMemGetAccess: PFN_cuMemGetAccess,
}

/// One function per wrapped entry point, same name and C signature plus the real table.
///
/// # Safety
/// Each has the contract of the driver function of the same name: the caller's pointers must be
/// valid as the CUDA documentation requires (null out-pointers are reported, not dereferenced).
#[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
pub mod hooks {
    use super::*;
    use crate::runtime::{Active, active};

    /// Dispatch: the runtime's tracked call, the driver (no runtime), or a refusal (forked child).
    macro_rules! dispatch {
        ($real:ident . $pfn:ident ( $($arg:expr),* ) => $rt:ident . $method:ident) => {
            match active() {
                // SAFETY: same arguments, same contract as the caller's.
                Active::Running($rt) => unsafe { $rt.$method($($arg),*) },
                // SAFETY: same arguments, same contract as the caller's.
                Active::Off => unsafe { ($real.$pfn)($($arg),*) },
                Active::Forked => CUresult::ERROR_NOT_INITIALIZED,
            }
        };
    }

    pub unsafe fn cuInit(real: &Real, flags: c_uint) -> CUresult {
        // SAFETY: same arguments, same contract as the caller's.
        let r = unsafe { (real.cuInit)(flags) };
        if r.is_success() {
            runtime::start_after_init(real);
        }
        r
    }

    pub unsafe fn cuMemCreate(
        real: &Real,
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMemCreate(handle, size, prop, flags) => rt.mem_create)
    }

    pub unsafe fn cuMemRelease(real: &Real, handle: CUmemGenericAllocationHandle) -> CUresult {
        dispatch!(real.cuMemRelease(handle) => rt.mem_release)
    }

    pub unsafe fn cuMemAddressReserve(
        real: &Real,
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMemAddressReserve(ptr, size, alignment, addr, flags) => rt.mem_address_reserve)
    }

    pub unsafe fn cuMemAddressFree(real: &Real, ptr: CUdeviceptr, size: usize) -> CUresult {
        dispatch!(real.cuMemAddressFree(ptr, size) => rt.mem_address_free)
    }

    pub unsafe fn cuMemMap(
        real: &Real,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMemMap(ptr, size, offset, handle, flags) => rt.mem_map)
    }

    pub unsafe fn cuMemUnmap(real: &Real, ptr: CUdeviceptr, size: usize) -> CUresult {
        dispatch!(real.cuMemUnmap(ptr, size) => rt.mem_unmap)
    }

    pub unsafe fn cuMemSetAccess(
        real: &Real,
        ptr: CUdeviceptr,
        size: usize,
        desc: *const CUmemAccessDesc,
        count: usize,
    ) -> CUresult {
        dispatch!(real.cuMemSetAccess(ptr, size, desc, count) => rt.mem_set_access)
    }

    pub unsafe fn cuMemRetainAllocationHandle(
        real: &Real,
        handle: *mut CUmemGenericAllocationHandle,
        addr: *mut c_void,
    ) -> CUresult {
        dispatch!(real.cuMemRetainAllocationHandle(handle, addr) => rt.mem_retain)
    }

    pub unsafe fn cuMemGetAllocationPropertiesFromHandle(
        real: &Real,
        prop: *mut CUmemAllocationProp,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult {
        dispatch!(real.cuMemGetAllocationPropertiesFromHandle(prop, handle) => rt.mem_get_props)
    }

    pub unsafe fn cuMemExportToShareableHandle(
        real: &Real,
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        handle_type: u32,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMemExportToShareableHandle(shareable, handle, handle_type, flags) => rt.mem_export)
    }

    pub unsafe fn cuMemImportFromShareableHandle(
        real: &Real,
        handle: *mut CUmemGenericAllocationHandle,
        os_handle: *mut c_void,
        handle_type: u32,
    ) -> CUresult {
        dispatch!(real.cuMemImportFromShareableHandle(handle, os_handle, handle_type) => rt.mem_import)
    }

    pub unsafe fn cuMemFree_v2(real: &Real, dptr: CUdeviceptr) -> CUresult {
        dispatch!(real.cuMemFree_v2(dptr) => rt.mem_free)
    }

    pub unsafe fn cuIpcGetMemHandle(
        real: &Real,
        handle: *mut CUipcMemHandle,
        dptr: CUdeviceptr,
    ) -> CUresult {
        dispatch!(real.cuIpcGetMemHandle(handle, dptr) => rt.ipc_get_mem_handle)
    }

    pub unsafe fn cuIpcOpenMemHandle_v2(
        real: &Real,
        dptr: *mut CUdeviceptr,
        handle: CUipcMemHandle,
        flags: c_uint,
    ) -> CUresult {
        dispatch!(real.cuIpcOpenMemHandle_v2(dptr, handle, flags) => rt.ipc_open_mem_handle)
    }

    pub unsafe fn cuIpcCloseMemHandle(real: &Real, dptr: CUdeviceptr) -> CUresult {
        dispatch!(real.cuIpcCloseMemHandle(dptr) => rt.ipc_close_mem_handle)
    }

    pub unsafe fn cuMulticastCreate(
        real: &Real,
        handle: *mut CUmemGenericAllocationHandle,
        prop: *const CUmulticastObjectProp,
    ) -> CUresult {
        dispatch!(real.cuMulticastCreate(handle, prop) => rt.multicast_create)
    }

    pub unsafe fn cuMulticastAddDevice(
        real: &Real,
        handle: CUmemGenericAllocationHandle,
        dev: CUdevice,
    ) -> CUresult {
        dispatch!(real.cuMulticastAddDevice(handle, dev) => rt.multicast_add_device)
    }

    pub unsafe fn cuMulticastBindMem(
        real: &Real,
        mc: CUmemGenericAllocationHandle,
        mc_offset: usize,
        mem: CUmemGenericAllocationHandle,
        mem_offset: usize,
        size: usize,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMulticastBindMem(mc, mc_offset, mem, mem_offset, size, flags) => rt.multicast_bind_mem)
    }

    pub unsafe fn cuMulticastBindMem_v2(
        real: &Real,
        mc: CUmemGenericAllocationHandle,
        dev: CUdevice,
        mc_offset: usize,
        mem: CUmemGenericAllocationHandle,
        mem_offset: usize,
        size: usize,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMulticastBindMem_v2(mc, dev, mc_offset, mem, mem_offset, size, flags) => rt.multicast_bind_mem_v2)
    }

    pub unsafe fn cuMulticastBindAddr(
        real: &Real,
        mc: CUmemGenericAllocationHandle,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMulticastBindAddr(mc, mc_offset, ptr, size, flags) => rt.multicast_bind_addr)
    }

    pub unsafe fn cuMulticastBindAddr_v2(
        real: &Real,
        mc: CUmemGenericAllocationHandle,
        dev: CUdevice,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: c_ulonglong,
    ) -> CUresult {
        dispatch!(real.cuMulticastBindAddr_v2(mc, dev, mc_offset, ptr, size, flags) => rt.multicast_bind_addr_v2)
    }

    pub unsafe fn cuMulticastUnbind(
        real: &Real,
        mc: CUmemGenericAllocationHandle,
        dev: CUdevice,
        mc_offset: usize,
        size: usize,
    ) -> CUresult {
        dispatch!(real.cuMulticastUnbind(mc, dev, mc_offset, size) => rt.multicast_unbind)
    }
}
