//! Multicast objects, modelled across processes.
//!
//! A multicast object is a memfd backing (mappable with `cuMemMap` and shared by POSIX
//! descriptor like an allocation) whose trailer page holds, after the 64-byte trailer, the
//! object's **team and binding table**, shared by every process that holds the object:
//!
//! ```text
//! 64   team: 64 slots of u32, machine device + 1 (0: empty), in the order devices were added
//! 320  bindings: 67 slots of 56 bytes: device + 1 u32 (0: empty) | pid u32 | fd u32 | zero u32 |
//!      start u64 | inode u64 | mc_offset u64 | mem_offset u64 | size u64
//! ```
//!
//! A binding names the binder process (pid and start token) and the descriptor number and inode
//! of the member allocation's memfd in it, so any process can reach the member's bytes through
//! `/proc/<pid>/fd/<fd>` (as FABRIC handles do) while the binder lives. Every reader and writer
//! of the table holds an exclusive `flock` on its own open file description of the backing.
//!
//! - A write through a multicast mapping by the driver (`cuMemcpy*` to it, `cuMemset*`) lands in
//!   the object's own backing (what the mapping shows) and then in every bound member at the
//!   matching offset, in every process. Members that cannot be reached (their process is
//!   checkpointed: its memfds are closed) are skipped; bindings of dead processes are removed.
//! - A read through a multicast mapping by the driver (`cuMemcpy*` from it) first refreshes the
//!   object's own backing from the bound member of the lowest machine device (per byte range;
//!   ranges bound by no reachable member keep the bytes last written through the multicast), so
//!   every process reads the same member. Host loads and stores on the mapping see only the
//!   object's own backing (on a GPU the host cannot dereference it at all).
//! - The team is shared: a device added in one process is in the team for all; binding or
//!   mapping before the team is complete (`numDevices` devices added) is refused with
//!   `CUDA_ERROR_NOT_READY`, where the real driver blocks until the last device is added. A
//!   device stays in the team for the object's lifetime, as on the real driver.
//! - Unbinding, releasing the object (its bindings go with it) or the binder's death stops the
//!   propagation to that member.
//!
//! Multicast is only ever exercised on this fake (never on a real GPU).
//!
//! Errors: multicast disabled (`FAKE_CUDA_MULTICAST=0`): `CUDA_ERROR_NOT_SUPPORTED`; a device
//! that does not exist, or binding memory of a device not in the team: `CUDA_ERROR_INVALID_DEVICE`;
//! an incomplete team at bind or map: `CUDA_ERROR_NOT_READY`; the binding table full:
//! `CUDA_ERROR_OUT_OF_MEMORY`; the table unreadable: `CUDA_ERROR_OPERATING_SYSTEM`; everything
//! else invalid (sizes, offsets, unknown or non-multicast handles, a device added twice or
//! beyond `numDevices`, a binding overlapping another of the same device, an unbind matching no
//! binding of this process): `CUDA_ERROR_INVALID_VALUE`.

use std::ffi::c_ulonglong;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use cuda_abi::{
    CUdevice, CUdeviceptr, CUmemGenericAllocationHandle, CUmulticastObjectProp, CUresult,
};

use crate::memory::vmm::check_handle_types;
use crate::memory::{
    Backing, BackingKind, GRANULARITY, Object, Origin, TRAILER_LEN, Trailer, new_handle,
};
use crate::os::{self, FileLock};
use crate::state::{self, Driver};
use crate::{Res, read_in, write_out};

/// Where the table starts in the trailer page (after the 64-byte trailer).
const TABLE_AT: u64 = 64;
const TABLE_LEN: usize = (TRAILER_LEN - TABLE_AT) as usize;
/// Team slots: numDevices is at most the device count, at most 64.
const TEAM_SLOTS: usize = 64;
const BINDINGS_AT: usize = TEAM_SLOTS * 4;
const ENTRY_LEN: usize = 56;
/// Bindings one multicast object can hold, over all processes.
const MAX_BINDINGS: usize = (TABLE_LEN - BINDINGS_AT) / ENTRY_LEN;

/// One binding of this process's memory to a multicast object (the local half: which handle
/// it keeps alive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Binding {
    pub device: usize,
    pub mc_offset: u64,
    pub size: u64,
    pub mem: u64,
}

/// The local view of a multicast object: its team size and this process's bindings (the team
/// itself and every process's bindings live in the shared table).
#[derive(Debug)]
pub(crate) struct Multicast {
    pub num_devices: u32,
    pub bindings: Vec<Binding>,
}

