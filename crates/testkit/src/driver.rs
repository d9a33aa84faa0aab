//! The CUDA driver as the workload loads it: `libcuda.so.1` opened at run time, its entry points
//! resolved through the route the command line picks, and safe wrappers that turn `CUresult` into
//! [`CuError`].
//!
//! Two routes reach every entry point, because the shim must be reachable both ways:
//! - [`Resolve::Dlsym`]: `dlsym(handle, "cuMemCreate")`, with the ABI-versioned export names
//!   (`cuMemAlloc_v2`) as old `dlopen` users write them;
//! - [`Resolve::GetProcAddress`]: `dlsym(handle, "cuGetProcAddress_v2")` once, then
//!   `cuGetProcAddress_v2("cuMemCreate", &p, 12000, 0, &status)` for everything (what the CUDA
//!   runtime does; 12000 is the version PyTorch pins).

#![allow(unsafe_code)] // calls through driver function pointers; each block says why it is sound

use core::ffi::{CStr, c_char, c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use cuda_abi::pfn::*;
use cuda_abi::*;

/// The `cudaVersion` the GetProcAddress route asks for.
pub const PINNED_CUDA_VERSION: c_int = 12000;

/// How entry points are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resolve {
    /// `dlsym` on the library handle.
    #[default]
    Dlsym,
    /// `cuGetProcAddress_v2`.
    GetProcAddress,
}

impl Resolve {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolve::Dlsym => "dlsym",
            Resolve::GetProcAddress => "getprocaddress",
        }
    }

    /// Parses the command-line spelling.
    pub fn parse(text: &str) -> Option<Resolve> {
        match text {
            "dlsym" => Some(Resolve::Dlsym),
            "getprocaddress" => Some(Resolve::GetProcAddress),
            _ => None,
        }
    }
}

/// A driver call that did not return `CUDA_SUCCESS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call} returned {result}")]
pub struct CuError {
    /// The entry point.
    pub call: &'static str,
    /// What it returned.
    pub result: CUresult,
}

/// Why the driver could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `dlopen` failed.
    #[error("cannot load {library}: {source}")]
    Open {
        /// What was opened.
        library: String,
        /// The loader's message.
        source: libloading::Error,
    },
    /// An entry point is missing.
    #[error("the driver has no {symbol} (route {route})")]
    Missing {
        /// The name asked for.
        symbol: String,
        /// The route used.
        route: &'static str,
    },
}

fn check(call: &'static str, result: CUresult) -> Result<(), CuError> {
    if result.is_success() {
        Ok(())
    } else {
        Err(CuError { call, result })
    }
}

/// Reinterprets a resolved symbol address as the function-pointer type `F`.
///
/// # Safety
/// `F` must be a function-pointer type and `p` the address of a function with exactly that ABI.
unsafe fn cast<F: Copy>(p: *mut c_void) -> F {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<*mut c_void>()) };
    // SAFETY: sizes are equal (checked above) and the caller guarantees the ABI.
    unsafe { core::mem::transmute_copy::<*mut c_void, F>(&p) }
}

