//! Context teardown for the memory the shim owns. The driver frees a context's `cuMemAlloc`
//! memory and closes its IPC mappings when the context goes (`cuCtxDestroy`, the last
//! `cuDevicePrimaryCtxRelease` of a primary context); VMM mappings outlive contexts, so the shim
//! does the same for what it made in place of those (`owned_alloc.rs`, `ipc.rs`), after the
//! driver's call succeeded: unmapped and the range freed through the tracked calls, so that the
//! records follow. No synchronisation: the context, and the work it could run, is gone.
//!
//! Primary contexts are counted per device from the application's retains and releases that
//! pass through the shim (the shim's own retains are its runtime's, never counted); a release
//! without a counted retain frees nothing, since the shim cannot tell it is the last.
//!
//! Peer access: `cuCtxEnablePeerAccess` makes a context's cuMemAlloc memory reachable from the
//! peer context's device implicitly, VMM memory only through `cuMemSetAccess`. So the shim records
//! each enabled (context, peer device) and grants the peer device read-write access to every owned
//! allocation of that context, present (at the enable) and future (at each `cuMemAlloc`); the
//! grants are recorded access like any other, so rebuild replays them. `cuCtxDisablePeerAccess`
//! takes them back (`PROT_NONE`). The peer's device is known for primary contexts the application
//! retained through the shim (the usual case: the runtime API's); for another peer the driver's
//! answer stands and nothing is granted (logged).
//!
//! State: [`Contexts`], the primary context references and the peer grants. A context's teardown
//! reaches the owned allocations and the IPC opens, which the runtime passes in.

use crate::ipc::IpcOpens;
use crate::log::{log_debug, log_warn};
use crate::owned_alloc::OwnedAllocs;
use crate::track::{Tracked, Tracking, device_access};
use cuda_abi::*;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

/// The application's primary context references by device: the context and its count.
#[derive(Debug, Default)]
pub struct PrimaryRefs(Mutex<HashMap<CUdevice, (usize, u32)>>);

impl PrimaryRefs {
    fn lock(&self) -> MutexGuard<'_, HashMap<CUdevice, (usize, u32)>> {
        // A panic while holding it leaves the map consistent (single inserts and counts).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PrimaryRefs {
    /// The device whose primary context is `ctx`, if the application retained it through us.
    fn device_of(&self, ctx: usize) -> Option<CUdevice> {
        self.lock()
            .iter()
            .find(|(_, (c, _))| *c == ctx)
            .map(|(&d, _)| d)
    }
}

/// The peer devices granted access to each context's owned allocations (by context address).
#[derive(Debug, Default)]
pub struct PeerGrants(Mutex<HashMap<usize, BTreeSet<CUdevice>>>);

