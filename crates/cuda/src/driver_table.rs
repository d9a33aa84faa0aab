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
//   gated { ENTRY; ... }         driver functions that submit GPU work or touch device memory
//                                contents (launches, copies, memsets, stream memory operations,
//                                event records and waits, prefetches): the shim exports a wrapper
//                                for each that passes the submission gate and calls the driver with
//                                the arguments unchanged. No hand-written code per entry: the gate is
//                                all the shim does there (crates/shim-runtime/src/gate.rs). Each ABI
//                                variant (`_v2`, `_ptds`, `_ptsz`) is its own entry, because a
//                                resolver hands out whichever the caller's version and stream mode
//                                pick; the `_v2` ones are written `NAME = BASE @ VERSION` like the
//                                other sections' variants, so that the tool and the workloads reach
//                                them through `cuGetProcAddress_v2` too.
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
    gated {
        cuLaunchKernel(
            f: CUfunction,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        );
        cuLaunchKernel_ptsz(
            f: CUfunction,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        );
        cuLaunchKernelEx(
            config: *const c_void,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        );
        cuLaunchKernelEx_ptsz(
            config: *const c_void,
            f: CUfunction,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        );
        cuLaunchCooperativeKernel(
            f: CUfunction,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
        );
        cuLaunchCooperativeKernel_ptsz(
            f: CUfunction,
            grid_x: c_uint,
            grid_y: c_uint,
            grid_z: c_uint,
            block_x: c_uint,
            block_y: c_uint,
            block_z: c_uint,
            shared_mem: c_uint,
            stream: CUstream,
            params: *mut *mut c_void,
        );
        cuLaunchCooperativeKernelMultiDevice(params: *mut c_void, devices: c_uint, flags: c_uint);
        cuLaunchHostFunc(stream: CUstream, func: CUhostFn, user_data: *mut c_void);
        cuLaunchHostFunc_ptsz(stream: CUstream, func: CUhostFn, user_data: *mut c_void);
        cuStreamAddCallback(
            stream: CUstream,
            callback: CUstreamCallback,
            user_data: *mut c_void,
            flags: c_uint,
        );
        cuStreamAddCallback_ptsz(
            stream: CUstream,
            callback: CUstreamCallback,
            user_data: *mut c_void,
            flags: c_uint,
        );
        cuLaunch(f: CUfunction);
        cuLaunchGrid(f: CUfunction, grid_width: c_int, grid_height: c_int);
        cuLaunchGridAsync(f: CUfunction, grid_width: c_int, grid_height: c_int, stream: CUstream);
        cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
        cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream);
        cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize);
        cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize);
        cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
        cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
        cuMemcpyPeer(
            dst: CUdeviceptr,
            dst_ctx: CUcontext,
            src: CUdeviceptr,
            src_ctx: CUcontext,
            bytes: usize,
        );
        cuMemcpyPeer_ptds(
            dst: CUdeviceptr,
            dst_ctx: CUcontext,
            src: CUdeviceptr,
            src_ctx: CUcontext,
            bytes: usize,
        );
        cuMemcpyPeerAsync(
            dst: CUdeviceptr,
            dst_ctx: CUcontext,
            src: CUdeviceptr,
            src_ctx: CUcontext,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyPeerAsync_ptsz(
            dst: CUdeviceptr,
            dst_ctx: CUcontext,
            src: CUdeviceptr,
            src_ctx: CUcontext,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyHtoD_v2 = cuMemcpyHtoD @ 12000 (dst: CUdeviceptr, src: *const c_void, bytes: usize);
        cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, bytes: usize);
        cuMemcpyDtoH_v2 = cuMemcpyDtoH @ 12000 (dst: *mut c_void, src: CUdeviceptr, bytes: usize);
        cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, bytes: usize);
        cuMemcpyDtoD_v2 = cuMemcpyDtoD @ 12000 (dst: CUdeviceptr, src: CUdeviceptr, bytes: usize);
        cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize);
        cuMemcpyDtoA_v2 = cuMemcpyDtoA @ 12000 (dst: CUarray, dst_offset: usize, src: CUdeviceptr, bytes: usize);
        cuMemcpyDtoA_v2_ptds(dst: CUarray, dst_offset: usize, src: CUdeviceptr, bytes: usize);
        cuMemcpyAtoD_v2 = cuMemcpyAtoD @ 12000 (dst: CUdeviceptr, src: CUarray, src_offset: usize, bytes: usize);
        cuMemcpyAtoD_v2_ptds(dst: CUdeviceptr, src: CUarray, src_offset: usize, bytes: usize);
        cuMemcpyHtoA_v2 = cuMemcpyHtoA @ 12000 (dst: CUarray, dst_offset: usize, src: *const c_void, bytes: usize);
        cuMemcpyHtoA_v2_ptds(dst: CUarray, dst_offset: usize, src: *const c_void, bytes: usize);
        cuMemcpyAtoH_v2 = cuMemcpyAtoH @ 12000 (dst: *mut c_void, src: CUarray, src_offset: usize, bytes: usize);
        cuMemcpyAtoH_v2_ptds(dst: *mut c_void, src: CUarray, src_offset: usize, bytes: usize);
        cuMemcpyAtoA_v2 = cuMemcpyAtoA @ 12000 (
            dst: CUarray,
            dst_offset: usize,
            src: CUarray,
            src_offset: usize,
            bytes: usize,
        );
        cuMemcpyAtoA_v2_ptds(
            dst: CUarray,
            dst_offset: usize,
            src: CUarray,
            src_offset: usize,
            bytes: usize,
        );
        cuMemcpyHtoAAsync_v2 = cuMemcpyHtoAAsync @ 12000 (
            dst: CUarray,
            dst_offset: usize,
            src: *const c_void,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyHtoAAsync_v2_ptsz(
            dst: CUarray,
            dst_offset: usize,
            src: *const c_void,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyAtoHAsync_v2 = cuMemcpyAtoHAsync @ 12000 (
            dst: *mut c_void,
            src: CUarray,
            src_offset: usize,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyAtoHAsync_v2_ptsz(
            dst: *mut c_void,
            src: CUarray,
            src_offset: usize,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyHtoDAsync_v2 = cuMemcpyHtoDAsync @ 12000 (dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: CUstream);
        cuMemcpyHtoDAsync_v2_ptsz(
            dst: CUdeviceptr,
            src: *const c_void,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyDtoHAsync_v2 = cuMemcpyDtoHAsync @ 12000 (dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream);
        cuMemcpyDtoHAsync_v2_ptsz(
            dst: *mut c_void,
            src: CUdeviceptr,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpyDtoDAsync_v2 = cuMemcpyDtoDAsync @ 12000 (dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
        cuMemcpyDtoDAsync_v2_ptsz(
            dst: CUdeviceptr,
            src: CUdeviceptr,
            bytes: usize,
            stream: CUstream,
        );
        cuMemcpy2D_v2 = cuMemcpy2D @ 12000 (copy: *const c_void);
        cuMemcpy2D_v2_ptds(copy: *const c_void);
        cuMemcpy2DUnaligned_v2 = cuMemcpy2DUnaligned @ 12000 (copy: *const c_void);
        cuMemcpy2DUnaligned_v2_ptds(copy: *const c_void);
        cuMemcpy2DAsync_v2 = cuMemcpy2DAsync @ 12000 (copy: *const c_void, stream: CUstream);
        cuMemcpy2DAsync_v2_ptsz(copy: *const c_void, stream: CUstream);
        cuMemcpy3D_v2 = cuMemcpy3D @ 12000 (copy: *const c_void);
        cuMemcpy3D_v2_ptds(copy: *const c_void);
        cuMemcpy3DAsync_v2 = cuMemcpy3DAsync @ 12000 (copy: *const c_void, stream: CUstream);
        cuMemcpy3DAsync_v2_ptsz(copy: *const c_void, stream: CUstream);
        cuMemcpy3DPeer(copy: *const c_void);
        cuMemcpy3DPeer_ptds(copy: *const c_void);
        cuMemcpy3DPeerAsync(copy: *const c_void, stream: CUstream);
        cuMemcpy3DPeerAsync_ptsz(copy: *const c_void, stream: CUstream);
        cuMemcpyBatchAsync(
            dsts: *mut CUdeviceptr,
            srcs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            attrs: *mut c_void,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            fail_idx: *mut usize,
            stream: CUstream,
        );
        cuMemcpyBatchAsync_ptsz(
            dsts: *mut CUdeviceptr,
            srcs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            attrs: *mut c_void,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            fail_idx: *mut usize,
            stream: CUstream,
        );
        cuMemcpyBatchAsync_v2 = cuMemcpyBatchAsync @ 13000 (
            dsts: *mut CUdeviceptr,
            srcs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            attrs: *mut c_void,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            stream: CUstream,
        );
        cuMemcpyBatchAsync_v2_ptsz(
            dsts: *mut CUdeviceptr,
            srcs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            attrs: *mut c_void,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            stream: CUstream,
        );
        cuMemcpy3DBatchAsync(
            num_ops: usize,
            ops: *mut c_void,
            fail_idx: *mut usize,
            flags: c_ulonglong,
            stream: CUstream,
        );
        cuMemcpy3DBatchAsync_ptsz(
            num_ops: usize,
            ops: *mut c_void,
            fail_idx: *mut usize,
            flags: c_ulonglong,
            stream: CUstream,
        );
        cuMemcpy3DBatchAsync_v2 = cuMemcpy3DBatchAsync @ 13000 (
            num_ops: usize,
            ops: *mut c_void,
            flags: c_ulonglong,
            stream: CUstream,
        );
        cuMemcpy3DBatchAsync_v2_ptsz(
            num_ops: usize,
            ops: *mut c_void,
            flags: c_ulonglong,
            stream: CUstream,
        );
        cuMemsetD8_v2 = cuMemsetD8 @ 12000 (dst: CUdeviceptr, value: u8, count: usize);
        cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, count: usize);
        cuMemsetD2D8_v2 = cuMemsetD2D8 @ 12000 (dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize);
        cuMemsetD2D8_v2_ptds(
            dst: CUdeviceptr,
            pitch: usize,
            value: u8,
            width: usize,
            height: usize,
        );
        cuMemsetD8Async(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream);
        cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream);
        cuMemsetD2D8Async(
            dst: CUdeviceptr,
            pitch: usize,
            value: u8,
            width: usize,
            height: usize,
            stream: CUstream,
        );
        cuMemsetD2D8Async_ptsz(
            dst: CUdeviceptr,
            pitch: usize,
            value: u8,
            width: usize,
            height: usize,
            stream: CUstream,
        );
        cuMemsetD16_v2 = cuMemsetD16 @ 12000 (dst: CUdeviceptr, value: u16, count: usize);
        cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: u16, count: usize);
        cuMemsetD2D16_v2 = cuMemsetD2D16 @ 12000 (dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize);
        cuMemsetD2D16_v2_ptds(
            dst: CUdeviceptr,
            pitch: usize,
            value: u16,
            width: usize,
            height: usize,
        );
        cuMemsetD16Async(dst: CUdeviceptr, value: u16, count: usize, stream: CUstream);
        cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: u16, count: usize, stream: CUstream);
        cuMemsetD2D16Async(
            dst: CUdeviceptr,
            pitch: usize,
            value: u16,
            width: usize,
            height: usize,
            stream: CUstream,
        );
        cuMemsetD2D16Async_ptsz(
            dst: CUdeviceptr,
            pitch: usize,
            value: u16,
            width: usize,
            height: usize,
            stream: CUstream,
        );
        cuMemsetD32_v2 = cuMemsetD32 @ 12000 (dst: CUdeviceptr, value: c_uint, count: usize);
        cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: c_uint, count: usize);
        cuMemsetD2D32_v2 = cuMemsetD2D32 @ 12000 (
            dst: CUdeviceptr,
            pitch: usize,
            value: c_uint,
            width: usize,
            height: usize,
        );
        cuMemsetD2D32_v2_ptds(
            dst: CUdeviceptr,
            pitch: usize,
            value: c_uint,
            width: usize,
            height: usize,
        );
        cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, count: usize, stream: CUstream);
        cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: c_uint, count: usize, stream: CUstream);
        cuMemsetD2D32Async(
            dst: CUdeviceptr,
            pitch: usize,
            value: c_uint,
            width: usize,
            height: usize,
            stream: CUstream,
        );
        cuMemsetD2D32Async_ptsz(
            dst: CUdeviceptr,
            pitch: usize,
            value: c_uint,
            width: usize,
            height: usize,
            stream: CUstream,
        );
        cuStreamWaitValue32(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
        cuStreamWaitValue32_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
        cuStreamWaitValue64(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
        cuStreamWaitValue64_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
        cuStreamWriteValue32(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
        cuStreamWriteValue32_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
        cuStreamWriteValue64(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
        cuStreamWriteValue64_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
        cuStreamBatchMemOp(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint);
        cuStreamBatchMemOp_ptsz(stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint);
        cuStreamWaitValue32_v2 = cuStreamWaitValue32 @ 12000 (stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
        cuStreamWaitValue32_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
        cuStreamWaitValue64_v2 = cuStreamWaitValue64 @ 12000 (stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
        cuStreamWaitValue64_v2_ptsz(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
        cuStreamWriteValue32_v2 = cuStreamWriteValue32 @ 12000 (stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint);
        cuStreamWriteValue32_v2_ptsz(
            stream: CUstream,
            addr: CUdeviceptr,
            value: u32,
            flags: c_uint,
        );
        cuStreamWriteValue64_v2 = cuStreamWriteValue64 @ 12000 (stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint);
        cuStreamWriteValue64_v2_ptsz(
            stream: CUstream,
            addr: CUdeviceptr,
            value: u64,
            flags: c_uint,
        );
        cuStreamBatchMemOp_v2 = cuStreamBatchMemOp @ 12000 (stream: CUstream, count: c_uint, ops: *mut c_void, flags: c_uint);
        cuStreamBatchMemOp_v2_ptsz(
            stream: CUstream,
            count: c_uint,
            ops: *mut c_void,
            flags: c_uint,
        );
        cuEventRecord(event: CUevent, stream: CUstream);
        cuEventRecord_ptsz(event: CUevent, stream: CUstream);
        cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint);
        cuEventRecordWithFlags_ptsz(event: CUevent, stream: CUstream, flags: c_uint);
        cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);
        cuStreamWaitEvent_ptsz(stream: CUstream, event: CUevent, flags: c_uint);
        cuMemPrefetchAsync(ptr: CUdeviceptr, bytes: usize, device: CUdevice, stream: CUstream);
        cuMemPrefetchAsync_ptsz(ptr: CUdeviceptr, bytes: usize, device: CUdevice, stream: CUstream);
        cuMemPrefetchAsync_v2 = cuMemPrefetchAsync @ 13000 (
            ptr: CUdeviceptr,
            bytes: usize,
            location: CUmemLocation,
            flags: c_uint,
            stream: CUstream,
        );
        cuMemPrefetchAsync_v2_ptsz(
            ptr: CUdeviceptr,
            bytes: usize,
            location: CUmemLocation,
            flags: c_uint,
            stream: CUstream,
        );
        cuSignalExternalSemaphoresAsync(
            semaphores: *const CUexternalSemaphore,
            params: *const c_void,
            count: c_uint,
            stream: CUstream,
        );
        cuSignalExternalSemaphoresAsync_ptsz(
            semaphores: *const CUexternalSemaphore,
            params: *const c_void,
            count: c_uint,
            stream: CUstream,
        );
        cuWaitExternalSemaphoresAsync(
            semaphores: *const CUexternalSemaphore,
            params: *const c_void,
            count: c_uint,
            stream: CUstream,
        );
        cuWaitExternalSemaphoresAsync_ptsz(
            semaphores: *const CUexternalSemaphore,
            params: *const c_void,
            count: c_uint,
            stream: CUstream,
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
        cuStreamCreate(stream: *mut CUstream, flags: c_uint);
        cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int);
        cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
        cuModuleGetFunction(function: *mut CUfunction, module: CUmodule, name: *const c_char);
        cuModuleUnload(module: CUmodule);
        cuStreamQuery(stream: CUstream);
        cuEventCreate(event: *mut CUevent, flags: c_uint);
        cuEventDestroy_v2 = cuEventDestroy @ 12000 (event: CUevent);
        cuEventQuery(event: CUevent);
        cuEventSynchronize(event: CUevent);
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
        cuCheckpointProcessLock(pid: c_int, args: *mut CUcheckpointLockArgs);
        cuCheckpointProcessCheckpoint(pid: c_int, args: *mut CUcheckpointCheckpointArgs);
        cuCheckpointProcessRestore(pid: c_int, args: *mut CUcheckpointRestoreArgs);
        cuCheckpointProcessUnlock(pid: c_int, args: *mut CUcheckpointUnlockArgs);
        cuCheckpointProcessGetState(pid: c_int, state: *mut u32);
        cuCheckpointProcessGetRestoreThreadId(pid: c_int, tid: *mut c_int);
    }
}
