//! Suspend and resume in place: the capture phases of docs/design.md driven over every
//! participant, the native lock and checkpoint around them, and the rebuild after native restore.
//!
//! Order of a suspend: discover → inspect (read-only, whole-group checks) → freeze → inspect again
//! (frozen, nothing in flight) → state file → save → release → inspect (all released) → native lock
//! of every process → native checkpoint of each. Resume: native restore and unlock of each process
//! that needs it → load (creators) → import (importers) → verify (records equal the captured
//! ones) → thaw.
//!
//! Up to the native lock every failure is rolled back with the resume code (load, import, thaw), so
//! the workload keeps running; participants that exited are left out of the rollback and named.
//! After the lock, the step and the process are named and the tool still tries to bring every
//! process back. The state file exists from before the first destructive step, so `resume` also
//! recovers a group whose tool was killed at any step: it takes each process from the native state
//! it finds (checkpointed, locked, or still running) and rebuilds what its shim released.

use crate::config::ToolConfig;
use crate::group::{Group, Participant, PhaseResult, Snapshot, check_group};
use crate::native::{Driver, NativeCheckpoint, ProcessState};
use crate::procfs::{Proc, Procs};
use crate::{ControlError, Refusal};
use protocol::state::{CarrierInfo, GroupState, ParticipantState, SuspendMode};
use protocol::{MulticastStep, Phase, ProcessRecord, Request};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Name of the topology file in a state directory.
pub const STATE_FILE: &str = "cuinterpose.state";
/// Largest state file the tool reads back.
pub const STATE_FILE_LIMIT: u64 = protocol::state::MAX_STATE_FILE_LEN;

/// Where a suspended group's state lives unless `--state-dir` says otherwise.
pub fn default_state_dir(root: u32) -> PathBuf {
    std::env::temp_dir().join(format!("cuinterpose-suspended-{root}"))
}

/// Receives progress of long phases (the CLI draws bars on a terminal).
pub trait Progress: Sync {
    /// A phase starts; `total_bytes` is known for the phases that move bytes.
    fn phase_started(&self, _name: &'static str, _total_bytes: Option<u64>) {}
    /// Bytes moved by one participant.
    fn advance(&self, _bytes: u64) {}
    /// One participant finished a phase request (`step`): what its shim reported, with the copy
    /// statistics of Save and Load (the benchmark reads them here).
    fn participant_done(&self, _step: &'static str, _process: &str, _result: &PhaseResult) {}
    fn phase_finished(&self, _timing: &PhaseTiming) {}
}

/// Progress that goes nowhere.
#[derive(Debug, Default)]
pub struct Quiet;
impl Progress for Quiet {}

/// How long a phase took over the whole group, and what it moved.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseTiming {
    pub name: &'static str,
    pub millis: f64,
    pub bytes: u64,
    /// Longest time a single shim spent in it (the group's phases run in parallel).
    pub slowest_shim_millis: f64,
}

impl PhaseTiming {
    /// Bytes per second over the phase's wall time, when it moved bytes.
    pub fn gigabytes_per_second(&self) -> Option<f64> {
        (self.bytes > 0 && self.millis > 0.0).then(|| self.bytes as f64 / self.millis / 1e6)
    }
}

/// Options of a suspend.
#[derive(Debug, Clone)]
pub struct SuspendOptions {
    pub root: u32,
    pub state_dir: PathBuf,
    /// Time the shims get to drain tracked calls in flight.
    pub freeze_timeout: Duration,
    /// `cuCheckpointProcessLock` timeout.
    pub lock_timeout_ms: u32,
    /// The driver library the tool loads (`None`: `libcuda.so.1` from the search path).
    pub driver: Option<PathBuf>,
    /// The tool's settings (the answer timeout; CRIU for a checkpoint to disk).
    pub config: ToolConfig,
    /// Whether the native lock and checkpoint follow the release (`KeepContexts`: they do not,
    /// and the contexts stay resident). A checkpoint to disk always captures `Native`.
    pub mode: SuspendMode,
    /// `--carrier`: the carrier asked for (crate::carrier_choice).
    pub carrier: crate::carrier_choice::Requested,
    /// How a carrier helper is started where none runs; `None`: this caller cannot start one, so
    /// `auto` keeps each process's own carrier and `helper` is refused.
    pub helper: Option<crate::carrier_helper::HelperLaunch>,
}

impl SuspendOptions {
    pub fn new(root: u32, config: &ToolConfig) -> SuspendOptions {
        SuspendOptions {
            root,
            state_dir: default_state_dir(root),
            freeze_timeout: Duration::from_secs(30),
            lock_timeout_ms: 10_000,
            driver: None,
            config: config.clone(),
            mode: SuspendMode::Native,
            carrier: crate::carrier_choice::Requested::Auto,
            helper: None,
        }
    }
}

/// One participant in a report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ParticipantSummary {
    pub host_pid: u32,
    pub ns_pid: u32,
    pub command: String,
    /// Allocations it created (shared or private): what its carrier holds.
    pub created: usize,
    /// Of those, the ones it shares (exported).
    pub created_shared: usize,
    pub imported: usize,
    /// Bytes of its creations saved to the carrier.
    pub saved_bytes: u64,
}

/// What a suspend or resume did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub participants: Vec<ParticipantSummary>,
    pub phases: Vec<PhaseTiming>,
    /// Bytes of the allocations the shims created, shared or private, saved to (or loaded from)
    /// host carriers.
    pub saved_bytes: u64,
    pub state_file: PathBuf,
    pub total_millis: f64,
    /// Captured processes that had exited and were left out (`resume --allow-lost`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<String>,
    /// What could not be rebuilt because its creator is among `lost`: imports left unmapped.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_rebuilt: Vec<String>,
    /// When each process was drained, from the hold (a capture; empty for a rebuild).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drained: Vec<crate::drain::Drained>,
    /// The carrier the capture used, why, and what it holds (a capture; none for a rebuild).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<crate::carrier_choice::CarrierChoice>,
}

pub(crate) fn summarize(snapshots: &[Snapshot]) -> Vec<ParticipantSummary> {
    snapshots
        .iter()
        .map(|s| {
            let created = &s.record.allocations;
            ParticipantSummary {
                host_pid: s.info.host_pid,
                ns_pid: s.info.ns_pid,
                command: s.info.command.clone(),
                created: created.len(),
                created_shared: created.iter().filter(|a| a.shared).count(),
                imported: s.record.imports.len(),
                saved_bytes: created.iter().map(|a| a.size).sum(),
            }
        })
        .collect()
}

/// Records the phases of one run.
pub(crate) struct Clock<'a> {
    progress: &'a dyn Progress,
    pub(crate) phases: Vec<PhaseTiming>,
    /// When each process was drained, from the hold (a capture's first step).
    pub(crate) drained: Vec<crate::drain::Drained>,
}

impl<'a> Clock<'a> {
    /// Where the phases report the bytes they move, for the phases timed outside this module.
    pub(crate) fn progress(&self) -> &'a dyn Progress {
        self.progress
    }

    pub(crate) fn new(progress: &'a dyn Progress) -> Clock<'a> {
        Clock {
            progress,
            phases: Vec::new(),
            drained: Vec::new(),
        }
    }

    /// Times `step`, which returns the bytes it moved and the slowest shim's time.
    pub(crate) fn time<T>(
        &mut self,
        name: &'static str,
        total_bytes: Option<u64>,
        step: impl FnOnce() -> Result<(T, u64, f64), ControlError>,
    ) -> Result<T, ControlError> {
        self.progress.phase_started(name, total_bytes);
        let start = Instant::now();
        let (value, bytes, slowest_shim_millis) = step()?;
        let timing = PhaseTiming {
            name,
            millis: millis_since(start),
            bytes,
            slowest_shim_millis,
        };
        self.progress.phase_finished(&timing);
        self.phases.push(timing);
        Ok(value)
    }
}

