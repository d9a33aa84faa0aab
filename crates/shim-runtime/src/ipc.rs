//! Legacy CUDA IPC served by the shim for the memory it owns (`cuMemAlloc` on VMM,
//! `owned_alloc.rs`), never by the driver, so that capture can carry it like any shared memory.
//!
//! - `cuIpcGetMemHandle` of a pointer into an owned allocation returns a virtual handle
//!   ([`protocol::ipc::IpcHandle`]: creator, allocation ID, the pointer's offset, sizes) in the
//!   64 bytes of a `CUipcMemHandle`. Nothing is recorded: the allocation is already a shared
//!   creation, which the creator's peer service hands out by ID and capture saves and rebuilds.
//! - `cuIpcOpenMemHandle` of a virtual handle is a ticket import of the allocation from its
//!   creator, a reservation of its backing size, a mapping and an access grant, made through the
//!   tracked calls: capture releases such an import and rebuilds it (fetched again, mapped at the
//!   same address) with no code of its own, exactly like a ticket import. It returns the base of
//!   the allocation whatever the offset the handle names, as the driver does (a handle of an
//!   interior pointer opens the whole allocation at its base: PyTorch sends the offset apart).
//!   Repeated opens of one handle in this process are counted and return the same address;
//!   `cuIpcCloseMemHandle` unmaps and frees the range on the last close.
//! - Anything else (a driver's handle, from a process without the shim or with `cuMemAlloc` left
//!   native; a pointer the shim does not own) goes to the driver and is recorded as a legacy IPC
//!   blocker, as before (`track.rs`).
//!
//! Flags: `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS` is the only one the driver accepts (others give
//! INVALID_VALUE, checked first, as the driver does). VMM memory is reachable from exactly the
//! devices granted access, so the calling context's device is always granted read-write; with the
//! flag, the allocation's own device is granted too when it is another device of this process
//! (the peer access the driver would enable lazily).
//!
//! State: [`IpcOpens`], the virtual handles opened here by base address; the imports and their
//! mappings are [`Tracking`]'s, which its calls go through.

use crate::log::log_warn;
use crate::owned_alloc::OwnedAllocs;
use crate::registry::VHandle;
use crate::track::{Tracked, Tracking, device_access};
use core::ffi::{c_char, c_uint};
use cuda_abi::*;
use protocol::ipc::IpcHandle;
use protocol::record::AllocationId;
use protocol::ticket::Ticket;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// One virtual handle opened in this process: its base address is its key in [`IpcOpens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcOpen {
    /// The allocation's creator (namespace PID) and ID: what makes two handles the same.
    pub creator_ns_pid: u32,
    pub id: AllocationId,
    /// The size the creator's application asked for (what `cuMemGetAddressRange` answers).
    pub requested: u64,
    /// The reserved and mapped size.
    pub backing: u64,
    /// Opens not yet closed.
    pub opens: u32,
    /// The context current at the first open (its address): its teardown unmaps the mapping,
    /// as the driver's does (`contexts.rs`).
    pub ctx: usize,
}

/// The open virtual IPC handles by base address. Its lock is never held across a driver call,
/// nor while the state lock is taken.
#[derive(Debug, Default)]
pub struct IpcOpens(Mutex<BTreeMap<CUdeviceptr, IpcOpen>>);

impl IpcOpens {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<CUdeviceptr, IpcOpen>> {
        // A panic while holding it leaves the map consistent (single inserts, removes, counts).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open mapping whose requested range holds `ptr`: `(base, open)`.
    pub fn containing(&self, ptr: CUdeviceptr) -> Option<(CUdeviceptr, IpcOpen)> {
        let map = self.lock();
        let (&base, &o) = map.range(..=ptr).next_back()?;
        (ptr - base < o.requested).then_some((base, o))
    }

    /// Counts one more open of the allocation if it is open already: its base.
    fn reopen(&self, creator_ns_pid: u32, id: AllocationId) -> Option<CUdeviceptr> {
        let mut map = self.lock();
        let (&base, o) = map
            .iter_mut()
            .find(|(_, o)| o.creator_ns_pid == creator_ns_pid && o.id == id)?;
        o.opens = o.opens.saturating_add(1);
        Some(base)
    }

