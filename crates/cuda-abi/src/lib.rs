//! `repr(C)` mirrors of the CUDA driver types and entry points this project touches.
//!
//! Everything that crosses the C boundary is an integer, a pointer or a plain struct: results and enums
//! are integers with named constants, never Rust enums, because a value added by a newer driver must
//! not be undefined behaviour. Layouts follow `cuda.h` of CUDA 13.0 (driver API 13000, the r580
//! branch); [`layout::LAYOUT`] lists sizes, alignments and field offsets, which the GPU lane compares
//! with a C program compiled against the machine's `cuda.h` (`scripts/abi-layout.c`).
//!
//! This crate has no dependencies and no unsafe code: it only declares.

#![forbid(unsafe_code)]
#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use core::fmt;

pub mod layout;

/// A driver result code. `repr(transparent)` over `u32`, so it is ABI-identical to `CUresult`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[must_use = "a driver result says whether the call happened; check it, or say why it does not matter"]
pub struct CUresult(pub u32);

macro_rules! results {
    ($( $name:ident = $value:literal, $text:literal; )*) => {
        impl CUresult {
            $( pub const $name: CUresult = CUresult($value); )*

            /// The driver's name for this code (`CUDA_ERROR_INVALID_VALUE`), if it is one this crate knows.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some(concat!("CUDA_", stringify!($name))), )*
                    _ => None,
                }
            }

            /// The driver's description of this code, if it is one this crate knows.
            pub fn description(self) -> Option<&'static str> {
                match self.0 {
                    $( $value => Some($text), )*
                    _ => None,
                }
            }

            /// NUL-terminated name, for `cuGetErrorName`.
            pub fn name_cstr(self) -> Option<&'static core::ffi::CStr> {
                match self.0 {
                    $( $value => Some(
                        match core::ffi::CStr::from_bytes_with_nul(
                            concat!("CUDA_", stringify!($name), "\0").as_bytes()) {
                            Ok(s) => s,
                            Err(_) => unreachable!(),
                        }), )*
                    _ => None,
                }
            }

            /// NUL-terminated description, for `cuGetErrorString`.
            pub fn description_cstr(self) -> Option<&'static core::ffi::CStr> {
                match self.0 {
                    $( $value => Some(
                        match core::ffi::CStr::from_bytes_with_nul(concat!($text, "\0").as_bytes()) {
                            Ok(s) => s,
                            Err(_) => unreachable!(),
                        }), )*
                    _ => None,
                }
            }
        }
    };
}

results! {
    SUCCESS = 0, "no error";
    ERROR_INVALID_VALUE = 1, "invalid argument";
    ERROR_OUT_OF_MEMORY = 2, "out of memory";
    ERROR_NOT_INITIALIZED = 3, "initialization error";
    ERROR_DEINITIALIZED = 4, "driver shutting down";
    ERROR_NO_DEVICE = 100, "no CUDA-capable device is detected";
    ERROR_INVALID_DEVICE = 101, "invalid device ordinal";
    ERROR_INVALID_IMAGE = 200, "device kernel image is invalid";
    ERROR_INVALID_CONTEXT = 201, "invalid device context";
    ERROR_OPERATING_SYSTEM = 304, "OS call failed or operation not supported on this OS";
    ERROR_CONTEXT_ALREADY_CURRENT = 202, "context already current";
    ERROR_ALREADY_MAPPED = 208, "resource already mapped";
    ERROR_NOT_MAPPED = 211, "resource not mapped";
    ERROR_INVALID_HANDLE = 400, "invalid resource handle";
    ERROR_ILLEGAL_STATE = 401, "the operation cannot be performed in the present state";
    ERROR_NOT_FOUND = 500, "named symbol not found";
    ERROR_NOT_READY = 600, "device not ready";
    ERROR_ILLEGAL_ADDRESS = 700, "an illegal memory access was encountered";
    ERROR_PEER_ACCESS_ALREADY_ENABLED = 704, "peer access is already enabled";
    ERROR_PEER_ACCESS_NOT_ENABLED = 705, "peer access has not been enabled";
    ERROR_UNSUPPORTED_LIMIT = 215, "limit is not supported on this architecture";
    ERROR_PEER_ACCESS_UNSUPPORTED = 217, "peer access is not supported between these two devices";
    ERROR_CONTEXT_IS_DESTROYED = 709, "context is destroyed";
    ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712, "part or all of the requested memory range is already mapped";
    ERROR_HOST_MEMORY_NOT_REGISTERED = 713, "pointer does not correspond to a registered memory region";
    ERROR_NOT_PERMITTED = 800, "operation not permitted";
    ERROR_NOT_SUPPORTED = 801, "operation not supported";
    ERROR_TIMEOUT = 909, "timeout";
    ERROR_UNKNOWN = 999, "unknown error";
}