fn millis_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// Sends `request` to every participant at once (one thread each) and waits for all.
fn phase_all(
    participants: &mut [Participant],
    step: &'static str,
    request: &Request,
    progress: &dyn Progress,
) -> Result<(Vec<PhaseResult>, u64, f64), ControlError> {
    let results: Vec<Result<PhaseResult, ControlError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = participants
            .iter_mut()
            .map(|p| {
                scope.spawn(move || {
                    let result = p
                        .phase(request)
                        .map_err(|e| step_error(step, &p.info.label(), e));
                    if let Ok(r) = &result {
                        progress.advance(r.bytes);
                        progress.participant_done(step, &p.info.label(), r);
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ControlError::Protocol {
                        process: "tool".into(),
                        message: format!("a {step} thread panicked"),
                    })
                })
            })
            .collect()
    });
    let mut done = Vec::new();
    let mut first_error = None;
    for result in results {
        match result {
            Ok(r) => done.push(r),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let bytes = done.iter().map(|r| r.bytes).sum();
    let slowest = done.iter().map(|r| r.micros).max().unwrap_or(0) as f64 / 1e3;
    Ok((done, bytes, slowest))
}

fn step_error(step: &'static str, process: &str, source: ControlError) -> ControlError {
    ControlError::Step {
        step,
        process: process.to_string(),
        source: Box::new(source),
    }
}

/// Where a capture's Save puts the shared bytes, and so where a rebuild loads them from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bytes<'a> {
    /// The shims' host carriers (Save, Load): a suspend in place.
    Carriers,
    /// Data files the shims stream (SaveTo, LoadFrom): a checkpoint to disk.
    Files(&'a crate::disk::DataFiles),
}

/// Save (or SaveTo) to every participant: bytes moved and the slowest shim's milliseconds.
/// `mode` tells the shims whether a native checkpoint follows (their `auto` carrier pins only
/// for a cycle that skips it).
/// Save (or SaveTo) to every participant; with carriers, also what the carriers cost the Save.
fn save_all(
    participants: &mut [Participant],
    bytes: Bytes<'_>,
    mode: SuspendMode,
    through_helper: bool,
    progress: &dyn Progress,
) -> Result<(u64, f64, Option<crate::carrier_choice::SaveCarriers>), ControlError> {
    match bytes {
        Bytes::Carriers => {
            let save = match (mode, through_helper) {
                (_, true) => Request::SaveThroughHelper {
                    native_follows: mode == SuspendMode::Native,
                },
                (SuspendMode::Native, false) => Request::Save,
                (SuspendMode::KeepContexts, false) => Request::SaveKeepingContexts,
            };
            phase_all(participants, "save", &save, progress).map(|(results, b, s)| {
                let moved: Vec<_> = results
                    .iter()
                    .filter_map(|r| r.stats.as_ref())
                    .filter(|st| st.bytes > 0)
                    .collect();
                let carriers = crate::carrier_choice::SaveCarriers {
                    carrier_millis: moved.iter().map(|st| st.carrier_micros).max().unwrap_or(0)
                        as f64
                        / 1e3,
                    carriers_reused: moved.iter().all(|st| st.carrier_reused),
                };
                (b, s, Some(carriers))
            })
        }
        Bytes::Files(files) => files
            .save_all(participants, progress)
            .map(|(b, s)| (b, s, None)),
    }
}

/// Load (or LoadFrom) to every participant.
fn load_all(
    participants: &mut [Participant],
    bytes: Bytes<'_>,
    progress: &dyn Progress,
) -> Result<(u64, f64), ControlError> {
    match bytes {
        Bytes::Carriers => {
            phase_all(participants, "load", &Request::Load, progress).map(|(_, b, s)| (b, s))
        }
        Bytes::Files(files) => files.load_all(participants, progress),
    }
}

/// Sends the rebuild (load, import, the multicast steps, thaw) to every participant: the rollback
/// of a capture that failed before the native lock. Returns every error it met.
fn rebuild(group: &mut Group, clock: &mut Clock<'_>, bytes: Bytes<'_>) -> Vec<ControlError> {
    let mut errors = Vec::new();
    if let Err(e) = clock.time("load", None, || {
        load_all(&mut group.participants, bytes, clock.progress).map(|(b, s)| ((), b, s))
    }) {
        errors.push(e);
    }
    let multicast = MulticastStep::ALL.map(|step| (step.name(), Request::Multicast(step)));
    for (name, request) in std::iter::once(("import", Request::Import)).chain(multicast) {
        if let Err(e) = clock.time(name, None, || {
            phase_all(&mut group.participants, name, &request, clock.progress)
                .map(|(_, bytes, slowest)| ((), bytes, slowest))
        }) {
            errors.push(e);
        }
    }
    errors.extend(thaw_all(group));
    errors
}

/// Thaw to every participant; a process whose capture another run holds is that run's to
/// thaw, not an error of ours.
fn thaw_all(group: &mut Group) -> Vec<ControlError> {
    group
        .participants
        .iter_mut()
        .filter_map(|p| match p.phase(&Request::Thaw) {
            Ok(_)
            | Err(ControlError::Shim {
                code: protocol::ErrorCode::Busy,
                ..
            }) => None,
            Err(e) => Some(step_error("thaw", &p.info.label(), e)),
        })
        .collect()
}

/// Rolls back a capture that failed before the native lock: participants that exited are left
/// out (nothing of theirs can be rebuilt, and waiting for them would fail every survivor's
/// report), the survivors get `rollback` (the rebuild, or only a thaw when nothing was
/// released yet).
fn roll_back(
    group: &mut Group,
    procs: &dyn Procs,
    clock: &mut Clock<'_>,
    failure: ControlError,
    rollback: &dyn Fn(&mut Group, &mut Clock<'_>) -> Vec<ControlError>,
) -> ControlError {
    let mut lost = Vec::new();
    group.participants.retain(|p| {
        let gone = procs.exited(p.info.host_pid);
        if gone {
            lost.push(p.info.label());
        }
        !gone
    });
    let failure = if lost.is_empty() {
        failure
    } else {
        tracing::error!(processes = %lost.join(", "), "participants exited during the capture");
        ControlError::ParticipantsExited {
            processes: lost,
            failure: Box::new(failure),
        }
    };
    let errors = rollback(group, clock);
    if errors.is_empty() {
        ControlError::RolledBack {
            failure: Box::new(failure),
        }
    } else {
        ControlError::RollbackFailed {
            failure: Box::new(failure),
            rollback: errors,
        }
    }
}

fn thaw_only(group: &mut Group, _clock: &mut Clock<'_>) -> Vec<ControlError> {
    thaw_all(group)
}

/// Suspends the group under `options.root` in place: afterwards its processes hold no GPU memory
/// and stay alive, and `cuinterpose.state` in the state directory describes what to rebuild.
pub fn suspend(options: &SuspendOptions, progress: &dyn Progress) -> Result<Report, ControlError> {
    let start = Instant::now();
    let mut clock = Clock::new(progress);
    let _lock = lock_tree(options.root)?;
    let state_path = check_state_dir(&options.state_dir)?;
    let (group, captured, mut carrier) =
        capture(options, &state_path, &mut clock, Bytes::Carriers)?;
    // The measured cost, once the tool's own connections are closed.
    drop(group);
    carrier.pinned_host_bytes = pinned_after_save(&captured, options.config.answer_timeout);
    Ok(Report {
        carrier: Some(carrier),
        participants: summarize(&captured),
        drained: clock.drained,
        phases: clock.phases,
        saved_bytes: saved_bytes(&captured),
        state_file: state_path,
        total_millis: millis_since(start),
        lost: Vec::new(),
        not_rebuilt: Vec::new(),
    })
}

/// Takes this run's lock on every process of the tree under `root` (crate::runlock): the first
/// thing every command that changes a group does, so a second run is refused before it reads or
/// changes anything.
pub(crate) fn lock_tree(root: u32) -> Result<crate::runlock::RunLock, ControlError> {
    let tree = crate::discovery::process_tree(root)?;
    crate::runlock::RunLock::processes(&tree)
}

/// What a capture drives besides the shims: the driver's checkpoint calls (none for a
/// keep-contexts suspend, which makes no native call) and `/proc` (who exited half way).
#[derive(Clone, Copy)]
pub(crate) struct Host<'a> {
    pub(crate) native: Option<&'a dyn NativeCheckpoint>,
    pub(crate) procs: &'a dyn Procs,
}

/// Everything of a suspend up to and including the native checkpoint of every process: on success
/// the group is connected, every process is checkpointed natively, and `state_path` holds the
/// topology, and the result says which carrier the bytes went through; on failure the workload
/// was rolled back (or the error says it could not be).
pub(crate) fn capture(
    options: &SuspendOptions,
    state_path: &Path,
    clock: &mut Clock<'_>,
    bytes: Bytes<'_>,
) -> Result<(Group, Vec<Snapshot>, crate::carrier_choice::CarrierChoice), ControlError> {
    let mut need = 0;
    let mut group = clock.time("inspect", None, || {
        let mut group = Group::discover(options.root, options.config.answer_timeout)?;
        let snapshots = group.snapshot()?;
        let refusals = check_group(&snapshots, Phase::Running);
        if !refusals.is_empty() {
            return Err(ControlError::Refused(refusals));
        }
        need = saved_bytes(&snapshots);
        Ok((group, 0, 0.0))
    })?;
    // Load the driver before anything changes: without a checkpoint API nothing may start. The
    // keep mode makes no native call, so it needs none.
    let driver = match options.mode {
        SuspendMode::Native => Some(Driver::load(options.driver.as_deref())?),
        SuspendMode::KeepContexts => None,
    };
    let mut choice = carrier_for(options, &group, driver.as_ref(), need, bytes)?;
    let host = Host {
        native: driver.as_ref().map(|d| d as &dyn NativeCheckpoint),
        procs: &Proc,
    };
    let captured = capture_group(
        &mut group,
        host,
        options,
        state_path,
        clock,
        bytes,
        &mut choice,
    )?;
    Ok((group, captured, choice))
}

/// The carrier of a capture (none for one to disk: the shims stream to data files), with the
/// carrier helper of every control directory of the group answering, or started, before
/// anything changes.
fn carrier_for(
    options: &SuspendOptions,
    group: &Group,
    driver: Option<&Driver>,
    need: u64,
    bytes: Bytes<'_>,
) -> Result<crate::carrier_choice::CarrierChoice, ControlError> {
    let choice = match bytes {
        Bytes::Carriers => choose_carrier(options, group, driver, need)?,
        Bytes::Files(_) => {
            crate::carrier_choice::none_for_disk(crate::carrier_choice::host_facts())
        }
    };
    if let (Some(launch), crate::carrier_choice::Carrier::Helper) =
        (&options.helper, choice.carrier)
    {
        for dir in control_dirs(group) {
            crate::carrier_helper::ensure(dir, launch).map_err(|e| ControlError::Unchanged {
                source: Box::new(e),
            })?;
        }
    }
    Ok(choice)
}

/// The capture of a connected group that passed its checks: hold, drain and freeze, the state
/// file, save and release, the native lock and checkpoint. Every failure is rolled back (the
/// state file removed with it) or says why it could not be; returns the frozen records.
fn capture_group(
    group: &mut Group,
    host: Host<'_>,
    options: &SuspendOptions,
    state_path: &Path,
    clock: &mut Clock<'_>,
    bytes: Bytes<'_>,
    choice: &mut crate::carrier_choice::CarrierChoice,
) -> Result<Vec<Snapshot>, ControlError> {
    let captured = freeze(group, host, options, clock)?;
    let saved_bytes = saved_bytes(&captured);
    // The topology is published before anything is released: a tool killed from here on leaves a
    // state file from which `cuinterpose resume` rebuilds the group (the shims' records are the
    // same in every phase).
    let dir_existed = state_path.parent().is_none_or(Path::exists);
    let published = clock.time("state", None, || {
        write_state(state_path, &captured, options.mode).map(|()| ((), 0, 0.0))
    });
    // What a rollback removes: the state file, and its directory when this run made it.
    let unpublish = || {
        let _ = std::fs::remove_file(state_path);
        if !dir_existed && let Some(dir) = state_path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    };
    if let Err(e) = published {
        unpublish();
        return Err(roll_back(group, host.procs, clock, e, &thaw_only));
    }

    // Save and release: from here until the native lock, failures are rolled back.
    let destructive = save_and_release(group, clock, options, bytes, choice, saved_bytes).and_then(
        |()| match host.native {
            Some(native) => clock.time("native-checkpoint", None, || {
                native_checkpoint(native, group, options.lock_timeout_ms).map(|()| ((), 0, 0.0))
            }),
            // The shims hold their gate closed from the freeze on, so the application's tracked
            // calls block as in a native suspend; contexts, modules and streams stay where they
            // are.
            None => Ok(()),
        },
    );
    if let Err(e) = destructive {
        let error = roll_back(group, host.procs, clock, e, &|g, c| rebuild(g, c, bytes));
        // A failed rollback keeps the state file: `cuinterpose resume` can try again from it.
        if matches!(error, ControlError::RolledBack { .. }) {
            unpublish();
        }
        return Err(error);
    }
    Ok(captured)
}

/// Hold, drain, freeze (crate::drain), then the frozen records, checked: a failure opens every
/// gate again and changes nothing else.
fn freeze(
    group: &mut Group,
    host: Host<'_>,
    options: &SuspendOptions,
    clock: &mut Clock<'_>,
) -> Result<Vec<Snapshot>, ControlError> {
    let progress = clock.progress;
    let freeze = Request::Freeze {
        timeout_ms: options.freeze_timeout.as_millis().min(u32::MAX as u128) as u32,
    };
    let mut drained = Vec::new();
    let frozen = clock.time("freeze", None, || {
        let timeout = options.freeze_timeout + options.config.answer_timeout;
        for p in &mut group.participants {
            p.set_timeout(Some(timeout))?;
        }
        drained =
            crate::drain::drain_group(group.participants.as_mut_slice(), options.freeze_timeout)?;
        phase_all(&mut group.participants, "freeze", &freeze, progress).and_then(|_| {
            let snapshots = group.snapshot()?;
            let refusals = check_group(&snapshots, Phase::Frozen);
            if refusals.is_empty() {
                Ok((snapshots, 0, 0.0))
            } else {
                Err(ControlError::Refused(refusals))
            }
        })
    });
    match frozen {
        Ok(frozen) => {
            clock.drained = drained;
            Ok(frozen)
        }
        // Another run holds a process: ours are opened again, the other run's left to it.
        Err(e @ ControlError::AnotherRun { .. }) => {
            let _ = thaw_all(group);
            Err(e)
        }
        // A context that holds a sticky error: nothing was frozen or released, so a refusal once
        // every gate is open again.
        Err(e @ ControlError::StickyError { .. }) => {
            let _ = thaw_all(group);
            Err(e)
        }
        Err(e) => Err(roll_back(group, host.procs, clock, e, &thaw_only)),
    }
}

/// Save and Release in every process, then a check that each still answers and holds no memory
/// the shims own (the native checkpoint may start). The carriers the save used go into `choice`.
fn save_and_release(
    group: &mut Group,
    clock: &mut Clock<'_>,
    options: &SuspendOptions,
    bytes: Bytes<'_>,
    choice: &mut crate::carrier_choice::CarrierChoice,
    saved_bytes: u64,
) -> Result<(), ControlError> {
    let progress = clock.progress;
    let through_helper = choice.carrier == crate::carrier_choice::Carrier::Helper;
    for p in &mut group.participants {
        // Copies of many GiB take as long as they take; a dead shim still fails the socket at
        // once.
        p.set_timeout(None)?;
    }
    choice.save = clock.time("save", Some(saved_bytes), || {
        save_all(
            &mut group.participants,
            bytes,
            options.mode,
            through_helper,
            progress,
        )
        .map(|(b, s, carriers)| (carriers, b, s))
    })?;
    clock.time("release", None, || {
        phase_all(
            &mut group.participants,
            "release",
            &Request::Release,
            progress,
        )
        .map(|(_, b, s)| ((), b, s))
    })?;
    // Everyone still answers and holds no memory the shims own: the native checkpoint may start.
    let released = group.snapshot()?;
    let refusals = check_group(&released, Phase::Released);
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(ControlError::Refused(refusals))
    }
}

