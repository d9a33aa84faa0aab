//! The drain: how a running process is brought to a point where no GPU work of its own runs or is
//! on its way into the driver, without the application's cooperation.
//!
//! - **Hold** closes both gates (the submission gate, `gate::SubmissionGate`, and the tracked-call
//!   gate) without waiting. The tool sends it to every process of the group before it drains any,
//!   so that no process is drained while a peer still submits work it may wait for.
//! - **Drain** waits, up to the tool's slice, until nothing is on its way into the driver (no
//!   submission inside the gate, no admission pending, no tracked call in flight) and then until
//!   every active context's work has finished: a synchronisation thread per device calls
//!   `cuCtxSynchronize` on its primary context. A synchronisation waits for the work submitted
//!   before it started, so each one is tagged with the number of admissions the gate had taken
//!   (its epoch): the process is drained when a synchronisation of the current epoch has finished
//!   and the gate is still quiet. A synchronisation still blocked when the slice ends keeps
//!   running (the driver gives no way to cancel it); a later Drain waits for the same one, and
//!   one that never finishes (a peer's work that never comes) stays blocked until the gates
//!   open and the work completes.
//! - **Admit** lets held submissions through the closed gate, one per request: a kernel of another
//!   process may be spinning on a flag this process's held launch would set (NCCL ranks, IPC
//!   spin barriers); the tool admits while some process's drain is stalled (control's capture).
//! - A context whose synchronisation returns an error holds a sticky error of the application's
//!   own work: the drain fails naming it, before anything is released.
//!
//! Only active primary contexts are synchronised (`cuDevicePrimaryCtxGetState`: entering another
//! device would make a context there); a driver without that entry falls back to the devices
//! the process's records name.
//!
//! State: [`Drain`], the drain job: the submission gate it closes, when the gates closed and each
//! device's synchronisation. The tracked-call gate and the phase are [`Tracking`]'s.

use crate::capture::PhaseError;
use crate::gate::SubmissionGate;
use crate::log::log_debug;
use crate::track::Tracking;
use protocol::message::DrainReport;
use protocol::record::Phase;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a drain looks again at a gate whose submissions are still inside the driver (they
/// leave without signalling: passing the open gate takes no lock).
const GATE_POLL: Duration = Duration::from_millis(1);

/// The drain job: the submission gate it closes, when the gates closed, and the
/// synchronisation of each device.
#[derive(Debug)]
pub struct Drain {
    /// The submission gate this runtime closes (the process's; a fresh one per runtime in unit
    /// tests, which run several runtimes in one process).
    submissions: &'static SubmissionGate,
    held_since: Mutex<Option<Instant>>,
    /// Holds so far: a synchronisation of an earlier hold covers nothing of this one.
    holds: std::sync::atomic::AtomicU64,
    syncs: Mutex<BTreeMap<i32, Arc<ContextSync>>>,
}

/// One device's synchronisation thread and its outcome.
#[derive(Debug, Default)]
struct ContextSync {
    state: Mutex<SyncState>,
    finished: Condvar,
}

#[derive(Clone, Debug, Default)]
enum SyncState {
    /// Never started on this device.
    #[default]
    Idle,
    /// Blocked in `cuCtxSynchronize` (a later epoch waits for it to return, then starts anew).
    Running,
    /// Returned: covers every submission up to this epoch.
    Finished {
        epoch: Epoch,
        result: Result<(), String>,
    },
}

/// What a synchronisation covers: the hold it was started in, and the admissions the gate had
/// taken by then (ordered: a later hold, or more admissions, is a later epoch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Epoch {
    hold: u64,
    admitted: u64,
}

