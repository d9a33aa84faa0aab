//! The tracked driver calls: each calls the real driver first and records only what succeeded;
//! a driver error is returned unchanged (PyTorch relies on the exact codes).
//!
//! Locking: a tracked call passes the [`crate::gate::Gate`] (counted in flight), then takes the
//! state lock across its local driver call so that the record follows the driver's order. The
//! calls that can wait for another process run without the state lock: the import of a ticket
//! (its fetch from the creator's socket) and the multicast calls (`multicast.rs`: a bind can wait
//! for the whole team).
//!
//! Import error codes for tickets: a descriptor that starts like a ticket but is malformed
//! (truncated, unsealed, other version, checksum, reserved bytes) gives `CUDA_ERROR_INVALID_VALUE`;
//! a creator that cannot be reached (dead, no socket, broken reply) gives
//! `CUDA_ERROR_INVALID_HANDLE`; a creator that does not know the allocation (released it, or the
//! ticket is stale) gives `CUDA_ERROR_NOT_FOUND`; a creator that refuses us (uid) gives
//! `CUDA_ERROR_NOT_PERMITTED`. Each failure is logged once, as one line.
//!
//! State: [`Tracking`], the tracking job: the registry behind the state lock, the tracked-call
//! gate, the export cache, the driver table and the runtime's [`Config`]. Every other job works
//! on the registry through it.

use crate::Real;
use crate::config::Config;
use crate::exports::ExportCache;
use crate::fdutil::{self, Classified};
use crate::gate::Gate;
use crate::log::{log_debug, log_warn};
use crate::registry::multicast::McInfo;
use crate::registry::{Dead, Kind, Registry, UNKNOWN_PROPS, VHandle, record_props};
use core::ffi::c_uint;
use cuda::{CudaError, DriverHandle, ForeignPtr};
use cuda_abi::*;
use protocol::record::{AccessRecord, AllocationId, ReservationRecord};
use protocol::ticket::Ticket;
use protocol::{ErrorCode, Request, Response};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use transport::Connection;

/// Bound of a peer fd request (connect, send, receive).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a descriptor could not be fetched from its creator.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("creator {pid} unreachable: {source}")]
    Unreachable {
        pid: u32,
        source: transport::TransportError,
    },
    #[error("creator {pid} does not know allocation {id}: {message}")]
    NotFound {
        pid: u32,
        id: AllocationId,
        message: String,
    },
    #[error("creator {pid} refused us: {message}")]
    Denied { pid: u32, message: String },
    #[error("creator {pid} answered {answer}")]
    BadAnswer { pid: u32, answer: String },
}

impl FetchError {
    pub fn cuda(&self) -> CUresult {
        match self {
            FetchError::Unreachable { .. } | FetchError::BadAnswer { .. } => {
                CUresult::ERROR_INVALID_HANDLE
            }
            FetchError::NotFound { .. } => CUresult::ERROR_NOT_FOUND,
            FetchError::Denied { .. } => CUresult::ERROR_NOT_PERMITTED,
        }
    }
}

/// A tracked call's outcome: its value, or the driver's (or the shim's) result code.
pub type Tracked<T = ()> = Result<T, CUresult>;

/// The driver's code of a failed call, unchanged.
fn code(e: CudaError) -> CUresult {
    e.result
}

/// Where an export goes.
#[derive(Debug, Clone, Copy)]
pub enum ExportTo {
    /// A POSIX descriptor into a non-null `int*`: returned as an owned descriptor.
    Descriptor,
    /// Any other case (other handle types, a null out-pointer): the application's own pointer,
    /// handed to the driver as it is.
    Foreign(ForeignPtr),
}

/// A read-write (or, with `flags` PROT_NONE, no) access descriptor for `device`.
pub(crate) fn device_access(device: CUdevice, flags: u32) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: CUmemLocation {
            type_: location_type::DEVICE,
            id: device,
        },
        flags,
    }
}

/// What [`Tracking::export_natively`] exports: the object, its driver handle, the handle type and
/// the driver's flags.
struct NativeExport {
    handle: VHandle,
    real: DriverHandle,
    handle_type: u32,
    flags: u64,
}