/// What `cuinterpose prepare` did: the carrier a suspend will use, and per process what was pinned
/// ahead of it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PrepareReport {
    pub carrier: crate::carrier_choice::CarrierChoice,
    /// `CUINTERPOSE_PIN_AHEAD_MIB` in bytes (`None`: no budget beyond the carrier choice's own
    /// limits).
    pub budget_bytes: Option<u64>,
    pub processes: Vec<PreparedProcess>,
    /// Why nothing was pinned ahead (each process's own carrier was chosen), if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nothing_to_pin: Option<String>,
    pub total_millis: f64,
}

/// One process's carrier, prepared ahead of the first suspend.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PreparedProcess {
    pub process: String,
    /// Bytes of the allocations it created: what its Save moves.
    pub bytes: u64,
    /// Bytes of its carrier now pinned (0: left to the first suspend, `skipped` says why).
    pub pinned_bytes: u64,
    pub pin_millis: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// Prepares the carriers of the group under `options.root` ahead of its first suspend, so that
/// the first cycle runs at the rate of later ones: chooses the carrier as a plain suspend would
/// (`options.carrier`), and where that is the carrier helper, starts it and has it make and pin
/// each process's carrier (in 256 MiB pieces, in the helper's process: the application runs on,
/// nothing of it is held or frozen), process by process while `budget` (bytes) allows. The
/// processes that allocate after it grow their carrier at their first Save, which pins the rest.
pub fn prepare(
    options: &SuspendOptions,
    budget: Option<u64>,
) -> Result<PrepareReport, ControlError> {
    let start = Instant::now();
    // No suspend of another run may save through a carrier while it is being prepared.
    let _lock = lock_tree(options.root)?;
    let mut group = Group::discover(options.root, options.config.answer_timeout)?;
    let snapshots = group.snapshot()?;
    let refusals = check_group(&snapshots, Phase::Running);
    if !refusals.is_empty() {
        return Err(ControlError::Refused(refusals));
    }
    let plain = SuspendOptions {
        mode: SuspendMode::Native,
        ..options.clone()
    };
    let choice = choose_carrier(&plain, &group, None, saved_bytes(&snapshots))?;
    let mut report = PrepareReport {
        carrier: choice,
        budget_bytes: budget,
        processes: Vec::new(),
        nothing_to_pin: None,
        total_millis: 0.0,
    };
    let launch = match (&options.helper, report.carrier.carrier) {
        (Some(launch), crate::carrier_choice::Carrier::Helper) => launch,
        _ => {
            report.nothing_to_pin = Some(
                "each process's own carrier: a plain cycle stages through small buffers, so \
                 nothing is pinned ahead"
                    .into(),
            );
            report.total_millis = millis_since(start);
            return Ok(report);
        }
    };
    for dir in control_dirs(&group) {
        crate::carrier_helper::ensure(dir, launch)?;
    }
    // The tool's connections go: the shims are not part of the preparation.
    group.participants.clear();
    let mut left = budget.unwrap_or(u64::MAX);
    for s in &snapshots {
        let bytes: u64 = s.record.allocations.iter().map(|a| a.size).sum();
        let mut prepared = PreparedProcess {
            process: s.info.label(),
            bytes,
            pinned_bytes: 0,
            pin_millis: 0.0,
            skipped: None,
        };
        let socket = s
            .info
            .control_socket
            .as_deref()
            .and_then(Path::parent)
            .map(|dir| dir.join(protocol::message::CARRIER_HELPER_SOCKET));
        match socket {
            _ if bytes == 0 => prepared.skipped = Some("it created no allocation".into()),
            _ if bytes > left => {
                prepared.skipped = Some(format!(
                    "beyond the budget (CUINTERPOSE_PIN_AHEAD_MIB): {} MiB left",
                    left >> 20
                ))
            }
            None => prepared.skipped = Some("no control socket".into()),
            // Best effort: a carrier not prepared is made by the first Save, as without prepare.
            Some(socket) => match crate::carrier_helper::prepare(&socket, s.info.host_pid, bytes) {
                Ok((pinned, micros)) => {
                    left -= bytes;
                    prepared.pinned_bytes = pinned;
                    prepared.pin_millis = micros as f64 / 1e3;
                }
                Err(e) => prepared.skipped = Some(e.to_string()),
            },
        }
        report.processes.push(prepared);
    }
    report.carrier.pinned_host_bytes = report.processes.iter().map(|p| p.pinned_bytes).sum();
    report.total_millis = millis_since(start);
    Ok(report)
}

