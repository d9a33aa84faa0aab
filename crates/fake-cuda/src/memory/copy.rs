//! Copies and memsets. The synchronous calls wait for the current context's queued work first
//! (stronger than the legacy stream's rule), then check every device-side range against the
//! bookkeeping (unmapped, inaccessible or read-only-for-a-write ranges are
//! `CUDA_ERROR_INVALID_VALUE`) and copy through `process_vm_writev` on this process, so a bad
//! host pointer is an error code too, never a fault. The `Async` calls check their arguments
//! and queue the work on the stream; ranges are checked when it executes (see `exec`: a bad
//! range there is r580's sticky `CUDA_ERROR_ILLEGAL_ADDRESS`). A copy from a multicast mapping
//! reads one bound member, a copy or memset to one reaches every bound member (see
//! `multicast`).

use std::ffi::{c_uint, c_void};

use cuda_abi::{CUdeviceptr, CUresult, CUstream};

use super::{Need, check_device, touches_driver_memory};
use crate::exec::{self, Side, Work};
use crate::state::{self, Driver};
use crate::{Res, multicast, os};

/// A host-side argument may be any memory, but where it is driver memory the driver's rules
/// apply to it too. A range that reaches into page-locked host memory (`cuMemHostAlloc`,
/// `cuMemHostRegister`) must lie inside one such range: r580 answers a copy whose host range
/// spans two registrations, or runs off the end of one, with `CUDA_ERROR_INVALID_VALUE` (seen
/// on the H200 when a carrier unit crossed from one registered piece into the next).
pub(crate) fn check_host(d: &Driver, addr: u64, len: u64, need: Need) -> Res {
    if touches_driver_memory(d, addr, len) {
        return check_device(d, addr, len, need);
    }
    let end = addr.checked_add(len).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let mut locked = d.mem.host.range(..end).filter(|(b, h)| **b + h.size > addr);
    match locked.next() {
        None => Ok(()),
        Some((&b, h)) if b <= addr && end <= b + h.size => Ok(()),
        Some(_) => Err(CUresult::ERROR_INVALID_VALUE),
    }
}

fn copy(dst: u64, src: u64, len: u64) -> Res {
    os::copy_checked(dst, src, len).map_err(|_| CUresult::ERROR_INVALID_VALUE)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    HtoD,
    DtoH,
    DtoD,
    /// Either side host or device memory (`cuMemcpyAsync`).
    Any,
}

/// Queues `work` on `stream` (`Some`), or runs `now` once the context is idle (`None`).
fn sync_or_queue(stream: Option<CUstream>, work: Work, now: impl FnMut(&mut Driver) -> Res) -> Res {
    match stream {
        Some(s) => state::with(|d| exec::enqueue(d, s, work)),
        None => exec::after_ctx_idle(now),
    }
}

/// One copy; `stream` is `None` for the synchronous calls.
pub(crate) fn memcpy(dir: Dir, dst: u64, src: u64, len: usize, stream: Option<CUstream>) -> Res {
    let len = len as u64;
    let (dst_side, src_side) = match dir {
        Dir::HtoD => (Side::Device, Side::Host),
        Dir::DtoH => (Side::Host, Side::Device),
        Dir::DtoD => (Side::Device, Side::Device),
        Dir::Any => (Side::Host, Side::Host),
    };
    let work = Work::Copy {
        dst,
        dst_side,
        src,
        src_side,
        len,
    };
    sync_or_queue(stream, work, |d| {
        if len == 0 {
            return Ok(());
        }
        match dir {
            Dir::HtoD => {
                check_device(d, dst, len, Need::Write)?;
                check_host(d, src, len, Need::Read)?;
            }
            Dir::DtoH => {
                check_device(d, src, len, Need::Read)?;
                check_host(d, dst, len, Need::Write)?;
            }
            Dir::DtoD => {
                check_device(d, src, len, Need::Read)?;
                check_device(d, dst, len, Need::Write)?;
            }
            Dir::Any => {
                check_host(d, src, len, Need::Read)?;
                check_host(d, dst, len, Need::Write)?;
            }
        }
        // Reads through a multicast mapping see one member; writes reach every member.
        multicast::gather(d, src, len)?;
        copy(dst, src, len)?;
        multicast::broadcast(d, dst, len)
    })
}

pub(crate) fn htod(dst: CUdeviceptr, src: *const c_void, len: usize, s: Option<CUstream>) -> Res {
    memcpy(Dir::HtoD, dst, src as u64, len, s)
}

pub(crate) fn dtoh(dst: *mut c_void, src: CUdeviceptr, len: usize, s: Option<CUstream>) -> Res {
    memcpy(Dir::DtoH, dst as u64, src, len, s)
}

pub(crate) fn dtod(dst: CUdeviceptr, src: CUdeviceptr, len: usize, s: Option<CUstream>) -> Res {
    memcpy(Dir::DtoD, dst, src, len, s)
}

/// `cuMemcpyAsync`: unified addressing, each side host or device memory.
pub(crate) fn any_async(dst: CUdeviceptr, src: CUdeviceptr, len: usize, s: CUstream) -> Res {
    memcpy(Dir::Any, dst, src, len, Some(s))
}

pub(crate) fn memset_d8(
    dst: CUdeviceptr,
    value: u8,
    count: usize,
    stream: Option<CUstream>,
) -> Res {
    let work = Work::Memset {
        dst,
        value: u32::from(value),
        width: 1,
        count: count as u64,
    };
    sync_or_queue(stream, work, |d| {
        if count == 0 {
            return Ok(());
        }
        check_device(d, dst, count as u64, Need::Write)?;
        // SAFETY: the whole range is writable device memory this driver mapped (checked above,
        // under the state lock, so nothing unmaps it meanwhile).
        unsafe { std::ptr::write_bytes(dst as usize as *mut u8, value, count) };
        multicast::broadcast(d, dst, count as u64)
    })
}

pub(crate) fn memset_d32(
    dst: CUdeviceptr,
    value: c_uint,
    count: usize,
    stream: Option<CUstream>,
) -> Res {
    if !dst.is_multiple_of(4) {
        return state::with(|d| {
            match stream {
                Some(s) => crate::device::check_stream(d, s)?,
                None => {
                    crate::device::current(d)?;
                }
            }
            Err(CUresult::ERROR_INVALID_VALUE)
        });
    }
    let work = Work::Memset {
        dst,
        value,
        width: 4,
        count: count as u64,
    };
    sync_or_queue(stream, work, |d| {
        if count == 0 {
            return Ok(());
        }
        let bytes = (count as u64)
            .checked_mul(4)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        check_device(d, dst, bytes, Need::Write)?;
        // SAFETY: the whole range is aligned, writable device memory this driver mapped
        // (checked above, under the state lock).
        let words = unsafe { std::slice::from_raw_parts_mut(dst as usize as *mut u32, count) };
        words.fill(value);
        multicast::broadcast(d, dst, bytes)
    })
}
