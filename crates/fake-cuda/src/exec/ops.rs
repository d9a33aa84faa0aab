//! Stream entry points that queue work or wait for it: stream memory operations
//! (`cuStreamWaitValue32_v2`, `cuStreamWriteValue32_v2`), `cuLaunchHostFunc`,
//! `cuStreamQuery`, `cuStreamSynchronize`, `cuCtxSynchronize`.

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUdeviceptr, CUhostFn, CUresult, CUstream, stream_wait_value, stream_write_value};

use super::{Work, ctx_busy, enqueue, stream_busy, wait_idle};
use crate::Res;
use crate::device::current;
use crate::state;

/// `cuStreamWaitValue32_v2`: later work on `stream` waits until the 32-bit value at `addr`
/// meets the condition (GEQ, EQ, AND, NOR, as the driver defines them; FLUSH accepted).
pub(crate) fn wait_value_32(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) -> Res {
    if flags & !stream_wait_value::FLUSH > stream_wait_value::NOR || !addr.is_multiple_of(4) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| enqueue(d, stream, Work::WaitValue { addr, value, flags }))
}

/// `cuStreamWriteValue32_v2`: the stream writes `value` at `addr` in order.
pub(crate) fn write_value_32(
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> Res {
    if flags & !stream_write_value::NO_MEMORY_BARRIER != 0 || !addr.is_multiple_of(4) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| enqueue(d, stream, Work::WriteValue { addr, value }))
}

/// `cuLaunchHostFunc`: the stream's worker calls `f(user_data)` in order, without the driver
/// lock (the function may block; it must not call the driver, as CUDA requires).
pub(crate) fn launch_host_func(stream: CUstream, f: CUhostFn, user_data: *mut c_void) -> Res {
    let f = f.ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let data = user_data as usize;
    state::with(|d| enqueue(d, stream, Work::Host { f, data }))
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while the stream has work queued or running.
pub(crate) fn stream_query(stream: CUstream) -> Res {
    state::with(|d| {
        if stream_busy(d, stream)? {
            Err(CUresult::ERROR_NOT_READY)
        } else {
            Ok(())
        }
    })
}

pub(crate) fn stream_synchronize(stream: CUstream) -> Res {
    wait_idle(None, |d| stream_busy(d, stream))
}

/// `cuCtxSynchronize`: every queue of the current context, destroyed streams still draining
/// included.
pub(crate) fn ctx_synchronize() -> Res {
    wait_idle(None, |d| current(d).map(|(ctx, _)| ctx_busy(d, ctx)))
}
