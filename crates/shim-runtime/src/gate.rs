//! The gate that Freeze closes: tracked memory calls wait at it until Thaw, and the calls already
//! past it are counted so that Freeze can wait for them to drain (and INSPECT can report them).
//! Untracked driver calls never meet it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
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

    /// Closes the gate and waits up to `timeout` for the calls inside to leave. On timeout the
    /// gate opens again (nothing changed) and the number still inside is returned as the error.
    pub fn freeze(&self, timeout: Duration) -> Result<(), u32> {
        self.frozen.store(true, Ordering::SeqCst);
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
}
