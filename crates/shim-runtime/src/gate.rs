//! The two gates the capture closes.
//!
//! - [`Gate`]: tracked memory calls (create, map, export, import, ...) wait at it while closed, and
//!   the calls already past it are counted so that Freeze can wait for them to drain (and INSPECT
//!   can report them).
//! - [`SubmissionGate`] ([`submissions`]): every call that submits GPU work or touches device
//!   memory contents (the driver table's `gated` section: launches, copies, memsets, stream memory
//!   operations, event records and waits, prefetches) passes it. Open, passing costs a store to the
//!   calling thread's own slot and one load of the shared flag; closed, application threads wait
//!   at it (the shim's own threads call the driver directly and never meet it), and the drain can
//!   tell from the slots that no submission is half way into the driver. While the group's drain
//!   is stalled, the tool admits held submissions one at a time ([`SubmissionGate::admit`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct Gate {
    frozen: AtomicBool,
    in_flight: AtomicU32,
    lock: Mutex<()>,
    changed: Condvar,
}

/// A tracked call past the gate; dropping it leaves.
#[derive(Debug)]
pub struct Pass<'a>(&'a Gate);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl Gate {
    /// Enters, waiting while frozen. SeqCst on both sides: a caller that sees "not frozen" has
    /// already been counted, so a freezer that then sees zero in flight knows nobody is inside.
    pub fn enter(&self) -> Pass<'_> {
        loop {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            if !self.frozen.load(Ordering::SeqCst) {
                return Pass(self);
            }
            self.leave();
            let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            while self.frozen.load(Ordering::SeqCst) {
                guard = self.changed.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    fn leave(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 && self.frozen.load(Ordering::SeqCst)
        {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.changed.notify_all();
        }
    }

    /// Closes the gate without waiting: new tracked calls wait from now on.
    pub fn close(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Closes the gate and waits up to `timeout` for the calls inside to leave. On timeout the
    /// gate opens again (nothing changed) and the number still inside is returned as the error.
    pub fn freeze(&self, timeout: Duration) -> Result<(), u32> {
        self.close();
        let deadline = Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let inside = self.in_flight.load(Ordering::SeqCst);
            if inside == 0 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                drop(guard);
                self.thaw();
                return Err(inside);
            }
            guard = self
                .changed
                .wait_timeout(guard, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Opens the gate and wakes every waiting call.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.notify_all();
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }
}

/// The process's submission gate (one per process: the exports reach it without the runtime,
/// which starts only after `cuInit`).
pub fn submissions() -> &'static SubmissionGate {
    static GATE: SubmissionGate = SubmissionGate::new();
    &GATE
}

/// One application thread's place at the submission gate, on its own cache line so that passing
/// the gate never writes a line another thread reads on its own fast path.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot {
    /// A submission of this thread is past the gate and may not have reached the driver's queue.
    inside: AtomicBool,
    /// The thread that owned this slot has exited: the next new thread takes it.
    free: AtomicBool,
}

/// The calling thread's slot, taken at its first submission and given back when it exits.
#[derive(Debug)]
struct SlotLease {
    slot: &'static Slot,
    /// Submissions of this thread currently inside (a callback the driver runs on an application
    /// thread may submit again: only the outermost one marks the slot).
    depth: Cell<u32>,
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        self.slot.inside.store(false, Ordering::SeqCst);
        self.slot.free.store(true, Ordering::Release);
    }
}

thread_local! {
    static LEASE: SlotLease = SlotLease {
        slot: submissions().take_slot(),
        depth: Cell::new(0),
    };
}

/// What waits at the gate, under its lock.
#[derive(Debug, Default)]
struct Held {
    /// Application threads waiting at the closed gate now.
    waiting: u32,
    /// Admissions granted and not yet taken by a waiting thread.
    admits: u32,
    /// Admissions taken since the process started: a drain that saw this number unchanged across
    /// its context synchronisation knows nothing was submitted behind it.
    admitted: u64,
}

/// How the submission gate stands, for the drain and INSPECT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubmissionState {
    pub closed: bool,
    /// Threads whose submission is past the gate and not yet back from the driver.
    pub inside: u32,
    /// Threads waiting at the closed gate.
    pub waiting: u32,
    /// Admissions granted and not yet taken.
    pub admits: u32,
    /// Admissions taken since the process started.
    pub admitted: u64,
}

impl SubmissionState {
    /// Nothing is on its way into the driver: no thread inside, no admission pending.
    pub fn is_quiet(&self) -> bool {
        self.inside == 0 && self.admits == 0
    }
}

