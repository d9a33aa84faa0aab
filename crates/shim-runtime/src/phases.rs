//! The capture and rebuild phases, run one at a time on the control worker thread.
//!
//! ```text
//! Running --Freeze--> Frozen --Save--> Saved --Release--> Released --Load--> Loaded --Import--> Imported --Thaw--> Running
//! ```
//!
//! - Freeze: tracked memory calls wait at the gate; those in flight drain (timeout: the gate opens
//!   again, nothing changed); the primary context of every device the process used is
//!   synchronised.
//! - Save: every allocation this process created, shared or private, is copied whole into the host
//!   carrier,
//!   through a temporary shim-owned mapping (so application mappings that are partial, read-only
//!   or absent do not matter), by the copy engine in the mode `CUINTERPOSE_CARRIER` chose
//!   (`copy.rs`). Save and Load answer with the engine's statistics (`PhaseDone::stats`).
//! - Release: multicast objects go first (`multicast.rs`: export closed, mappings unmapped,
//!   bindings unbound, handle released); imports are unmapped and released; creations leave the
//!   export cache, are unmapped and released. VA reservations stay the application's, records stay
//!   as they were (INSPECT reports the same topology in every phase). What the native checkpoint
//!   then sees of device memory is only what the shim does not own (`Kind::Native` and untracked
//!   kinds).
//! - Load: each released creation is created again with its recorded properties, filled from the
//!   carrier, mapped at its recorded addresses and offsets with its recorded access, and, when it
//!   is shared, exported again into the export cache; the application's virtual handle now names
//!   the new driver handle. Tickets held by peers stay valid: they name the allocation ID.
//! - Import: each released import is fetched again from its creator (by the creator PID and ID
//!   its ticket named) and mapped at its recorded addresses with its recorded access. Creators
//!   must have loaded first (the tool sends Load to everyone, then Import to everyone).
//! - Multicast (four steps after Import, each group-wide: create, import, add devices, bind and
//!   map; `multicast.rs`): the multicast objects Release released, rebuilt.
//! - Thaw: the gate opens.
//!
//! Rollback: Load and Import work from per-object state, not from the phase alone, so they are
//! idempotent and also repair a Save or Release that failed half way, and the tool can send the
//! same Load, Import, Thaw to every survivor whatever phase each reached: Load is accepted in
//! Frozen, Saved, Released and Loaded, Import in Frozen, Saved, Loaded and Imported (not in
//! Released: this process's own Load comes first), and each rebuilds exactly what is not live
//! (nothing, when nothing was released). Thaw is accepted in every phase (in Running it does
//! nothing) and refuses while anything released is not rebuilt. Freeze, Save and Release in any
//! other phase than their one are refused with WrongPhase and change nothing.
//!
//! An importer that exports an imported allocation again hands out a ticket naming the ORIGINAL
//! creator, so imports of imports are rebuilt from the creator, never through the middle process.

use crate::copy::{self, CarrierMode, CarrierView, CopyError, Direction, Unit};
use crate::datafile::DataFileError;
use crate::log::{log_debug, log_info, log_warn};
use crate::registry::{Kind, Mapping, VHandle, driver_props};
use crate::runtime::Runtime;
use crate::track::FetchError;
use crate::track::access_desc;
use cuda::{CudaError, DriverHandle};
use cuda_abi::*;
use protocol::message::{CopyStats, DataFile, StreamStats};
use protocol::record::{AllocationId, Phase};
use protocol::{ErrorCode, Request, Response};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// Phase machinery the control worker owns.
#[derive(Debug, Default)]
pub struct Control {
    pub(crate) carrier: copy::Carrier,
    /// How copies reach the carrier (`CUINTERPOSE_CARRIER` and the staging knobs, from the
    /// runtime's [`crate::runtime::Config`]).
    pub(crate) copy: copy::CopyConfig,
    /// Figures of the last phase that copied, for the log and for benchmarks.
    pub(crate) last: CopyStats,
    /// This capture's Release started here (so every creator was sent Release too, and may have
    /// recreated its allocations since); until the next successful Import or Thaw.
    pub(crate) release_started: bool,
    /// Imports whose creator has exited: they cannot be rebuilt, stay unmapped, and do not keep
    /// Thaw from bringing back the rest (`cuinterpose resume --allow-lost`).
    pub(crate) lost_imports: std::collections::HashSet<VHandle>,
    /// The data file this capture's SaveTo wrote (checkpoint to disk), until Thaw: the bytes of
    /// the allocations it lists are there, not in the carrier (process memory, so a process
    /// restored by CRIU still knows it).
    pub(crate) streamed: Option<DataFile>,
    /// The per-thread stack size of each device's context that Release set to zero, to put back
    /// at Thaw ([`Runtime::shrink_stacks`]).
    pub(crate) shrunk_stacks: Vec<(i32, usize)>,
    /// This cycle's Save went to the carrier helper: Load copies back from it.
    pub(crate) through_helper: bool,
    /// The helper's carrier, as a descriptor this process holds from its SaveThroughHelper
    /// until its Thaw: the pages outlive the helper, and a Load whose helper is gone reads them
    /// here ([`Runtime::load_from_own_copy`]).
    pub(crate) helper_copy: Option<HelperCopy>,
}

/// What a process holds of its bytes saved through the carrier helper ([`Control::helper_copy`]).
#[derive(Debug)]
pub(crate) struct HelperCopy {
    /// The helper's carrier (a memfd), shared with it.
    pub(crate) fd: std::os::fd::OwnedFd,
    /// Its length when it was handed over.
    pub(crate) length: u64,
    /// The helper's pid as it reported it.
    pub(crate) helper_pid: u32,
    /// Allocations saved there this cycle, and their bytes.
    pub(crate) allocations: u64,
    pub(crate) bytes: u64,
}

impl HelperCopy {
    /// What `inspect` shows of it ([`protocol::message::HelloReply::carrier_helper`]).
    pub(crate) fn hold(&self) -> protocol::message::HelperHold {
        protocol::message::HelperHold {
            helper_pid: self.helper_pid,
            allocations: self.allocations,
            bytes: self.bytes,
            held_bytes: self.length,
        }
    }
}

/// The helper's carrier as it handed it over ([`Response::CarrierFd`]): the memfd, its length
/// and the helper's pid.
type HandedCarrier = (std::os::fd::OwnedFd, u64, u32);

/// Why a call to the carrier helper failed.
enum HelperFailure {
    /// The helper is gone (nothing listens, or it died during the call) or is another helper
    /// that never held this process's carrier: the bytes are in this process's own copy.
    Gone(String),
    /// The helper answered an error, or the call failed otherwise.
    Failed(PhaseError),
}

impl From<HelperFailure> for PhaseError {
    fn from(f: HelperFailure) -> PhaseError {
        match f {
            HelperFailure::Gone(why) => PhaseError::Helper(why),
            HelperFailure::Failed(e) => e,
        }
    }
}

