//! Suspend, resume and prepare in place: the verbs over the capture of crate::group_capture and
//! the rebuild of crate::phases.
//!
//! Order of a suspend: discover → inspect (read-only, whole-group checks) → freeze → inspect again
//! (frozen, nothing in flight) → state file → save → release → inspect (all released) → native lock
//! of every process → native checkpoint of each (crate::group_capture, which also rolls a failure
//! back). Resume: native restore and unlock of each process that needs it → load (creators) →
//! import (importers) → verify (records equal the captured ones) → thaw.
//!
//! The state file exists from before the first destructive step, so `resume` also recovers a
//! group whose tool was killed at any step: it takes each process from the native state it finds
//! (checkpointed, locked, or still running) and rebuilds what its shim released.
//!
//! The types of the reports and options are re-exported here, where the tool's callers take them.

pub use crate::group_capture::SuspendOptions;
pub use crate::phases::record_difference;
pub use crate::progress::{ParticipantSummary, PhaseTiming, Progress, Quiet, Report};
pub use crate::suspend_error::SuspendError;

use crate::config::ToolConfig;
use crate::discovery::ProcessTree;
use crate::group::{Group, Participant, Snapshot, check_group};
use crate::group_capture::{capture, choose_carrier, control_dirs, lock_tree, saved_bytes};
use crate::native::{Driver, NativeCheckpoint};
use crate::native_steps::native_resume;
use crate::phases::{Bytes, FileBytes, finish_rebuild, match_participants, step_error};
use crate::progress::{Clock, millis_since, summarize};
use crate::statefile::{
    captured_label, check_state_dir, default_state_dir, find_state_in, read_state, remove_state,
};
use crate::{Classified, ControlError, ErrorClass, Refusal};
use protocol::Phase;
use protocol::state::{GroupState, ParticipantState, SuspendMode};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why `resume` failed, in the order it can: before it touched the group, part way through the
/// rebuild, and once the group runs again. Every failure leaves what `resume` reads again (the
/// state file, the shims' phases, the native states), so it can be run again after any of them;
/// the class of each is that of the error it wraps.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// Refused, or failed, before the rebuild changed anything: the run lock, the state file
    /// and the record of its data files, the driver, the group found again (its discovery, a
    /// captured process that exited without `--allow-lost`, a multicast object a lost process
    /// held). A group left stopped by an interrupted dump or restore may have been continued:
    /// that only brings it back to what a suspend leaves. The group stays suspended.
    #[error(transparent)]
    NotStarted(#[from] ControlError),
    /// Failed part way: continuing a group left stopped, the native restore, or the rebuild
    /// (load, import, the multicast steps, verify, thaw). The state file is kept and the group
    /// is not running: a participant that went away is an error, a step that failed or a
    /// rebuilt group that differs from the captured one needs attention (`cuinterpose resume`
    /// goes on from where this run got).
    #[error(transparent)]
    NotRebuilt(ControlError),
    /// The group was rebuilt and thawed, it runs, but its state file could not be removed.
    #[error(transparent)]
    StateNotRemoved(ControlError),
}

impl Classified for ResumeError {
    fn class(&self) -> ErrorClass {
        match self {
            ResumeError::NotStarted(cause)
            | ResumeError::NotRebuilt(cause)
            | ResumeError::StateNotRemoved(cause) => cause.class(),
        }
    }
}

