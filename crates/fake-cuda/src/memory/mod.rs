//! Device memory. "Device memory" is a memfd, mapped at the device address in this process:
//! device addresses are process virtual addresses, so an allocation whose descriptor reaches
//! another process really shares its bytes.
//!
//! - [`vmm`]: `cuMemCreate`/`Map`/`SetAccess`/export/import and the rest of the VMM API;
//! - [`legacy`]: `cuMemAlloc`/`cuMemFree` and legacy IPC (`cuIpc*`);
//! - [`copy`]: copies and memsets, which check every device range first and never fault;
//! - [`host`]: pinned host memory (ordinary private memory in the fake).
//!
//! Every backing memfd ends with a one-page trailer after the allocation's bytes (the
//! descriptor format documented in the crate README): magic, kind, size, device, handle types,
//! creator pid and start token, allocation id. An importer reads it to learn what it imports and
//! to refuse descriptors that are not the fake's.

pub(crate) mod copy;
pub(crate) mod host;
pub(crate) mod legacy;
pub(crate) mod vmm;

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

use cuda_abi::{CUmemAllocFlags, CUresult, access_flags};

use crate::Res;
use crate::os::{self, Saved};
use crate::state::Driver;

/// `cuMemGetAllocationGranularity` (minimum and recommended) and the alignment of every
/// allocation and reservation.
pub(crate) const GRANULARITY: u64 = 2 << 20;
/// The metadata trailer after the bytes of every backing memfd.
pub(crate) const TRAILER_LEN: u64 = os::PAGE;
const TRAILER_MAGIC: [u8; 8] = *b"FAKECUDA";
const TRAILER_VERSION: u32 = 1;

/// What a backing memfd holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BackingKind {
    /// A `cuMemCreate` allocation.
    Vmm = 1,
    /// A `cuMemAlloc` allocation.
    Legacy = 2,
    /// The backing of a multicast object.
    Multicast = 3,
}

/// The metadata trailer of a backing memfd (64 bytes used of its page, little endian):
/// `magic[8] "FAKECUDA" | version u32 = 1 | kind u32 | size u64 | device u32 | handle_types u32 |
/// creator_pid u32 | reserved u32 = 0 | alloc_id u64 | creator_start u64 | reserved u64 = 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Trailer {
    pub kind: BackingKind,
    pub size: u64,
    pub device: u32,
    pub handle_types: u32,
    pub creator_pid: u32,
    pub alloc_id: u64,
    pub creator_start: u64,
}

impl Trailer {
    pub(crate) fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&TRAILER_MAGIC);
        b[8..12].copy_from_slice(&TRAILER_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..28].copy_from_slice(&self.device.to_le_bytes());
        b[28..32].copy_from_slice(&self.handle_types.to_le_bytes());
        b[32..36].copy_from_slice(&self.creator_pid.to_le_bytes());
        b[40..48].copy_from_slice(&self.alloc_id.to_le_bytes());
        b[48..56].copy_from_slice(&self.creator_start.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8; 64]) -> Option<Trailer> {
        let u32_at = |i: usize| {
            b.get(i..i + 4)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let u64_at = |i: usize| {
            b.get(i..i + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
        };
        if b.get(0..8)? != TRAILER_MAGIC
            || u32_at(8)? != TRAILER_VERSION
            || u32_at(36)? != 0
            || u64_at(56)? != 0
        {
            return None;
        }
        let kind = match u32_at(12)? {
            1 => BackingKind::Vmm,
            2 => BackingKind::Legacy,
            3 => BackingKind::Multicast,
            _ => return None,
        };
        Some(Trailer {
            kind,
            size: u64_at(16)?,
            device: u32_at(24)?,
            handle_types: u32_at(28)?,
            creator_pid: u32_at(32)?,
            alloc_id: u64_at(40)?,
            creator_start: u64_at(48)?,
        })
    }
}

/// The memfd behind an allocation, or its saved bytes while the process is checkpointed.
#[derive(Debug)]
pub(crate) struct Backing {
    pub file: Option<File>,
    pub ino: u64,
    pub size: u64,
    pub saved: Option<Saved>,
    pub trailer: Trailer,
}

fn memfd_name(kind: BackingKind) -> &'static CStr {
    match kind {
        BackingKind::Vmm => c"fake-cuda-vmm",
        BackingKind::Legacy => c"fake-cuda-alloc",
        BackingKind::Multicast => c"fake-cuda-multicast",
    }
}

