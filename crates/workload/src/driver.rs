//! The CUDA driver as the workload loads it: the `cuda` crate's table, opened with its
//! `libloading` loader through the route the command line picks ([`Resolve`]: `dlsym` with the
//! exact ABI names, or `cuGetProcAddress_v2` as the CUDA runtime does, because the shim must be
//! reachable both ways), and the workload's vocabulary over the `cuda` crate's safe methods (sizes
//! as `u64`, IPC handles as bytes, allocation handles as the application holds them).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use cuda::DriverHandle;
use cuda_abi::*;

/// The raw entry points: the busy loops and kernels hold them, and the test kit's error probes call
/// them with bad arguments.
pub use cuda::DriverTable as Api;
pub use cuda::{CudaError as CuError, LoadError, PINNED_CUDA_VERSION, Resolve};

/// The loaded driver. Calls act on the calling thread's current context, as the driver's do.
#[derive(Debug)]
pub struct Driver {
    loaded: cuda::Loaded,
    /// The library exports `fakeCudaUsage` ([`exports_fake_usage`]).
    bundled_fake: bool,
}

/// An application's allocation handle, as the workload holds it (virtual under the shim).
fn handle(h: CUmemGenericAllocationHandle) -> DriverHandle {
    DriverHandle::from_raw(h)
}

/// Whether the driver `library` (loaded already, by the same name) exports `fakeCudaUsage`, which
/// only the bundled fake driver (crates/fake-cuda) has and no real driver does. Opened by the name
/// the driver was loaded by, so that the handle is the driver's even under the shim (whose `cuInit`
/// is what the driver's path resolves to there). The workload is test tooling: the tool and the
/// driver layer know nothing of the fake.
#[allow(unsafe_code)] // dlopen and dlsym of the library the driver was loaded from
fn exports_fake_usage(library: &Path) -> bool {
    // SAFETY: `cuda::load` loaded this library into the process already and never unloads it, so
    // opening it again only takes another reference; no initialiser runs a second time.
    let Ok(library) = (unsafe { libloading::Library::new(library) }) else {
        return false;
    };
    // SAFETY: the symbol is only looked up, never called or read.
    unsafe { library.get::<*mut core::ffi::c_void>(b"fakeCudaUsage\0") }.is_ok()
}

impl Driver {
    /// Opens `library` (a name the loader searches, or a path) and resolves every entry point.
    pub fn load(library: &Path, route: Resolve) -> Result<Driver, LoadError> {
        Ok(Driver {
            loaded: cuda::load(library.as_os_str(), route)?,
            bundled_fake: exports_fake_usage(library),
        })
    }

    /// The resolved entry points.
    pub fn api(&self) -> &Api {
        self.loaded.table()
    }

    /// Whether the library is the bundled fake driver: the gate of every multicast command
    /// (multicast must never run on a real GPU here: docs/design.md, GPU rules).
    pub fn is_bundled_fake(&self) -> bool {
        self.bundled_fake
    }

