//! The gate every application driver call passes: it counts calls in flight, blocks new calls
//! while the process is locked, and fails them once a restore has left the process unusable.
//!
//! Threads of the fake's checkpoint agent are marked and pass without counting, so the agent can
//! run driver work while application threads wait here. The gate has its own mutex, never held
//! while the driver state mutex is taken, so the two cannot deadlock.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cuda_abi::{CUresult, process_state};

use crate::Res;

/// Where the process stands in the checkpoint state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Running,
    /// A lock is waiting for calls in flight; new calls already wait.
    Locking,
    Locked,
    Checkpointed,
    /// A restore failed: every driver call fails from now on.
    Failed,
}

impl Phase {
    /// The `CUprocessState` that `cuCheckpointProcessGetState` reports.
    pub(crate) fn process_state(self) -> u32 {
        match self {
            Phase::Running | Phase::Locking => process_state::RUNNING,
            Phase::Locked => process_state::LOCKED,
            Phase::Checkpointed => process_state::CHECKPOINTED,
            Phase::Failed => process_state::FAILED,
        }
    }
}

#[derive(Debug)]
struct Gate {
    phase: Phase,
    in_flight: usize,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    phase: Phase::Running,
    in_flight: 0,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    static AGENT_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn gate() -> MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marks the calling thread as one of the agent's: its driver work bypasses the gate.
pub(crate) fn mark_agent_thread() {
    AGENT_THREAD.with(|a| a.set(true));
}

/// A call in flight; leaving it wakes a waiting lock.
#[derive(Debug)]
pub(crate) struct InFlight {
    counted: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.counted {
            let mut g = gate();
            g.in_flight -= 1;
            if g.in_flight == 0 {
                CHANGED.notify_all();
            }
        }
    }
}

/// The error of a call made in a process whose restore failed.
pub(crate) const UNUSABLE: CUresult = CUresult::ERROR_ILLEGAL_STATE;

/// Enters a driver call: waits while the process is locked or checkpointed.
pub(crate) fn enter() -> Res<InFlight> {
    if AGENT_THREAD.with(Cell::get) {
        return Ok(InFlight { counted: false });
    }
    let mut g = gate();
    loop {
        match g.phase {
            Phase::Running => break,
            Phase::Failed => return Err(UNUSABLE),
            Phase::Locking | Phase::Locked | Phase::Checkpointed => {
                g = CHANGED.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }
    g.in_flight += 1;
    Ok(InFlight { counted: true })
}

pub(crate) fn phase() -> Phase {
    gate().phase
}

/// Locks the process: new calls wait, and this waits for calls in flight, up to `timeout`
/// (`None`: no limit). On timeout the process is left running.
pub(crate) fn lock(timeout: Option<Duration>) -> Res {
    let mut g = gate();
    if g.phase != Phase::Running {
        return Err(CUresult::ERROR_ILLEGAL_STATE);
    }
    g.phase = Phase::Locking;
    let deadline = timeout.map(|t| Instant::now() + t);
    while g.in_flight > 0 {
        match deadline {
            None => g = CHANGED.wait(g).unwrap_or_else(PoisonError::into_inner),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    g.phase = Phase::Running;
                    CHANGED.notify_all();
                    return Err(CUresult::ERROR_TIMEOUT);
                }
                g = CHANGED
                    .wait_timeout(g, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
    }
    g.phase = Phase::Locked;
    Ok(())
}

/// Moves from `from` to `to`, or fails with `CUDA_ERROR_ILLEGAL_STATE`.
pub(crate) fn transition(from: Phase, to: Phase) -> Res {
    let mut g = gate();
    if g.phase != from {
        return Err(CUresult::ERROR_ILLEGAL_STATE);
    }
    g.phase = to;
    CHANGED.notify_all();
    Ok(())
}

/// Requires the process to be in `phase` (the agent holds its operation lock meanwhile, so the
/// phase cannot change under it).
pub(crate) fn require(phase: Phase) -> Res {
    if gate().phase == phase {
        Ok(())
    } else {
        Err(CUresult::ERROR_ILLEGAL_STATE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test process never initialises the driver, so the gate is free for this test.
    #[test]
    fn lock_waits_for_calls_in_flight_and_blocks_new_ones() {
        let in_flight = enter().unwrap();
        let timed_out = std::thread::spawn(|| lock(Some(Duration::from_millis(50))))
            .join()
            .unwrap();
        assert_eq!(timed_out, Err(CUresult::ERROR_TIMEOUT));
        assert_eq!(phase(), Phase::Running, "a timed-out lock changes nothing");
        drop(in_flight);
        assert_eq!(lock(None), Ok(()));
        assert_eq!(phase(), Phase::Locked);
        assert_eq!(lock(None), Err(CUresult::ERROR_ILLEGAL_STATE));
        let (tx, rx) = std::sync::mpsc::channel();
        let caller = std::thread::spawn(move || {
            let entered = enter().map(|_| ());
            tx.send(entered).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a call waits while locked"
        );
        assert_eq!(transition(Phase::Locked, Phase::Running), Ok(()));
        assert_eq!(rx.recv().unwrap(), Ok(()));
        caller.join().unwrap();
        assert_eq!(
            transition(Phase::Locked, Phase::Running),
            Err(CUresult::ERROR_ILLEGAL_STATE)
        );
        // Agent threads pass a locked gate.
        assert_eq!(lock(None), Ok(()));
        let agent = std::thread::spawn(|| {
            mark_agent_thread();
            enter().map(|_| ())
        });
        assert_eq!(agent.join().unwrap(), Ok(()));
        assert_eq!(transition(Phase::Locked, Phase::Running), Ok(()));
    }
}