/// Suspends the group under `options.root` in place: afterwards its processes hold no GPU memory
/// and stay alive, and `cuinterpose.state` in the state directory describes what to rebuild.
pub fn suspend(options: &SuspendOptions, progress: &dyn Progress) -> Result<Report, SuspendError> {
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

/// What `cuinterpose prepare` did: the carrier a suspend will use, and per process what was pinned
/// ahead of it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PrepareReport {
    pub carrier: crate::carrier_policy::CarrierChoice,
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

/// Why `prepare` failed, in the order it can: before it prepared anything, or starting the
/// carrier helper. Pinning itself is best effort (a carrier not pinned is reported, not an
/// error), so nothing fails once pinning starts; neither failure pinned anything, and the class
/// of each is that of the error it wraps.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// Refused, or failed, before anything was prepared: the run lock, the group's discovery and
    /// checks, the carrier choice (a `--carrier` the machine cannot hold).
    #[error(transparent)]
    NotStarted(#[from] ControlError),
    /// The carrier helper of a control directory could not be started or reached: nothing was
    /// pinned; a helper already answering, or started for another directory, keeps running
    /// (the next suspend uses it).
    #[error(transparent)]
    Helper(ControlError),
}

impl Classified for PrepareError {
    fn class(&self) -> ErrorClass {
        match self {
            PrepareError::NotStarted(cause) | PrepareError::Helper(cause) => cause.class(),
        }
    }
}

/// Prepares the carriers of the group under `options.root` ahead of its first suspend, so that
/// the first cycle runs at the rate of later ones: chooses the carrier as a suspend of
/// `options.mode` would (`options.carrier`), and pins ahead what that suspend would pin, process
/// by process while `budget` (bytes) allows, in 256 MiB pieces, while the application runs on
/// (nothing of it is held or frozen): for a plain suspend through the carrier helper, the helper
/// is started and makes and pins each process's carrier in its own process; for a keep-contexts
/// suspend, each shim pins its own carrier on its control worker. The processes that allocate
/// after it grow their carrier at their first Save, which pins the rest.
pub fn prepare(
    options: &SuspendOptions,
    budget: Option<u64>,
) -> Result<PrepareReport, PrepareError> {
    let start = Instant::now();
    // No suspend of another run may save through a carrier while it is being prepared.
    let _lock = lock_tree(options.root)?;
    let mut group = Group::discover(options.root, options.config.answer_timeout)?;
    let snapshots = group.snapshot()?;
    let refusals = check_group(&snapshots, Phase::Running);
    if !refusals.is_empty() {
        return Err(ControlError::Refused(refusals).into());
    }
    let choice = choose_carrier(options, &group, None, saved_bytes(&snapshots), true)?;
    let mut report = PrepareReport {
        carrier: choice,
        budget_bytes: budget,
        processes: Vec::new(),
        nothing_to_pin: None,
        total_millis: 0.0,
    };
    let keep_contexts = options.mode == SuspendMode::KeepContexts;
    match (&options.helper, report.carrier.carrier) {
        (_, crate::carrier_policy::Carrier::Process)
            if keep_contexts && report.carrier.pinned_host_bytes > 0 =>
        {
            // Each shim pins its own carrier, over the tool's connection to it.
            report.processes = pin_each(&snapshots, budget, |index, _| {
                group.participants[index].pin_carrier()
            });
        }
        (Some(launch), crate::carrier_policy::Carrier::Helper) if !keep_contexts => {
            for dir in control_dirs(&group) {
                crate::carrier_helper::ensure(dir, launch).map_err(PrepareError::Helper)?;
            }
            // The tool's connections go: the shims are not part of the preparation.
            group.participants.clear();
            report.processes = pin_each(&snapshots, budget, |_, s| {
                let socket = s
                    .info
                    .control_socket
                    .as_deref()
                    .and_then(Path::parent)
                    .map(|dir| dir.join(protocol::message::CARRIER_HELPER_SOCKET))
                    .ok_or_else(|| crate::refuse(&s.info.label(), "no control socket".into()))?;
                crate::carrier_helper::prepare(&socket, s.info.host_pid, s.created_bytes())
            });
        }
        _ => {
            report.nothing_to_pin = Some(
                if keep_contexts {
                    "each process's own carrier, which RLIMIT_MEMLOCK leaves unpinned: nothing is \
                 pinned ahead"
                } else {
                    "each process's own carrier: a plain cycle stages through small buffers, so \
                 nothing is pinned ahead"
                }
                .into(),
            );
        }
    }
    report.carrier.pinned_host_bytes = report.processes.iter().map(|p| p.pinned_bytes).sum();
    report.total_millis = millis_since(start);
    Ok(report)
}

/// Pins each process's carrier through `pin` (its index and snapshot: bytes pinned, µs taken),
/// process by process while `budget` (bytes) allows. Best effort: a carrier not prepared is made
/// by the first Save, as without prepare, and its entry says why it was skipped.
fn pin_each(
    snapshots: &[Snapshot],
    budget: Option<u64>,
    mut pin: impl FnMut(usize, &Snapshot) -> Result<(u64, u64), ControlError>,
) -> Vec<PreparedProcess> {
    let mut left = budget.unwrap_or(u64::MAX);
    let mut processes = Vec::with_capacity(snapshots.len());
    for (index, s) in snapshots.iter().enumerate() {
        let bytes = s.created_bytes();
        let mut prepared = PreparedProcess {
            process: s.info.label(),
            bytes,
            pinned_bytes: 0,
            pin_millis: 0.0,
            skipped: None,
        };
        if bytes == 0 {
            prepared.skipped = Some("it created no allocation".into());
        } else if bytes > left {
            prepared.skipped = Some(format!(
                "beyond the budget (CUINTERPOSE_PIN_AHEAD_MIB): {} MiB left",
                left >> 20
            ));
        } else {
            match pin(index, s) {
                Ok((pinned, micros)) => {
                    left -= bytes;
                    prepared.pinned_bytes = pinned;
                    prepared.pin_millis = micros as f64 / 1e3;
                }
                Err(e) => prepared.skipped = Some(e.to_string()),
            }
        }
        processes.push(prepared);
    }
    processes
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
pub fn resume(options: &ResumeOptions, progress: &dyn Progress) -> Result<Report, ResumeError> {
    let start = Instant::now();
    let mut clock = Clock::new(progress);
    let _lock = lock_tree(options.root)?;
    let state_path = find_state(options)?;
    let mut state = read_state(&state_path).map_err(unchanged)?;
    // A checkpoint or restore killed while the shared bytes were only in its data files left
    // a record of them beside the state file. Read with the state file, before anything changes,
    // so that its failure is the refusal its message says.
    let files = crate::disk::DataFiles::recorded(&state_path).map_err(unchanged)?;
    let bytes = files
        .as_ref()
        .map_or(Bytes::Carriers, |f| Bytes::Files(f as &dyn FileBytes));
    // Nothing native was done to a keep-contexts suspension, so nothing native is undone.
    let driver = match state.mode {
        SuspendMode::Native => Some(Driver::load(options.driver.as_deref())?),
        SuspendMode::KeepContexts => None,
    };
    let mut group = clock.time("inspect", None, || -> Result<_, ResumeError> {
        let native = driver.as_ref().map(|d| d as &dyn NativeCheckpoint);
        continue_stopped_group(&crate::procfs::Proc, options, &state, native)?;
        let group = Group::discover(options.root, options.config.answer_timeout)?;
        Ok((group, 0, 0.0))
    })?;
    let lost = match_participants(&mut group, &state, &crate::procfs::Proc)?;
    let (lost_labels, not_rebuilt) = leave_out_lost(&mut state, &lost, options.allow_lost)?;
    // Without a driver (keep-contexts) the contexts stayed resident and the shims rebuild into
    // them (from any phase a suspend or an earlier resume left).
    if let Some(driver) = &driver {
        clock
            .time("native-restore", None, || {
                native_resume(driver, &group, &options.gpu_pairs).map(|()| ((), 0, 0.0))
            })
            .map_err(ResumeError::NotRebuilt)?;
    }
    let (participants, saved_bytes) =
        finish_rebuild(&mut group, &state, &mut clock, bytes).map_err(ResumeError::NotRebuilt)?;
    crate::disk::remove_record(&state_path);
    std::fs::remove_file(&state_path).map_err(|e| {
        ResumeError::StateNotRemoved(ControlError::Removing {
            path: state_path.clone(),
            source: e,
        })
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

/// The captured processes that exited since the suspend (`lost`): refused unless `allow_lost`,
/// and refused where a survivor holds a multicast object one of them created or added its device
/// to; otherwise taken out of `state`. Their labels, and what cannot be rebuilt without them.
fn leave_out_lost(
    state: &mut GroupState,
    lost: &[ParticipantState],
    allow_lost: bool,
) -> Result<(Vec<String>, Vec<String>), ResumeError> {
    if !lost.is_empty() && !allow_lost {
        return Err(ResumeError::NotStarted(ControlError::Refused(
            lost.iter()
                .map(|p| Refusal {
                    process: captured_label(p),
                    reason: "was captured but has exited since; `cuinterpose resume --allow-lost` brings back the others without it"
                        .into(),
                })
                .collect(),
        )));
    }
    let multicast_refusals = multicast_needs_lost(state, lost);
    if !multicast_refusals.is_empty() {
        return Err(ControlError::Refused(multicast_refusals).into());
    }
    let lost_labels: Vec<String> = lost.iter().map(captured_label).collect();
    let not_rebuilt = depends_on_lost(state, lost);
    if !lost.is_empty() {
        tracing::warn!(lost = %lost_labels.join(", "), "resuming without processes that exited");
        state
            .participants
            .retain(|c| !lost.iter().any(|l| l.host_pid == c.host_pid));
    }
    Ok((lost_labels, not_rebuilt))
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

/// Continues the stopped processes of the group (SIGCONT, [`stopped_of_group`] says which):
/// what a CRIU dump that did not finish, or a restore killed before it continued what CRIU
/// brought back, leaves. With a driver, each stopped CUDA process that is natively checkpointed
/// is restored first, with only its restore thread running (crate::restore_thread: after CRIU's
/// restore its other threads must not run before that). `/proc` is read in `machine`.
fn continue_stopped(
    machine: &dyn ProcessTree,
    stopped: &[u32],
    driver: Option<&dyn NativeCheckpoint>,
    gpu_pairs: &[(cuda_abi::CUuuid, cuda_abi::CUuuid)],
    answer_timeout: Duration,
) -> Result<(), ControlError> {
    if stopped.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        ?stopped,
        "continuing processes of the group left stopped (an interrupted dump or restore)"
    );
    if let Some(driver) = driver {
        for &pid in stopped {
            if !machine.describe(pid).is_ok_and(|p| p.is_cuda()) {
                continue;
            }
            crate::restore_thread::restore_stopped(driver, machine, pid, gpu_pairs)
                .map_err(|e| step_error("native restore", &format!("pid {pid}"), e))?;
        }
    }
    crate::launch::continue_processes(stopped).map_err(|e| ControlError::Step {
        step: "continuing the stopped group",
        process: format!("pids {stopped:?}"),
        source: Box::new(e.into()),
    })?;
    // The shims answer once their threads run again.
    let deadline = Instant::now() + answer_timeout;
    while stopped
        .iter()
        .any(|&pid| machine.stat(pid).is_some_and(|s| s.stopped()))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// [`continue_stopped`] for [`resume`], with its two kinds of failure: the stopped processes not
/// found (nothing changed), or not all continued (the group changed part way).
fn continue_stopped_group(
    machine: &dyn ProcessTree,
    options: &ResumeOptions,
    state: &GroupState,
    driver: Option<&dyn NativeCheckpoint>,
) -> Result<(), ResumeError> {
    // A checkpoint killed during CRIU's dump, or a restore killed before it continued the tree
    // CRIU brought back, leaves the group stopped; resume holds the tree's lock, so no dump or
    // restore of it is running now. Finding them reads /proc only.
    let stopped = stopped_of_group(machine, options.root, state)?;
    continue_stopped(
        machine,
        &stopped,
        driver,
        &options.gpu_pairs,
        options.config.answer_timeout,
    )
    .map_err(ResumeError::NotRebuilt)
}

/// The processes under `root` that are stopped and of the group: a process the state file
/// captured, or, for a workload in a PID namespace of its own (what a checkpoint dumps, the
/// whole namespace), any process of that namespace. A stopped process of the tree outside the
/// group (a job the user stopped beside the workload, a process being debugged) is left as it
/// is; one of the group not stopped is not signalled.
fn stopped_of_group(
    machine: &dyn ProcessTree,
    root: u32,
    state: &GroupState,
) -> Result<Vec<u32>, ControlError> {
    let ours = machine.pid_namespace(None);
    let captured: Vec<u32> = state.participants.iter().map(|p| p.host_pid).collect();
    let workload_namespaces: Vec<u64> = captured
        .iter()
        .filter_map(|&pid| machine.pid_namespace(Some(pid)))
        .filter(|ns| Some(*ns) != ours)
        .collect();
    Ok(machine
        .tree(root)?
        .into_iter()
        .filter(|&pid| machine.stat(pid).is_some_and(|s| s.stopped()))
        .filter(|&pid| {
            captured.contains(&pid)
                || machine
                    .pid_namespace(Some(pid))
                    .is_some_and(|ns| workload_namespaces.contains(&ns))
        })
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{self, Log, Shim};
    use crate::group_capture::state_of;
    use protocol::{AllocationId, ImportRecord, MulticastRecord};

    /// The state of a capture of `pids` (nothing shared yet).
    fn captured(pids: &[u32]) -> GroupState {
        let log = Log::default();
        let mut group = fakes::group(pids.iter().map(|&pid| Shim::new(pid, &log)).collect());
        state_of(&group.snapshot().unwrap(), SuspendMode::Native)
    }

    fn multicast(creator_ns_pid: u32, devices: Vec<i32>) -> MulticastRecord {
        MulticastRecord {
            id: AllocationId([3; 16]),
            creator_ns_pid,
            size: 2 << 20,
            num_devices: 2,
            handle_types: 1,
            flags: 0,
            granularity: 2 << 20,
            shared: true,
            devices,
            bindings: Vec::new(),
            live_handles: 1,
        }
    }

    #[test]
    fn allow_lost_refuses_a_survivor_holding_a_multicast_object_a_lost_process_made_or_joined() {
        // 100 made the object and added device 0; 101 imported it and added device 1.
        let mut state = captured(&[100, 101, 102]);
        state.participants[0].record.multicasts = vec![multicast(100, vec![0])];
        state.participants[1].record.multicasts = vec![multicast(100, vec![1])];
        // 101 is lost: the object cannot be made again without its device.
        let lost = vec![state.participants[1].clone()];
        let refusals = multicast_needs_lost(&state, &lost);
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].process, "pid 100");
        assert!(
            refusals[0]
                .reason
                .starts_with("holds multicast object 030303030303 with pid 101, which has exited"),
            "{}",
            refusals[0].reason
        );
        // 102 is lost instead, holding nothing of it: no refusal.
        let lost = vec![state.participants[2].clone()];
        assert!(multicast_needs_lost(&state, &lost).is_empty());
    }

    #[test]
    fn allow_lost_names_each_import_whose_creator_is_lost_as_left_unmapped() {
        let mut state = captured(&[100, 101]);
        state.participants[1].record.imports = vec![ImportRecord {
            id: AllocationId([5; 16]),
            creator_ns_pid: 100,
            size: 1 << 20,
            props: crate::fakes::PROPS,
            live_handles: 1,
        }];
        let lost = vec![state.participants[0].clone()];
        assert_eq!(
            depends_on_lost(&state, &lost),
            ["pid 101: import of allocation 050505050505 created by pid 100 (left unmapped)"]
        );
        assert!(depends_on_lost(&state, &[]).is_empty());
    }

    /// A machine of processes `(pid, PID namespace, state letter)`, root first.
    fn machine(processes: &[(u32, u64, char)]) -> fakes::Machine {
        fakes::Machine {
            processes: processes
                .iter()
                .map(|&(pid, ns, state)| {
                    let info = crate::discovery::ProcessInfo {
                        pid_namespace: ns,
                        ..fakes::cuda_process(pid)
                    };
                    (info, Some(state), true)
                })
                .collect(),
            ..fakes::Machine::default()
        }
    }

    /// A resume continues the stopped processes of the group: those captured, and those of the
    /// workload's own PID namespace (a checkpoint's dump stops the whole namespace); a stopped
    /// process beside it in the tool's namespace, and the group's running ones, are left alone.
    #[test]
    fn a_resume_continues_only_the_stopped_processes_of_the_group() {
        const WORKLOAD: u64 = 9;
        const TOOL: u64 = fakes::TOOL_PID_NAMESPACE;
        let state = captured(&[100, 101]);
        let own_namespace = machine(&[
            (100, WORKLOAD, 'T'),
            (101, WORKLOAD, 'S'),
            (102, WORKLOAD, 'T'),
            (103, TOOL, 'T'),
            (104, WORKLOAD, 'S'),
            (105, 11, 't'),
        ]);
        assert_eq!(
            stopped_of_group(&own_namespace, 100, &state).unwrap(),
            [100, 102]
        );
        // A workload in the tool's namespace: only what was captured.
        let beside = machine(&[(100, TOOL, 'T'), (101, TOOL, 'T'), (103, TOOL, 'T')]);
        assert_eq!(stopped_of_group(&beside, 100, &state).unwrap(), [100, 101]);
        // Nothing stopped, nothing to continue: the resume goes on without a signal sent.
        let running = machine(&[(100, WORKLOAD, 'S'), (101, WORKLOAD, 'S')]);
        assert!(stopped_of_group(&running, 100, &state).unwrap().is_empty());
        continue_stopped(&running, &[], None, &[], Duration::ZERO).unwrap();
        let options = ResumeOptions::new(100, &ToolConfig::default());
        continue_stopped_group(&running, &options, &state, None).unwrap();
        // A tree that cannot be read changed nothing: the resume did not start.
        let gone = ResumeOptions::new(99, &ToolConfig::default());
        let unread = continue_stopped_group(&running, &gone, &state, None).unwrap_err();
        assert!(matches!(unread, ResumeError::NotStarted(_)), "{unread:?}");
    }

    /// A stopped CUDA process of the group that cannot be restored natively before it is
    /// continued fails the resume as not rebuilt (it found the group and began on it), naming
    /// the process and needing attention (another resume goes on from there), with no native
    /// call made and no signal sent.
    #[test]
    fn a_stopped_process_not_restored_fails_the_resume_as_not_rebuilt() {
        let state = captured(&[6000]);
        // The fake driver names the process's own pid as its restore thread; `/proc` lists
        // only its thread 6001 (1 in its namespace), so the restore cannot begin.
        let machine = fakes::Machine {
            threads: vec![(
                6000,
                vec![crate::procfs::Thread {
                    host: 6001,
                    own: Some(1),
                }],
            )],
            ..machine(&[(6000, 9, 'T')])
        };
        let log = Log::default();
        let driver = fakes::Native::new(&log);
        let options = ResumeOptions::new(6000, &ToolConfig::default());
        let error = continue_stopped_group(&machine, &options, &state, Some(&driver)).unwrap_err();
        let ResumeError::NotRebuilt(ControlError::Step { step, process, .. }) = &error else {
            panic!("{error:?}");
        };
        assert_eq!((*step, process.as_str()), ("native restore", "pid 6000"));
        assert_eq!(error.class(), ErrorClass::NeedsAttention);
        assert!(log.native().is_empty(), "{:?}", log.native());
    }

    /// Each of a suspend's failures is classified by what it left: a refusal or a failure before
    /// the capture changed anything by its own error, a capture rolled back as rolled back
    /// (exit 4), a failed rollback as needing attention (exit 5), with the messages users and
    /// tests grep.
    #[test]
    fn each_suspend_failure_is_classified_by_what_it_left() {
        let another_run = SuspendError::from(ControlError::AnotherRun {
            process: "pid 7".into(),
            message: "held".into(),
        });
        assert_eq!(another_run.class(), ErrorClass::Refused);
        assert_eq!(another_run.to_string(), "pid 7: held");
        let gone = SuspendError::from(ControlError::Protocol {
            process: "pid 7".into(),
            message: "closed".into(),
        });
        assert_eq!(gone.class(), ErrorClass::Error);
        let failure = || Box::new(ControlError::NoSuchProcess(7));
        let rolled_back = SuspendError::RolledBack { failure: failure() };
        assert_eq!(rolled_back.class(), ErrorClass::RolledBack);
        assert_eq!(
            rolled_back.to_string(),
            "no process 7\nrolled back: the shims rebuilt what they had released and the \
             workload is running"
        );
        let rollback_failed = SuspendError::RollbackFailed {
            failure: failure(),
            rollback: vec![
                ControlError::NoSuchProcess(8),
                ControlError::NoSuchProcess(9),
            ],
        };
        assert_eq!(rollback_failed.class(), ErrorClass::NeedsAttention);
        assert_eq!(
            rollback_failed.to_string(),
            "no process 7\nrollback also failed, the workload needs attention:\n  no process 8\n  \
             no process 9"
        );
    }

    /// Each of a prepare's failures keeps its error's message and class: a refusal before
    /// anything was prepared exits 3, a carrier helper that could not be started is an error.
    #[test]
    fn each_prepare_failure_keeps_its_errors_class_and_message() {
        let refused = PrepareError::from(ControlError::CarrierRefused {
            carrier: "helper",
            reason: "no helper".into(),
        });
        assert_eq!(refused.class(), ErrorClass::Refused);
        assert_eq!(
            refused.to_string(),
            "--carrier helper refused, nothing was changed: no helper"
        );
        let helper = PrepareError::Helper(ControlError::CarrierHelper {
            socket: "/run/c/carrier.sock".into(),
            message: "not listening".into(),
        });
        assert_eq!(helper.class(), ErrorClass::Error);
        assert_eq!(
            helper.to_string(),
            "carrier helper at /run/c/carrier.sock: not listening"
        );
    }

    /// Each of a resume's failures keeps its error's message and class, wherever it stopped: a
    /// refusal before anything changed exits 3, a rebuild that failed part way needs attention
    /// (or is an error when a participant went away), a state file not removed is an error.
    #[test]
    fn each_resume_failure_keeps_its_errors_class_and_message() {
        let no_state = ResumeError::from(unchanged(ControlError::NoSuchProcess(7)));
        assert_eq!(no_state.class(), ErrorClass::Refused);
        assert_eq!(no_state.to_string(), "no process 7\nnothing was changed");
        let verify = ResumeError::NotRebuilt(ControlError::VerifyFailed(Vec::new()));
        assert_eq!(verify.class(), ErrorClass::NeedsAttention);
        let step = ResumeError::NotRebuilt(step_error(
            "continuing the stopped group",
            "pid 7",
            ControlError::NoSuchProcess(7),
        ));
        assert_eq!(step.class(), ErrorClass::NeedsAttention);
        assert_eq!(
            step.to_string(),
            "continuing the stopped group failed for pid 7: no process 7"
        );
        let gone = ResumeError::NotRebuilt(ControlError::Protocol {
            process: "pid 7".into(),
            message: "closed".into(),
        });
        assert_eq!(gone.class(), ErrorClass::Error);
        let kept = ResumeError::StateNotRemoved(ControlError::Removing {
            path: "/s/cuinterpose.state".into(),
            source: std::io::Error::other("denied"),
        });
        assert_eq!(kept.class(), ErrorClass::Error);
        assert_eq!(kept.to_string(), "removing /s/cuinterpose.state: denied");
    }
}
