//! `cuGetProcAddress` and `cuGetProcAddress_v2`, with the semantics of the real driver:
//!
//! - `symbol` is a base name (`cuMemAlloc`, never `cuMemAlloc_v2`);
//! - `cudaVersion` picks the newest ABI variant introduced at or before it (`cuMemAlloc` ->
//!   `cuMemAlloc_v2` from 3020; `cuMemGetInfo` -> `_v2` from 3020; `cuIpcOpenMemHandle` -> `_v2`
//!   from 11000; `cuCtxCreate` -> `_v3` from 11040 and `_v4` from 12050; `cuMulticastBindMem`
//!   would become `_v2` at 13010, a version above this driver's, so it is always v1 here);
//! - a `cudaVersion` above the driver's (13000) or unknown flags: `CUDA_ERROR_INVALID_VALUE`;
//! - an unknown symbol: `_v2` returns `CUDA_SUCCESS`, `*pfn = NULL`, status SYMBOL_NOT_FOUND;
//!   v1 returns `CUDA_ERROR_NOT_FOUND` (and `*pfn = NULL`);
//! - a symbol newer than `cudaVersion`: the same with status VERSION_NOT_SUFFICIENT;
//! - the per-thread-default-stream flag gives the `_ptsz` variants where the fake has them
//!   ([`PER_THREAD`]), the same functions otherwise (the fake's null stream is one queue per
//!   context either way).
//!
//! The pointers handed out are the library's own definitions of the exports (bound inside the
//! library, see exports.rs), never an interposer's function of the same name.

use std::ffi::{CStr, c_char, c_int, c_void};

use cuda_abi::{CUresult, cuuint64_t, proc_address_flags, proc_address_status};

use crate::{DRIVER_VERSION, Res, exports, write_out};

