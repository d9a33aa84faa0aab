//! The runtime of one process: a thin composition of the shim's jobs, each with its own state
//! (module docs say which):
//!
//! - [`Tracking`] (`track.rs`, `multicast.rs`): the registry of what the application holds,
//!   behind the state lock, the tracked-call gate, the export cache, the driver table and
//!   [`Config`]; the tracked VMM and multicast calls, Load's rebuild (`store/rebuild.rs`) and
//!   the multicast capture steps.
//! - [`crate::owned_alloc::OwnedAllocs`], [`crate::ipc::IpcOpens`], [`Contexts`],
//!   [`crate::unowned::UnownedAllocs`]: `cuMemAlloc` on owned VMM, legacy IPC of it, context
//!   teardown and peer grants, and device memory the shim does not own.
//! - [`Capture`] (`capture.rs`; its phases in `phases.rs`, its byte stores in `store/`) and
//!   [`Drain`] (`drain.rs`): the capture's state between phase requests, and the gates and
//!   synchronisations of Hold, Drain and Admit.
//! - The control server's state (connections, the capture lease, the identity HELLO reports),
//!   which `server.rs` serves.
//!
//! `Runtime`'s methods are the shim's entry points: each is handed to the job that owns its
//! state, with the other jobs it reaches passed in (`handed_to!`, and the routing of the calls
//! whose pointer or context may be several jobs'). The process-global instance and its start are
//! `instance.rs`.

use crate::Real;
use crate::capture::Capture;
use crate::config::{AllocMode, Config};
use crate::contexts::Contexts;
use crate::drain::Drain;
use crate::lease::ServerState;
use crate::owned_alloc::PointerValue;
use crate::registry::{Registry, VHandle};
use crate::track::{ExportTo, FetchError, Tracked, Tracking};
use crate::unowned::UnownedKind;
use core::ffi::c_uint;
use cuda::{DriverHandle, ForeignPtr, VirtualHandle};
use cuda_abi::*;
use protocol::message::CopyStats;
use protocol::record::AllocationId;
use protocol::ticket::Ticket;
use protocol::{Request, Response};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, MutexGuard};

/// Everything the runtime of one process holds.
#[derive(Debug)]
pub struct Runtime {
    /// The registry and the tracked calls that keep it (track.rs, multicast.rs).
    pub(crate) tracking: Tracking,
    /// The capture's state between its phase requests (capture.rs; the phases are phases.rs);
    /// only the control worker uses it.
    pub(crate) capture: Capture,
    /// The drain: the submission gate and the synchronisation of each device (drain.rs).
    pub(crate) drain: Drain,
    /// The `cuMemAlloc` allocations the shim made on VMM (owned_alloc.rs).
    pub(crate) owned: crate::owned_alloc::OwnedAllocs,
    /// Device memory the driver made and the shim does not own, for INSPECT.
    pub(crate) unowned: crate::unowned::UnownedAllocs,
    /// The virtual legacy IPC handles opened here (ipc.rs).
    pub(crate) ipc: crate::ipc::IpcOpens,
    /// The application's primary context references and peer grants (contexts.rs).
    pub(crate) contexts: Contexts,
    /// The control server's state: its connections and the capture lease (lease.rs; served by
    /// server.rs).
    pub(crate) server: ServerState,
}

impl Runtime {
    /// A runtime over `real`; nothing is bound or started until [`Runtime::serve`].
    pub fn new(real: Real, config: Config) -> Arc<Runtime> {
        // An unknown version is reported as 0 (HELLO); nothing depends on it.
        let driver_version = real.driver_version().unwrap_or(0);
        let copy = config.copy;
        Arc::new(Runtime {
            tracking: Tracking::new(real, config),
            capture: Capture::new(copy),
            drain: Drain::new(submission_gate()),
            owned: crate::owned_alloc::OwnedAllocs::default(),
            unowned: crate::unowned::UnownedAllocs::default(),
            ipc: crate::ipc::IpcOpens::default(),
            contexts: Contexts::default(),
            server: ServerState::new(driver_version),
        })
    }

