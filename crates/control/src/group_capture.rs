//! The capture of a group, shared by `suspend` (capture.rs) and `checkpoint`
//! (disk/checkpoint.rs): discover and check the group, choose the carrier, then hold, drain and
//! freeze, publish the state file, save and release, and lock and checkpoint every process
//! natively.
//!
//! Up to the native lock every failure is rolled back with the resume code (load, import, thaw), so
//! the workload keeps running; participants that exited are left out of the rollback and named.
//! The shims, the driver and `/proc` are reached through seams (crate::group::ShimLink,
//! crate::native::NativeCheckpoint, crate::procfs::Procs), so every refusal and rollback branch
//! here is unit-tested with scripted ones (the tests at the end).

use crate::ControlError;
use crate::config::ToolConfig;
use crate::group::{Group, Snapshot, check_group};
use crate::native::{Driver, NativeCheckpoint};
use crate::native_steps::native_checkpoint;
use crate::phases::{Bytes, phase_all, rebuild, roll_back, save_all, thaw_all, thaw_only};
use crate::procfs::{Proc, Procs};
use crate::progress::Clock;
use crate::statefile::{default_state_dir, write_state_of};
use crate::suspend_error::SuspendError;
use protocol::state::{CarrierInfo, GroupState, ParticipantState, SuspendMode};
use protocol::{Phase, Request};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// `--carrier`: the carrier asked for (crate::carrier_policy).
    pub carrier: crate::carrier_policy::Requested,
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
            carrier: crate::carrier_policy::Requested::Auto,
            helper: None,
        }
    }
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
) -> Result<(Group, Vec<Snapshot>, crate::carrier_policy::CarrierChoice), SuspendError> {
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
) -> Result<crate::carrier_policy::CarrierChoice, ControlError> {
    let choice = match bytes {
        Bytes::Carriers => choose_carrier(options, group, driver, need, false)?,
        Bytes::Files(_) => {
            crate::carrier_policy::none_for_disk(crate::carrier_policy::host_facts())
        }
    };
    if let (Some(launch), crate::carrier_policy::Carrier::Helper) =
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
    choice: &mut crate::carrier_policy::CarrierChoice,
) -> Result<Vec<Snapshot>, SuspendError> {
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
        if matches!(error, SuspendError::RolledBack { .. }) {
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
) -> Result<Vec<Snapshot>, SuspendError> {
    let progress = clock.progress();
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
            Err(e.into())
        }
        // A context that holds a sticky error: nothing was frozen or released, so a refusal once
        // every gate is open again.
        Err(e @ ControlError::StickyError { .. }) => {
            let _ = thaw_all(group);
            Err(e.into())
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
    choice: &mut crate::carrier_policy::CarrierChoice,
    saved_bytes: u64,
) -> Result<(), ControlError> {
    let progress = clock.progress();
    let through_helper = choice.carrier == crate::carrier_policy::Carrier::Helper;
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

/// The control directories of the group's shims, each once.
pub(crate) fn control_dirs(group: &Group) -> Vec<&Path> {
    let mut dirs: Vec<&Path> = group
        .participants
        .iter()
        .filter_map(|p| p.info.control_socket.as_deref()?.parent())
        .collect();
    dirs.sort_unstable();
    dirs.dedup();
    dirs
}

/// The carrier of this suspend (crate::carrier_policy), from what the machine allows now, or of
/// `cuinterpose prepare` (`preparing`); a carrier asked for that the machine cannot hold is
/// refused, nothing changed.
pub(crate) fn choose_carrier(
    options: &SuspendOptions,
    group: &Group,
    driver: Option<&Driver>,
    need: u64,
    preparing: bool,
) -> Result<crate::carrier_policy::CarrierChoice, ControlError> {
    use crate::carrier_policy::{Requested, choose, device_rooms, host_facts};
    let mut machine = host_facts();
    machine.preparing = preparing;
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
        // Nor where auto takes no helper that is not prepared.
        let falls_back = requested == Requested::Auto
            && (crate::carrier_policy::no_pinning(&machine, need).is_some()
                || !(machine.helper_running || preparing));
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
pub(crate) fn saved_bytes(snapshots: &[Snapshot]) -> u64 {
    snapshots
        .iter()
        .flat_map(|s| &s.record.allocations)
        .map(|a| a.size)
        .sum()
}

/// The captured topology, published atomically (its directory made first, mode 0700: the records
/// describe the application's memory layout).
fn write_state(path: &Path, snapshots: &[Snapshot], mode: SuspendMode) -> Result<(), ControlError> {
    write_state_of(path, &state_of(snapshots, mode))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Classified;
    use crate::carrier_policy::{host_facts, none_for_disk};
    use crate::fakes::{self, Exited, Log, Native, Shim};
    use crate::native::ProcessState;
    use crate::progress::Quiet;
    use crate::statefile::{STATE_FILE, read_state};
    use protocol::ErrorCode;

    /// What a capture of scripted shims did: its result, and where its state file was to go.
    struct Captured {
        result: Result<Vec<Snapshot>, SuspendError>,
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
        let SuspendError::RolledBack { failure } = &error else {
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
        assert_eq!(error.class(), crate::ErrorClass::RolledBack);
    }

    #[test]
    fn a_process_with_calls_in_flight_once_frozen_is_refused_and_every_gate_opened() {
        let log = Log::default();
        let group = vec![
            Shim::new(100, &log),
            Shim::new(101, &log).in_flight_when_frozen(),
        ];
        let run = capture_of(group, Some(&Native::new(&log)), &[], &options());
        let error = run.result.unwrap_err();
        let SuspendError::RolledBack { failure } = &error else {
            panic!("{error}");
        };
        let ControlError::Refused(refusals) = &**failure else {
            panic!("{failure}");
        };
        assert_eq!(refusals.len(), 1);
        assert_eq!(
            refusals[0].to_string(),
            "pid 101 (w): has 1 tracked CUDA call(s) in flight"
        );
        for pid in [100, 101] {
            assert_eq!(log.shim(pid), then(&FROZEN, &["Thaw"]));
        }
        assert!(log.native().is_empty());
        assert!(!run.state.exists());
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
        let SuspendError::RolledBack { failure } = &error else {
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
        // Exit 4 (docs/recovery.md): every gate open again, nothing released; and the drain's
        // error alone says the same wherever it is met.
        assert_eq!(error.class(), crate::ErrorClass::RolledBack);
        assert_eq!(failure.class(), crate::ErrorClass::RolledBack);
    }

    /// A drain past its deadline whose gates do not all open again is no rollback: the process
    /// that did not thaw is named and the workload needs attention (exit 5).
    #[test]
    fn a_group_not_drained_whose_gate_stays_closed_needs_attention() {
        let log = Log::default();
        let options = SuspendOptions {
            freeze_timeout: Duration::from_millis(60),
            ..options()
        };
        let group = vec![
            Shim::new(100, &log),
            Shim::new(101, &log)
                .busy()
                .refusing("Thaw", ErrorCode::Internal),
        ];
        let run = capture_of(group, Some(&Native::new(&log)), &[], &options);
        let error = run.result.unwrap_err();
        let SuspendError::RollbackFailed { failure, rollback } = &error else {
            panic!("{error}");
        };
        assert!(
            matches!(&**failure, ControlError::NotDrained { .. }),
            "{failure}"
        );
        assert_eq!(rollback.len(), 1);
        assert!(
            matches!(&rollback[0], ControlError::Step { step: "thaw", process, .. } if process == "pid 101 (w)"),
            "{}",
            rollback[0]
        );
        assert_eq!(error.class(), crate::ErrorClass::NeedsAttention);
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
                    matches!(&error, SuspendError::NotStarted(ControlError::AnotherRun { process, .. }) if process == "pid 101 (w)"),
                    "{error}"
                ),
                _ => assert!(
                    matches!(&error, SuspendError::NotStarted(ControlError::StickyError { process, .. }) if process == "pid 101 (w)"),
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
        let SuspendError::RolledBack { failure } = &error else {
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
        let SuspendError::RolledBack { failure } = &error else {
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
        let SuspendError::RollbackFailed { failure, rollback } = &error else {
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
        assert_eq!(error.class(), crate::ErrorClass::NeedsAttention);
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
        let SuspendError::RolledBack { failure } = &error else {
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
        let SuspendError::RolledBack { failure } = &error else {
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
        assert!(matches!(&error, SuspendError::RolledBack { .. }), "{error}");
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