/// Base name -> (first cudaVersion, exported symbol) variants, oldest first.
const TABLE: &[(&str, &[(i32, &str)])] = &[
    ("cuInit", &[(2000, "cuInit")]),
    ("cuDriverGetVersion", &[(2020, "cuDriverGetVersion")]),
    ("cuGetErrorName", &[(6000, "cuGetErrorName")]),
    ("cuGetErrorString", &[(6000, "cuGetErrorString")]),
    (
        "cuGetProcAddress",
        &[(11030, "cuGetProcAddress"), (12000, "cuGetProcAddress_v2")],
    ),
    ("cuDeviceGet", &[(2000, "cuDeviceGet")]),
    ("cuDeviceGetCount", &[(2000, "cuDeviceGetCount")]),
    ("cuDeviceGetName", &[(2000, "cuDeviceGetName")]),
    (
        "cuDeviceGetUuid",
        &[(9020, "cuDeviceGetUuid"), (11040, "cuDeviceGetUuid_v2")],
    ),
    ("cuDeviceGetAttribute", &[(2000, "cuDeviceGetAttribute")]),
    ("cuDeviceTotalMem", &[(3020, "cuDeviceTotalMem_v2")]),
    (
        "cuDevicePrimaryCtxRetain",
        &[(7000, "cuDevicePrimaryCtxRetain")],
    ),
    (
        "cuDevicePrimaryCtxRelease",
        &[(11000, "cuDevicePrimaryCtxRelease_v2")],
    ),
    (
        "cuDevicePrimaryCtxReset",
        &[(11000, "cuDevicePrimaryCtxReset_v2")],
    ),
    (
        "cuDevicePrimaryCtxGetState",
        &[(7000, "cuDevicePrimaryCtxGetState")],
    ),
    (
        "cuCtxCreate",
        &[
            (3020, "cuCtxCreate_v2"),
            (11040, "cuCtxCreate_v3"),
            (12050, "cuCtxCreate_v4"),
        ],
    ),
    ("cuCtxDestroy", &[(4000, "cuCtxDestroy_v2")]),
    ("cuCtxEnablePeerAccess", &[(4000, "cuCtxEnablePeerAccess")]),
    (
        "cuCtxDisablePeerAccess",
        &[(4000, "cuCtxDisablePeerAccess")],
    ),
    ("cuCtxSetCurrent", &[(4000, "cuCtxSetCurrent")]),
    ("cuCtxGetCurrent", &[(4000, "cuCtxGetCurrent")]),
    ("cuCtxGetDevice", &[(2000, "cuCtxGetDevice")]),
    ("cuCtxSynchronize", &[(2000, "cuCtxSynchronize")]),
    ("cuCtxGetLimit", &[(3010, "cuCtxGetLimit")]),
    ("cuCtxSetLimit", &[(3010, "cuCtxSetLimit")]),
    ("cuStreamCreate", &[(2000, "cuStreamCreate")]),
    ("cuStreamDestroy", &[(4000, "cuStreamDestroy_v2")]),
    ("cuStreamSynchronize", &[(2000, "cuStreamSynchronize")]),
    ("cuStreamQuery", &[(2000, "cuStreamQuery")]),
    ("cuStreamWaitEvent", &[(3020, "cuStreamWaitEvent")]),
    ("cuStreamWaitValue32", &[(11070, "cuStreamWaitValue32_v2")]),
    (
        "cuStreamWriteValue32",
        &[(11070, "cuStreamWriteValue32_v2")],
    ),
    ("cuLaunchHostFunc", &[(10000, "cuLaunchHostFunc")]),
    ("cuEventCreate", &[(2000, "cuEventCreate")]),
    ("cuEventDestroy", &[(4000, "cuEventDestroy_v2")]),
    ("cuEventRecord", &[(2000, "cuEventRecord")]),
    (
        "cuEventRecordWithFlags",
        &[(11010, "cuEventRecordWithFlags")],
    ),
    ("cuEventQuery", &[(2000, "cuEventQuery")]),
    ("cuEventSynchronize", &[(2000, "cuEventSynchronize")]),
    ("cuModuleLoadData", &[(2000, "cuModuleLoadData")]),
    ("cuModuleGetFunction", &[(2000, "cuModuleGetFunction")]),
    ("cuModuleUnload", &[(2000, "cuModuleUnload")]),
    ("cuLaunchKernel", &[(4000, "cuLaunchKernel")]),
    ("cuLaunchKernelEx", &[(11060, "cuLaunchKernelEx")]),
    ("cuMemcpyAsync", &[(4000, "cuMemcpyAsync")]),
    (
        "cuMemGetInfo",
        &[(2000, "cuMemGetInfo"), (3020, "cuMemGetInfo_v2")],
    ),
    ("cuMemAlloc", &[(3020, "cuMemAlloc_v2")]),
    ("cuMemFree", &[(3020, "cuMemFree_v2")]),
    ("cuMemGetAddressRange", &[(3020, "cuMemGetAddressRange_v2")]),
    ("cuMemAllocPitch", &[(3020, "cuMemAllocPitch_v2")]),
    ("cuMemAllocManaged", &[(6000, "cuMemAllocManaged")]),
    ("cuMemAllocAsync", &[(11020, "cuMemAllocAsync")]),
    ("cuMemFreeAsync", &[(11020, "cuMemFreeAsync")]),
    ("cuMemHostAlloc", &[(2020, "cuMemHostAlloc")]),
    ("cuMemFreeHost", &[(2000, "cuMemFreeHost")]),
    ("cuMemHostRegister", &[(6050, "cuMemHostRegister_v2")]),
    ("cuMemHostUnregister", &[(4000, "cuMemHostUnregister")]),
    ("cuMemcpyHtoD", &[(3020, "cuMemcpyHtoD_v2")]),
    ("cuMemcpyDtoH", &[(3020, "cuMemcpyDtoH_v2")]),
    ("cuMemcpyDtoD", &[(3020, "cuMemcpyDtoD_v2")]),
    ("cuMemcpyHtoDAsync", &[(3020, "cuMemcpyHtoDAsync_v2")]),
    ("cuMemcpyDtoHAsync", &[(3020, "cuMemcpyDtoHAsync_v2")]),
    ("cuMemcpyDtoDAsync", &[(3020, "cuMemcpyDtoDAsync_v2")]),
    ("cuMemsetD8", &[(3020, "cuMemsetD8_v2")]),
    ("cuMemsetD32", &[(3020, "cuMemsetD32_v2")]),
    ("cuMemsetD8Async", &[(3020, "cuMemsetD8Async")]),
    ("cuMemsetD32Async", &[(3020, "cuMemsetD32Async")]),
    ("cuMemCreate", &[(10020, "cuMemCreate")]),
    ("cuMemRelease", &[(10020, "cuMemRelease")]),
    ("cuMemAddressReserve", &[(10020, "cuMemAddressReserve")]),
    ("cuMemAddressFree", &[(10020, "cuMemAddressFree")]),
    ("cuMemMap", &[(10020, "cuMemMap")]),
    ("cuMemUnmap", &[(10020, "cuMemUnmap")]),
    ("cuMemSetAccess", &[(10020, "cuMemSetAccess")]),
    ("cuMemGetAccess", &[(10020, "cuMemGetAccess")]),
    (
        "cuMemExportToShareableHandle",
        &[(10020, "cuMemExportToShareableHandle")],
    ),
    (
        "cuMemImportFromShareableHandle",
        &[(10020, "cuMemImportFromShareableHandle")],
    ),
    (
        "cuMemRetainAllocationHandle",
        &[(11000, "cuMemRetainAllocationHandle")],
    ),
    (
        "cuMemGetAllocationPropertiesFromHandle",
        &[(10020, "cuMemGetAllocationPropertiesFromHandle")],
    ),
    (
        "cuMemGetAllocationGranularity",
        &[(10020, "cuMemGetAllocationGranularity")],
    ),
    ("cuIpcGetMemHandle", &[(4010, "cuIpcGetMemHandle")]),
    (
        "cuIpcOpenMemHandle",
        &[
            (4010, "cuIpcOpenMemHandle"),
            (11000, "cuIpcOpenMemHandle_v2"),
        ],
    ),
    ("cuIpcCloseMemHandle", &[(4010, "cuIpcCloseMemHandle")]),
    ("cuPointerGetAttribute", &[(4000, "cuPointerGetAttribute")]),
    (
        "cuPointerGetAttributes",
        &[(7000, "cuPointerGetAttributes")],
    ),
    ("cuMulticastCreate", &[(12010, "cuMulticastCreate")]),
    ("cuMulticastAddDevice", &[(12010, "cuMulticastAddDevice")]),
    ("cuMulticastBindMem", &[(12010, "cuMulticastBindMem")]),
    ("cuMulticastBindAddr", &[(12010, "cuMulticastBindAddr")]),
    ("cuMulticastUnbind", &[(12010, "cuMulticastUnbind")]),
    (
        "cuMulticastGetGranularity",
        &[(12010, "cuMulticastGetGranularity")],
    ),
    (
        "cuCheckpointProcessLock",
        &[(12080, "cuCheckpointProcessLock")],
    ),
    (
        "cuCheckpointProcessCheckpoint",
        &[(12080, "cuCheckpointProcessCheckpoint")],
    ),
    (
        "cuCheckpointProcessRestore",
        &[(12080, "cuCheckpointProcessRestore")],
    ),
    (
        "cuCheckpointProcessUnlock",
        &[(12080, "cuCheckpointProcessUnlock")],
    ),
    (
        "cuCheckpointProcessGetState",
        &[(12080, "cuCheckpointProcessGetState")],
    ),
    (
        "cuCheckpointProcessGetRestoreThreadId",
        &[(12080, "cuCheckpointProcessGetRestoreThreadId")],
    ),
];