/// The control directories of the group's shims, each once.
fn control_dirs(group: &Group) -> Vec<&Path> {
    let mut dirs: Vec<&Path> = group
        .participants
        .iter()
        .filter_map(|p| p.info.control_socket.as_deref()?.parent())
        .collect();
    dirs.sort_unstable();
    dirs.dedup();
    dirs
}

/// Host memory the group's carriers hold pinned after its Save, as each shim's HELLO says now
/// (a connection's HELLO is from before the Save): its own pinned carrier, and the helper's carrier
/// of what it saved there (the helper pins all of it, in 256 MiB pieces). A process that does not
/// answer counts nothing.
fn pinned_after_save(snapshots: &[Snapshot], timeout: std::time::Duration) -> u64 {
    snapshots
        .iter()
        .filter_map(|s| Participant::connect(s.info.clone(), timeout).ok())
        .map(|p| {
            p.hello.carrier_pinned_bytes
                + p.hello.carrier_helper.as_ref().map_or(0, |h| h.held_bytes)
        })
        .sum()
}

/// The carrier of this suspend (crate::carrier_choice), from what the machine allows now; a
/// carrier asked for that the machine cannot hold is refused, nothing changed.
fn choose_carrier(
    options: &SuspendOptions,
    group: &Group,
    driver: Option<&Driver>,
    need: u64,
) -> Result<crate::carrier_choice::CarrierChoice, ControlError> {
    use crate::carrier_choice::{Requested, choose, device_rooms, host_facts};
    let mut machine = host_facts();
    let requested = match (options.carrier, &options.helper) {
        // Nothing here can start a helper: every process keeps its own carrier.
        (Requested::Auto, None) => Requested::Process,
        (requested, _) => requested,
    };
    let helper_possible = requested == Requested::Helper
        || (requested == Requested::Auto && options.mode == SuspendMode::Native);
    if helper_possible {
        let dirs = control_dirs(group);
        machine.helper_running = !dirs.is_empty()
            && dirs.iter().all(|dir| {
                std::os::unix::net::UnixStream::connect(
                    dir.join(protocol::message::CARRIER_HELPER_SOCKET),
                )
                .is_ok()
            });
        // Where auto falls back for want of pinning anyway, the devices are not asked: on a GPU
        // each answer costs the tool a context on that device.
        let falls_back = requested == Requested::Auto
            && crate::carrier_choice::no_pinning(&machine, need).is_some();
        if !machine.helper_running && !falls_back {
            // Room for the helper's context on every device, as the driver reports it now (the
            // group still holds all its memory).
            let loaded;
            let driver = match driver {
                Some(d) => d,
                None => {
                    loaded = Driver::load(options.driver.as_deref())?;
                    &loaded
                }
            };
            machine.devices = device_rooms(driver)?;
        }
    }
    let mut choice = choose(
        requested,
        options.mode,
        need,
        machine,
        options.config.helper_context_bytes,
    )
    .map_err(|reason| ControlError::CarrierRefused {
        carrier: "helper",
        reason,
    })?;
    if options.carrier == Requested::Auto {
        choice.requested = Requested::Auto;
        if options.helper.is_none() {
            choice.reason = "each process's own carrier: this caller cannot start a carrier \
                             helper"
                .into();
        }
    }
    if requested == Requested::Helper && options.helper.is_none() {
        return Err(ControlError::CarrierRefused {
            carrier: "helper",
            reason: "this caller cannot start a carrier helper".into(),
        });
    }
    Ok(choice)
}

/// Bytes of every allocation the shims created, shared or private: what Save copies.
fn saved_bytes(snapshots: &[Snapshot]) -> u64 {
    snapshots
        .iter()
        .flat_map(|s| &s.record.allocations)
        .map(|a| a.size)
        .sum()
}

/// Locks every process, then checkpoints each. On a failure it brings back what it changed (restore
/// and unlock) before returning the error, so the caller can roll the shims back.
fn native_checkpoint(
    driver: &dyn NativeCheckpoint,
    group: &Group,
    lock_timeout_ms: u32,
) -> Result<(), ControlError> {
    let pids: Vec<(u32, String)> = group
        .participants
        .iter()
        .map(|p| (p.info.host_pid, p.info.label()))
        .collect();
    // Every process is frozen by its shim (no tracked call in flight, contexts synchronised), so
    // the locks go in parallel too: no process can be waiting on work of another. Each native
    // step costs a few hundred milliseconds per process even with nearly no memory left to it
    // (measured on r580), so a group pays it once, not once per process.
    let (locked, failed) = split(
        &pids,
        for_each_parallel(&pids, |&(pid, _)| driver.lock(pid, lock_timeout_ms)),
    );
    if let Some((label, e)) = failed {
        undo_native(driver, &[], &locked);
        return Err(step_error("native lock", label, e));
    }
    // Every process is locked, so nothing runs against memory the others are saving: the
    // checkpoints go in parallel (each is the driver moving one process's private memory).
    let (checkpointed, failed) = split(
        &pids,
        for_each_parallel(&pids, |&(pid, _)| driver.checkpoint(pid)),
    );
    if let Some((label, e)) = failed {
        undo_native(driver, &checkpointed, &locked);
        return Err(step_error("native checkpoint", label, e));
    }
    Ok(())
}

/// The pids whose step succeeded, and the first failure in their order with its process's label.
fn split<E>(pids: &[(u32, String)], results: Vec<Result<(), E>>) -> (Vec<u32>, Option<(&str, E)>) {
    let mut succeeded = Vec::new();
    let mut failed = None;
    for ((pid, label), result) in pids.iter().zip(results) {
        match result {
            Ok(()) => succeeded.push(*pid),
            Err(e) => {
                failed.get_or_insert((label.as_str(), e));
            }
        }
    }
    (succeeded, failed)
}

use crate::parallel::for_each as for_each_parallel;

/// Best effort after a failed native step: restore the checkpointed processes, unlock the locked.
fn undo_native(driver: &dyn NativeCheckpoint, checkpointed: &[u32], locked: &[u32]) {
    for_each_parallel(checkpointed, |&pid| {
        if let Err(e) = driver.restore(pid, &[]) {
            tracing::error!(pid, error = %e, "native restore while undoing a failed checkpoint");
        }
    });
    for_each_parallel(locked, |&pid| {
        if let Err(e) = driver.unlock(pid) {
            tracing::error!(pid, error = %e, "native unlock while undoing a failed checkpoint");
        }
    });
}

/// Checks, changing nothing (a refused run leaves no directory behind), that `dir` can take the
/// state of a new capture: no state file in it yet, and a directory (or one that can be made)
/// this run can write. Returns the state file's path.
pub(crate) fn check_state_dir(dir: &Path) -> Result<PathBuf, ControlError> {
    let path = dir.join(STATE_FILE);
    if path.exists() {
        // Nothing was touched yet: a refusal, like every other reason not to start.
        return Err(ControlError::Refused(vec![Refusal {
            process: path.display().to_string(),
            reason:
                "already holds a suspended group; resume it first or choose another --state-dir"
                    .into(),
        }]));
    }
    // The nearest directory that exists must be writable; a file on the way is refused.
    let mut existing = dir;
    let problem = loop {
        match std::fs::metadata(existing) {
            Ok(m) if m.is_dir() => {
                break rustix::fs::access(existing, rustix::fs::Access::WRITE_OK)
                    .err()
                    .map(|e| format!("{} cannot be written: {e}", existing.display()));
            }
            Ok(_) => break Some(format!("{} is not a directory", existing.display())),
            Err(_) => match existing.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
                _ => break None,
            },
        }
    };
    match problem {
        None => Ok(path),
        Some(reason) => Err(ControlError::Refused(vec![Refusal {
            process: format!("--state-dir {}", dir.display()),
            reason,
        }])),
    }
}

/// Removes a state file that is of no use any more, and its directory when nothing else is in it.
pub(crate) fn remove_state(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "removing a state file");
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// The captured topology, published atomically (its directory made first, mode 0700: the records
/// describe the application's memory layout).
fn write_state(path: &Path, snapshots: &[Snapshot], mode: SuspendMode) -> Result<(), ControlError> {
    write_state_of(path, &state_of(snapshots, mode))
}

