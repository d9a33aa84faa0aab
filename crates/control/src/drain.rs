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

/// The group as the drain sees it: a seam in front of the shims, so that the policy of this
/// module is tested on its own (the tests at the end drive it with scripted processes).
pub(crate) trait Members {
    /// How many processes the group has.
    fn count(&self) -> usize;
    /// Process `i` as errors and reports name it.
    fn label(&self, i: usize) -> String;
    /// Sends `request` (Hold, Drain or Admit) to every process `chosen` marks, all at once; their
    /// answers in their order.
    fn ask(&mut self, chosen: &[bool], request: &Request)
    -> Vec<Result<DrainReport, ControlError>>;
}

impl Members for [Participant] {
    fn count(&self) -> usize {
        self.len()
    }

    fn label(&self, i: usize) -> String {
        self.get(i).map(|p| p.info.label()).unwrap_or_default()
    }

    fn ask(
        &mut self,
        chosen: &[bool],
        request: &Request,
    ) -> Vec<Result<DrainReport, ControlError>> {
        let targets: Vec<&mut Participant> = self
            .iter_mut()
            .zip(chosen)
            .filter(|(_, chosen)| **chosen)
            .map(|(p, _)| p)
            .collect();
        crate::parallel::for_each_mut("drain", targets, |p| p.drain_request(request))
    }
}

/// One process's standing in the drain.
struct Standing {
    last: DrainReport,
    drained_at: Option<f64>,
    admitted_at_hold: u64,
}

/// Holds and drains the whole group (module docs). On error the caller opens the gates again
/// (Thaw): some processes may be held.
pub(crate) fn drain_group<M: Members + ?Sized>(
    members: &mut M,
    timeout: Duration,
) -> Result<Vec<Drained>, ControlError> {
    let start = Instant::now();
    let deadline = start + timeout;
    let held = request_all(members, &Request::Hold)?;
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
        let newly = drain_slice(members, &mut standing, deadline, start)?;
        if standing.iter().all(|s| s.drained_at.is_some()) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(not_drained(members, &standing, timeout));
        }
        if newly > 0 {
            admit = 1;
            continue;
        }
        admit_held(members, &mut standing, admit)?;
        admit = (admit * 2).min(MAX_ADMIT);
    }
    Ok(standing
        .iter()
        .enumerate()
        .map(|(i, s)| Drained {
            process: members.label(i),
            millis: s.drained_at.unwrap_or(0.0),
            admitted: s.last.admitted.saturating_sub(s.admitted_at_hold),
        })
        .collect())
}

/// One Drain slice to every process not drained yet; returns how many were newly drained.
fn drain_slice<M: Members + ?Sized>(
    members: &mut M,
    standing: &mut [Standing],
    deadline: Instant,
    start: Instant,
) -> Result<usize, ControlError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let wait_ms = u32::try_from(left.min(SLICE).as_millis()).unwrap_or(u32::MAX);
    let request = Request::Drain { wait_ms };
    let pending: Vec<bool> = standing.iter().map(|s| s.drained_at.is_none()).collect();
    let reports = members.ask(&pending, &request);
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
fn admit_held<M: Members + ?Sized>(
    members: &mut M,
    standing: &mut [Standing],
    count: u32,
) -> Result<(), ControlError> {
    let at_rest: Vec<bool> = standing.iter().map(|s| s.drained_at.is_some()).collect();
    let granted = admit_into(members, standing, count, &at_rest)?;
    if granted == 0 {
        let busy: Vec<bool> = at_rest.iter().map(|rest| !rest).collect();
        admit_into(members, standing, count, &busy)?;
    }
    Ok(())
}

