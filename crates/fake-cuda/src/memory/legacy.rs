//! `cuMemAlloc`/`cuMemFree`/`cuMemGetAddressRange` and legacy IPC.
//!
//! Each `cuMemAlloc` allocation is its own memfd (size rounded up to 2 MiB) mapped read-write,
//! so another process can open it: a `CUipcMemHandle` names the creator's pid, the descriptor
//! number of the memfd in the creator, its inode, the size and the allocation id, and the
//! importer opens `/proc/<pid>/fd/<fd>` (same uid, as ptrace-read access requires) and checks the
//! inode and the memfd's trailer. Handle layout (64 bytes, little endian):
//! `magic[8] "FAKEIPC1" | pid u32 | fd u32 | inode u64 | offset u64 | size u64 | start_token u64 |
//! alloc_id u64 | device u32 | zero u32`.

use std::ffi::{c_char, c_uint, c_void};
use std::os::fd::AsRawFd;

use cuda_abi::{CUdeviceptr, CUipcMemHandle, CUresult, CUstream, ipc_flags};

use super::{Backing, BackingKind, GRANULARITY, Trailer, vmm};
use crate::device::{check_stream, current};
use crate::state::{self, Driver};
use crate::{Res, os, write_out};

/// A `cuMemAlloc` allocation.
#[derive(Debug)]
pub(crate) struct Legacy {
    /// Bytes the application asked for (what `cuMemGetAddressRange` reports and copies may reach).
    pub size: u64,
    /// Bytes reserved and mapped (rounded up to the granularity).
    pub mapped: u64,
    pub backing: Backing,
    pub device: usize,
    pub ctx: u64,
}

/// A mapping opened with `cuIpcOpenMemHandle`.
#[derive(Debug)]
pub(crate) struct IpcOpen {
    pub size: u64,
    pub mapped: u64,
    pub backing: Backing,
    pub creator: (u32, u64, u64),
    pub refs: u32,
}

