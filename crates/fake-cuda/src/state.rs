//! The driver's process-wide state, one mutex around all of it (a fake needs no finer locking).
//! Entry points take it for the whole of their work, so a copy never races an unmap.

use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_abi::CUresult;

use crate::Res;
use crate::accounting::{Publisher, Usage};
use crate::config::Config;
use crate::device::{Contexts, Device};
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

fn guard() -> MutexGuard<'static, Option<Driver>> {
    DRIVER.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn install(driver: Driver) {
    *guard() = Some(driver);
}

pub(crate) fn uninstall() {
    *guard() = None;
}

/// Runs `f` on the driver state (`CUDA_ERROR_NOT_INITIALIZED` before `cuInit`).
pub(crate) fn with<R>(f: impl FnOnce(&mut Driver) -> Res<R>) -> Res<R> {
    match guard().as_mut() {
        Some(driver) => f(driver),
        None => Err(CUresult::ERROR_NOT_INITIALIZED),
    }
}
