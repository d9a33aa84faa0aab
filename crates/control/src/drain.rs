//! The group-wide drain that starts every capture (docs/design.md, "The drain"): a running job
//! is brought to rest without its cooperation, and nothing is released before every process of the
//! group is drained.
//!
//! 1. **Hold** to every process at once: each shim closes its gates (new GPU submissions and
//!    tracked memory calls of the application wait). No process is drained before all are held,
//!    so none is drained while a peer can still submit work it waits for.
//! 2. **Drain** in slices to every process not yet drained: each shim waits for what is on its
//!    way into the driver and for its contexts' work to finish. A drained process stays drained
//!    (its gates are closed) unless the tool admits something into it.
//! 3. When a slice ends with no process newly drained, the group is stalled: kernels of one
//!    process wait for work of another that is held at its gate (NCCL ranks in a collective,
//!    processes spinning on each other's flags in shared memory). The tool then **admits** held
//!    submissions, one per process at first and twice as many at each stall in a row (a process
//!    with many submitting threads lets its peers catch up in a few slices), so the exchange in
//!    flight completes instead of being cut. It admits into the processes that are drained and
//!    hold submissions: a process still busy waits for a peer, so what it holds would only take it
//!    further ahead and start new waits, while the work it waits for is held in a process that is
//!    at rest (the one behind). Admitting into every process at each stall made a chase that
//!    never ended in rings of 8 spinning processes: each admission moved the ranks ahead as far as
//!    the one behind. Only when no drained process holds anything (a process that waits for its
//!    own held work, two streams of one process) are the busy ones admitted into.
//! 4. The deadline (`--freeze-timeout`) ends it: every gate opens again (the caller's rollback),
//!    nothing was released, and the refusal names each process still busy, what it waits for,
//!    and what is held at its gate.
//!
//! A job that never stops (a persistent kernel, a peer outside the group that never calls the
//! collective) is refused this way; anything that completes its exchanges is drained.

use crate::ControlError;
use crate::group::Participant;
use protocol::message::DrainReport;
use protocol::{ErrorCode, Request};
use std::time::{Duration, Instant};

/// How long one Drain request may wait inside a shim: short, so that a stall is seen soon and
/// held submissions are admitted while peers spin.
const SLICE: Duration = Duration::from_millis(25);
/// Most submissions admitted into one process at one stall.
const MAX_ADMIT: u32 = 64;

/// When one process was drained, counted from the hold.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Drained {
    pub process: String,
    pub millis: f64,
    /// Held submissions the drain admitted into it.
    pub admitted: u64,
}

/// One process's standing in the drain.
struct Standing {
    last: DrainReport,
    drained_at: Option<f64>,
    admitted_at_hold: u64,
}

/// Holds and drains the whole group (module docs). On error the caller opens the gates again
/// (Thaw): some processes may be held.
pub(crate) fn drain_group(
    participants: &mut [Participant],
    timeout: Duration,
) -> Result<Vec<Drained>, ControlError> {
    let start = Instant::now();
    let deadline = start + timeout;
    let held = request_all(participants, &Request::Hold)?;
    let mut standing: Vec<Standing> = held
        .into_iter()
        .map(|last| Standing {
            admitted_at_hold: last.admitted,
            last,
            drained_at: None,
        })
        .collect();
    let mut admit = 1u32;
    loop {
        let newly = drain_slice(participants, &mut standing, deadline, start)?;
        if standing.iter().all(|s| s.drained_at.is_some()) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(not_drained(participants, &standing, timeout));
        }
        if newly > 0 {
            admit = 1;
            continue;
        }
        admit_held(participants, &mut standing, admit)?;
        admit = (admit * 2).min(MAX_ADMIT);
    }
    Ok(participants
        .iter()
        .zip(&standing)
        .map(|(p, s)| Drained {
            process: p.info.label(),
            millis: s.drained_at.unwrap_or(0.0),
            admitted: s.last.admitted.saturating_sub(s.admitted_at_hold),
        })
        .collect())
}

