//! The driver's checkpoint steps over a whole group, behind [`NativeCheckpoint`]: lock and
//! checkpoint every process (undone on a failure), restore and unlock them, and a resume's
//! restore from whatever native state a suspend left each process in.

use crate::ControlError;
use crate::group::{Group, Participant};
use crate::native::{NativeCheckpoint, ProcessState};
use crate::parallel::for_each;
use crate::phases::step_error;

/// Locks every process, then checkpoints each. On a failure it brings back what it changed (restore
/// and unlock) before returning the error, so the caller can roll the shims back.
pub(crate) fn native_checkpoint(
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
        for_each("native lock", &pids, |&(pid, _)| {
            driver.lock(pid, lock_timeout_ms)
        }),
    );
    if let Some((label, e)) = failed {
        undo_native(driver, &[], &locked);
        return Err(step_error("native lock", label, e));
    }
    // Every process is locked, so nothing runs against memory the others are saving: the
    // checkpoints go in parallel (each is the driver moving one process's private memory).
    let (checkpointed, failed) = split(
        &pids,
        for_each("native checkpoint", &pids, |&(pid, _)| {
            driver.checkpoint(pid)
        }),
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

/// Best effort after a failed native step: restore the checkpointed processes, unlock the locked.
fn undo_native(driver: &dyn NativeCheckpoint, checkpointed: &[u32], locked: &[u32]) {
    let restored = for_each("native restore", checkpointed, |&pid| {
        driver.restore(pid, &[])
    });
    for (pid, result) in checkpointed.iter().zip(restored) {
        if let Err(e) = result {
            tracing::error!(pid, error = %e, "native restore while undoing a failed checkpoint");
        }
    }
    let unlocked = for_each("native unlock", locked, |&pid| driver.unlock(pid));
    for (pid, result) in locked.iter().zip(unlocked) {
        if let Err(e) = result {
            tracing::error!(pid, error = %e, "native unlock while undoing a failed checkpoint");
        }
    }
}

/// Native restore of every process (remapping GPUs as asked), then unlock of every process.
pub(crate) fn native_restore(
    driver: &dyn NativeCheckpoint,
    group: &Group,
    gpu_pairs: &[(cuda_abi::CUuuid, cuda_abi::CUuuid)],
) -> Result<(), ControlError> {
    let restored = for_each("native restore", &group.participants, |p| {
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
    let unlocked = for_each("native unlock", participants, |p| {
        driver.unlock(p.info.host_pid)
    });
    for (p, result) in participants.iter().zip(unlocked) {
        result.map_err(|e| step_error("native unlock", &p.info.label(), e))?;
    }
    Ok(())
}

/// Brings every participant back to native RUNNING from wherever a suspend left it: restore and
/// unlock a checkpointed process, unlock a locked one, leave a running one alone (a capture that
/// was killed, or that failed to roll back, before its native lock released shared memory
/// without ever locking). Refuses nothing it does not understand: a FAILED process is reported.
pub(crate) fn native_resume(
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
    let restored = for_each("native restore", &to_restore, |p| {
        driver.restore(p.info.host_pid, gpu_pairs)
    });
    for (p, result) in to_restore.iter().zip(restored) {
        result.map_err(|e| step_error("native restore", &p.info.label(), e))?;
    }
    to_unlock.extend(to_restore);
    unlock_all(driver, &to_unlock)
}

#[cfg(test)]
mod tests {
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
