//! One safe method per table entry, in Rust values: out-parameters are return values, slices carry
//! their lengths, allocation handles are [`DriverHandle`]s, and every result goes through
//! [`crate::check`]. Addresses of device memory (`CUdeviceptr`), contexts and streams are values
//! the driver validates; host memory a copy reads or writes while the call is running is a slice.
//! Calls whose memory outlives the call (asynchronous copies, host registration) are the
//! `unsafe` ones, and the owned types of [`crate::owned`] wrap them.

use crate::{CudaError, DriverHandle, DriverTable, ForeignPtr};
use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use cuda_abi::*;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

type Result<T> = core::result::Result<T, CudaError>;

impl DriverTable {
    /// `cuInit`.
    pub fn init(&self, flags: u32) -> Result<()> {
        // SAFETY: no pointers.
        unsafe { self.cuInit(flags) }
    }

    /// `cuDriverGetVersion`, e.g. 13000.
    pub fn driver_version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuDriverGetVersion(&mut v) }?;
        Ok(v)
    }

    /// The driver's own name for a result (`cuGetErrorName`), else this crate's, else `CUresult(N)`.
    pub fn error_name(&self, result: CUresult) -> String {
        let mut out: *const c_char = core::ptr::null();
        // SAFETY: a valid out-pointer; the driver returns a static NUL-terminated string.
        if unsafe { self.cuGetErrorName(result, &mut out) }.is_ok() && !out.is_null() {
            // SAFETY: the driver returned a NUL-terminated static string.
            return unsafe { CStr::from_ptr(out) }
                .to_string_lossy()
                .into_owned();
        }
        match result.name() {
            Some(name) => name.to_owned(),
            None => format!("CUresult({})", result.0),
        }
    }

    /// `cuDeviceGet`.
    pub fn device_get(&self, ordinal: i32) -> Result<CUdevice> {
        let mut d: CUdevice = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuDeviceGet(&mut d, ordinal) }?;
        Ok(d)
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<i32> {
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuDeviceGetCount(&mut n) }?;
        Ok(n)
    }

    /// `cuDeviceGetName`, e.g. "NVIDIA H200".
    pub fn device_name(&self, device: CUdevice) -> Result<String> {
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds `len + 1` bytes and the driver writes at most `len`, NUL
        // included, so the last byte stays 0.
        unsafe { self.cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int - 1, device) }?;
        // SAFETY: NUL-terminated within the buffer (above).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    /// `cuDeviceGetUuid`.
    pub fn device_uuid(&self, device: CUdevice) -> Result<CUuuid> {
        let mut u = CUuuid::default();
        // SAFETY: a valid out-pointer.
        unsafe { self.cuDeviceGetUuid(&mut u, device) }?;
        Ok(u)
    }

    /// `cuDevicePrimaryCtxRetain` (see [`crate::owned::PrimaryContext`] for the owned form).
    pub fn primary_ctx_retain(&self, device: CUdevice) -> Result<CUcontext> {
        let mut ctx: CUcontext = core::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { self.cuDevicePrimaryCtxRetain(&mut ctx, device) }?;
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxGetState`: whether the device's primary context is active (made and
    /// retained by someone), without making it.
    pub fn primary_ctx_active(&self, device: CUdevice) -> Result<bool> {
        let mut flags: c_uint = 0;
        let mut active: c_int = 0;
        // SAFETY: valid out-pointers.
        unsafe { self.cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) }?;
        Ok(active != 0)
    }

    /// `cuDevicePrimaryCtxRelease`.
    pub fn primary_ctx_release(&self, device: CUdevice) -> Result<()> {
        // SAFETY: no pointers.
        unsafe { self.cuDevicePrimaryCtxRelease_v2(device) }
    }

    /// `cuDevicePrimaryCtxReset`.
    pub fn primary_ctx_reset(&self, device: CUdevice) -> Result<()> {
        // SAFETY: no pointers.
        unsafe { self.cuDevicePrimaryCtxReset_v2(device) }
    }

    /// `cuCtxDestroy`.
    // The context is an opaque handle: passed by value, never dereferenced on this side; the
    // driver validates it.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn ctx_destroy(&self, ctx: CUcontext) -> Result<()> {
        // SAFETY: the context is passed by value, never dereferenced here; the driver checks it.
        unsafe { self.cuCtxDestroy_v2(ctx) }
    }

    /// `cuCtxEnablePeerAccess` from the current context to `peer`'s device.
    // As for `ctx_destroy`: an opaque handle, never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn ctx_enable_peer_access(&self, peer: CUcontext, flags: u32) -> Result<()> {
        // SAFETY: no pointer is dereferenced; the driver validates the context.
        unsafe { self.cuCtxEnablePeerAccess(peer, flags) }
    }

    /// `cuCtxDisablePeerAccess`.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn ctx_disable_peer_access(&self, peer: CUcontext) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.cuCtxDisablePeerAccess(peer) }
    }

    /// `cuCtxGetCurrent`.
    pub fn ctx_current(&self) -> Result<CUcontext> {
        let mut ctx: CUcontext = core::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { self.cuCtxGetCurrent(&mut ctx) }?;
        Ok(ctx)
    }

    /// `cuCtxSetCurrent` of a context this crate retained (see [`crate::owned::PrimaryContext`]).
    pub(crate) fn ctx_set_current(&self, ctx: CUcontext) -> Result<()> {
        // SAFETY: the context is passed by value; the driver never dereferences it for us.
        unsafe { self.cuCtxSetCurrent(ctx) }
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&self, attrib: i32, device: CUdevice) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuDeviceGetAttribute(&mut v, attrib, device) }?;
        Ok(v)
    }

    /// `cuCtxGetDevice`: the device of the current context.
    pub fn ctx_device(&self) -> Result<CUdevice> {
        let mut dev: CUdevice = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuCtxGetDevice(&mut dev) }?;
        Ok(dev)
    }

    /// `cuCtxGetLimit`: a limit of the current context (`cuda_abi::limit`).
    pub fn ctx_get_limit(&self, limit: c_int) -> Result<usize> {
        let mut value = 0usize;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuCtxGetLimit(&mut value, limit) }?;
        Ok(value)
    }

    /// `cuCtxSetLimit`: sets a limit of the current context (`cuda_abi::limit`).
    pub fn ctx_set_limit(&self, limit: c_int, value: usize) -> Result<()> {
        // SAFETY: no pointers.
        unsafe { self.cuCtxSetLimit(limit, value) }
    }

    /// `cuCtxSynchronize`.
    pub fn ctx_synchronize(&self) -> Result<()> {
        // SAFETY: no pointers.
        unsafe { self.cuCtxSynchronize() }
    }

    /// `cuMemGetInfo`: `(free, total)` bytes of the current context's device.
    pub fn mem_get_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        unsafe { self.cuMemGetInfo_v2(&mut free, &mut total) }?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemAlloc`.
    pub fn mem_alloc(&self, bytes: usize) -> Result<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuMemAlloc_v2(&mut p, bytes) }?;
        Ok(p)
    }

    /// `cuMemAllocManaged` with `flags` (`CU_MEM_ATTACH_GLOBAL` = 1, `HOST` = 2).
    pub fn mem_alloc_managed(&self, bytes: usize, flags: u32) -> Result<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuMemAllocManaged(&mut p, bytes, flags) }?;
        Ok(p)
    }

    /// `cuMemAllocAsync` on the legacy default stream.
    pub fn mem_alloc_async(&self, bytes: usize) -> Result<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the null stream is the legacy default stream.
        unsafe { self.cuMemAllocAsync(&mut p, bytes, core::ptr::null_mut()) }?;
        Ok(p)
    }

    /// `cuMemFreeAsync` on the legacy default stream.
    pub fn mem_free_async(&self, ptr: CUdeviceptr) -> Result<()> {
        // SAFETY: a device address the driver validates; the null stream is the default one.
        unsafe { self.cuMemFreeAsync(ptr, core::ptr::null_mut()) }
    }

    /// `cuMemAllocPitch`: `(base, pitch)` of `height` rows of `width` bytes.
    pub fn mem_alloc_pitch(
        &self,
        width: usize,
        height: usize,
        element_size: u32,
    ) -> Result<(CUdeviceptr, usize)> {
        let (mut p, mut pitch): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers.
        unsafe { self.cuMemAllocPitch_v2(&mut p, &mut pitch, width, height, element_size) }?;
        Ok((p, pitch))
    }

    /// `cuMemFree`.
    pub fn mem_free(&self, ptr: CUdeviceptr) -> Result<()> {
        // SAFETY: a device address; the driver validates it.
        unsafe { self.cuMemFree_v2(ptr) }
    }

    /// `cuMemGetAddressRange`: `(base, size)` of the allocation holding `ptr`.
    pub fn mem_address_range(&self, ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
        let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers.
        unsafe { self.cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }?;
        Ok((base, size))
    }

    /// `cuPointerGetAttribute` of an attribute whose value is a `T` (the caller picks the
    /// attribute's width; a boolean attribute read as `u32` from a zeroed value is right for
    /// either width the driver may write).
    pub fn pointer_attribute<T: Copy + Default>(
        &self,
        attribute: c_uint,
        ptr: CUdeviceptr,
    ) -> Result<T> {
        let mut value = T::default();
        // SAFETY: a valid out-pointer of the width the caller chose for this attribute.
        unsafe { self.cuPointerGetAttribute((&raw mut value).cast(), attribute, ptr) }?;
        Ok(value)
    }

    /// `cuPointerGetAttributes` of `attributes`, each value read as a `u64` (zeroed first, so
    /// narrower values read right on little-endian hosts).
    pub fn pointer_attributes(&self, attributes: &[c_uint], ptr: CUdeviceptr) -> Result<Vec<u64>> {
        let mut values = vec![0u64; attributes.len()];
        let mut slots: Vec<*mut c_void> =
            values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let mut attributes = attributes.to_vec();
        let count = c_uint::try_from(attributes.len()).map_err(|_| CudaError {
            call: "cuPointerGetAttributes",
            result: CUresult::ERROR_INVALID_VALUE,
        })?;
        // SAFETY: `count` attributes and as many 8-byte slots, each valid for the call.
        unsafe {
            self.cuPointerGetAttributes(count, attributes.as_mut_ptr(), slots.as_mut_ptr(), ptr)
        }?;
        Ok(values)
    }

    /// `cuMemcpyHtoD`: the whole of `src` to `dst`.
    pub fn memcpy_htod(&self, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is readable for its length during this synchronous copy.
        unsafe { self.cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) }
    }

    /// `cuMemcpyDtoH`: fills the whole of `dst` from `src`.
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
        // SAFETY: `dst` is writable for its length during this synchronous copy.
        unsafe { self.cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) }
    }

    /// `cuMemsetD8`.
    pub fn memset_d8(&self, dst: CUdeviceptr, value: u8, count: usize) -> Result<()> {
        // SAFETY: device addresses only; the driver validates them.
        unsafe { self.cuMemsetD8_v2(dst, value, count) }
    }

    /// `cuMemCreate`.
    pub fn mem_create(
        &self,
        size: usize,
        prop: &CUmemAllocationProp,
        flags: u64,
    ) -> Result<DriverHandle> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer and property struct.
        unsafe { self.cuMemCreate(&mut h, size, prop, flags) }?;
        Ok(DriverHandle::from_raw(h))
    }

    /// `cuMemRelease`.
    pub fn mem_release(&self, handle: DriverHandle) -> Result<()> {
        // SAFETY: a handle value; the driver validates it.
        unsafe { self.cuMemRelease(handle.raw()) }
    }

    /// `cuMemAddressReserve`.
    pub fn mem_address_reserve(
        &self,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) -> Result<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuMemAddressReserve(&mut p, size, alignment, addr, flags) }?;
        Ok(p)
    }

    /// `cuMemAddressFree`.
    pub fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Result<()> {
        // SAFETY: device addresses only.
        unsafe { self.cuMemAddressFree(ptr, size) }
    }

    /// `cuMemMap`.
    pub fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: DriverHandle,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: values only; the driver validates them.
        unsafe { self.cuMemMap(ptr, size, offset, handle.raw(), flags) }
    }

    /// `cuMemUnmap`.
    pub fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Result<()> {
        // SAFETY: values only.
        unsafe { self.cuMemUnmap(ptr, size) }
    }

    /// `cuMemSetAccess` with every descriptor of `desc`.
    pub fn mem_set_access(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        desc: &[CUmemAccessDesc],
    ) -> Result<()> {
        // SAFETY: `desc` is valid for `desc.len()` elements.
        unsafe { self.cuMemSetAccess(ptr, size, desc.as_ptr(), desc.len()) }
    }

    /// `cuMemGetAccess` of `location` on `ptr`.
    pub fn mem_get_access(&self, location: &CUmemLocation, ptr: CUdeviceptr) -> Result<u64> {
        let mut flags: u64 = 0;
        // SAFETY: a valid location and out-pointer.
        unsafe { self.cuMemGetAccess(&mut flags, location, ptr) }?;
        Ok(flags)
    }

    /// `cuMemRetainAllocationHandle` of the allocation mapped at `addr`.
    pub fn mem_retain_allocation_handle(&self, addr: CUdeviceptr) -> Result<DriverHandle> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: the address is passed by value as the driver's `void*` (a device address it
        // only looks up).
        unsafe { self.cuMemRetainAllocationHandle(&mut h, addr as usize as *mut c_void) }?;
        Ok(DriverHandle::from_raw(h))
    }

    /// `cuMemGetAllocationPropertiesFromHandle`.
    pub fn mem_allocation_properties(&self, handle: DriverHandle) -> Result<CUmemAllocationProp> {
        let mut prop = CUmemAllocationProp::default();
        // SAFETY: a valid out-pointer.
        unsafe { self.cuMemGetAllocationPropertiesFromHandle(&mut prop, handle.raw()) }?;
        Ok(prop)
    }

    /// `cuMemGetAllocationGranularity`.
    pub fn mem_allocation_granularity(
        &self,
        prop: &CUmemAllocationProp,
        option: u32,
    ) -> Result<usize> {
        let mut g: usize = 0;
        // SAFETY: a valid out-pointer and property struct.
        unsafe { self.cuMemGetAllocationGranularity(&mut g, prop, option) }?;
        Ok(g)
    }

    /// `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`: the one export to a descriptor,
    /// owned (closed on drop) and made close-on-exec, since a descriptor the driver made
    /// inheritable would keep device memory alive in every program exec'd later.
    pub fn mem_export_fd(&self, handle: DriverHandle, flags: u64) -> Result<OwnedFd> {
        const CALL: &str = "cuMemExportToShareableHandle";
        let mut fd: c_int = -1;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the out-pointer is an `int*`.
        unsafe {
            self.cuMemExportToShareableHandle(
                (&raw mut fd).cast(),
                handle.raw(),
                handle_type::POSIX_FILE_DESCRIPTOR,
                flags,
            )
        }?;
        if fd < 0 {
            return Err(CudaError {
                call: CALL,
                result: CUresult::ERROR_UNKNOWN,
            });
        }
        // SAFETY: the driver handed over a new descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // Best effort, ignored on failure: the descriptor works either way, and the one holder
        // that keeps descriptors for long (the shim's export cache) sets and logs it itself.
        let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
        Ok(owned)
    }

    /// `cuMemExportToShareableHandle(FABRIC)`.
    pub fn mem_export_fabric(&self, handle: DriverHandle) -> Result<CUmemFabricHandle> {
        let mut out = CUmemFabricHandle { data: [0; 64] };
        // SAFETY: for FABRIC the out-pointer is a `CUmemFabricHandle*`.
        unsafe {
            self.cuMemExportToShareableHandle(
                (&raw mut out).cast(),
                handle.raw(),
                handle_type::FABRIC,
                0,
            )
        }?;
        Ok(out)
    }

    /// `cuMemExportToShareableHandle` into the application's own out-argument, for handle types
    /// the shim passes through.
    pub fn mem_export_foreign(
        &self,
        out: ForeignPtr,
        handle: DriverHandle,
        handle_type: u32,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: `out` came with this call from the application, which owes the driver's
        // contract for it (ForeignPtr::new).
        unsafe { self.cuMemExportToShareableHandle(out.get(), handle.raw(), handle_type, flags) }
    }

    /// `cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)`: the one import of a descriptor,
    /// which stays the caller's.
    pub fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> Result<DriverHandle> {
        self.mem_import_raw_fd(fd.as_raw_fd())
    }

    /// The import of a descriptor number that may be closed or foreign (error paths): the driver
    /// only reads the number.
    pub fn mem_import_raw_fd(&self, fd: c_int) -> Result<DriverHandle> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the OS handle is the descriptor number cast to a
        // pointer (cuda.h), never dereferenced.
        unsafe {
            self.cuMemImportFromShareableHandle(
                &mut h,
                fd as isize as *mut c_void,
                handle_type::POSIX_FILE_DESCRIPTOR,
            )
        }?;
        Ok(DriverHandle::from_raw(h))
    }

    /// `cuMemImportFromShareableHandle` of the application's own OS handle.
    pub fn mem_import_foreign(
        &self,
        os_handle: ForeignPtr,
        handle_type: u32,
    ) -> Result<DriverHandle> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: `os_handle` came with this call from the application (ForeignPtr::new).
        unsafe { self.cuMemImportFromShareableHandle(&mut h, os_handle.get(), handle_type) }?;
        Ok(DriverHandle::from_raw(h))
    }

    /// `cuIpcGetMemHandle`.
    pub fn ipc_get_mem_handle(&self, ptr: CUdeviceptr) -> Result<CUipcMemHandle> {
        let mut h = CUipcMemHandle::default();
        // SAFETY: a valid out-pointer.
        unsafe { self.cuIpcGetMemHandle(&mut h, ptr) }?;
        Ok(h)
    }

    /// `cuIpcOpenMemHandle`.
    pub fn ipc_open_mem_handle(&self, handle: CUipcMemHandle, flags: u32) -> Result<CUdeviceptr> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the handle is passed by value.
        unsafe { self.cuIpcOpenMemHandle_v2(&mut p, handle, flags) }?;
        Ok(p)
    }

    /// `cuIpcCloseMemHandle`.
    pub fn ipc_close_mem_handle(&self, ptr: CUdeviceptr) -> Result<()> {
        // SAFETY: a value only.
        unsafe { self.cuIpcCloseMemHandle(ptr) }
    }

    /// `cuMulticastCreate`.
    pub fn multicast_create(&self, prop: &CUmulticastObjectProp) -> Result<DriverHandle> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer and property struct.
        unsafe { self.cuMulticastCreate(&mut h, prop) }?;
        Ok(DriverHandle::from_raw(h))
    }

    /// `cuMulticastGetGranularity`.
    pub fn multicast_granularity(
        &self,
        prop: &CUmulticastObjectProp,
        option: u32,
    ) -> Result<usize> {
        let mut g = 0usize;
        // SAFETY: a valid out-pointer and property struct.
        unsafe { self.cuMulticastGetGranularity(&mut g, prop, option) }?;
        Ok(g)
    }

    /// `cuMulticastAddDevice`.
    pub fn multicast_add_device(&self, mc: DriverHandle, device: CUdevice) -> Result<()> {
        // SAFETY: values only.
        unsafe { self.cuMulticastAddDevice(mc.raw(), device) }
    }

    /// `cuMulticastBindMem`.
    pub fn multicast_bind_mem(
        &self,
        mc: DriverHandle,
        mc_offset: usize,
        mem: DriverHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: values only.
        unsafe { self.cuMulticastBindMem(mc.raw(), mc_offset, mem.raw(), mem_offset, size, flags) }
    }

    /// `cuMulticastBindMem_v2`.
    #[allow(clippy::too_many_arguments)]
    pub fn multicast_bind_mem_v2(
        &self,
        mc: DriverHandle,
        device: CUdevice,
        mc_offset: usize,
        mem: DriverHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: values only.
        unsafe {
            self.cuMulticastBindMem_v2(
                mc.raw(),
                device,
                mc_offset,
                mem.raw(),
                mem_offset,
                size,
                flags,
            )
        }
    }

    /// `cuMulticastBindAddr`.
    pub fn multicast_bind_addr(
        &self,
        mc: DriverHandle,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: values only.
        unsafe { self.cuMulticastBindAddr(mc.raw(), mc_offset, ptr, size, flags) }
    }

    /// `cuMulticastBindAddr_v2`.
    pub fn multicast_bind_addr_v2(
        &self,
        mc: DriverHandle,
        device: CUdevice,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: u64,
    ) -> Result<()> {
        // SAFETY: values only.
        unsafe { self.cuMulticastBindAddr_v2(mc.raw(), device, mc_offset, ptr, size, flags) }
    }

    /// `cuMulticastUnbind`.
    pub fn multicast_unbind(
        &self,
        mc: DriverHandle,
        device: CUdevice,
        mc_offset: usize,
        size: usize,
    ) -> Result<()> {
        // SAFETY: values only.
        unsafe { self.cuMulticastUnbind(mc.raw(), device, mc_offset, size) }
    }

    /// `cuModuleLoadData` of a PTX (or cubin) image, NUL-terminated as the driver requires.
    pub fn module_load_data(&self, image: &CStr) -> Result<CUmodule> {
        let mut module: CUmodule = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; the image is NUL-terminated and outlives the call (the
        // driver copies what it keeps).
        unsafe { self.cuModuleLoadData(&mut module, image.as_ptr().cast()) }?;
        Ok(module)
    }

    /// `cuModuleGetFunction`.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn module_get_function(&self, module: CUmodule, name: &CStr) -> Result<CUfunction> {
        let mut function: CUfunction = core::ptr::null_mut();
        // SAFETY: a valid out-pointer and a NUL-terminated name; the module is passed by value.
        unsafe { self.cuModuleGetFunction(&mut function, module, name.as_ptr()) }?;
        Ok(function)
    }

    /// `cuModuleUnload`.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn module_unload(&self, module: CUmodule) -> Result<()> {
        // SAFETY: the module is passed by value; the driver validates it.
        unsafe { self.cuModuleUnload(module) }
    }

    /// `cuLaunchKernel` of `f` on `stream` with `params` (no `extra`).
    ///
    /// # Safety
    /// `params` holds one pointer per parameter of the kernel, in order, each pointing at a value
    /// of that parameter's type, valid for the call (the driver copies the values at launch); the
    /// kernel's memory accesses are the caller's to make valid for as long as it runs.
    pub unsafe fn launch_kernel(
        &self,
        f: CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        stream: CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let params_ptr = if params.is_empty() {
            core::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: the caller vouches for the parameter pointers; `extra` is null.
        unsafe {
            self.cuLaunchKernel(
                f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_mem,
                stream,
                params_ptr,
                core::ptr::null_mut(),
            )
        }
    }

    /// `cuStreamCreate`: a raw stream (see [`crate::owned::Stream`] for one destroyed on drop).
    pub fn stream_create(&self, flags: u32) -> Result<CUstream> {
        let mut stream: CUstream = core::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { self.cuStreamCreate(&mut stream, flags) }?;
        Ok(stream)
    }

    /// `cuStreamDestroy`.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn stream_destroy(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the stream is passed by value; the driver validates it.
        unsafe { self.cuStreamDestroy_v2(stream) }
    }

    /// `cuStreamSynchronize`.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn stream_synchronize(&self, stream: CUstream) -> Result<()> {
        // SAFETY: the stream is passed by value.
        unsafe { self.cuStreamSynchronize(stream) }
    }

    /// `cuStreamQuery`: whether every piece of work on the stream is complete
    /// (`CUDA_ERROR_NOT_READY` is `false`, not an error).
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn stream_query(&self, stream: CUstream) -> Result<bool> {
        // SAFETY: the stream is passed by value.
        match unsafe { self.cuStreamQuery(stream) } {
            Ok(()) => Ok(true),
            Err(e) if e.result == CUresult::ERROR_NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `cuEventCreate`.
    pub fn event_create(&self, flags: u32) -> Result<CUevent> {
        let mut event: CUevent = core::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { self.cuEventCreate(&mut event, flags) }?;
        Ok(event)
    }

    /// `cuEventDestroy`.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn event_destroy(&self, event: CUevent) -> Result<()> {
        // SAFETY: the event is passed by value.
        unsafe { self.cuEventDestroy_v2(event) }
    }

    /// `cuEventRecord` of `event` on `stream`.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn event_record(&self, event: CUevent, stream: CUstream) -> Result<()> {
        // SAFETY: handles passed by value.
        unsafe { self.cuEventRecord(event, stream) }
    }

    /// `cuEventQuery`: whether the event's work is complete (`CUDA_ERROR_NOT_READY` is `false`).
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn event_query(&self, event: CUevent) -> Result<bool> {
        // SAFETY: the event is passed by value.
        match unsafe { self.cuEventQuery(event) } {
            Ok(()) => Ok(true),
            Err(e) if e.result == CUresult::ERROR_NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `cuEventSynchronize`.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn event_synchronize(&self, event: CUevent) -> Result<()> {
        // SAFETY: the event is passed by value.
        unsafe { self.cuEventSynchronize(event) }
    }

    /// `cuMemcpyHtoDAsync` of `bytes` bytes from `src` on `stream`.
    ///
    /// # Safety
    /// `src` is readable for `bytes` bytes and not written until the copy has completed (the
    /// stream is synchronised); page-locked memory makes the copy truly asynchronous.
    pub unsafe fn memcpy_htod_async(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        bytes: usize,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller keeps `src` valid until the copy completes.
        unsafe { self.cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream) }
    }

    /// `cuMemcpyDtoHAsync` of `bytes` bytes into `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` is writable for `bytes` bytes and neither read nor written by anyone else until the
    /// copy has completed (the stream is synchronised).
    pub unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller keeps `dst` valid and unaliased until the copy completes.
        unsafe { self.cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, stream) }
    }

    /// `cuCtxSetCurrent`: makes `ctx` (a context of this process, e.g. another thread's current
    /// one) current on the calling thread.
    // Opaque handles, passed by value and never dereferenced on this side.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn ctx_make_current(&self, ctx: CUcontext) -> Result<()> {
        self.ctx_set_current(ctx)
    }

    /// `cuCheckpointProcessLock` of process `pid`.
    pub fn checkpoint_lock(&self, pid: i32, timeout_ms: u32) -> Result<()> {
        let mut args = CUcheckpointLockArgs {
            timeoutMs: timeout_ms,
            ..Default::default()
        };
        // SAFETY: a valid, zero-reserved argument struct of the header's layout.
        unsafe { self.cuCheckpointProcessLock(pid, &mut args) }
    }

    /// `cuCheckpointProcessCheckpoint`.
    pub fn checkpoint_checkpoint(&self, pid: i32) -> Result<()> {
        let mut args = CUcheckpointCheckpointArgs::default();
        // SAFETY: as for the lock.
        unsafe { self.cuCheckpointProcessCheckpoint(pid, &mut args) }
    }

    /// `cuCheckpointProcessRestore`, remapping GPUs as `pairs` says (old UUID, new UUID).
    pub fn checkpoint_restore(&self, pid: i32, pairs: &[(CUuuid, CUuuid)]) -> Result<()> {
        let mut gpu_pairs: Vec<CUcheckpointGpuPair> = pairs
            .iter()
            .map(|&(old, new)| CUcheckpointGpuPair {
                oldUuid: old,
                newUuid: new,
            })
            .collect();
        let mut args = CUcheckpointRestoreArgs::default();
        if !gpu_pairs.is_empty() {
            args.gpuPairs = gpu_pairs.as_mut_ptr();
            args.gpuPairsCount = u32::try_from(gpu_pairs.len()).unwrap_or(u32::MAX);
        }
        // SAFETY: `args` is zero-reserved; `gpuPairs` points at `gpuPairsCount` pairs that outlive
        // the call.
        unsafe { self.cuCheckpointProcessRestore(pid, &mut args) }
    }

    /// `cuCheckpointProcessUnlock`.
    pub fn checkpoint_unlock(&self, pid: i32) -> Result<()> {
        let mut args = CUcheckpointUnlockArgs::default();
        // SAFETY: as for the lock.
        unsafe { self.cuCheckpointProcessUnlock(pid, &mut args) }
    }

    /// `cuCheckpointProcessGetRestoreThreadId`: the thread of `pid` that carries out its restore
    /// (the one thread that must run while a process CRIU brought back is restored).
    pub fn checkpoint_restore_thread(&self, pid: i32) -> Result<i32> {
        let mut tid = 0;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuCheckpointProcessGetRestoreThreadId(pid, &mut tid) }?;
        Ok(tid)
    }

    /// `cuCheckpointProcessGetState`: a [`cuda_abi::process_state`] value.
    pub fn checkpoint_state(&self, pid: i32) -> Result<u32> {
        let mut state = 0u32;
        // SAFETY: a valid out-pointer.
        unsafe { self.cuCheckpointProcessGetState(pid, &mut state) }?;
        Ok(state)
    }
}