    /// The library's file.
    pub fn path(&self) -> &'static Path {
        self.loaded.path()
    }

    /// The route the entry points came through.
    pub fn route(&self) -> Resolve {
        self.loaded.route()
    }

    /// The driver's own name for a result (`cuGetErrorName`), or `CUresult(N)`.
    pub fn error_name(&self, result: CUresult) -> String {
        self.api().error_name(result)
    }

    /// `cuInit`.
    pub fn init(&self) -> Result<(), CuError> {
        self.api().init(0)
    }

    /// `cuDriverGetVersion`.
    pub fn driver_version(&self) -> Result<i32, CuError> {
        self.api().driver_version()
    }

    /// `cuDeviceGet`.
    pub fn device(&self, ordinal: i32) -> Result<CUdevice, CuError> {
        self.api().device_get(ordinal)
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<i32, CuError> {
        self.api().device_count()
    }

    /// `cuDeviceGetUuid`.
    pub fn device_uuid(&self, device: CUdevice) -> Result<[u8; 16], CuError> {
        Ok(self.api().device_uuid(device)?.bytes.map(|b| b as u8))
    }

    /// Retains the primary context of `device` and makes it current on this thread, for the rest
    /// of the workload's life.
    pub fn use_primary_context(&self, device: CUdevice) -> Result<(), CuError> {
        cuda::owned::PrimaryContext::enter(self.api(), device, |e| {
            eprintln!("workload: releasing a primary context: {e}")
        })?
        .keep();
        Ok(())
    }

    /// `cuCtxSynchronize`.
    pub fn synchronize(&self) -> Result<(), CuError> {
        self.api().ctx_synchronize()
    }

    /// `cuMemGetInfo`: (free, total) bytes of the current context's device.
    pub fn mem_info(&self) -> Result<(u64, u64), CuError> {
        self.api().mem_get_info()
    }

    /// `cuMemAlloc`.
    pub fn malloc(&self, size: u64) -> Result<CUdeviceptr, CuError> {
        self.api().mem_alloc(size as usize)
    }

    /// `cuMemAllocManaged` (attached globally).
    pub fn malloc_managed(&self, size: u64) -> Result<CUdeviceptr, CuError> {
        self.api().mem_alloc_managed(size as usize, 1)
    }

    /// `cuMemAllocAsync` on the default stream.
    pub fn malloc_async(&self, size: u64) -> Result<CUdeviceptr, CuError> {
        self.api().mem_alloc_async(size as usize)
    }

    /// `cuMemFreeAsync` on the default stream.
    pub fn free_async(&self, ptr: CUdeviceptr) -> Result<(), CuError> {
        self.api().mem_free_async(ptr)
    }

    /// `cuMemAllocPitch` of 4 rows of `size / 4` bytes (4-byte elements): the base.
    pub fn malloc_pitch(&self, size: u64) -> Result<CUdeviceptr, CuError> {
        let (base, _pitch) = self.api().mem_alloc_pitch(size as usize / 4, 4, 4)?;
        Ok(base)
    }

    /// `cuMemFree`.
    pub fn free(&self, ptr: CUdeviceptr) -> Result<(), CuError> {
        self.api().mem_free(ptr)
    }

    /// `cuMemGetAddressRange`: (base, size) of the allocation holding `ptr`.
    pub fn address_range(&self, ptr: CUdeviceptr) -> Result<(CUdeviceptr, u64), CuError> {
        let (base, size) = self.api().mem_address_range(ptr)?;
        Ok((base, size as u64))
    }

    /// `cuMemcpyHtoD`.
    pub fn copy_to_device(&self, dst: CUdeviceptr, src: &[u8]) -> Result<(), CuError> {
        self.api().memcpy_htod(dst, src)
    }

    /// `cuMemcpyDtoH`.
    pub fn copy_from_device(&self, dst: &mut [u8], src: CUdeviceptr) -> Result<(), CuError> {
        self.api().memcpy_dtoh(dst, src)
    }

    /// `cuMemsetD8`.
    pub fn memset(&self, dst: CUdeviceptr, value: u8, count: u64) -> Result<(), CuError> {
        self.api().memset_d8(dst, value, count as usize)
    }

    /// `cuMemCreate`.
    pub fn mem_create(
        &self,
        size: u64,
        prop: &CUmemAllocationProp,
    ) -> Result<CUmemGenericAllocationHandle, CuError> {
        Ok(self.api().mem_create(size as usize, prop, 0)?.raw())
    }

    /// `cuMemRelease`.
    pub fn mem_release(&self, h: CUmemGenericAllocationHandle) -> Result<(), CuError> {
        self.api().mem_release(handle(h))
    }

    /// `cuMemAddressReserve`.
    pub fn address_reserve(
        &self,
        size: u64,
        alignment: u64,
        addr: CUdeviceptr,
    ) -> Result<CUdeviceptr, CuError> {
        self.api()
            .mem_address_reserve(size as usize, alignment as usize, addr, 0)
    }

    /// `cuMemAddressFree`.
    pub fn address_free(&self, ptr: CUdeviceptr, size: u64) -> Result<(), CuError> {
        self.api().mem_address_free(ptr, size as usize)
    }

    /// `cuMemMap`.
    pub fn map(
        &self,
        ptr: CUdeviceptr,
        size: u64,
        offset: u64,
        h: CUmemGenericAllocationHandle,
    ) -> Result<(), CuError> {
        self.api()
            .mem_map(ptr, size as usize, offset as usize, handle(h), 0)
    }

    /// `cuMemUnmap`.
    pub fn unmap(&self, ptr: CUdeviceptr, size: u64) -> Result<(), CuError> {
        self.api().mem_unmap(ptr, size as usize)
    }

    /// `cuMemSetAccess`.
    pub fn set_access(
        &self,
        ptr: CUdeviceptr,
        size: u64,
        desc: &[CUmemAccessDesc],
    ) -> Result<(), CuError> {
        self.api().mem_set_access(ptr, size as usize, desc)
    }

    /// `cuMemGetAccess` for a device location.
    pub fn get_access(&self, device: i32, ptr: CUdeviceptr) -> Result<u64, CuError> {
        let loc = CUmemLocation {
            type_: location_type::DEVICE,
            id: device,
        };
        self.api().mem_get_access(&loc, ptr)
    }

    /// `cuCtxEnablePeerAccess` (or, with `enable` false, `cuCtxDisablePeerAccess`) from the
    /// current context to `device`'s primary context. The enable keeps the primary context it
    /// retained (the peer must outlive the access); a successful disable gives that back.
    pub fn peer_access(&self, device: i32, enable: bool) -> Result<(), CuError> {
        let api = self.api();
        let peer = api.primary_ctx_retain(device)?;
        if enable {
            let done = api.ctx_enable_peer_access(peer, 0);
            if done.is_err() {
                api.primary_ctx_release(device)?;
            }
            return done;
        }
        let done = api.ctx_disable_peer_access(peer);
        api.primary_ctx_release(device)?;
        if done.is_ok() {
            api.primary_ctx_release(device)?;
        }
        done
    }

    /// `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`; the descriptor is made
    /// close-on-exec.
    pub fn export_fd(&self, h: CUmemGenericAllocationHandle) -> Result<OwnedFd, CuError> {
        let owned = self.api().mem_export_fd(handle(h), 0)?;
        // Best effort: a descriptor the driver made inheritable must not leak into exec'd children.
        let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
        Ok(owned)
    }

    /// `cuMemExportToShareableHandle(FABRIC)`: the 64 handle bytes.
    pub fn export_fabric(&self, h: CUmemGenericAllocationHandle) -> Result<[u8; 64], CuError> {
        Ok(self.api().mem_export_fabric(handle(h))?.data)
    }

    /// `cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)`; the descriptor stays ours.
    pub fn import_fd(&self, fd: BorrowedFd<'_>) -> Result<CUmemGenericAllocationHandle, CuError> {
        Ok(self.api().mem_import_fd(fd)?.raw())
    }

    /// Import with a raw descriptor number, for error paths (a closed or foreign number).
    pub fn import_raw_fd(&self, fd: i32) -> Result<CUmemGenericAllocationHandle, CuError> {
        Ok(self.api().mem_import_raw_fd(fd)?.raw())
    }

    /// `cuMemRetainAllocationHandle`.
    pub fn retain(&self, addr: CUdeviceptr) -> Result<CUmemGenericAllocationHandle, CuError> {
        Ok(self.api().mem_retain_allocation_handle(addr)?.raw())
    }

    /// `cuMemGetAllocationPropertiesFromHandle`.
    pub fn properties(
        &self,
        h: CUmemGenericAllocationHandle,
    ) -> Result<CUmemAllocationProp, CuError> {
        self.api().mem_allocation_properties(handle(h))
    }

    /// `cuMemGetAllocationGranularity`.
    pub fn granularity(&self, prop: &CUmemAllocationProp, option: u32) -> Result<u64, CuError> {
        Ok(self.api().mem_allocation_granularity(prop, option)? as u64)
    }

    /// `cuIpcGetMemHandle`.
    pub fn ipc_get(&self, ptr: CUdeviceptr) -> Result<[u8; 64], CuError> {
        Ok(self
            .api()
            .ipc_get_mem_handle(ptr)?
            .reserved
            .map(|b| b as u8))
    }

    /// `cuIpcOpenMemHandle` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
    pub fn ipc_open(&self, bytes: &[u8; 64]) -> Result<CUdeviceptr, CuError> {
        let h = CUipcMemHandle {
            reserved: bytes.map(|b| b as core::ffi::c_char),
        };
        self.api()
            .ipc_open_mem_handle(h, ipc_flags::LAZY_ENABLE_PEER_ACCESS)
    }

    /// `cuIpcCloseMemHandle`.
    pub fn ipc_close(&self, ptr: CUdeviceptr) -> Result<(), CuError> {
        self.api().ipc_close_mem_handle(ptr)
    }
}

