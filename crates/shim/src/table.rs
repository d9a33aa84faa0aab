//! What the table in `driver_table.rs` generates inside the library.
//!
//! For each `wrapped` entry: the exported `#[no_mangle]` wrapper (in [`exports`]), its place in the
//! resolver dispatch ([`wrapper`]), its family in [`is_tracked_family`], and its field of
//! [`shim_runtime::Real`]. For each `called` entry: its field of `Real` only. A function the driver
//! lacks becomes a stub returning `CUDA_ERROR_NOT_FOUND`, so the runtime never calls through null.
//!
//! To wrap another driver function: add its hook to `shim_runtime::hooks` and its field to
//! `shim_runtime::Real` (same name, `PFN_<name>` type), then one line in `driver_table.rs`'s
//! `wrapped` section. The export, the version script, the resolver dispatch and the export test
//! follow from that line.

#![allow(unsafe_code)] // the exports are `unsafe extern "C"` and call through driver pointers
#![allow(non_snake_case)] // items carry the driver's symbol names

use core::ffi::{c_int, c_uint, c_ulonglong, c_void};
use core::ptr::NonNull;
use cuda_abi::{
    CUcontext, CUdevice, CUdeviceptr, CUipcMemHandle, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemLocation, CUmulticastObjectProp, CUresult, CUstream, CUuuid,
};

/// A `&'static CStr` naming the identifier, built at compile time.
macro_rules! cstr {
    ($name:ident) => {
        const {
            match core::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes())
            {
                Ok(name) => name,
                Err(_) => unreachable!(),
            }
        }
    };
}

/// How an entry is found: by its exact name, or through the driver's resolver at a version.
macro_rules! versioned {
    () => {
        None
    };
    ($base:ident, $version:literal) => {
        Some((cstr!($base), $version))
    };
}

/// The base name a resolver is asked for (`cuMemFree` for `cuMemFree_v2`).
macro_rules! family {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident, $base:ident) => {
        stringify!($base)
    };
}

/// One real-table field: the driver's entry point for exactly this ABI, or the stub.
macro_rules! real_entry {
    ($name:ident, ($($ty:ty),*), $($base:ident, $version:literal)?) => {{
        type Entry = unsafe extern "C" fn($($ty),*) -> CUresult;
        match crate::real::lookup(cstr!($name), versioned!($($base, $version)?)) {
            // SAFETY: `lookup` returns the driver's entry point of this exact ABI (by its ELF name,
            // or chosen by the driver's own resolver for the pinned version and checked by symbol
            // name), whose C signature is `Entry`.
            Some(found) => unsafe { core::mem::transmute::<*mut c_void, Entry>(found.as_ptr()) },
            None => missing::$name,
        }
    }};
}

