//! The one driver layer of cuinterpose, generated from `driver_table.rs`.
//!
//! From the table this crate generates:
//! - [`DriverTable`], the raw function-pointer table (one field per entry, named and typed as in
//!   the table; the types are [`pfn`]);
//! - [`DriverTable::resolve`], which fills it through a caller's lookup (the shim's resolvers, or
//!   [`load`]'s `libloading`), with a stub returning `CUDA_ERROR_NOT_FOUND` for what is missing,
//!   so nothing ever calls through null;
//! - one checked call per entry (`table.cuMemMap(..)`, an `unsafe fn` taking the C arguments and
//!   returning `Result<(), CudaError>` through the single [`check`]).
//!
//! On top of those, [`safe`] holds one safe method per entry in Rust values (out-parameters become
//! return values, slices carry their lengths, handles are typed), and [`owned`] the objects that
//! clean up on drop. [`VirtualHandle`] (what an application sees) and [`DriverHandle`] (the
//! driver's) are distinct types, so the compiler keeps them apart.
//!
//! Two loaders, one API: the shim resolves the table with its own resolvers (crates/shim), the
//! tool and the workloads open `libcuda` with [`load`].

#![allow(unsafe_code)] // the driver layer: calls through C function pointers; each block says why
#![allow(non_snake_case)] // fields and checked calls carry the driver's symbol names

use core::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use core::ptr::NonNull;
use cuda_abi::{
    CUarray, CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUcontext, CUdevice, CUdeviceptr, CUevent, CUexternalSemaphore,
    CUfunction, CUgraphExec, CUhostFn, CUipcMemHandle, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemLocation, CUmodule, CUmulticastObjectProp, CUresult,
    CUstream, CUstreamCallback, CUuuid,
};

pub use cuda_abi as abi;

mod handles;
mod loader;
pub mod owned;
pub mod safe;

pub use handles::{DriverHandle, ForeignPtr, VirtualHandle};
pub use loader::{LoadError, Loaded, PINNED_CUDA_VERSION, Resolve, load};

/// A driver call that did not return `CUDA_SUCCESS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{call} returned {result}")]
pub struct CudaError {
    /// The entry point.
    pub call: &'static str,
    /// What it returned.
    pub result: CUresult,
}

/// The one place a driver result becomes a Rust result.
pub fn check(call: &'static str, result: CUresult) -> Result<(), CudaError> {
    if result.is_success() {
        Ok(())
    } else {
        Err(CudaError { call, result })
    }
}

/// How one entry point is found: by its exact name, or through the driver's resolver as `base` at
/// `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The exact ABI name (`cuMemFree_v2`).
    pub name: &'static CStr,
    /// `(base, version)` for an ABI variant the driver's `cuGetProcAddress_v2` picks.
    pub versioned: Option<(&'static CStr, c_int)>,
}

impl Entry {
    /// The name a resolver is asked for: the base name of a variant, else the name itself.
    pub fn base(&self) -> &'static CStr {
        self.versioned.map_or(self.name, |(base, _)| base)
    }
}

/// A `&'static CStr` naming the identifier, built at compile time.
macro_rules! cstr {
    ($name:ident) => {
        const {
            match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => unreachable!(),
            }
        }
    };
}

macro_rules! versioned {
    () => {
        None
    };
    ($base:ident, $version:literal) => {
        Some((cstr!($base), $version))
    };
}