macro_rules! api {
    ($( $field:ident : $ty:ident = $dlsym:literal, $base:literal; )*) => {
        /// Every entry point the workload calls, resolved once.
        #[allow(non_snake_case)]
        #[derive(Debug, Clone, Copy)]
        pub struct Api {
            $( #[allow(missing_docs)] pub $field: $ty, )*
        }

        impl Api {
            fn resolve(
                lookup: &dyn Fn(&CStr, &CStr) -> Result<*mut c_void, LoadError>,
            ) -> Result<Api, LoadError> {
                Ok(Api {
                    $( $field: {
                        let p = lookup($dlsym, $base)?;
                        // SAFETY: the driver exports this symbol with the C signature of `$ty`
                        // (cuda.h; the `_v2` names are the ABI variants the types describe).
                        unsafe { cast::<$ty>(p) }
                    }, )*
                })
            }
        }
    };
}

api! {
    cuInit: PFN_cuInit = c"cuInit", c"cuInit";
    cuDriverGetVersion: PFN_cuDriverGetVersion = c"cuDriverGetVersion", c"cuDriverGetVersion";
    cuGetErrorName: PFN_cuGetErrorName = c"cuGetErrorName", c"cuGetErrorName";
    cuDeviceGet: PFN_cuDeviceGet = c"cuDeviceGet", c"cuDeviceGet";
    cuDeviceGetCount: PFN_cuDeviceGetCount = c"cuDeviceGetCount", c"cuDeviceGetCount";
    cuDeviceGetUuid: PFN_cuDeviceGetUuid = c"cuDeviceGetUuid", c"cuDeviceGetUuid";
    cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain =
        c"cuDevicePrimaryCtxRetain", c"cuDevicePrimaryCtxRetain";
    cuCtxSetCurrent: PFN_cuCtxSetCurrent = c"cuCtxSetCurrent", c"cuCtxSetCurrent";
    cuCtxSynchronize: PFN_cuCtxSynchronize = c"cuCtxSynchronize", c"cuCtxSynchronize";
    cuMemGetInfo_v2: PFN_cuMemGetInfo_v2 = c"cuMemGetInfo_v2", c"cuMemGetInfo";
    cuMemAlloc_v2: PFN_cuMemAlloc_v2 = c"cuMemAlloc_v2", c"cuMemAlloc";
    cuMemFree_v2: PFN_cuMemFree_v2 = c"cuMemFree_v2", c"cuMemFree";
    cuMemGetAddressRange_v2: PFN_cuMemGetAddressRange_v2 =
        c"cuMemGetAddressRange_v2", c"cuMemGetAddressRange";
    cuMemcpyHtoD_v2: PFN_cuMemcpyHtoD_v2 = c"cuMemcpyHtoD_v2", c"cuMemcpyHtoD";
    cuMemcpyDtoH_v2: PFN_cuMemcpyDtoH_v2 = c"cuMemcpyDtoH_v2", c"cuMemcpyDtoH";
    cuMemsetD8_v2: PFN_cuMemsetD8_v2 = c"cuMemsetD8_v2", c"cuMemsetD8";
    cuMemCreate: PFN_cuMemCreate = c"cuMemCreate", c"cuMemCreate";
    cuMemRelease: PFN_cuMemRelease = c"cuMemRelease", c"cuMemRelease";
    cuMemAddressReserve: PFN_cuMemAddressReserve = c"cuMemAddressReserve", c"cuMemAddressReserve";
    cuMemAddressFree: PFN_cuMemAddressFree = c"cuMemAddressFree", c"cuMemAddressFree";
    cuMemMap: PFN_cuMemMap = c"cuMemMap", c"cuMemMap";
    cuMemUnmap: PFN_cuMemUnmap = c"cuMemUnmap", c"cuMemUnmap";
    cuMemSetAccess: PFN_cuMemSetAccess = c"cuMemSetAccess", c"cuMemSetAccess";
    cuMemGetAccess: PFN_cuMemGetAccess = c"cuMemGetAccess", c"cuMemGetAccess";
    cuMemExportToShareableHandle: PFN_cuMemExportToShareableHandle =
        c"cuMemExportToShareableHandle", c"cuMemExportToShareableHandle";
    cuMemImportFromShareableHandle: PFN_cuMemImportFromShareableHandle =
        c"cuMemImportFromShareableHandle", c"cuMemImportFromShareableHandle";
    cuMemRetainAllocationHandle: PFN_cuMemRetainAllocationHandle =
        c"cuMemRetainAllocationHandle", c"cuMemRetainAllocationHandle";
    cuMemGetAllocationPropertiesFromHandle: PFN_cuMemGetAllocationPropertiesFromHandle =
        c"cuMemGetAllocationPropertiesFromHandle", c"cuMemGetAllocationPropertiesFromHandle";
    cuMemGetAllocationGranularity: PFN_cuMemGetAllocationGranularity =
        c"cuMemGetAllocationGranularity", c"cuMemGetAllocationGranularity";
    cuIpcGetMemHandle: PFN_cuIpcGetMemHandle = c"cuIpcGetMemHandle", c"cuIpcGetMemHandle";
    cuIpcOpenMemHandle_v2: PFN_cuIpcOpenMemHandle_v2 =
        c"cuIpcOpenMemHandle_v2", c"cuIpcOpenMemHandle";
    cuIpcCloseMemHandle: PFN_cuIpcCloseMemHandle = c"cuIpcCloseMemHandle", c"cuIpcCloseMemHandle";
}

/// The loaded driver. Calls act on the calling thread's current context, as the driver's do.
#[derive(Debug)]
pub struct Driver {
    api: Api,
    route: Resolve,
    // Kept last so it is dropped after nothing can call through `api` any more.
    _library: libloading::Library,
}

impl Driver {
    /// Opens `library` (a name the loader searches, or a path) and resolves every entry point.
    pub fn load(library: &Path, route: Resolve) -> Result<Driver, LoadError> {
        // SAFETY: loading libcuda runs its initialisers; that is what every CUDA program does.
        let lib = unsafe { libloading::Library::new(library.as_os_str()) }.map_err(|source| {
            LoadError::Open {
                library: library.display().to_string(),
                source,
            }
        })?;
        let missing = |symbol: &CStr| LoadError::Missing {
            symbol: symbol.to_string_lossy().into_owned(),
            route: route.as_str(),
        };
        let dlsym = |name: &CStr| -> Result<*mut c_void, LoadError> {
            // SAFETY: the symbol is only read as an address here; it is cast to its real type by
            // the caller.
            let sym = unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) }
                .map_err(|_| missing(name))?;
            let p: *mut c_void = *sym;
            if p.is_null() {
                Err(missing(name))
            } else {
                Ok(p)
            }
        };
        let api = match route {
            Resolve::Dlsym => Api::resolve(&|dlsym_name, _| dlsym(dlsym_name))?,
            Resolve::GetProcAddress => {
                let gpa_ptr = dlsym(c"cuGetProcAddress_v2")?;
                // SAFETY: cuGetProcAddress_v2 has this signature since CUDA 12.0 (cuda.h).
                let gpa: PFN_cuGetProcAddress_v2 = unsafe { cast(gpa_ptr) };
                Api::resolve(&|_, base| {
                    let mut p: *mut c_void = core::ptr::null_mut();
                    let mut status: c_int = -1;
                    // SAFETY: `base` is NUL-terminated, both out-pointers are valid locals.
                    let r =
                        unsafe { gpa(base.as_ptr(), &mut p, PINNED_CUDA_VERSION, 0, &mut status) };
                    if r.is_success() && !p.is_null() {
                        Ok(p)
                    } else {
                        Err(missing(base))
                    }
                })?
            }
        };
        Ok(Driver {
            api,
            route,
            _library: lib,
        })
    }

    /// The resolved entry points, for the error probes that call them with bad arguments.
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// The route the entry points came through.
    pub fn route(&self) -> Resolve {
        self.route
    }

    /// The driver's own name for a result (`cuGetErrorName`), or `CUresult(N)`.
    pub fn error_name(&self, result: CUresult) -> String {
        let mut out: *const c_char = core::ptr::null();
        // SAFETY: valid out-pointer; the driver returns a static NUL-terminated string.
        let r = unsafe { (self.api.cuGetErrorName)(result, &mut out) };
        if r.is_success() && !out.is_null() {
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

    /// `cuInit`.
    pub fn init(&self) -> Result<(), CuError> {
        // SAFETY: no pointers.
        check("cuInit", unsafe { (self.api.cuInit)(0) })
    }

    /// `cuDriverGetVersion`.
    pub fn driver_version(&self) -> Result<i32, CuError> {
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        check("cuDriverGetVersion", unsafe {
            (self.api.cuDriverGetVersion)(&mut v)
        })?;
        Ok(v)
    }

    /// `cuDeviceGet`.
    pub fn device(&self, ordinal: i32) -> Result<CUdevice, CuError> {
        let mut d: CUdevice = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGet", unsafe {
            (self.api.cuDeviceGet)(&mut d, ordinal)
        })?;
        Ok(d)
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<i32, CuError> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            (self.api.cuDeviceGetCount)(&mut n)
        })?;
        Ok(n)
    }

    /// `cuDeviceGetUuid`.
    pub fn device_uuid(&self, device: CUdevice) -> Result<[u8; 16], CuError> {
        let mut u = CUuuid::default();
        // SAFETY: valid out-pointer.
        check("cuDeviceGetUuid", unsafe {
            (self.api.cuDeviceGetUuid)(&mut u, device)
        })?;
        Ok(u.bytes.map(|b| b as u8))
    }

    /// Retains the primary context of `device` and makes it current on this thread.
    pub fn use_primary_context(&self, device: CUdevice) -> Result<CUcontext, CuError> {
        let mut ctx: CUcontext = core::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cuDevicePrimaryCtxRetain", unsafe {
            (self.api.cuDevicePrimaryCtxRetain)(&mut ctx, device)
        })?;
        // SAFETY: a context the driver just returned.
        check("cuCtxSetCurrent", unsafe {
            (self.api.cuCtxSetCurrent)(ctx)
        })?;
        Ok(ctx)
    }

    /// `cuCtxSynchronize`.
    pub fn synchronize(&self) -> Result<(), CuError> {
        // SAFETY: no pointers.
        check("cuCtxSynchronize", unsafe { (self.api.cuCtxSynchronize)() })
    }

    /// `cuMemGetInfo`: (free, total) bytes of the current context's device.
    pub fn mem_info(&self) -> Result<(u64, u64), CuError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        check("cuMemGetInfo_v2", unsafe {
            (self.api.cuMemGetInfo_v2)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemAlloc`.
    pub fn malloc(&self, size: u64) -> Result<CUdeviceptr, CuError> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        check("cuMemAlloc_v2", unsafe {
            (self.api.cuMemAlloc_v2)(&mut p, size as usize)
        })?;
        Ok(p)
    }

    /// `cuMemFree`.
    pub fn free(&self, ptr: CUdeviceptr) -> Result<(), CuError> {
        // SAFETY: a device address; the driver validates it.
        check("cuMemFree_v2", unsafe { (self.api.cuMemFree_v2)(ptr) })
    }

    /// `cuMemGetAddressRange`: (base, size) of the allocation holding `ptr`.
    pub fn address_range(&self, ptr: CUdeviceptr) -> Result<(CUdeviceptr, u64), CuError> {
        let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers.
        check("cuMemGetAddressRange_v2", unsafe {
            (self.api.cuMemGetAddressRange_v2)(&mut base, &mut size, ptr)
        })?;
        Ok((base, size as u64))
    }

    /// `cuMemcpyHtoD`.
    pub fn copy_to_device(&self, dst: CUdeviceptr, src: &[u8]) -> Result<(), CuError> {
        // SAFETY: `src` is valid for `src.len()` bytes; the driver validates `dst`.
        check("cuMemcpyHtoD_v2", unsafe {
            (self.api.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len())
        })
    }

    /// `cuMemcpyDtoH`.
    pub fn copy_from_device(&self, dst: &mut [u8], src: CUdeviceptr) -> Result<(), CuError> {
        // SAFETY: `dst` is valid for writes of `dst.len()` bytes; the driver validates `src`.
        check("cuMemcpyDtoH_v2", unsafe {
            (self.api.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    /// `cuMemsetD8`.
    pub fn memset(&self, dst: CUdeviceptr, value: u8, count: u64) -> Result<(), CuError> {
        // SAFETY: device addresses only; the driver validates them.
        check("cuMemsetD8_v2", unsafe {
            (self.api.cuMemsetD8_v2)(dst, value, count as usize)
        })
    }

    /// `cuMemCreate`.
    pub fn mem_create(
        &self,
        size: u64,
        prop: &CUmemAllocationProp,
    ) -> Result<CUmemGenericAllocationHandle, CuError> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct.
        check("cuMemCreate", unsafe {
            (self.api.cuMemCreate)(&mut h, size as usize, prop, 0)
        })?;
        Ok(h)
    }

    /// `cuMemRelease`.
    pub fn mem_release(&self, handle: CUmemGenericAllocationHandle) -> Result<(), CuError> {
        // SAFETY: a handle value; the driver validates it.
        check("cuMemRelease", unsafe { (self.api.cuMemRelease)(handle) })
    }

    /// `cuMemAddressReserve`.
    pub fn address_reserve(
        &self,
        size: u64,
        alignment: u64,
        addr: CUdeviceptr,
    ) -> Result<CUdeviceptr, CuError> {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        check("cuMemAddressReserve", unsafe {
            (self.api.cuMemAddressReserve)(&mut p, size as usize, alignment as usize, addr, 0)
        })?;
        Ok(p)
    }

    /// `cuMemAddressFree`.
    pub fn address_free(&self, ptr: CUdeviceptr, size: u64) -> Result<(), CuError> {
        // SAFETY: device addresses only.
        check("cuMemAddressFree", unsafe {
            (self.api.cuMemAddressFree)(ptr, size as usize)
        })
    }

    /// `cuMemMap`.
    pub fn map(
        &self,
        ptr: CUdeviceptr,
        size: u64,
        offset: u64,
        handle: CUmemGenericAllocationHandle,
    ) -> Result<(), CuError> {
        // SAFETY: values only; the driver validates them.
        check("cuMemMap", unsafe {
            (self.api.cuMemMap)(ptr, size as usize, offset as usize, handle, 0)
        })
    }

    /// `cuMemUnmap`.
    pub fn unmap(&self, ptr: CUdeviceptr, size: u64) -> Result<(), CuError> {
        // SAFETY: values only.
        check("cuMemUnmap", unsafe {
            (self.api.cuMemUnmap)(ptr, size as usize)
        })
    }

    /// `cuMemSetAccess`.
    pub fn set_access(
        &self,
        ptr: CUdeviceptr,
        size: u64,
        desc: &[CUmemAccessDesc],
    ) -> Result<(), CuError> {
        // SAFETY: `desc` is valid for `desc.len()` elements.
        check("cuMemSetAccess", unsafe {
            (self.api.cuMemSetAccess)(ptr, size as usize, desc.as_ptr(), desc.len())
        })
    }

    /// `cuMemGetAccess` for a device location.
    pub fn get_access(&self, device: i32, ptr: CUdeviceptr) -> Result<u64, CuError> {
        let loc = CUmemLocation {
            type_: location_type::DEVICE,
            id: device,
        };
        let mut flags: u64 = 0;
        // SAFETY: valid location and out-pointer.
        check("cuMemGetAccess", unsafe {
            (self.api.cuMemGetAccess)(&mut flags, &loc, ptr)
        })?;
        Ok(flags)
    }

    /// `cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`; the descriptor is made
    /// close-on-exec.
    pub fn export_fd(&self, handle: CUmemGenericAllocationHandle) -> Result<OwnedFd, CuError> {
        let mut fd: c_int = -1;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the out-pointer is an `int*`.
        check("cuMemExportToShareableHandle", unsafe {
            (self.api.cuMemExportToShareableHandle)(
                (&mut fd as *mut c_int).cast(),
                handle,
                handle_type::POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        if fd < 0 {
            return Err(CuError {
                call: "cuMemExportToShareableHandle",
                result: CUresult::ERROR_UNKNOWN,
            });
        }
        // SAFETY: the driver handed us a new descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // Best effort: a descriptor the driver made inheritable must not leak into exec'd children.
        let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
        Ok(owned)
    }

    /// `cuMemExportToShareableHandle(FABRIC)`: the 64 handle bytes.
    pub fn export_fabric(&self, handle: CUmemGenericAllocationHandle) -> Result<[u8; 64], CuError> {
        let mut out = CUmemFabricHandle { data: [0; 64] };
        // SAFETY: for FABRIC the out-pointer is a `CUmemFabricHandle*`.
        check("cuMemExportToShareableHandle", unsafe {
            (self.api.cuMemExportToShareableHandle)(
                (&mut out as *mut CUmemFabricHandle).cast(),
                handle,
                handle_type::FABRIC,
                0,
            )
        })?;
        Ok(out.data)
    }

    /// `cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)`; the descriptor stays ours.
    pub fn import_fd(&self, fd: BorrowedFd<'_>) -> Result<CUmemGenericAllocationHandle, CuError> {
        self.import_raw_fd(fd.as_raw_fd())
    }

    /// Import with a raw descriptor number, for error paths (a closed or foreign number).
    pub fn import_raw_fd(&self, fd: c_int) -> Result<CUmemGenericAllocationHandle, CuError> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the OS handle is the descriptor number cast to a
        // pointer (cuda.h); the driver only reads the number.
        check("cuMemImportFromShareableHandle", unsafe {
            (self.api.cuMemImportFromShareableHandle)(
                &mut h,
                fd as isize as *mut c_void,
                handle_type::POSIX_FILE_DESCRIPTOR,
            )
        })?;
        Ok(h)
    }

    /// `cuMemRetainAllocationHandle`.
    pub fn retain(&self, addr: CUdeviceptr) -> Result<CUmemGenericAllocationHandle, CuError> {
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: the address is passed by value as the driver's `void*` (a device address).
        check("cuMemRetainAllocationHandle", unsafe {
            (self.api.cuMemRetainAllocationHandle)(&mut h, addr as usize as *mut c_void)
        })?;
        Ok(h)
    }

    /// `cuMemGetAllocationPropertiesFromHandle`.
    pub fn properties(
        &self,
        handle: CUmemGenericAllocationHandle,
    ) -> Result<CUmemAllocationProp, CuError> {
        let mut prop = CUmemAllocationProp::default();
        // SAFETY: valid out-pointer.
        check("cuMemGetAllocationPropertiesFromHandle", unsafe {
            (self.api.cuMemGetAllocationPropertiesFromHandle)(&mut prop, handle)
        })?;
        Ok(prop)
    }

    /// `cuMemGetAllocationGranularity`.
    pub fn granularity(&self, prop: &CUmemAllocationProp, option: u32) -> Result<u64, CuError> {
        let mut g: usize = 0;
        // SAFETY: valid out-pointer and property struct.
        check("cuMemGetAllocationGranularity", unsafe {
            (self.api.cuMemGetAllocationGranularity)(&mut g, prop, option)
        })?;
        Ok(g as u64)
    }

    /// `cuIpcGetMemHandle`.
    pub fn ipc_get(&self, ptr: CUdeviceptr) -> Result<[u8; 64], CuError> {
        let mut h = CUipcMemHandle::default();
        // SAFETY: valid out-pointer.
        check("cuIpcGetMemHandle", unsafe {
            (self.api.cuIpcGetMemHandle)(&mut h, ptr)
        })?;
        Ok(h.reserved.map(|b| b as u8))
    }

    /// `cuIpcOpenMemHandle` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
    pub fn ipc_open(&self, bytes: &[u8; 64]) -> Result<CUdeviceptr, CuError> {
        let h = CUipcMemHandle {
            reserved: bytes.map(|b| b as c_char),
        };
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the handle is passed by value.
        check("cuIpcOpenMemHandle_v2", unsafe {
            (self.api.cuIpcOpenMemHandle_v2)(&mut p, h, ipc_flags::LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(p)
    }

    /// `cuIpcCloseMemHandle`.
    pub fn ipc_close(&self, ptr: CUdeviceptr) -> Result<(), CuError> {
        // SAFETY: value only.
        check("cuIpcCloseMemHandle", unsafe {
            (self.api.cuIpcCloseMemHandle)(ptr)
        })
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
}