macro_rules! interposer_table {
    (
        interception { $($i:ident),* $(,)? }
        wrapped { $( $w:ident $(= $wb:ident @ $wv:literal)? ( $($wa:ident : $wt:ty),* $(,)? ); )* }
        called { $( $c:ident $(= $cb:ident @ $cv:literal)? ( $($ca:ident : $ct:ty),* $(,)? ); )* }
    ) => {
        /// The exported wrappers. Each one fetches the real table (built on the first call) and
        /// hands its arguments unchanged to the runtime's hook of the same name.
        pub mod exports {
            use super::*;
            $(
                #[doc = concat!("The interposed `", stringify!($w), "`: runs `shim_runtime::hooks::",
                    stringify!($w), "` with the real driver table.")]
                ///
                /// # Safety
                /// The driver function's own contract for its arguments.
                #[cfg_attr(not(test), unsafe(no_mangle))]
                pub unsafe extern "C" fn $w($($wa: $wt),*) -> CUresult {
                    let real = crate::real::get();
                    // SAFETY: the caller upholds the driver function's contract for these
                    // arguments, which is the hook's contract.
                    unsafe { shim_runtime::hooks::$w(real, $($wa),*) }
                }
            )*
        }

        /// Stand-ins for entry points the driver does not have.
        mod missing {
            use super::*;
            $(
                pub(super) unsafe extern "C" fn $w($(_: $wt),*) -> CUresult {
                    CUresult::ERROR_NOT_FOUND
                }
            )*
            $(
                pub(super) unsafe extern "C" fn $c($(_: $ct),*) -> CUresult {
                    CUresult::ERROR_NOT_FOUND
                }
            )*
        }

        /// Resolves every entry of the real table. Loader calls only: never call it under a lock
        /// or inside a `OnceLock` initialiser (see `real::get`).
        pub(crate) fn build_real() -> shim_runtime::Real {
            shim_runtime::Real {
                $( $w: real_entry!($w, ($($wt),*), $($wb, $wv)?), )*
                $( $c: real_entry!($c, ($($ct),*), $($cb, $cv)?), )*
            }
        }

        /// The wrapper exported for the driver symbol `name` (an exact ABI name such as
        /// `cuIpcOpenMemHandle_v2`).
        pub(crate) fn wrapper(name: &[u8]) -> Option<NonNull<c_void>> {
            $(
                if name == stringify!($w).as_bytes() {
                    return NonNull::new(exports::$w as *mut c_void);
                }
            )*
            None
        }

        /// Whether `base` (a resolver's base name, `cuMemFree`) has a wrapped ABI variant.
        pub(crate) fn is_tracked_family(base: &[u8]) -> bool {
            $( if base == family!($w $(, $wb)?).as_bytes() { return true; } )*
            false
        }

        /// Whether `name` is an ABI the real table holds (wrapped or called).
        pub(crate) fn is_table_abi(name: &[u8]) -> bool {
            $( if name == stringify!($w).as_bytes() { return true; } )*
            $( if name == stringify!($c).as_bytes() { return true; } )*
            false
        }

        /// Every name the library exports, as the version script lists them.
        #[cfg(test)]
        pub(crate) const EXPORTS: &[&str] = &[$(stringify!($i),)* $(stringify!($w),)*];
    };
}

include!("driver_table.rs");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrappers_are_found_by_exact_abi_name_only() {
        assert!(wrapper(b"cuMemCreate").is_some());
        assert!(wrapper(b"cuIpcOpenMemHandle_v2").is_some());
        assert!(wrapper(b"cuMulticastBindMem_v2").is_some());
        assert!(wrapper(b"cuIpcOpenMemHandle").is_none());
        assert!(wrapper(b"cuMemFree").is_none());
        assert!(wrapper(b"cuMemcpyHtoD_v2").is_none());
        assert!(wrapper(b"cuGetExportTable").is_none());
        assert!(wrapper(b"cuMemCreat").is_none());
    }

    #[test]
    fn families_are_base_names() {
        assert!(is_tracked_family(b"cuMemFree"));
        assert!(is_tracked_family(b"cuIpcOpenMemHandle"));
        assert!(is_tracked_family(b"cuMulticastBindMem"));
        assert!(is_tracked_family(b"cuInit"));
        assert!(!is_tracked_family(b"cuMemFree_v2"));
        assert!(!is_tracked_family(b"cuMemcpyHtoD"));
        assert!(!is_tracked_family(b"cuDriverGetVersion"));
    }

    #[test]
    fn called_entries_are_table_abis_but_not_wrapped() {
        assert!(is_table_abi(b"cuMemcpyHtoD_v2"));
        assert!(is_table_abi(b"cuMemCreate"));
        assert!(!is_table_abi(b"cuMemcpyHtoD"));
        assert!(wrapper(b"cuDriverGetVersion").is_none());
    }

    #[test]
    fn exports_are_unique() {
        let mut names = EXPORTS.to_vec();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len());
        assert!(names.contains(&"dlsym"));
    }
}