/// Whether a transport error means the helper is gone: nothing listens at its socket, or the
/// connection ended under a call (the helper never closes one with a request unanswered).
fn helper_gone(e: &transport::TransportError) -> bool {
    use std::io::ErrorKind;
    match e {
        transport::TransportError::Closed => true,
        transport::TransportError::Io { source, .. } => matches!(
            source.kind(),
            ErrorKind::ConnectionRefused
                | ErrorKind::NotFound
                | ErrorKind::ConnectionReset
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

impl Control {
    pub(crate) fn carrier_poisoned(&self) -> bool {
        self.carrier.is_poisoned()
    }
}

/// Why a phase failed.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    #[error("{request} is not valid in phase {phase:?}")]
    WrongPhase { request: &'static str, phase: Phase },
    #[error("{0}")]
    NotRebuilt(String),
    #[error("checkpoint is blocked: this process {}", .0.join("; "))]
    Blocked(Vec<String>),
    #[error("{inside} tracked calls still in flight after {timeout_ms} ms; not frozen")]
    Timeout { inside: u32, timeout_ms: u32 },
    #[error("not drained after {timeout_ms} ms ({}); not frozen", .busy.join("; "))]
    NotDrained { busy: Vec<String>, timeout_ms: u32 },
    #[error(
        "the context of device {device} holds an error of the application's own work ({error})"
    )]
    Sticky { device: i32, error: String },
    #[error("{call} failed for {what}: {result}")]
    Driver {
        call: &'static str,
        what: String,
        result: CUresult,
    },
    #[error(transparent)]
    Copy(#[from] CopyError),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    DataFile(#[from] DataFileError),
    #[error("{0}")]
    Internal(String),
    /// The carrier helper could not be reached or failed; its message says which.
    #[error("{0}")]
    Helper(String),
}

impl PhaseError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PhaseError::WrongPhase { .. } | PhaseError::NotRebuilt(_) | PhaseError::Blocked(_) => {
                ErrorCode::WrongPhase
            }
            PhaseError::Timeout { .. } | PhaseError::NotDrained { .. } => ErrorCode::Timeout,
            PhaseError::Sticky { .. } => ErrorCode::Sticky,
            PhaseError::Driver { .. }
            | PhaseError::Copy(_)
            | PhaseError::DataFile(DataFileError::Copy(_)) => ErrorCode::Driver,
            PhaseError::DataFile(_) => ErrorCode::Internal,
            PhaseError::Fetch(FetchError::NotFound { .. }) => ErrorCode::NotFound,
            PhaseError::Fetch(_) => ErrorCode::Peer,
            PhaseError::Internal(_) => ErrorCode::Internal,
            PhaseError::Helper(_) => ErrorCode::Peer,
        }
    }
}

/// The phase error of a failed driver call, naming what it was for.
pub(crate) fn check<T>(
    what: impl FnOnce() -> String,
    r: Result<T, CudaError>,
) -> Result<T, PhaseError> {
    r.map_err(|e| PhaseError::Driver {
        call: e.call,
        what: what(),
        result: e.result,
    })
}

/// A shim-owned mapping of a whole allocation, for copying: unmapped and its range freed on
/// drop, which happens under the device's context ([`Runtime::drop_temp`]), or leaked while a copy
/// may still use it.
pub(crate) type TempMap<'a> = cuda::owned::Mapping<'a>;

/// One import to rebuild: handle, ID, creator, size, surviving driver handle, unmapped mappings.
type ImportItem = (
    VHandle,
    AllocationId,
    u32,
    u64,
    Option<DriverHandle>,
    Vec<(u64, Mapping)>,
);

/// One creation to rebuild.
pub(crate) struct LoadItem {
    handle: VHandle,
    pub(crate) id: AllocationId,
    /// Exported before: exported again into the cache once rebuilt.
    shared: bool,
    size: usize,
    device: i32,
    props: protocol::record::AllocationProps,
    /// The driver handle, if it survived (a Release that failed half way).
    real: Option<DriverHandle>,
    pub(crate) carrier: Option<u64>,
    unmapped: Vec<(u64, Mapping)>,
    cached: bool,
}

/// One allocation Save (or SaveTo) copies out.
pub(crate) struct SaveItem {
    pub(crate) handle: VHandle,
    pub(crate) id: AllocationId,
    pub(crate) real: DriverHandle,
    pub(crate) size: usize,
    pub(crate) device: i32,
}

/// What a phase request did.
enum Done {
    /// Bytes moved, and the copy engine's figures for Save and Load.
    Phase(u64, Option<CopyStats>),
    /// SaveTo and LoadFrom: bytes moved, how the streaming went, the data file.
    Streamed(u64, StreamStats, DataFile),
    /// Hold, Drain and Admit: how the drain stands.
    Drain(protocol::message::DrainReport),
}

impl Runtime {
    /// Runs one phase request (on the control worker); `file` is the data file that came with
    /// SaveTo or LoadFrom.
    pub fn run_phase(&self, request: Request, file: Option<std::os::fd::OwnedFd>) -> Response {
        let start = Instant::now();
        let name = request_name(&request);
        let plain = |r: Result<u64, PhaseError>| r.map(|bytes| Done::Phase(bytes, None));
        let copied = |r: Result<(u64, Option<CopyStats>), PhaseError>| {
            r.map(|(bytes, stats)| Done::Phase(bytes, stats))
        };
        let streamed = |r: Result<(u64, StreamStats, DataFile), PhaseError>| {
            r.map(|(bytes, stats, file)| Done::Streamed(bytes, stats, file))
        };
        let drained = |r: Result<protocol::message::DrainReport, PhaseError>| r.map(Done::Drain);
        let result = match (request, file) {
            (Request::Freeze { timeout_ms }, _) => plain(self.freeze(timeout_ms)),
            (Request::Hold, _) => drained(self.hold()),
            (Request::Drain { wait_ms }, _) => {
                drained(self.drain(Duration::from_millis(u64::from(wait_ms))))
            }
            (Request::Admit { count }, _) => drained(self.admit(count)),
            (Request::Save, _) => copied(self.save(true)),
            (Request::SaveKeepingContexts, _) => copied(self.save(false)),
            (Request::SaveThroughHelper { native_follows }, _) => {
                copied(self.save_through_helper(native_follows))
            }
            (Request::Release, _) => plain(self.release()),
            (Request::Load, _) => copied(self.load()),
            (Request::Import, _) => plain(self.import()),
            (Request::Thaw, _) => plain(self.thaw()),
            (Request::SaveTo { store, workers }, Some(file)) => {
                streamed(self.save_to(file.as_fd(), store, workers))
            }
            (
                Request::LoadFrom {
                    file: record,
                    workers,
                },
                Some(file),
            ) => streamed(self.load_from(file.as_fd(), record, workers)),
            (Request::Multicast(step), _) => plain(self.multicast_step(step)),
            (other, _) => Err(PhaseError::Internal(format!(
                "{other:?} is not a phase request, or came without its descriptor"
            ))),
        };
        let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
        match result {
            Ok(Done::Phase(bytes, stats)) => {
                let phase = self.lock().phase();
                log_info!("{name} done: {bytes} bytes in {micros} us, now {phase:?}");
                Response::PhaseDone {
                    phase,
                    bytes,
                    micros,
                    stats,
                }
            }
            Ok(Done::Streamed(bytes, stats, file)) => {
                let phase = self.lock().phase();
                log_info!(
                    "{name} done: {bytes} bytes in {micros} us ({} zero bytes elided), now {phase:?}",
                    stats.zero_bytes
                );
                Response::Streamed {
                    phase,
                    bytes,
                    micros,
                    stats,
                    file,
                }
            }
            Ok(Done::Drain(report)) => {
                log_debug!(
                    "{name}: drained {}, {} waiting",
                    report.drained,
                    report.waiting
                );
                Response::Drain(report)
            }
            Err(e) => {
                // Not a warning: the tool reports it, naming the process. Written to the
                // application's stderr by default, it would change a file a checkpoint recorded
                // (CRIU restores a regular file only at its recorded size), and a restore whose
                // rebuild failed could not be tried again.
                log_info!("{name} failed: {e}");
                Response::Error {
                    code: e.code(),
                    message: e.to_string(),
                }
            }
        }
    }

