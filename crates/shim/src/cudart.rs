//! The CUDA runtime's resolvers, for programs bound to a dynamic `libcudart.so`:
//! `cudaGetDriverEntryPoint{,_ptsz}` and `cudaGetDriverEntryPointByVersion{,_ptsz}`.
//!
//! Each forwards to the real runtime function (the one the `dlsym` hook saw in `libcudart.so*`,
//! else the next definition after this library) and applies the driver resolver rule
//! ([`crate::resolver::choose`]) to its answer. A runtime usually resolves through the driver's
//! `cuGetProcAddress_v2`, which it found through our `dlsym` and so already substitutes; this layer
//! covers a runtime that reached the driver some other way.
//!
//! ABI guard: `cudaGetDriverEntryPoint` took three arguments before CUDA 12.0 and four since (the
//! query status). All four argument registers are forwarded as the caller set them, which is sound
//! for both (the 11.x function ignores the fourth), but the shim reads or writes the status only if
//! `cudaRuntimeGetVersion` of the same library reports 12000 or more; otherwise the fourth register
//! may be stale garbage from a three-argument caller. `...ByVersion` exists only since 12.5 and
//! always has the status.

#![allow(unsafe_code)] // exported C entry points writing through the caller's pointers
#![allow(non_snake_case)] // the entry points carry the CUDA symbol names

use core::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use core::ptr::{self, NonNull};
use core::sync::atomic::AtomicPtr;

use crate::loader;
use crate::resolver::{self, Choice};

/// `cudaError_t` values used here.
const CUDA_SUCCESS: c_int = 0;
const CUDA_ERROR_SYMBOL_NOT_FOUND: c_int = 500;
const CUDA_ERROR_NOT_SUPPORTED: c_int = 801;
/// `cudaDriverEntryPointQueryResult` values used here.
const ENTRY_POINT_SUCCESS: c_int = 0;
const ENTRY_POINT_SYMBOL_NOT_FOUND: c_int = 1;
/// The runtime version that added the status argument.
const STATUS_SINCE: c_int = 12000;

type GetEntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_ulonglong, *mut c_int) -> c_int;
type GetEntryPointByVersion =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, c_ulonglong, *mut c_int) -> c_int;
type RuntimeGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

/// The four runtime resolvers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    EntryPoint,
    EntryPointPtsz,
    ByVersion,
    ByVersionPtsz,
}

/// The real runtime functions, or null until found.
static REAL: [AtomicPtr<c_void>; 4] = [
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
    AtomicPtr::new(ptr::null_mut()),
];

impl Which {
    fn named(name: &[u8]) -> Option<Which> {
        match name {
            b"cudaGetDriverEntryPoint" => Some(Which::EntryPoint),
            b"cudaGetDriverEntryPoint_ptsz" => Some(Which::EntryPointPtsz),
            b"cudaGetDriverEntryPointByVersion" => Some(Which::ByVersion),
            b"cudaGetDriverEntryPointByVersion_ptsz" => Some(Which::ByVersionPtsz),
            _ => None,
        }
    }

    fn name(self) -> &'static CStr {
        match self {
            Which::EntryPoint => c"cudaGetDriverEntryPoint",
            Which::EntryPointPtsz => c"cudaGetDriverEntryPoint_ptsz",
            Which::ByVersion => c"cudaGetDriverEntryPointByVersion",
            Which::ByVersionPtsz => c"cudaGetDriverEntryPointByVersion_ptsz",
        }
    }

    fn slot(self) -> &'static AtomicPtr<c_void> {
        let [entry, entry_ptsz, by_version, by_version_ptsz] = &REAL;
        match self {
            Which::EntryPoint => entry,
            Which::EntryPointPtsz => entry_ptsz,
            Which::ByVersion => by_version,
            Which::ByVersionPtsz => by_version_ptsz,
        }
    }

    fn ours(self) -> *mut c_void {
        match self {
            Which::EntryPoint => cudaGetDriverEntryPoint as GetEntryPoint as *mut c_void,
            Which::EntryPointPtsz => cudaGetDriverEntryPoint_ptsz as GetEntryPoint as *mut c_void,
            Which::ByVersion => {
                cudaGetDriverEntryPointByVersion as GetEntryPointByVersion as *mut c_void
            }
            Which::ByVersionPtsz => {
                cudaGetDriverEntryPointByVersion_ptsz as GetEntryPointByVersion as *mut c_void
            }
        }
    }

    /// The real runtime function: the one the `dlsym` hook saw, else the next definition.
    fn real(self) -> Option<NonNull<c_void>> {
        loader::found_once(self.slot(), || {
            // SAFETY: RTLD_NEXT is a valid pseudo-handle.
            unsafe { loader::lookup_in(libc::RTLD_NEXT, self.name()) }
                .filter(|found| !loader::is_own(found.as_ptr()))
        })
    }
}

/// Records a runtime resolver the `dlsym` hook found in `libcudart.so*`. Allocation- and lock-free.
pub(crate) fn note_real(name: &[u8], found: *mut c_void) {
    if let Some(which) = Which::named(name) {
        loader::publish_once(which.slot(), found);
    }
}

/// Our export for the runtime symbol `name`. Allocation- and lock-free.
pub(crate) fn exported_for(name: &[u8]) -> Option<NonNull<c_void>> {
    Which::named(name).and_then(|which| NonNull::new(which.ours()))
}

