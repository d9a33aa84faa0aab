// The one table of the driver entry points cuinterpose uses, with their C signatures: the only
// place a signature is written. It is read four times, each time through a macro of the reader's
// own: by this crate (src/lib.rs: the raw function-pointer table, the checked calls, the stubs of
// missing entries, the resolution by the shim's or libloading's lookup), by the shim
// (crates/shim/src/table.rs: exports, resolver dispatch), by the shim's build.rs (the linker
// version script) and by crates/shim/tests/exports.rs (the expected dynamic symbol list). It
// therefore holds no `use` lines and nothing but the invocation.
//
// Grammar:
//   interception { NAME, ... }   the shim's hand-written entry points (crates/shim/src/dlsym.rs,
//                                resolver.rs, cudart.rs), exported as they are; not driver entries.
//   wrapped { ENTRY; ... }       driver functions the shim intercepts: it exports a wrapper for
//                                each, and every resolver hands the wrapper out for NAME.
//   called { ENTRY; ... }        driver functions called but not intercepted (by the shim's
//                                runtime, the tool, the workloads).
// ENTRY is `NAME(ARG: TYPE, ...)` (every driver function returns CUresult), found by its exact ELF
// name, or `NAME = BASE @ VERSION (ARG: TYPE, ...)` for an ABI variant, found through the driver's
// own `cuGetProcAddress_v2(BASE, VERSION)` (the driver picks the variant; names are never guessed).
// NAME is the exported symbol, the field of `cuda::DriverTable` and its checked call.