/// The gate on every submission of GPU work (module docs).
#[derive(Debug)]
pub struct SubmissionGate {
    closed: AtomicBool,
    /// The process that closed the gate: a child forked while it was closed passes (its driver
    /// calls fail on their own, as CUDA requires of a forked child).
    closer: AtomicU32,
    slots: Mutex<Vec<&'static Slot>>,
    held: Mutex<Held>,
    changed: Condvar,
}

/// A submission past the gate; dropping it leaves.
#[derive(Debug)]
#[must_use = "the submission leaves the gate when the pass drops"]
pub struct SubmissionPass {
    /// Whether this pass marked the thread's slot (the outermost submission of a thread that has
    /// one).
    marked: bool,
}

impl Drop for SubmissionPass {
    fn drop(&mut self) {
        if self.marked {
            // A thread being torn down has no slot to clear (its lease already cleared it).
            let _ = LEASE.try_with(|lease| {
                let depth = lease.depth.get().saturating_sub(1);
                lease.depth.set(depth);
                if depth == 0 {
                    lease.slot.inside.store(false, Ordering::SeqCst);
                }
            });
        }
    }
}

impl SubmissionGate {
    pub(crate) const fn new() -> SubmissionGate {
        SubmissionGate {
            closed: AtomicBool::new(false),
            closer: AtomicU32::new(0),
            slots: Mutex::new(Vec::new()),
            held: Mutex::new(Held {
                waiting: 0,
                admits: 0,
                admitted: 0,
            }),
            changed: Condvar::new(),
        }
    }

    /// Passes the process's gate ([`submissions`]; the slots are its): at once while it is
    /// open, else after the gate opens or the tool admits this submission. SeqCst on the slot
    /// store and the flag load, and on the closer's side: either this thread sees the gate closed,
    /// or the drain sees this thread inside (Dekker).
    pub fn enter() -> SubmissionPass {
        let gate = submissions();
        let entered = LEASE.try_with(|lease| {
            let depth = lease.depth.get();
            lease.depth.set(depth + 1);
            if depth > 0 {
                return;
            }
            lease.slot.inside.store(true, Ordering::SeqCst);
            if gate.closed.load(Ordering::SeqCst) {
                lease.slot.inside.store(false, Ordering::SeqCst);
                gate.wait_at_gate(lease.slot);
            }
        });
        // A thread past its thread-local destructors submits ungated: it can hold no place.
        SubmissionPass {
            marked: entered.is_ok(),
        }
    }

    /// The slow path: waits while closed, unless admitted; leaves with the slot marked inside,
    /// under the lock, so a drain that holds the lock never misses an admitted submission.
    #[cold]
    fn wait_at_gate(&self, slot: &Slot) {
        let mut held = self.lock_held();
        if self.closer.load(Ordering::SeqCst) != std::process::id() {
            slot.inside.store(true, Ordering::SeqCst);
            return;
        }
        held.waiting += 1;
        self.changed.notify_all();
        while self.closed.load(Ordering::SeqCst) {
            if held.admits > 0 {
                held.admits -= 1;
                held.admitted += 1;
                break;
            }
            held = self.changed.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.waiting -= 1;
        slot.inside.store(true, Ordering::SeqCst);
        self.changed.notify_all();
    }

    fn lock_held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_slot(&self) -> &'static Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for slot in slots.iter() {
            if slot
                .free
                .compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return slot;
            }
        }
        // One slot per thread that ever submitted at once; reused after the thread exits.
        let slot: &'static Slot = Box::leak(Box::default());
        slots.push(slot);
        slot
    }

    /// Closes the gate: submissions from now on wait (or are admitted).
    pub fn close(&self) {
        {
            let _held = self.lock_held();
            self.closer.store(std::process::id(), Ordering::SeqCst);
            self.closed.store(true, Ordering::SeqCst);
        }
        self.changed.notify_all();
    }

    /// Opens the gate and wakes every waiting submission; admissions not taken lapse.
    pub fn open(&self) {
        {
            let mut held = self.lock_held();
            held.admits = 0;
            self.closed.store(false, Ordering::SeqCst);
        }
        self.changed.notify_all();
    }

    /// Lets up to `count` waiting submissions through the closed gate; returns how many were
    /// granted (never more than wait now, so an admission cannot lapse onto a later call).
    pub fn admit(&self, count: u32) -> u32 {
        let granted = {
            let mut held = self.lock_held();
            if !self.closed.load(Ordering::SeqCst) {
                return 0;
            }
            let granted = count.min(held.waiting.saturating_sub(held.admits));
            held.admits += granted;
            granted
        };
        self.changed.notify_all();
        granted
    }

    /// How the gate stands. Reads the slots under the lock, so an admitted submission is seen
    /// either waiting, pending or inside.
    pub fn state(&self) -> SubmissionState {
        let held = self.lock_held();
        let inside = {
            let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots
                .iter()
                .filter(|slot| slot.inside.load(Ordering::SeqCst))
                .count()
        };
        SubmissionState {
            closed: self.closed.load(Ordering::SeqCst),
            inside: u32::try_from(inside).unwrap_or(u32::MAX),
            waiting: held.waiting,
            admits: held.admits,
            admitted: held.admitted,
        }
    }

    /// Waits up to `timeout` for the gate's state to change (a submission leaving or arriving);
    /// a poll interval for the drain, not a promise of change.
    pub fn wait_change(&self, timeout: Duration) {
        let held = self.lock_held();
        let _ = self.changed.wait_timeout(held, timeout);
    }
}

