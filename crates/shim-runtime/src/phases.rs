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
//!   (the `cuinterpose-copy` crate). Save and Load answer with the engine's statistics
//!   (`PhaseDone::stats`).
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
//!
//! State: none of its own here. The phases are methods of [`Capture`], whose state
//! ([`crate::capture::Control`]) they keep between requests; they work on the registry through
//! [`Tracking`] and close and open the gates through [`Drain`]. Where the bytes go is a byte store
//! (`store/`).

use crate::capture::{Capture, PhaseError, check};
use crate::drain::Drain;
use crate::log::{log_debug, log_info, log_warn};
use crate::registry::{Kind, Mapping, VHandle};
use crate::store::carrier::Carrier;
use crate::store::datafile::DataFile as DataFileStore;
use crate::store::helper::{self, Helper};
use crate::track::Tracking;
use cuda::DriverHandle;
use cuda_abi::*;
use protocol::message::{CopyStats, DataFile, StreamStats};
use protocol::record::{AllocationId, Phase};
use protocol::{Request, Response};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// One import to rebuild: handle, ID, creator, size, surviving driver handle, unmapped mappings.
type ImportItem = (
    VHandle,
    AllocationId,
    u32,
    u64,
    Option<DriverHandle>,
    Vec<(u64, Mapping)>,
);

/// What a phase request did.
enum Done {
    /// Bytes moved, and the copy engine's figures for Save and Load.
    Phase(u64, Option<CopyStats>),
    /// SaveTo and LoadFrom: bytes moved, how the streaming went, the data file.
    Streamed(u64, StreamStats, DataFile),
    /// Hold, Drain and Admit: how the drain stands.
    Drain(protocol::message::DrainReport),
    /// PinCarrier: the carrier's bytes now pinned.
    Pinned(u64),
}

