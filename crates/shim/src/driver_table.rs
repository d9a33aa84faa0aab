// The one table of what libcuinterpose.so intercepts. It is read three times, each time through a
// different `interposer_table!` macro: by the library (src/table.rs: exports, resolver dispatch,
// the real-function table), by build.rs (the linker version script), and by tests/exports.rs (the
// expected dynamic symbol list). It therefore holds no `use` lines and nothing but the invocation.
//
// Grammar:
//   interception { NAME, ... }   hand-written entry points (src/dlsym.rs, src/resolver.rs,
//                                src/cudart.rs), exported as they are.
//   wrapped { ENTRY; ... }       exported wrappers: each forwards to `shim_runtime::hooks::NAME`
//                                with the real table, and is what every resolver hands out for
//                                the driver's NAME.
//   called { ENTRY; ... }        driver functions the runtime calls but the shim does not wrap;
//                                they are only resolved into `shim_runtime::Real`.
// ENTRY is `NAME(ARG: TYPE, ...)` (every driver function returns CUresult), found by its exact ELF
// name, or `NAME = BASE @ VERSION (ARG: TYPE, ...)` for an ABI variant, found through the driver's
// own `cuGetProcAddress_v2(BASE, VERSION)` (the driver picks the variant; names are never guessed).
// NAME is both the exported symbol and the field of `shim_runtime::Real`; a field missing here or a
// signature that disagrees with `cuda_abi::pfn::PFN_NAME` is a compile error.

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
        cuMemFree_v2 = cuMemFree @ 12000 (dptr: CUdeviceptr);
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
        cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice);
        cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice);
        cuDevicePrimaryCtxRelease_v2 = cuDevicePrimaryCtxRelease @ 12000 (dev: CUdevice);
        cuCtxGetCurrent(ctx: *mut CUcontext);
        cuCtxSetCurrent(ctx: CUcontext);
        cuCtxSynchronize();
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
        cuMemGetInfo_v2 = cuMemGetInfo @ 12000 (free: *mut usize, total: *mut usize);
        cuMemGetAccess(flags: *mut c_ulonglong, location: *const CUmemLocation, ptr: CUdeviceptr);
    }
}