/// [`write_state`] of a state at hand.
pub(crate) fn write_state_of(path: &Path, state: &GroupState) -> Result<(), ControlError> {
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ControlError::State {
                path: dir.to_path_buf(),
                source: e.into(),
            })?;
    }
    transport::files::write_atomically(path, &protocol::state::encode(state)).map_err(|e| {
        ControlError::State {
            path: path.to_path_buf(),
            source: e.into(),
        }
    })
}

/// The state a set of snapshots describes.
pub(crate) fn state_of(snapshots: &[Snapshot], mode: SuspendMode) -> GroupState {
    GroupState {
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        tool_version: crate::VERSION.to_string(),
        mode,
        participants: snapshots
            .iter()
            .map(|s| ParticipantState {
                host_pid: s.info.host_pid,
                ns_pid: s.info.ns_pid,
                shim_sha256: s.hello.shim_sha256.clone(),
                carriers: s
                    .record
                    .allocations
                    .iter()
                    .map(|a| CarrierInfo {
                        id: a.id,
                        bytes: a.size,
                    })
                    .collect(),
                record: s.record.clone(),
            })
            .collect(),
    }
}

/// Reads and decodes a state file.
pub fn read_state(path: &Path) -> Result<GroupState, ControlError> {
    let bytes = transport::files::read_bounded(path, STATE_FILE_LIMIT).map_err(|e| {
        ControlError::State {
            path: path.to_path_buf(),
            source: e.into(),
        }
    })?;
    protocol::state::decode(&bytes).map_err(|e| match e {
        // Another tool's state: read before anything changes, so a refusal (docs/design.md,
        // "Versions").
        protocol::ProtocolError::VersionMismatch { .. } => ControlError::Refused(vec![Refusal {
            process: format!("state file {}", path.display()),
            reason: format!("{e}: resume with the tool that suspended the group"),
        }]),
        e => ControlError::State {
            path: path.to_path_buf(),
            source: e.into(),
        },
    })
}

/// Options of a resume.
#[derive(Debug, Clone)]
pub struct ResumeOptions {
    pub root: u32,
    pub state_dir: PathBuf,
    pub driver: Option<PathBuf>,
    /// GPU remapping for the native restore (old UUID, new UUID).
    pub gpu_pairs: Vec<(cuda_abi::CUuuid, cuda_abi::CUuuid)>,
    /// The tool's settings (the answer timeout).
    pub config: ToolConfig,
    /// Bring back the captured processes still alive when others have exited.
    pub allow_lost: bool,
}

impl ResumeOptions {
    pub fn new(root: u32, config: &ToolConfig) -> ResumeOptions {
        ResumeOptions {
            root,
            state_dir: default_state_dir(root),
            driver: None,
            gpu_pairs: Vec::new(),
            config: config.clone(),
            allow_lost: false,
        }
    }
}

/// Resumes a group suspended in place: native restore and unlock of every process, then load,
/// import, verify and thaw. On success the state file is removed.
///
/// The recovery rule: every step of a capture or a rebuild leaves a record of where it got (the
/// state file from before the first destructive step, each shim's phase, each process's native
/// state, a tree CRIU left stopped), and resume reads all of them first and goes on from there.
/// Every step it sends is valid in every phase a previous run can have left, and does only what
/// is not done yet, so resume can be run again after any failure or kill, its own included.
pub fn resume(options: &ResumeOptions, progress: &dyn Progress) -> Result<Report, ControlError> {
    let start = Instant::now();
    let mut clock = Clock::new(progress);
    let _lock = lock_tree(options.root)?;
    let state_path = find_state(options)?;
    let state = read_state(&state_path).map_err(unchanged)?;
    // Nothing native was done to a keep-contexts suspension, so nothing native is undone.
    let driver = match state.mode {
        SuspendMode::Native => Some(Driver::load(options.driver.as_deref())?),
        SuspendMode::KeepContexts => None,
    };
    let (mut state, mut group) = clock.time("inspect", None, || {
        // A checkpoint killed during CRIU's dump, or a restore killed before it continued the
        // tree CRIU brought back, leaves the group stopped; this run holds the tree's lock, so
        // no dump or restore of it is running now.
        continue_stopped(
            options.root,
            &state,
            driver.as_ref(),
            &options.gpu_pairs,
            options.config.answer_timeout,
        )?;
        let group = Group::discover(options.root, options.config.answer_timeout)?;
        Ok(((state, group), 0, 0.0))
    })?;
    let lost = match_participants(&mut group, &state)?;
    if !lost.is_empty() && !options.allow_lost {
        return Err(ControlError::Refused(
            lost.iter()
                .map(|p| Refusal {
                    process: captured_label(p),
                    reason: "was captured but has exited since; `cuinterpose resume --allow-lost` brings back the others without it"
                        .into(),
                })
                .collect(),
        ));
    }
    let multicast_refusals = multicast_needs_lost(&state, &lost);
    if !multicast_refusals.is_empty() {
        return Err(ControlError::Refused(multicast_refusals));
    }
    let lost_labels: Vec<String> = lost.iter().map(captured_label).collect();
    let not_rebuilt = depends_on_lost(&state, &lost);
    if !lost.is_empty() {
        tracing::warn!(lost = %lost_labels.join(", "), "resuming without processes that exited");
        state
            .participants
            .retain(|c| !lost.iter().any(|l| l.host_pid == c.host_pid));
    }
    // Without a driver (keep-contexts) the contexts stayed resident and the shims rebuild into
    // them (from any phase a suspend or an earlier resume left).
    if let Some(driver) = &driver {
        clock.time("native-restore", None, || {
            native_resume(driver, &group, &options.gpu_pairs).map(|()| ((), 0, 0.0))
        })?;
    }
    // A checkpoint or restore killed while the shared bytes were only in its data files left
    // a record of them beside the state file.
    let files = crate::disk::DataFiles::recorded(&state_path).map_err(unchanged)?;
    let bytes = files.as_ref().map_or(Bytes::Carriers, Bytes::Files);
    let (participants, saved_bytes) = finish_rebuild(&mut group, &state, &mut clock, bytes)?;
    crate::disk::remove_record(&state_path);
    std::fs::remove_file(&state_path).map_err(|e| ControlError::Removing {
        path: state_path.clone(),
        source: e,
    })?;
    // A default directory is the tool's own: it goes with its state file.
    if options.state_dir == default_state_dir(options.root) {
        remove_state(&state_path);
    }
    Ok(Report {
        participants,
        phases: clock.phases,
        saved_bytes,
        state_file: state_path,
        total_millis: millis_since(start),
        lost: lost_labels,
        drained: Vec::new(),
        not_rebuilt,
        carrier: None,
    })
}

/// A captured process as the state file names it.
pub(crate) fn captured_label(p: &ParticipantState) -> String {
    if p.host_pid == p.ns_pid {
        format!("pid {}", p.host_pid)
    } else {
        format!("pid {} [ns pid {}]", p.host_pid, p.ns_pid)
    }
}

/// A failure before anything changed, as a refusal's exit code says (the cause kept).
fn unchanged(error: ControlError) -> ControlError {
    ControlError::Unchanged {
        source: Box::new(error),
    }
}

/// The state file a resume starts from: in `--state-dir`, or in the default directory of the root
/// given, or in that of the init of the workload's PID namespace under it (where a checkpoint
/// keeps the state until its directory is complete). A refusal when there is none.
fn find_state(options: &ResumeOptions) -> Result<PathBuf, ControlError> {
    find_state_in(options.root, &options.state_dir)
}

/// [`find_state`] for `root` and a state directory (`end` looks where `resume` does).
pub(crate) fn find_state_in(root: u32, state_dir: &Path) -> Result<PathBuf, ControlError> {
    if let Some(found) = state_candidates(root, state_dir)
        .into_iter()
        .find(|p| p.exists())
    {
        return Ok(found);
    }
    Err(ControlError::Refused(vec![Refusal {
        process: format!("pid {root}"),
        reason: format!(
            "no suspended group: {} does not exist (resumed already, or suspended with another \
             --state-dir)",
            state_dir.join(STATE_FILE).display()
        ),
    }]))
}

/// Where resume looks for the state file of `root`, in order.
fn state_candidates(root: u32, state_dir: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![state_dir.join(STATE_FILE)];
    if state_dir == default_state_dir(root)
        && let Ok(init) = crate::disk::namespace_root(root)
        && init != root
    {
        candidates.push(default_state_dir(init).join(STATE_FILE));
    }
    candidates
}

/// The suspension `resume --pid root [--state-dir]` would take up, read for `inspect`: `None`
/// when there is no state file there or it cannot be read (inspect reports, it does not judge).
pub fn suspended_state(root: u32, state_dir: Option<&Path>) -> Option<crate::group::Suspension> {
    let dir = state_dir.map_or_else(|| default_state_dir(root), Path::to_path_buf);
    let path = state_candidates(root, &dir)
        .into_iter()
        .find(|p| p.exists())?;
    let state = read_state(&path).ok()?;
    Some(crate::group::Suspension {
        state_file: path,
        mode: state.mode,
    })
}