/// The tracking job: the registry of what the application holds and the calls that keep it.
#[derive(Debug)]
pub struct Tracking {
    pub(crate) real: Real,
    pub(crate) config: Config,
    /// The state lock. Never held across a driver call that can wait for another process, nor
    /// while serving a peer.
    state: Mutex<Registry>,
    /// The gate every tracked call passes (closed by Freeze).
    pub(crate) gate: Gate,
    /// Descriptors of this process's shared creations, for its peers.
    pub(crate) exports: ExportCache,
}

impl Tracking {
    pub fn new(real: Real, config: Config) -> Tracking {
        Tracking {
            real,
            config,
            state: Mutex::new(Registry::new()),
            gate: Gate::default(),
            exports: ExportCache::default(),
        }
    }

    /// The state lock. A panic cannot poison it in the shipped library (`panic = "abort"`); in
    /// tests a poisoned lock still holds consistent data, because every mutation is committed
    /// after the fallible driver call.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Registry> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What keeps this process from being captured: the registry's blockers, and submission entry
    /// points a resolver handed out without the gate.
    pub(crate) fn blockers(&self) -> Vec<protocol::Blocker> {
        let mut blockers = self.lock().blockers();
        if let Some((entry, count)) = crate::gate::ungated() {
            blockers.push(protocol::Blocker::UngatedSubmission { entry, count });
        }
        blockers
    }
    /// Releases driver references of objects that died, and their export cache entries.
    fn bury(&self, dead: Vec<Dead>) {
        for d in dead {
            if let Some(id) = d.created_id {
                self.exports.remove(&id);
            }
            if let Some(real) = d.real
                && let Err(e) = self.real.mem_release(real)
            {
                log_warn!("cuMemRelease of a finished allocation failed: {e}");
            }
        }
    }

    /// Gives back a driver reference the shim does not keep (an extra one from a retain or an
    /// import of what it already holds, or one it could not record); a failure is logged, since
    /// the call it belongs to succeeded.
    fn give_back(&self, call: &str, real: DriverHandle) {
        if let Err(e) = self.real.mem_release(real) {
            log_warn!("{call}: extra driver reference not released: {e}");
        }
    }

    /// `cuMemCreate`.
    pub fn mem_create(
        &self,
        size: usize,
        prop: &CUmemAllocationProp,
        flags: u64,
    ) -> Tracked<VHandle> {
        let _pass = self.gate.enter();
        let real = self.real.mem_create(size, prop, flags).map_err(code)?;
        let props = record_props(prop);
        let id = match fdutil::random_id() {
            Ok(id) => id,
            Err(e) => {
                log_warn!("cuMemCreate: no random allocation id ({e}); allocation undone");
                self.give_back("cuMemCreate", real);
                return Err(CUresult::ERROR_OPERATING_SYSTEM);
            }
        };
        let kind = Kind::Created {
            id,
            shared: false,
            unsupported_exports: Vec::new(),
        };
        Ok(self.lock().insert(kind, size as u64, props, real))
    }

    /// `cuMemRelease`.
    pub fn mem_release(&self, handle: VHandle) -> Tracked {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        let Some(kills) = reg.release_would_kill(handle) else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        if reg.get(handle).is_some_and(|o| o.refs == 0) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        if kills && let Some(real) = reg.real_of(handle) {
            self.real.mem_release(real).map_err(code)?;
            reg.set_real(handle, None);
        }
        let dead = reg.drop_ref(handle).flatten();
        drop(reg);
        self.bury(dead.into_iter().collect());
        Ok(())
    }

