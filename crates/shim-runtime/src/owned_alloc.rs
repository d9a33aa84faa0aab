//! `cuMemAlloc` owned by the shim: each allocation is made of the same tracked VMM calls an
//! application would make itself (`cuMemCreate` with POSIX descriptors, `cuMemAddressReserve`,
//! `cuMemMap`, `cuMemSetAccess` for the context's device, then `cuMemRelease` of the handle, which
//! the mapping keeps alive). It is then a creation like the application's own: the capture path
//! saves it through carriers and releases it before the native checkpoint, and rebuild recreates
//! it at the same address, with no code of its own. It is exported (and so holds a descriptor in
//! the shim's export cache) only when something shares it.
//!
//! What only this module knows is the size the application asked for, apart from the
//! granularity-rounded backing: `cuMemGetAddressRange` answers with the requested size, as it does
//! for native `cuMemAlloc` memory, and `cuMemFree` finds the whole reservation to undo.
//!
//! State: [`OwnedAllocs`], the owned allocations by base address; the allocations themselves are
//! creations of [`Tracking`], which its calls go through. The runtime routes the calls that may
//! concern another job's pointer (`cuMemFree`, the retain, pointer attributes, address ranges).

use crate::log::log_warn;
use crate::track::{Tracked, Tracking, device_access};
use cuda::VirtualHandle;
use cuda_abi::*;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// One owned allocation: its base address is its key in [`OwnedAllocs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedAlloc {
    /// The size the application asked for.
    pub requested: u64,
    /// The reserved and mapped size (the request rounded up to the granularity).
    pub backing: u64,
    /// The context current at the allocation (its address): its teardown frees the memory, as
    /// the driver frees a context's cuMemAlloc memory (`contexts.rs`).
    pub ctx: usize,
}

/// An answer of `cuPointerGetAttribute(s)` the shim gives instead of the driver's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointerValue {
    /// A device address (`CUdeviceptr`, 8 bytes).
    Address(CUdeviceptr),
    /// A `size_t`.
    Size(usize),
    /// A boolean the driver answered false: its width is not documented, so the hook sets the
    /// lowest byte of what the driver wrote as zero, which reads as true at any width.
    True,
}

/// The owned `cuMemAlloc` allocations by base address. Its lock is never held across a driver
/// call, nor while the state lock is taken.
#[derive(Debug, Default)]
pub struct OwnedAllocs(Mutex<BTreeMap<CUdeviceptr, OwnedAlloc>>);

impl OwnedAllocs {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<CUdeviceptr, OwnedAlloc>> {
        // A panic while holding it leaves the map consistent (single inserts and removes).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The allocation whose requested range holds `ptr`: `(base, allocation)`.
    pub fn containing(&self, ptr: CUdeviceptr) -> Option<(CUdeviceptr, OwnedAlloc)> {
        let map = self.lock();
        let (&base, &a) = map.range(..=ptr).next_back()?;
        (ptr - base < a.requested).then_some((base, a))
    }

    /// The allocation based at `base`.
    pub fn at(&self, base: CUdeviceptr) -> Option<OwnedAlloc> {
        self.lock().get(&base).copied()
    }

    fn insert(&self, base: CUdeviceptr, a: OwnedAlloc) {
        self.lock().insert(base, a);
    }

    fn remove(&self, base: CUdeviceptr) -> Option<OwnedAlloc> {
        self.lock().remove(&base)
    }

    /// How many allocations are owned.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The allocations made in context `ctx`: `(base, allocation)`.
    pub(crate) fn of_context(&self, ctx: usize) -> Vec<(CUdeviceptr, OwnedAlloc)> {
        self.lock()
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&b, &a)| (b, a))
            .collect()
    }

    /// Takes out every allocation made in context `ctx`: `(base, allocation)`.
    pub(crate) fn take_context(&self, ctx: usize) -> Vec<(CUdeviceptr, OwnedAlloc)> {
        let mut map = self.lock();
        let bases: Vec<CUdeviceptr> = map
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&b, _)| b)
            .collect();
        bases
            .into_iter()
            .filter_map(|b| map.remove(&b).map(|a| (b, a)))
            .collect()
    }
}

/// The property of an owned allocation on `device`: pinned device memory exportable to a POSIX
/// descriptor, so that it can be shared and saved like any created allocation, and RDMA-capable
/// where VMM memory can be (cuMemAlloc memory is implicitly; gdrcopy and UCX rely on it).
fn alloc_prop(device: CUdevice, rdma: bool) -> CUmemAllocationProp {
    let mut prop = CUmemAllocationProp {
        type_: allocation_type::PINNED,
        requestedHandleTypes: handle_type::POSIX_FILE_DESCRIPTOR,
        ..CUmemAllocationProp::default()
    };
    prop.location.type_ = location_type::DEVICE;
    prop.location.id = device;
    prop.allocFlags.gpuDirectRDMACapable = u8::from(rdma);
    prop
}