/// Continues the stopped processes of the group (SIGCONT): what a CRIU dump that did not finish,
/// or a restore killed before it continued what CRIU brought back, leaves. Of the group: a
/// process the state file captured, or, for a workload in a PID namespace of its own (what a
/// checkpoint dumps, the whole namespace), any process of that namespace. A stopped process of
/// the tree outside the group (a job the user stopped beside the workload, a process being
/// debugged) is left as it is; one of the group not stopped is not signalled. With a driver,
/// each stopped CUDA process that is natively checkpointed is restored first, with only its
/// restore thread running (crate::restore_thread: after CRIU's restore its other threads must
/// not run before that).
fn continue_stopped(
    root: u32,
    state: &GroupState,
    driver: Option<&Driver>,
    gpu_pairs: &[(cuda_abi::CUuuid, cuda_abi::CUuuid)],
    answer_timeout: Duration,
) -> Result<(), ControlError> {
    let ours = crate::discovery::pid_namespace(std::process::id());
    let captured: Vec<u32> = state.participants.iter().map(|p| p.host_pid).collect();
    let workload_namespaces: Vec<u64> = captured
        .iter()
        .filter_map(|&pid| crate::discovery::pid_namespace(pid))
        .filter(|ns| Some(*ns) != ours)
        .collect();
    let stopped: Vec<u32> = crate::discovery::process_tree(root)?
        .into_iter()
        .filter(|&pid| crate::procfs::stat(pid).is_some_and(|s| s.stopped()))
        .filter(|pid| {
            captured.contains(pid)
                || crate::discovery::pid_namespace(*pid)
                    .is_some_and(|ns| workload_namespaces.contains(&ns))
        })
        .collect();
    if stopped.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        ?stopped,
        "continuing processes of the group left stopped (an interrupted dump or restore)"
    );
    if let Some(driver) = driver {
        for &pid in &stopped {
            if !crate::discovery::describe(pid).is_ok_and(|p| p.is_cuda()) {
                continue;
            }
            crate::restore_thread::restore_stopped(driver, pid, gpu_pairs)
                .map_err(|e| step_error("native restore", &format!("pid {pid}"), e))?;
        }
    }
    crate::launch::continue_processes(&stopped).map_err(|e| ControlError::Step {
        step: "continuing the stopped group",
        process: format!("pid {root}"),
        source: Box::new(e.into()),
    })?;
    // The shims answer once their threads run again.
    let deadline = Instant::now() + answer_timeout;
    while stopped
        .iter()
        .any(|&pid| crate::procfs::stat(pid).is_some_and(|s| s.stopped()))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The survivors of `--allow-lost` holding a multicast object that cannot be made again
/// without a lost process: one it created, or to which it added a device (a multicast object
/// takes bindings only once all its devices are added: cuMulticastBindMem fails NOT_READY
/// forever). Refused before anything changes (issue 29).
fn multicast_needs_lost(state: &GroupState, lost: &[ParticipantState]) -> Vec<Refusal> {
    let is_lost = |p: &ParticipantState| lost.iter().any(|l| l.host_pid == p.host_pid);
    let mut out = Vec::new();
    for survivor in state.participants.iter().filter(|p| !is_lost(p)) {
        for mc in &survivor.record.multicasts {
            let needed = lost.iter().find(|l| {
                l.ns_pid == mc.creator_ns_pid
                    || l.record.multicasts.iter().any(|m| {
                        (m.creator_ns_pid, m.id) == (mc.creator_ns_pid, mc.id)
                            && !m.devices.is_empty()
                    })
            });
            if let Some(gone) = needed {
                out.push(Refusal {
                    process: captured_label(survivor),
                    reason: format!(
                        "holds multicast object {} with {}, which has exited: the object needs \
                         every device it was made for, so it cannot be rebuilt without it, and \
                         `--allow-lost` cannot bring this group back; end the group with \
                         `cuinterpose end --pid <root>`",
                        mc.id,
                        captured_label(gone)
                    ),
                });
            }
        }
    }
    out
}

/// The imports of the captured survivors whose creator is among `lost`: what `--allow-lost`
/// cannot rebuild (they stay unmapped).
fn depends_on_lost(state: &GroupState, lost: &[ParticipantState]) -> Vec<String> {
    let mut out = Vec::new();
    for p in state
        .participants
        .iter()
        .filter(|p| !lost.iter().any(|l| l.host_pid == p.host_pid))
    {
        for import in &p.record.imports {
            if let Some(creator) = lost.iter().find(|l| l.ns_pid == import.creator_ns_pid) {
                out.push(format!(
                    "{}: import of allocation {} created by {} (left unmapped)",
                    captured_label(p),
                    import.id,
                    captured_label(creator)
                ));
            }
        }
    }
    out
}

/// Checks that the live group is the captured one, participant for participant, none running.
/// Returns the captured participants that have exited (the caller decides whether to go on
/// without them); a captured process still alive but not in the group is refused.
pub fn match_participants(
    group: &mut Group,
    state: &GroupState,
) -> Result<Vec<ParticipantState>, ControlError> {
    let mut refusals = Vec::new();
    let mut lost = Vec::new();
    for captured in &state.participants {
        if !group
            .participants
            .iter()
            .any(|p| p.info.host_pid == captured.host_pid)
        {
            if crate::procfs::exited(captured.host_pid) {
                lost.push(captured.clone());
            } else {
                refusals.push(Refusal {
                    process: captured_label(captured),
                    reason: "was captured but is not part of the group now".into(),
                });
            }
        }
    }
    for p in &mut group.participants {
        match state
            .participants
            .iter()
            .find(|c| c.host_pid == p.info.host_pid)
        {
            None => refusals.push(Refusal {
                process: p.info.label(),
                reason: "uses CUDA but was not part of the captured group".into(),
            }),
            Some(captured) => {
                let record = p.inspect()?;
                // Any phase of a capture is resumable (Load and Import rebuild exactly what is
                // not live, Thaw ends it); Running means there is nothing to resume.
                if record.phase == Phase::Running {
                    refusals.push(Refusal {
                        process: p.info.label(),
                        reason: "is running, not suspended".into(),
                    });
                }
                if p.hello.shim_sha256 != captured.shim_sha256 {
                    refusals.push(Refusal {
                        process: p.info.label(),
                        reason: "runs a different libcuinterpose.so than the one captured".into(),
                    });
                }
            }
        }
    }
    if refusals.is_empty() {
        Ok(lost)
    } else {
        Err(ControlError::Refused(refusals))
    }
}

/// Native restore of every process (remapping GPUs as asked), then unlock of every process.
pub(crate) fn native_restore(
    driver: &dyn NativeCheckpoint,
    group: &Group,
    gpu_pairs: &[(cuda_abi::CUuuid, cuda_abi::CUuuid)],
) -> Result<(), ControlError> {
    let restored = for_each_parallel(&group.participants, |p| {
        driver.restore(p.info.host_pid, gpu_pairs)
    });
    for (p, result) in group.participants.iter().zip(restored) {
        result.map_err(|e| step_error("native restore", &p.info.label(), e))?;
    }
    let participants: Vec<&Participant> = group.participants.iter().collect();
    unlock_all(driver, &participants)
}

/// Native unlock of every process given, all at once; the first failure in their order.
pub(crate) fn unlock_all(
    driver: &dyn NativeCheckpoint,
    participants: &[&Participant],
) -> Result<(), ControlError> {
    let unlocked = for_each_parallel(participants, |p| driver.unlock(p.info.host_pid));
    for (p, result) in participants.iter().zip(unlocked) {
        result.map_err(|e| step_error("native unlock", &p.info.label(), e))?;
    }
    Ok(())
}

/// Brings every participant back to native RUNNING from wherever a suspend left it: restore and
/// unlock a checkpointed process, unlock a locked one, leave a running one alone (a capture that
/// was killed, or that failed to roll back, before its native lock released shared memory
/// without ever locking). Refuses nothing it does not understand: a FAILED process is reported.
fn native_resume(
    driver: &dyn NativeCheckpoint,
    group: &Group,
    gpu_pairs: &[(cuda_abi::CUuuid, cuda_abi::CUuuid)],
) -> Result<(), ControlError> {
    let mut to_restore = Vec::new();
    let mut to_unlock = Vec::new();
    for p in &group.participants {
        let label = p.info.label();
        let pid = p.info.host_pid;
        match driver
            .state(pid)
            .map_err(|e| step_error("native state", &label, e))?
        {
            ProcessState::Running => {
                tracing::info!(pid, "natively running: released before the native lock");
            }
            ProcessState::Locked => to_unlock.push(p),
            ProcessState::Checkpointed => to_restore.push(p),
            state => {
                return Err(step_error(
                    "native restore",
                    &label,
                    ControlError::Protocol {
                        process: label.clone(),
                        message: format!("the driver reports the process as {state:?}"),
                    },
                ));
            }
        }
    }
    // The restores go in parallel, as the checkpoints did; a failed one leaves the others
    // restored and locked, which a `resume` run again finds and finishes.
    let restored = for_each_parallel(&to_restore, |p| driver.restore(p.info.host_pid, gpu_pairs));
    for (p, result) in to_restore.iter().zip(restored) {
        result.map_err(|e| step_error("native restore", &p.info.label(), e))?;
    }
    to_unlock.extend(to_restore);
    unlock_all(driver, &to_unlock)
}

