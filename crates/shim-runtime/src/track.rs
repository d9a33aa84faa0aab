//! The tracked driver calls: each calls the real driver first and records only what succeeded;
//! a driver error is returned unchanged (PyTorch relies on the exact codes).
//!
//! Locking: a tracked call passes the [`crate::gate::Gate`] (counted in flight), then takes the
//! state lock across its local driver call so that the record follows the driver's order. The
//! calls that can wait for another process run without the state lock: the import of a ticket
//! (its fetch from the creator's socket) and the multicast calls (a bind can wait for the whole
//! team).
//!
//! Import error codes for tickets: a descriptor that starts like a ticket but is malformed
//! (truncated, unsealed, other version, checksum, reserved bytes) gives `CUDA_ERROR_INVALID_VALUE`;
//! a creator that cannot be reached (dead, no socket, broken reply) gives
//! `CUDA_ERROR_INVALID_HANDLE`; a creator that does not know the allocation (released it, or the
//! ticket is stale) gives `CUDA_ERROR_NOT_FOUND`; a creator that refuses us (uid) gives
//! `CUDA_ERROR_NOT_PERMITTED`. Each failure is logged once, as one line.

use crate::fdutil::{self, Classified};
use crate::log::{log_debug, log_warn};
use crate::registry::{Dead, Kind, UNKNOWN_PROPS, VHandle, record_props};
use crate::runtime::Runtime;
use core::ffi::{c_int, c_uint, c_void};
use cuda_abi::*;
use protocol::record::{AccessRecord, AllocationId, ReservationRecord};
use protocol::ticket::Ticket;
use protocol::{ErrorCode, Request, Response};
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
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

impl Runtime {
    /// Releases driver references of objects that died, and their export cache entries.
    fn bury(&self, dead: Vec<Dead>) {
        for d in dead {
            if let Some(id) = d.created_id {
                self.exports.remove(&id);
            }
            if let Some(real) = d.real {
                // SAFETY: a driver handle the shim owns and nothing else references.
                let r = unsafe { (self.real.cuMemRelease)(real) };
                if !r.is_success() {
                    log_warn!("cuMemRelease of a finished allocation failed: {r}");
                }
            }
        }
    }

    /// # Safety
    /// The contract of `cuMemCreate`.
    pub unsafe fn mem_create(
        &self,
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        // SAFETY: the caller's arguments, unchanged; the driver reports null pointers.
        let r = unsafe { (self.real.cuMemCreate)(handle, size, prop, flags) };
        if !r.is_success() || handle.is_null() || prop.is_null() {
            return r;
        }
        // SAFETY: the driver succeeded, so the pointer is valid.
        let real = unsafe { handle.read() };
        // SAFETY: as above.
        let props = record_props(unsafe { &*prop });
        let id = match fdutil::random_id() {
            Ok(id) => id,
            Err(e) => {
                log_warn!("cuMemCreate: no random allocation id ({e}); allocation undone");
                // SAFETY: the handle the driver just returned, referenced by nobody else.
                unsafe { (self.real.cuMemRelease)(real) };
                return CUresult::ERROR_OPERATING_SYSTEM;
            }
        };
        let kind = Kind::Created {
            id,
            shared: false,
            unsupported_exports: Vec::new(),
        };
        let vh = self.lock().insert(kind, size as u64, props, real);
        // SAFETY: valid (the driver wrote it).
        unsafe { handle.write(vh) };
        CUresult::SUCCESS
    }

    /// # Safety
    /// The contract of `cuMemRelease`.
    pub unsafe fn mem_release(&self, handle: CUmemGenericAllocationHandle) -> CUresult {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        let Some(kills) = reg.release_would_kill(handle) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        if reg.get(handle).is_some_and(|o| o.refs == 0) {
            return CUresult::ERROR_INVALID_VALUE;
        }
        if kills && let Some(real) = reg.real_of(handle) {
            // SAFETY: the shim's own driver reference of this object.
            let r = unsafe { (self.real.cuMemRelease)(real) };
            if !r.is_success() {
                return r;
            }
            reg.set_real(handle, None);
        }
        let dead = reg.drop_ref(handle).flatten();
        drop(reg);
        self.bury(dead.into_iter().collect());
        CUresult::SUCCESS
    }

