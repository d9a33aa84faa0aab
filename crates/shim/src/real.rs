//! The real driver table handed to every hook: built on the first wrapper call, published once.
//!
//! Building resolves every entry through the loader and the driver's resolver, so it happens
//! outside any lock and outside any `OnceLock` initialiser: two threads that race both build, one
//! table is published (a leaked `Box` in an `AtomicPtr`), and the loser frees its own copy. Nothing
//! runs in a library constructor.

#![allow(unsafe_code)] // publishing a leaked table through a raw pointer

use core::ffi::{CStr, c_int, c_void};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, Ordering};

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
    let fresh = Box::into_raw(Box::new(crate::table::build_real()));
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
        Some((base, version)) => crate::resolver::driver_entry(base, version, name),
    }
}