impl Multicast {
    pub(crate) fn new(num_devices: u32) -> Multicast {
        Multicast {
            num_devices,
            bindings: Vec::new(),
        }
    }
}

/// A binding in the shared table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    device: usize,
    pid: i32,
    start: u64,
    fd: u32,
    ino: u64,
    mc_offset: u64,
    mem_offset: u64,
    size: u64,
}

impl Entry {
    /// The part of `[from, from+len)` (multicast offsets) this binding covers.
    fn overlap(&self, from: u64, len: u64) -> Option<(u64, u64)> {
        let start = from.max(self.mc_offset);
        let end = (from + len).min(self.mc_offset + self.size);
        (start < end).then_some((start, end))
    }

    /// The member's memfd, opened through the binder's descriptor table (`None` if the binder
    /// holds it no more, e.g. while checkpointed).
    fn open_member(&self) -> Option<File> {
        let file = os::open_peer_fd(self.pid as u32, self.fd).ok()?;
        let ino = file.metadata().ok()?.ino();
        (ino == self.ino).then_some(file)
    }
}

/// The team and bindings of one multicast object.
#[derive(Debug, Default, PartialEq, Eq)]
struct Table {
    team: Vec<usize>,
    bindings: Vec<Entry>,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    b.get(i..i + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    b.get(i..i + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn put(b: &mut [u8], i: usize, v: &[u8]) {
    if let Some(slot) = b.get_mut(i..i + v.len()) {
        slot.copy_from_slice(v);
    }
}

impl Table {
    fn decode(b: &[u8]) -> Table {
        let team = (0..TEAM_SLOTS)
            .map(|i| u32_at(b, i * 4))
            .filter(|&v| v != 0)
            .map(|v| v as usize - 1)
            .collect();
        let bindings = (0..MAX_BINDINGS)
            .map(|i| BINDINGS_AT + i * ENTRY_LEN)
            .filter(|&at| u32_at(b, at) != 0)
            .map(|at| Entry {
                device: u32_at(b, at) as usize - 1,
                pid: u32_at(b, at + 4) as i32,
                fd: u32_at(b, at + 8),
                start: u64_at(b, at + 16),
                ino: u64_at(b, at + 24),
                mc_offset: u64_at(b, at + 32),
                mem_offset: u64_at(b, at + 40),
                size: u64_at(b, at + 48),
            })
            .collect();
        Table { team, bindings }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; TABLE_LEN];
        for (i, &dev) in self.team.iter().take(TEAM_SLOTS).enumerate() {
            put(&mut b, i * 4, &(dev as u32 + 1).to_le_bytes());
        }
        for (i, e) in self.bindings.iter().take(MAX_BINDINGS).enumerate() {
            let at = BINDINGS_AT + i * ENTRY_LEN;
            put(&mut b, at, &(e.device as u32 + 1).to_le_bytes());
            put(&mut b, at + 4, &(e.pid as u32).to_le_bytes());
            put(&mut b, at + 8, &e.fd.to_le_bytes());
            put(&mut b, at + 16, &e.start.to_le_bytes());
            put(&mut b, at + 24, &e.ino.to_le_bytes());
            put(&mut b, at + 32, &e.mc_offset.to_le_bytes());
            put(&mut b, at + 40, &e.mem_offset.to_le_bytes());
            put(&mut b, at + 48, &e.size.to_le_bytes());
        }
        b
    }
}

/// The table of one multicast backing, read under its lock; [`Shared::store`] writes it back.
struct Shared<'a> {
    file: &'a File,
    at: u64,
    table: Table,
    _lock: FileLock<'a>,
}

const OS_ERROR: CUresult = CUresult::ERROR_OPERATING_SYSTEM;

impl<'a> Shared<'a> {
    fn open(backing: &'a Backing) -> Res<Shared<'a>> {
        let file = backing.file()?;
        let lock = FileLock::exclusive(file).map_err(|_| OS_ERROR)?;
        let at = backing.size + TABLE_AT;
        let mut raw = vec![0u8; TABLE_LEN];
        file.read_exact_at(&mut raw, at).map_err(|_| OS_ERROR)?;
        Ok(Shared {
            file,
            at,
            table: Table::decode(&raw),
            _lock: lock,
        })
    }

    fn store(&self) -> Res {
        self.file
            .write_all_at(&self.table.encode(), self.at)
            .map_err(|_| OS_ERROR)
    }

    /// Drops the bindings of dead processes; true if any went.
    fn prune(&mut self, me: i32) -> bool {
        let before = self.table.bindings.len();
        self.table
            .bindings
            .retain(|e| e.pid == me || os::alive(e.pid, e.start));
        self.table.bindings.len() != before
    }

    /// Prunes, storing the table if anything went.
    fn pruned(mut self, me: i32) -> Res<Shared<'a>> {
        if self.prune(me) {
            self.store()?;
        }
        Ok(self)
    }
}

fn aligned(v: u64) -> bool {
    v.is_multiple_of(GRANULARITY)
}

fn enabled(d: &Driver) -> Res {
    if d.config.multicast {
        Ok(())
    } else {
        Err(CUresult::ERROR_NOT_SUPPORTED)
    }
}

/// The multicast object behind a handle the application holds.
fn multicast_object(d: &Driver, handle: u64) -> Res<(&Object, &Multicast)> {
    let obj = d
        .mem
        .objects
        .get(&handle)
        .filter(|o| o.handle_refs > 0)
        .ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let mc = obj
        .multicast
        .as_ref()
        .ok_or(CUresult::ERROR_INVALID_VALUE)?;
    Ok((obj, mc))
}

fn multicast_mut(d: &mut Driver, handle: u64) -> Option<&mut Multicast> {
    d.mem
        .objects
        .get_mut(&handle)
        .and_then(|o| o.multicast.as_mut())
}

/// `CUDA_ERROR_NOT_READY` unless every device of the team has been added (in any process).
pub(crate) fn require_team(obj: &Object) -> Res {
    let Some(mc) = &obj.multicast else {
        return Ok(());
    };
    let shared = Shared::open(&obj.backing)?;
    if shared.table.team.len() < mc.num_devices as usize {
        return Err(CUresult::ERROR_NOT_READY);
    }
    Ok(())
}

/// Validates multicast properties (shared by create and granularity).
fn check_prop(d: &Driver, prop: &CUmulticastObjectProp) -> Res<u32> {
    if prop.flags != 0 || prop.numDevices == 0 || prop.numDevices as usize > d.devices.len() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let types = u32::try_from(prop.handleTypes).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
    check_handle_types(d, types)?;
    Ok(types)
}

pub(crate) unsafe fn get_granularity(
    granularity: *mut usize,
    prop: *const CUmulticastObjectProp,
    option: u32,
) -> Res {
    if granularity.is_null() || option > 1 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a readable CUmulticastObjectProp (null refused).
    let prop = unsafe { read_in(prop) }?;
    state::with(|d| {
        enabled(d)?;
        check_prop(d, &prop).map(|_| ())
    })?;
    // SAFETY: checked non-null; the caller passes a writable size_t.
    unsafe { write_out(granularity, GRANULARITY as usize) }
}

pub(crate) unsafe fn create(
    handle: *mut CUmemGenericAllocationHandle,
    prop: *const CUmulticastObjectProp,
) -> Res {
    if handle.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes a readable CUmulticastObjectProp (null refused).
    let prop = unsafe { read_in(prop) }?;
    let h = state::with(|d| {
        enabled(d)?;
        let types = check_prop(d, &prop)?;
        let size = prop.size as u64;
        if size == 0 || !aligned(size) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let h = new_handle(d);
        // For a multicast backing the trailer's device field carries numDevices.
        let trailer = Trailer {
            kind: BackingKind::Multicast,
            size,
            device: prop.numDevices,
            handle_types: types,
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
                device: 0,
                handle_types: types,
                alloc_flags: Default::default(),
                handle_refs: 1,
                users: 0,
                charged: 0,
                multicast: Some(Multicast::new(prop.numDevices)),
            },
        );
        Ok(h)
    })?;
    // SAFETY: checked non-null; the caller passes a writable handle.
    unsafe { write_out(handle, h) }
}

