//! The VMM API: physical allocations (`cuMemCreate`), VA reservations, mappings, access, and
//! sharing through POSIX file descriptors and FABRIC handles.
//!
//! Error codes follow the real driver: bad arguments, stale or released handles, unaligned or
//! unreserved ranges, a mapping over a mapped range, an unmap of part of a mapping, and an export
//! of a type the allocation was not created with are `CUDA_ERROR_INVALID_VALUE`; Win32 handle
//! types (and FABRIC where disabled) are `CUDA_ERROR_NOT_SUPPORTED`; a location naming no device
//! is `CUDA_ERROR_INVALID_DEVICE`; no memory left is `CUDA_ERROR_OUT_OF_MEMORY`.
//!
//! Measured on r580 (2026-12-02) and reproduced here: `cuMemMap` of an unaligned size or
//! allocation offset, or of a range the allocation does not hold, is `CUDA_ERROR_NOT_SUPPORTED`;
//! `cuMemUnmap` of a reserved range with nothing mapped in it succeeds; `cuMemSetAccess` naming no
//! device is `CUDA_ERROR_INVALID_VALUE`; `cuMemGetAllocationGranularity` does not look at the
//! location id; a POSIX import of a descriptor that is not the driver's (negative, not open, any
//! other file) is `CUDA_ERROR_UNKNOWN`.

use std::ffi::{c_int, c_ulonglong, c_void};
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};

use cuda_abi::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemFabricHandle,
    CUmemGenericAllocationHandle, CUmemLocation, CUresult, access_flags, allocation_type,
    handle_type, location_type,
};

use super::{
    Backing, BackingKind, GRANULARITY, Object, Origin, Piece, Trailer, collect, new_handle, object,
};
use crate::state::{self, Driver};
use crate::{Res, accounting, os, read_in, write_out};

const KNOWN_HANDLE_TYPES: u32 = handle_type::POSIX_FILE_DESCRIPTOR
    | handle_type::WIN32
    | handle_type::WIN32_KMT
    | handle_type::FABRIC;
/// Bound on descriptors accepted by one `cuMemSetAccess`.
const MAX_ACCESS_DESCS: usize = 1024;

fn aligned(v: u64) -> bool {
    v.is_multiple_of(GRANULARITY)
}

