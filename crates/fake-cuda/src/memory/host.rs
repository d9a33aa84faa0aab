//! Pinned host memory: `cuMemHostAlloc` gives ordinary private anonymous memory (so it stays
//! ordinary memory across checkpoint, as CRIU needs), `cuMemHostRegister` only records the range.

use std::ffi::{c_uint, c_void};

use cuda_abi::CUresult;

use crate::device::current;
use crate::os::{self, HostBuf};
use crate::state;
use crate::{Res, write_out};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostKind {
    Allocated { mapped: u64 },
    Registered,
}

#[derive(Debug)]
pub(crate) struct HostRange {
    pub size: u64,
    pub kind: HostKind,
}

/// CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED.
const HOST_ALLOC_FLAGS: c_uint = 0x7;
/// CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY.
const HOST_REGISTER_FLAGS: c_uint = 0xf;

pub(crate) unsafe fn host_alloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) -> Res {
    if pp.is_null() || bytes == 0 || flags & !HOST_ALLOC_FLAGS != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let addr = state::with(|d| {
        current(d)?;
        let buf = HostBuf::new(bytes as u64).map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        let (addr, mapped) = buf.into_raw();
        d.mem.host.insert(
            addr,
            HostRange {
                size: bytes as u64,
                kind: HostKind::Allocated { mapped },
            },
        );
        Ok(addr)
    })?;
    // SAFETY: checked non-null; the caller passes a writable pointer slot.
    unsafe { write_out(pp, addr as usize as *mut c_void) }
}

pub(crate) fn free_host(p: *mut c_void) -> Res {
    let addr = p as u64;
    state::with(|d| {
        current(d)?;
        match d.mem.host.get(&addr).map(|h| h.kind) {
            Some(HostKind::Allocated { mapped }) => {
                d.mem.host.remove(&addr);
                drop(HostBuf::from_raw(addr, mapped));
                Ok(())
            }
            _ => Err(CUresult::ERROR_INVALID_VALUE),
        }
    })
}

pub(crate) fn host_register(p: *mut c_void, bytes: usize, flags: c_uint) -> Res {
    let (addr, size) = (p as u64, bytes as u64);
    if addr == 0 || size == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let end = addr
        .checked_add(size)
        .ok_or(CUresult::ERROR_INVALID_VALUE)?;
    state::with(|d| {
        current(d)?;
        let overlaps = d.mem.host.range(..end).any(|(&b, h)| b + h.size > addr);
        if overlaps {
            return Err(CUresult::ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        if !os::is_mapped(addr, size) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        d.mem.host.insert(
            addr,
            HostRange {
                size,
                kind: HostKind::Registered,
            },
        );
        Ok(())
    })
}

pub(crate) fn host_unregister(p: *mut c_void) -> Res {
    let addr = p as u64;
    state::with(|d| {
        current(d)?;
        match d.mem.host.get(&addr).map(|h| h.kind) {
            Some(HostKind::Registered) => {
                d.mem.host.remove(&addr);
                Ok(())
            }
            _ => Err(CUresult::ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    })
}
