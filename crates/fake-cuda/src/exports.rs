//! Every exported symbol of the library.
//!
//! Each driver entry point is exported once, under its driver name (`cuMemCreate`), and holds the
//! implementation. `cuGetProcAddress` hands out these same functions: the library is linked with
//! `-Bsymbolic-functions` (build.rs), so its own references bind to its own definitions and never
//! to an interposer's export of the same name, as the real driver's resolver hands out its own
//! functions. Besides those, the library exports only [`fakeCudaUsage`].

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use cuda_abi::{
    CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUhostFn,
    CUipcMemHandle, CUlaunchConfig, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemLocation, CUmodule, CUmulticastObjectProp, CUresult,
    CUstream, CUuuid, cuuint32_t, cuuint64_t,
};

use crate::entry::{Kind, call};
use crate::exec::{event, module, ops};
use crate::memory::{copy, host, legacy, vmm};
use crate::{Res, write_out};
use crate::{accounting, checkpoint, config, device, errors, init, multicast, procaddress};

macro_rules! entry_points {
    ($( $kind:ident $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $body:expr; )*) => {
        $(
            #[doc = concat!("The fake driver's implementation of `", stringify!($name), "`.")]
            ///
            /// # Safety
            /// The driver API contract of this entry point: pointers are null or valid.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                call(stringify!($name), Kind::$kind, || {
                    #[allow(unused_unsafe)]
                    // SAFETY: the caller's pointers follow the driver API contract; the
                    // implementation checks them for null before use.
                    unsafe { $body }
                })
            }
        )*

        /// The address of exported entry point `symbol` (this library's own definition).
        pub(crate) fn own_address(symbol: &[u8]) -> Option<*mut c_void> {
            $( if symbol == stringify!($name).as_bytes() {
                return Some($name as *mut c_void);
            } )*
            None
        }

        /// The driver names of every exported entry point.
        #[cfg(test)]
        pub(crate) const EXPORTED: &[&str] = &[$(stringify!($name)),*];
    };
}

/// `CUctxCreateParams` of CUDA 13.0 (`cuCtxCreate_v4`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtxCreateParams {
    pub exec_affinity_params: *mut c_void,
    pub num_exec_affinity_params: c_int,
    pub cig_params: *mut c_void,
}

unsafe fn v4_params_given(params: *mut CtxCreateParams) -> Res<bool> {
    if params.is_null() {
        return Ok(false);
    }
    // SAFETY: non-null; the caller passes readable CUctxCreateParams.
    let p = unsafe { crate::read_in(params.cast_const()) }?;
    Ok(!p.exec_affinity_params.is_null()
        || p.num_exec_affinity_params != 0
        || !p.cig_params.is_null())
}

fn mem_get_info_v1(free: *mut c_uint, total: *mut c_uint) -> Res {
    if free.is_null() || total.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let (f, t) = accounting::mem_info()?;
    let clamp = |v: u64| c_uint::try_from(v).unwrap_or(c_uint::MAX);
    // SAFETY: checked non-null; the caller passes writable unsigned ints.
    unsafe { write_out(free, clamp(f)) }?;
    // SAFETY: as above.
    unsafe { write_out(total, clamp(t)) }
}

fn mem_get_info(free: *mut usize, total: *mut usize) -> Res {
    if free.is_null() || total.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let (f, t) = accounting::mem_info()?;
    // SAFETY: checked non-null; the caller passes writable size_t values.
    unsafe { write_out(free, f as usize) }?;
    // SAFETY: as above.
    unsafe { write_out(total, t as usize) }
}