/// The per-thread-default-stream variants: what a lookup with `CU_GET_PROC_ADDRESS_PER_THREAD_
/// DEFAULT_STREAM` returns in place of the default-stream symbol, as the real driver does (cudart
/// asks that way for programs built with `--default-stream per-thread`). Only the stream-ordered
/// allocation calls, `cuMemcpyAsync`, `cuMemsetD32Async` and the launches are modelled; the
/// model's other stream calls have one spelling. The fake's null stream is one queue per
/// context either way, so a `_ptsz` function behaves as its default-stream twin.
const PER_THREAD: &[(&str, &str)] = &[
    ("cuMemAllocAsync", "cuMemAllocAsync_ptsz"),
    ("cuMemFreeAsync", "cuMemFreeAsync_ptsz"),
    ("cuMemcpyAsync", "cuMemcpyAsync_ptsz"),
    ("cuMemsetD32Async", "cuMemsetD32Async_ptsz"),
    ("cuLaunchKernel", "cuLaunchKernel_ptsz"),
    ("cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"),
];

/// The base name of an exported symbol: `cuMemAlloc_v2` -> `cuMemAlloc`.
pub(crate) fn base_name(symbol: &str) -> &str {
    match symbol.rsplit_once("_v") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => symbol,
    }
}

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    Found(&'static str),
    NotFound,
    VersionNotSufficient,
}

