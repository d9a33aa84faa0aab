//! Modules and kernel launches. `cuModuleLoadData` takes PTX text and keeps the names of its
//! `.entry` functions (no JIT: the fake runs its built-in kernels, this crate's README, "Modules
//! and kernels"); `cuModuleGetFunction` hands out a function for a name the module has and the fake
//! implements; `cuLaunchKernel`/`cuLaunchKernelEx` copy the arguments and queue the kernel on the
//! stream.

use std::ffi::{CStr, c_char, c_uint, c_void};

use cuda_abi::{CUfunction, CUlaunchConfig, CUmodule, CUresult, CUstream};

use super::kernel::{Builtin, Kernel};
use super::{Work, enqueue};
use crate::device::current;
use crate::state::{self, Driver};
use crate::{Res, read_in, write_out};

/// Base of module handle values (opaque to the application, never dereferenced).
const MODULE_BASE: u64 = 0x00a0_d000_0000;
/// Base of function handle values.
const FUNCTION_BASE: u64 = 0x00f0_0000_0000;

/// A loaded module: its context and the `.entry` names of its image.
#[derive(Debug)]
pub(crate) struct Module {
    pub ctx: u64,
    names: Vec<String>,
}

/// A function handed out by `cuModuleGetFunction`.
#[derive(Debug)]
pub(crate) struct Function {
    pub module: u64,
    which: Builtin,
}

/// The names of the `.entry` functions in PTX text (`.entry NAME(` or `.visible .entry NAME (`).
pub(crate) fn entry_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at + ".entry".len()..];
        rest = after;
        // ".entry" must be a word of its own, followed by blanks and the name.
        if !after.starts_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let after = after.trim_start();
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '.'))
            .unwrap_or(after.len());
        let (name, tail) = after.split_at(end);
        if !name.is_empty() && tail.trim_start().starts_with('(') {
            names.push(name.to_owned());
        }
    }
    names
}

fn handle_id(value: u64, base: u64) -> Option<u64> {
    (value > base && (value - base).is_multiple_of(0x10)).then(|| (value - base) / 0x10)
}

/// `cuModuleLoadData`: `image` is NUL-terminated PTX text. An ELF image (a cubin, which only a
/// GPU can run) is `CUDA_ERROR_INVALID_IMAGE`.
pub(crate) unsafe fn load_data(module: *mut CUmodule, image: *const c_void) -> Res {
    if module.is_null() || image.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated image (null refused above).
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_bytes();
    if text.starts_with(b"\x7fELF") {
        return Err(CUresult::ERROR_INVALID_IMAGE);
    }
    let names = entry_names(&String::from_utf8_lossy(text));
    let id = state::with(|d| {
        let (ctx, _) = current(d)?;
        let id = d.next_id();
        d.exec.modules.insert(id, Module { ctx, names });
        Ok(id)
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUmodule.
    unsafe { write_out(module, (MODULE_BASE + id * 0x10) as usize as CUmodule) }
}

/// `cuModuleGetFunction`: `CUDA_ERROR_NOT_FOUND` for a name the module lacks or the fake does
/// not implement; the same handle for the same name again.
pub(crate) unsafe fn get_function(
    f: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> Res {
    if f.is_null() || name.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated name (null refused above).
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    let id = state::with(|d| {
        current(d)?;
        let module = handle_id(module as usize as u64, MODULE_BASE)
            .filter(|m| d.exec.modules.contains_key(m))
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        let has = d
            .exec
            .modules
            .get(&module)
            .is_some_and(|m| m.names.contains(&name));
        let which = Builtin::by_name(&name)
            .filter(|_| has)
            .ok_or(CUresult::ERROR_NOT_FOUND)?;
        let known = d
            .exec
            .functions
            .iter()
            .find(|(_, f)| f.module == module && f.which == which)
            .map(|(&id, _)| id);
        Ok(known.unwrap_or_else(|| {
            let id = d.next_id();
            d.exec.functions.insert(id, Function { module, which });
            id
        }))
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUfunction.
    unsafe { write_out(f, (FUNCTION_BASE + id * 0x10) as usize as CUfunction) }
}

/// `cuModuleUnload`: its functions go (kernels already queued keep their copy).
pub(crate) fn unload(module: CUmodule) -> Res {
    state::with(|d| {
        current(d)?;
        let id = handle_id(module as usize as u64, MODULE_BASE)
            .filter(|m| d.exec.modules.contains_key(m))
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        d.exec.modules.remove(&id);
        d.exec.functions.retain(|_, f| f.module != id);
        Ok(())
    })
}

fn function(d: &Driver, f: CUfunction) -> Res<Builtin> {
    handle_id(f as usize as u64, FUNCTION_BASE)
        .and_then(|id| d.exec.functions.get(&id))
        .map(|f| f.which)
        .ok_or(CUresult::ERROR_INVALID_HANDLE)
}

/// Grid and block dimensions: ignored by the fake, but each must be at least 1.
pub(crate) type Dims = [c_uint; 6];

/// Dynamic shared memory a block may have without opting in: the device's
/// `MAX_SHARED_MEMORY_PER_BLOCK` (the fake's kernels use none).
const MAX_SHARED_MEMORY: c_uint = 49152;

/// `cuLaunchKernel`: `extra` is not supported (`CUDA_ERROR_NOT_SUPPORTED`).
pub(crate) unsafe fn launch(
    f: CUfunction,
    dims: Dims,
    shared_mem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Res {
    if !extra.is_null() {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    if dims.contains(&0) || shared_mem > MAX_SHARED_MEMORY {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        current(d)?;
        let which = function(d, f)?;
        // SAFETY: the caller's kernelParams, one pointer per parameter (the driver contract).
        let kernel = unsafe { Kernel::launch(which, params) }?;
        enqueue(d, stream, Work::Kernel(kernel))
    })
}

/// `cuLaunchKernelEx`: the grid, block, shared memory and stream of `config` (attributes are
/// ignored).
pub(crate) unsafe fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Res {
    // SAFETY: the caller passes a readable CUlaunchConfig (null refused by read_in).
    let c = unsafe { read_in(config) }?;
    let dims = [
        c.gridDimX,
        c.gridDimY,
        c.gridDimZ,
        c.blockDimX,
        c.blockDimY,
        c.blockDimZ,
    ];
    // SAFETY: forwarded from the caller.
    unsafe { launch(f, dims, c.sharedMemBytes, c.hStream, params, extra) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_come_from_the_ptx_text() {
        let ptx = ".version 8.0\n.target sm_90\n.visible .entry cuinterpose_fill_u32(\n\
                   .param .u64 a)\n{ ret; }\n.entry  other_kernel (\n)\n.func not_an_entry(\n)\n\
                   // .entryless\n";
        assert_eq!(entry_names(ptx), ["cuinterpose_fill_u32", "other_kernel"]);
        assert!(entry_names("no kernels here").is_empty());
    }
}