/// Admits up to `count` held submissions into each process `chosen` marks; returns how many were
/// granted in all.
fn admit_into<M: Members + ?Sized>(
    members: &mut M,
    standing: &mut [Standing],
    count: u32,
    chosen: &[bool],
) -> Result<u64, ControlError> {
    if !chosen.contains(&true) {
        return Ok(0);
    }
    let reports = members.ask(chosen, &Request::Admit { count });
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
fn request_all<M: Members + ?Sized>(
    members: &mut M,
    request: &Request,
) -> Result<Vec<DrainReport>, ControlError> {
    let everyone = vec![true; members.count()];
    members
        .ask(&everyone, request)
        .into_iter()
        .map(|result| {
            result.map_err(|e| match e {
                ControlError::Shim {
                    process,
                    code: ErrorCode::Busy,
                    message,
                } => ControlError::AnotherRun { process, message },
                other => sticky_refusal(other),
            })
        })
        .collect()
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
fn not_drained<M: Members + ?Sized>(
    members: &M,
    standing: &[Standing],
    timeout: Duration,
) -> ControlError {
    let mut busy = Vec::new();
    for (i, s) in standing.iter().enumerate() {
        let label = members.label(i);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted process: what it answers to Hold, Drain and Admit.
    #[derive(Default)]
    struct Scripted {
        /// Submissions held at its gate.
        holding: u32,
        /// Admitted since the hold.
        admitted: u64,
        /// Drained only once this process has had something admitted (it spins on a flag that
        /// work held there sets).
        waits_on: Option<usize>,
        /// Drained only once something of its own was admitted (two streams of one process).
        waits_on_itself: bool,
        /// Never drained (a persistent kernel).
        never: bool,
        /// A context holds a sticky error.
        sticky: bool,
        /// Another run holds its capture.
        busy_elsewhere: bool,
    }

    /// The group: the processes and every request each got, in order.
    #[derive(Default)]
    struct Group {
        processes: Vec<Scripted>,
        log: Vec<(usize, Request)>,
    }

    impl Group {
        fn of(processes: Vec<Scripted>) -> Group {
            Group {
                processes,
                log: Vec::new(),
            }
        }

        fn drained(&self, i: usize) -> bool {
            let p = &self.processes[i];
            !p.never
                && p.waits_on.is_none_or(|j| self.processes[j].admitted > 0)
                && (!p.waits_on_itself || p.admitted > 0)
        }

        /// The processes each Admit went to, in order.
        fn admitted_into(&self) -> Vec<usize> {
            self.log
                .iter()
                .filter(|(_, r)| matches!(r, Request::Admit { .. }))
                .map(|(i, _)| *i)
                .collect()
        }

        fn answer(&mut self, i: usize, request: &Request) -> Result<DrainReport, ControlError> {
            self.log.push((i, request.clone()));
            let p = &self.processes[i];
            let refuse = |code: ErrorCode, message: &str| ControlError::Shim {
                process: self.label(i),
                code,
                message: message.into(),
            };
            if p.busy_elsewhere {
                return Err(refuse(ErrorCode::Busy, "another run holds this capture"));
            }
            if p.sticky && matches!(request, Request::Drain { .. }) {
                return Err(refuse(
                    ErrorCode::Sticky,
                    "the context of device 0 holds an error of the application's own work \
                     (CUDA_ERROR_ILLEGAL_ADDRESS)",
                ));
            }
            let mut granted = 0;
            if let Request::Admit { count } = request {
                let p = &mut self.processes[i];
                granted = (*count).min(p.holding);
                p.holding -= granted;
                p.admitted += u64::from(granted);
            }
            let drained = granted == 0
                && matches!(request, Request::Drain { .. } | Request::Admit { .. })
                && self.drained(i);
            let p = &self.processes[i];
            Ok(DrainReport {
                drained,
                waiting: p.holding,
                admitted: p.admitted,
                granted,
                busy: if drained {
                    Vec::new()
                } else {
                    vec!["device 0: work submitted before the hold is still running".into()]
                },
                held_micros: 0,
            })
        }
    }

    impl Members for Group {
        fn count(&self) -> usize {
            self.processes.len()
        }

        fn label(&self, i: usize) -> String {
            format!("pid {}", 100 + i)
        }

        fn ask(
            &mut self,
            chosen: &[bool],
            request: &Request,
        ) -> Vec<Result<DrainReport, ControlError>> {
            (0..self.processes.len())
                .filter(|&i| chosen.get(i).copied().unwrap_or(false))
                .map(|i| self.answer(i, request))
                .collect()
        }
    }

    const LONG: Duration = Duration::from_secs(600);

    #[test]
    fn a_group_at_rest_is_drained_without_admitting_anything() {
        let mut group = Group::of(vec![Scripted::default(), Scripted::default()]);
        let drained = drain_group(&mut group, LONG).unwrap();
        let names: Vec<&str> = drained.iter().map(|d| d.process.as_str()).collect();
        assert_eq!(names, ["pid 100", "pid 101"]);
        assert!(drained.iter().all(|d| d.admitted == 0), "{drained:?}");
        // Hold to both before any Drain, then one Drain each.
        let kinds: Vec<(usize, u16)> = group.log.iter().map(|(i, r)| (*i, r.kind())).collect();
        let (hold, drain) = (Request::Hold.kind(), Request::Drain { wait_ms: 0 }.kind());
        assert_eq!(kinds, [(0, hold), (1, hold), (0, drain), (1, drain)]);
    }

    #[test]
    fn a_stall_admits_into_the_processes_at_rest_first() {
        // 0 is at rest and holds the launch 1 spins for; 1 holds work too, which would only take
        // it further ahead: only 0 is admitted into.
        let mut group = Group::of(vec![
            Scripted {
                holding: 1,
                ..Scripted::default()
            },
            Scripted {
                holding: 3,
                waits_on: Some(0),
                ..Scripted::default()
            },
        ]);
        let drained = drain_group(&mut group, LONG).unwrap();
        assert_eq!(group.admitted_into(), [0]);
        assert_eq!(drained[0].admitted, 1, "{drained:?}");
        assert_eq!(drained[1].admitted, 0, "{drained:?}");
        assert_eq!(group.processes[1].holding, 3);
    }

    #[test]
    fn busy_processes_are_admitted_into_only_when_those_at_rest_grant_nothing() {
        // 0 is at rest and holds nothing; 1 waits for its own held work.
        let mut group = Group::of(vec![
            Scripted::default(),
            Scripted {
                holding: 1,
                waits_on_itself: true,
                ..Scripted::default()
            },
        ]);
        let drained = drain_group(&mut group, LONG).unwrap();
        assert_eq!(group.admitted_into(), [0, 1]);
        assert_eq!(drained[1].admitted, 1, "{drained:?}");
    }

    #[test]
    fn the_deadline_refuses_naming_each_busy_process_and_what_it_holds() {
        let mut group = Group::of(vec![
            Scripted::default(),
            Scripted {
                never: true,
                holding: 2,
                ..Scripted::default()
            },
        ]);
        let e = drain_group(&mut group, Duration::ZERO).unwrap_err();
        let ControlError::NotDrained { busy, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(
            busy,
            &[
                "pid 101: device 0: work submitted before the hold is still running".to_string(),
                "pid 101: 2 GPU submissions held at its gate".to_string(),
            ]
        );
        // Nothing was admitted once the deadline had passed.
        assert!(group.admitted_into().is_empty());
    }

    #[test]
    fn a_sticky_error_and_another_run_are_refusals_naming_the_process() {
        let mut group = Group::of(vec![
            Scripted::default(),
            Scripted {
                sticky: true,
                ..Scripted::default()
            },
        ]);
        match drain_group(&mut group, LONG).unwrap_err() {
            ControlError::StickyError { process, message } => {
                assert_eq!(process, "pid 101");
                assert!(message.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let mut group = Group::of(vec![Scripted {
            busy_elsewhere: true,
            ..Scripted::default()
        }]);
        assert!(matches!(
            drain_group(&mut group, LONG).unwrap_err(),
            ControlError::AnotherRun { .. }
        ));
    }
}