    /// Takes out every open made in context `ctx`: `(base, open)`.
    pub(crate) fn take_context(&self, ctx: usize) -> Vec<(CUdeviceptr, IpcOpen)> {
        let mut map = self.lock();
        let bases: Vec<CUdeviceptr> = map
            .iter()
            .filter(|(_, o)| o.ctx == ctx)
            .map(|(&b, _)| b)
            .collect();
        bases
            .into_iter()
            .filter_map(|b| map.remove(&b).map(|o| (b, o)))
            .collect()
    }

    /// How many distinct handles are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// The `CUipcMemHandle` carrying `bytes`.
fn to_driver(bytes: [u8; protocol::ipc::IPC_HANDLE_LEN]) -> CUipcMemHandle {
    CUipcMemHandle {
        reserved: bytes.map(|b| b as c_char),
    }
}

impl IpcOpens {
    /// `cuIpcGetMemHandle`: a virtual handle for a pointer into owned memory, the driver's
    /// (recorded as a blocker) for any other.
    pub fn ipc_get_mem_handle(
        &self,
        t: &Tracking,
        owned: &OwnedAllocs,
        dptr: CUdeviceptr,
    ) -> Tracked<CUipcMemHandle> {
        let Some((base, alloc)) = owned.containing(dptr) else {
            return t.native_ipc_get(dptr);
        };
        let _pass = t.gate.enter();
        // The driver needs a current context for this call (INVALID_CONTEXT otherwise).
        t.real.ctx_device().map_err(|e| e.result)?;
        let id = {
            let mut reg = t.lock();
            let found = reg
                .mapping_at(base)
                .and_then(|h| Some((h, reg.get(h)?)))
                .and_then(|(h, o)| Some((h, o.id()?, o.real?)));
            let Some((handle, id, real)) = found else {
                // An owned allocation is always mapped at its base by a live created object.
                log_warn!("cuIpcGetMemHandle: no allocation recorded at the owned base {base:#x}");
                return Err(CUresult::ERROR_INVALID_VALUE);
            };
            // Shared from its first handle on: its descriptor goes into the export cache, where
            // openers fetch it (later handles of the same allocation find it there).
            if !t.exports.contains(&id) {
                t.share_creation(&mut reg, handle, real, 0)?;
            }
            id
        };
        let handle = IpcHandle {
            creator_ns_pid: t.config.ns_pid,
            id,
            offset: dptr - base,
            requested: alloc.requested,
            backing: alloc.backing,
        };
        Ok(to_driver(handle.encode()))
    }

    /// `cuIpcOpenMemHandle_v2`: a virtual handle is imported from its creator and mapped; a
    /// driver's handle goes to the driver.
    pub fn ipc_open_mem_handle(
        &self,
        t: &Tracking,
        handle: CUipcMemHandle,
        flags: c_uint,
    ) -> Tracked<CUdeviceptr> {
        let bytes = handle.reserved.map(|b| b as u8);
        if !IpcHandle::is_ours(&bytes) {
            return t.native_ipc_open(handle, flags);
        }
        if flags & !ipc_flags::LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        let virt = IpcHandle::decode(&bytes).map_err(|e| {
            log_warn!("cuIpcOpenMemHandle: refused a malformed cuinterpose IPC handle: {e}");
            CUresult::ERROR_INVALID_VALUE
        })?;
        // INVALID_CONTEXT (or NOT_INITIALIZED) without a current context: the driver's code.
        let device = t.real.ctx_device().map_err(|e| e.result)?;
        let ctx = t.real.ctx_current().map_err(|e| e.result)? as usize;
        if virt.creator_ns_pid == t.config.ns_pid {
            // r580 refuses to open a handle in the process that made it, with this code.
            return Err(CUresult::ERROR_INVALID_CONTEXT);
        }
        if let Some(base) = self.reopen(virt.creator_ns_pid, virt.id) {
            return Ok(base);
        }
        let ticket = Ticket {
            creator_ns_pid: virt.creator_ns_pid,
            id: virt.id,
            size: virt.backing,
            // An IPC handle names memory, never a multicast object.
            multicast: false,
        };
        let imported = t.import_ticket(&ticket)?;
        let base = self.map_ipc_import(t, imported, virt.backing, device, flags)?;
        let mut opens = self.lock();
        if let Some((&first, o)) = opens
            .iter_mut()
            .find(|(_, o)| o.creator_ns_pid == virt.creator_ns_pid && o.id == virt.id)
        {
            // Another thread opened the same handle meanwhile: one mapping per allocation.
            o.opens = o.opens.saturating_add(1);
            drop(opens);
            self.unmap_ipc_range(t, base, virt.backing as usize, true);
            return Ok(first);
        }
        opens.insert(
            base,
            IpcOpen {
                creator_ns_pid: virt.creator_ns_pid,
                id: virt.id,
                requested: virt.requested,
                backing: virt.backing,
                opens: 1,
                ctx,
            },
        );
        Ok(base)
    }