/// The exported symbol `cudaVersion` selects for base name `name`.
pub(crate) fn select(name: &[u8], cuda_version: i32) -> Lookup {
    let Some((_, variants)) = TABLE.iter().find(|(base, _)| base.as_bytes() == name) else {
        return Lookup::NotFound;
    };
    match variants
        .iter()
        .rev()
        .find(|(since, _)| *since <= cuda_version)
    {
        Some((_, symbol)) => Lookup::Found(symbol),
        None => Lookup::VersionNotSufficient,
    }
}

/// Common body of both resolvers. Returns the status and the pointer (null unless found).
unsafe fn resolve(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> Res<(c_int, *mut c_void)> {
    if symbol.is_null() || pfn.is_null() || cuda_version > DRIVER_VERSION {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if !matches!(
        flags,
        proc_address_flags::DEFAULT
            | proc_address_flags::LEGACY_STREAM
            | proc_address_flags::PER_THREAD_DEFAULT_STREAM
    ) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated symbol name (null refused above).
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let per_thread = flags == proc_address_flags::PER_THREAD_DEFAULT_STREAM;
    let (status, ptr) = match select(name, cuda_version) {
        Lookup::Found(default) => {
            let exported = PER_THREAD
                .iter()
                .find(|(d, _)| per_thread && *d == default)
                .map_or(default, |(_, ptsz)| ptsz);
            match exports::own_address(exported.as_bytes()) {
                Some(p) => (proc_address_status::SUCCESS, p),
                None => (proc_address_status::SYMBOL_NOT_FOUND, std::ptr::null_mut()),
            }
        }
        Lookup::NotFound => (proc_address_status::SYMBOL_NOT_FOUND, std::ptr::null_mut()),
        Lookup::VersionNotSufficient => (
            proc_address_status::VERSION_NOT_SUFFICIENT,
            std::ptr::null_mut(),
        ),
    };
    // SAFETY: checked non-null; the caller passes a writable pointer slot.
    unsafe { write_out(pfn, ptr) }?;
    Ok((status, ptr))
}

pub(crate) unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> Res {
    // SAFETY: forwarded unchanged from the caller.
    let (status, _) = unsafe { resolve(symbol, pfn, cuda_version, flags) }?;
    if status == proc_address_status::SUCCESS {
        Ok(())
    } else {
        Err(CUresult::ERROR_NOT_FOUND)
    }
}

pub(crate) unsafe fn get_proc_address_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut c_int,
) -> Res {
    // SAFETY: forwarded unchanged from the caller.
    let (found, _) = unsafe { resolve(symbol, pfn, cuda_version, flags) }?;
    if !status.is_null() {
        // SAFETY: non-null; the caller passes a writable status.
        unsafe { write_out(status, found) }?;
    }
    Ok(())
}

/// `cuGetProcAddress_v2_ptsz`, the spelling cuda.h binds under
/// `CUDA_API_PER_THREAD_DEFAULT_STREAM`: `_v2` with the per-thread-default-stream flag when the
/// caller chose no stream flag.
pub(crate) unsafe fn get_proc_address_v2_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut c_int,
) -> Res {
    let flags = if flags == proc_address_flags::DEFAULT {
        proc_address_flags::PER_THREAD_DEFAULT_STREAM
    } else {
        flags
    };
    // SAFETY: forwarded unchanged from the caller.
    unsafe { get_proc_address_v2(symbol, pfn, cuda_version, flags, status) }
}