/// One Drain slice to every process not drained yet; returns how many were newly drained.
fn drain_slice(
    participants: &mut [Participant],
    standing: &mut [Standing],
    deadline: Instant,
    start: Instant,
) -> Result<usize, ControlError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let wait_ms = u32::try_from(left.min(SLICE).as_millis()).unwrap_or(u32::MAX);
    let request = Request::Drain { wait_ms };
    let pending: Vec<&mut Participant> = participants
        .iter_mut()
        .zip(standing.iter())
        .filter(|(_, s)| s.drained_at.is_none())
        .map(|(p, _)| p)
        .collect();
    let reports = crate::parallel::for_each_mut(pending, |p| p.drain_request(&request));
    let mut newly = 0;
    let pending_standing = standing.iter_mut().filter(|s| s.drained_at.is_none());
    for (s, report) in pending_standing.zip(reports) {
        s.last = report.map_err(sticky_refusal)?;
        if s.last.drained {
            s.drained_at = Some(start.elapsed().as_secs_f64() * 1e3);
            newly += 1;
        }
    }
    Ok(newly)
}

/// Admits up to `count` held submissions at a stall (module docs, step 3): into the drained
/// processes first, and only when none of them holds anything into the busy ones. A process that
/// let some through is no longer drained.
fn admit_held(
    participants: &mut [Participant],
    standing: &mut [Standing],
    count: u32,
) -> Result<(), ControlError> {
    let at_rest: Vec<bool> = standing.iter().map(|s| s.drained_at.is_some()).collect();
    let granted = admit_into(participants, standing, count, &at_rest)?;
    if granted == 0 {
        let busy: Vec<bool> = at_rest.iter().map(|rest| !rest).collect();
        admit_into(participants, standing, count, &busy)?;
    }
    Ok(())
}

/// Admits up to `count` held submissions into each process `chosen` marks; returns how many were
/// granted in all.
fn admit_into(
    participants: &mut [Participant],
    standing: &mut [Standing],
    count: u32,
    chosen: &[bool],
) -> Result<u64, ControlError> {
    let request = Request::Admit { count };
    let targets: Vec<&mut Participant> = participants
        .iter_mut()
        .zip(chosen)
        .filter(|(_, chosen)| **chosen)
        .map(|(p, _)| p)
        .collect();
    let reports = crate::parallel::for_each_mut(targets, |p| p.drain_request(&request));
    let target_standing = standing
        .iter_mut()
        .zip(chosen)
        .filter(|(_, chosen)| **chosen)
        .map(|(s, _)| s);
    let mut granted = 0u64;
    for (s, report) in target_standing.zip(reports) {
        let report = report?;
        granted += u64::from(report.granted);
        if report.granted > 0 {
            tracing::debug!(granted = report.granted, "held submissions admitted");
            s.drained_at = None;
            s.last = report;
        } else {
            s.last.waiting = report.waiting;
            s.last.admitted = report.admitted;
        }
    }
    Ok(granted)
}

/// Hold to everyone at once. Another run holding a process's capture is a refusal.
fn request_all(
    participants: &mut [Participant],
    request: &Request,
) -> Result<Vec<DrainReport>, ControlError> {
    let results = crate::parallel::for_each_mut(participants.iter_mut().collect(), |p| {
        p.drain_request(request).map_err(|e| match e {
            ControlError::Shim {
                process,
                code: ErrorCode::Busy,
                message,
            } => ControlError::AnotherRun { process, message },
            other => sticky_refusal(other),
        })
    });
    results.into_iter().collect()
}

/// A shim's report of a sticky error in one of its contexts, as the refusal it is (exit 3: the
/// caller opens the gates again and nothing else was changed).
fn sticky_refusal(error: ControlError) -> ControlError {
    match error {
        ControlError::Shim {
            process,
            code: ErrorCode::Sticky,
            message,
        } => ControlError::StickyError { process, message },
        other => other,
    }
}

/// The refusal after the deadline: each process still busy and why, and what is held where.
fn not_drained(
    participants: &[Participant],
    standing: &[Standing],
    timeout: Duration,
) -> ControlError {
    let mut busy = Vec::new();
    for (p, s) in participants.iter().zip(standing) {
        let label = p.info.label();
        if s.drained_at.is_none() {
            let why = if s.last.busy.is_empty() {
                "not drained".to_string()
            } else {
                s.last.busy.join("; ")
            };
            busy.push(format!("{label}: {why}"));
        }
        if s.last.waiting > 0 {
            busy.push(format!(
                "{label}: {} GPU submissions held at its gate",
                s.last.waiting
            ));
        }
    }
    ControlError::NotDrained { timeout, busy }
}
