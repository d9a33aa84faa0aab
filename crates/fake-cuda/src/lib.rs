#![doc = include_str!("../README.md")]
//!
//! Modules: [`exports`] (every exported symbol), `entry` (the common prologue: fault injection,
//! initialisation check, checkpoint gate), `init`, `config`, `device` (devices, contexts,
//! streams), `exec` (stream queues and their workers, events, modules and kernels, the sticky
//! fault), `memory` (VMM, `cuMemAlloc` and legacy IPC, copies, pinned host memory),
//! `multicast`, `checkpoint` (gate, agent, client, wire format), `accounting`, `procaddress`,
//! `errors`, `fault`, `os` (the Linux calls underneath).

#![allow(unsafe_code)]

mod accounting;
mod checkpoint;
mod config;
mod device;
mod entry;
mod errors;
mod exec;
pub mod exports;
mod fault;
mod init;
mod memory;
mod multicast;
mod os;
mod procaddress;
mod state;

#[cfg(test)]
mod tests;

use cuda_abi::CUresult;

/// The driver API version this fake reports (`cuDriverGetVersion`): CUDA 13.0, the r580 branch.
pub const DRIVER_VERSION: i32 = 13000;

/// The result of the fake's internal operations: `Err` carries the driver's error code.
pub(crate) type Res<T = ()> = Result<T, CUresult>;

/// Writes `value` through an out-pointer from the application.
///
/// # Safety
/// `p` must be null or valid for a write of `T` (alignment is not required).
pub(crate) unsafe fn write_out<T>(p: *mut T, value: T) -> Res {
    if p.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller vouches it is writable.
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// Reads a `T` the application passed by pointer.
///
/// # Safety
/// `p` must be null or valid for a read of `T` (alignment is not required).
pub(crate) unsafe fn read_in<T: Copy>(p: *const T) -> Res<T> {
    if p.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller vouches it is readable.
    Ok(unsafe { p.read_unaligned() })
}