    /// Reserves `backing` bytes, maps the import there (the mapping then holds it: its handle is
    /// released) and grants the calling context's device read-write access, and the allocation's
    /// own device too with `LAZY_ENABLE_PEER_ACCESS`. The range's base; on failure nothing is left.
    fn map_ipc_import(
        &self,
        t: &Tracking,
        imported: VHandle,
        backing: u64,
        device: CUdevice,
        flags: c_uint,
    ) -> Tracked<CUdeviceptr> {
        let backing = usize::try_from(backing).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        let undo_import = |what: &str| {
            if let Err(e) = t.mem_release(imported) {
                log_warn!("cuIpcOpenMemHandle undo ({what}): the import was not released: {e:?}");
            }
        };
        let base = match t.mem_address_reserve(backing, 0, 0, 0) {
            Ok(base) => base,
            Err(e) => {
                undo_import("reserve");
                return Err(e);
            }
        };
        if let Err(e) = t.mem_map(base, backing, 0, imported, 0) {
            self.unmap_ipc_range(t, base, backing, false);
            undo_import("map");
            return Err(e);
        }
        // The mapping holds the import from here on: the application has no handle to release.
        undo_import("mapped");
        let mut access = vec![device_access(device, access_flags::PROT_READWRITE)];
        if flags & ipc_flags::LAZY_ENABLE_PEER_ACCESS != 0
            && let Some(home) = self.home_device(t, imported)
            && home != device
        {
            access.push(device_access(home, access_flags::PROT_READWRITE));
        }
        if let Err(e) = t.mem_set_access(base, backing, &access) {
            self.unmap_ipc_range(t, base, backing, true);
            return Err(e);
        }
        Ok(base)
    }

    /// Undoes [`IpcOpens::map_ipc_import`]'s range: unmapped (when `mapped`) and freed.
    fn unmap_ipc_range(&self, t: &Tracking, base: CUdeviceptr, backing: usize, mapped: bool) {
        if mapped && let Err(e) = t.mem_unmap(base, backing) {
            log_warn!("cuIpcOpenMemHandle undo: cuMemUnmap failed: {e:?}");
        }
        if let Err(e) = t.mem_address_free(base, backing) {
            log_warn!("cuIpcOpenMemHandle undo: cuMemAddressFree failed: {e:?}");
        }
    }

    /// The device an imported allocation lives on, when it is a device of this process.
    fn home_device(&self, t: &Tracking, imported: VHandle) -> Option<CUdevice> {
        let props = t.lock().get(imported)?.props;
        let count = t.real.device_count().ok()?;
        (props.location_type == location_type::DEVICE && (0..count).contains(&props.location_id))
            .then_some(props.location_id)
    }

    /// `cuIpcCloseMemHandle`: one open fewer of a virtual handle, unmapped and freed on the last;
    /// the driver's for any other address.
    pub fn ipc_close_mem_handle(&self, t: &Tracking, dptr: CUdeviceptr) -> Tracked {
        // The last open leaves the map before the unmap, so that a concurrent open of the same
        // handle maps it anew instead of counting a mapping that is going away.
        let last = {
            let mut opens = self.lock();
            match opens.get_mut(&dptr) {
                None => {
                    drop(opens);
                    return t.native_ipc_close(dptr);
                }
                Some(o) if o.opens > 1 => {
                    o.opens -= 1;
                    return Ok(());
                }
                Some(_) => opens.remove(&dptr),
            }
        };
        let Some(last) = last else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        let size = usize::try_from(last.backing).map_err(|_| CUresult::ERROR_INVALID_VALUE)?;
        if let Err(e) = t.mem_unmap(dptr, size) {
            // Still mapped: the open stays as it was, and the application may retry.
            self.lock().insert(dptr, last);
            return Err(e);
        }
        if let Err(e) = t.mem_address_free(dptr, size) {
            // The mapping is gone, which is what the application asked for.
            log_warn!("cuIpcCloseMemHandle: the range at {dptr:#x} was not freed: {e:?}");
        }
        Ok(())
    }
}