impl Capture {
    /// Runs one phase request (on the control worker); `file` is the data file that came with
    /// SaveTo or LoadFrom.
    pub(crate) fn run_phase(
        &self,
        t: &Tracking,
        drain: &Drain,
        request: Request,
        file: Option<std::os::fd::OwnedFd>,
    ) -> Response {
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
            (Request::Freeze { timeout_ms }, _) => plain(self.freeze(t, drain, timeout_ms)),
            (Request::Hold, _) => drained(drain.hold(t)),
            (Request::Drain { wait_ms }, _) => {
                drained(drain.drain(t, Duration::from_millis(u64::from(wait_ms))))
            }
            (Request::Admit { count }, _) => drained(drain.admit(t, count)),
            (Request::Save, _) => copied(self.save(
                t,
                &Carrier {
                    native_follows: true,
                },
            )),
            (Request::SaveKeepingContexts, _) => copied(self.save(
                t,
                &Carrier {
                    native_follows: false,
                },
            )),
            (Request::SaveThroughHelper { native_follows }, _) => {
                copied(self.save(t, &Helper { native_follows }))
            }
            (Request::Release, _) => plain(self.release(t)),
            (Request::Load, _) => copied(self.load_saved(t)),
            (Request::Import, _) => plain(self.import(t)),
            (Request::Thaw, _) => plain(self.thaw(t, drain)),
            (Request::SaveTo { store, workers }, Some(file)) => {
                streamed(self.save(t, &DataFileStore::save_to(file.as_fd(), store, workers)))
            }
            (
                Request::LoadFrom {
                    file: record,
                    workers,
                },
                Some(file),
            ) => streamed(self.load(t, &DataFileStore::load_from(file.as_fd(), record, workers))),
            (Request::Multicast(step), _) => plain(t.multicast_step(step)),
            (Request::PinCarrier, _) => self.pin_carrier_ahead(t, drain).map(Done::Pinned),
            (other, _) => Err(PhaseError::Internal(format!(
                "{other:?} is not a phase request, or came without its descriptor"
            ))),
        };
        let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
        respond(name, micros, || t.lock().phase(), result)
    }

    /// PinCarrier: only outside a capture (inside one, the carrier may hold the bytes of a Save
    /// that growing it would unmap).
    fn pin_carrier_ahead(&self, t: &Tracking, drain: &Drain) -> Result<u64, PhaseError> {
        if self.in_capture(t, drain) {
            return Err(PhaseError::WrongPhase {
                request: "PinCarrier",
                phase: t.lock().phase(),
            });
        }
        crate::store::carrier::pin_ahead(t, self)
    }

    /// Load: from the store this cycle's Save used (the carrier helper's, or this process's own
    /// carrier).
    fn load_saved(&self, t: &Tracking) -> Result<(u64, Option<CopyStats>), PhaseError> {
        // Either store's Load takes the same items (their carrier offsets); `native_follows`
        // only matters to a Save.
        if self.control().through_helper {
            self.load(
                t,
                &Helper {
                    native_follows: true,
                },
            )
        } else {
            self.load(
                t,
                &Carrier {
                    native_follows: true,
                },
            )
        }
    }

    /// Freeze: closes the gates if the tool did not hold them first (a capture of one process),
    /// drains without admitting anything, checks for blockers and marks the process Frozen. Any
    /// failure opens the gates again: nothing was changed.
    fn freeze(&self, t: &Tracking, drain: &Drain, timeout_ms: u32) -> Result<u64, PhaseError> {
        t.expect_phase("Freeze", &[Phase::Running])?;
        if !drain.gates_closed() {
            drain.hold(t)?;
        }
        let frozen = self.drain_to_frozen(t, drain, timeout_ms);
        if frozen.is_err() {
            drain.open_gates(t);
        }
        frozen
    }

    fn drain_to_frozen(
        &self,
        t: &Tracking,
        drain: &Drain,
        timeout_ms: u32,
    ) -> Result<u64, PhaseError> {
        let timeout = Duration::from_millis(u64::from(timeout_ms));
        let busy = drain.drain_until(t, Instant::now() + timeout)?;
        if !busy.is_empty() {
            return Err(PhaseError::NotDrained { busy, timeout_ms });
        }
        if let Err(inside) = t.gate.freeze(timeout) {
            return Err(PhaseError::Timeout { inside, timeout_ms });
        }
        // Drained and held, nothing new can appear: a blocker that came after the tool's
        // inspection is caught here, before anything is released.
        let blockers = t.blockers();
        if !blockers.is_empty() {
            return Err(PhaseError::Blocked(
                blockers.iter().map(ToString::to_string).collect(),
            ));
        }
        t.set_phase(Phase::Frozen);
        Ok(0)
    }

    /// Unmaps the live mappings of an object and releases its driver handle, recording each step.
    fn release_object(&self, t: &Tracking, handle: VHandle) -> Result<u64, PhaseError> {
        let (real, size, mappings, id) = {
            let reg = t.lock();
            let Some(o) = reg.get(handle) else {
                return Ok(0);
            };
            (o.real, o.size, reg.mappings_of(handle), o.id())
        };
        if let (Some(id), true) = (id, reg_is_created(t, handle)) {
            t.exports.remove(&id);
        }
        for (address, m) in mappings.iter().filter(|(_, m)| m.mapped) {
            check(
                || format!("mapping at {address:#x}"),
                t.real.mem_unmap(*address, m.size as usize),
            )?;
            t.lock().set_mapped(*address, false);
        }
        if let Some(real) = real {
            check(|| format!("allocation {id:?}"), t.real.mem_release(real))?;
            t.lock().set_real(handle, None);
            return Ok(size);
        }
        Ok(0)
    }

    fn release(&self, t: &Tracking) -> Result<u64, PhaseError> {
        t.expect_phase("Release", &[Phase::Saved])?;
        let streamed = self.control().streamed.clone();
        let in_file = |id: Option<AllocationId>| {
            streamed
                .as_ref()
                .is_some_and(|f| f.extents.iter().any(|e| Some(e.id) == id))
        };
        let (imports, creations) = {
            let reg = t.lock();
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
        let mut bytes = t.release_multicasts()?;
        for h in imports.into_iter().chain(creations) {
            bytes += self.release_object(t, h)?;
        }
        self.shrink_stacks(t);
        t.set_phase(Phase::Released);
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
    fn shrink_stacks(&self, t: &Tracking) {
        let devices = t.lock().devices();
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
            let result = copy::enter(&t.real, device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| {
                    let what = || format!("the stack size of device {device}");
                    let size = check(what, t.real.ctx_get_limit(limit::STACK_SIZE))?;
                    check(what, t.real.ctx_set_limit(limit::STACK_SIZE, 0))?;
                    Ok(size)
                });
            match result {
                Ok(size) => shrunk.push((device, size)),
                Err(e) => log_debug!("stack of device {device} kept: {e}"),
            }
        }
        self.control().shrunk_stacks.extend(shrunk);
    }

    /// Puts back the stack sizes [`Capture::shrink_stacks`] set to zero (at the end of Import, and
    /// in Thaw for what a rebuild without Import left).
    fn restore_stacks(&self, t: &Tracking) {
        let shrunk = std::mem::take(&mut self.control().shrunk_stacks);
        for (device, size) in shrunk {
            let result = copy::enter(&t.real, device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| {
                    check(
                        || format!("the stack size of device {device}"),
                        t.real.ctx_set_limit(limit::STACK_SIZE, size),
                    )
                });
            if let Err(e) = result {
                log_warn!("{e}; the driver sizes the stack at the next launch that needs it");
            }
        }
    }

    fn import(&self, t: &Tracking) -> Result<u64, PhaseError> {
        t.expect_phase(
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
                let reg = t.lock();
                let mut v: Vec<VHandle> = reg
                    .objects()
                    .filter(|(_, o)| matches!(o.kind, Kind::Imported { .. }) && o.real.is_some())
                    .map(|(h, _)| h)
                    .collect();
                v.sort_unstable();
                v
            };
            for handle in held {
                self.release_object(t, handle)?;
            }
        }
        let items: Vec<ImportItem> = {
            let reg = t.lock();
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
                    let fd = match t.fetch_fd(creator, id) {
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
                        t.real.mem_import_fd(fd.as_fd()),
                    )?;
                    drop(fd);
                    (got, true)
                }
            };
            let mapped = match t.map_recorded(real, &unmapped) {
                Ok(m) => m,
                Err(e) => {
                    if fresh {
                        t.release_unpublished([real]);
                    }
                    return Err(e);
                }
            };
            let mut reg = t.lock();
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
        self.restore_stacks(t);
        t.set_phase(Phase::Imported);
        Ok(bytes)
    }

    /// What capture released that is not rebuilt yet.
    fn not_rebuilt(&self, t: &Tracking) -> Vec<String> {
        let reg = t.lock();
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
                } => !t.exports.contains(&id),
                _ => false,
            };
            if o.real.is_none() || unmapped > 0 || uncached {
                out.push(format!("{:?}", o.id()));
            }
        }
        out
    }

    pub(crate) fn thaw(&self, t: &Tracking, drain: &Drain) -> Result<u64, PhaseError> {
        if t.lock().phase() == Phase::Running {
            // A capture given up after Hold: the gates open, nothing else was touched.
            drain.open_gates(t);
            return Ok(0);
        }
        let mut missing = self.not_rebuilt(t);
        missing.extend(t.multicasts_not_rebuilt());
        if !missing.is_empty() {
            return Err(PhaseError::NotRebuilt(format!(
                "cannot thaw: {} objects released and not rebuilt ({}); send Load, Import and the multicast steps first",
                missing.len(),
                missing.join(", ")
            )));
        }
        {
            let mut reg = t.lock();
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
                && let Err(e) = control.carrier.unpin(&t.real)
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
            helper::forget_carrier(t);
        }
        self.control().release_started = false;
        self.control().lost_imports.clear();
        self.restore_stacks(t);
        drain.open_gates(t);
        Ok(0)
    }

    /// Whether this process is inside a capture: gates closed, or a phase other than Running
    /// (the server keeps the capture lease while it is: lease.rs).
    pub(crate) fn in_capture(&self, t: &Tracking, drain: &Drain) -> bool {
        drain.gates_closed() || t.lock().phase() != Phase::Running
    }

    /// The tool that held this capture is gone (lease.rs): undo a capture that released
    /// nothing; keep one that did for `cuinterpose resume`.
    pub(crate) fn lease_lost(&self, t: &Tracking, drain: &Drain) {
        if !self.in_capture(t, drain) {
            return;
        }
        let phase = t.lock().phase();
        // Only a capture that never reached Release is undone here; anything from Release on (a
        // rebuild half done included) is finished by `cuinterpose resume` from the state file,
        // for the whole group at once.
        let released = self.control().release_started
            || !matches!(phase, Phase::Running | Phase::Frozen | Phase::Saved);
        if released {
            // Every suspend and checkpoint ends this way (the tool exits, or drops its
            // connections before CRIU): not a warning, and never on the application's stderr,
            // whose file CRIU restores only at its recorded size.
            log_info!(
                "the tool holding this capture is gone after memory was released ({phase:?}): \
                 the process stays suspended until `cuinterpose resume`"
            );
            return;
        }
        log_warn!("the tool holding this capture is gone before anything was released: thawing");
        if let Err(e) = self.thaw(t, drain) {
            log_warn!("cannot thaw after the tool was lost: {e}; `cuinterpose resume` can");
        }
    }
}

/// The answer to phase request `name`, which took `micros`, from what it did; `phase` is the
/// phase the process is in after it.
fn respond(
    name: &str,
    micros: u64,
    phase: impl Fn() -> Phase,
    result: Result<Done, PhaseError>,
) -> Response {
    match result {
        Ok(Done::Phase(bytes, stats)) => {
            let phase = phase();
            log_info!("{name} done: {bytes} bytes in {micros} us, now {phase:?}");
            Response::PhaseDone {
                phase,
                bytes,
                micros,
                stats,
            }
        }
        Ok(Done::Streamed(bytes, stats, file)) => {
            let phase = phase();
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
        Ok(Done::Pinned(pinned)) => {
            log_info!("{name} done: {pinned} bytes of the carrier pinned in {micros} us");
            Response::Prepared { pinned, micros }
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

fn reg_is_created(t: &Tracking, handle: VHandle) -> bool {
    t.lock()
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
        Request::PinCarrier => "PinCarrier",
        Request::Hold => "Hold",
        Request::Drain { .. } => "Drain",
        Request::Admit { .. } => "Admit",
    }
}