impl OwnedAllocs {
    /// `cuMemAlloc` on owned VMM memory in the current context's device (under
    /// [`crate::config::AllocMode::Vmm`]), accessible from it and from `peers_of` the context (the devices of
    /// the peer contexts it enabled access to, which reach cuMemAlloc memory implicitly).
    pub fn mem_alloc(
        &self,
        t: &Tracking,
        bytes: usize,
        peers_of: impl FnOnce(usize) -> Vec<CUdevice>,
    ) -> Tracked<CUdeviceptr> {
        // The driver refuses a zero-byte cuMemAlloc with INVALID_VALUE; so does this.
        if bytes == 0 {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // Without a current context the driver answers INVALID_CONTEXT (or NOT_INITIALIZED):
        // its own code, unchanged.
        let device = t.real.ctx_device().map_err(|e| e.result)?;
        let ctx = t.real.ctx_current().map_err(|e| e.result)? as usize;
        // A driver that cannot say is taken as not supporting it: the creation then still works.
        let rdma = t
            .real
            .device_attribute(
                device_attribute::GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                device,
            )
            .is_ok_and(|v| v == 1);
        let prop = alloc_prop(device, rdma);
        let granularity = t
            .real
            .mem_allocation_granularity(&prop, granularity_flags::MINIMUM)
            .map_err(|e| e.result)?;
        let backing = bytes
            .checked_next_multiple_of(granularity.max(1))
            .ok_or(CUresult::ERROR_OUT_OF_MEMORY)?;
        let handle = t.mem_create(backing, &prop, 0)?;
        let base = match t.mem_address_reserve(backing, granularity, 0, 0) {
            Ok(base) => base,
            Err(e) => {
                self.undo_alloc(t, handle, None, false);
                return Err(e);
            }
        };
        if let Err(e) = t.mem_map(base, backing, 0, handle, 0) {
            self.undo_alloc(t, handle, Some((base, backing)), false);
            return Err(e);
        }
        let access: Vec<CUmemAccessDesc> = std::iter::once(device)
            .chain(peers_of(ctx).into_iter().filter(|&d| d != device))
            .map(|d| device_access(d, access_flags::PROT_READWRITE))
            .collect();
        if let Err(e) = t.mem_set_access(base, backing, &access) {
            self.undo_alloc(t, handle, Some((base, backing)), true);
            return Err(e);
        }
        // The mapping holds the allocation from here on, as the driver's own cuMemAlloc memory
        // has no handle for the application to release.
        if let Err(e) = t.mem_release(handle) {
            log_warn!("cuMemAlloc: the handle of an owned allocation was not released: {e:?}");
        }
        self.insert(
            base,
            OwnedAlloc {
                requested: bytes as u64,
                backing: backing as u64,
                ctx,
            },
        );
        Ok(base)
    }

    /// Undoes a partly made owned allocation; each step is logged if it fails, since the
    /// application sees the error of the step that failed.
    fn undo_alloc(
        &self,
        t: &Tracking,
        handle: VirtualHandle,
        reserved: Option<(CUdeviceptr, usize)>,
        mapped: bool,
    ) {
        if let Some((base, size)) = reserved {
            if mapped && let Err(e) = t.mem_unmap(base, size) {
                log_warn!("cuMemAlloc undo: cuMemUnmap failed: {e:?}");
            }
            if let Err(e) = t.mem_address_free(base, size) {
                log_warn!("cuMemAlloc undo: cuMemAddressFree failed: {e:?}");
            }
        }
        if let Err(e) = t.mem_release(handle) {
            log_warn!("cuMemAlloc undo: cuMemRelease failed: {e:?}");
        }
    }

    /// `cuMemFree` of the owned allocation `a` at `dptr`, synchronised first, as the driver's
    /// cuMemFree is.
    pub fn mem_free(&self, t: &Tracking, dptr: CUdeviceptr, a: OwnedAlloc) -> Tracked {
        // cuMemFree waits for the device's work on the memory; an unmap does not.
        t.real.ctx_synchronize().map_err(|e| e.result)?;
        t.mem_unmap(dptr, a.backing as usize)?;
        self.remove(dptr);
        t.mem_address_free(dptr, a.backing as usize)?;
        Ok(())
    }
}
