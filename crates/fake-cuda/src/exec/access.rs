//! Memory access by queued work, checked when the work executes, under the driver-state lock
//! (so nothing unmaps the range between the check and the access). Every byte moves through
//! `process_vm_writev` on this process ([`os::copy_checked`]), so even a host range the
//! application unmapped behind the driver's back is an error, never a fault of the process.

use crate::memory::{Need, copy::check_host, touches_driver_memory, within};
use crate::state::Driver;
use crate::{multicast, os};

use super::Side;

/// Queued work touched memory it may not (the process is then poisoned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault;

/// Whether `device` may access `[addr, addr+len)` with `need`: inside one `cuMemAlloc`
/// allocation, one opened IPC mapping or one pinned host range (reachable from every device in
/// the fake), or contiguous VMM mappings whose access for `device` allows `need`.
pub(crate) fn reachable(d: &Driver, device: usize, addr: u64, len: u64, need: Need) -> bool {
    let m = &d.mem;
    if within(&m.legacy, |l| l.size, addr, len)
        || within(&m.ipc_open, |o| o.size, addr, len)
        || within(&m.host, |h| h.size, addr, len)
    {
        return true;
    }
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut cursor = addr;
    while cursor < end {
        let Some((&start, piece)) = m.pieces.range(..=cursor).next_back() else {
            return false;
        };
        if start + piece.size <= cursor {
            return false;
        }
        let flags = piece.access.get(device).copied().unwrap_or(0);
        let ok = match need {
            Need::Read => flags & cuda_abi::access_flags::PROT_READ != 0,
            Need::Write => flags == cuda_abi::access_flags::PROT_READWRITE,
        };
        if !ok {
            return false;
        }
        cursor = start + piece.size;
    }
    true
}

/// [`reachable`] as a result.
pub(crate) fn require(
    d: &Driver,
    device: usize,
    addr: u64,
    len: u64,
    need: Need,
) -> Result<(), Fault> {
    if reachable(d, device, addr, len, need) {
        Ok(())
    } else {
        Err(Fault)
    }
}

/// Checks one side of a copy.
fn side_ok(d: &Driver, device: usize, addr: u64, side: Side, len: u64, need: Need) -> bool {
    match side {
        Side::Device => reachable(d, device, addr, len, need),
        Side::Host if touches_driver_memory(d, addr, len) => reachable(d, device, addr, len, need),
        Side::Host => check_host(d, addr, len, need).is_ok(),
    }
}

/// An async copy of `len` bytes, at execution.
pub(crate) fn copy(
    d: &Driver,
    device: usize,
    (dst, dst_side): (u64, Side),
    (src, src_side): (u64, Side),
    len: u64,
) -> Result<(), Fault> {
    if len == 0 {
        return Ok(());
    }
    if !side_ok(d, device, src, src_side, len, Need::Read)
        || !side_ok(d, device, dst, dst_side, len, Need::Write)
    {
        return Err(Fault);
    }
    multicast::gather(d, src, len).map_err(|_| Fault)?;
    os::copy_checked(dst, src, len).map_err(|_| Fault)?;
    multicast::broadcast(d, dst, len).map_err(|_| Fault)
}

/// An async memset of `count` elements of `width` bytes (1 or 4), at execution.
pub(crate) fn memset(
    d: &Driver,
    device: usize,
    dst: u64,
    value: u32,
    width: u64,
    count: u64,
) -> Result<(), Fault> {
    let len = count.checked_mul(width).ok_or(Fault)?;
    if len == 0 {
        return Ok(());
    }
    require(d, device, dst, len, Need::Write)?;
    let bytes: Vec<u8> = if width == 4 {
        value.to_le_bytes().repeat(count as usize)
    } else {
        vec![value as u8; count as usize]
    };
    write(d, device, dst, &bytes)
}

/// Reads `len` bytes the device reaches.
pub(crate) fn read(d: &Driver, device: usize, addr: u64, len: u64) -> Result<Vec<u8>, Fault> {
    require(d, device, addr, len, Need::Read)?;
    multicast::gather(d, addr, len).map_err(|_| Fault)?;
    let mut out = vec![0u8; len as usize];
    os::copy_checked(out.as_mut_ptr() as u64, addr, len).map_err(|_| Fault)?;
    Ok(out)
}

/// Writes `bytes` where the device may write.
pub(crate) fn write(d: &Driver, device: usize, addr: u64, bytes: &[u8]) -> Result<(), Fault> {
    let len = bytes.len() as u64;
    require(d, device, addr, len, Need::Write)?;
    os::copy_checked(addr, bytes.as_ptr() as u64, len).map_err(|_| Fault)?;
    multicast::broadcast(d, addr, len).map_err(|_| Fault)
}

pub(crate) fn read_u32(d: &Driver, device: usize, addr: u64) -> Result<u32, Fault> {
    let b = read(d, device, addr, 4)?;
    let raw: [u8; 4] = b.as_slice().try_into().map_err(|_| Fault)?;
    Ok(u32::from_le_bytes(raw))
}

/// Reads `count` u32 elements.
pub(crate) fn read_words(
    d: &Driver,
    device: usize,
    addr: u64,
    count: u64,
) -> Result<Vec<u32>, Fault> {
    let len = count.checked_mul(4).ok_or(Fault)?;
    require(d, device, addr, len, Need::Read)?;
    let bytes = read(d, device, addr, len)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Writes u32 elements.
pub(crate) fn write_words(
    d: &Driver,
    device: usize,
    addr: u64,
    words: &[u32],
) -> Result<(), Fault> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    write(d, device, addr, &bytes)
}
