//! The driver's process-wide state, one mutex around all of it (a fake needs no finer locking).
//! Entry points take it for the whole of their work, so a copy never races an unmap; stream
//! workers take it while they touch memory, for the same reason. Whoever waits (a synchronize,
//! a worker waiting for a kernel's flag or its sleep to end) waits on [`CHANGED`], which releases
//! the mutex: nobody waits or spins while holding it.

use std::ffi::c_int;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cuda_abi::CUresult;

use crate::Res;
use crate::accounting::{Publisher, Usage};
use crate::config::Config;
use crate::device::{Contexts, Device};
use crate::exec::Exec;
use crate::memory::Memory;

#[derive(Debug)]
pub(crate) struct Driver {
    pub config: Config,
    pub pid: i32,
    pub start_token: u64,
    pub devices: Vec<Device>,
    pub contexts: Contexts,
    pub mem: Memory,
    pub usage: Usage,
    /// Stream queues, events and modules.
    pub exec: Exec,
    next_id: u64,
}

impl Driver {
    pub(crate) fn new(config: Config, pid: i32, start_token: u64, publisher: Publisher) -> Driver {
        let devices = (0..config.devices)
            .map(|ordinal| Device::new(ordinal, config.device_memory))
            .collect::<Vec<_>>();
        let contexts = Contexts::new(devices.len());
        let usage = Usage::new(publisher, devices.len());
        Driver {
            config,
            pid,
            start_token,
            devices,
            contexts,
            mem: Memory::default(),
            usage,
            exec: Exec::default(),
            next_id: 1,
        }
    }

    /// A fresh identifier, never reused in this process.
    pub(crate) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The process's ordinal `dev` if it names a device (`CUDA_ERROR_INVALID_DEVICE` if not).
    pub(crate) fn ordinal(&self, dev: i32) -> Res<usize> {
        usize::try_from(dev)
            .ok()
            .filter(|&d| d < self.devices.len())
            .ok_or(CUresult::ERROR_INVALID_DEVICE)
    }

    /// The machine device (index into `devices`) that the process's ordinal `dev` names.
    pub(crate) fn device(&self, dev: i32) -> Res<usize> {
        let ordinal = self.ordinal(dev)?;
        self.contexts
            .device_of(ordinal)
            .filter(|&d| d < self.devices.len())
            .ok_or(CUresult::ERROR_INVALID_DEVICE)
    }

    /// The process's ordinal of machine device `device`, for values handed to the application.
    pub(crate) fn ordinal_of(&self, device: usize) -> c_int {
        self.contexts.ordinal_of(device) as c_int
    }
}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);
/// Signalled whenever queued work completes, is queued or is discarded, or the state that a
/// waiter may be waiting for changes otherwise.
static CHANGED: Condvar = Condvar::new();

pub(crate) type Guard = MutexGuard<'static, Option<Driver>>;

fn guard() -> Guard {
    DRIVER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The driver state, locked (for stream workers, which hold it across steps).
pub(crate) fn lock() -> Guard {
    guard()
}

/// Releases the lock until [`notify`] or `timeout` (`None`: no limit), then takes it again.
pub(crate) fn wait(g: Guard, timeout: Option<Duration>) -> Guard {
    match timeout {
        None => CHANGED.wait(g).unwrap_or_else(PoisonError::into_inner),
        Some(t) => {
            CHANGED
                .wait_timeout(g, t)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        }
    }
}

/// Wakes every waiter (they re-check their condition).
pub(crate) fn notify() {
    CHANGED.notify_all();
}

/// Runs `f` on the driver state until it gives an answer; between tries the lock is released
/// until something changes, for at most `poll` (`None`: until notified). `f` is told whether
/// `deadline` has passed; past it, a `None` from `f` is `CUDA_ERROR_TIMEOUT`.
pub(crate) fn wait_until<R>(
    deadline: Option<Instant>,
    poll: Option<Duration>,
    mut f: impl FnMut(&mut Driver, bool) -> Option<Res<R>>,
) -> Res<R> {
    let mut g = guard();
    loop {
        let Some(driver) = g.as_mut() else {
            return Err(CUresult::ERROR_NOT_INITIALIZED);
        };
        let now = Instant::now();
        let expired = deadline.is_some_and(|t| now >= t);
        if let Some(result) = f(driver, expired) {
            return result;
        }
        if expired {
            return Err(CUresult::ERROR_TIMEOUT);
        }
        let left = deadline.map(|t| t - now);
        let timeout = match (left, poll) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        g = wait(g, timeout);
    }
}

pub(crate) fn install(driver: Driver) {
    *guard() = Some(driver);
}

pub(crate) fn uninstall() {
    *guard() = None;
}

/// Runs `f` on the driver state (`CUDA_ERROR_NOT_INITIALIZED` before `cuInit`; the sticky
/// fault once queued work faulted: checked again under the lock, since a worker may poison the
/// process after the entry prologue looked).
pub(crate) fn with<R>(f: impl FnOnce(&mut Driver) -> Res<R>) -> Res<R> {
    match guard().as_mut() {
        Some(_) if crate::exec::poisoned() => Err(crate::exec::FAULT),
        Some(driver) => f(driver),
        None => Err(CUresult::ERROR_NOT_INITIALIZED),
    }
}