impl Backing {
    /// A fresh zero-filled memfd for `trailer.size` bytes, trailer written.
    pub(crate) fn create(trailer: Trailer) -> io::Result<Backing> {
        let file = os::memfd(memfd_name(trailer.kind), trailer.size + TRAILER_LEN)?;
        file.write_all_at(&trailer.encode(), trailer.size)?;
        let ino = file.metadata()?.ino();
        Ok(Backing {
            file: Some(file),
            ino,
            size: trailer.size,
            saved: None,
            trailer,
        })
    }

    /// Takes a descriptor another process made (import): it must carry a valid trailer whose size
    /// matches the file; anything else is refused with `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn adopt(file: File) -> Res<Backing> {
        let meta = file.metadata().map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        let len = meta.len();
        if !meta.file_type().is_file() || len < TRAILER_LEN + GRANULARITY {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let mut raw = [0u8; 64];
        file.read_exact_at(&mut raw, len - TRAILER_LEN)
            .map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        let trailer = Trailer::decode(&raw).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if trailer.size + TRAILER_LEN != len || trailer.size % GRANULARITY != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        Ok(Backing {
            file: Some(file),
            ino: meta.ino(),
            size: trailer.size,
            saved: None,
            trailer,
        })
    }

    /// The open memfd (`CUDA_ERROR_ILLEGAL_STATE` while checkpointed, which cannot be reached by
    /// application calls: they wait at the gate).
    pub(crate) fn file(&self) -> Res<&File> {
        self.file.as_ref().ok_or(CUresult::ERROR_ILLEGAL_STATE)
    }
}

/// Where an allocation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Created,
    Imported,
}

/// A generic allocation handle's object: a physical allocation or a multicast object.
#[derive(Debug)]
pub(crate) struct Object {
    pub backing: Backing,
    pub origin: Origin,
    pub device: usize,
    pub handle_types: u32,
    pub alloc_flags: CUmemAllocFlags,
    /// References the application holds (create/import: 1, each retain: +1, each release: -1).
    /// The handle is valid while this is above zero.
    pub handle_refs: u32,
    /// Mappings and multicast bindings that keep the memory alive after the handle is released.
    pub users: u32,
    /// Bytes charged to this process (created allocations only).
    pub charged: u64,
    pub multicast: Option<crate::multicast::Multicast>,
}

/// One piece of a `cuMemMap` mapping. A mapping is split into pieces only where
/// `cuMemSetAccess` set different access on parts of it; `map_id` ties the pieces together so
/// `cuMemUnmap` can refuse to unmap part of a mapping.
#[derive(Clone, Debug)]
pub(crate) struct Piece {
    pub size: u64,
    pub map_id: u64,
    pub handle: u64,
    pub offset: u64,
    /// `CUmemAccess_flags` per device ordinal.
    pub access: Vec<u32>,
}

impl Piece {
    /// The host protection that serves every device's access: the widest one.
    pub(crate) fn prot(&self) -> libc::c_int {
        prot_of(
            self.access
                .iter()
                .copied()
                .max()
                .unwrap_or(access_flags::PROT_NONE),
        )
    }
}

pub(crate) fn prot_of(flags: u32) -> libc::c_int {
    match flags {
        access_flags::PROT_READWRITE => libc::PROT_READ | libc::PROT_WRITE,
        access_flags::PROT_READ => libc::PROT_READ,
        _ => libc::PROT_NONE,
    }
}

/// All memory bookkeeping of the process.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub objects: BTreeMap<u64, Object>,
    /// VA reservations: start -> size.
    pub reservations: BTreeMap<u64, u64>,
    /// VMM mapping pieces by start address.
    pub pieces: BTreeMap<u64, Piece>,
    pub legacy: BTreeMap<u64, legacy::Legacy>,
    pub ipc_open: BTreeMap<u64, legacy::IpcOpen>,
    pub host: BTreeMap<u64, host::HostRange>,
    pub next_map_id: u64,
}

/// Base of allocation and multicast handle values.
const HANDLE_BASE: u64 = 0x00cd_0000_0000_0000;

pub(crate) fn new_handle(d: &mut Driver) -> u64 {
    HANDLE_BASE + d.next_id()
}