pub(crate) fn add_device(handle: CUmemGenericAllocationHandle, dev: CUdevice) -> Res {
    state::with(|d| {
        enabled(d)?;
        let device = d.device(dev)?;
        let (obj, mc) = multicast_object(d, handle)?;
        let mut shared = Shared::open(&obj.backing)?;
        let team = &mut shared.table.team;
        if team.contains(&device) || team.len() >= mc.num_devices as usize {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        team.push(device);
        shared.store()
    })
}

fn bind(
    d: &mut Driver,
    mc_handle: u64,
    mc_offset: u64,
    mem: u64,
    mem_offset: u64,
    size: u64,
) -> Res {
    if size == 0 || !aligned(mc_offset) || !aligned(mem_offset) || !aligned(size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let (device, mem_size, fd, ino) = {
        let obj = d
            .mem
            .objects
            .get(&mem)
            .filter(|o| o.handle_refs > 0 && o.multicast.is_none())
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let fd = obj.backing.file()?.as_raw_fd() as u32;
        (obj.device, obj.backing.size, fd, obj.backing.ino)
    };
    if mem_offset.checked_add(size).is_none_or(|e| e > mem_size) {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let (pid, start) = (d.pid, d.start_token);
    {
        let (obj, mc) = multicast_object(d, mc_handle)?;
        if mc_offset
            .checked_add(size)
            .is_none_or(|e| e > obj.backing.size)
        {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let mut shared = Shared::open(&obj.backing)?.pruned(pid)?;
        let table = &mut shared.table;
        if table.team.len() < mc.num_devices as usize {
            return Err(CUresult::ERROR_NOT_READY);
        }
        if !table.team.contains(&device) {
            return Err(CUresult::ERROR_INVALID_DEVICE);
        }
        let overlaps = table.bindings.iter().any(|b| {
            b.device == device && b.mc_offset < mc_offset + size && mc_offset < b.mc_offset + b.size
        });
        if overlaps {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if table.bindings.len() >= MAX_BINDINGS {
            return Err(CUresult::ERROR_OUT_OF_MEMORY);
        }
        table.bindings.push(Entry {
            device,
            pid,
            start,
            fd,
            ino,
            mc_offset,
            mem_offset,
            size,
        });
        shared.store()?;
    }
    if let Some(mc) = multicast_mut(d, mc_handle) {
        mc.bindings.push(Binding {
            device,
            mc_offset,
            size,
            mem,
        });
    }
    if let Some(obj) = d.mem.objects.get_mut(&mem) {
        obj.users += 1;
    }
    Ok(())
}

pub(crate) fn bind_mem(
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> Res {
    if flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        enabled(d)?;
        bind(d, mc, mc_offset as u64, mem, mem_offset as u64, size as u64)
    })
}

pub(crate) fn bind_addr(
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    ptr: CUdeviceptr,
    size: usize,
    flags: c_ulonglong,
) -> Res {
    if flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        enabled(d)?;
        // The range must lie in one mapping piece: its handle and offset are what gets bound.
        let (&s, p) = d
            .mem
            .pieces
            .range(..=ptr)
            .next_back()
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let end = ptr
            .checked_add(size as u64)
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if ptr >= s + p.size || end > s + p.size {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let (mem, mem_offset) = (p.handle, p.offset + (ptr - s));
        bind(d, mc, mc_offset as u64, mem, mem_offset, size as u64)
    })
}

/// Removes this process's shared entry for a local binding.
fn forget_entry(table: &mut Table, pid: i32, start: u64, b: &Binding) {
    table.bindings.retain(|e| {
        !(e.pid == pid
            && e.start == start
            && e.device == b.device
            && e.mc_offset == b.mc_offset
            && e.size == b.size)
    });
}

pub(crate) fn unbind(
    handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> Res {
    state::with(|d| {
        enabled(d)?;
        let device = d.device(dev)?;
        let (pid, start) = (d.pid, d.start_token);
        let (obj, mc) = multicast_object(d, handle)?;
        let at = mc
            .bindings
            .iter()
            .position(|b| {
                b.device == device && b.mc_offset == mc_offset as u64 && b.size == size as u64
            })
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let mut shared = Shared::open(&obj.backing)?;
        if let Some(b) = mc.bindings.get(at) {
            forget_entry(&mut shared.table, pid, start, b);
        }
        shared.store()?;
        drop(shared);
        let Some(b) = multicast_mut(d, handle).map(|mc| mc.bindings.remove(at)) else {
            return Ok(());
        };
        if let Some(obj) = d.mem.objects.get_mut(&b.mem) {
            obj.users = obj.users.saturating_sub(1);
        }
        crate::memory::collect(d, b.mem);
        Ok(())
    })
}

/// A multicast object is going away in this process: its bindings leave the shared table
/// (best effort: a table that cannot be written is left to the pruning of dead binders, and
/// while checkpointed there is no backing to write).
pub(crate) fn forget(backing: &Backing, mc: &Multicast, pid: i32, start: u64) {
    if mc.bindings.is_empty() || backing.file.is_none() {
        return;
    }
    if let Ok(mut shared) = Shared::open(backing) {
        for b in &mc.bindings {
            forget_entry(&mut shared.table, pid, start, b);
        }
        let _ = shared.store();
    }
}

/// The parts of `[addr, addr+len)` mapped from multicast objects: (object handle, multicast
/// offset, length).
fn multicast_spans(d: &Driver, addr: u64, len: u64) -> Vec<(u64, u64, u64)> {
    let Some(end) = addr.checked_add(len) else {
        return Vec::new();
    };
    d.mem
        .pieces
        .range(..end)
        .filter(|&(&s, p)| s + p.size > addr)
        .filter(|(_, p)| {
            d.mem
                .objects
                .get(&p.handle)
                .is_some_and(|o| o.multicast.is_some())
        })
        .map(|(&s, p)| {
            let from = addr.max(s);
            let to = end.min(s + p.size);
            (p.handle, p.offset + (from - s), to - from)
        })
        .collect()
}

/// After the driver wrote `[dst, dst+len)`: where that range is a multicast mapping, the bytes
/// (now in the object's own backing) go to every reachable bound member, in every process.
pub(crate) fn broadcast(d: &Driver, dst: u64, len: u64) -> Res {
    for (handle, from, n) in multicast_spans(d, dst, len) {
        let Some(obj) = d.mem.objects.get(&handle) else {
            continue;
        };
        let shared = Shared::open(&obj.backing)?.pruned(d.pid)?;
        let mut bytes = vec![0u8; n as usize];
        shared
            .file
            .read_exact_at(&mut bytes, from)
            .map_err(|_| OS_ERROR)?;
        for e in &shared.table.bindings {
            let Some((s, t)) = e.overlap(from, n) else {
                continue;
            };
            let Some(member) = e.open_member() else {
                continue;
            };
            let part = bytes
                .get((s - from) as usize..(t - from) as usize)
                .unwrap_or_default();
            member
                .write_all_at(part, e.mem_offset + (s - e.mc_offset))
                .map_err(|_| OS_ERROR)?;
        }
    }
    Ok(())
}

/// Before the driver reads `[src, src+len)`: where that range is a multicast mapping, the
/// object's own backing is refreshed from the bound member of the lowest machine device, so
/// the read sees that member (the same one in every process).
pub(crate) fn gather(d: &Driver, src: u64, len: u64) -> Res {
    for (handle, from, n) in multicast_spans(d, src, len) {
        let Some(obj) = d.mem.objects.get(&handle) else {
            continue;
        };
        let shared = Shared::open(&obj.backing)?.pruned(d.pid)?;
        let mut bytes = vec![0u8; n as usize];
        shared
            .file
            .read_exact_at(&mut bytes, from)
            .map_err(|_| OS_ERROR)?;
        let mut members = shared.table.bindings.clone();
        // Highest device first, so the lowest device's bytes are laid last and win.
        members.sort_by_key(|e| std::cmp::Reverse(e.device));
        for e in &members {
            let Some((s, t)) = e.overlap(from, n) else {
                continue;
            };
            let Some(member) = e.open_member() else {
                continue;
            };
            if let Some(part) = bytes.get_mut((s - from) as usize..(t - from) as usize) {
                member
                    .read_exact_at(part, e.mem_offset + (s - e.mc_offset))
                    .map_err(|_| OS_ERROR)?;
            }
        }
        shared
            .file
            .write_all_at(&bytes, from)
            .map_err(|_| OS_ERROR)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip_and_fit_the_trailer_page() {
        let table = Table {
            team: vec![3, 0, 63],
            bindings: (0..MAX_BINDINGS as u64)
                .map(|i| Entry {
                    device: (i % 64) as usize,
                    pid: 4000 + i as i32,
                    start: 77 + i,
                    fd: 9,
                    ino: 1 << 40,
                    mc_offset: i * GRANULARITY,
                    mem_offset: GRANULARITY,
                    size: GRANULARITY,
                })
                .collect(),
        };
        let raw = table.encode();
        assert_eq!(raw.len() as u64, TRAILER_LEN - TABLE_AT);
        assert_eq!(Table::decode(&raw), table);
        assert_eq!(MAX_BINDINGS, 67);
        assert_eq!(Table::decode(&[0u8; TABLE_LEN]), Table::default());
    }

    #[test]
    fn overlaps_clip_to_the_binding() {
        let e = Entry {
            device: 0,
            pid: 1,
            start: 1,
            fd: 3,
            ino: 1,
            mc_offset: 4,
            mem_offset: 0,
            size: 4,
        };
        assert_eq!(e.overlap(0, 6), Some((4, 6)));
        assert_eq!(e.overlap(6, 10), Some((6, 8)));
        assert_eq!(e.overlap(8, 2), None);
        assert_eq!(e.overlap(0, 4), None);
    }
}