interposer_table! {
    interception {
        dlsym,
        cuGetProcAddress,
        cuGetProcAddress_v2,
        cuGetProcAddress_v2_ptsz,
        cudaGetDriverEntryPoint,
        cudaGetDriverEntryPoint_ptsz,
        cudaGetDriverEntryPointByVersion,
        cudaGetDriverEntryPointByVersion_ptsz,
    }
    wrapped {
        cuInit(flags: c_uint);
        cuMemCreate(
            handle: *mut CUmemGenericAllocationHandle,
            size: usize,
            prop: *const CUmemAllocationProp,
            flags: c_ulonglong,
        );
        cuMemRelease(handle: CUmemGenericAllocationHandle);
        cuMemAddressReserve(
            ptr: *mut CUdeviceptr,
            size: usize,
            alignment: usize,
            addr: CUdeviceptr,
            flags: c_ulonglong,
        );
        cuMemAddressFree(ptr: CUdeviceptr, size: usize);
        cuMemMap(
            ptr: CUdeviceptr,
            size: usize,
            offset: usize,
            handle: CUmemGenericAllocationHandle,
            flags: c_ulonglong,
        );
        cuMemUnmap(ptr: CUdeviceptr, size: usize);
        cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
        cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void);
        cuMemGetAllocationPropertiesFromHandle(
            prop: *mut CUmemAllocationProp,
            handle: CUmemGenericAllocationHandle,
        );
        cuMemExportToShareableHandle(
            shareable: *mut c_void,
            handle: CUmemGenericAllocationHandle,
            handle_type: u32,
            flags: c_ulonglong,
        );
        cuMemImportFromShareableHandle(
            handle: *mut CUmemGenericAllocationHandle,
            os_handle: *mut c_void,
            handle_type: u32,
        );
        cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice);
        cuDevicePrimaryCtxRelease_v2 = cuDevicePrimaryCtxRelease @ 12000 (dev: CUdevice);
        cuDevicePrimaryCtxReset_v2 = cuDevicePrimaryCtxReset @ 12000 (dev: CUdevice);
        cuCtxDestroy_v2 = cuCtxDestroy @ 12000 (ctx: CUcontext);
        cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint);
        cuCtxDisablePeerAccess(peer: CUcontext);
        cuMemAlloc_v2 = cuMemAlloc @ 12000 (dptr: *mut CUdeviceptr, bytes: usize);
        cuMemFree_v2 = cuMemFree @ 12000 (dptr: CUdeviceptr);
        cuMemGetAddressRange_v2 = cuMemGetAddressRange @ 12000 (
            base: *mut CUdeviceptr,
            size: *mut usize,
            dptr: CUdeviceptr,
        );
        cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr);
        cuPointerGetAttributes(
            count: c_uint,
            attributes: *mut c_uint,
            data: *mut *mut c_void,
            ptr: CUdeviceptr,
        );
        cuMemAllocPitch_v2 = cuMemAllocPitch @ 12000 (
            dptr: *mut CUdeviceptr,
            pitch: *mut usize,
            width: usize,
            height: usize,
            element_size: c_uint,
        );
        cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint);
        cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream);
        cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream);
        cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream);
        cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream);
        cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr);
        cuIpcOpenMemHandle_v2 = cuIpcOpenMemHandle @ 12000 (
            dptr: *mut CUdeviceptr,
            handle: CUipcMemHandle,
            flags: c_uint,
        );
        cuIpcCloseMemHandle(dptr: CUdeviceptr);
        cuMulticastCreate(
            handle: *mut CUmemGenericAllocationHandle,
            prop: *const CUmulticastObjectProp,
        );
        cuMulticastAddDevice(handle: CUmemGenericAllocationHandle, dev: CUdevice);
        cuMulticastBindMem(
            mc: CUmemGenericAllocationHandle,
            mc_offset: usize,
            mem: CUmemGenericAllocationHandle,
            mem_offset: usize,
            size: usize,
            flags: c_ulonglong,
        );
        cuMulticastBindMem_v2 = cuMulticastBindMem @ 13010 (
            mc: CUmemGenericAllocationHandle,
            dev: CUdevice,
            mc_offset: usize,
            mem: CUmemGenericAllocationHandle,
            mem_offset: usize,
            size: usize,
            flags: c_ulonglong,
        );
        cuMulticastBindAddr(
            mc: CUmemGenericAllocationHandle,
            mc_offset: usize,
            ptr: CUdeviceptr,
            size: usize,
            flags: c_ulonglong,
        );
        cuMulticastBindAddr_v2 = cuMulticastBindAddr @ 13010 (
            mc: CUmemGenericAllocationHandle,
            dev: CUdevice,
            mc_offset: usize,
            ptr: CUdeviceptr,
            size: usize,
            flags: c_ulonglong,
        );
        cuMulticastUnbind(
            mc: CUmemGenericAllocationHandle,
            dev: CUdevice,
            mc_offset: usize,
            size: usize,
        );
    }
    called {
        cuDriverGetVersion(version: *mut c_int);
        cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
        cuDeviceGetCount(count: *mut c_int);
        cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
        cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
        cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice);
        cuCtxGetCurrent(ctx: *mut CUcontext);
        cuCtxSetCurrent(ctx: CUcontext);
        cuCtxSynchronize();
        cuCtxGetDevice(device: *mut CUdevice);
        cuCtxGetLimit(value: *mut usize, limit: c_int);
        cuCtxSetLimit(limit: c_int, value: usize);
        cuMemcpyDtoH_v2 = cuMemcpyDtoH @ 12000 (dst: *mut c_void, src: CUdeviceptr, bytes: usize);
        cuMemcpyHtoD_v2 = cuMemcpyHtoD @ 12000 (dst: CUdeviceptr, src: *const c_void, bytes: usize);
        cuMemcpyDtoHAsync_v2 = cuMemcpyDtoHAsync @ 12000 (
            dst: *mut c_void,
            src: CUdeviceptr,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyHtoDAsync_v2 = cuMemcpyHtoDAsync @ 12000 (
            dst: CUdeviceptr,
            src: *const c_void,
            bytes: usize,
            stream: CUstream,
        );
        cuStreamCreate(stream: *mut CUstream, flags: c_uint);
        cuStreamSynchronize(stream: CUstream);
        cuStreamDestroy_v2 = cuStreamDestroy @ 12000 (stream: CUstream);
        cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint);
        cuMemFreeHost(p: *mut c_void);
        cuMemHostRegister_v2 = cuMemHostRegister @ 12000 (p: *mut c_void, bytes: usize, flags: c_uint);
        cuMemHostUnregister(p: *mut c_void);
        cuMemGetAllocationGranularity(
            granularity: *mut usize,
            prop: *const CUmemAllocationProp,
            option: u32,
        );
        cuMulticastGetGranularity(
            granularity: *mut usize,
            prop: *const CUmulticastObjectProp,
            option: u32,
        );
        cuMemGetInfo_v2 = cuMemGetInfo @ 12000 (free: *mut usize, total: *mut usize);
        cuMemGetAccess(flags: *mut c_ulonglong, location: *const CUmemLocation, ptr: CUdeviceptr);
        cuGetErrorName(error: CUresult, out: *mut *const c_char);
        cuMemsetD8_v2 = cuMemsetD8 @ 12000 (dst: CUdeviceptr, value: u8, count: usize);
        cuCheckpointProcessLock(pid: c_int, args: *mut CUcheckpointLockArgs);
        cuCheckpointProcessCheckpoint(pid: c_int, args: *mut CUcheckpointCheckpointArgs);
        cuCheckpointProcessRestore(pid: c_int, args: *mut CUcheckpointRestoreArgs);
        cuCheckpointProcessUnlock(pid: c_int, args: *mut CUcheckpointUnlockArgs);
        cuCheckpointProcessGetState(pid: c_int, state: *mut u32);
    }
}