impl CUresult {
    pub fn is_success(self) -> bool {
        self == CUresult::SUCCESS
    }
}

impl fmt::Debug for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}({})", self.0),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl fmt::Display for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

pub type CUdevice = c_int;
pub type CUdeviceptr = c_ulonglong;
pub type CUmemGenericAllocationHandle = c_ulonglong;
pub type cuuint64_t = u64;
pub type cuuint32_t = u32;

/// Opaque driver objects: only ever pointers to them cross the boundary.
#[repr(C)]
#[derive(Debug)]
pub struct CUctx_st {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct CUstream_st {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct CUevent_st {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct CUmod_st {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct CUfunc_st {
    _private: [u8; 0],
}
/// `CUlaunchAttribute`: only pointed to (the fake ignores launch attributes).
#[repr(C)]
#[derive(Debug)]
pub struct CUlaunchAttribute_st {
    _private: [u8; 0],
}
pub type CUcontext = *mut CUctx_st;
pub type CUstream = *mut CUstream_st;
pub type CUevent = *mut CUevent_st;
pub type CUmodule = *mut CUmod_st;
pub type CUfunction = *mut CUfunc_st;
/// `CUhostFn`: a host function queued on a stream (`cuLaunchHostFunc`).
pub type CUhostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// `CUlaunchConfig` (`cuLaunchKernelEx`), as in `cuda.h` of CUDA 13.0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute_st,
    pub numAttrs: c_uint,
}

/// `CUstreamWaitValue_flags` (`cuStreamWaitValue32`).
pub mod stream_wait_value {
    /// Wait until `(int32_t)(*addr - value) >= 0`.
    pub const GEQ: u32 = 0x0;
    /// Wait until `*addr == value`.
    pub const EQ: u32 = 0x1;
    /// Wait until `(*addr & value) != 0`.
    pub const AND: u32 = 0x2;
    /// Wait until `~(*addr | value) != 0`.
    pub const NOR: u32 = 0x3;
    /// Flush remote writes before the wait completes (a modifier bit).
    pub const FLUSH: u32 = 1 << 30;
}

/// `CUstreamWriteValue_flags` (`cuStreamWriteValue32`).
pub mod stream_write_value {
    pub const DEFAULT: u32 = 0x0;
    pub const NO_MEMORY_BARRIER: u32 = 0x1;
}

/// Opaque driver handles this project passes through without looking inside: the submission gate
/// forwards them unchanged. (Modules, functions and events have their opaque struct types above.)
pub type CUgraphExec = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUexternalSemaphore = *mut c_void;
/// `CUstreamCallback`: `void (*)(CUstream, CUresult, void *userData)`.
pub type CUstreamCallback =
    Option<unsafe extern "C" fn(stream: CUstream, status: CUresult, user_data: *mut c_void)>;

/// `CUdevice_attribute` values this project reads.
pub mod device_attribute {
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: i32 = 103;
    pub const GENERIC_COMPRESSION_SUPPORTED: i32 = 106;
    pub const MEMORY_POOLS_SUPPORTED: i32 = 115;
    pub const GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: i32 = 116;
    pub const HANDLE_TYPE_FABRIC_SUPPORTED: i32 = 128;
    pub const MULTICAST_SUPPORTED: i32 = 132;
}

/// `CUmemAllocationType`.
pub mod allocation_type {
    pub const INVALID: u32 = 0;
    pub const PINNED: u32 = 1;
}

/// `CUlimit`: the context limits of `cuCtxGetLimit` / `cuCtxSetLimit` this crate uses.
pub mod limit {
    use core::ffi::c_int;
    /// `CU_LIMIT_STACK_SIZE`: the per-thread stack, in bytes, for which the context reserves
    /// local memory on its device.
    pub const STACK_SIZE: c_int = 0;
}

/// `CUmemAllocationHandleType`, a bit set.
pub mod handle_type {
    pub const NONE: u32 = 0;
    pub const POSIX_FILE_DESCRIPTOR: u32 = 1;
    pub const WIN32: u32 = 2;
    pub const WIN32_KMT: u32 = 4;
    pub const FABRIC: u32 = 8;
}

/// `CUmemLocationType`.
pub mod location_type {
    pub const INVALID: u32 = 0;
    pub const DEVICE: u32 = 1;
    pub const HOST: u32 = 2;
    pub const HOST_NUMA: u32 = 3;
    pub const HOST_NUMA_CURRENT: u32 = 4;
}

/// `CUmemAccess_flags`.
pub mod access_flags {
    pub const PROT_NONE: u32 = 0;
    pub const PROT_READ: u32 = 1;
    pub const PROT_READWRITE: u32 = 3;
}

/// `CUmemAllocationGranularity_flags`.
pub mod granularity_flags {
    pub const MINIMUM: u32 = 0;
    pub const RECOMMENDED: u32 = 1;
}

/// `CUprocessState`, as `cuCheckpointProcessGetState` reports it.
pub mod process_state {
    pub const RUNNING: u32 = 0;
    pub const LOCKED: u32 = 1;
    pub const CHECKPOINTED: u32 = 2;
    pub const FAILED: u32 = 3;
}

/// `cuGetProcAddress` flags.
pub mod proc_address_flags {
    pub const DEFAULT: u64 = 0;
    pub const LEGACY_STREAM: u64 = 1;
    pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;
}

/// `CUdriverProcAddressQueryResult`.
pub mod proc_address_status {
    pub const SUCCESS: i32 = 0;
    pub const SYMBOL_NOT_FOUND: i32 = 1;
    pub const VERSION_NOT_SUFFICIENT: i32 = 2;
}

/// `CUpointer_attribute`: the attributes cuinterpose answers itself or the fake driver models.
pub mod pointer_attribute {
    pub const MEMORY_TYPE: u32 = 2;
    pub const DEVICE_ORDINAL: u32 = 9;
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
    pub const RANGE_START_ADDR: u32 = 11;
    pub const RANGE_SIZE: u32 = 12;
    pub const MAPPED: u32 = 13;
}

/// `CUmemorytype`.
pub mod memory_type {
    pub const HOST: u32 = 1;
    pub const DEVICE: u32 = 2;
}

/// `cuIpcOpenMemHandle` flags.
pub mod ipc_flags {
    pub const LAZY_ENABLE_PEER_ACCESS: u32 = 1;
}

/// `cuMemHostAlloc` flags.
pub mod host_alloc_flags {
    pub const PORTABLE: u32 = 1;
    pub const DEVICEMAP: u32 = 2;
    pub const WRITECOMBINED: u32 = 4;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    /// A [`location_type`] value.
    pub type_: u32,
    pub id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemAllocationProp {
    /// An [`allocation_type`] value.
    pub type_: u32,
    /// A bit set of [`handle_type`] values.
    pub requestedHandleTypes: u32,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocFlags,
}

impl Default for CUmemAllocationProp {
    fn default() -> Self {
        CUmemAllocationProp {
            type_: 0,
            requestedHandleTypes: 0,
            location: CUmemLocation::default(),
            win32HandleMetaData: core::ptr::null_mut(),
            allocFlags: CUmemAllocFlags::default(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    /// An [`access_flags`] value.
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmulticastObjectProp {
    pub numDevices: c_uint,
    pub size: usize,
    pub handleTypes: c_ulonglong,
    pub flags: c_ulonglong,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; 64],
}

impl Default for CUipcMemHandle {
    fn default() -> Self {
        CUipcMemHandle { reserved: [0; 64] }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemFabricHandle {
    pub data: [u8; 64],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUcheckpointLockArgs {
    pub timeoutMs: c_uint,
    pub reserved0: c_uint,
    pub reserved1: [cuuint64_t; 7],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUcheckpointCheckpointArgs {
    pub reserved: [cuuint64_t; 8],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUcheckpointGpuPair {
    pub oldUuid: CUuuid,
    pub newUuid: CUuuid,
}

/// CUDA 13.0 layout: `gpuPairs`, `gpuPairsCount`, `char reserved[52 - sizeof(void *)]`, `reserved1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUcheckpointRestoreArgs {
    pub gpuPairs: *mut CUcheckpointGpuPair,
    pub gpuPairsCount: c_uint,
    pub reserved: [c_char; 52 - core::mem::size_of::<*mut CUcheckpointGpuPair>()],
    pub reserved1: cuuint64_t,
}

impl Default for CUcheckpointRestoreArgs {
    fn default() -> Self {
        CUcheckpointRestoreArgs {
            gpuPairs: core::ptr::null_mut(),
            gpuPairsCount: 0,
            reserved: [0; 52 - core::mem::size_of::<*mut CUcheckpointGpuPair>()],
            reserved1: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUcheckpointUnlockArgs {
    pub reserved: [cuuint64_t; 8],
}

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<CUmemLocation>() == 8);
    assert!(size_of::<CUmemAllocationProp>() == 32);
    assert!(size_of::<CUmemAccessDesc>() == 12);
    assert!(size_of::<CUmulticastObjectProp>() == 32);
    assert!(size_of::<CUipcMemHandle>() == 64);
    assert!(size_of::<CUmemFabricHandle>() == 64);
    assert!(size_of::<CUcheckpointLockArgs>() == 64);
    assert!(size_of::<CUcheckpointCheckpointArgs>() == 64);
    assert!(size_of::<CUcheckpointRestoreArgs>() == 64);
    assert!(size_of::<CUcheckpointUnlockArgs>() == 64);
    assert!(size_of::<CUcheckpointGpuPair>() == 32);
    assert!(size_of::<CUresult>() == 4);
    assert!(size_of::<CUlaunchConfig>() == 56);
    assert!(core::mem::offset_of!(CUlaunchConfig, hStream) == 32);
    assert!(core::mem::offset_of!(CUlaunchConfig, numAttrs) == 48);
};

/// Function-pointer types of the driver entry points outside the `cuda` crate's table (the
/// resolvers the shim implements, and entry points only the fake driver has): those in the table
/// are `cuda::pfn`, generated from it. Named `PFN_<symbol>` after the ABI variant, as
/// `cudaTypedefs.h` does.
pub mod pfn {
    use super::*;

    pub type PFN_cuGetErrorString =
        unsafe extern "C" fn(error: CUresult, out: *mut *const c_char) -> CUresult;
    pub type PFN_cuGetProcAddress = unsafe extern "C" fn(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: cuuint64_t,
    ) -> CUresult;
    pub type PFN_cuGetProcAddress_v2 = unsafe extern "C" fn(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: cuuint64_t,
        status: *mut c_int,
    ) -> CUresult;

    pub type PFN_cuDeviceGetName =
        unsafe extern "C" fn(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
    pub type PFN_cuDeviceGetAttribute =
        unsafe extern "C" fn(value: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult;
    pub type PFN_cuDeviceTotalMem_v2 =
        unsafe extern "C" fn(bytes: *mut usize, dev: CUdevice) -> CUresult;

    pub type PFN_cuCtxCreate_v2 =
        unsafe extern "C" fn(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult;
    pub type PFN_cuCtxDestroy_v2 = unsafe extern "C" fn(ctx: CUcontext) -> CUresult;
    pub type PFN_cuCtxGetDevice = unsafe extern "C" fn(dev: *mut CUdevice) -> CUresult;
    pub type PFN_cuMemcpyDtoD_v2 =
        unsafe extern "C" fn(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult;
    pub type PFN_cuMemcpyDtoDAsync_v2 = unsafe extern "C" fn(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    pub type PFN_cuMemsetD32_v2 =
        unsafe extern "C" fn(dst: CUdeviceptr, value: c_uint, count: usize) -> CUresult;
    pub type PFN_cuMemsetD8Async = unsafe extern "C" fn(
        dst: CUdeviceptr,
        value: u8,
        count: usize,
        stream: CUstream,
    ) -> CUresult;
    pub type PFN_cuMemsetD32Async = unsafe extern "C" fn(
        dst: CUdeviceptr,
        value: c_uint,
        count: usize,
        stream: CUstream,
    ) -> CUresult;

    pub type PFN_cuMulticastGetGranularity = unsafe extern "C" fn(
        granularity: *mut usize,
        prop: *const CUmulticastObjectProp,
        option: u32,
    ) -> CUresult;

    pub type PFN_cuCheckpointProcessGetRestoreThreadId =
        unsafe extern "C" fn(pid: c_int, tid: *mut c_int) -> CUresult;
}

/// The driver API version this crate's layouts follow (`CUDA_VERSION` of the header).
pub const CUDA_VERSION: i32 = 13000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_names_match_the_driver_spelling() {
        assert_eq!(
            CUresult::ERROR_INVALID_VALUE.name(),
            Some("CUDA_ERROR_INVALID_VALUE")
        );
        assert_eq!(
            CUresult::ERROR_NOT_SUPPORTED
                .name_cstr()
                .map(|c| c.to_bytes()),
            Some(&b"CUDA_ERROR_NOT_SUPPORTED"[..])
        );
        assert_eq!(CUresult(123_456).name(), None);
        assert_eq!(format!("{:?}", CUresult(123_456)), "CUresult(123456)");
    }

    #[test]
    fn restore_args_reserve_what_the_header_reserves() {
        assert_eq!(
            core::mem::offset_of!(CUcheckpointRestoreArgs, gpuPairsCount),
            8
        );
        assert_eq!(
            core::mem::offset_of!(CUcheckpointRestoreArgs, reserved1),
            56
        );
    }
}
