//! The workload's kernels: one PTX module ([`PTX`], `kernels.ptx`) with every kernel of the fake
//! driver's kernel contract, loaded with `cuModuleLoadData`, its functions found with
//! `cuModuleGetFunction` and launched with `cuLaunchKernel` through the workload's driver table
//! (so that, under the shim, every launch passes its submission gate). A GPU JIT-compiles the
//! text; the fake driver reads only the `.entry` names and runs its built-in equivalents.
//!
//! Element kernels (`fill`, `iota`, `add`, `sum_*`) run one thread per element; the others work
//! in the first thread of a one-thread grid.

use std::ffi::{CString, c_void};

use cuda_abi::{CUdeviceptr, CUfunction, CUmodule, CUstream};

use crate::driver::{Api, CuError};

/// The module's text (PTX 7.8 for sm_70 and later).
pub const PTX: &str = include_str!("kernels.ptx");

/// Threads per block of the element kernels.
const BLOCK: u32 = 256;

/// One kernel argument, passed by value as the kernel declares it.
#[derive(Debug, Clone, Copy)]
enum Arg {
    U64(u64),
    U32(u32),
}

/// The loaded module and one function handle per kernel.
#[derive(Debug)]
pub struct Kernels {
    module: CUmodule,
    noop: CUfunction,
    fill_u32: CUfunction,
    iota_u32: CUfunction,
    add_u32: CUfunction,
    checksum_u32: CUfunction,
    copy: CUfunction,
    sleep: CUfunction,
    spin_until_u32: CUfunction,
    set_u32: CUfunction,
    sum_u32: CUfunction,
    sum_f32: CUfunction,
}

