//! The driver's resolvers: `cuGetProcAddress` (CUDA 11.3, four arguments), `cuGetProcAddress_v2`
//! (CUDA 12.0, adds the symbol status) and `cuGetProcAddress_v2_ptsz`, plus the rule every
//! resolver wrapper (these and the runtime's in `cudart`) applies to what the real one returned.
//!
//! The rule ([`choose`]): the real resolver answers first and its result and status are kept. Only
//! a success with a non-null pointer (and status `SUCCESS` where there is one) is examined; the
//! wrapper is chosen by the symbol `dladdr` names at exactly that address, because the driver picks
//! the ABI variant from the requested version (`cuMulticastBindMem_v2` at 13.1). A function the
//! shim tracks whose returned ABI it has no wrapper for is reported as not found rather than handed
//! out with a mismatched signature or untracked; everything else passes through untouched, so an
//! untracked call costs nothing. `cuGetExportTable` is never touched.

#![allow(unsafe_code)] // exported C entry points writing through the caller's pointers
#![allow(non_snake_case)] // the entry points carry the CUDA symbol names

use core::ffi::{CStr, c_char, c_int, c_void};
use core::ptr::{self, NonNull};

use cuda_abi::pfn::{PFN_cuGetProcAddress, PFN_cuGetProcAddress_v2};
use cuda_abi::{CUresult, cuuint64_t, proc_address_flags, proc_address_status};

use crate::loader;

/// The cudaVersion from which `cuGetProcAddress` resolves to the five-argument `_v2`.
const V2_SINCE: c_int = 12000;

/// What a resolver wrapper does with the real resolver's successful, non-null answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Leave the pointer (and result, and status) as the real resolver gave them.
    Keep,
    /// Hand out this wrapper instead.
    Substitute(NonNull<c_void>),
    /// A tracked function in an ABI the shim cannot represent: report it as not found.
    NotFound,
}

/// This library's export for the driver symbol `name` (exact ABI name): a wrapper, or one of our
/// resolvers. Allocation- and lock-free.
pub(crate) fn exported_for(name: &[u8]) -> Option<NonNull<c_void>> {
    crate::table::wrapper(name).or_else(|| own_resolver(name))
}

fn own_resolver(name: &[u8]) -> Option<NonNull<c_void>> {
    let ours = match name {
        b"cuGetProcAddress" => cuGetProcAddress as PFN_cuGetProcAddress as *mut c_void,
        b"cuGetProcAddress_v2" => cuGetProcAddress_v2 as PFN_cuGetProcAddress_v2 as *mut c_void,
        b"cuGetProcAddress_v2_ptsz" => {
            cuGetProcAddress_v2_ptsz as PFN_cuGetProcAddress_v2 as *mut c_void
        }
        _ => return None,
    };
    NonNull::new(ours)
}

/// The resolver rule, for a request of base name `requested` at `cuda_version` that the real
/// resolver answered successfully with `found` (non-null).
pub(crate) fn choose(requested: &[u8], found: NonNull<c_void>, cuda_version: c_int) -> Choice {
    if requested == b"cuGetExportTable" || loader::is_own(found.as_ptr()) {
        return Choice::Keep;
    }
    let returned = loader::symbol_at(found.as_ptr());
    let name = returned
        .as_ref()
        .and_then(|info| info.exact_name(found.as_ptr()));
    if let Some(ours) = name.and_then(exported_for) {
        return Choice::Substitute(ours);
    }
    if requested == b"cuGetProcAddress" {
        // The driver's resolver under a name we do not know: its ABI is fixed by the documented
        // version boundary, and withholding it would break every runtime that bootstraps from it.
        let ours = if cuda_version >= V2_SINCE {
            b"cuGetProcAddress_v2".as_slice()
        } else {
            b"cuGetProcAddress".as_slice()
        };
        return own_resolver(ours).map_or(Choice::NotFound, Choice::Substitute);
    }
    if crate::table::is_tracked_family(requested) {
        Choice::NotFound
    } else {
        if crate::table::is_gated_family(requested) {
            // A submission entry in an ABI the table lacks: handing it out keeps the application
            // working, and the runtime refuses to capture this process while it could submit
            // work the gate does not see (fail closed, named in INSPECT).
            shim_runtime::gate::note_ungated(requested);
        }
        Choice::Keep
    }
}