/// Frees an object once the application released it and nothing maps or binds it.
pub(crate) fn collect(d: &mut Driver, handle: u64) {
    let dead = d
        .mem
        .objects
        .get(&handle)
        .is_some_and(|o| o.handle_refs == 0 && o.users == 0);
    if !dead {
        return;
    }
    if let Some(obj) = d.mem.objects.remove(&handle) {
        if obj.charged > 0 {
            d.usage.uncharge(obj.device, obj.charged);
        }
        if let Some(mc) = obj.multicast {
            crate::multicast::forget(&obj.backing, &mc, d.pid, d.start_token);
            for bound in mc.bindings {
                if let Some(o) = d.mem.objects.get_mut(&bound.mem) {
                    o.users = o.users.saturating_sub(1);
                }
                collect(d, bound.mem);
            }
        }
    }
}

/// The object behind a handle the application still holds.
pub(crate) fn object(d: &Driver, handle: u64) -> Res<&Object> {
    d.mem
        .objects
        .get(&handle)
        .filter(|o| o.handle_refs > 0)
        .ok_or(CUresult::ERROR_INVALID_VALUE)
}

/// What a copy or memset needs from a device range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    Read,
    Write,
}

pub(crate) fn within<T>(
    map: &BTreeMap<u64, T>,
    size: impl Fn(&T) -> u64,
    addr: u64,
    len: u64,
) -> bool {
    map.range(..=addr).next_back().is_some_and(|(&base, v)| {
        addr.checked_add(len)
            .is_some_and(|end| end <= base + size(v))
    })
}

/// Whether `[addr, addr+len)` is memory the device can reach with `need`: one `cuMemAlloc`
/// allocation, one opened IPC mapping, pinned host memory, or contiguous VMM mappings whose
/// access allows it. Anything else (unmapped, PROT_NONE, read-only for a write) is
/// `CUDA_ERROR_INVALID_VALUE`, so a copy never faults.
pub(crate) fn check_device(d: &Driver, addr: u64, len: u64, need: Need) -> Res {
    let m = &d.mem;
    if within(&m.legacy, |l| l.size, addr, len)
        || within(&m.ipc_open, |o| o.size, addr, len)
        || within(&m.host, |h| h.size, addr, len)
    {
        return Ok(());
    }
    let end = addr.checked_add(len).ok_or(CUresult::ERROR_INVALID_VALUE)?;
    let mut cursor = addr;
    while cursor < end {
        let (&start, piece) = m
            .pieces
            .range(..=cursor)
            .next_back()
            .ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if start + piece.size <= cursor {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let prot = piece.prot();
        let ok = match need {
            Need::Read => prot & libc::PROT_READ != 0,
            Need::Write => prot & libc::PROT_WRITE != 0,
        };
        if !ok {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        cursor = start + piece.size;
    }
    Ok(())
}

/// Whether any byte of `[addr, addr+len)` is memory this driver manages (for host-side
/// arguments that must not be device memory the fake has not checked).
pub(crate) fn touches_driver_memory(d: &Driver, addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return true;
    };
    let hits = |base: u64, size: u64| base < end && addr < base + size;
    let m = &d.mem;
    m.reservations.iter().any(|(&b, &s)| hits(b, s))
        || m.legacy.iter().any(|(&b, l)| hits(b, l.mapped))
        || m.ipc_open.iter().any(|(&b, o)| hits(b, o.mapped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_round_trip_and_refuse_garbage() {
        let t = Trailer {
            kind: BackingKind::Vmm,
            size: 4 << 20,
            device: 1,
            handle_types: 1,
            creator_pid: 4242,
            alloc_id: 7,
            creator_start: 123_456,
        };
        let raw = t.encode();
        assert_eq!(Trailer::decode(&raw), Some(t));
        let mut bad = raw;
        bad[0] = b'X';
        assert_eq!(Trailer::decode(&bad), None);
        let mut bad = raw;
        bad[12] = 9;
        assert_eq!(Trailer::decode(&bad), None);
        let mut bad = raw;
        bad[36] = 1;
        assert_eq!(Trailer::decode(&bad), None);
    }

    #[test]
    fn widest_access_sets_the_host_protection() {
        let piece = Piece {
            size: GRANULARITY,
            map_id: 1,
            handle: 1,
            offset: 0,
            access: vec![access_flags::PROT_READ, access_flags::PROT_READWRITE],
        };
        assert_eq!(piece.prot(), libc::PROT_READ | libc::PROT_WRITE);
        let none = Piece {
            access: vec![0, 0],
            ..piece
        };
        assert_eq!(none.prot(), libc::PROT_NONE);
    }
}