    /// `cuMemMap`.
    pub fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: VHandle,
        flags: u64,
    ) -> Tracked {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        let Some(real) = reg.real_of(handle) else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        self.real
            .mem_map(ptr, size, offset, real, flags)
            .map_err(code)?;
        let dead = reg.insert_mapping(ptr, size as u64, offset as u64, handle);
        drop(reg);
        self.bury(dead);
        Ok(())
    }

    /// `cuMemUnmap`.
    pub fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> Tracked {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        self.real.mem_unmap(ptr, size).map_err(code)?;
        let dead = reg.remove_range(ptr, size as u64);
        drop(reg);
        self.bury(dead);
        Ok(())
    }

    /// `cuMemSetAccess` with the application's descriptors.
    pub fn mem_set_access(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        descs: &[CUmemAccessDesc],
    ) -> Tracked {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        self.real.mem_set_access(ptr, size, descs).map_err(code)?;
        let grants: Vec<AccessRecord> = descs.iter().map(access_record).collect();
        reg.set_access(ptr, size as u64, &grants);
        Ok(())
    }

    /// `cuMemAddressReserve`.
    pub fn mem_address_reserve(
        &self,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) -> Tracked<CUdeviceptr> {
        let _pass = self.gate.enter();
        let address = self
            .real
            .mem_address_reserve(size, alignment, addr, flags)
            .map_err(code)?;
        self.lock().insert_reservation(ReservationRecord {
            address,
            size: size as u64,
            alignment: alignment as u64,
            flags,
        });
        Ok(address)
    }

    /// `cuMemAddressFree`.
    pub fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> Tracked {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        self.real.mem_address_free(ptr, size).map_err(code)?;
        reg.remove_reservation(ptr);
        Ok(())
    }

    /// `cuMemRetainAllocationHandle` of the allocation mapped at `addr`.
    pub fn mem_retain(&self, addr: CUdeviceptr) -> Tracked<VHandle> {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        let got = self.real.mem_retain_allocation_handle(addr).map_err(code)?;
        let known = reg
            .mapping_at(addr)
            .or_else(|| reg.by_real(got))
            .filter(|vh| reg.get(*vh).is_some());
        Ok(match known {
            Some(vh) => {
                // One driver reference per allocation: give back the one the retain added.
                self.give_back("cuMemRetainAllocationHandle", got);
                reg.add_ref(vh);
                vh
            }
            None => {
                let props = self.driver_props(got);
                reg.insert(Kind::Native, 0, props, got)
            }
        })
    }

    /// The driver handle behind an application's handle (for a call the shim hands to the driver
    /// as it is, such as one with a null out-pointer).
    pub fn driver_handle(&self, handle: VHandle) -> Option<DriverHandle> {
        let _pass = self.gate.enter();
        self.lock().real_of(handle)
    }

    /// `cuMemGetAllocationPropertiesFromHandle`.
    pub fn mem_get_props(&self, handle: VHandle) -> Tracked<CUmemAllocationProp> {
        let _pass = self.gate.enter();
        let Some(real) = self.lock().real_of(handle) else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        self.real.mem_allocation_properties(real).map_err(code)
    }

    /// Puts a fresh POSIX descriptor of the created object `handle` (driver handle `real`) into
    /// the export cache, which peers fetch through tickets and IPC handles, and marks it shared:
    /// capture then exports it again when it rebuilds it. The caller holds the registry lock.
    pub(crate) fn share_creation(
        &self,
        reg: &mut Registry,
        handle: VHandle,
        real: DriverHandle,
        flags: u64,
    ) -> Tracked {
        let Some(Kind::Created { id, shared, .. }) = reg.get_mut(handle).map(|o| &mut o.kind)
        else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        let fd = self.real.mem_export_fd(real, flags).map_err(code)?;
        self.exports.insert(*id, fd);
        *shared = true;
        Ok(())
    }

    /// `cuMemExportToShareableHandle`. A POSIX export of an allocation the shim shares comes back
    /// as a ticket descriptor; other exports go to the driver (into the application's pointer for
    /// [`ExportTo::Foreign`], as a descriptor for [`ExportTo::Descriptor`]).
    pub fn mem_export(
        &self,
        handle: VHandle,
        handle_type: u32,
        flags: u64,
        to: ExportTo,
    ) -> Tracked<Option<OwnedFd>> {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        let Some(object) = reg.get(handle) else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        let Some(real) = object.real else {
            return Err(CUresult::ERROR_INVALID_VALUE);
        };
        let posix = handle_type == handle_type::POSIX_FILE_DESCRIPTOR;
        let ticket = match (&object.kind, posix) {
            (Kind::Created { id, .. }, true) => Ticket {
                creator_ns_pid: self.config.ns_pid,
                id: *id,
                size: object.size,
                multicast: false,
            },
            // Re-export of an import: the ticket names the original creator.
            (Kind::Imported { id, creator_ns_pid }, true) => Ticket {
                creator_ns_pid: *creator_ns_pid,
                id: *id,
                size: object.size,
                multicast: false,
            },
            (Kind::Multicast(info), true) => Ticket {
                creator_ns_pid: info.creator.unwrap_or(self.config.ns_pid),
                id: info.id,
                size: object.size,
                multicast: true,
            },
            _ => {
                let export = NativeExport {
                    handle,
                    real,
                    handle_type,
                    flags,
                };
                return self.export_natively(&mut reg, export, to);
            }
        };
        if matches!(to, ExportTo::Foreign(_)) {
            // A POSIX export of a shared allocation into a null out-pointer.
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        // Every export by the application refreshes the cached descriptor: one descriptor taken
        // before a native checkpoint made without the shim's phases would name memory the driver
        // has since replaced, and exports are rare (set-up time), so the extra driver call is free.
        // A multicast object is exported by its creating process only (an importer's re-export
        // names the creator through the ticket, and the creator's cache serves it).
        let multicast_created_here = match &object.kind {
            Kind::Created { .. } => Some(false),
            Kind::Multicast(info) if info.creator.is_none() => Some(true),
            _ => None,
        };
        match multicast_created_here {
            Some(false) => self.share_creation(&mut reg, handle, real, flags)?,
            Some(true) => {
                let fd = self.real.mem_export_fd(real, flags).map_err(code)?;
                self.exports.insert(ticket.id, fd);
                if let Some(Kind::Multicast(info)) = reg.get_mut(handle).map(|o| &mut o.kind) {
                    info.shared = true;
                }
            }
            None => {}
        }
        drop(reg);
        match fdutil::make_ticket(&ticket) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) => {
                log_warn!("cuMemExportToShareableHandle: cannot make a ticket: {e}");
                Err(CUresult::ERROR_OPERATING_SYSTEM)
            }
        }
    }

    /// An export the driver makes (a handle type other than a POSIX descriptor, or an object the
    /// shim does not share): into the application's pointer or as a descriptor. An allocation or a
    /// multicast object the shim made is then marked as blocking checkpoint while it lives.
    fn export_natively(
        &self,
        reg: &mut Registry,
        export: NativeExport,
        to: ExportTo,
    ) -> Tracked<Option<OwnedFd>> {
        let NativeExport {
            handle,
            real,
            handle_type,
            flags,
        } = export;
        let posix = handle_type == handle_type::POSIX_FILE_DESCRIPTOR;
        let exported = match to {
            ExportTo::Descriptor if posix => self.real.mem_export_fd(real, flags).map(Some),
            // A descriptor is what only a POSIX export writes.
            ExportTo::Descriptor => return Err(CUresult::ERROR_INVALID_VALUE),
            ExportTo::Foreign(out) => self
                .real
                .mem_export_foreign(out, real, handle_type, flags)
                .map(|()| None),
        }
        .map_err(code)?;
        match reg.get_mut(handle).map(|o| &mut o.kind) {
            Some(Kind::Created {
                unsupported_exports,
                id,
                ..
            }) if !unsupported_exports.contains(&handle_type) => {
                unsupported_exports.push(handle_type);
                log_warn!(
                    "allocation {id} exported with handle type {handle_type:#x}: checkpoint is blocked while it lives"
                );
            }
            Some(Kind::Multicast(info)) if !info.unsupported_exports.contains(&handle_type) => {
                info.unsupported_exports.push(handle_type);
                log_warn!(
                    "multicast object {} exported with handle type {handle_type:#x}: checkpoint is blocked while it lives",
                    info.id
                );
            }
            _ => {}
        }
        Ok(exported)
    }

    /// Asks the creator for the real descriptor of `id`, through its control socket.
    pub fn fetch_fd(&self, creator_ns_pid: u32, id: AllocationId) -> Result<OwnedFd, FetchError> {
        let pid = creator_ns_pid;
        let path = self.config.socket_of(pid);
        let unreachable = |source| FetchError::Unreachable { pid, source };
        let mut conn = Connection::connect(&path, PEER_TIMEOUT).map_err(unreachable)?;
        conn.check_peer().map_err(unreachable)?;
        match conn.call(&Request::GetFd { id }).map_err(unreachable)? {
            (Response::Fd { id: got }, Some(fd)) if got == id => Ok(fd),
            (Response::Error { code, message }, _) => Err(match code {
                ErrorCode::NotFound => FetchError::NotFound { pid, id, message },
                ErrorCode::Denied => FetchError::Denied { pid, message },
                _ => FetchError::BadAnswer {
                    pid,
                    answer: format!("{code:?}: {message}"),
                },
            }),
            (other, _) => Err(FetchError::BadAnswer {
                pid,
                answer: format!("{other:?}"),
            }),
        }
    }

    /// The recorded properties of a live driver handle (unknown ones if the driver cannot say).
    fn driver_props(&self, real: DriverHandle) -> protocol::record::AllocationProps {
        match self.real.mem_allocation_properties(real) {
            Ok(prop) => record_props(&prop),
            Err(_) => UNKNOWN_PROPS,
        }
    }

    /// Records a native import (a descriptor that was not a ticket, or another handle type),
    /// aliasing an object the process already holds for the same driver handle.
    fn adopt_native_import(&self, got: DriverHandle, handle_type: u32) -> VHandle {
        let props = self.driver_props(got);
        let mut reg = self.lock();
        if let Some(vh) = reg.by_real(got).filter(|vh| reg.get(*vh).is_some()) {
            // The reference the import just added; the object keeps its own.
            self.give_back("cuMemImportFromShareableHandle", got);
            reg.add_ref(vh);
            return vh;
        }
        let serial = reg.new_serial();
        log_debug!("native import #{serial} (handle type {handle_type:#x}) tracked as foreign");
        reg.insert(
            Kind::Foreign {
                serial,
                handle_type,
            },
            0,
            props,
            got,
        )
    }

    /// `cuMemImportFromShareableHandle` of a handle type other than a POSIX descriptor (or of
    /// arguments the driver will refuse): the driver's import, recorded as foreign.
    pub fn mem_import_other(&self, os_handle: ForeignPtr, handle_type: u32) -> Tracked<VHandle> {
        let _pass = self.gate.enter();
        let got = self
            .real
            .mem_import_foreign(os_handle, handle_type)
            .map_err(code)?;
        Ok(self.adopt_native_import(got, handle_type))
    }

    /// `cuMemImportFromShareableHandle` of the application's POSIX descriptor: a ticket is
    /// imported from its creator, any other descriptor goes to the driver.
    pub fn mem_import_fd(&self, app_fd: BorrowedFd<'_>) -> Tracked<VHandle> {
        let _pass = self.gate.enter();
        let ticket = match fdutil::classify(app_fd) {
            Classified::Foreign => {
                let got = self.real.mem_import_fd(app_fd).map_err(code)?;
                return Ok(self.adopt_native_import(got, handle_type::POSIX_FILE_DESCRIPTOR));
            }
            Classified::BadTicket(why) => {
                log_warn!("cuMemImportFromShareableHandle: refused a bad ticket: {why}");
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            Classified::Ticket(t) => t,
        };
        self.import_ticket(&ticket)
    }

    /// The import of a well-formed ticket: an alias if the process already holds the allocation,
    /// else a fetch from the creator (without the state lock) and a driver import.
    pub fn import_ticket(&self, ticket: &Ticket) -> Result<VHandle, CUresult> {
        {
            let mut reg = self.lock();
            if let Some(vh) = reg.by_id(&ticket.id) {
                reg.add_ref(vh);
                return Ok(vh);
            }
        }
        if ticket.creator_ns_pid == self.config.ns_pid {
            log_warn!(
                "cuMemImportFromShareableHandle: ticket names allocation {} of this process, which no longer exists",
                ticket.id
            );
            return Err(CUresult::ERROR_NOT_FOUND);
        }
        let fd = self
            .fetch_fd(ticket.creator_ns_pid, ticket.id)
            .map_err(|e| {
                log_warn!("cuMemImportFromShareableHandle: {e}");
                e.cuda()
            })?;
        use std::os::fd::AsFd;
        let got = self.real.mem_import_fd(fd.as_fd()).map_err(|e| {
            log_warn!(
                "cuMemImportFromShareableHandle: the driver refused the descriptor of {} from {}: {}",
                ticket.id,
                ticket.creator_ns_pid,
                e.result
            );
            e.result
        })?;
        drop(fd);
        // A multicast handle has no allocation properties to ask for.
        let props = if ticket.multicast {
            UNKNOWN_PROPS
        } else {
            self.driver_props(got)
        };
        let mut reg = self.lock();
        if let Some(vh) = reg.by_id(&ticket.id) {
            // Another thread imported it meanwhile: one driver handle per allocation.
            self.give_back("cuMemImportFromShareableHandle", got);
            reg.add_ref(vh);
            return Ok(vh);
        }
        let kind = if ticket.multicast {
            Kind::Multicast(Box::new(McInfo::imported(
                ticket.id,
                ticket.creator_ns_pid,
                ticket.size,
            )))
        } else {
            Kind::Imported {
                id: ticket.id,
                creator_ns_pid: ticket.creator_ns_pid,
            }
        };
        Ok(reg.insert(kind, ticket.size, props, got))
    }

    /// `cuMemFree`. Not gated: it frees private memory; it only ends a legacy IPC export record.
    pub fn mem_free(&self, dptr: CUdeviceptr) -> Tracked {
        self.real.mem_free(dptr).map_err(code)?;
        self.lock().freed(dptr);
        Ok(())
    }

    /// `cuIpcGetMemHandle` by the driver (memory the shim does not own): a blocker while it lives.
    pub(crate) fn native_ipc_get(&self, dptr: CUdeviceptr) -> Tracked<CUipcMemHandle> {
        let _pass = self.gate.enter();
        let handle = self.real.ipc_get_mem_handle(dptr).map_err(code)?;
        self.lock().ipc_exported(dptr);
        log_debug!("legacy IPC export of {dptr:#x}: checkpoint is blocked until it is freed");
        Ok(handle)
    }

    /// `cuIpcOpenMemHandle_v2` by the driver (a handle that is not the shim's): a blocker while open.
    pub(crate) fn native_ipc_open(
        &self,
        handle: CUipcMemHandle,
        flags: c_uint,
    ) -> Tracked<CUdeviceptr> {
        let _pass = self.gate.enter();
        let address = self.real.ipc_open_mem_handle(handle, flags).map_err(code)?;
        self.lock().ipc_opened(address);
        Ok(address)
    }

    /// `cuIpcCloseMemHandle` by the driver.
    pub(crate) fn native_ipc_close(&self, dptr: CUdeviceptr) -> Tracked {
        let _pass = self.gate.enter();
        self.real.ipc_close_mem_handle(dptr).map_err(code)?;
        self.lock().ipc_closed(dptr);
        Ok(())
    }
}

/// The record of one access descriptor: the one conversion between the driver's descriptors and
/// the records (the other way: [`access_desc`]).
pub fn access_record(d: &CUmemAccessDesc) -> AccessRecord {
    AccessRecord {
        location_type: d.location.type_,
        location_id: d.location.id,
        flags: d.flags,
    }
}

/// The driver's descriptor of one access record.
pub fn access_desc(a: &AccessRecord) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: CUmemLocation {
            type_: a.location_type,
            id: a.location_id,
        },
        flags: a.flags,
    }
}