    /// # Safety
    /// The contract of `cuMemMap`.
    pub unsafe fn mem_map(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        let Some(real) = reg.real_of(handle) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's arguments with the driver's handle behind the virtual one.
        let r = unsafe { (self.real.cuMemMap)(ptr, size, offset, real, flags) };
        if !r.is_success() {
            return r;
        }
        let dead = reg.insert_mapping(ptr, size as u64, offset as u64, handle);
        drop(reg);
        self.bury(dead);
        CUresult::SUCCESS
    }

    /// # Safety
    /// The contract of `cuMemUnmap`.
    pub unsafe fn mem_unmap(&self, ptr: CUdeviceptr, size: usize) -> CUresult {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuMemUnmap)(ptr, size) };
        if !r.is_success() {
            return r;
        }
        let dead = reg.remove_range(ptr, size as u64);
        drop(reg);
        self.bury(dead);
        CUresult::SUCCESS
    }

    /// # Safety
    /// The contract of `cuMemSetAccess`.
    pub unsafe fn mem_set_access(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        desc: *const CUmemAccessDesc,
        count: usize,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuMemSetAccess)(ptr, size, desc, count) };
        if !r.is_success() || desc.is_null() {
            return r;
        }
        // SAFETY: the driver read `count` descriptors from `desc` successfully.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        let grants: Vec<AccessRecord> = descs
            .iter()
            .map(|d| AccessRecord {
                location_type: d.location.type_,
                location_id: d.location.id,
                flags: d.flags,
            })
            .collect();
        reg.set_access(ptr, size as u64, &grants);
        CUresult::SUCCESS
    }

    /// # Safety
    /// The contract of `cuMemAddressReserve`.
    pub unsafe fn mem_address_reserve(
        &self,
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuMemAddressReserve)(ptr, size, alignment, addr, flags) };
        if r.is_success() && !ptr.is_null() {
            // SAFETY: the driver wrote the reserved address.
            let address = unsafe { ptr.read() };
            self.lock().insert_reservation(ReservationRecord {
                address,
                size: size as u64,
                alignment: alignment as u64,
                flags,
            });
        }
        r
    }

    /// # Safety
    /// The contract of `cuMemAddressFree`.
    pub unsafe fn mem_address_free(&self, ptr: CUdeviceptr, size: usize) -> CUresult {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuMemAddressFree)(ptr, size) };
        if r.is_success() {
            reg.remove_reservation(ptr);
        }
        r
    }

    /// # Safety
    /// The contract of `cuMemRetainAllocationHandle`.
    pub unsafe fn mem_retain(
        &self,
        handle: *mut CUmemGenericAllocationHandle,
        addr: *mut c_void,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuMemRetainAllocationHandle)(handle, addr) };
        if !r.is_success() || handle.is_null() {
            return r;
        }
        // SAFETY: the driver wrote a handle there.
        let got = unsafe { handle.read() };
        let known = reg
            .mapping_at(addr as u64)
            .or_else(|| reg.by_real(got))
            .filter(|vh| reg.get(*vh).is_some());
        let vh = match known {
            Some(vh) => {
                // One driver reference per allocation: give back the one the retain added.
                // SAFETY: the reference the driver just added.
                let r = unsafe { (self.real.cuMemRelease)(got) };
                if !r.is_success() {
                    log_warn!("cuMemRetainAllocationHandle: extra reference not released: {r}");
                }
                reg.add_ref(vh);
                vh
            }
            None => {
                let mut prop = CUmemAllocationProp::default();
                // SAFETY: valid out-pointer, a live driver handle.
                let pr =
                    unsafe { (self.real.cuMemGetAllocationPropertiesFromHandle)(&mut prop, got) };
                let props = if pr.is_success() {
                    record_props(&prop)
                } else {
                    UNKNOWN_PROPS
                };
                reg.insert(Kind::Native, 0, props, got)
            }
        };
        // SAFETY: valid (the driver wrote it).
        unsafe { handle.write(vh) };
        CUresult::SUCCESS
    }

    /// # Safety
    /// The contract of `cuMemGetAllocationPropertiesFromHandle`.
    pub unsafe fn mem_get_props(
        &self,
        prop: *mut CUmemAllocationProp,
        handle: CUmemGenericAllocationHandle,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let Some(real) = self.lock().real_of(handle) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's out-pointer, the driver's handle.
        unsafe { (self.real.cuMemGetAllocationPropertiesFromHandle)(prop, real) }
    }

    /// # Safety
    /// The contract of `cuMemExportToShareableHandle`.
    pub unsafe fn mem_export(
        &self,
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        handle_type: u32,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let mut reg = self.lock();
        let Some(object) = reg.get(handle) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        let Some(real) = object.real else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        let posix = handle_type == handle_type::POSIX_FILE_DESCRIPTOR;
        let ticket = match (&object.kind, posix) {
            (Kind::Created { id, .. }, true) => Ticket {
                creator_ns_pid: self.config.ns_pid,
                id: *id,
                size: object.size,
            },
            // Re-export of an import: the ticket names the original creator.
            (Kind::Imported { id, creator_ns_pid }, true) => Ticket {
                creator_ns_pid: *creator_ns_pid,
                id: *id,
                size: object.size,
            },
            (kind, _) => {
                let created = matches!(kind, Kind::Created { .. });
                // SAFETY: the caller's arguments with the driver's handle.
                let r = unsafe {
                    (self.real.cuMemExportToShareableHandle)(shareable, real, handle_type, flags)
                };
                if r.is_success()
                    && created
                    && let Some(Kind::Created {
                        unsupported_exports,
                        id,
                        ..
                    }) = reg.get_mut(handle).map(|o| &mut o.kind)
                    && !unsupported_exports.contains(&handle_type)
                {
                    unsupported_exports.push(handle_type);
                    log_warn!(
                        "allocation {id} exported with handle type {handle_type:#x}: checkpoint is blocked while it lives"
                    );
                }
                return r;
            }
        };
        if shareable.is_null() {
            return CUresult::ERROR_INVALID_VALUE;
        }
        // Every export by the application refreshes the cached descriptor: one descriptor taken
        // before a native checkpoint made without the shim's phases would name memory the driver
        // has since replaced, and exports are rare (set-up time), so the extra driver call is free.
        if matches!(object.kind, Kind::Created { .. }) {
            let mut fd: c_int = -1;
            // SAFETY: a valid out-pointer for a POSIX descriptor, the driver's handle.
            let r = unsafe {
                (self.real.cuMemExportToShareableHandle)(
                    (&raw mut fd).cast(),
                    real,
                    handle_type,
                    flags,
                )
            };
            if !r.is_success() {
                return r;
            }
            if fd < 0 {
                return CUresult::ERROR_UNKNOWN;
            }
            // SAFETY: the driver handed us this new descriptor; we own it from here.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            self.exports.insert(ticket.id, owned);
        }
        if let Some(Kind::Created { shared, .. }) = reg.get_mut(handle).map(|o| &mut o.kind) {
            *shared = true;
        }
        drop(reg);
        match fdutil::make_ticket(&ticket) {
            Ok(fd) => {
                // SAFETY: `shareable` is non-null and points to an int, as for a POSIX export.
                unsafe { shareable.cast::<c_int>().write(fd.into_raw_fd()) };
                CUresult::SUCCESS
            }
            Err(e) => {
                log_warn!("cuMemExportToShareableHandle: cannot make a ticket: {e}");
                CUresult::ERROR_OPERATING_SYSTEM
            }
        }
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

    /// Imports a descriptor with the driver, returning the driver handle.
    fn driver_import(&self, fd: BorrowedFd<'_>, handle_type: u32) -> Result<u64, CUresult> {
        use std::os::fd::AsRawFd;
        let mut got: CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer; for POSIX descriptors the OS handle is the fd's value.
        let r = unsafe {
            (self.real.cuMemImportFromShareableHandle)(
                &mut got,
                fd.as_raw_fd() as usize as *mut c_void,
                handle_type,
            )
        };
        if r.is_success() { Ok(got) } else { Err(r) }
    }

    fn driver_props(&self, real: u64) -> protocol::record::AllocationProps {
        let mut prop = CUmemAllocationProp::default();
        // SAFETY: valid out-pointer, a live driver handle.
        let r = unsafe { (self.real.cuMemGetAllocationPropertiesFromHandle)(&mut prop, real) };
        if r.is_success() {
            record_props(&prop)
        } else {
            UNKNOWN_PROPS
        }
    }

    /// Records a native import (a descriptor that was not a ticket, or another handle type),
    /// aliasing an object the process already holds for the same driver handle.
    fn adopt_native_import(&self, got: u64, handle_type: u32) -> VHandle {
        let props = self.driver_props(got);
        let mut reg = self.lock();
        if let Some(vh) = reg.by_real(got).filter(|vh| reg.get(*vh).is_some()) {
            // SAFETY: the reference the import just added; the object keeps its own.
            unsafe { (self.real.cuMemRelease)(got) };
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

    /// # Safety
    /// The contract of `cuMemImportFromShareableHandle`.
    pub unsafe fn mem_import(
        &self,
        handle: *mut CUmemGenericAllocationHandle,
        os_handle: *mut c_void,
        handle_type: u32,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let raw = os_handle as usize;
        let fd_value = i32::try_from(raw).ok().filter(|fd| *fd >= 0);
        let (true, false, Some(fd_value)) = (
            handle_type == handle_type::POSIX_FILE_DESCRIPTOR,
            handle.is_null(),
            fd_value,
        ) else {
            // Other handle types (FABRIC...), or arguments the driver will refuse.
            // SAFETY: the caller's arguments.
            let r = unsafe {
                (self.real.cuMemImportFromShareableHandle)(handle, os_handle, handle_type)
            };
            if r.is_success() && !handle.is_null() {
                // SAFETY: the driver wrote a handle.
                let got = unsafe { handle.read() };
                let vh = self.adopt_native_import(got, handle_type);
                // SAFETY: as above.
                unsafe { handle.write(vh) };
            }
            return r;
        };
        // SAFETY: only borrowed for syscalls that report a closed descriptor as EBADF; it is the
        // application's and is never closed here.
        let app_fd = unsafe { BorrowedFd::borrow_raw(fd_value) };
        let ticket = match fdutil::classify(app_fd) {
            Classified::Foreign => {
                // SAFETY: the caller's arguments.
                let r = unsafe {
                    (self.real.cuMemImportFromShareableHandle)(handle, os_handle, handle_type)
                };
                if r.is_success() {
                    // SAFETY: the driver wrote a handle.
                    let got = unsafe { handle.read() };
                    let vh = self.adopt_native_import(got, handle_type);
                    // SAFETY: as above.
                    unsafe { handle.write(vh) };
                }
                return r;
            }
            Classified::BadTicket(why) => {
                log_warn!("cuMemImportFromShareableHandle: refused a bad ticket: {why}");
                return CUresult::ERROR_INVALID_VALUE;
            }
            Classified::Ticket(t) => t,
        };
        match self.import_ticket(&ticket) {
            Ok(vh) => {
                // SAFETY: checked non-null above.
                unsafe { handle.write(vh) };
                CUresult::SUCCESS
            }
            Err(r) => r,
        }
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
        let got = self
            .driver_import(fd.as_fd(), handle_type::POSIX_FILE_DESCRIPTOR)
            .inspect_err(|r| {
                log_warn!(
                    "cuMemImportFromShareableHandle: the driver refused the descriptor of {} from {}: {r}",
                    ticket.id,
                    ticket.creator_ns_pid
                );
            })?;
        drop(fd);
        let props = self.driver_props(got);
        let mut reg = self.lock();
        if let Some(vh) = reg.by_id(&ticket.id) {
            // Another thread imported it meanwhile: one driver handle per allocation.
            // SAFETY: the reference this import added.
            unsafe { (self.real.cuMemRelease)(got) };
            reg.add_ref(vh);
            return Ok(vh);
        }
        Ok(reg.insert(
            Kind::Imported {
                id: ticket.id,
                creator_ns_pid: ticket.creator_ns_pid,
            },
            ticket.size,
            props,
            got,
        ))
    }

    /// # Safety
    /// The contract of `cuMemFree_v2`. Not gated: it frees private memory; it only ends a legacy
    /// IPC export record.
    pub unsafe fn mem_free(&self, dptr: CUdeviceptr) -> CUresult {
        // SAFETY: the caller's argument.
        let r = unsafe { (self.real.cuMemFree_v2)(dptr) };
        if r.is_success() {
            self.lock().freed(dptr);
        }
        r
    }

    /// # Safety
    /// The contract of `cuIpcGetMemHandle`.
    pub unsafe fn ipc_get_mem_handle(
        &self,
        handle: *mut CUipcMemHandle,
        dptr: CUdeviceptr,
    ) -> CUresult {
        let _pass = self.gate.enter();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuIpcGetMemHandle)(handle, dptr) };
        if r.is_success() {
            self.lock().ipc_exported(dptr);
            log_debug!("legacy IPC export of {dptr:#x}: checkpoint is blocked until it is freed");
        }
        r
    }

    /// # Safety
    /// The contract of `cuIpcOpenMemHandle_v2`.
    pub unsafe fn ipc_open_mem_handle(
        &self,
        dptr: *mut CUdeviceptr,
        handle: CUipcMemHandle,
        flags: c_uint,
    ) -> CUresult {
        let _pass = self.gate.enter();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuIpcOpenMemHandle_v2)(dptr, handle, flags) };
        if r.is_success() && !dptr.is_null() {
            // SAFETY: the driver wrote the address.
            let address = unsafe { dptr.read() };
            self.lock().ipc_opened(address);
        }
        r
    }

    /// # Safety
    /// The contract of `cuIpcCloseMemHandle`.
    pub unsafe fn ipc_close_mem_handle(&self, dptr: CUdeviceptr) -> CUresult {
        let _pass = self.gate.enter();
        // SAFETY: the caller's argument.
        let r = unsafe { (self.real.cuIpcCloseMemHandle)(dptr) };
        if r.is_success() {
            self.lock().ipc_closed(dptr);
        }
        r
    }

    /// # Safety
    /// The contract of `cuMulticastCreate`.
    pub unsafe fn multicast_create(
        &self,
        handle: *mut CUmemGenericAllocationHandle,
        prop: *const CUmulticastObjectProp,
    ) -> CUresult {
        let _pass = self.gate.enter();
        // SAFETY: the caller's arguments.
        let r = unsafe { (self.real.cuMulticastCreate)(handle, prop) };
        if !r.is_success() || handle.is_null() || prop.is_null() {
            return r;
        }
        // SAFETY: the driver succeeded: the pointer is valid.
        let got = unsafe { handle.read() };
        // SAFETY: as above.
        let size = unsafe { (*prop).size } as u64;
        let vh = self.lock().insert(
            Kind::Multicast { size, devices: 0 },
            size,
            UNKNOWN_PROPS,
            got,
        );
        // SAFETY: valid (the driver wrote it).
        unsafe { handle.write(vh) };
        CUresult::SUCCESS
    }

    /// The driver handle of a multicast object (translation only; the call runs unlocked).
    fn multicast_real(&self, handle: VHandle) -> Option<u64> {
        let reg = self.lock();
        reg.get(handle)
            .filter(|o| matches!(o.kind, Kind::Multicast { .. }))
            .and_then(|o| o.real)
    }

    /// # Safety
    /// The contract of `cuMulticastAddDevice`.
    pub unsafe fn multicast_add_device(
        &self,
        handle: CUmemGenericAllocationHandle,
        dev: CUdevice,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let Some(real) = self.multicast_real(handle) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's arguments with the driver's handle.
        let r = unsafe { (self.real.cuMulticastAddDevice)(real, dev) };
        if r.is_success()
            && let Some(Kind::Multicast { devices, .. }) =
                self.lock().get_mut(handle).map(|o| &mut o.kind)
        {
            *devices = devices.saturating_add(1);
        }
        r
    }

    /// Translates the (multicast, memory) pair of a bind.
    fn bind_pair(&self, mc: VHandle, mem: VHandle) -> Option<(u64, u64)> {
        let mc = self.multicast_real(mc)?;
        let mem = self.lock().real_of(mem)?;
        Some((mc, mem))
    }

    /// # Safety
    /// The contract of `cuMulticastBindMem`.
    pub unsafe fn multicast_bind_mem(
        &self,
        mc: VHandle,
        mc_offset: usize,
        mem: VHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let Some((mc, mem)) = self.bind_pair(mc, mem) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's arguments with driver handles.
        unsafe { (self.real.cuMulticastBindMem)(mc, mc_offset, mem, mem_offset, size, flags) }
    }

    /// # Safety
    /// The contract of `cuMulticastBindMem_v2`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn multicast_bind_mem_v2(
        &self,
        mc: VHandle,
        dev: CUdevice,
        mc_offset: usize,
        mem: VHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let Some((mc, mem)) = self.bind_pair(mc, mem) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's arguments with driver handles.
        unsafe {
            (self.real.cuMulticastBindMem_v2)(mc, dev, mc_offset, mem, mem_offset, size, flags)
        }
    }

    /// # Safety
    /// The contract of `cuMulticastBindAddr`.
    pub unsafe fn multicast_bind_addr(
        &self,
        mc: VHandle,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let Some(mc) = self.multicast_real(mc) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's arguments with the driver's handle.
        unsafe { (self.real.cuMulticastBindAddr)(mc, mc_offset, ptr, size, flags) }
    }

    /// # Safety
    /// The contract of `cuMulticastBindAddr_v2`.
    pub unsafe fn multicast_bind_addr_v2(
        &self,
        mc: VHandle,
        dev: CUdevice,
        mc_offset: usize,
        ptr: CUdeviceptr,
        size: usize,
        flags: u64,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let Some(mc) = self.multicast_real(mc) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's arguments with the driver's handle.
        unsafe { (self.real.cuMulticastBindAddr_v2)(mc, dev, mc_offset, ptr, size, flags) }
    }

    /// # Safety
    /// The contract of `cuMulticastUnbind`.
    pub unsafe fn multicast_unbind(
        &self,
        mc: VHandle,
        dev: CUdevice,
        mc_offset: usize,
        size: usize,
    ) -> CUresult {
        let _pass = self.gate.enter();
        let Some(mc) = self.multicast_real(mc) else {
            return CUresult::ERROR_INVALID_VALUE;
        };
        // SAFETY: the caller's arguments with the driver's handle.
        unsafe { (self.real.cuMulticastUnbind)(mc, dev, mc_offset, size) }
    }
}
