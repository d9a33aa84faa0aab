//! The CUDA driver, reached as real NCCL reaches it through the CUDA runtime: `dlopen` of
//! `libcuda.so.1` and `dlsym` of each entry point. `dlsym` is called (not linked), so an
//! interposer that wraps `dlsym` (LD_PRELOAD) sees, and may wrap, every launch.

use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::OnceLock;

use cuda_abi::{CUcontext, CUdevice, CUresult, CUstream};

use crate::abi::Element;
use crate::error::NcclError;
use crate::plan::Kernel;

/// `CUmodule` and `CUfunction`: opaque driver handles.
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;

type ModuleLoadData = unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult;
type ModuleGetFunction = unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> CUresult;
type ModuleUnload = unsafe extern "C" fn(CUmodule) -> CUresult;
type LaunchKernel = unsafe extern "C" fn(
    CUfunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CUstream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
type MemHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult;
type MemHostUnregister = unsafe extern "C" fn(*mut c_void) -> CUresult;
type CtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type CtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;

/// The driver entry points this library calls.
#[derive(Debug)]
pub struct Driver {
    module_load_data: ModuleLoadData,
    module_get_function: ModuleGetFunction,
    /// Optional: without it a communicator's module stays loaded after it is destroyed.
    module_unload: Option<ModuleUnload>,
    launch_kernel: LaunchKernel,
    mem_host_register: MemHostRegister,
    mem_host_unregister: MemHostUnregister,
    ctx_get_current: CtxGetCurrent,
    ctx_get_device: CtxGetDevice,
}

/// The module this library loads in each communicator's context: PTX text whose `.entry` names are
/// the fake driver's built-in kernels (crates/fake-cuda/README.md, "Modules and kernels"), which is
/// all the fake reads of it. The bodies are empty: this library is for the fake driver, never for a
/// GPU.
const MODULE: &CStr = c"//
// fake-nccl: the kernels of an all-reduce (implemented by the fake CUDA driver)
//
.version 8.0
.target sm_90
.address_size 64

.visible .entry cuinterpose_copy(.param .u64 dst, .param .u64 src, .param .u64 bytes) { ret; }
.visible .entry cuinterpose_set_u32(.param .u64 flag, .param .u32 value) { ret; }
.visible .entry cuinterpose_spin_until_u32(.param .u64 flag, .param .u32 value) { ret; }
.visible .entry cuinterpose_sum_u32(.param .u64 dst, .param .u64 src, .param .u64 count) { ret; }
.visible .entry cuinterpose_sum_f32(.param .u64 dst, .param .u64 src, .param .u64 count) { ret; }
";

/// The kernel names, in the order of [`Kernels`]' fields.
const NAMES: [&CStr; 5] = [
    c"cuinterpose_copy",
    c"cuinterpose_set_u32",
    c"cuinterpose_spin_until_u32",
    c"cuinterpose_sum_u32",
    c"cuinterpose_sum_f32",
];

/// A loaded module and its functions (valid in the context that loaded them).
#[derive(Debug)]
pub struct Kernels {
    module: CUmodule,
    functions: [CUfunction; 5],
}

// SAFETY: driver handles are plain identifiers the driver accepts from any thread.
unsafe impl Send for Kernels {}
// SAFETY: as above; nothing is reached through them in this process.
unsafe impl Sync for Kernels {}

fn check(call: &'static str, result: CUresult) -> Result<(), NcclError> {
    if result.is_success() {
        Ok(())
    } else {
        Err(NcclError::Cuda { call, result })
    }
}

/// The driver, loaded at the first use (and never unloaded, as the CUDA runtime keeps it).
pub fn driver() -> Result<&'static Driver, NcclError> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(Driver::load)
        .as_ref()
        .map_err(|e| NcclError::DriverLoad(e.clone()))
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call on
    // this thread, copied at once.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        "unknown dl error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Driver {
    fn load() -> Result<Driver, String> {
        // SAFETY: a constant NUL-terminated name; loading the driver runs its initialisers,
        // which is what loading it is for.
        let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if handle.is_null() {
            return Err(format!("libcuda.so.1: {}", dlerror_text()));
        }
        let find = |name: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: `handle` is a live dlopen handle (never closed); `name` is NUL-terminated.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if p.is_null() {
                Err(format!("{}: {}", name.to_string_lossy(), dlerror_text()))
            } else {
                Ok(p)
            }
        };
        macro_rules! get {
            ($name:literal, $ty:ty) => {{
                let p = find($name)?;
                // SAFETY: the driver exports this name with this C signature (cuda.h).
                unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
            }};
        }
        Ok(Driver {
            module_load_data: get!(c"cuModuleLoadData", ModuleLoadData),
            module_get_function: get!(c"cuModuleGetFunction", ModuleGetFunction),
            module_unload: match find(c"cuModuleUnload") {
                // SAFETY: as above.
                Ok(p) => Some(unsafe { std::mem::transmute::<*mut c_void, ModuleUnload>(p) }),
                Err(_) => None,
            },
            launch_kernel: get!(c"cuLaunchKernel", LaunchKernel),
            mem_host_register: get!(c"cuMemHostRegister_v2", MemHostRegister),
            mem_host_unregister: get!(c"cuMemHostUnregister", MemHostUnregister),
            ctx_get_current: get!(c"cuCtxGetCurrent", CtxGetCurrent),
            ctx_get_device: get!(c"cuCtxGetDevice", CtxGetDevice),
        })
    }

    /// The calling thread's current context and its device; a communicator lives in it.
    pub fn current(&self) -> Result<(CUcontext, CUdevice), NcclError> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        check("cuCtxGetCurrent", unsafe {
            (self.ctx_get_current)(&mut ctx)
        })?;
        if ctx.is_null() {
            return Err(NcclError::InvalidUsage(
                "no current CUDA context: make the communicator's device's context current first"
                    .into(),
            ));
        }
        let mut device: CUdevice = -1;
        // SAFETY: as above.
        check("cuCtxGetDevice", unsafe {
            (self.ctx_get_device)(&mut device)
        })?;
        Ok((ctx, device))
    }

    /// Loads the module in the current context and finds its kernels.
    pub fn load_kernels(&self) -> Result<Kernels, NcclError> {
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: the image is a NUL-terminated static string; the out-pointer a live local.
        let loaded = unsafe { (self.module_load_data)(&mut module, MODULE.as_ptr().cast()) };
        check("cuModuleLoadData", loaded)?;
        let mut functions = [std::ptr::null_mut(); 5];
        for (slot, name) in functions.iter_mut().zip(NAMES) {
            // SAFETY: `module` was just loaded; the name is NUL-terminated; the out-pointer lives.
            let found = unsafe { (self.module_get_function)(slot, module, name.as_ptr()) };
            if let Err(e) = check("cuModuleGetFunction", found) {
                self.unload(&Kernels { module, functions });
                return Err(e);
            }
        }
        Ok(Kernels { module, functions })
    }

    /// Unloads a module once nothing queued uses it any more.
    pub fn unload(&self, kernels: &Kernels) {
        if let Some(unload) = self.module_unload {
            // SAFETY: the module was loaded by `load_kernels`; its owner unloads it once. A failure
            // leaves a module loaded, which harms nothing.
            let _ = unsafe { unload(kernels.module) };
        }
    }

    /// Registers `[p, p + bytes)` (host memory this process mapped) with the driver, so kernels
    /// may touch it.
    pub fn register(&self, p: *mut c_void, bytes: usize) -> Result<(), NcclError> {
        // SAFETY: the caller passes a range it mapped and keeps mapped until `unregister`.
        check("cuMemHostRegister_v2", unsafe {
            (self.mem_host_register)(p, bytes, 0)
        })
    }

    pub fn unregister(&self, p: *mut c_void) -> Result<(), NcclError> {
        // SAFETY: `p` is the start of a range registered by `register`.
        check("cuMemHostUnregister", unsafe {
            (self.mem_host_unregister)(p)
        })
    }

    /// Enqueues `kernel` on `stream` (a 1x1x1 grid of 1x1x1 blocks: the fake ignores the shape).
    pub fn launch(
        &self,
        kernels: &Kernels,
        stream: CUstream,
        kernel: &Kernel,
    ) -> Result<(), NcclError> {
        let (index, mut wide, mut narrow) = arguments(kernel);
        let mut params: Vec<*mut c_void> = match kernel {
            Kernel::Copy { .. } => vec![ptr(&mut wide[0]), ptr(&mut wide[1]), ptr(&mut wide[2])],
            Kernel::Set { .. } | Kernel::SpinUntil { .. } => {
                vec![ptr(&mut wide[0]), ptr(&mut narrow)]
            }
            Kernel::Sum { .. } => vec![ptr(&mut wide[0]), ptr(&mut wide[1]), ptr(&mut wide[2])],
        };
        // SAFETY: `params` holds one pointer per kernel parameter (in the order of the kernel table
        // of crates/fake-cuda/README.md), each to a live local of the parameter's type; the driver
        // copies the values before returning.
        let launched = unsafe {
            (self.launch_kernel)(
                kernels.functions[index],
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check("cuLaunchKernel", launched)
    }
}

fn ptr<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

/// A kernel's function index in [`NAMES`] and its u64 and u32 arguments.
fn arguments(kernel: &Kernel) -> (usize, [u64; 3], u32) {
    match *kernel {
        Kernel::Copy { dst, src, bytes } => (0, [dst, src, bytes], 0),
        Kernel::Set { flag, value } => (1, [flag, 0, 0], value),
        Kernel::SpinUntil { flag, value } => (2, [flag, 0, 0], value),
        Kernel::Sum {
            element,
            dst,
            src,
            count,
        } => {
            let index = match element {
                Element::U32 => 3,
                Element::F32 => 4,
            };
            (index, [dst, src, count], 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_names_every_kernel_this_library_launches() {
        let text = MODULE.to_str().unwrap();
        for name in NAMES {
            let name = name.to_str().unwrap();
            assert!(text.contains(&format!(".visible .entry {name}(")), "{name}");
        }
        let kernels = [
            Kernel::Copy {
                dst: 1,
                src: 2,
                bytes: 3,
            },
            Kernel::Set { flag: 4, value: 5 },
            Kernel::SpinUntil { flag: 6, value: 7 },
            Kernel::Sum {
                element: Element::U32,
                dst: 8,
                src: 9,
                count: 10,
            },
            Kernel::Sum {
                element: Element::F32,
                dst: 11,
                src: 12,
                count: 13,
            },
        ];
        let indices: Vec<usize> = kernels.iter().map(|k| arguments(k).0).collect();
        assert_eq!(indices, [0, 1, 2, 3, 4]);
        assert_eq!(arguments(&kernels[2]), (2, [6, 0, 0], 7));
        assert_eq!(arguments(&kernels[4]), (4, [11, 12, 13], 0));
    }
}