/// Load, import, the multicast steps, verify and thaw: the rebuild half of resume and restore.
/// Returns the participants' summary and the bytes loaded from carriers.
pub(crate) fn finish_rebuild(
    group: &mut Group,
    state: &GroupState,
    clock: &mut Clock<'_>,
    bytes: Bytes<'_>,
) -> Result<(Vec<ParticipantSummary>, u64), ControlError> {
    let total: u64 = state
        .participants
        .iter()
        .flat_map(|p| &p.carriers)
        .map(|c| c.bytes)
        .sum();
    let progress = clock.progress;
    // Copies of many GiB take as long as they take (private memory included: a whole process's);
    // a dead shim still fails the socket at once.
    for p in &mut group.participants {
        p.set_timeout(None)?;
    }
    // Creators first, everywhere, so that every importer finds its allocation exported again.
    clock.time("load", Some(total), || {
        load_all(&mut group.participants, bytes, progress).map(|(b, s)| ((), b, s))
    })?;
    clock.time("import", None, || {
        phase_all(
            &mut group.participants,
            "import",
            &Request::Import,
            progress,
        )
        .map(|(_, b, s)| ((), b, s))
    })?;
    // The multicast objects, in four group-wide steps: each done by everyone before the next
    // (skipped, and absent from the report, for a group that holds none).
    let multicast = state
        .participants
        .iter()
        .any(|p| !p.record.multicasts.is_empty());
    for step in MulticastStep::ALL.into_iter().filter(|_| multicast) {
        clock.time(step.name(), None, || {
            phase_all(
                &mut group.participants,
                step.name(),
                &Request::Multicast(step),
                progress,
            )
            .map(|(_, b, s)| ((), b, s))
        })?;
    }
    let snapshots = clock.time("verify", None, || {
        let snapshots = group.snapshot()?;
        let refusals = verify(&snapshots, state);
        if refusals.is_empty() {
            Ok((snapshots, 0, 0.0))
        } else {
            Err(ControlError::VerifyFailed(refusals))
        }
    })?;
    clock.time("thaw", None, || {
        let errors = thaw_all(group);
        match errors.into_iter().next() {
            None => Ok(((), 0, 0.0)),
            Some(e) => Err(e),
        }
    })?;
    Ok((summarize(&snapshots), total))
}

/// Differences between the rebuilt records and the captured ones, per process.
fn verify(snapshots: &[Snapshot], state: &GroupState) -> Vec<Refusal> {
    let mut differences = Vec::new();
    for s in snapshots {
        let Some(captured) = state
            .participants
            .iter()
            .find(|c| c.host_pid == s.info.host_pid)
        else {
            continue;
        };
        if let Some(what) = record_difference(&captured.record, &s.record) {
            differences.push(Refusal {
                process: s.info.label(),
                reason: format!("rebuilt {what} differ from the captured ones"),
            });
        }
    }
    differences
}