/// The requested base name, if there is one.
///
/// # Safety
/// `symbol` is null or NUL-terminated.
unsafe fn requested<'a>(symbol: *const c_char) -> Option<&'a [u8]> {
    if symbol.is_null() {
        return None;
    }
    // SAFETY: per the contract; the real resolver has just read the same string.
    Some(unsafe { CStr::from_ptr(symbol) }.to_bytes())
}

/// The pointer the real resolver stored, when there is one to examine.
///
/// # Safety
/// `pfn` is null or valid for reads.
unsafe fn returned(pfn: *mut *mut c_void) -> Option<NonNull<c_void>> {
    if pfn.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    NonNull::new(unsafe { pfn.read() })
}

/// `cuGetProcAddress` (CUDA 11.3 ABI): the real one, then [`choose`]. Not found is reported as
/// `CUDA_ERROR_NOT_FOUND` with a null pointer, as this ABI did.
///
/// # Safety
/// The driver's contract: `symbol` NUL-terminated, `pfn` valid for writes.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
) -> CUresult {
    let Some(real) = crate::real::resolver_v1() else {
        return CUresult::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, under the same contract.
    let result = unsafe { real(symbol, pfn, cuda_version, flags) };
    if !result.is_success() {
        return result;
    }
    // SAFETY: the real resolver accepted both pointers.
    let (Some(name), Some(found)) = (unsafe { requested(symbol) }, unsafe { returned(pfn) }) else {
        return result;
    };
    match choose(name, found, cuda_version) {
        Choice::Keep => result,
        Choice::Substitute(ours) => {
            // SAFETY: `pfn` is non-null (we just read it) and valid for writes per the contract.
            unsafe { pfn.write(ours.as_ptr()) };
            result
        }
        Choice::NotFound => {
            // SAFETY: as above.
            unsafe { pfn.write(ptr::null_mut()) };
            CUresult::ERROR_NOT_FOUND
        }
    }
}

/// `cuGetProcAddress_v2` (CUDA 12.0 ABI): the real one, then [`choose`] when the status is
/// `SUCCESS` or not asked for. Not found is reported as the driver reports it: `CUDA_SUCCESS`, a
/// null pointer and `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
///
/// # Safety
/// The driver's contract: `symbol` NUL-terminated, `pfn` valid for writes, `status` null or valid
/// for writes.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut c_int,
) -> CUresult {
    let Some(real) = crate::real::resolver_v2() else {
        return CUresult::ERROR_NOT_FOUND;
    };
    // SAFETY: the caller's arguments, under the same contract.
    let result = unsafe { real(symbol, pfn, cuda_version, flags, status) };
    // SAFETY: `status` is null or valid per the contract.
    if !result.is_success() || unsafe { status_says_other(status) } {
        return result;
    }
    // SAFETY: the real resolver accepted both pointers.
    let (Some(name), Some(found)) = (unsafe { requested(symbol) }, unsafe { returned(pfn) }) else {
        return result;
    };
    match choose(name, found, cuda_version) {
        Choice::Keep => {}
        // SAFETY: `pfn` is non-null (we just read it) and valid for writes per the contract.
        Choice::Substitute(ours) => unsafe { pfn.write(ours.as_ptr()) },
        Choice::NotFound => {
            // SAFETY: as above.
            unsafe { pfn.write(ptr::null_mut()) };
            if !status.is_null() {
                // SAFETY: a given status is valid for writes per the contract.
                unsafe { status.write(proc_address_status::SYMBOL_NOT_FOUND) };
            }
        }
    }
    result
}

/// Whether a status was asked for and says anything but `SUCCESS`.
///
/// # Safety
/// `status` is null or valid for reads.
unsafe fn status_says_other(status: *const c_int) -> bool {
    // SAFETY: per the contract.
    !status.is_null() && unsafe { status.read() } != proc_address_status::SUCCESS
}

/// `cuGetProcAddress_v2_ptsz`: the per-thread-default-stream spelling. Asks for the per-thread
/// variants when the caller chose neither stream flag, then behaves as [`cuGetProcAddress_v2`].
///
/// # Safety
/// As [`cuGetProcAddress_v2`].
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cuGetProcAddress_v2_ptsz(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut c_int,
) -> CUresult {
    let streams = proc_address_flags::LEGACY_STREAM | proc_address_flags::PER_THREAD_DEFAULT_STREAM;
    let flags = if flags & streams == 0 {
        flags | proc_address_flags::PER_THREAD_DEFAULT_STREAM
    } else {
        flags
    };
    // SAFETY: the caller's arguments, under the same contract.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status) }
}