entry_points! {
    Init cuInit(flags: c_uint) => init::cu_init(flags);
    Free cuDriverGetVersion(version: *mut c_int)
        => errors::driver_get_version(version);
    Free cuGetErrorName(error: CUresult, out: *mut *const c_char)
        => errors::error_text(error, out, true);
    Free cuGetErrorString(error: CUresult, out: *mut *const c_char)
        => errors::error_text(error, out, false);
    Free cuGetProcAddress(
        symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t)
        => procaddress::get_proc_address(symbol, pfn, cuda_version, flags);
    Free cuGetProcAddress_v2(
        symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t,
        status: *mut c_int)
        => procaddress::get_proc_address_v2(symbol, pfn, cuda_version, flags, status);
    Free cuGetProcAddress_v2_ptsz(
        symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t,
        status: *mut c_int)
        => procaddress::get_proc_address_v2_ptsz(symbol, pfn, cuda_version, flags, status);

    Gated cuDeviceGet(dev: *mut CUdevice, ordinal: c_int)
        => device::device_get(dev, ordinal);
    Gated cuDeviceGetCount(count: *mut c_int)
        => device::device_get_count(count);
    Gated cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice)
        => device::device_get_name(name, len, dev);
    Gated cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice)
        => device::device_get_uuid(uuid, dev);
    Gated cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice)
        => device::device_get_uuid(uuid, dev);
    Gated cuDeviceGetAttribute(
        value: *mut c_int, attrib: c_int, dev: CUdevice)
        => device::device_get_attribute(value, attrib, dev);
    Gated cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice)
        => device::device_total_mem(bytes, dev);

    Gated cuDevicePrimaryCtxRetain(
        ctx: *mut CUcontext, dev: CUdevice)
        => device::primary_ctx_retain(ctx, dev);
    Gated cuDevicePrimaryCtxRelease_v2(dev: CUdevice)
        => device::primary_ctx_release(dev);
    Gated cuDevicePrimaryCtxReset_v2(dev: CUdevice) => device::primary_ctx_reset(dev);
    Gated cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int)
        => device::primary_ctx_get_state(dev, flags, active);
    Gated cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice)
        => device::ctx_create(ctx, flags, dev);
    Gated cuCtxCreate_v3(
        ctx: *mut CUcontext, params: *mut c_void, num_params: c_int, flags: c_uint,
        dev: CUdevice)
        => device::ctx_create_with_params(ctx, !params.is_null() && num_params != 0, flags, dev);
    Gated cuCtxCreate_v4(
        ctx: *mut CUcontext, params: *mut CtxCreateParams, flags: c_uint, dev: CUdevice)
        => match v4_params_given(params) {
            Ok(given) => device::ctx_create_with_params(ctx, given, flags, dev),
            Err(code) => Err(code),
        };
    Gated cuCtxDestroy_v2(ctx: CUcontext) => device::ctx_destroy(ctx);
    Gated cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint)
        => device::ctx_enable_peer_access(peer, flags);
    Gated cuCtxDisablePeerAccess(peer: CUcontext) => device::ctx_disable_peer_access(peer);
    Gated cuCtxSetCurrent(ctx: CUcontext) => device::ctx_set_current(ctx);
    Gated cuCtxGetCurrent(ctx: *mut CUcontext)
        => device::ctx_get_current(ctx);
    Gated cuCtxGetDevice(dev: *mut CUdevice) => device::ctx_get_device(dev);
    Gated cuCtxSynchronize() => ops::ctx_synchronize();
    Gated cuCtxGetLimit(value: *mut usize, limit: c_int) => device::ctx_get_limit(value, limit);
    Gated cuCtxSetLimit(limit: c_int, value: usize) => device::ctx_set_limit(limit, value);

    Gated cuStreamCreate(stream: *mut CUstream, flags: c_uint)
        => device::stream_create(stream, flags);
    Gated cuStreamDestroy_v2(stream: CUstream)
        => device::stream_destroy(stream);
    Gated cuStreamSynchronize(stream: CUstream)
        => ops::stream_synchronize(stream);
    Gated cuStreamQuery(stream: CUstream) => ops::stream_query(stream);
    Gated cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint)
        => event::stream_wait_event(stream, event, flags);
    Gated cuStreamWaitValue32_v2(
        stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint)
        => ops::wait_value_32(stream, addr, value, flags);
    Gated cuStreamWriteValue32_v2(
        stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint)
        => ops::write_value_32(stream, addr, value, flags);
    Gated cuLaunchHostFunc(stream: CUstream, f: CUhostFn, user_data: *mut c_void)
        => ops::launch_host_func(stream, f, user_data);

    Gated cuEventCreate(event: *mut CUevent, flags: c_uint) => event::create(event, flags);
    Gated cuEventDestroy_v2(event: CUevent) => event::destroy(event);
    Gated cuEventRecord(event: CUevent, stream: CUstream) => event::record(event, stream, 0);
    Gated cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint)
        => event::record(event, stream, flags);
    Gated cuEventQuery(event: CUevent) => event::query(event);
    Gated cuEventSynchronize(event: CUevent) => event::synchronize(event);

    Gated cuModuleLoadData(module: *mut CUmodule, image: *const c_void)
        => module::load_data(module, image);
    Gated cuModuleGetFunction(f: *mut CUfunction, module: CUmodule, name: *const c_char)
        => module::get_function(f, module, name);
    Gated cuModuleUnload(module: CUmodule) => module::unload(module);
    Gated cuLaunchKernel(
        f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
        block_y: c_uint, block_z: c_uint, shared_mem: c_uint, stream: CUstream,
        params: *mut *mut c_void, extra: *mut *mut c_void)
        => module::launch(
            f, [grid_x, grid_y, grid_z, block_x, block_y, block_z], shared_mem, stream, params,
            extra);
    Gated cuLaunchKernel_ptsz(
        f: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint,
        block_y: c_uint, block_z: c_uint, shared_mem: c_uint, stream: CUstream,
        params: *mut *mut c_void, extra: *mut *mut c_void)
        => module::launch(
            f, [grid_x, grid_y, grid_z, block_x, block_y, block_z], shared_mem, stream, params,
            extra);
    Gated cuLaunchKernelEx(
        config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
        extra: *mut *mut c_void)
        => module::launch_ex(config, f, params, extra);
    Gated cuLaunchKernelEx_ptsz(
        config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void,
        extra: *mut *mut c_void)
        => module::launch_ex(config, f, params, extra);

    Gated cuMemGetInfo(free: *mut c_uint, total: *mut c_uint)
        => mem_get_info_v1(free, total);
    Gated cuMemGetInfo_v2(free: *mut usize, total: *mut usize)
        => mem_get_info(free, total);
    Gated cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize)
        => legacy::mem_alloc(dptr, bytes);
    Gated cuMemFree_v2(dptr: CUdeviceptr) => legacy::mem_free(dptr);
    Gated cuMemAllocPitch_v2(
        dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize,
        element_size: c_uint)
        => legacy::mem_alloc_pitch(dptr, pitch, width, height, element_size);
    Gated cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint)
        => legacy::mem_alloc_managed(dptr, bytes, flags);
    Gated cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream)
        => legacy::mem_alloc_async(dptr, bytes, stream);
    Gated cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream)
        => legacy::mem_alloc_async(dptr, bytes, stream);
    Gated cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream)
        => legacy::mem_free_async(dptr, stream);
    Gated cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream)
        => legacy::mem_free_async(dptr, stream);
    Gated cuMemGetAddressRange_v2(
        base: *mut CUdeviceptr, size: *mut usize, dptr: CUdeviceptr)
        => legacy::get_address_range(base, size, dptr);
    Gated cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr)
        => legacy::pointer_attribute(data, attribute, ptr);
    Gated cuPointerGetAttributes(
        count: c_uint, attributes: *mut c_uint, data: *mut *mut c_void, ptr: CUdeviceptr)
        => legacy::pointer_attributes(count, attributes, data, ptr);
    Gated cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint)
        => host::host_alloc(pp, bytes, flags);
    Gated cuMemFreeHost(p: *mut c_void) => host::free_host(p);
    Gated cuMemHostRegister_v2(
        p: *mut c_void, bytes: usize, flags: c_uint)
        => host::host_register(p, bytes, flags);
    Gated cuMemHostUnregister(p: *mut c_void)
        => host::host_unregister(p);

    Gated cuMemcpyHtoD_v2(
        dst: CUdeviceptr, src: *const c_void, bytes: usize)
        => copy::htod(dst, src, bytes, None);
    Gated cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize)
        => copy::dtoh(dst, src, bytes, None);
    Gated cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize)
        => copy::dtod(dst, src, bytes, None);
    Gated cuMemcpyHtoDAsync_v2(
        dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: CUstream)
        => copy::htod(dst, src, bytes, Some(stream));
    Gated cuMemcpyDtoHAsync_v2(
        dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream)
        => copy::dtoh(dst, src, bytes, Some(stream));
    Gated cuMemcpyDtoDAsync_v2(
        dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream)
        => copy::dtod(dst, src, bytes, Some(stream));
    Gated cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize)
        => copy::memset_d8(dst, value, count, None);
    Gated cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, count: usize)
        => copy::memset_d32(dst, value, count, None);
    Gated cuMemsetD8Async(
        dst: CUdeviceptr, value: u8, count: usize, stream: CUstream)
        => copy::memset_d8(dst, value, count, Some(stream));
    Gated cuMemsetD32Async(
        dst: CUdeviceptr, value: c_uint, count: usize, stream: CUstream)
        => copy::memset_d32(dst, value, count, Some(stream));
    Gated cuMemsetD32Async_ptsz(
        dst: CUdeviceptr, value: c_uint, count: usize, stream: CUstream)
        => copy::memset_d32(dst, value, count, Some(stream));
    Gated cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream)
        => copy::any_async(dst, src, bytes, stream);
    Gated cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream)
        => copy::any_async(dst, src, bytes, stream);

    Gated cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle, size: usize,
        prop: *const CUmemAllocationProp, flags: c_ulonglong)
        => vmm::mem_create(handle, size, prop, flags);
    Gated cuMemRelease(handle: CUmemGenericAllocationHandle)
        => vmm::mem_release(handle);
    Gated cuMemAddressReserve(
        ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr,
        flags: c_ulonglong)
        => vmm::address_reserve(ptr, size, alignment, addr, flags);
    Gated cuMemAddressFree(ptr: CUdeviceptr, size: usize)
        => vmm::address_free(ptr, size);
    Gated cuMemMap(
        ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle,
        flags: c_ulonglong)
        => vmm::mem_map(ptr, size, offset, handle, flags);
    Gated cuMemUnmap(ptr: CUdeviceptr, size: usize) => vmm::mem_unmap(ptr, size);
    Gated cuMemSetAccess(
        ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize)
        => vmm::set_access(ptr, size, desc, count);
    Gated cuMemGetAccess(
        flags: *mut c_ulonglong, location: *const CUmemLocation, ptr: CUdeviceptr)
        => vmm::get_access(flags, location, ptr);
    Gated cuMemExportToShareableHandle(
        shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: u32,
        flags: c_ulonglong)
        => vmm::export(shareable, handle, handle_type, flags);
    Gated cuMemImportFromShareableHandle(
        handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: u32)
        => vmm::import(handle, os_handle, handle_type);
    Gated cuMemRetainAllocationHandle(
        handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void)
        => vmm::retain(handle, addr);
    Gated cuMemGetAllocationPropertiesFromHandle(
        prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle)
        => vmm::get_properties(prop, handle);
    Gated cuMemGetAllocationGranularity(
        granularity: *mut usize, prop: *const CUmemAllocationProp, option: u32)
        => vmm::granularity(granularity, prop, option);

    Gated cuIpcGetMemHandle(
        handle: *mut CUipcMemHandle, dptr: CUdeviceptr)
        => legacy::ipc_get_mem_handle(handle, dptr);
    Gated cuIpcOpenMemHandle(
        dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
        => legacy::ipc_open_mem_handle(dptr, handle, flags);
    Gated cuIpcOpenMemHandle_v2(
        dptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
        => legacy::ipc_open_mem_handle(dptr, handle, flags);
    Gated cuIpcCloseMemHandle(dptr: CUdeviceptr)
        => legacy::ipc_close_mem_handle(dptr);

    Gated cuMulticastCreate(
        handle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp)
        => multicast::create(handle, prop);
    Gated cuMulticastAddDevice(
        handle: CUmemGenericAllocationHandle, dev: CUdevice)
        => multicast::add_device(handle, dev);
    Gated cuMulticastBindMem(
        mc: CUmemGenericAllocationHandle, mc_offset: usize, mem: CUmemGenericAllocationHandle,
        mem_offset: usize, size: usize, flags: c_ulonglong)
        => multicast::bind_mem(mc, mc_offset, mem, mem_offset, size, flags);
    Gated cuMulticastBindAddr(
        mc: CUmemGenericAllocationHandle, mc_offset: usize, ptr: CUdeviceptr, size: usize,
        flags: c_ulonglong)
        => multicast::bind_addr(mc, mc_offset, ptr, size, flags);
    Gated cuMulticastUnbind(
        mc: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: usize, size: usize)
        => multicast::unbind(mc, dev, mc_offset, size);
    Gated cuMulticastGetGranularity(
        granularity: *mut usize, prop: *const CUmulticastObjectProp, option: u32)
        => multicast::get_granularity(granularity, prop, option);

    Control cuCheckpointProcessLock(
        pid: c_int, args: *mut CUcheckpointLockArgs)
        => checkpoint::process_lock(pid, args);
    Control cuCheckpointProcessCheckpoint(
        pid: c_int, args: *mut CUcheckpointCheckpointArgs)
        => checkpoint::process_checkpoint(pid, args);
    Control cuCheckpointProcessRestore(
        pid: c_int, args: *mut CUcheckpointRestoreArgs)
        => checkpoint::process_restore(pid, args);
    Control cuCheckpointProcessUnlock(
        pid: c_int, args: *mut CUcheckpointUnlockArgs)
        => checkpoint::process_unlock(pid, args);
    Control cuCheckpointProcessGetState(
        pid: c_int, state: *mut u32)
        => checkpoint::process_get_state(pid, state);
    Control cuCheckpointProcessGetRestoreThreadId(
        pid: c_int, tid: *mut c_int)
        => checkpoint::process_get_restore_thread_id(pid, tid);
}

/// Bytes of device memory used by live processes, as published under `$FAKE_CUDA_STATE_DIR`
/// (default `/tmp/fake-cuda-<uid>`): one process (`pid > 0`) or all (`pid <= 0`), one device
/// (`device >= 0`) or all (`device < 0`). Needs no `cuInit`. A checkpointed process uses 0.
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaUsage(pid: c_int, device: c_int) -> u64 {
    accounting::usage_in(&config::state_dir_from_env(), pid, device)
}
