//! The real driver: the table handed to every hook (built on the first wrapper call, published
//! once) and the driver's own resolvers it is built through.
//!
//! Building resolves every entry through the loader and the driver's resolver, so it happens
//! outside any lock and outside any `OnceLock` initialiser: two threads that race both build, one
//! table is published (a leaked `Box` in an `AtomicPtr`), and the loser frees its own copy. Nothing
//! runs in a library constructor.

#![allow(unsafe_code)] // publishing a leaked table through a raw pointer; calling the driver's resolver

use core::ffi::{CStr, c_int, c_void};

use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, Ordering};
use cuda_abi::pfn::{PFN_cuGetProcAddress, PFN_cuGetProcAddress_v2};
use cuda_abi::{proc_address_flags, proc_address_status};

use cuda::DriverTable as Real;

static REAL: AtomicPtr<Real> = AtomicPtr::new(ptr::null_mut());

/// The real table, built on first use.
pub(crate) fn get() -> &'static Real {
    let current = REAL.load(Ordering::Acquire);
    if current.is_null() {
        return publish();
    }
    // SAFETY: a published table is leaked and never mutated or freed.
    unsafe { &*current }
}

#[cold]
fn publish() -> &'static Real {
    let fresh = Box::into_raw(Box::new(build()));
    match REAL.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `fresh` is now the published table, leaked for the life of the process.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` lost the race and was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: `winner` is the published table, leaked for the life of the process.
            unsafe { &*winner }
        }
    }
}

/// One entry point of the driver: by exact ELF name, or through the driver's own
/// `cuGetProcAddress_v2(base, version)` for an ABI variant.
pub(crate) fn lookup(name: &CStr, versioned: Option<(&CStr, c_int)>) -> Option<NonNull<c_void>> {
    match versioned {
        None => crate::loader::driver_symbol(name),
        Some((base, version)) => driver_entry(base, version, name),
    }
}

/// Resolves every entry of the real table. Loader calls only: never call it under a lock or inside
/// a `OnceLock` initialiser (see [`get`]).
fn build() -> Real {
    // SAFETY: `lookup` returns the driver's entry point of each entry's exact ABI (by its ELF name,
    // or chosen by the driver's own resolver for the pinned version and checked by symbol name),
    // whose C signature is the table's; the driver stays loaded for the life of the process.
    unsafe { Real::resolve(|entry| lookup(entry.name, entry.versioned)) }
}

/// The real `cuGetProcAddress` (v1) and `cuGetProcAddress_v2`, or null until found.
static REAL_V1: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
static REAL_V2: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Records a driver resolver the `dlsym` hook found, so that ours forwards to the very driver the
/// application opened. Allocation- and lock-free.
pub(crate) fn note_resolver(name: &[u8], found: *mut c_void) {
    let slot = match name {
        b"cuGetProcAddress" => &REAL_V1,
        b"cuGetProcAddress_v2" => &REAL_V2,
        _ => return,
    };
    crate::loader::publish_once(slot, found);
}

/// A real resolver: the one the `dlsym` hook saw, else the driver's own definition.
fn resolver(slot: &AtomicPtr<c_void>, name: &CStr) -> Option<NonNull<c_void>> {
    crate::loader::found_once(slot, || crate::loader::driver_symbol(name))
}

pub(crate) fn resolver_v1() -> Option<PFN_cuGetProcAddress> {
    let found = resolver(&REAL_V1, c"cuGetProcAddress")?;
    // SAFETY: the driver's `cuGetProcAddress` export is the CUDA 11.3 four-argument resolver.
    Some(unsafe { core::mem::transmute::<*mut c_void, PFN_cuGetProcAddress>(found.as_ptr()) })
}

pub(crate) fn resolver_v2() -> Option<PFN_cuGetProcAddress_v2> {
    let found = resolver(&REAL_V2, c"cuGetProcAddress_v2")?;
    // SAFETY: the driver's `cuGetProcAddress_v2` export is the CUDA 12.0 five-argument resolver.
    Some(unsafe { core::mem::transmute::<*mut c_void, PFN_cuGetProcAddress_v2>(found.as_ptr()) })
}

/// The driver's entry point `expected` (an ABI variant such as `cuMemFree_v2`), as the driver's
/// own `cuGetProcAddress_v2(base, version)` resolves it. Refused if the driver names the result
/// as a different ABI the table knows (a version mismatch), or it is one of ours.
pub(crate) fn driver_entry(
    base: &CStr,
    version: c_int,
    expected: &CStr,
) -> Option<NonNull<c_void>> {
    let real = resolver_v2()?;
    let mut found: *mut c_void = ptr::null_mut();
    let mut status = proc_address_status::SYMBOL_NOT_FOUND;
    // SAFETY: a NUL-terminated name and two valid out-pointers.
    let result = unsafe {
        real(
            base.as_ptr(),
            &mut found,
            version,
            proc_address_flags::DEFAULT,
            &mut status,
        )
    };
    let found = NonNull::new(found)?;
    if !result.is_success()
        || status != proc_address_status::SUCCESS
        || crate::loader::is_own(found.as_ptr())
    {
        return None;
    }
    let info = crate::loader::symbol_at(found.as_ptr());
    let named = info
        .as_ref()
        .and_then(|info| info.exact_name(found.as_ptr()));
    match named {
        Some(name) if name != expected.to_bytes() && is_table_abi(name) => None,
        _ => Some(found),
    }
}

/// Whether `name` is an ABI the real table holds (wrapped, gated or called).
pub(crate) fn is_table_abi(name: &[u8]) -> bool {
    cuda::ENTRIES
        .iter()
        .any(|entry| entry.name.to_bytes() == name)
}