    /// Figures of the last copying phase.
    pub fn last_stats(&self) -> CopyStats {
        self.control().last
    }

    pub(crate) fn expect_phase(
        &self,
        request: &'static str,
        allowed: &[Phase],
    ) -> Result<Phase, PhaseError> {
        let phase = self.lock().phase();
        if allowed.contains(&phase) {
            Ok(phase)
        } else {
            Err(PhaseError::WrongPhase { request, phase })
        }
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.lock().phase = Some(phase);
    }

    /// The device whose context copies an allocation and which gets access to its temporary
    /// mapping: its location for device memory, else the first device the process used.
    fn copy_device(&self, props: &protocol::record::AllocationProps) -> i32 {
        if props.location_type == location_type::DEVICE {
            props.location_id
        } else {
            self.lock().devices().first().copied().unwrap_or(0)
        }
    }

    /// Freeze: closes the gates if the tool did not hold them first (a capture of one process),
    /// drains without admitting anything, checks for blockers and marks the process Frozen. Any
    /// failure opens the gates again: nothing was changed.
    fn freeze(&self, timeout_ms: u32) -> Result<u64, PhaseError> {
        self.expect_phase("Freeze", &[Phase::Running])?;
        if !self.gates_closed() {
            self.hold()?;
        }
        let frozen = self.drain_to_frozen(timeout_ms);
        if frozen.is_err() {
            self.open_gates();
        }
        frozen
    }

    fn drain_to_frozen(&self, timeout_ms: u32) -> Result<u64, PhaseError> {
        let timeout = Duration::from_millis(u64::from(timeout_ms));
        let busy = self.drain_until(Instant::now() + timeout)?;
        if !busy.is_empty() {
            return Err(PhaseError::NotDrained { busy, timeout_ms });
        }
        if let Err(inside) = self.gate.freeze(timeout) {
            return Err(PhaseError::Timeout { inside, timeout_ms });
        }
        // Drained and held, nothing new can appear: a blocker that came after the tool's
        // inspection is caught here, before anything is released.
        let blockers = self.blockers();
        if !blockers.is_empty() {
            return Err(PhaseError::Blocked(
                blockers.iter().map(ToString::to_string).collect(),
            ));
        }
        self.set_phase(Phase::Frozen);
        Ok(0)
    }