/// Which part of a rebuilt record differs from the captured one (phase and calls in flight aside).
pub fn record_difference(
    captured: &ProcessRecord,
    rebuilt: &ProcessRecord,
) -> Option<&'static str> {
    if captured.allocations != rebuilt.allocations {
        Some("allocations")
    } else if captured.imports != rebuilt.imports {
        Some("imports")
    } else if captured.mappings != rebuilt.mappings {
        Some("mappings")
    } else if captured.reservations != rebuilt.reservations {
        Some("reservations")
    } else if captured.blockers != rebuilt.blockers {
        Some("blockers")
    } else if captured.multicasts != rebuilt.multicasts {
        Some("multicast objects")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::carrier_choice::{host_facts, none_for_disk};
    use crate::fakes::{self, Exited, Log, Native, Shim};
    use protocol::ErrorCode;

    /// What a capture of scripted shims did: its result, and where its state file was to go.
    struct Captured {
        result: Result<Vec<Snapshot>, ControlError>,
        state: PathBuf,
        _dir: tempfile::TempDir,
    }

    fn options() -> SuspendOptions {
        SuspendOptions::new(100, &ToolConfig::default())
    }

    fn capture_of(
        shims: Vec<Shim>,
        native: Option<&Native>,
        exited: &[u32],
        options: &SuspendOptions,
    ) -> Captured {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state").join(STATE_FILE);
        let mut group = fakes::group(shims);
        let procs = Exited(exited.to_vec());
        let host = Host {
            native: native.map(|n| n as &dyn NativeCheckpoint),
            procs: &procs,
        };
        let mut clock = Clock::new(&Quiet);
        let mut choice = none_for_disk(host_facts());
        let result = capture_group(
            &mut group,
            host,
            options,
            &state,
            &mut clock,
            Bytes::Carriers,
            &mut choice,
        );
        Captured {
            result,
            state,
            _dir: dir,
        }
    }

    fn shims(log: &Log, pids: &[u32]) -> Vec<Shim> {
        pids.iter().map(|&pid| Shim::new(pid, log)).collect()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    const FROZEN: [&str; 4] = ["Hold", "Drain", "Freeze", "Inspect"];
    /// The rebuild a rollback sends after a release: load, import, the four multicast steps,
    /// thaw.
    const REBUILT: [&str; 7] = [
        "Load",
        "Import",
        "Multicast",
        "Multicast",
        "Multicast",
        "Multicast",
        "Thaw",
    ];

    fn then(first: &[&str], rest: &[&str]) -> Vec<String> {
        strings(&[first, rest].concat())
    }

    #[test]
    fn a_capture_freezes_publishes_saves_releases_then_locks_and_checkpoints_everyone() {
        let log = Log::default();
        let native = Native::new(&log);
        let run = capture_of(shims(&log, &[100, 101]), Some(&native), &[], &options());
        let captured = run.result.unwrap();
        assert_eq!(captured.len(), 2);
        for pid in [100, 101] {
            assert_eq!(
                log.shim(pid),
                then(&FROZEN, &["Save", "Release", "Inspect"])
            );
            assert_eq!(native.state_of(pid), ProcessState::Checkpointed);
        }
        // Every lock before any checkpoint: no process runs against memory another saves.
        let native_calls: Vec<String> = log
            .entries()
            .into_iter()
            .filter(|e| e.starts_with("native"))
            .collect();
        assert!(native_calls[..2].iter().all(|c| c.contains("lock")));
        assert!(native_calls[2..].iter().all(|c| c.contains("checkpoint")));
        let state = read_state(&run.state).unwrap();
        assert_eq!(state.participants.len(), 2);
        assert_eq!(state.mode, SuspendMode::Native);
    }

    #[test]
    fn a_keep_contexts_capture_saves_keeping_contexts_and_makes_no_native_call() {
        let log = Log::default();
        let options = SuspendOptions {
            mode: SuspendMode::KeepContexts,
            ..options()
        };
        let run = capture_of(shims(&log, &[100]), None, &[], &options);
        run.result.unwrap();
        assert_eq!(
            log.shim(100),
            then(&FROZEN, &["SaveKeepingContexts", "Release", "Inspect"])
        );
        assert!(log.native().is_empty());
        assert_eq!(
            read_state(&run.state).unwrap().mode,
            SuspendMode::KeepContexts
        );
    }

    #[test]
    fn a_process_refusing_the_freeze_has_every_gate_opened_and_nothing_released() {
        let log = Log::default();
        let native = Native::new(&log);
        let refusing = vec![
            Shim::new(100, &log),
            Shim::new(101, &log).refusing("Freeze", ErrorCode::WrongPhase),
        ];
        let run = capture_of(refusing, Some(&native), &[], &options());
        let error = run.result.unwrap_err();
        let ControlError::RolledBack { failure } = &error else {
            panic!("{error}");
        };
        assert!(
            matches!(&**failure, ControlError::Step { step: "freeze", process, .. } if process == "pid 101 (w)"),
            "{failure}"
        );
        for pid in [100, 101] {
            assert_eq!(log.shim(pid), strings(&["Hold", "Drain", "Freeze", "Thaw"]));
        }
        assert!(log.native().is_empty());
        assert!(!run.state.exists());
        assert!(error.workload_untouched());
    }

    #[test]
    fn a_group_not_drained_in_time_is_reopened_and_the_refusal_names_the_busy_process() {
        let log = Log::default();
        let options = SuspendOptions {
            freeze_timeout: Duration::from_millis(60),
            ..options()
        };
        let group = vec![Shim::new(100, &log), Shim::new(101, &log).busy()];
        let run = capture_of(group, Some(&Native::new(&log)), &[], &options);
        let error = run.result.unwrap_err();
        let ControlError::RolledBack { failure } = &error else {
            panic!("{error}");
        };
        let ControlError::NotDrained { busy, .. } = &**failure else {
            panic!("{failure}");
        };
        assert_eq!(busy.len(), 1);
        assert!(busy[0].starts_with("pid 101 (w)"), "{busy:?}");
        for pid in [100, 101] {
            let requests = log.shim(pid);
            assert_eq!(requests.first().map(String::as_str), Some("Hold"));
            assert_eq!(requests.last().map(String::as_str), Some("Thaw"));
            assert!(
                !requests
                    .iter()
                    .any(|r| ["Freeze", "Save", "Release"].contains(&r.as_str())),
                "{requests:?}"
            );
        }
        assert!(log.native().is_empty());
        assert!(!run.state.exists());
    }

    #[test]
    fn another_run_or_a_sticky_error_reopens_the_gates_and_is_not_called_a_rollback() {
        for (request, code) in [("Hold", ErrorCode::Busy), ("Drain", ErrorCode::Sticky)] {
            let log = Log::default();
            let group = vec![
                Shim::new(100, &log),
                Shim::new(101, &log).refusing(request, code),
            ];
            let run = capture_of(group, Some(&Native::new(&log)), &[], &options());
            let error = run.result.unwrap_err();
            match code {
                ErrorCode::Busy => assert!(
                    matches!(&error, ControlError::AnotherRun { process, .. } if process == "pid 101 (w)"),
                    "{error}"
                ),
                _ => assert!(
                    matches!(&error, ControlError::StickyError { process, .. } if process == "pid 101 (w)"),
                    "{error}"
                ),
            }
            for pid in [100, 101] {
                assert_eq!(log.shim(pid).last().map(String::as_str), Some("Thaw"));
                assert!(!log.shim(pid).contains(&"Freeze".to_string()));
            }
            assert!(!run.state.exists());
        }
    }

    #[test]
    fn a_state_file_that_cannot_be_written_reopens_the_gates_before_anything_is_released() {
        let log = Log::default();
        let mut group = fakes::group(shims(&log, &[100]));
        let dir = tempfile::tempdir().unwrap();
        // The state directory's place is taken by a file.
        let blocked = dir.path().join("state");
        std::fs::write(&blocked, b"").unwrap();
        let host = Host {
            native: None,
            procs: &Exited::default(),
        };
        let mut choice = none_for_disk(host_facts());
        let error = capture_group(
            &mut group,
            host,
            &options(),
            &blocked.join(STATE_FILE),
            &mut Clock::new(&Quiet),
            Bytes::Carriers,
            &mut choice,
        )
        .unwrap_err();
        let ControlError::RolledBack { failure } = &error else {
            panic!("{error}");
        };
        assert!(
            matches!(&**failure, ControlError::State { .. }),
            "{failure}"
        );
        assert_eq!(log.shim(100), then(&FROZEN, &["Thaw"]));
        assert!(blocked.is_file());
    }

    #[test]
    fn a_release_failing_mid_group_rebuilds_everyone_and_removes_the_state_file() {
        let log = Log::default();
        let native = Native::new(&log);
        let group = vec![
            Shim::new(100, &log),
            Shim::new(101, &log).refusing("Release", ErrorCode::Driver),
            Shim::new(102, &log),
        ];
        let run = capture_of(group, Some(&native), &[], &options());
        let error = run.result.unwrap_err();
        let ControlError::RolledBack { failure } = &error else {
            panic!("{error}");
        };
        assert!(
            matches!(&**failure, ControlError::Step { step: "release", process, .. } if process == "pid 101 (w)"),
            "{failure}"
        );
        for pid in [100, 101, 102] {
            assert_eq!(
                log.shim(pid),
                then(&FROZEN, &[&["Save", "Release"], &REBUILT[..]].concat())
            );
        }
        assert!(
            log.native().is_empty(),
            "no native step after a failed release"
        );
        assert!(!run.state.exists());
        assert!(
            !run.state.parent().unwrap().exists(),
            "the directory it made goes too"
        );
    }

    #[test]
    fn a_failed_rollback_names_each_failure_and_keeps_the_state_file_for_resume() {
        let log = Log::default();
        let group = vec![
            Shim::new(100, &log),
            Shim::new(101, &log)
                .refusing("Release", ErrorCode::Driver)
                .refusing("Load", ErrorCode::Driver),
        ];
        let run = capture_of(group, Some(&Native::new(&log)), &[], &options());
        let error = run.result.unwrap_err();
        let ControlError::RollbackFailed { failure, rollback } = &error else {
            panic!("{error}");
        };
        assert!(matches!(
            &**failure,
            ControlError::Step {
                step: "release",
                ..
            }
        ));
        assert_eq!(rollback.len(), 1);
        assert!(
            matches!(&rollback[0], ControlError::Step { step: "load", process, .. } if process == "pid 101 (w)"),
            "{}",
            rollback[0]
        );
        // The rest of the rebuild still went to everyone.
        for pid in [100, 101] {
            assert_eq!(
                log.shim(pid),
                then(&FROZEN, &[&["Save", "Release"], &REBUILT[..]].concat())
            );
        }
        assert!(run.state.exists());
        assert!(!error.workload_untouched());
        assert!(error.to_string().contains("rollback also failed"));
    }

    #[test]
    fn a_participant_that_exited_is_left_out_of_the_rollback_and_named() {
        let log = Log::default();
        let group = vec![
            Shim::new(100, &log),
            Shim::new(101, &log).refusing("Release", ErrorCode::Peer),
            Shim::new(102, &log),
        ];
        let run = capture_of(group, Some(&Native::new(&log)), &[101], &options());
        let error = run.result.unwrap_err();
        let ControlError::RolledBack { failure } = &error else {
            panic!("{error}");
        };
        let ControlError::ParticipantsExited { processes, .. } = &**failure else {
            panic!("{failure}");
        };
        assert_eq!(processes, &strings(&["pid 101 (w)"]));
        assert_eq!(log.shim(101), then(&FROZEN, &["Save", "Release"]));
        for pid in [100, 102] {
            assert_eq!(
                log.shim(pid),
                then(&FROZEN, &[&["Save", "Release"], &REBUILT[..]].concat())
            );
        }
    }

    #[test]
    fn a_native_lock_failing_unlocks_the_locked_and_rebuilds_the_shims() {
        let log = Log::default();
        let native = Native::new(&log).failing("lock", 101);
        let run = capture_of(shims(&log, &[100, 101]), Some(&native), &[], &options());
        let error = run.result.unwrap_err();
        let ControlError::RolledBack { failure } = &error else {
            panic!("{error}");
        };
        assert!(
            matches!(&**failure, ControlError::Step { step: "native lock", process, .. } if process == "pid 101 (w)"),
            "{failure}"
        );
        assert_eq!(
            log.native(),
            strings(&["lock 100", "lock 101", "unlock 100"])
        );
        for pid in [100, 101] {
            assert_eq!(native.state_of(pid), ProcessState::Running);
            assert_eq!(
                log.shim(pid),
                then(
                    &FROZEN,
                    &[&["Save", "Release", "Inspect"], &REBUILT[..]].concat()
                )
            );
        }
        assert!(!run.state.exists());
    }

    #[test]
    fn a_native_checkpoint_failing_restores_the_checkpointed_and_unlocks_everyone() {
        let log = Log::default();
        let native = Native::new(&log).failing("checkpoint", 101);
        let run = capture_of(shims(&log, &[100, 101]), Some(&native), &[], &options());
        let error = run.result.unwrap_err();
        assert!(matches!(&error, ControlError::RolledBack { .. }), "{error}");
        assert_eq!(
            log.native(),
            strings(&[
                "checkpoint 100",
                "checkpoint 101",
                "lock 100",
                "lock 101",
                "restore 100",
                "unlock 100",
                "unlock 101"
            ])
        );
        // The restore came before the unlocks.
        let order = log.entries();
        let at = |call: &str| order.iter().position(|e| e == call).unwrap();
        assert!(at("native restore 100") < at("native unlock 100"));
        for pid in [100, 101] {
            assert_eq!(native.state_of(pid), ProcessState::Running);
            assert_eq!(log.shim(pid).last().map(String::as_str), Some("Thaw"));
        }
    }
}

#[cfg(test)]
mod resume_tests {
    use super::*;
    use crate::fakes::{self, Log, Native, Shim};

    #[test]
    fn a_resume_takes_each_process_from_the_native_state_it_finds() {
        let log = Log::default();
        let native = Native::new(&log)
            .with_state(101, ProcessState::Locked)
            .with_state(102, ProcessState::Checkpointed);
        let group = fakes::group((100..103).map(|pid| Shim::new(pid, &log)).collect());
        native_resume(&native, &group, &[]).unwrap();
        // The running one is only asked; the locked one unlocked; the checkpointed one restored,
        // then unlocked.
        assert_eq!(
            log.native(),
            [
                "restore 102",
                "state 100",
                "state 101",
                "state 102",
                "unlock 101",
                "unlock 102"
            ]
        );
        for pid in 100..103 {
            assert_eq!(native.state_of(pid), ProcessState::Running);
        }
    }

    #[test]
    fn a_resume_refuses_a_process_the_driver_reports_failed_before_restoring_any() {
        let log = Log::default();
        let native = Native::new(&log)
            .with_state(100, ProcessState::Checkpointed)
            .with_state(101, ProcessState::Failed);
        let group = fakes::group(vec![Shim::new(100, &log), Shim::new(101, &log)]);
        let error = native_resume(&native, &group, &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "native restore failed for pid 101 (w): protocol error: the driver reports the \
             process as Failed"
        );
        assert_eq!(log.native(), ["state 100", "state 101"]);
        assert_eq!(native.state_of(100), ProcessState::Checkpointed);
    }
}