/// What one device's synchronisation says for an epoch.
enum Synced {
    Done,
    StillRunning,
    Failed(String),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drain {
    /// A drain of `submissions`, gates open.
    pub fn new(submissions: &'static SubmissionGate) -> Drain {
        Drain {
            submissions,
            held_since: Mutex::default(),
            holds: std::sync::atomic::AtomicU64::default(),
            syncs: Mutex::default(),
        }
    }

    fn held_micros(&self) -> u64 {
        lock(&self.held_since).map_or(0, |since| {
            u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
        })
    }
}

impl Drain {
    /// The submission gate this drain closes.
    pub(crate) fn submissions(&self) -> &SubmissionGate {
        self.submissions
    }

    /// Hold: closes both gates, waits for nothing.
    pub(crate) fn hold(&self, t: &Tracking) -> Result<DrainReport, PhaseError> {
        t.expect_phase("Hold", &[Phase::Running])?;
        self.close_gates(t);
        Ok(self.drain_report(vec!["held: not drained yet".into()]))
    }

    fn close_gates(&self, t: &Tracking) {
        let mut held_since = lock(&self.held_since);
        if held_since.is_none() {
            self.holds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            *held_since = Some(Instant::now());
        }
        self.submissions().close();
        t.gate.close();
    }

    /// Opens both gates (a thaw, or a capture given up before anything was released).
    pub(crate) fn open_gates(&self, t: &Tracking) {
        self.submissions().open();
        t.gate.thaw();
        *lock(&self.held_since) = None;
    }

    /// Whether a capture closed the gates.
    pub(crate) fn gates_closed(&self) -> bool {
        self.submissions().state().closed
    }

    /// Drain: waits up to `wait` for this process to be drained; answers how it stands either way.
    pub(crate) fn drain(&self, t: &Tracking, wait: Duration) -> Result<DrainReport, PhaseError> {
        t.expect_phase("Drain", &[Phase::Running])?;
        if !self.gates_closed() {
            return Err(PhaseError::Internal(
                "Drain before Hold: the gates are open".into(),
            ));
        }
        let busy = self.drain_until(t, Instant::now() + wait)?;
        Ok(self.drain_report(busy))
    }

    /// Admit: lets up to `count` held submissions through.
    pub(crate) fn admit(&self, t: &Tracking, count: u32) -> Result<DrainReport, PhaseError> {
        t.expect_phase("Admit", &[Phase::Running])?;
        let granted = self.submissions().admit(count);
        log_debug!("admitted {granted} held submissions");
        let busy = if granted > 0 {
            vec![format!(
                "{granted} held submissions admitted, not drained since"
            )]
        } else {
            Vec::new()
        };
        let mut report = self.drain_report(busy);
        report.granted = granted;
        // Nothing admitted: nothing checked either, so not a drained answer.
        report.drained = false;
        Ok(report)
    }

    fn drain_report(&self, busy: Vec<String>) -> DrainReport {
        let gate = self.submissions().state();
        DrainReport {
            drained: busy.is_empty() && gate.closed,
            waiting: gate.waiting,
            admitted: gate.admitted,
            granted: 0,
            busy,
            held_micros: self.held_micros(),
        }
    }

    /// Drains until `deadline`: an empty list when drained, else what is still busy.
    pub(crate) fn drain_until(
        &self,
        t: &Tracking,
        deadline: Instant,
    ) -> Result<Vec<String>, PhaseError> {
        loop {
            let busy = self.drain_step(t, deadline)?;
            if busy.is_empty() || Instant::now() >= deadline {
                return Ok(busy);
            }
        }
    }

