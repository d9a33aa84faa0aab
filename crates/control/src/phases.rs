//! The shims' side of a capture and a rebuild: one phase request sent to every participant at
//! once, Save and Load to wherever the bytes go ([`Bytes`]: the shims' carriers, or data files a
//! checkpoint implements behind [`FileBytes`]), the rollback of a capture that failed before the
//! native lock, and the rebuild (load, import, multicast steps, verify, thaw) of a resume and a
//! restore.

use crate::group::{Group, Participant, PhaseResult, Snapshot};
use crate::parallel::for_each_mut;
use crate::procfs::Procs;
use crate::progress::{Clock, ParticipantSummary, Progress, summarize};
use crate::statefile::captured_label;
use crate::suspend_error::SuspendError;
use crate::{ControlError, Refusal};
use protocol::state::{GroupState, ParticipantState, SuspendMode};
use protocol::{MulticastStep, Phase, ProcessRecord, Request};

/// Sends `request` to every participant at once (one thread each) and waits for all.
pub(crate) fn phase_all(
    participants: &mut [Participant],
    step: &'static str,
    request: &Request,
    progress: &dyn Progress,
) -> Result<(Vec<PhaseResult>, u64, f64), ControlError> {
    let results = for_each_mut(step, participants.iter_mut().collect(), |p| {
        let result = p
            .phase(request)
            .map_err(|e| step_error(step, &p.info.label(), e));
        if let Ok(r) = &result {
            progress.advance(r.bytes);
            progress.participant_done(step, &p.info.label(), r);
        }
        result
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

pub(crate) fn step_error(step: &'static str, process: &str, source: ControlError) -> ControlError {
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
    Files(&'a dyn FileBytes),
}

/// Where a checkpoint to disk keeps the shared bytes (the data files and block store of disk/):
/// declared here, where Save and Load are sent, so that the capture does not know the disk format.
pub(crate) trait FileBytes: Sync + std::fmt::Debug {
    /// SaveTo to every participant: bytes written and the slowest shim's milliseconds.
    fn save_all(
        &self,
        participants: &mut [Participant],
        progress: &dyn Progress,
    ) -> Result<(u64, f64), ControlError>;
    /// LoadFrom to every participant: bytes read and the slowest shim's milliseconds.
    fn load_all(
        &self,
        participants: &mut [Participant],
        progress: &dyn Progress,
    ) -> Result<(u64, f64), ControlError>;
}

/// Save (or SaveTo) to every participant: bytes moved and the slowest shim's milliseconds.
/// `mode` tells the shims whether a native checkpoint follows (their `auto` carrier pins only
/// for a cycle that skips it).
/// Save (or SaveTo) to every participant; with carriers, also what the carriers cost the Save.
pub(crate) fn save_all(
    participants: &mut [Participant],
    bytes: Bytes<'_>,
    mode: SuspendMode,
    through_helper: bool,
    progress: &dyn Progress,
) -> Result<(u64, f64, Option<crate::carrier_policy::SaveCarriers>), ControlError> {
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
                let slowest = |micros: fn(&protocol::message::CopyStats) -> u64| {
                    moved.iter().map(|st| micros(st)).max().unwrap_or(0) as f64 / 1e3
                };
                let carriers = crate::carrier_policy::SaveCarriers {
                    carrier_millis: slowest(|st| st.carrier_micros),
                    copy_millis: slowest(|st| st.copy_micros),
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
pub(crate) fn load_all(
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
pub(crate) fn rebuild(
    group: &mut Group,
    clock: &mut Clock<'_>,
    bytes: Bytes<'_>,
) -> Vec<ControlError> {
    let progress = clock.progress();
    let mut errors = Vec::new();
    if let Err(e) = clock.time("load", None, || {
        load_all(&mut group.participants, bytes, progress).map(|(b, s)| ((), b, s))
    }) {
        errors.push(e);
    }
    let multicast = MulticastStep::ALL.map(|step| (step.name(), Request::Multicast(step)));
    for (name, request) in std::iter::once(("import", Request::Import)).chain(multicast) {
        if let Err(e) = clock.time(name, None, || {
            phase_all(&mut group.participants, name, &request, progress)
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
pub(crate) fn thaw_all(group: &mut Group) -> Vec<ControlError> {
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
pub(crate) fn roll_back(
    group: &mut Group,
    procs: &dyn Procs,
    clock: &mut Clock<'_>,
    failure: ControlError,
    rollback: &dyn Fn(&mut Group, &mut Clock<'_>) -> Vec<ControlError>,
) -> SuspendError {
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
        SuspendError::RolledBack {
            failure: Box::new(failure),
        }
    } else {
        SuspendError::RollbackFailed {
            failure: Box::new(failure),
            rollback: errors,
        }
    }
}

pub(crate) fn thaw_only(group: &mut Group, _clock: &mut Clock<'_>) -> Vec<ControlError> {
    thaw_all(group)
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
    let progress = clock.progress();
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

/// Checks that the live group is the captured one, participant for participant, none running.
/// Returns the captured participants that have exited (the caller decides whether to go on
/// without them); a captured process still alive but not in the group is refused.
pub(crate) fn match_participants(
    group: &mut Group,
    state: &GroupState,
    procs: &dyn Procs,
) -> Result<Vec<ParticipantState>, ControlError> {
    let mut refusals = Vec::new();
    let mut lost = Vec::new();
    for captured in &state.participants {
        if !group
            .participants
            .iter()
            .any(|p| p.info.host_pid == captured.host_pid)
        {
            if procs.exited(captured.host_pid) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{self, Exited, Log, Shim};
    use crate::group_capture::state_of;
    use crate::progress::Quiet;
    use protocol::{Blocker, ErrorCode};

    /// The state a capture of `pids` (all frozen, nothing shared) would have written.
    fn captured(log: &Log, pids: &[u32]) -> GroupState {
        let mut group = fakes::group(pids.iter().map(|&pid| Shim::new(pid, log)).collect());
        state_of(&group.snapshot().unwrap(), SuspendMode::Native)
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_rebuild_loads_imports_verifies_then_thaws_and_skips_multicast_steps_without_objects() {
        let log = Log::default();
        let state = captured(&Log::default(), &[100, 101]);
        let mut group = fakes::group(vec![Shim::new(100, &log), Shim::new(101, &log)]);
        let mut clock = Clock::new(&Quiet);
        let (summary, _) = finish_rebuild(&mut group, &state, &mut clock, Bytes::Carriers).unwrap();
        assert_eq!(summary.len(), 2);
        for pid in [100, 101] {
            assert_eq!(
                log.shim(pid),
                strings(&["Load", "Import", "Inspect", "Thaw"])
            );
        }
        let phases: Vec<&str> = clock.phases.iter().map(|p| p.name).collect();
        assert_eq!(phases, ["load", "import", "verify", "thaw"]);
    }

    #[test]
    fn a_rebuilt_group_that_differs_from_the_captured_one_is_left_frozen() {
        let log = Log::default();
        let mut state = captured(&Log::default(), &[100, 101]);
        state.participants[1]
            .record
            .blockers
            .push(Blocker::LegacyIpcExport { address: 0x1000 });
        let mut group = fakes::group(vec![Shim::new(100, &log), Shim::new(101, &log)]);
        let error = finish_rebuild(&mut group, &state, &mut Clock::new(&Quiet), Bytes::Carriers)
            .unwrap_err();
        let ControlError::VerifyFailed(refusals) = &error else {
            panic!("{error}");
        };
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].process, "pid 101 (w)");
        assert_eq!(
            refusals[0].reason,
            "rebuilt blockers differ from the captured ones"
        );
        for pid in [100, 101] {
            assert_eq!(
                log.shim(pid),
                strings(&["Load", "Import", "Inspect"]),
                "no Thaw"
            );
        }
    }

    #[test]
    fn a_load_failing_in_one_process_stops_the_rebuild_before_any_import() {
        let log = Log::default();
        let state = captured(&Log::default(), &[100, 101]);
        let mut group = fakes::group(vec![
            Shim::new(100, &log),
            Shim::new(101, &log).refusing("Load", ErrorCode::Driver),
        ]);
        let error = finish_rebuild(&mut group, &state, &mut Clock::new(&Quiet), Bytes::Carriers)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "load failed for pid 101 (w): shim reported Driver: Load refused"
        );
        for pid in [100, 101] {
            assert_eq!(log.shim(pid), strings(&["Load"]));
        }
    }

    #[test]
    fn the_live_group_must_be_the_captured_one_and_the_exited_are_returned_as_lost() {
        let log = Log::default();
        // Captured: 100, 101 (exited since) and 102 (alive, but no longer in the group).
        let state = captured(&Log::default(), &[100, 101, 102]);
        // Live: 100, and 103, which the capture did not see.
        let mut group = fakes::group(vec![Shim::new(100, &log), Shim::new(103, &log)]);
        let error = match_participants(&mut group, &state, &Exited(vec![101])).unwrap_err();
        let ControlError::Refused(refusals) = &error else {
            panic!("{error}");
        };
        let reasons: Vec<String> = refusals.iter().map(ToString::to_string).collect();
        assert_eq!(
            reasons,
            [
                "pid 102: was captured but is not part of the group now",
                "pid 100 (w): is running, not suspended",
                "pid 103 (w): uses CUDA but was not part of the captured group",
            ]
        );
        // Frozen now, and 102 gone too: the exited ones are the caller's to judge.
        let log = Log::default();
        let mut group = fakes::group(vec![Shim::new(100, &log)]);
        group.participants[0]
            .phase(&Request::Freeze { timeout_ms: 0 })
            .unwrap();
        let lost = match_participants(&mut group, &state, &Exited(vec![101, 102])).unwrap();
        let lost: Vec<u32> = lost.iter().map(|p| p.host_pid).collect();
        assert_eq!(lost, [101, 102]);
    }
}