/// Submission entry points the resolvers handed out without the gate (an ABI the driver table
/// lacks): how many, and the first one's base name. Written lock- and allocation-free, since the
/// resolvers run it.
static UNGATED_COUNT: AtomicU32 = AtomicU32::new(0);
static UNGATED_CLAIMED: AtomicBool = AtomicBool::new(false);
static UNGATED_LEN: AtomicU32 = AtomicU32::new(0);
static UNGATED_FIRST: [AtomicU8; 64] = [const { AtomicU8::new(0) }; 64];

/// Records that a resolver handed out the submission entry `base` without the gate.
pub fn note_ungated(base: &[u8]) {
    UNGATED_COUNT.fetch_add(1, Ordering::SeqCst);
    if UNGATED_CLAIMED
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed)
        .is_ok()
    {
        let len = base.len().min(UNGATED_FIRST.len());
        for (cell, byte) in UNGATED_FIRST.iter().zip(base) {
            cell.store(*byte, Ordering::Relaxed);
        }
        UNGATED_LEN.store(u32::try_from(len).unwrap_or(0), Ordering::SeqCst);
    }
}

/// The submission entries handed out without the gate: how many, and the first one's name.
pub fn ungated() -> Option<(String, u32)> {
    let count = UNGATED_COUNT.load(Ordering::SeqCst);
    if count == 0 {
        return None;
    }
    let len = UNGATED_LEN.load(Ordering::SeqCst) as usize;
    let name: Vec<u8> = UNGATED_FIRST
        .iter()
        .take(len)
        .map(|cell| cell.load(Ordering::Relaxed))
        .collect();
    Some((String::from_utf8_lossy(&name).into_owned(), count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;

    #[test]
    fn freeze_waits_for_calls_inside_and_holds_new_ones() {
        let gate = Arc::new(Gate::default());
        let (entered_tx, entered_rx) = mpsc::channel();
        let (finish_tx, finish_rx) = mpsc::channel::<()>();
        let inside = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let _pass = gate.enter();
                entered_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
            })
        };
        entered_rx.recv().unwrap();
        assert_eq!(gate.in_flight(), 1);
        // The call inside does not leave: freeze times out and changes nothing.
        assert_eq!(gate.freeze(Duration::from_millis(50)), Err(1));
        assert!(!gate.is_frozen());
        finish_tx.send(()).unwrap();
        inside.join().unwrap();
        gate.freeze(Duration::from_secs(30)).unwrap();
        // A new call waits until thaw.
        let (done_tx, done_rx) = mpsc::channel();
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let _pass = gate.enter();
                done_tx.send(()).unwrap();
            })
        };
        assert!(done_rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert_eq!(gate.in_flight(), 0);
        gate.thaw();
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        waiter.join().unwrap();
    }

    #[test]
    fn the_closed_submission_gate_holds_threads_and_admits_them_one_at_a_time() {
        // The process's gate (its slots are thread-local); no other test of this binary enters
        // it, and runtimes in tests close gates of their own.
        let gate = submissions();
        gate.close();
        let (done_tx, done_rx) = mpsc::channel();
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let done_tx = done_tx.clone();
                std::thread::spawn(move || {
                    let pass = SubmissionGate::enter();
                    done_tx.send(i).unwrap();
                    drop(pass);
                })
            })
            .collect();
        while gate.state().waiting < 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(done_rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert_eq!(gate.admit(1), 1);
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(done_rx.recv_timeout(Duration::from_millis(100)).is_err());
        let state = gate.state();
        assert_eq!((state.waiting, state.admitted, state.admits), (1, 1, 0));
        // Never more admissions than waiters: none can lapse onto a later call.
        assert_eq!(gate.admit(5), 1);
        done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        for t in threads {
            t.join().unwrap();
        }
        assert!(gate.state().is_quiet());
        assert_eq!(gate.admit(1), 0);
        gate.open();
        // Open: a submission passes at once, and is seen inside while it is.
        let pass = SubmissionGate::enter();
        assert_eq!(gate.state().inside, 1);
        drop(pass);
        assert_eq!(gate.state().inside, 0);
    }
}