/// Checks requested handle types (a bit set) against what this machine supports.
pub(crate) fn check_handle_types(d: &Driver, types: u32) -> Res {
    if types & !KNOWN_HANDLE_TYPES != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if types & (handle_type::WIN32 | handle_type::WIN32_KMT) != 0 {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    if types & handle_type::FABRIC != 0 && !d.config.fabric {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// Validates allocation properties but the location id.
fn check_prop_kinds(prop: &CUmemAllocationProp) -> Res {
    if prop.type_ != allocation_type::PINNED {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    match prop.location.type_ {
        location_type::DEVICE => {}
        location_type::HOST | location_type::HOST_NUMA | location_type::HOST_NUMA_CURRENT => {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        _ => return Err(CUresult::ERROR_INVALID_VALUE),
    }
    Ok(())
}

/// Validates allocation properties; returns the machine device.
fn check_prop(d: &Driver, prop: &CUmemAllocationProp) -> Res<usize> {
    check_prop_kinds(prop)?;
    let device = d.device(prop.location.id)?;
    check_handle_types(d, prop.requestedHandleTypes)?;
    Ok(device)
}

/// Checks that `size` bytes fit on `device` given every live process's usage.
pub(crate) fn check_free(d: &Driver, device: usize, size: u64) -> Res {
    if accounting::free_bytes(d, device) < size {
        Err(CUresult::ERROR_OUT_OF_MEMORY)
    } else {
        Ok(())
    }
}

pub(crate) unsafe fn mem_create(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> Res {
    if handle.is_null() || flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a readable CUmemAllocationProp (null is refused).
    let prop = unsafe { read_in(prop) }?;
    let size = size as u64;
    if size == 0 || !aligned(size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let h = state::with(|d| {
        let device = check_prop(d, &prop)?;
        check_free(d, device, size)?;
        let h = new_handle(d);
        let trailer = Trailer {
            kind: BackingKind::Vmm,
            size,
            device: device as u32,
            handle_types: prop.requestedHandleTypes,
            creator_pid: d.pid as u32,
            alloc_id: h,
            creator_start: d.start_token,
        };
        let backing = Backing::create(trailer).map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        d.mem.objects.insert(
            h,
            Object {
                backing,
                origin: Origin::Created,
                device,
                handle_types: prop.requestedHandleTypes,
                alloc_flags: prop.allocFlags,
                handle_refs: 1,
                users: 0,
                charged: size,
                multicast: None,
            },
        );
        d.usage.charge(device, size);
        Ok(h)
    })?;
    // SAFETY: checked non-null; the caller passes a writable handle.
    unsafe { write_out(handle, h) }
}

pub(crate) fn mem_release(handle: CUmemGenericAllocationHandle) -> Res {
    state::with(|d| {
        let obj = d
            .mem
            .objects
            .get_mut(&handle)
            .filter(|o| o.handle_refs > 0)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        obj.handle_refs -= 1;
        collect(d, handle);
        Ok(())
    })
}

pub(crate) unsafe fn address_reserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> Res {
    let (size, alignment) = (size as u64, alignment as u64);
    if ptr.is_null() || flags != 0 || size == 0 || !aligned(size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if alignment != 0 && !alignment.is_power_of_two() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let align = alignment.max(GRANULARITY);
    let start = state::with(|d| {
        let start = os::reserve(size, align, addr).map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        d.mem.reservations.insert(start, size);
        Ok(start)
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUdeviceptr.
    unsafe { write_out(ptr, start) }
}

fn pieces_in(d: &Driver, start: u64, end: u64) -> impl Iterator<Item = (&u64, &Piece)> {
    d.mem
        .pieces
        .range(..end)
        .filter(move |&(&s, p)| s + p.size > start)
}

pub(crate) fn address_free(ptr: CUdeviceptr, size: usize) -> Res {
    let size = size as u64;
    state::with(|d| {
        if d.mem.reservations.get(&ptr) != Some(&size) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if pieces_in(d, ptr, ptr + size).next().is_some() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        os::unmap(ptr, size).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        d.mem.reservations.remove(&ptr);
        Ok(())
    })
}

/// Whether `[start, end)` lies inside one reservation.
fn reserved(d: &Driver, start: u64, end: u64) -> bool {
    d.mem
        .reservations
        .range(..=start)
        .next_back()
        .is_some_and(|(&s, &size)| end <= s + size)
}

pub(crate) fn mem_map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> Res {
    let (size, offset) = (size as u64, offset as u64);
    if flags != 0 || size == 0 || !aligned(ptr) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // r580: an unaligned size or offset is "not supported" rather than invalid.
    if !aligned(size) || !aligned(offset) {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    let end = ptr.checked_add(size).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    state::with(|d| {
        let obj = object(d, handle)?;
        // r580: so is a range the allocation does not hold.
        if offset
            .checked_add(size)
            .is_none_or(|e| e > obj.backing.size)
        {
            return Err(CUresult::ERROR_NOT_SUPPORTED);
        }
        if !reserved(d, ptr, end) || pieces_in(d, ptr, end).next().is_some() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // A multicast object maps only once its team is complete (the real driver blocks).
        crate::multicast::require_team(obj)?;
        os::map_shared(ptr, size, obj.backing.file()?, offset, libc::PROT_NONE)
            .map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        let map_id = d.mem.next_map_id;
        d.mem.next_map_id += 1;
        let devices = d.devices.len();
        d.mem.pieces.insert(
            ptr,
            Piece {
                size,
                map_id,
                handle,
                offset,
                access: vec![access_flags::PROT_NONE; devices],
            },
        );
        if let Some(obj) = d.mem.objects.get_mut(&handle) {
            obj.users += 1;
        }
        Ok(())
    })
}

/// The pieces tiling `[start, end)` exactly, or `CUDA_ERROR_INVALID_VALUE` if there is a hole.
/// With `whole`, a piece may not stick out of the range either.
fn tiling(d: &Driver, start: u64, end: u64, whole: bool) -> Res<Vec<u64>> {
    let mut out = Vec::new();
    let mut cursor = start;
    for (&s, p) in pieces_in(d, start, end) {
        if s > cursor || (whole && (s < start || s + p.size > end)) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        out.push(s);
        cursor = s + p.size;
    }
    if cursor < end {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    Ok(out)
}

pub(crate) fn mem_unmap(ptr: CUdeviceptr, size: usize) -> Res {
    let size = size as u64;
    if size == 0 || !aligned(ptr) || !aligned(size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let end = ptr.checked_add(size).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    state::with(|d| {
        // r580: unmapping a reserved range that holds no mapping succeeds and does nothing.
        if reserved(d, ptr, end) && pieces_in(d, ptr, end).next().is_none() {
            return Ok(());
        }
        let starts = tiling(d, ptr, end, true)?;
        let ids: Vec<u64> = starts
            .iter()
            .filter_map(|s| d.mem.pieces.get(s).map(|p| p.map_id))
            .collect();
        // Every piece of each mapping touched must be inside the range: no partial unmap.
        let outside = d
            .mem
            .pieces
            .iter()
            .any(|(s, p)| ids.contains(&p.map_id) && (*s < ptr || *s + p.size > end));
        if outside {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        os::map_none(ptr, size).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        let mut released = Vec::new();
        for s in starts {
            if let Some(p) = d.mem.pieces.remove(&s)
                && !released.iter().any(|(id, _)| *id == p.map_id)
            {
                released.push((p.map_id, p.handle));
            }
        }
        for (_, handle) in released {
            if let Some(obj) = d.mem.objects.get_mut(&handle) {
                obj.users = obj.users.saturating_sub(1);
            }
            collect(d, handle);
        }
        Ok(())
    })
}

/// Splits the piece that strictly contains `at`, so a range boundary falls between pieces.
fn split_at(d: &mut Driver, at: u64) {
    let Some((&s, p)) = d.mem.pieces.range(..at).next_back() else {
        return;
    };
    if s + p.size <= at {
        return;
    }
    let mut tail = p.clone();
    tail.size = s + p.size - at;
    tail.offset += at - s;
    if let Some(head) = d.mem.pieces.get_mut(&s) {
        head.size = at - s;
    }
    d.mem.pieces.insert(at, tail);
}

pub(crate) unsafe fn set_access(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> Res {
    let size = size as u64;
    if desc.is_null() || count == 0 || count > MAX_ACCESS_DESCS {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if size == 0 || !aligned(ptr) || !aligned(size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let end = ptr.checked_add(size).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    // SAFETY: the caller passes `count` readable descriptors at `desc` (checked non-null).
    let descs = unsafe { std::slice::from_raw_parts(desc, count) }.to_vec();
    state::with(|d| {
        let mut wanted = Vec::with_capacity(descs.len());
        for a in &descs {
            if a.location.type_ != location_type::DEVICE {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            // r580: a location naming no device is an invalid value here (not INVALID_DEVICE).
            let dev = d
                .device(a.location.id)
                .map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
            if !matches!(
                a.flags,
                access_flags::PROT_NONE | access_flags::PROT_READ | access_flags::PROT_READWRITE
            ) {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            wanted.push((dev, a.flags));
        }
        tiling(d, ptr, end, false)?;
        split_at(d, ptr);
        split_at(d, end);
        let starts = tiling(d, ptr, end, true)?;
        for s in starts {
            let Some(p) = d.mem.pieces.get_mut(&s) else {
                continue;
            };
            for &(dev, flags) in &wanted {
                if let Some(slot) = p.access.get_mut(dev) {
                    *slot = flags;
                }
            }
            let (len, prot) = (p.size, p.prot());
            os::protect(s, len, prot).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        }
        Ok(())
    })
}

pub(crate) unsafe fn get_access(
    flags: *mut c_ulonglong,
    location: *const CUmemLocation,
    ptr: CUdeviceptr,
) -> Res {
    if flags.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a readable CUmemLocation (null is refused).
    let location = unsafe { read_in(location) }?;
    if location.type_ != location_type::DEVICE {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let value = state::with(|d| {
        let dev = d.device(location.id)?;
        let (&s, p) = d
            .mem
            .pieces
            .range(..=ptr)
            .next_back()
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if s + p.size <= ptr {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        Ok(p.access.get(dev).copied().unwrap_or(0))
    })?;
    // SAFETY: checked non-null; the caller passes a writable unsigned long long.
    unsafe { write_out(flags, u64::from(value)) }
}

const FABRIC_MAGIC: [u8; 8] = *b"FAKEFAB1";

/// A FABRIC handle names the exporting process and its descriptor (64 bytes, little endian):
/// `magic[8] "FAKEFAB1" | pid u32 | fd u32 | inode u64 | size u64 | start_token u64 | zero[24]`.
/// An importer on the same host opens `/proc/<pid>/fd/<fd>` and checks the inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FabricName {
    pub pid: u32,
    pub fd: u32,
    pub ino: u64,
    pub size: u64,
    pub start: u64,
}

impl FabricName {
    pub(crate) fn encode(&self) -> CUmemFabricHandle {
        let mut data = [0u8; 64];
        data[0..8].copy_from_slice(&FABRIC_MAGIC);
        data[8..12].copy_from_slice(&self.pid.to_le_bytes());
        data[12..16].copy_from_slice(&self.fd.to_le_bytes());
        data[16..24].copy_from_slice(&self.ino.to_le_bytes());
        data[24..32].copy_from_slice(&self.size.to_le_bytes());
        data[32..40].copy_from_slice(&self.start.to_le_bytes());
        CUmemFabricHandle { data }
    }

    pub(crate) fn decode(h: &CUmemFabricHandle) -> Option<FabricName> {
        let d = &h.data;
        let u32_at = |i: usize| d.get(i..i + 4)?.try_into().ok().map(u32::from_le_bytes);
        let u64_at = |i: usize| d.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes);
        if d.get(0..8)? != FABRIC_MAGIC || d.get(40..64)?.iter().any(|&b| b != 0) {
            return None;
        }
        Some(FabricName {
            pid: u32_at(8)?,
            fd: u32_at(12)?,
            ino: u64_at(16)?,
            size: u64_at(24)?,
            start: u64_at(32)?,
        })
    }
}

/// A close-on-exec duplicate of `file`'s descriptor, given to the application.
pub(crate) fn dup_cloexec(file: &File) -> Res<c_int> {
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor creates a new one and touches no memory.
    let fd = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        Err(CUresult::ERROR_OUT_OF_MEMORY)
    } else {
        Ok(fd)
    }
}

pub(crate) unsafe fn export(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    kind: u32,
    flags: c_ulonglong,
) -> Res {
    if shareable.is_null() || flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        let obj = object(d, handle)?;
        match kind {
            handle_type::WIN32 | handle_type::WIN32_KMT => Err(CUresult::ERROR_NOT_SUPPORTED),
            handle_type::FABRIC if !d.config.fabric => Err(CUresult::ERROR_NOT_SUPPORTED),
            handle_type::POSIX_FILE_DESCRIPTOR | handle_type::FABRIC
                if obj.handle_types & kind == 0 =>
            {
                Err(CUresult::ERROR_INVALID_VALUE)
            }
            handle_type::POSIX_FILE_DESCRIPTOR => {
                let fd = dup_cloexec(obj.backing.file()?)?;
                // SAFETY: for POSIX_FILE_DESCRIPTOR the caller passes a writable int.
                unsafe { write_out(shareable.cast::<c_int>(), fd) }
            }
            handle_type::FABRIC => {
                let name = FabricName {
                    pid: d.pid as u32,
                    fd: obj.backing.file()?.as_raw_fd() as u32,
                    ino: obj.backing.ino,
                    size: obj.backing.size,
                    start: d.start_token,
                };
                // SAFETY: for FABRIC the caller passes a writable CUmemFabricHandle.
                unsafe { write_out(shareable.cast::<CUmemFabricHandle>(), name.encode()) }
            }
            _ => Err(CUresult::ERROR_INVALID_VALUE),
        }
    })
}

/// What r580 returns for a POSIX import of a descriptor that is not one of its exports: a
/// negative number, a descriptor not open, any other file (measured 2026-12-02).
const NOT_OURS: CUresult = CUresult::ERROR_UNKNOWN;

/// Opens what a shareable handle names, as a file of our own.
unsafe fn open_shareable(d: &Driver, os_handle: *mut c_void, kind: u32) -> Res<File> {
    match kind {
        handle_type::WIN32 | handle_type::WIN32_KMT => Err(CUresult::ERROR_NOT_SUPPORTED),
        handle_type::POSIX_FILE_DESCRIPTOR => {
            let fd = os_handle as usize as i64;
            let fd = c_int::try_from(fd)
                .ok()
                .filter(|&fd| fd >= 0)
                .ok_or(NOT_OURS)?;
            // SAFETY: F_GETFD only asks whether `fd` is open; it borrows nothing.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(NOT_OURS);
            }
            // Reopen read-write where possible: a descriptor opened read-only (through
            // /proc/<pid>/fd) could not back a read-write mapping.
            if let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/self/fd/{fd}"))
            {
                return Ok(file);
            }
            // SAFETY: `fd` is open (checked just above) and borrowed only for the duplication.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            let owned = borrowed.try_clone_to_owned().map_err(|_| NOT_OURS)?;
            Ok(File::from(owned))
        }
        handle_type::FABRIC => {
            if !d.config.fabric {
                return Err(CUresult::ERROR_NOT_SUPPORTED);
            }
            // SAFETY: for FABRIC the caller passes a readable CUmemFabricHandle (null refused).
            let raw = unsafe { read_in(os_handle.cast::<CUmemFabricHandle>()) }?;
            let name = FabricName::decode(&raw).ok_or(CUresult::ERROR_INVALID_VALUE)?;
            let file =
                os::open_peer_fd(name.pid, name.fd).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
            use std::os::unix::fs::MetadataExt;
            let ino = file
                .metadata()
                .map_err(|_| CUresult::ERROR_INVALID_VALUE)?
                .ino();
            if ino != name.ino {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            Ok(file)
        }
        _ => Err(CUresult::ERROR_INVALID_VALUE),
    }
}

pub(crate) unsafe fn import(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    kind: u32,
) -> Res {
    if handle.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let h = state::with(|d| {
        // SAFETY: forwarded from the caller, who passes the handle of `kind`.
        let file = unsafe { open_shareable(d, os_handle, kind) }?;
        let foreign = if kind == handle_type::POSIX_FILE_DESCRIPTOR {
            NOT_OURS
        } else {
            CUresult::ERROR_INVALID_VALUE
        };
        let backing = Backing::adopt(file).map_err(|_| foreign)?;
        let t = backing.trailer;
        if t.handle_types & kind == 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let (device, multicast) = match t.kind {
            // The trailer names a machine device (the same in every process).
            BackingKind::Vmm if (t.device as usize) < d.devices.len() => (t.device as usize, None),
            BackingKind::Vmm => return Err(CUresult::ERROR_INVALID_VALUE),
            BackingKind::Multicast => (0, Some(crate::multicast::Multicast::new(t.device))),
            BackingKind::Legacy => return Err(foreign),
        };
        let h = new_handle(d);
        d.mem.objects.insert(
            h,
            Object {
                backing,
                origin: Origin::Imported,
                device,
                handle_types: t.handle_types,
                alloc_flags: Default::default(),
                handle_refs: 1,
                users: 0,
                charged: 0,
                multicast,
            },
        );
        Ok(h)
    })?;
    // SAFETY: checked non-null; the caller passes a writable handle.
    unsafe { write_out(handle, h) }
}

pub(crate) unsafe fn retain(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> Res {
    if handle.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let addr = addr as u64;
    let h = state::with(|d| {
        let (&s, p) = d
            .mem
            .pieces
            .range(..=addr)
            .next_back()
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if s + p.size <= addr {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let h = p.handle;
        let obj = d
            .mem
            .objects
            .get_mut(&h)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        obj.handle_refs += 1;
        Ok(h)
    })?;
    // SAFETY: checked non-null; the caller passes a writable handle.
    unsafe { write_out(handle, h) }
}

pub(crate) unsafe fn get_properties(
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> Res {
    if prop.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let value = state::with(|d| {
        let obj = object(d, handle)?;
        if obj.multicast.is_some() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        Ok(CUmemAllocationProp {
            type_: allocation_type::PINNED,
            requestedHandleTypes: obj.handle_types,
            location: CUmemLocation {
                type_: location_type::DEVICE,
                id: d.ordinal_of(obj.device),
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: obj.alloc_flags,
        })
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUmemAllocationProp.
    unsafe { write_out(prop, value) }
}

pub(crate) unsafe fn granularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: u32,
) -> Res {
    if granularity.is_null() || option > 1 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a readable CUmemAllocationProp (null is refused).
    let prop = unsafe { read_in(prop) }?;
    // r580 answers for any location id, device or not (measured with id 9999).
    state::with(|d| {
        check_prop_kinds(&prop)?;
        check_handle_types(d, prop.requestedHandleTypes)
    })?;
    // SAFETY: checked non-null; the caller passes a writable size_t.
    unsafe { write_out(granularity, GRANULARITY as usize) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_names_round_trip_and_refuse_garbage() {
        let name = FabricName {
            pid: 77,
            fd: 12,
            ino: 99_999,
            size: 4 << 20,
            start: 5,
        };
        let h = name.encode();
        assert_eq!(FabricName::decode(&h), Some(name));
        let mut bad = h;
        bad.data[63] = 1;
        assert_eq!(FabricName::decode(&bad), None);
        let mut bad = h;
        bad.data[1] = 0;
        assert_eq!(FabricName::decode(&bad), None);
    }
}
