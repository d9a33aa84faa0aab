//! `cuGetErrorName`, `cuGetErrorString`, `cuDriverGetVersion`.

use std::ffi::{c_char, c_int};

use cuda_abi::CUresult;

use crate::{DRIVER_VERSION, Res, write_out};

/// `cuGetErrorName`/`cuGetErrorString`: an unknown code is `CUDA_ERROR_INVALID_VALUE` with
/// `*out = NULL`, as on the real driver.
pub(crate) unsafe fn error_text(error: CUresult, out: *mut *const c_char, name: bool) -> Res {
    if out.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let text = if name {
        error.name_cstr()
    } else {
        error.description_cstr()
    };
    let ptr = text.map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: checked non-null; the caller passes a writable `const char *` slot.
    unsafe { write_out(out, ptr) }?;
    if text.is_some() {
        Ok(())
    } else {
        Err(CUresult::ERROR_INVALID_VALUE)
    }
}

pub(crate) unsafe fn driver_get_version(version: *mut c_int) -> Res {
    // SAFETY: the caller passes a writable int (null is refused by write_out).
    unsafe { write_out(version, DRIVER_VERSION) }
}