    pub(crate) fn temp_map(
        &self,
        real: DriverHandle,
        size: usize,
        device: i32,
    ) -> Result<TempMap<'_>, PhaseError> {
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: location_type::DEVICE,
                id: device,
            },
            flags: access_flags::PROT_READWRITE,
        };
        check(
            || format!("a temporary mapping of {size} bytes"),
            TempMap::whole(&self.real, real, size, &[desc], copy::log_cleanup),
        )
    }

    /// Removes temporary mappings under their device's context; one whose context cannot be
    /// entered is kept (never unmapped without its context).
    pub(crate) fn drop_temp<'a, T>(&self, work: impl IntoIterator<Item = (TempMap<'a>, i32, T)>) {
        for (map, device, _) in work {
            match copy::enter(&self.real, device) {
                Ok(_ctx) => drop(map),
                Err(e) => {
                    log_warn!("temporary mapping kept: {e}");
                    map.leak();
                }
            }
        }
    }

    /// Copies between the carrier and allocations mapped temporarily; unmaps them unless a copy
    /// may still be running.
    fn copy_through(
        &self,
        work: Vec<(TempMap<'_>, i32, u64)>,
        dir: Direction,
    ) -> Result<copy::CopyStats, PhaseError> {
        let (base, config, pinned) = {
            let control = self.control();
            (
                control.carrier.base(),
                control.copy,
                control.carrier.pinned(),
            )
        };
        let mut units: Vec<Unit> = Vec::new();
        for (map, device, offset) in &work {
            units.extend(copy::segments(
                *device,
                map.va(),
                base,
                *offset as usize,
                map.size(),
            ));
        }
        let needed = units.iter().map(|u| u.host + u.len).max().unwrap_or(base) - base;
        // Pinned only where the whole range is: a refused pinning (logged once by the carrier)
        // copies staged.
        let mode = config.carrier.mode(needed, pinned);
        let (stats, error) = copy::copy_all(&self.real, units, dir, mode, config.chunk);
        if stats.dma_uncertain {
            // Fail-stop on this data: the mappings and the carrier may still be read or written.
            self.control().carrier.poison();
            for (map, ..) in work {
                map.leak();
            }
        } else {
            self.drop_temp(work);
        }
        match error {
            Some(e) => Err(e.into()),
            None => Ok(stats),
        }
    }

    /// The allocations Save and SaveTo copy out, in handle order: the one place that says which.
    pub(crate) fn save_items(&self) -> Vec<SaveItem> {
        let reg = self.lock();
        let mut v: Vec<_> = reg
            .objects()
            .filter(|(_, o)| o.is_creation())
            .filter_map(|(h, o)| Some((h, o.id()?, o.real?, o.size as usize, o.props)))
            .collect();
        v.sort_by_key(|(h, ..)| *h);
        drop(reg);
        v.into_iter()
            .map(|(handle, id, real, size, props)| SaveItem {
                handle,
                id,
                real,
                size,
                device: self.copy_device(&props),
            })
            .collect()
    }

    /// Save; `native_follows` says a native checkpoint comes after it (not so for
    /// `suspend --keep-contexts`), which decides whether an `auto` carrier is pinned.
    fn save(&self, native_follows: bool) -> Result<(u64, Option<CopyStats>), PhaseError> {
        self.expect_phase("Save", &[Phase::Frozen])?;
        let items: Vec<(VHandle, DriverHandle, usize, i32)> = self
            .save_items()
            .into_iter()
            .map(|i| (i.handle, i.real, i.size, i.device))
            .collect();
        let total: usize = items.iter().map(|(_, _, size, _)| *size).sum();
        // The carrier is registered through the context of the first allocation's device.
        let pin_device = items.first().map_or(0, |(.., device)| *device);
        let carrier = {
            let mut control = self.control();
            let pinned = control.carrier.pinned() > 0;
            if control.copy.carrier.pins(native_follows, pinned) {
                let (took, reused, _pinned) = control.carrier.ensure_pinned(
                    &self.real,
                    total,
                    copy::PIN_PIECE,
                    pin_device,
                )?;
                (took, reused)
            } else {
                control.carrier.ensure(total)?
            }
        };
        let mut work = Vec::with_capacity(items.len());
        let mut offsets = Vec::with_capacity(items.len());
        let mut offset = 0u64;
        for (handle, real, size, device) in &items {
            let mapped = copy::enter(&self.real, *device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| self.temp_map(*real, *size, *device));
            match mapped {
                Ok(map) => work.push((map, *device, offset)),
                Err(e) => {
                    self.drop_temp(work);
                    return Err(e);
                }
            }
            offsets.push((*handle, offset));
            offset += *size as u64;
        }
        let stats = self.copy_through(work, Direction::ToHost)?;
        {
            let mut reg = self.lock();
            for (handle, offset) in offsets {
                if let Some(o) = reg.get_mut(handle) {
                    o.carrier = Some(offset);
                }
            }
            reg.phase = Some(Phase::Saved);
        }
        let recorded = self.record_stats(stats, carrier);
        Ok((stats.bytes, Some(recorded)))
    }

    /// Keeps and logs what a copying phase measured; `carrier` is the carrier's preparation
    /// (time, reused) for Save, nothing for Load.
    fn record_stats(&self, stats: copy::CopyStats, carrier: (Duration, bool)) -> CopyStats {
        self.record(stats.report(carrier))
    }

    /// Keeps and logs a copying phase's figures.
    fn record(&self, last: CopyStats) -> CopyStats {
        log_debug!(
            "copied {} bytes {:?} with {} threads: carrier {} us (reused {}), pinning {} us, \
             copies {} us, {} staged fallbacks",
            last.bytes,
            last.mode,
            last.threads,
            last.carrier_micros,
            last.carrier_reused,
            last.pin_micros,
            last.copy_micros,
            last.staged_fallbacks
        );
        self.control().last = last;
        last
    }

    /// Unmaps the live mappings of an object and releases its driver handle, recording each step.
    fn release_object(&self, handle: VHandle) -> Result<u64, PhaseError> {
        let (real, size, mappings, id) = {
            let reg = self.lock();
            let Some(o) = reg.get(handle) else {
                return Ok(0);
            };
            (o.real, o.size, reg.mappings_of(handle), o.id())
        };
        if let (Some(id), true) = (id, reg_is_created(self, handle)) {
            self.exports.remove(&id);
        }
        for (address, m) in mappings.iter().filter(|(_, m)| m.mapped) {
            check(
                || format!("mapping at {address:#x}"),
                self.real.mem_unmap(*address, m.size as usize),
            )?;
            self.lock().set_mapped(*address, false);
        }
        if let Some(real) = real {
            check(|| format!("allocation {id:?}"), self.real.mem_release(real))?;
            self.lock().set_real(handle, None);
            return Ok(size);
        }
        Ok(0)
    }

    fn release(&self) -> Result<u64, PhaseError> {
        self.expect_phase("Release", &[Phase::Saved])?;
        let streamed = self.control().streamed.clone();
        let in_file = |id: Option<AllocationId>| {
            streamed
                .as_ref()
                .is_some_and(|f| f.extents.iter().any(|e| Some(e.id) == id))
        };
        let (imports, creations) = {
            let reg = self.lock();
            let mut imports = Vec::new();
            let mut creations = Vec::new();
            for (h, o) in reg.objects() {
                match o.kind {
                    Kind::Imported { .. } => imports.push(h),
                    Kind::Created { .. } => {
                        if o.carrier.is_none() && !in_file(o.id()) && o.real.is_some() {
                            return Err(PhaseError::Internal(format!(
                                "allocation {:?} was not saved; nothing released",
                                o.id()
                            )));
                        }
                        creations.push(h);
                    }
                    _ => {}
                }
            }
            imports.sort_unstable();
            creations.sort_unstable();
            (imports, creations)
        };
        self.control().release_started = true;
        let mut bytes = self.release_multicasts()?;
        for h in imports.into_iter().chain(creations) {
            bytes += self.release_object(h)?;
        }
        self.shrink_stacks();
        self.set_phase(Phase::Released);
        Ok(bytes)
    }

    /// Gives back the local memory each device's context reserves for its threads' stacks, last
    /// in Release. It is the largest part of what a context holds on its device once the shim has
    /// released every allocation it owns (264 MiB of about 500 on the H200 at the default 1 KiB
    /// stack), and the driver's native checkpoint moves it at its own rate: measured on r580
    /// (`scripts/gpu/context_floor.py`), checkpoint and restore of a nearly empty process took
    /// 367 + 253 ms with it and 221 + 184 ms without. In a keep-contexts cycle it is memory the
    /// next job on the GPU can use. Safe even if it were never put back: the driver grows the
    /// stack again at the next launch that needs more (`cuCtxSetLimit`'s contract); Import puts each
    /// value read here back, so launches after the resume find what they found before. A context
    /// whose limit cannot be read or set keeps its stack (an optimisation, never a failure).
    fn shrink_stacks(&self) {
        let devices = self.lock().devices();
        let mut shrunk = Vec::new();
        for device in devices {
            // Never twice: the value kept is the application's, not the zero set here.
            if self
                .control()
                .shrunk_stacks
                .iter()
                .any(|(d, _)| *d == device)
            {
                continue;
            }
            let result = copy::enter(&self.real, device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| {
                    let what = || format!("the stack size of device {device}");
                    let size = check(what, self.real.ctx_get_limit(limit::STACK_SIZE))?;
                    check(what, self.real.ctx_set_limit(limit::STACK_SIZE, 0))?;
                    Ok(size)
                });
            match result {
                Ok(size) => shrunk.push((device, size)),
                Err(e) => log_debug!("stack of device {device} kept: {e}"),
            }
        }
        self.control().shrunk_stacks.extend(shrunk);
    }

    /// Puts back the stack sizes [`Runtime::shrink_stacks`] set to zero (at the end of Import, and
    /// in Thaw for what a rebuild without Import left).
    fn restore_stacks(&self) {
        let shrunk = std::mem::take(&mut self.control().shrunk_stacks);
        for (device, size) in shrunk {
            let result = copy::enter(&self.real, device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| {
                    check(
                        || format!("the stack size of device {device}"),
                        self.real.ctx_set_limit(limit::STACK_SIZE, size),
                    )
                });
            if let Err(e) = result {
                log_warn!("{e}; the driver sizes the stack at the next launch that needs it");
            }
        }
    }

    /// Maps the unmapped recorded mappings of an object at their addresses with their access.
    /// Returns the addresses mapped (for undo).
    pub(crate) fn map_recorded(
        &self,
        real: DriverHandle,
        unmapped: &[(u64, Mapping)],
    ) -> Result<Vec<u64>, PhaseError> {
        let mut done = Vec::new();
        for (address, m) in unmapped {
            // The recorded address range lies in a reservation the application kept.
            let mapped = self
                .real
                .mem_map(*address, m.size as usize, m.offset as usize, real, 0);
            if let Err(e) = check(|| format!("recorded mapping at {address:#x}"), mapped) {
                self.unmap_addresses(&done, unmapped);
                return Err(e);
            }
            done.push(*address);
            if !m.access.is_empty() {
                let descs: Vec<CUmemAccessDesc> = m.access.iter().map(access_desc).collect();
                let granted = self.real.mem_set_access(*address, m.size as usize, &descs);
                if let Err(e) = check(|| format!("mapping at {address:#x}"), granted) {
                    self.unmap_addresses(&done, unmapped);
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// Undoes mappings this phase made (on its failure path, so a failed unmap is only logged:
    /// the phase's own error is what the tool gets).
    fn unmap_addresses(&self, addresses: &[u64], all: &[(u64, Mapping)]) {
        for (address, m) in all.iter().filter(|(a, _)| addresses.contains(a)) {
            if let Err(e) = self.real.mem_unmap(*address, m.size as usize) {
                log_warn!("mapping at {address:#x} not undone: {e}");
            }
        }
    }

    /// Releases driver handles this phase made and never published (failure paths: logged).
    pub(crate) fn release_unpublished(&self, handles: impl IntoIterator<Item = DriverHandle>) {
        for real in handles {
            if let Err(e) = self.real.mem_release(real) {
                log_warn!("an allocation this phase made was not released: {e}");
            }
        }
    }

    fn load(&self) -> Result<(u64, Option<CopyStats>), PhaseError> {
        if self.control().through_helper {
            let rebuilt = self.rebuild_creations(
                "Load",
                |item| item.carrier,
                |work| self.load_from_helper(work),
                // The helper's copies are confirmed before it answers, or it poisoned its own
                // carrier and kept the mappings: ours may be released either way, unless a
                // load from this process's own copy could not confirm its copies.
                || self.control().carrier_poisoned(),
            )?;
            return Ok(rebuilt.map_or((0, None), |(loaded, stats)| {
                (loaded, Some(self.record(stats)))
            }));
        }
        let rebuilt = self.rebuild_creations(
            "Load",
            |item| item.carrier,
            |work| self.copy_through(work, Direction::ToDevice),
            || self.control().carrier_poisoned(),
        )?;
        Ok(match rebuilt {
            None => (0, None),
            Some((loaded, stats)) => (
                loaded,
                Some(self.record_stats(stats, (Duration::ZERO, false))),
            ),
        })
    }

    /// Has the carrier helper give this process's carrier back (after a resume, under
    /// `CUINTERPOSE_CARRIER_RELEASE=after-resume`); a failure is logged (the helper gives it
    /// back anyway when this process exits).
    fn forget_helper_carrier(&self) {
        let socket = self.helper_socket();
        let forgot = transport::Connection::connect(&socket, HELPER_TIMEOUT)
            .and_then(|mut c| c.call(&Request::CarrierForget));
        match forgot {
            Ok((Response::Accepted, _)) => {}
            Ok((other, _)) => {
                log_warn!("the carrier helper kept this process's carrier: {other:?}")
            }
            Err(e) => log_warn!("the carrier helper kept this process's carrier: {e}"),
        }
    }

    /// The carrier helper's socket (in this process's control directory).
    fn helper_socket(&self) -> std::path::PathBuf {
        self.config
            .control_dir
            .join(crate::carrier_helper::SOCKET_NAME)
    }

    /// Sends `allocations` (driver handle, size, device, offset in the carrier) to the carrier
    /// helper and has it copy them into (`to_host`) or out of this process's carrier there.
    /// After a copy into it, the helper hands over its carrier ([`Request::CarrierShare`]).
    fn helper_copy(
        &self,
        allocations: &[(DriverHandle, usize, i32, u64)],
        to_host: bool,
        total: u64,
    ) -> Result<(CopyStats, Option<HandedCarrier>), HelperFailure> {
        let socket = self.helper_socket();
        let transport_error = |e: transport::TransportError| {
            let message = format!("carrier helper at {}: {e}", socket.display());
            if helper_gone(&e) {
                HelperFailure::Gone(message)
            } else {
                HelperFailure::Failed(PhaseError::Helper(message))
            }
        };
        let mut connection =
            transport::Connection::connect(&socket, HELPER_TIMEOUT).map_err(transport_error)?;
        connection
            .set_timeout(Some(HELPER_TIMEOUT))
            .map_err(transport_error)?;
        let answer = |response: Response| match response {
            Response::Accepted | Response::Copied { .. } | Response::CarrierFd { .. } => {
                Ok(response)
            }
            // Another helper than the one this process saved through (the one it saved
            // through is gone): it holds nothing of this process's.
            Response::Error {
                code: ErrorCode::NotFound,
                message,
            } => Err(HelperFailure::Gone(message)),
            Response::Error { message, .. } => {
                Err(HelperFailure::Failed(PhaseError::Helper(message)))
            }
            other => Err(HelperFailure::Failed(PhaseError::Helper(format!(
                "the carrier helper answered {other:?}"
            )))),
        };
        for &(real, size, device, offset) in allocations {
            let uuid = check(
                || format!("device {device}"),
                self.real
                    .device_get(device)
                    .and_then(|d| self.real.device_uuid(d)),
            )
            .map_err(HelperFailure::Failed)?;
            let fd = check(
                || format!("an allocation of {size} bytes"),
                self.real.mem_export_fd(real, 0),
            )
            .map_err(HelperFailure::Failed)?;
            let request = Request::CarrierItem {
                offset,
                size: size as u64,
                device: crate::carrier_helper::uuid_bytes(&uuid),
            };
            let (response, _) = connection
                .call_with(&request, Some(fd.as_fd()))
                .map_err(transport_error)?;
            answer(response)?;
        }
        let (response, _) = connection
            .call(&Request::CarrierCopy { to_host, total })
            .map_err(transport_error)?;
        let stats = match answer(response)? {
            Response::Copied { stats } => stats,
            other => {
                return Err(HelperFailure::Failed(PhaseError::Helper(format!(
                    "the carrier helper answered {other:?} to a copy"
                ))));
            }
        };
        if !to_host {
            return Ok((stats, None));
        }
        let (response, fd) = connection
            .call(&Request::CarrierShare)
            .map_err(transport_error)?;
        match (answer(response)?, fd) {
            (Response::CarrierFd { length, helper_pid }, Some(fd)) => {
                Ok((stats, Some((fd, length, helper_pid))))
            }
            (other, _) => Err(HelperFailure::Failed(PhaseError::Helper(format!(
                "the carrier helper answered {other:?} when asked for its carrier"
            )))),
        }
    }

    /// Save through the carrier helper ([`Request::SaveThroughHelper`]): every allocation Save
    /// would copy is exported to the helper, which copies it into this process's carrier there.
    /// A creation that cannot be exported (made without a shareable handle type) makes the
    /// cycle save into this process's own carrier instead, logged.
    fn save_through_helper(
        &self,
        native_follows: bool,
    ) -> Result<(u64, Option<CopyStats>), PhaseError> {
        self.expect_phase("SaveThroughHelper", &[Phase::Frozen])?;
        let items = self.save_items();
        if let Some(private) = items.iter().find(|i| {
            !self
                .lock()
                .get(i.handle)
                .is_some_and(|o| exportable(&o.props))
        }) {
            log_info!(
                "allocation {} has no shareable handle type: this cycle saves into the \
                 process's own carrier",
                private.id
            );
            return self.save(native_follows);
        }
        if items.is_empty() {
            // Nothing of this process's goes to the helper (it only imports): saved, with no
            // carrier there to hand over, and a Load with nothing to fill.
            self.set_phase(Phase::Saved);
            let mut control = self.control();
            control.through_helper = true;
            control.helper_copy = None;
            return Ok((0, None));
        }
        let mut allocations = Vec::with_capacity(items.len());
        let mut offset = 0u64;
        for item in &items {
            allocations.push((item.real, item.size, item.device, offset));
            offset += item.size as u64;
        }
        // Saved only once the helper has handed over its carrier: from then on the bytes
        // outlive the helper (docs/design.md, "The carrier helper's death").
        let (stats, shared) = self.helper_copy(&allocations, true, offset)?;
        let Some((fd, length, helper_pid)) = shared else {
            return Err(PhaseError::Internal(
                "the carrier helper handed over no carrier".into(),
            ));
        };
        if length < offset {
            return Err(PhaseError::Helper(format!(
                "the carrier helper (pid {helper_pid}) handed over a carrier of {length} bytes for \
                 {offset} bytes saved; nothing was released"
            )));
        }
        {
            let mut reg = self.lock();
            for (item, (.., offset)) in items.iter().zip(&allocations) {
                if let Some(o) = reg.get_mut(item.handle) {
                    o.carrier = Some(*offset);
                }
            }
            reg.phase = Some(Phase::Saved);
        }
        {
            let mut control = self.control();
            control.through_helper = true;
            control.helper_copy = Some(HelperCopy {
                fd,
                length,
                helper_pid,
                allocations: allocations.len() as u64,
                bytes: offset,
            });
        }
        Ok((stats.bytes, Some(self.record(stats))))
    }

    /// Load's fill from the carrier helper: the fresh allocations, exported, are filled there.
    fn load_from_helper(
        &self,
        work: Vec<(TempMap<'_>, i32, u64)>,
    ) -> Result<CopyStats, PhaseError> {
        if work.is_empty() {
            // Nothing to fill (a Load sent again after its fills were done): the helper, alive
            // or not, is not needed.
            return Ok(CopyStats::default());
        }
        let mut allocations = Vec::with_capacity(work.len());
        let mut retained = Vec::with_capacity(work.len());
        let mut result = Ok(());
        for (map, device, offset) in &work {
            let got = copy::enter(&self.real, *device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| {
                    check(
                        || format!("the allocation at {:#x}", map.va()),
                        self.real.mem_retain_allocation_handle(map.va()),
                    )
                });
            match got {
                Ok(real) => {
                    retained.push(real);
                    allocations.push((real, map.size(), *device, *offset));
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let copied = result.and_then(|()| match self.helper_copy(&allocations, false, 0) {
            Ok((stats, _)) => Ok(stats),
            Err(HelperFailure::Gone(why)) => self.load_from_own_copy(&work, &why),
            Err(HelperFailure::Failed(e)) => Err(e),
        });
        self.release_unpublished(retained);
        if self.control().carrier_poisoned() {
            // A copy into the fresh allocations could not be confirmed finished: their
            // mappings stay (and the allocations, see `load`).
            for (map, ..) in work {
                map.leak();
            }
        } else {
            self.drop_temp(work);
        }
        copied
    }

    /// Load's fill when the carrier helper is gone: from this process's own descriptor of the
    /// helper's carrier ([`Control::helper_copy`]), mapped read-only and copied staged (nothing
    /// is pinned in the application). Where it holds none, says exactly what is lost.
    fn load_from_own_copy(
        &self,
        work: &[(TempMap<'_>, i32, u64)],
        why: &str,
    ) -> Result<CopyStats, PhaseError> {
        let needed = work
            .iter()
            .map(|(map, _, offset)| offset.saturating_add(map.size() as u64))
            .max()
            .unwrap_or(0);
        let (fd, chunk) = {
            let control = self.control();
            let fd = match &control.helper_copy {
                Some(own) => own.fd.try_clone().map_err(|e| {
                    PhaseError::Helper(format!("{why}; this process's copy of its carrier: {e}"))
                }),
                None => Err(PhaseError::Helper(format!(
                    "the bytes of {} allocations ({needed} bytes) saved through the carrier \
                     helper are lost: {why}, and this process holds no copy of its carrier \
                     (`cuinterpose end --pid <root>` ends the group)",
                    work.len()
                ))),
            }?;
            (fd, control.copy.chunk)
        };
        log_warn!("{why}: loading from this process's own copy of the helper's carrier");
        let view = CarrierView::map(fd.as_fd(), needed as usize).map_err(|e| {
            PhaseError::Helper(format!(
                "the bytes of {} allocations ({needed} bytes) saved through the carrier helper \
                 are lost: {why}, and this process's copy of its carrier cannot be read: {e} \
                 (`cuinterpose end --pid <root>` ends the group)",
                work.len()
            ))
        })?;
        let mut units: Vec<Unit> = Vec::new();
        for (map, device, offset) in work {
            units.extend(copy::segments(
                *device,
                map.va(),
                view.base(),
                *offset as usize,
                map.size(),
            ));
        }
        let (stats, error) = copy::copy_all(
            &self.real,
            units,
            Direction::ToDevice,
            CarrierMode::Staged,
            chunk,
        );
        if stats.dma_uncertain {
            // Fail-stop, as `copy_through`: the fresh allocations may still be written.
            self.control().carrier.poison();
        }
        match error {
            Some(e) => Err(e.into()),
            None => Ok(stats.report((Duration::ZERO, true))),
        }
    }

    /// Load and LoadFrom: recreates every released shared creation, fills the fresh ones with
    /// `fill` from where `source` says each one's bytes are (a carrier offset, an extent of a
    /// data file), then maps, exports and publishes them. `None` when everything was loaded
    /// already (phase Imported). On a failed fill the fresh allocations are released unless
    /// `keep` says a copy may still touch them.
    pub(crate) fn rebuild_creations<'s, T, S>(
        &'s self,
        request: &'static str,
        source: impl Fn(&LoadItem) -> Option<T>,
        fill: impl FnOnce(Vec<(TempMap<'s>, i32, T)>) -> Result<S, PhaseError>,
        keep: impl Fn() -> bool,
    ) -> Result<Option<(u64, S)>, PhaseError> {
        // Imported comes after a Load that completed: a resume that stopped after Import and is
        // run again finds everything loaded, and the phase stays Imported.
        if self.expect_phase(
            request,
            &[
                Phase::Frozen,
                Phase::Saved,
                Phase::Released,
                Phase::Loaded,
                Phase::Imported,
            ],
        )? == Phase::Imported
        {
            return Ok(None);
        }
        let mut items = self.load_items();
        // Fresh allocations for those released, filled from the carrier.
        let mut fresh: Vec<(usize, DriverHandle)> = Vec::new();
        let mut work = Vec::new();
        let undo_fresh = |fresh: &[(usize, DriverHandle)]| {
            self.release_unpublished(fresh.iter().map(|(_, real)| *real));
        };
        for (index, item) in items.iter().enumerate() {
            if item.real.is_some() {
                continue;
            }
            let Some(offset) = source(item) else {
                undo_fresh(&fresh);
                return Err(PhaseError::Internal(format!(
                    "allocation {} was released without its bytes saved where {request} loads \
                     from (carrier or data file)",
                    item.id
                )));
            };
            match self.fresh_allocation(item) {
                Ok((real, map)) => {
                    fresh.push((index, real));
                    work.push((map, item.device, offset));
                }
                Err(e) => {
                    self.drop_temp(work);
                    undo_fresh(&fresh);
                    return Err(e);
                }
            }
        }
        let stats = match fill(work) {
            Ok(stats) => stats,
            Err(e) => {
                if !keep() {
                    undo_fresh(&fresh);
                }
                return Err(e);
            }
        };
        for (index, real) in &fresh {
            if let Some(item) = items.get_mut(*index) {
                item.real = Some(*real);
            }
        }
        let loaded = self.publish_all(&items, &fresh)?;
        self.set_phase(Phase::Loaded);
        Ok(Some((loaded, stats)))
    }

    /// The creations whose memory, mappings or export a Load must rebuild, in handle order, each
    /// with the device its bytes are copied on.
    fn load_items(&self) -> Vec<LoadItem> {
        let mut items = Vec::new();
        {
            let reg = self.lock();
            for (h, o) in reg.objects() {
                let Kind::Created { id, shared, .. } = o.kind else {
                    continue;
                };
                let unmapped: Vec<(u64, Mapping)> = reg
                    .mappings_of(h)
                    .into_iter()
                    .filter(|(_, m)| !m.mapped)
                    .collect();
                let cached = self.exports.contains(&id);
                if o.real.is_some() && unmapped.is_empty() && (cached || !shared) {
                    continue;
                }
                items.push(LoadItem {
                    handle: h,
                    id,
                    shared,
                    size: o.size as usize,
                    device: 0,
                    props: o.props,
                    real: o.real,
                    carrier: o.carrier,
                    unmapped,
                    cached,
                });
            }
        }
        items.sort_by_key(|i| i.handle);
        // Outside the state lock: the device of a placement may be asked of the driver.
        for item in &mut items {
            item.device = self.copy_device(&item.props);
        }
        items
    }

    /// A fresh allocation for a released `item`, mapped temporarily for the fill; released
    /// again when the temporary map fails.
    fn fresh_allocation(&self, item: &LoadItem) -> Result<(DriverHandle, TempMap<'_>), PhaseError> {
        let _context = copy::enter(&self.real, item.device)?;
        let prop = driver_props(&item.props);
        let real = check(
            || format!("allocation {}", item.id),
            self.real.mem_create(item.size, &prop, 0),
        )?;
        match self.temp_map(real, item.size, item.device) {
            Ok(map) => Ok((real, map)),
            Err(e) => {
                self.release_unpublished([real]);
                Err(e)
            }
        }
    }

    /// Maps, exports and publishes each item, one at a time: what is published stays published,
    /// and on a failure the fresh allocations not published yet are released. The bytes of the
    /// fresh ones.
    fn publish_all(
        &self,
        items: &[LoadItem],
        fresh: &[(usize, DriverHandle)],
    ) -> Result<u64, PhaseError> {
        let mut loaded = 0;
        for (index, item) in items.iter().enumerate() {
            let Some(real) = item.real else { continue };
            let published = copy::enter(&self.real, item.device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| self.publish_creation(item, real));
            if let Err(e) = published {
                self.release_unpublished(
                    fresh
                        .iter()
                        .filter(|(i, _)| *i >= index)
                        .map(|(_, real)| *real),
                );
                return Err(e);
            }
            if fresh.iter().any(|(i, _)| *i == index) {
                loaded += item.size as u64;
            }
        }
        Ok(loaded)
    }

    /// Maps a rebuilt creation at its recorded addresses, exports it into the cache when it is
    /// shared and points the application's virtual handle at it.
    fn publish_creation(&self, item: &LoadItem, real: DriverHandle) -> Result<(), PhaseError> {
        let mapped = self.map_recorded(real, &item.unmapped)?;
        if item.shared && !item.cached {
            let exported = check(
                || format!("allocation {}", item.id),
                self.real.mem_export_fd(real, 0),
            );
            match exported {
                Ok(fd) => self.exports.insert(item.id, fd),
                Err(e) => {
                    self.unmap_addresses(&mapped, &item.unmapped);
                    return Err(e);
                }
            }
        }
        let mut reg = self.lock();
        reg.set_real(item.handle, Some(real));
        for address in mapped {
            reg.set_mapped(address, true);
        }
        Ok(())
    }

    fn import(&self) -> Result<u64, PhaseError> {
        self.expect_phase(
            "Import",
            &[Phase::Frozen, Phase::Saved, Phase::Loaded, Phase::Imported],
        )?;
        // Found again below: whatever is still not live and whose creator is gone.
        self.control().lost_imports.clear();
        // Once Release began anywhere, creators may have recreated (Load) allocations whose old
        // memory this process still holds through an import its own Release did not finish:
        // mapping that old handle again would split the sharing (each side writing different
        // memory). Every import still held is dropped and fetched again from its creator, which
        // hands out its current allocation (the same one if it never released it).
        if self.control().release_started {
            let held: Vec<VHandle> = {
                let reg = self.lock();
                let mut v: Vec<VHandle> = reg
                    .objects()
                    .filter(|(_, o)| matches!(o.kind, Kind::Imported { .. }) && o.real.is_some())
                    .map(|(h, _)| h)
                    .collect();
                v.sort_unstable();
                v
            };
            for handle in held {
                self.release_object(handle)?;
            }
        }
        let items: Vec<ImportItem> = {
            let reg = self.lock();
            let mut v: Vec<_> = reg
                .objects()
                .filter_map(|(h, o)| {
                    let Kind::Imported { id, creator_ns_pid } = o.kind else {
                        return None;
                    };
                    let unmapped: Vec<(u64, Mapping)> = reg
                        .mappings_of(h)
                        .into_iter()
                        .filter(|(_, m)| !m.mapped)
                        .collect();
                    if o.real.is_some() && unmapped.is_empty() {
                        return None;
                    }
                    Some((h, id, creator_ns_pid, o.size, o.real, unmapped))
                })
                .collect();
            v.sort_by_key(|i| i.0);
            v
        };
        let mut bytes = 0;
        for (handle, id, creator, size, real, unmapped) in items {
            let (real, fresh) = match real {
                Some(real) => (real, false),
                None => {
                    let fd = match self.fetch_fd(creator, id) {
                        Ok(fd) => fd,
                        Err(e) if creator_exited(creator) => {
                            log_warn!(
                                "import of allocation {id}: its creator (ns pid {creator}) has \
                                 exited, it stays unmapped: {e}"
                            );
                            self.control().lost_imports.insert(handle);
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    };
                    let got = check(
                        || format!("allocation {id} of {creator}"),
                        self.real.mem_import_fd(fd.as_fd()),
                    )?;
                    drop(fd);
                    (got, true)
                }
            };
            let mapped = match self.map_recorded(real, &unmapped) {
                Ok(m) => m,
                Err(e) => {
                    if fresh {
                        self.release_unpublished([real]);
                    }
                    return Err(e);
                }
            };
            let mut reg = self.lock();
            reg.set_real(handle, Some(real));
            for address in mapped {
                reg.set_mapped(address, true);
            }
            if fresh {
                bytes += size;
            }
        }
        self.control().release_started = false;
        // Here, not in Thaw: setting a stack size waits for the device, and once some process of
        // the group is thawed its kernels may spin waiting for this one (measured on r580: a Thaw
        // of 4.9 s in a spin pair). At Import every process of the group is still held.
        self.restore_stacks();
        self.set_phase(Phase::Imported);
        Ok(bytes)
    }

    /// What capture released that is not rebuilt yet.
    fn not_rebuilt(&self) -> Vec<String> {
        let reg = self.lock();
        let mut out = Vec::new();
        let lost = self.control().lost_imports.clone();
        for (h, o) in reg.objects() {
            if !o.is_captured() || lost.contains(&h) {
                continue;
            }
            let unmapped = reg.mappings_of(h).iter().filter(|(_, m)| !m.mapped).count();
            let uncached = match o.kind {
                Kind::Created {
                    id, shared: true, ..
                } => !self.exports.contains(&id),
                _ => false,
            };
            if o.real.is_none() || unmapped > 0 || uncached {
                out.push(format!("{:?}", o.id()));
            }
        }
        out
    }

    pub(crate) fn thaw(&self) -> Result<u64, PhaseError> {
        if self.lock().phase() == Phase::Running {
            // A capture given up after Hold: the gates open, nothing else was touched.
            self.open_gates();
            return Ok(0);
        }
        let mut missing = self.not_rebuilt();
        missing.extend(self.multicasts_not_rebuilt());
        if !missing.is_empty() {
            return Err(PhaseError::NotRebuilt(format!(
                "cannot thaw: {} objects released and not rebuilt ({}); send Load, Import and the multicast steps first",
                missing.len(),
                missing.join(", ")
            )));
        }
        {
            let mut reg = self.lock();
            let handles: Vec<VHandle> = reg.objects().map(|(h, _)| h).collect();
            for h in handles {
                if let Some(o) = reg.get_mut(h) {
                    o.carrier = None;
                }
            }
            reg.phase = Some(Phase::Running);
        }
        {
            let mut control = self.control();
            if control.copy.release == copy::CarrierRelease::AfterResume
                && let Err(e) = control.carrier.unpin(&self.real)
            {
                // The group runs again either way; the carrier stays (poisoned: never unmapped).
                log_warn!("cannot give the pinned carrier back after resume: {e}");
            }
            control.carrier.discard();
            control.streamed = None;
        }
        // Everything is loaded: this process's copy of the helper's carrier goes.
        self.control().helper_copy = None;
        if std::mem::take(&mut self.control().through_helper)
            && self.control().copy.release == copy::CarrierRelease::AfterResume
        {
            self.forget_helper_carrier();
        }
        self.control().release_started = false;
        self.control().lost_imports.clear();
        self.restore_stacks();
        self.open_gates();
        Ok(0)
    }
}

/// How long the shim waits for the carrier helper: to connect, and for each answer (a copy of
/// the whole process's memory included).
const HELPER_TIMEOUT: Duration = Duration::from_secs(600);

/// Whether an allocation was made with a POSIX descriptor handle type (so the carrier helper
/// can import it).
fn exportable(props: &protocol::record::AllocationProps) -> bool {
    props.requested_handle_types & handle_type::POSIX_FILE_DESCRIPTOR != 0
}

/// Whether the process with namespace PID `ns_pid` (in ours) has exited: signal 0 finds no such
/// process, or only a zombie.
fn creator_exited(ns_pid: u32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(ns_pid as i32) else {
        return false;
    };
    match rustix::process::test_kill_process(pid) {
        Err(rustix::io::Errno::SRCH) => true,
        // A zombie still takes signal 0; /proc tells, when it is the /proc of our namespace.
        _ if !own_proc() => false,
        _ => std::fs::read_to_string(format!("/proc/{ns_pid}/stat")).is_ok_and(|stat| {
            stat.rfind(')')
                .and_then(|i| stat.get(i + 1..))
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|state| state == "Z" || state == "X")
        }),
    }
}

/// Whether `/proc` is mounted for our PID namespace (it names us by our own PID).
fn own_proc() -> bool {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    std::fs::read_link("/proc/self").is_ok_and(|l| l.to_str() == Some(me.to_string().as_str()))
}

fn reg_is_created(rt: &Runtime, handle: VHandle) -> bool {
    rt.lock()
        .get(handle)
        .is_some_and(|o| matches!(o.kind, Kind::Created { .. }))
}

fn request_name(request: &Request) -> &'static str {
    match request {
        Request::Hello { .. } => "Hello",
        Request::Inspect => "Inspect",
        Request::GetFd { .. } => "GetFd",
        Request::Freeze { .. } => "Freeze",
        Request::Save => "Save",
        Request::SaveKeepingContexts => "SaveKeepingContexts",
        Request::Release => "Release",
        Request::Load => "Load",
        Request::Import => "Import",
        Request::Thaw => "Thaw",
        Request::Multicast(step) => step.name(),
        Request::SaveTo { .. } => "SaveTo",
        Request::LoadFrom { .. } => "LoadFrom",
        Request::SaveThroughHelper { .. } => "SaveThroughHelper",
        Request::CarrierItem { .. } => "CarrierItem",
        Request::CarrierCopy { .. } => "CarrierCopy",
        Request::CarrierForget => "CarrierForget",
        Request::CarrierShare => "CarrierShare",
        Request::CarrierPrepare { .. } => "CarrierPrepare",
        Request::Hold => "Hold",
        Request::Drain { .. } => "Drain",
        Request::Admit { .. } => "Admit",
    }
}