impl PeerGrants {
    fn lock(&self) -> MutexGuard<'_, HashMap<usize, BTreeSet<CUdevice>>> {
        // A panic while holding it leaves the map consistent (single inserts and removes).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The peer devices of context `ctx`.
    pub(crate) fn of(&self, ctx: usize) -> Vec<CUdevice> {
        self.lock()
            .get(&ctx)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// The contexts job: the application's primary context references and the peer access each
/// context enabled; the teardown of a context's owned memory goes to the owned allocations and
/// the IPC opens, which the runtime passes in.
#[derive(Debug, Default)]
pub struct Contexts {
    primary: PrimaryRefs,
    peers: PeerGrants,
}

impl Contexts {
    /// The peer devices of context `ctx` (granted access to its owned allocations).
    pub(crate) fn peers_of(&self, ctx: usize) -> Vec<CUdevice> {
        self.peers.of(ctx)
    }

    /// `cuCtxEnablePeerAccess`: the peer device is granted access to the current context's
    /// owned allocations, now and at each later `cuMemAlloc` in it.
    pub fn ctx_enable_peer_access(
        &self,
        t: &Tracking,
        owned: &OwnedAllocs,
        peer: CUcontext,
        flags: u32,
    ) -> Tracked {
        t.real
            .ctx_enable_peer_access(peer, flags)
            .map_err(|e| e.result)?;
        self.regrant_peer(t, owned, peer as usize, access_flags::PROT_READWRITE)
    }

    /// `cuCtxDisablePeerAccess`: the grants of the enable are taken back.
    pub fn ctx_disable_peer_access(
        &self,
        t: &Tracking,
        owned: &OwnedAllocs,
        peer: CUcontext,
    ) -> Tracked {
        t.real.ctx_disable_peer_access(peer).map_err(|e| e.result)?;
        self.regrant_peer(t, owned, peer as usize, access_flags::PROT_NONE)
    }

    /// Records (or forgets, for PROT_NONE) the peer device of `peer` for the current context and
    /// sets that access on the context's owned allocations. The driver's call succeeded, so a
    /// failure here is logged, not returned.
    fn regrant_peer(&self, t: &Tracking, owned: &OwnedAllocs, peer: usize, flags: u32) -> Tracked {
        let ctx = match t.real.ctx_current() {
            Ok(ctx) => ctx as usize,
            Err(e) => {
                log_warn!("peer access: no current context after the driver's call: {e}");
                return Ok(());
            }
        };
        let Some(device) = self.primary.device_of(peer) else {
            log_warn!(
                "peer access to context {peer:#x}: not a primary context retained through the \
                 shim, so its device is unknown; owned cuMemAlloc memory is not granted to it"
            );
            return Ok(());
        };
        {
            let mut peers = self.peers.lock();
            let set = peers.entry(ctx).or_default();
            if flags == access_flags::PROT_NONE {
                set.remove(&device);
            } else {
                set.insert(device);
            }
        }
        for (base, a) in owned.of_context(ctx) {
            if let Err(e) =
                t.mem_set_access(base, a.backing as usize, &[device_access(device, flags)])
            {
                log_warn!(
                    "peer access: device {device} not granted {flags:#x} on {base:#x}: {e:?}"
                );
            }
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxRetain`: counted.
    pub fn primary_ctx_retain(&self, t: &Tracking, device: CUdevice) -> Tracked<CUcontext> {
        let ctx = t.real.primary_ctx_retain(device).map_err(|e| e.result)?;
        let mut refs = self.primary.lock();
        let entry = refs.entry(device).or_insert((ctx as usize, 0));
        *entry = (ctx as usize, entry.1.saturating_add(1));
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxRelease`: the last counted release tears the context's owned memory
    /// down.
    pub fn primary_ctx_release(
        &self,
        t: &Tracking,
        owned: &OwnedAllocs,
        ipc: &IpcOpens,
        device: CUdevice,
    ) -> Tracked {
        t.real.primary_ctx_release(device).map_err(|e| e.result)?;
        let last = {
            let mut refs = self.primary.lock();
            match refs.get_mut(&device) {
                Some((ctx, count)) if *count <= 1 => {
                    let ctx = *ctx;
                    refs.remove(&device);
                    Some(ctx)
                }
                Some((_, count)) => {
                    *count -= 1;
                    None
                }
                None => None,
            }
        };
        if let Some(ctx) = last {
            self.reclaim_context(t, owned, ipc, ctx);
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxReset`: the driver destroyed every allocation of the device's primary
    /// context (which stays retained), so its owned memory is torn down too.
    pub fn primary_ctx_reset(
        &self,
        t: &Tracking,
        owned: &OwnedAllocs,
        ipc: &IpcOpens,
        device: CUdevice,
    ) -> Tracked {
        t.real.primary_ctx_reset(device).map_err(|e| e.result)?;
        let ctx = self.primary.lock().get(&device).map(|(ctx, _)| *ctx);
        match ctx {
            Some(ctx) => self.reclaim_context(t, owned, ipc, ctx),
            None => log_warn!(
                "cuDevicePrimaryCtxReset of device {device}, whose primary context the shim did \
                 not see retained: its owned memory is kept"
            ),
        }
        Ok(())
    }

    /// `cuCtxDestroy`: the context's owned memory is torn down after the driver destroyed it.
    pub fn ctx_destroy(
        &self,
        t: &Tracking,
        owned: &OwnedAllocs,
        ipc: &IpcOpens,
        ctx: CUcontext,
    ) -> Tracked {
        t.real.ctx_destroy(ctx).map_err(|e| e.result)?;
        self.reclaim_context(t, owned, ipc, ctx as usize);
        Ok(())
    }

    /// Unmaps and frees the owned allocations and IPC mappings made in context `ctx`; each
    /// failure is logged, since the application's call succeeded.
    fn reclaim_context(&self, t: &Tracking, owned: &OwnedAllocs, ipc: &IpcOpens, ctx: usize) {
        // Its peer grants go with it (the driver forgets a destroyed context's peer access).
        self.peers.lock().remove(&ctx);
        let allocs = owned.take_context(ctx);
        let opens = ipc.take_context(ctx);
        let ranges = allocs
            .iter()
            .map(|(base, a)| (*base, a.backing, "cuMemAlloc memory"))
            .chain(
                opens
                    .iter()
                    .map(|(base, o)| (*base, o.backing, "an IPC mapping")),
            );
        for (base, backing, what) in ranges {
            let size = backing as usize;
            log_debug!("context {ctx:#x} ended: {what} at {base:#x} freed");
            if let Err(e) = t.mem_unmap(base, size) {
                log_warn!("context teardown: {what} at {base:#x} not unmapped: {e:?}");
                continue;
            }
            if let Err(e) = t.mem_address_free(base, size) {
                log_warn!("context teardown: the range of {what} at {base:#x} not freed: {e:?}");
            }
        }
    }
}