    /// The registry's lock ([`Tracking::lock`]).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Registry> {
        self.tracking.lock()
    }

    /// Runs one phase request (on the control worker); `file` is the data file that came with
    /// SaveTo or LoadFrom.
    pub fn run_phase(&self, request: Request, file: Option<OwnedFd>) -> Response {
        self.capture
            .run_phase(&self.tracking, &self.drain, request, file)
    }

    /// Figures of the last copying phase.
    pub fn last_stats(&self) -> CopyStats {
        self.capture.last_stats()
    }

    pub fn config(&self) -> &Config {
        &self.tracking.config
    }

    /// The records INSPECT returns.
    pub fn inspect(&self) -> protocol::ProcessRecord {
        let in_flight = self.tracking.gate.in_flight();
        let mut record = self.lock().report(self.tracking.config.ns_pid, in_flight);
        record.unowned = self.unowned.summary();
        if let Some((entry, count)) = crate::gate::ungated() {
            record
                .blockers
                .push(protocol::Blocker::UngatedSubmission { entry, count });
        }
        let gate = self.drain.submissions().state();
        record.gate = protocol::GateRecord {
            closed: gate.closed,
            waiting: gate.waiting,
            inside: gate.inside,
        };
        record
    }
}

/// Hands each listed call to the job that owns its state, unchanged: the shim's entry points (and
/// the tests') are `Runtime`'s, the work and the state are the job's.
macro_rules! handed_to {
    ($job:ident: $( $(#[$doc:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; )*) => {
        impl Runtime {
            $(
                $(#[$doc])*
                pub fn $name(&self $(, $arg: $ty)*) -> $ret {
                    self.$job.$name($($arg),*)
                }
            )*
        }
    };
}

handed_to! { tracking:
    /// `cuMemCreate` ([`Tracking::mem_create`]).
    fn mem_create(&self, size: usize, prop: &CUmemAllocationProp, flags: u64) -> Tracked<VHandle>;
    /// `cuMemRelease`.
    fn mem_release(&self, handle: VHandle) -> Tracked;
    /// `cuMemMap`.
    fn mem_map(&self, ptr: CUdeviceptr, size: usize, offset: usize, handle: VHandle, flags: u64) -> Tracked;
    /// `cuMemUnmap`.
    fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Tracked;
    /// `cuMemSetAccess`.
    fn mem_set_access(&self, ptr: CUdeviceptr, size: usize, descs: &[CUmemAccessDesc]) -> Tracked;
    /// `cuMemAddressReserve`.
    fn mem_address_reserve(&self, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) -> Tracked<CUdeviceptr>;
    /// `cuMemAddressFree`.
    fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Tracked;
    /// `cuMemRetainAllocationHandle` of VMM memory.
    fn mem_retain(&self, addr: CUdeviceptr) -> Tracked<VHandle>;
    /// The driver handle behind a virtual one.
    fn driver_handle(&self, handle: VHandle) -> Option<DriverHandle>;
    /// `cuMemGetAllocationPropertiesFromHandle`.
    fn mem_get_props(&self, handle: VHandle) -> Tracked<CUmemAllocationProp>;
    /// `cuMemExportToShareableHandle`.
    fn mem_export(&self, handle: VHandle, handle_type: u32, flags: u64, to: ExportTo) -> Tracked<Option<OwnedFd>>;
    /// A descriptor of allocation `id` from its creator's socket.
    fn fetch_fd(&self, creator_ns_pid: u32, id: AllocationId) -> Result<OwnedFd, FetchError>;
    /// `cuMemImportFromShareableHandle` of a handle type other than a POSIX descriptor.
    fn mem_import_other(&self, os_handle: ForeignPtr, handle_type: u32) -> Tracked<VHandle>;
    /// `cuMemImportFromShareableHandle` of a POSIX descriptor (a ticket or the driver's own).
    fn mem_import_fd(&self, app_fd: BorrowedFd<'_>) -> Tracked<VHandle>;
    /// The import of a ticket.
    fn import_ticket(&self, ticket: &Ticket) -> Result<VHandle, CUresult>;
    /// `cuMemFree` of memory the shim does not own.
    fn mem_free(&self, dptr: CUdeviceptr) -> Tracked;
    /// `cuMulticastCreate`.
    fn multicast_create(&self, prop: &CUmulticastObjectProp) -> Tracked<VHandle>;
    /// `cuMulticastAddDevice`.
    fn multicast_add_device(&self, handle: VHandle, dev: CUdevice) -> Tracked;
    /// `cuMulticastBindMem`.
    fn multicast_bind_mem(&self, mc: VHandle, mc_offset: usize, mem: VHandle, mem_offset: usize, size: usize, flags: u64) -> Tracked;
    /// `cuMulticastBindMem_v2` (the driver's eight arguments).
    #[allow(clippy::too_many_arguments)]
    fn multicast_bind_mem_v2(&self, mc: VHandle, dev: CUdevice, mc_offset: usize, mem: VHandle, mem_offset: usize, size: usize, flags: u64) -> Tracked;
    /// `cuMulticastBindAddr`.
    fn multicast_bind_addr(&self, mc: VHandle, mc_offset: usize, ptr: CUdeviceptr, size: usize, flags: u64) -> Tracked;
    /// `cuMulticastBindAddr_v2`.
    fn multicast_bind_addr_v2(&self, mc: VHandle, dev: CUdevice, mc_offset: usize, ptr: CUdeviceptr, size: usize, flags: u64) -> Tracked;
    /// `cuMulticastUnbind`.
    fn multicast_unbind(&self, mc: VHandle, dev: CUdevice, mc_offset: usize, size: usize) -> Tracked;
}

/// The calls whose state is several jobs': routed to the job that owns the pointer or the
/// context, with the other jobs it reaches passed in.
impl Runtime {
    /// `cuMemAlloc`: on owned VMM memory in the current context's device, or the driver's own
    /// with [`AllocMode::Native`] (counted as unowned).
    pub fn mem_alloc(&self, bytes: usize) -> Tracked<CUdeviceptr> {
        if self.tracking.config.alloc == AllocMode::Native {
            return self.unowned.driver_mem_alloc(&self.tracking.real, bytes);
        }
        self.owned
            .mem_alloc(&self.tracking, bytes, |ctx| self.contexts.peers_of(ctx))
    }

    /// `cuMemFree` of an owned allocation, or the driver's own of any other pointer (which
    /// unowned memory then forgets).
    pub fn mem_free_any(&self, dptr: CUdeviceptr) -> Tracked {
        if let Some(a) = self.owned.at(dptr) {
            return self.owned.mem_free(&self.tracking, dptr, a);
        }
        self.tracking.mem_free(dptr)?;
        self.unowned.note_unowned_freed(dptr);
        Ok(())
    }

    /// `cuMemRetainAllocationHandle`: refused for owned memory and for opened virtual IPC
    /// handles with the driver's code for cuMemAlloc and IPC memory (INVALID_VALUE), since
    /// libraries (NCCL, torchcomms) pick their sharing path by whether it succeeds; the tracked
    /// retain otherwise.
    pub fn mem_retain_any(&self, addr: CUdeviceptr) -> Tracked<VirtualHandle> {
        if self.owned.containing(addr).is_some() || self.ipc.containing(addr).is_some() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        self.tracking.mem_retain(addr)
    }

    /// What `cuPointerGetAttribute(s)` answers for `attribute` of `ptr` where owned memory, being
    /// VMM, would get another answer from the driver than cuMemAlloc memory does: the range (base
    /// and requested size, as [`Runtime::mem_address_range`]) of owned memory and of its opened
    /// IPC mappings, and legacy-IPC capability of owned memory (the shims serve its IPC). `None`:
    /// the driver's answer stands.
    pub fn pointer_attribute(&self, ptr: CUdeviceptr, attribute: u32) -> Option<PointerValue> {
        use cuda_abi::pointer_attribute as a;
        let owned = self.owned.containing(ptr);
        let (base, requested) = match &owned {
            Some((base, o)) => (*base, o.requested),
            None => {
                let (base, o) = self.ipc.containing(ptr)?;
                (base, o.requested)
            }
        };
        match attribute {
            a::RANGE_START_ADDR => Some(PointerValue::Address(base)),
            a::RANGE_SIZE => Some(PointerValue::Size(requested as usize)),
            a::IS_LEGACY_CUDA_IPC_CAPABLE if owned.is_some() => Some(PointerValue::True),
            _ => None,
        }
    }

    /// `cuMemGetAddressRange`: for owned memory, and for its opened IPC mappings, the base and
    /// the requested size, as the driver answers for its own cuMemAlloc memory and IPC
    /// mappings; the driver's answer otherwise.
    pub fn mem_address_range(&self, dptr: CUdeviceptr) -> Tracked<(CUdeviceptr, usize)> {
        if let Some((base, a)) = self.owned.containing(dptr) {
            return Ok((base, a.requested as usize));
        }
        match self.ipc.containing(dptr) {
            Some((base, o)) => Ok((base, o.requested as usize)),
            None => self
                .tracking
                .real
                .mem_address_range(dptr)
                .map_err(|e| e.result),
        }
    }

    /// `cuIpcGetMemHandle`.
    pub fn ipc_get_mem_handle(&self, dptr: CUdeviceptr) -> Tracked<CUipcMemHandle> {
        self.ipc
            .ipc_get_mem_handle(&self.tracking, &self.owned, dptr)
    }

    /// `cuIpcOpenMemHandle_v2`.
    pub fn ipc_open_mem_handle(
        &self,
        handle: CUipcMemHandle,
        flags: c_uint,
    ) -> Tracked<CUdeviceptr> {
        self.ipc.ipc_open_mem_handle(&self.tracking, handle, flags)
    }

    /// `cuIpcCloseMemHandle`.
    pub fn ipc_close_mem_handle(&self, dptr: CUdeviceptr) -> Tracked {
        self.ipc.ipc_close_mem_handle(&self.tracking, dptr)
    }

    /// `cuCtxEnablePeerAccess`.
    pub fn ctx_enable_peer_access(&self, peer: CUcontext, flags: u32) -> Tracked {
        self.contexts
            .ctx_enable_peer_access(&self.tracking, &self.owned, peer, flags)
    }

    /// `cuCtxDisablePeerAccess`.
    pub fn ctx_disable_peer_access(&self, peer: CUcontext) -> Tracked {
        self.contexts
            .ctx_disable_peer_access(&self.tracking, &self.owned, peer)
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub fn primary_ctx_retain(&self, device: CUdevice) -> Tracked<CUcontext> {
        self.contexts.primary_ctx_retain(&self.tracking, device)
    }

    /// `cuDevicePrimaryCtxRelease`.
    pub fn primary_ctx_release(&self, device: CUdevice) -> Tracked {
        self.contexts
            .primary_ctx_release(&self.tracking, &self.owned, &self.ipc, device)
    }

    /// `cuDevicePrimaryCtxReset`.
    pub fn primary_ctx_reset(&self, device: CUdevice) -> Tracked {
        self.contexts
            .primary_ctx_reset(&self.tracking, &self.owned, &self.ipc, device)
    }

    /// `cuCtxDestroy`.
    pub fn ctx_destroy(&self, ctx: CUcontext) -> Tracked {
        self.contexts
            .ctx_destroy(&self.tracking, &self.owned, &self.ipc, ctx)
    }
}

handed_to! { unowned:
    /// The driver made `bytes` of `kind` at `base`.
    fn note_unowned(&self, kind: UnownedKind, base: CUdeviceptr, bytes: u64) -> ();
    /// The driver freed the allocation at `base`.
    fn note_unowned_freed(&self, base: CUdeviceptr) -> ();
}

/// The submission gate of a runtime: the process's in the library; a fresh one per runtime in unit
/// tests, so that tests running side by side in one process never close each other's.
#[cfg(not(test))]
fn submission_gate() -> &'static crate::gate::SubmissionGate {
    crate::gate::submissions()
}

#[cfg(test)]
fn submission_gate() -> &'static crate::gate::SubmissionGate {
    Box::leak(Box::new(crate::gate::SubmissionGate::new()))
}
