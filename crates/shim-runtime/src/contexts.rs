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

use crate::log::{log_debug, log_warn};
use crate::runtime::Runtime;
use crate::track::Tracked;
use cuda_abi::*;
use std::collections::HashMap;
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

impl Runtime {
    /// `cuDevicePrimaryCtxRetain`: counted.
    pub fn primary_ctx_retain(&self, device: CUdevice) -> Tracked<CUcontext> {
        let ctx = self.real.primary_ctx_retain(device).map_err(|e| e.result)?;
        let mut refs = self.primary.lock();
        let entry = refs.entry(device).or_insert((ctx as usize, 0));
        *entry = (ctx as usize, entry.1.saturating_add(1));
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxRelease`: the last counted release tears the context's owned memory
    /// down.
    pub fn primary_ctx_release(&self, device: CUdevice) -> Tracked {
        self.real
            .primary_ctx_release(device)
            .map_err(|e| e.result)?;
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
            self.reclaim_context(ctx);
        }
        Ok(())
    }

    /// `cuCtxDestroy`: the context's owned memory is torn down after the driver destroyed it.
    pub fn ctx_destroy(&self, ctx: CUcontext) -> Tracked {
        self.real.ctx_destroy(ctx).map_err(|e| e.result)?;
        self.reclaim_context(ctx as usize);
        Ok(())
    }

    /// Unmaps and frees the owned allocations and IPC mappings made in context `ctx`; each
    /// failure is logged, since the application's call succeeded.
    fn reclaim_context(&self, ctx: usize) {
        let allocs = self.owned.take_context(ctx);
        let opens = self.ipc.take_context(ctx);
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
            if let Err(e) = self.mem_unmap(base, size) {
                log_warn!("context teardown: {what} at {base:#x} not unmapped: {e:?}");
                continue;
            }
            if let Err(e) = self.mem_address_free(base, size) {
                log_warn!("context teardown: the range of {what} at {base:#x} not freed: {e:?}");
            }
        }
    }
}