#[allow(unsafe_code)] // a driver handle crossing to the busy thread
// SAFETY: module and function handles are process-wide driver handles, valid on any thread whose
// current context is the one they were loaded in (the workload has one context per process); the
// struct holds no host memory behind them.
unsafe impl Send for Kernels {}
#[allow(unsafe_code)] // a driver handle crossing to the busy thread
// SAFETY: as for `Send`; launching only reads the handles.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Loads [`PTX`] into the current context and finds every kernel.
    pub fn load(api: &Api) -> Result<Kernels, CuError> {
        // The text has no NUL byte (it is a source file of this crate).
        let image = CString::new(PTX).map_err(|_| CuError {
            call: "cuModuleLoadData",
            result: cuda_abi::CUresult::ERROR_INVALID_VALUE,
        })?;
        let module = api.module_load_data(&image)?;
        let find = |name: &std::ffi::CStr| api.module_get_function(module, name);
        let found = (|| {
            Ok(Kernels {
                module,
                noop: find(c"cuinterpose_noop")?,
                fill_u32: find(c"cuinterpose_fill_u32")?,
                iota_u32: find(c"cuinterpose_iota_u32")?,
                add_u32: find(c"cuinterpose_add_u32")?,
                checksum_u32: find(c"cuinterpose_checksum_u32")?,
                copy: find(c"cuinterpose_copy")?,
                sleep: find(c"cuinterpose_sleep")?,
                spin_until_u32: find(c"cuinterpose_spin_until_u32")?,
                set_u32: find(c"cuinterpose_set_u32")?,
                sum_u32: find(c"cuinterpose_sum_u32")?,
                sum_f32: find(c"cuinterpose_sum_f32")?,
            })
        })();
        if found.is_err() {
            let _ = api.module_unload(module);
        }
        found
    }

    /// The module handle.
    pub fn module(&self) -> CUmodule {
        self.module
    }

    /// Launches `f` with `args` on `stream`: one thread per element for `elements`, else one
    /// thread.
    fn launch(
        &self,
        api: &Api,
        f: CUfunction,
        stream: CUstream,
        elements: Option<u64>,
        args: &[Arg],
    ) -> Result<(), CuError> {
        let grid = match elements {
            Some(n) => u32::try_from(n.div_ceil(u64::from(BLOCK)).max(1)).map_err(|_| CuError {
                call: "cuLaunchKernel",
                result: cuda_abi::CUresult::ERROR_INVALID_VALUE,
            })?,
            None => 1,
        };
        let block = if elements.is_some() { BLOCK } else { 1 };
        let mut values: Vec<Arg> = args.to_vec();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|a| match a {
                Arg::U64(v) => std::ptr::from_mut(v).cast::<c_void>(),
                Arg::U32(v) => std::ptr::from_mut(v).cast::<c_void>(),
            })
            .collect();
        #[allow(unsafe_code)] // the launch: kernel parameters by pointer
        // SAFETY: every public launcher below passes exactly the parameters its kernel declares in
        // kernels.ptx (and the kernel table of crates/fake-cuda/README.md), in order and of the
        // declared widths; `values` outlives the call, and the driver copies the values at launch.
        // Device addresses the kernel touches are checked by the device (a bad one is a sticky
        // error, not host memory access).
        unsafe {
            api.launch_kernel(f, [grid, 1, 1], [block, 1, 1], 0, stream, &mut params)
        }
    }

    /// `cuinterpose_noop`.
    pub fn noop(&self, api: &Api, stream: CUstream) -> Result<(), CuError> {
        self.launch(api, self.noop, stream, None, &[])
    }

    /// `cuinterpose_fill_u32`: `dst[i] = value`.
    pub fn fill_u32(
        &self,
        api: &Api,
        stream: CUstream,
        dst: CUdeviceptr,
        count: u64,
        value: u32,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(dst), Arg::U64(count), Arg::U32(value)];
        self.launch(api, self.fill_u32, stream, Some(count), &args)
    }

    /// `cuinterpose_iota_u32`: `dst[i] = start + i` (wrapping).
    pub fn iota_u32(
        &self,
        api: &Api,
        stream: CUstream,
        dst: CUdeviceptr,
        count: u64,
        start: u32,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(dst), Arg::U64(count), Arg::U32(start)];
        self.launch(api, self.iota_u32, stream, Some(count), &args)
    }

    /// `cuinterpose_add_u32`: `dst[i] = src[i] + addend` (wrapping).
    pub fn add_u32(
        &self,
        api: &Api,
        stream: CUstream,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        count: u64,
        addend: u32,
    ) -> Result<(), CuError> {
        let args = [
            Arg::U64(dst),
            Arg::U64(src),
            Arg::U64(count),
            Arg::U32(addend),
        ];
        self.launch(api, self.add_u32, stream, Some(count), &args)
    }

    /// `cuinterpose_checksum_u32`: `*(u64*)out = sum of src[i]` (wrapping).
    pub fn checksum_u32(
        &self,
        api: &Api,
        stream: CUstream,
        src: CUdeviceptr,
        count: u64,
        out: CUdeviceptr,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(src), Arg::U64(count), Arg::U64(out)];
        self.launch(api, self.checksum_u32, stream, None, &args)
    }

    /// `cuinterpose_copy`: memmove of `bytes`.
    pub fn copy(
        &self,
        api: &Api,
        stream: CUstream,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: u64,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(dst), Arg::U64(src), Arg::U64(bytes)];
        self.launch(api, self.copy, stream, None, &args)
    }

    /// `cuinterpose_sleep`: the stream is busy for `nanoseconds`.
    pub fn sleep(&self, api: &Api, stream: CUstream, nanoseconds: u64) -> Result<(), CuError> {
        self.launch(api, self.sleep, stream, None, &[Arg::U64(nanoseconds)])
    }

    /// `cuinterpose_spin_until_u32`: busy until `*(u32*)flag >= value`.
    pub fn spin_until_u32(
        &self,
        api: &Api,
        stream: CUstream,
        flag: CUdeviceptr,
        value: u32,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(flag), Arg::U32(value)];
        self.launch(api, self.spin_until_u32, stream, None, &args)
    }

    /// `cuinterpose_set_u32`: `*(u32*)flag = value` (release store).
    pub fn set_u32(
        &self,
        api: &Api,
        stream: CUstream,
        flag: CUdeviceptr,
        value: u32,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(flag), Arg::U32(value)];
        self.launch(api, self.set_u32, stream, None, &args)
    }

    /// `cuinterpose_sum_u32`: `dst[i] += src[i]` (wrapping).
    pub fn sum_u32(
        &self,
        api: &Api,
        stream: CUstream,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        count: u64,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(dst), Arg::U64(src), Arg::U64(count)];
        self.launch(api, self.sum_u32, stream, Some(count), &args)
    }

    /// `cuinterpose_sum_f32`: `dst[i] += src[i]`.
    pub fn sum_f32(
        &self,
        api: &Api,
        stream: CUstream,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        count: u64,
    ) -> Result<(), CuError> {
        let args = [Arg::U64(dst), Arg::U64(src), Arg::U64(count)];
        self.launch(api, self.sum_f32, stream, Some(count), &args)
    }
}

/// The sum of `start + i` (wrapping u32) for `i < count`, as `cuinterpose_checksum_u32` of an
/// iota computes it (wrapping u64): what the busy modes compare the device's sums with.
pub fn iota_checksum(start: u32, count: u64) -> u64 {
    (0..count).fold(0u64, |sum, i| {
        sum.wrapping_add(u64::from(start.wrapping_add(i as u32)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_names_every_kernel_of_the_contract() {
        for name in [
            "cuinterpose_noop",
            "cuinterpose_fill_u32",
            "cuinterpose_iota_u32",
            "cuinterpose_add_u32",
            "cuinterpose_checksum_u32",
            "cuinterpose_copy",
            "cuinterpose_sleep",
            "cuinterpose_spin_until_u32",
            "cuinterpose_set_u32",
            "cuinterpose_sum_u32",
            "cuinterpose_sum_f32",
        ] {
            assert!(
                PTX.contains(&format!(".visible .entry {name}(")),
                "{name} is not an entry of kernels.ptx"
            );
        }
        assert!(PTX.contains(".version 7.8"));
        assert!(PTX.contains(".target sm_70"));
        assert!(!PTX.contains('\0'));
    }

    #[test]
    fn iota_checksums_wrap_per_element() {
        assert_eq!(iota_checksum(0, 4), 6);
        assert_eq!(iota_checksum(u32::MAX, 2), u64::from(u32::MAX));
        assert_eq!(iota_checksum(7, 0), 0);
    }
}