pub(crate) unsafe fn mem_alloc(dptr: *mut CUdeviceptr, bytes: usize) -> Res {
    if dptr.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let size = bytes as u64;
    let addr = state::with(|d| {
        let (ctx, device) = current(d)?;
        if size == 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let mapped = size
            .checked_next_multiple_of(GRANULARITY)
            .ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
        vmm::check_free(d, device, mapped)?;
        let alloc_id = d.next_id();
        let trailer = Trailer {
            kind: BackingKind::Legacy,
            size: mapped,
            device: device as u32,
            handle_types: 0,
            creator_pid: d.pid as u32,
            alloc_id,
            creator_start: d.start_token,
        };
        let backing = Backing::create(trailer).map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        let addr = map_rw(&backing, mapped)?;
        d.mem.legacy.insert(
            addr,
            Legacy {
                size,
                mapped,
                backing,
                device,
                ctx,
            },
        );
        d.usage.charge(device, mapped);
        Ok(addr)
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUdeviceptr.
    unsafe { write_out(dptr, addr) }
}

/// `cuMemAllocPitch`: rows of `width` bytes padded to the pitch (a multiple of 512 bytes here, as
/// the texture alignment of current GPUs), one linear allocation of pitch x height. The element
/// size must be 4, 8 or 16 bytes, as the driver requires.
pub(crate) unsafe fn mem_alloc_pitch(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> Res {
    if pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&element_size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let padded = width
        .checked_next_multiple_of(PITCH_ALIGNMENT)
        .ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
    let bytes = padded
        .checked_mul(height)
        .ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
    // SAFETY: the caller's out-pointer, passed on.
    unsafe { mem_alloc(dptr, bytes) }?;
    // SAFETY: checked non-null; the caller passes a writable size_t.
    unsafe { write_out(pitch, padded) }
}

/// Row alignment of pitched allocations.
const PITCH_ALIGNMENT: usize = 512;

/// `cuMemAllocManaged`: device memory in this model (no migration to the host is modelled), with
/// the driver's flag check (exactly one of GLOBAL = 1 and HOST = 2).
pub(crate) unsafe fn mem_alloc_managed(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> Res {
    if flags != 1 && flags != 2 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's out-pointer, passed on.
    unsafe { mem_alloc(dptr, bytes) }
}

/// `cuMemAllocAsync`: the model runs every stream synchronously, so the memory is made now, from
/// the device's default pool (the same memory as `cuMemAlloc`), for a valid stream.
pub(crate) unsafe fn mem_alloc_async(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Res {
    state::with(|d| check_stream(d, stream))?;
    // SAFETY: the caller's out-pointer, passed on.
    unsafe { mem_alloc(dptr, bytes) }
}

/// `cuMemFreeAsync`: freed once the work queued on the stream before it is complete, so the
/// free keeps stream order (the call waits for that work instead of queueing the free: the
/// fake has no stream-ordered allocator, and usage then drops when the call returns).
pub(crate) fn mem_free_async(dptr: CUdeviceptr, stream: CUstream) -> Res {
    state::with(|d| check_stream(d, stream))?;
    crate::exec::wait_idle(None, |d| crate::exec::stream_busy(d, stream))?;
    mem_free(dptr)
}

/// Reserves a fresh range and maps the backing read-write into it.
fn map_rw(backing: &Backing, mapped: u64) -> Res<u64> {
    let addr = os::reserve(mapped, GRANULARITY, 0).map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
    let file = backing.file()?;
    if os::map_shared(addr, mapped, file, 0, libc::PROT_READ | libc::PROT_WRITE).is_err() {
        let _ = os::unmap(addr, mapped);
        return Err(CUresult::ERROR_OUT_OF_MEMORY);
    }
    Ok(addr)
}

fn free_at(d: &mut Driver, base: u64) {
    if let Some(l) = d.mem.legacy.remove(&base) {
        let _ = os::unmap(base, l.mapped);
        d.usage.uncharge(l.device, l.mapped);
    }
}

pub(crate) fn mem_free(dptr: CUdeviceptr) -> Res {
    state::with(|d| {
        if !d.mem.legacy.contains_key(&dptr) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        free_at(d, dptr);
        Ok(())
    })
}

/// Frees the `cuMemAlloc` memory of a context that is destroyed (or a primary context reset).
pub(crate) fn free_context(d: &mut Driver, ctx: u64) {
    let bases: Vec<u64> = d
        .mem
        .legacy
        .iter()
        .filter(|(_, l)| l.ctx == ctx)
        .map(|(&b, _)| b)
        .collect();
    for base in bases {
        free_at(d, base);
    }
}

/// The allocation containing `dptr`: (base, size) of a `cuMemAlloc` allocation, an opened IPC
/// mapping, or a whole `cuMemMap` mapping.
fn range_of(d: &Driver, dptr: u64) -> Option<(u64, u64)> {
    let hit = |base: u64, size: u64| (dptr >= base && dptr < base + size).then_some((base, size));
    if let Some(r) = d
        .mem
        .legacy
        .range(..=dptr)
        .next_back()
        .and_then(|(&b, l)| hit(b, l.size))
    {
        return Some(r);
    }
    if let Some(r) = d
        .mem
        .ipc_open
        .range(..=dptr)
        .next_back()
        .and_then(|(&b, o)| hit(b, o.size))
    {
        return Some(r);
    }
    let (&s, p) = d.mem.pieces.range(..=dptr).next_back()?;
    hit(s, p.size)?;
    let id = p.map_id;
    let mut pieces = d.mem.pieces.iter().filter(|(_, p)| p.map_id == id);
    let (&first, _) = pieces.next()?;
    let end = d
        .mem
        .pieces
        .iter()
        .filter(|(_, p)| p.map_id == id)
        .map(|(&s, p)| s + p.size)
        .max()?;
    Some((first, end - first))
}

pub(crate) unsafe fn get_address_range(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> Res {
    let (b, s) = state::with(|d| {
        current(d)?;
        range_of(d, dptr).ok_or(CUresult::ERROR_NOT_FOUND)
    })?;
    if !base.is_null() {
        // SAFETY: non-null; the caller passes a writable CUdeviceptr.
        unsafe { write_out(base, b) }?;
    }
    if !size.is_null() {
        // SAFETY: non-null; the caller passes a writable size_t.
        unsafe { write_out(size, s as usize) }?;
    }
    Ok(())
}

/// What the fake driver knows of a device pointer for `cuPointerGetAttribute(s)`.
struct PointerFacts {
    range: (u64, u64),
    device: i32,
    /// `cuMemAlloc` memory (legacy-IPC capable), not VMM mappings or opened IPC handles.
    legacy: bool,
}

/// What `ptr` is, with `device` the current context's (the device of an opened IPC mapping).
fn pointer_facts(d: &Driver, ptr: u64, device: usize) -> Option<PointerFacts> {
    let range = range_of(d, ptr)?;
    let legacy = d.mem.legacy.get(&range.0);
    let vmm_device = || {
        let (_, piece) = d.mem.pieces.range(..=ptr).next_back()?;
        Some(d.mem.objects.get(&piece.handle)?.device)
    };
    let device = match legacy {
        Some(l) => l.device,
        None if d.mem.ipc_open.contains_key(&range.0) => device,
        None => vmm_device().unwrap_or(device),
    };
    Some(PointerFacts {
        range,
        device: i32::try_from(device).unwrap_or(i32::MAX),
        legacy: legacy.is_some(),
    })
}

/// One attribute's value, written at `data` with the width the real driver uses for it
/// (`bool` as one byte: the fake's own choice, since the driver's width is not documented).
///
/// # Safety
/// `data` is null or points at writable memory of the attribute's width.
unsafe fn write_attribute(data: *mut c_void, attribute: u32, facts: &PointerFacts) -> Res {
    use cuda_abi::pointer_attribute as a;
    let bytes: Vec<u8> = match attribute {
        a::MEMORY_TYPE => cuda_abi::memory_type::DEVICE.to_ne_bytes().to_vec(),
        a::DEVICE_ORDINAL => facts.device.to_ne_bytes().to_vec(),
        a::IS_LEGACY_CUDA_IPC_CAPABLE => vec![u8::from(facts.legacy)],
        a::RANGE_START_ADDR => facts.range.0.to_ne_bytes().to_vec(),
        a::RANGE_SIZE => (facts.range.1 as usize).to_ne_bytes().to_vec(),
        a::MAPPED => vec![1],
        // Not modelled: the fake says so rather than answer wrongly.
        _ => return Err(CUresult::ERROR_NOT_SUPPORTED),
    };
    if data.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller's memory holds the attribute's width, `bytes.len()`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data.cast::<u8>(), bytes.len()) };
    Ok(())
}

/// `cuPointerGetAttribute` for the attributes the fake models: memory type, device, legacy-IPC
/// capability, range and mapped-ness of device memory it made (cuMemAlloc memory, VMM mappings,
/// opened IPC handles); INVALID_VALUE for a pointer it did not make.
pub(crate) unsafe fn pointer_attribute(data: *mut c_void, attribute: u32, ptr: CUdeviceptr) -> Res {
    let facts = state::with(|d| {
        let (_, device) = current(d)?;
        pointer_facts(d, ptr, device).ok_or(CUresult::ERROR_INVALID_VALUE)
    })?;
    // SAFETY: the caller's out-pointer for this attribute.
    unsafe { write_attribute(data, attribute, &facts) }
}

/// `cuPointerGetAttributes`: each attribute into its slot of `data` (a null slot is skipped, as
/// the driver does).
pub(crate) unsafe fn pointer_attributes(
    count: u32,
    attributes: *mut u32,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> Res {
    if attributes.is_null() || data.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let facts = state::with(|d| {
        let (_, device) = current(d)?;
        pointer_facts(d, ptr, device).ok_or(CUresult::ERROR_INVALID_VALUE)
    })?;
    let count = count as usize;
    // SAFETY: the caller's arrays hold `count` entries.
    let attributes = unsafe { std::slice::from_raw_parts(attributes, count) };
    // SAFETY: as above.
    let slots = unsafe { std::slice::from_raw_parts(data, count) };
    for (attribute, slot) in attributes.iter().zip(slots) {
        if !slot.is_null() {
            // SAFETY: the caller's out-pointer for this attribute.
            unsafe { write_attribute(*slot, *attribute, &facts) }?;
        }
    }
    Ok(())
}

const IPC_MAGIC: [u8; 8] = *b"FAKEIPC1";

/// What a `CUipcMemHandle` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IpcName {
    pub pid: u32,
    pub fd: u32,
    pub ino: u64,
    pub offset: u64,
    pub size: u64,
    pub start: u64,
    pub alloc_id: u64,
    pub device: u32,
}

impl IpcName {
    pub(crate) fn encode(&self) -> CUipcMemHandle {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&IPC_MAGIC);
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.ino.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        b[40..48].copy_from_slice(&self.start.to_le_bytes());
        b[48..56].copy_from_slice(&self.alloc_id.to_le_bytes());
        b[56..60].copy_from_slice(&self.device.to_le_bytes());
        CUipcMemHandle {
            reserved: b.map(|x| x as c_char),
        }
    }

    pub(crate) fn decode(h: &CUipcMemHandle) -> Option<IpcName> {
        let b = h.reserved.map(|x| x as u8);
        let u32_at = |i: usize| b.get(i..i + 4)?.try_into().ok().map(u32::from_le_bytes);
        let u64_at = |i: usize| b.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes);
        if b.get(0..8)? != IPC_MAGIC || u32_at(60)? != 0 {
            return None;
        }
        Some(IpcName {
            pid: u32_at(8)?,
            fd: u32_at(12)?,
            ino: u64_at(16)?,
            offset: u64_at(24)?,
            size: u64_at(32)?,
            start: u64_at(40)?,
            alloc_id: u64_at(48)?,
            device: u32_at(56)?,
        })
    }
}

pub(crate) unsafe fn ipc_get_mem_handle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> Res {
    if handle.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let name = state::with(|d| {
        current(d)?;
        let (&base, l) = d
            .mem
            .legacy
            .range(..=dptr)
            .next_back()
            .filter(|(b, l)| dptr < **b + l.size)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let _ = base;
        Ok(IpcName {
            pid: d.pid as u32,
            fd: l.backing.file()?.as_raw_fd() as u32,
            ino: l.backing.ino,
            offset: 0,
            size: l.size,
            start: d.start_token,
            alloc_id: l.backing.trailer.alloc_id,
            device: l.device as u32,
        })
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUipcMemHandle.
    unsafe { write_out(handle, name.encode()) }
}

pub(crate) unsafe fn ipc_open_mem_handle(
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> Res {
    if dptr.is_null() || flags & !ipc_flags::LAZY_ENABLE_PEER_ACCESS != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let addr = state::with(|d| {
        current(d)?;
        let name = IpcName::decode(&handle).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if name.pid == d.pid as u32 {
            // The real driver refuses to open a handle in the process that created it.
            return Err(CUresult::ERROR_INVALID_CONTEXT);
        }
        let key = (name.pid, name.start, name.alloc_id);
        if let Some((&base, open)) = d.mem.ipc_open.iter_mut().find(|(_, o)| o.creator == key) {
            open.refs += 1;
            return Ok(base);
        }
        if os::start_token(name.pid as i32) != Some(name.start) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let file =
            os::open_peer_fd(name.pid, name.fd).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        let backing = Backing::adopt(file)?;
        let t = backing.trailer;
        if backing.ino != name.ino
            || t.kind != BackingKind::Legacy
            || t.alloc_id != name.alloc_id
            || name.offset != 0
            || name.size > t.size
        {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let mapped = t.size;
        let base = map_rw(&backing, mapped)?;
        d.mem.ipc_open.insert(
            base,
            IpcOpen {
                size: name.size,
                mapped,
                backing,
                creator: key,
                refs: 1,
            },
        );
        Ok(base)
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUdeviceptr.
    unsafe { write_out(dptr, addr) }
}

pub(crate) fn ipc_close_mem_handle(dptr: CUdeviceptr) -> Res {
    state::with(|d| {
        let open = d
            .mem
            .ipc_open
            .get_mut(&dptr)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        open.refs -= 1;
        if open.refs == 0
            && let Some(o) = d.mem.ipc_open.remove(&dptr)
        {
            let _ = os::unmap(dptr, o.mapped);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_names_round_trip_and_refuse_garbage() {
        let name = IpcName {
            pid: 1234,
            fd: 9,
            ino: 777,
            offset: 0,
            size: 1000,
            start: 42,
            alloc_id: 3,
            device: 1,
        };
        let h = name.encode();
        assert_eq!(IpcName::decode(&h), Some(name));
        assert_eq!(IpcName::decode(&CUipcMemHandle::default()), None);
        let mut bad = h;
        bad.reserved[61] = 1;
        assert_eq!(IpcName::decode(&bad), None);
    }
}
