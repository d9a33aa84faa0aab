// The one table of the driver entry points cuinterpose uses, with their C signatures: the only
// place a signature is written. It is read four times, each time through a macro of the reader's
// own: by this crate (src/lib.rs: the raw function-pointer table, the checked calls, the stubs of
// missing entries, the resolution by the shim's or libloading's lookup), by the shim
// (crates/shim/src/table.rs: exports, hooks, resolver dispatch), by the shim's build.rs (the linker
// version script) and by crates/shim/tests/exports.rs (the expected dynamic symbol list). It
// therefore holds no `use` lines and nothing but the invocation.
//
// Grammar:
//   interception { NAME, ... }   the shim's hand-written entry points (crates/shim/src/dlsym.rs,
//                                resolver.rs, cudart.rs), exported as they are; not driver entries.
//   wrapped { #[hook(HOOK)] ENTRY; ... }
//                                driver functions the shim intercepts: it exports a wrapper for
//                                each, every resolver hands the wrapper out for NAME, and HOOK says
//                                what the wrapper does (crates/shim/src/hooks.rs generates it):
//     rt.METHOD(ARG, ...) [-> OUT]   a tracked call: with the runtime running, the wrapper calls
//                                the runtime's METHOD with the ARGs and writes its value through
//                                the out-pointer OUT on success; without a runtime the driver's own
//                                function, in a child forked after start CUDA_ERROR_NOT_INITIALIZED.
//                                Each ARG names a C argument by its role:
//                                  x              a value, passed as it is;
//                                  handle(x)      an allocation handle the application holds (the
//                                                 shim's virtual handle: a `VirtualHandle`);
//                                  read(p)        a struct the runtime reads (`&T`);
//                                  slice(p, n)    `n` structs the runtime reads (`&[T]`);
//                                  address(p)     a device address passed in a `void*`;
//                                OUT is `x` (the value as it is) or `handle(x)` (a virtual handle
//                                written as the driver's handle type). A null `read`, `slice` or
//                                OUT pointer sends the call to the driver unchanged, which reports
//                                it with its own code; nothing is recorded.
//     unowned(KIND, BYTES) -> OUT    memory the shim does not own: the driver's call, then, on
//                                success and with the runtime running, the base written through
//                                OUT is counted as `UnownedKind::KIND` of BYTES (an argument, or
//                                `pitched(pitch, width, height)`: the pitch the driver wrote times
//                                the rows).
//     unowned_freed(ARG)         the driver's free of such memory, forgotten on success.
//     by_hand                    the hook of the same name in crates/shim/src/hooks.rs, for
//                                the few that do more than the above (cuInit starts the runtime,
//                                the shareable-handle export and import, pointer attributes).
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
//
// Adding an entry is one edit here: a line in `called` for a function the shim hands out untouched;
// a line in `gated` for one that submits GPU work or touches device memory contents (nothing else to
// write); a line in `wrapped` with its HOOK for one the shim tracks, whose runtime call (`rt.METHOD`)
// is the only other code to write, in crates/shim-runtime. The pointer table, the checked call, the
// export, the version script, the resolver dispatch and the export test follow from the table.

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
        #[hook(by_hand)]
        cuInit(flags: c_uint);
        #[hook(rt.mem_create(size, read(prop), flags) -> handle(handle))]
        cuMemCreate(
            handle: *mut CUmemGenericAllocationHandle,
            size: usize,
            prop: *const CUmemAllocationProp,
            flags: c_ulonglong,
        );
        #[hook(rt.mem_release(handle(handle)))]
        cuMemRelease(handle: CUmemGenericAllocationHandle);
        #[hook(rt.mem_address_reserve(size, alignment, addr, flags) -> ptr)]
        cuMemAddressReserve(
            ptr: *mut CUdeviceptr,
            size: usize,
            alignment: usize,
            addr: CUdeviceptr,
            flags: c_ulonglong,
        );
        #[hook(rt.mem_address_free(ptr, size))]
        cuMemAddressFree(ptr: CUdeviceptr, size: usize);
        #[hook(rt.mem_map(ptr, size, offset, handle(handle), flags))]
        cuMemMap(
            ptr: CUdeviceptr,
            size: usize,
            offset: usize,
            handle: CUmemGenericAllocationHandle,
            flags: c_ulonglong,
        );
        #[hook(rt.mem_unmap(ptr, size))]
        cuMemUnmap(ptr: CUdeviceptr, size: usize);
        #[hook(rt.mem_set_access(ptr, size, slice(desc, count)))]
        cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
        #[hook(rt.mem_retain_any(address(addr)) -> handle(handle))]
        cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void);
        #[hook(by_hand)]
        cuMemGetAllocationPropertiesFromHandle(
            prop: *mut CUmemAllocationProp,
            handle: CUmemGenericAllocationHandle,
        );
        #[hook(by_hand)]
        cuMemExportToShareableHandle(
            shareable: *mut c_void,
            handle: CUmemGenericAllocationHandle,
            handle_type: u32,
            flags: c_ulonglong,
        );
        #[hook(by_hand)]
        cuMemImportFromShareableHandle(
            handle: *mut CUmemGenericAllocationHandle,
            os_handle: *mut c_void,
            handle_type: u32,
        );
        #[hook(rt.primary_ctx_retain(dev) -> ctx)]
        cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice);
        #[hook(rt.primary_ctx_release(dev))]
        cuDevicePrimaryCtxRelease_v2 = cuDevicePrimaryCtxRelease @ 12000 (dev: CUdevice);
        #[hook(rt.primary_ctx_reset(dev))]
        cuDevicePrimaryCtxReset_v2 = cuDevicePrimaryCtxReset @ 12000 (dev: CUdevice);
        #[hook(rt.ctx_destroy(ctx))]
        cuCtxDestroy_v2 = cuCtxDestroy @ 12000 (ctx: CUcontext);
        #[hook(rt.ctx_enable_peer_access(peer, flags))]
        cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint);
        #[hook(rt.ctx_disable_peer_access(peer))]
        cuCtxDisablePeerAccess(peer: CUcontext);
        #[hook(rt.mem_alloc(bytes) -> dptr)]
        cuMemAlloc_v2 = cuMemAlloc @ 12000 (dptr: *mut CUdeviceptr, bytes: usize);
        #[hook(rt.mem_free_any(dptr))]
        cuMemFree_v2 = cuMemFree @ 12000 (dptr: CUdeviceptr);
        #[hook(by_hand)]
        cuMemGetAddressRange_v2 = cuMemGetAddressRange @ 12000 (
            base: *mut CUdeviceptr,
            size: *mut usize,
            dptr: CUdeviceptr,
        );
        #[hook(by_hand)]
        cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr);
        #[hook(by_hand)]
        cuPointerGetAttributes(
            count: c_uint,
            attributes: *mut c_uint,
            data: *mut *mut c_void,
            ptr: CUdeviceptr,
        );
        #[hook(unowned(Pitched, pitched(pitch, width, height)) -> dptr)]
        cuMemAllocPitch_v2 = cuMemAllocPitch @ 12000 (
            dptr: *mut CUdeviceptr,
            pitch: *mut usize,
            width: usize,
            height: usize,
            element_size: c_uint,
        );
        #[hook(unowned(Managed, bytes) -> dptr)]
        cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint);
        #[hook(unowned(StreamOrdered, bytes) -> dptr)]
        cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream);
        #[hook(unowned(StreamOrdered, bytes) -> dptr)]
        cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream);
        #[hook(unowned_freed(dptr))]
        cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream);
        #[hook(unowned_freed(dptr))]
        cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream);
        #[hook(rt.ipc_get_mem_handle(dptr) -> handle)]
        cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr);
        #[hook(rt.ipc_open_mem_handle(handle, flags) -> dptr)]
        cuIpcOpenMemHandle_v2 = cuIpcOpenMemHandle @ 12000 (
            dptr: *mut CUdeviceptr,
            handle: CUipcMemHandle,
            flags: c_uint,
        );
        #[hook(rt.ipc_close_mem_handle(dptr))]
        cuIpcCloseMemHandle(dptr: CUdeviceptr);
        #[hook(rt.multicast_create(read(prop)) -> handle(handle))]
        cuMulticastCreate(
            handle: *mut CUmemGenericAllocationHandle,
            prop: *const CUmulticastObjectProp,
        );
        #[hook(rt.multicast_add_device(handle(handle), dev))]
        cuMulticastAddDevice(handle: CUmemGenericAllocationHandle, dev: CUdevice);
        #[hook(rt.multicast_bind_mem(handle(mc), mc_offset, handle(mem), mem_offset, size, flags))]
        cuMulticastBindMem(
            mc: CUmemGenericAllocationHandle,
            mc_offset: usize,
            mem: CUmemGenericAllocationHandle,
            mem_offset: usize,
            size: usize,
            flags: c_ulonglong,
        );
        #[hook(rt.multicast_bind_mem_v2(
            handle(mc), dev, mc_offset, handle(mem), mem_offset, size, flags
        ))]
        cuMulticastBindMem_v2 = cuMulticastBindMem @ 13010 (
            mc: CUmemGenericAllocationHandle,
            dev: CUdevice,
            mc_offset: usize,
            mem: CUmemGenericAllocationHandle,
            mem_offset: usize,
            size: usize,
            flags: c_ulonglong,
        );
        #[hook(rt.multicast_bind_addr(handle(mc), mc_offset, ptr, size, flags))]
        cuMulticastBindAddr(
            mc: CUmemGenericAllocationHandle,
            mc_offset: usize,
            ptr: CUdeviceptr,
            size: usize,
            flags: c_ulonglong,
        );
        #[hook(rt.multicast_bind_addr_v2(handle(mc), dev, mc_offset, ptr, size, flags))]
        cuMulticastBindAddr_v2 = cuMulticastBindAddr @ 13010 (
            mc: CUmemGenericAllocationHandle,
            dev: CUdevice,
            mc_offset: usize,
            ptr: CUdeviceptr,
            size: usize,
            flags: c_ulonglong,
        );
        #[hook(rt.multicast_unbind(handle(mc), dev, mc_offset, size))]
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