/// Allocation properties for a pinned device allocation on `device` with `handle_types`.
pub fn device_prop(device: i32, handle_types: u32) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: allocation_type::PINNED,
        requestedHandleTypes: handle_types,
        location: CUmemLocation {
            type_: location_type::DEVICE,
            id: device,
        },
        ..CUmemAllocationProp::default()
    }
}

/// Parses `posix`, `fabric`, `none`, `posix+fabric`.
pub fn parse_handle_types(text: &str) -> Option<u32> {
    let mut bits = 0;
    for part in text.split('+') {
        bits |= match part {
            "posix" => handle_type::POSIX_FILE_DESCRIPTOR,
            "fabric" => handle_type::FABRIC,
            "none" => handle_type::NONE,
            _ => return None,
        };
    }
    Some(bits)
}

/// Names the bits of a handle-type set (`posix+fabric`, `none`).
pub fn handle_types_name(bits: u32) -> String {
    let mut parts = Vec::new();
    if bits & handle_type::POSIX_FILE_DESCRIPTOR != 0 {
        parts.push("posix".to_owned());
    }
    if bits & handle_type::FABRIC != 0 {
        parts.push("fabric".to_owned());
    }
    let rest = bits & !(handle_type::POSIX_FILE_DESCRIPTOR | handle_type::FABRIC);
    if rest != 0 {
        parts.push(format!("{rest:#x}"));
    }
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join("+")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_type_names_round_trip() {
        for text in ["posix", "fabric", "none", "posix+fabric"] {
            let bits = parse_handle_types(text).unwrap();
            assert_eq!(handle_types_name(bits), text);
        }
        assert_eq!(parse_handle_types("win32"), None);
        assert_eq!(handle_types_name(0x13), "posix+0x12");
    }

    #[test]
    fn resolve_spellings() {
        assert_eq!(Resolve::parse("dlsym"), Some(Resolve::Dlsym));
        assert_eq!(
            Resolve::parse("getprocaddress"),
            Some(Resolve::GetProcAddress)
        );
        assert_eq!(Resolve::parse("x"), None);
        assert_eq!(Resolve::GetProcAddress.as_str(), "getprocaddress");
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_crash() {
        let err = Driver::load(Path::new("/nonexistent/libcuda.so.1"), Resolve::Dlsym)
            .expect_err("must not load");
        assert!(matches!(err, LoadError::Open { .. }), "{err}");
    }

    #[test]
    fn only_a_library_exporting_the_fakes_symbol_is_the_fake() {
        // libc is in every process and exports no `fakeCudaUsage`; a library that does not load
        // is not the fake either. (The fake itself passes: the multicast tests run through it.)
        assert!(!exports_fake_usage(Path::new("libc.so.6")));
        assert!(!exports_fake_usage(Path::new("/nonexistent/libcuda.so.1")));
    }
}