/// Exports reached by their own name only (cuda.h's per-thread spellings), not by a base name.
#[cfg(test)]
const NOT_BY_BASE_NAME: &[&str] = &["cuGetProcAddress_v2_ptsz"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_select_the_abi_variant() {
        assert_eq!(select(b"cuMemAlloc", 12000), Lookup::Found("cuMemAlloc_v2"));
        assert_eq!(select(b"cuMemAlloc", 3000), Lookup::VersionNotSufficient);
        assert_eq!(select(b"cuMemGetInfo", 3010), Lookup::Found("cuMemGetInfo"));
        assert_eq!(
            select(b"cuMemGetInfo", 13000),
            Lookup::Found("cuMemGetInfo_v2")
        );
        assert_eq!(
            select(b"cuIpcOpenMemHandle", 10020),
            Lookup::Found("cuIpcOpenMemHandle")
        );
        assert_eq!(
            select(b"cuIpcOpenMemHandle", 12000),
            Lookup::Found("cuIpcOpenMemHandle_v2")
        );
        assert_eq!(
            select(b"cuCtxCreate", 13000),
            Lookup::Found("cuCtxCreate_v4")
        );
        assert_eq!(
            select(b"cuCtxCreate", 11000),
            Lookup::Found("cuCtxCreate_v2")
        );
        assert_eq!(
            select(b"cuMulticastBindMem", 13000),
            Lookup::Found("cuMulticastBindMem")
        );
        assert_eq!(select(b"cuMemCreate", 10010), Lookup::VersionNotSufficient);
        assert_eq!(select(b"cuMemAlloc_v2", 13000), Lookup::NotFound);
        assert_eq!(select(b"cuNoSuchThing", 13000), Lookup::NotFound);
    }

    #[test]
    fn every_table_symbol_is_exported_and_every_export_reachable() {
        for (base, variants) in TABLE {
            for (_, symbol) in *variants {
                assert!(
                    exports::own_address(symbol.as_bytes()).is_some(),
                    "{symbol} (for {base}) is not exported"
                );
                assert_eq!(base_name(symbol), *base, "{symbol}");
            }
        }
        for symbol in exports::EXPORTED {
            if NOT_BY_BASE_NAME.contains(symbol) {
                continue;
            }
            let reachable = TABLE
                .iter()
                .any(|(_, variants)| variants.iter().any(|(_, s)| s == symbol))
                || PER_THREAD.iter().any(|(_, ptsz)| ptsz == symbol);
            assert!(
                reachable,
                "{symbol} is exported but no base name resolves to it"
            );
        }
    }

    #[test]
    fn per_thread_lookups_return_the_ptsz_variants_where_there_are_some() {
        let lookup = |name: &CStr, flags| {
            let mut p = std::ptr::null_mut();
            // SAFETY: a NUL-terminated name and a writable slot.
            unsafe { resolve(name.as_ptr(), &mut p, 13000, flags) }.unwrap();
            p
        };
        let own = |s: &str| exports::own_address(s.as_bytes()).unwrap();
        let per_thread = proc_address_flags::PER_THREAD_DEFAULT_STREAM;
        assert_eq!(
            lookup(c"cuMemAllocAsync", per_thread),
            own("cuMemAllocAsync_ptsz")
        );
        assert_eq!(
            lookup(c"cuMemFreeAsync", per_thread),
            own("cuMemFreeAsync_ptsz")
        );
        assert_eq!(
            lookup(c"cuMemAllocAsync", proc_address_flags::DEFAULT),
            own("cuMemAllocAsync")
        );
        assert_eq!(lookup(c"cuMemAlloc", per_thread), own("cuMemAlloc_v2"));
    }

    #[test]
    fn base_names_strip_only_version_suffixes() {
        assert_eq!(base_name("cuMemAlloc_v2"), "cuMemAlloc");
        assert_eq!(base_name("cuCtxCreate_v4"), "cuCtxCreate");
        assert_eq!(base_name("cuMemCreate"), "cuMemCreate");
        assert_eq!(base_name("cuFoo_vX"), "cuFoo_vX");
    }
}