    /// One look: the gate first, then every active context's synchronisation for the gate's
    /// current epoch.
    fn drain_step(&self, t: &Tracking, deadline: Instant) -> Result<Vec<String>, PhaseError> {
        let gate = self.submissions().state();
        let tracked = t.gate.in_flight();
        if !gate.is_quiet() || tracked > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            self.submissions().wait_change(left.min(GATE_POLL));
            let mut busy = Vec::new();
            if gate.inside > 0 {
                busy.push(format!(
                    "{} application threads are inside a GPU submission",
                    gate.inside
                ));
            }
            if gate.admits > 0 {
                busy.push(format!(
                    "{} admitted submissions not yet taken",
                    gate.admits
                ));
            }
            if tracked > 0 {
                busy.push(format!("{tracked} tracked memory calls in flight"));
            }
            return Ok(busy);
        }
        let epoch = Epoch {
            hold: self.holds.load(std::sync::atomic::Ordering::SeqCst),
            admitted: gate.admitted,
        };
        let mut busy = Vec::new();
        for device in self.active_devices(t) {
            match self.synced(t, device, epoch, deadline) {
                Synced::Done => {}
                Synced::StillRunning => busy.push(format!(
                    "device {device}: work submitted before the hold is still running"
                )),
                Synced::Failed(error) => {
                    return Err(PhaseError::Sticky { device, error });
                }
            }
        }
        let after = self.submissions().state();
        if busy.is_empty() && (!after.is_quiet() || after.admitted != epoch.admitted) {
            busy.push("a submission was admitted during the synchronisation".into());
        }
        Ok(busy)
    }

    /// Devices whose primary context is active; the recorded devices where the driver cannot say.
    /// A driver that cannot even count its devices (a process holding a sticky error fails every
    /// call) cannot say either: the recorded devices, or device 0 where none is recorded, are
    /// synchronised, and their synchronisation reports the error.
    fn active_devices(&self, t: &Tracking) -> Vec<i32> {
        let (count, mut unknown) = match t.real.device_count() {
            Ok(count) => (count, false),
            Err(_) => (0, true),
        };
        let mut devices = Vec::new();
        for device in 0..count {
            match t.real.primary_ctx_active(device) {
                Ok(true) => devices.push(device),
                Ok(false) => {}
                Err(_) => unknown = true,
            }
        }
        if unknown {
            devices.extend(t.lock().devices());
            devices.sort_unstable();
            devices.dedup();
            if count == 0 && devices.is_empty() {
                devices.push(0);
            }
        }
        devices
    }

    /// Whether `device`'s context has finished every submission up to `epoch`, waiting for its
    /// synchronisation until `deadline`; starts one when none covers the epoch.
    fn synced(&self, t: &Tracking, device: i32, epoch: Epoch, deadline: Instant) -> Synced {
        let sync = lock(&self.syncs).entry(device).or_default().clone();
        let mut state = lock(&sync.state);
        loop {
            match &*state {
                SyncState::Finished {
                    epoch: done,
                    result,
                } if *done >= epoch => {
                    return match result {
                        Ok(()) => Synced::Done,
                        Err(e) => Synced::Failed(e.clone()),
                    };
                }
                SyncState::Idle | SyncState::Finished { .. } => {
                    if let Err(e) = self.start_sync(t, device, epoch, &sync) {
                        return Synced::Failed(e);
                    }
                    *state = SyncState::Running;
                }
                SyncState::Running => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Synced::StillRunning;
                    }
                    state = sync
                        .finished
                        .wait_timeout(state, deadline - now)
                        .map(|(s, _)| s)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
            }
        }
    }

    /// A thread that synchronises `device`'s primary context and records the outcome.
    fn start_sync(
        &self,
        t: &Tracking,
        device: i32,
        epoch: Epoch,
        sync: &Arc<ContextSync>,
    ) -> Result<(), String> {
        let real = t.real;
        let sync = sync.clone();
        crate::threads::spawn_quiet("cuinterpose-drain", move || {
            let result = copy::enter(&real, device)
                .map_err(|e| e.to_string())
                .and_then(|_context| {
                    real.ctx_synchronize()
                        .map_err(|e| format!("{} returned {}", e.call, e.result))
                });
            *lock(&sync.state) = SyncState::Finished { epoch, result };
            sync.finished.notify_all();
        })
        .map(drop)
        .map_err(|e| format!("cannot start a synchronisation thread: {e}"))
    }
}
