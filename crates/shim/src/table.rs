//! What the table in `crates/cuda/src/driver_table.rs` generates inside the library.
//!
//! For each `wrapped` entry: the exported `#[no_mangle]` wrapper (in [`exports`]), whose body is the
//! hook its `#[hook(..)]` clause names, expanded by `crate::hooks::hook!` (the FFI boundary), its
//! place in the resolver dispatch ([`wrapper`]) and its family in [`is_tracked_family`]. For each
//! `gated` entry: the exported wrapper that passes the submission gate and calls the driver's same
//! ABI, and its place in the resolver dispatch and in [`is_gated_family`]. The real table is the
//! `cuda` crate's [`cuda::DriverTable`], resolved through this library's own lookup (`real.rs`);
//! an entry the driver lacks is the `cuda` crate's `CUDA_ERROR_NOT_FOUND` stub, so
//! the runtime never calls through null.
//!
//! To wrap another driver function: move its line to the table's `wrapped` section with its
//! `#[hook(..)]` clause, and write its tracked call in `shim_runtime` (Rust values); to gate one,
//! move its line to `gated`. The export, the hook, the version script, the resolver dispatch and
//! the export test follow from the table.

#![allow(unsafe_code)] // the exports are `unsafe extern "C"`
#![allow(non_snake_case)] // items carry the driver's symbol names

use core::ffi::c_int;
use core::ffi::{c_uint, c_ulonglong, c_void};
use core::ptr::NonNull;
use cuda_abi::{
    CUarray, CUcontext, CUdevice, CUdeviceptr, CUevent, CUexternalSemaphore, CUfunction,
    CUgraphExec, CUhostFn, CUipcMemHandle, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemLocation, CUmulticastObjectProp, CUresult, CUstream,
    CUstreamCallback,
};

/// The base name a resolver is asked for (`cuMemFree` for `cuMemFree_v2`).
macro_rules! family {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident, $base:ident) => {
        stringify!($base)
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
        /// The exported wrappers. A wrapped entry's wrapper fetches the real table (built on the
        /// first call) and runs the hook its `#[hook(..)]` clause names (`crate::hooks::hook!`).
        pub mod exports {
            use super::*;
            $(
                #[doc = concat!("The interposed `", stringify!($w), "`: `#[hook",
                    stringify!($wh), "]`.")]
                ///
                /// # Safety
                /// The driver function's own contract for its arguments.
                #[cfg_attr(not(test), unsafe(no_mangle))]
                pub unsafe extern "C" fn $w($($wa: $wt),*) -> CUresult {
                    let real = crate::real::get();
                    crate::hooks::hook!($wh real.$w($($wa),*))
                }
            )*
            $(
                #[doc = concat!("The gated `", stringify!($g), "`: passes the submission gate, then \
                    calls the driver's with the arguments unchanged.")]
                ///
                /// # Safety
                /// The driver function's own contract for its arguments.
                #[cfg_attr(not(test), unsafe(no_mangle))]
                pub unsafe extern "C" fn $g($($ga: $gt),*) -> CUresult {
                    let _pass = shim_runtime::gate::SubmissionGate::enter();
                    let real = crate::real::get();
                    // SAFETY: the caller upholds the driver function's contract for these
                    // arguments, passed on unchanged to the same ABI of the real driver.
                    unsafe { (real.$g)($($ga),*) }
                }
            )*
        }

        /// The wrapper exported for the driver symbol `name` (an exact ABI name such as
        /// `cuIpcOpenMemHandle_v2`).
        pub(crate) fn wrapper(name: &[u8]) -> Option<NonNull<c_void>> {
            $(
                if name == stringify!($w).as_bytes() {
                    return NonNull::new(exports::$w as *mut c_void);
                }
            )*
            $(
                if name == stringify!($g).as_bytes() {
                    return NonNull::new(exports::$g as *mut c_void);
                }
            )*
            None
        }

        /// Whether `base` (a resolver's base name, `cuLaunchKernel`) names a gated family: one of
        /// the gated entries is `base` itself or `base` with ABI suffixes (`_v2`, `_ptsz`, `_ptds`).
        pub(crate) fn is_gated_family(base: &[u8]) -> bool {
            $( if abi_family(stringify!($g).as_bytes()) == base { return true; } )*
            false
        }

        /// Whether `base` (a resolver's base name, `cuMemFree`) has a wrapped ABI variant.
        pub(crate) fn is_tracked_family(base: &[u8]) -> bool {
            $( if base == family!($w $(, $wb)?).as_bytes() { return true; } )*
            false
        }

        /// Every name the library exports, as the version script lists them.
        #[cfg(test)]
        pub(crate) const EXPORTS: &[&str] =
            &[$(stringify!($i),)* $(stringify!($w),)* $(stringify!($g),)*];
    };
}

include!("../../cuda/src/driver_table.rs");

/// The resolver's base name of an exact ABI name: `cuMemcpyHtoDAsync_v2_ptsz` ->
/// `cuMemcpyHtoDAsync`. Allocation-free (the resolvers run it).
fn abi_family(name: &[u8]) -> &[u8] {
    let name = name
        .strip_suffix(b"_ptsz")
        .or_else(|| name.strip_suffix(b"_ptds"))
        .unwrap_or(name);
    name.strip_suffix(b"_v2").unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::real::is_table_abi;

    #[test]
    fn wrappers_are_found_by_exact_abi_name_only() {
        assert!(wrapper(b"cuMemCreate").is_some());
        assert!(wrapper(b"cuIpcOpenMemHandle_v2").is_some());
        assert!(wrapper(b"cuMulticastBindMem_v2").is_some());
        assert!(wrapper(b"cuIpcOpenMemHandle").is_none());
        assert!(wrapper(b"cuMemFree").is_none());
        assert!(wrapper(b"cuMemcpyHtoD").is_none());
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
        assert!(is_table_abi(b"cuStreamCreate"));
        assert!(is_table_abi(b"cuMemCreate"));
        assert!(!is_table_abi(b"cuMemcpyHtoD"));
        assert!(wrapper(b"cuDriverGetVersion").is_none());
        assert!(wrapper(b"cuStreamCreate").is_none());
    }

    #[test]
    fn every_abi_of_a_gated_family_has_its_own_wrapper() {
        for name in [
            &b"cuLaunchKernel"[..],
            b"cuLaunchKernel_ptsz",
            b"cuMemcpyHtoDAsync_v2",
            b"cuMemcpyHtoDAsync_v2_ptsz",
            b"cuMemcpyDtoH_v2_ptds",
            b"cuMemsetD8_v2",
            b"cuStreamWaitValue32_v2",
            b"cuEventRecord_ptsz",
            b"cuGraphLaunch",
        ] {
            assert!(wrapper(name).is_some(), "{}", String::from_utf8_lossy(name));
            assert!(is_table_abi(name));
        }
        assert!(is_gated_family(b"cuLaunchKernel"));
        assert!(is_gated_family(b"cuMemcpyHtoDAsync"));
        assert!(is_gated_family(b"cuMemcpyBatchAsync"));
        assert!(!is_gated_family(b"cuMemcpyHtoDAsync_v2"));
        assert!(!is_gated_family(b"cuMemCreate"));
        assert!(!is_gated_family(b"cuStreamCreate"));
        assert_eq!(
            abi_family(b"cuMemcpy3DBatchAsync_v2_ptsz"),
            b"cuMemcpy3DBatchAsync"
        );
        assert_eq!(abi_family(b"cuMemcpy_ptds"), b"cuMemcpy");
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