/// `cudaRuntimeGetVersion` of the library holding `function`.
fn runtime_version(function: NonNull<c_void>) -> Option<c_int> {
    loader::with_object_of(function.as_ptr(), |library| {
        // SAFETY: `library` is a live reference held by `with_object_of`.
        let Some(get) = (unsafe { loader::lookup_in(library.as_ptr(), c"cudaRuntimeGetVersion") })
        else {
            loader::clear_dlerror();
            return None;
        };
        // SAFETY: the runtime's `cudaRuntimeGetVersion(int *)`.
        let get = unsafe { core::mem::transmute::<*mut c_void, RuntimeGetVersion>(get.as_ptr()) };
        let mut version: c_int = 0;
        // SAFETY: a valid out-pointer.
        (unsafe { get(&mut version) } == CUDA_SUCCESS).then_some(version)
    })
}

/// Applies the resolver rule to a real runtime resolver's answer.
///
/// `status` is `Some` when the ABI has the status argument (then it may still be null).
///
/// # Safety
/// `symbol` null or NUL-terminated; `pfn` null or valid for reads and writes; a `Some(status)`
/// null or valid for reads and writes.
unsafe fn finish(
    result: c_int,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    status: Option<*mut c_int>,
    cuda_version: c_int,
) -> c_int {
    if result != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() {
        return result;
    }
    if let Some(status) = status {
        // SAFETY: per the contract.
        if !status.is_null() && unsafe { status.read() } != ENTRY_POINT_SUCCESS {
            return result;
        }
    }
    // SAFETY: per the contract.
    let Some(found) = NonNull::new(unsafe { pfn.read() }) else {
        return result;
    };
    // SAFETY: per the contract; the real resolver has just read the same string.
    let requested = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    match resolver::choose(requested, found, cuda_version) {
        Choice::Keep => result,
        Choice::Substitute(ours) => {
            // SAFETY: per the contract.
            unsafe { pfn.write(ours.as_ptr()) };
            result
        }
        Choice::NotFound => {
            // SAFETY: per the contract.
            unsafe { pfn.write(ptr::null_mut()) };
            match status {
                Some(status) => {
                    if !status.is_null() {
                        // SAFETY: per the contract.
                        unsafe { status.write(ENTRY_POINT_SYMBOL_NOT_FOUND) };
                    }
                    CUDA_SUCCESS
                }
                None => CUDA_ERROR_SYMBOL_NOT_FOUND,
            }
        }
    }
}

/// `cudaGetDriverEntryPoint{,_ptsz}` through the real `which`.
///
/// # Safety
/// The runtime's contract for the function.
unsafe fn entry_point(
    which: Which,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    let Some(real) = which.real() else {
        return CUDA_ERROR_NOT_SUPPORTED;
    };
    // SAFETY: the runtime's `cudaGetDriverEntryPoint`, three or four arguments (see module docs).
    let function = unsafe { core::mem::transmute::<*mut c_void, GetEntryPoint>(real.as_ptr()) };
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { function(symbol, pfn, flags, status) };
    if result != CUDA_SUCCESS {
        return result;
    }
    let version = runtime_version(real).unwrap_or(0);
    let status = (version >= STATUS_SINCE).then_some(status);
    // SAFETY: the caller's pointers; the status only where the ABI has it.
    unsafe { finish(result, symbol, pfn, status, version) }
}

/// `cudaGetDriverEntryPointByVersion{,_ptsz}` through the real `which`.
///
/// # Safety
/// The runtime's contract for the function.
unsafe fn by_version(
    which: Which,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_uint,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    let Some(real) = which.real() else {
        return CUDA_ERROR_NOT_SUPPORTED;
    };
    // SAFETY: the runtime's `cudaGetDriverEntryPointByVersion` (CUDA 12.5 ABI, its only one).
    let function =
        unsafe { core::mem::transmute::<*mut c_void, GetEntryPointByVersion>(real.as_ptr()) };
    // SAFETY: the caller's arguments, unchanged.
    let result = unsafe { function(symbol, pfn, cuda_version, flags, status) };
    let version = c_int::try_from(cuda_version).unwrap_or(c_int::MAX);
    // SAFETY: the caller's pointers.
    unsafe { finish(result, symbol, pfn, Some(status), version) }
}

/// `cudaGetDriverEntryPoint`: the real one, then the resolver rule.
///
/// # Safety
/// The runtime's contract: `symbol` NUL-terminated, `funcPtr` valid for writes, the status (CUDA
/// 12.0 and later) null or valid for writes.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { entry_point(Which::EntryPoint, symbol, pfn, flags, status) }
}

/// `cudaGetDriverEntryPoint_ptsz`: as [`cudaGetDriverEntryPoint`], through the real `_ptsz`.
///
/// # Safety
/// As [`cudaGetDriverEntryPoint`].
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cudaGetDriverEntryPoint_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { entry_point(Which::EntryPointPtsz, symbol, pfn, flags, status) }
}

/// `cudaGetDriverEntryPointByVersion`: the real one, then the resolver rule.
///
/// # Safety
/// The runtime's contract: `symbol` NUL-terminated, `funcPtr` valid for writes, the status null
/// or valid for writes.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_uint,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { by_version(Which::ByVersion, symbol, pfn, cuda_version, flags, status) }
}

/// `cudaGetDriverEntryPointByVersion_ptsz`: as [`cudaGetDriverEntryPointByVersion`], through the
/// real `_ptsz`.
///
/// # Safety
/// As [`cudaGetDriverEntryPointByVersion`].
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_uint,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        by_version(
            Which::ByVersionPtsz,
            symbol,
            pfn,
            cuda_version,
            flags,
            status,
        )
    }
}