macro_rules! interposer_table {
    (
        interception { $($i:ident),* $(,)? }
        wrapped {
            $( #[hook $wh:tt] $w:ident $(= $wb:ident @ $wv:literal)? ( $($wa:ident : $wt:ty),* $(,)? ); )*
        }
        gated { $( $g:ident $(= $gb:ident @ $gv:literal)? ( $($ga:ident : $gt:ty),* $(,)? ); )* }
        called { $( $c:ident $(= $cb:ident @ $cv:literal)? ( $($ca:ident : $ct:ty),* $(,)? ); )* }
    ) => {
        generate! {
            $( $w $(= $wb @ $wv)? ( $($wa : $wt),* ); )*
            $( $g $(= $gb @ $gv)? ( $($ga : $gt),* ); )*
            $( $c $(= $cb @ $cv)? ( $($ca : $ct),* ); )*
        }

        /// The names of the entries the shim intercepts (the table's `wrapped` section).
        pub const WRAPPED: &[&str] = &[$(stringify!($w)),*];

        /// The names of the entries the shim gates (the table's `gated` section).
        pub const GATED: &[&str] = &[$(stringify!($g)),*];
    };
}

macro_rules! generate {
    ( $( $n:ident $(= $b:ident @ $v:literal)? ( $($a:ident : $t:ty),* ); )* ) => {
        /// The C function-pointer type of every table entry, named after it.
        #[allow(non_camel_case_types)] // named after the entry points
        pub mod pfn {
            use super::*;
            $( pub type $n = unsafe extern "C" fn($($t),*) -> CUresult; )*
        }

        /// The driver's entry points, one field per table entry.
        #[derive(Debug, Clone, Copy)]
        pub struct DriverTable {
            $( #[allow(missing_docs)] pub $n: pfn::$n, )*
        }

        /// Stand-ins for entry points the driver does not have.
        mod missing {
            use super::*;
            $(
                pub(super) unsafe extern "C" fn $n($(_: $t),*) -> CUresult {
                    CUresult::ERROR_NOT_FOUND
                }
            )*
        }

        /// Every entry of the table, in table order.
        pub const ENTRIES: &[Entry] = &[
            $( Entry { name: cstr!($n), versioned: versioned!($($b, $v)?) }, )*
        ];

        impl DriverTable {
            /// A table of stubs only (every call returns `CUDA_ERROR_NOT_FOUND`): the base of a
            /// table a test fills with its own functions.
            pub fn unresolved() -> DriverTable {
                DriverTable { $( $n: missing::$n, )* }
            }

            /// Fills the table through `lookup`; an entry it does not find is a stub returning
            /// `CUDA_ERROR_NOT_FOUND`.
            ///
            /// # Safety
            /// Every pointer `lookup` returns for an entry is a function of exactly that entry's
            /// C signature, valid for as long as the table is used.
            pub unsafe fn resolve(
                mut lookup: impl FnMut(&Entry) -> Option<NonNull<c_void>>,
            ) -> DriverTable {
                DriverTable {
                    $( $n: {
                        let entry = Entry { name: cstr!($n), versioned: versioned!($($b, $v)?) };
                        match lookup(&entry) {
                            // SAFETY: the caller vouches for the pointer's signature.
                            Some(found) => unsafe {
                                core::mem::transmute::<*mut c_void, pfn::$n>(found.as_ptr())
                            },
                            None => missing::$n,
                        }
                    }, )*
                }
            }

            $(
                #[doc = concat!("`", stringify!($n), "`, checked.")]
                ///
                /// # Safety
                /// The driver function's contract for these arguments.
                #[allow(clippy::too_many_arguments)]
                pub unsafe fn $n(&self, $($a: $t),*) -> Result<(), CudaError> {
                    // SAFETY: the caller upholds the driver function's contract.
                    check(stringify!($n), unsafe { (self.$n)($($a),*) })
                }
            )*
        }
    };
}

include!("driver_table.rs");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_name_their_abi_and_base() {
        let free = ENTRIES
            .iter()
            .find(|e| e.name == c"cuMemFree_v2")
            .expect("cuMemFree_v2 is in the table");
        assert_eq!(free.versioned, Some((c"cuMemFree", 12000)));
        assert_eq!(free.base(), c"cuMemFree");
        let create = ENTRIES
            .iter()
            .find(|e| e.name == c"cuMemCreate")
            .expect("cuMemCreate is in the table");
        assert_eq!(create.versioned, None);
        assert_eq!(create.base(), c"cuMemCreate");
        assert!(WRAPPED.contains(&"cuMemMap"));
        assert!(!WRAPPED.contains(&"cuMemcpyHtoD_v2"));
    }

    #[test]
    fn a_missing_entry_is_a_not_found_stub_and_check_names_the_call() {
        // SAFETY: the lookup finds nothing, so every entry is a stub.
        let table = unsafe { DriverTable::resolve(|_| None) };
        // SAFETY: the stub reads no argument.
        let r = unsafe { table.cuMemUnmap(0, 0) };
        assert_eq!(
            r,
            Err(CudaError {
                call: "cuMemUnmap",
                result: CUresult::ERROR_NOT_FOUND
            })
        );
        assert_eq!(check("cuInit", CUresult::SUCCESS), Ok(()));
    }
}
