//! Host carriers and the copy engine that fills and drains them.
//!
//! The carrier is ordinary anonymous memory (CRIU and native checkpoint see it as process memory),
//! mapped once and reused across cycles: it grows when a capture needs more, and after Thaw its
//! pages are given back lazily (`MADV_FREE`: kept unless the host needs them, so a next capture
//! usually finds them resident). Transparent huge pages are requested to cut first-touch faults.
//! First touch runs on several threads and is timed apart from the copies.
//!
//! Copies go through small pinned staging buffers: device → pinned (`cuMemcpyDtoHAsync`) →
//! carrier (`memcpy`), and back. Each worker thread owns two streams and two staging buffers and
//! double-buffers: while the DMA of chunk i runs, the CPU moves chunk i-1. Work is cut into
//! segments so that several workers share one large allocation; each device gets its own workers
//! with its primary context current.
//!
//! DMA safety: if a stream cannot be synchronised, a copy may still be in flight into the staging
//! buffer or out of the carrier, so neither is freed or reused: the staging buffer is leaked and
//! the carrier is marked poisoned (never unmapped) and the phase fails.

#![allow(unsafe_code)] // raw carrier memory and driver calls; each block says why it is sound

use crate::Real;
use cuda_abi::{CUcontext, CUresult, CUstream};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Staging buffer size (each worker has two).
pub const CHUNK: usize = 8 << 20;
/// Work unit size: large allocations are split into segments of this size across workers.
pub const SEGMENT: usize = 64 << 20;
const PAGE: usize = 4096;
/// `CU_STREAM_NON_BLOCKING`: our streams never wait for the application's legacy stream.
const STREAM_NON_BLOCKING: u32 = 1;

/// Why copying failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{call} failed on device {device}: {result}")]
    Driver {
        call: &'static str,
        device: i32,
        result: CUresult,
    },
    #[error("cannot map {len} bytes of host carrier: {source}")]
    Carrier {
        len: usize,
        source: rustix::io::Errno,
    },
    #[error("cannot start a copy thread: {0}")]
    Spawn(std::io::Error),
}

/// The host carrier of a process.
#[derive(Debug, Default)]
pub struct Carrier {
    base: usize,
    len: usize,
    /// A copy could not be confirmed finished: never unmap or shrink.
    poisoned: bool,
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to).saturating_mul(to)
}

impl Carrier {
    /// Makes room for `len` bytes and touches every page with `threads` threads. Returns the time
    /// spent (allocation plus first touch).
    pub fn ensure(&mut self, len: usize, threads: usize) -> Result<Duration, CopyError> {
        let start = Instant::now();
        if len == 0 {
            return Ok(Duration::ZERO);
        }
        if self.len < len {
            let want = round_up(len, 2 << 20);
            // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
            let ptr = unsafe {
                rustix::mm::mmap_anonymous(
                    std::ptr::null_mut(),
                    want,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
                )
            }
            .map_err(|source| CopyError::Carrier { len: want, source })?;
            // SAFETY: advice on the mapping just made; failure only means no huge pages.
            let _ = unsafe { rustix::mm::madvise(ptr, want, rustix::mm::Advice::LinuxHugepage) };
            if self.len > 0 && !self.poisoned {
                // SAFETY: the old carrier, which nothing references between phases.
                let _ = unsafe { rustix::mm::munmap(self.base as *mut _, self.len) };
            }
            self.base = ptr as usize;
            self.len = want;
        }
        touch(self.base, len, threads);
        Ok(start.elapsed())
    }

    pub fn base(&self) -> usize {
        self.base
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    pub fn poison(&mut self) {
        self.poisoned = true;
    }

    /// Lets the kernel take the pages back when it needs them (contents are not needed any more).
    pub fn discard(&self) {
        if self.len > 0 && !self.poisoned {
            // SAFETY: our own mapping; MADV_FREE keeps it mapped, only its contents may go.
            let _ = unsafe {
                rustix::mm::madvise(self.base as *mut _, self.len, rustix::mm::Advice::LinuxFree)
            };
        }
    }
}

/// Writes one byte per page of `[base, base + len)` from `threads` threads, in parallel.
fn touch(base: usize, len: usize, threads: usize) {
    let threads = threads.clamp(1, 16);
    let per = round_up(len.div_ceil(threads), PAGE);
    std::thread::scope(|s| {
        for t in 0..threads {
            let from = t.saturating_mul(per);
            let to = from.saturating_add(per).min(len);
            if from >= to {
                continue;
            }
            s.spawn(move || {
                let mut at = from;
                while at < to {
                    // SAFETY: inside the carrier mapping; its contents are about to be overwritten,
                    // and no other thread touches this range.
                    unsafe { std::ptr::write_volatile((base + at) as *mut u8, 0) };
                    at += PAGE;
                }
            });
        }
    });
}

/// Which way bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Device → carrier (Save).
    ToHost,
    /// Carrier → device (Load).
    ToDevice,
}

/// One segment to copy: `len` bytes between device address `dev` (a shim-owned mapping) and host
/// address `host` (inside the carrier).
#[derive(Clone, Copy, Debug)]
pub struct Unit {
    pub device: i32,
    pub dev: u64,
    pub host: usize,
    pub len: usize,
}

/// Splits a `len`-byte region into units of at most [`SEGMENT`] bytes.
pub fn segments(device: i32, dev: u64, host: usize, len: usize) -> Vec<Unit> {
    let mut out = Vec::with_capacity(len.div_ceil(SEGMENT));
    let mut off = 0;
    while off < len {
        let n = SEGMENT.min(len - off);
        out.push(Unit {
            device,
            dev: dev + off as u64,
            host: host + off,
            len: n,
        });
        off += n;
    }
    out
}

/// What the copy engine measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyStats {
    pub bytes: u64,
    /// Longest time a worker spent allocating its pinned staging.
    pub staging: Duration,
    /// Wall time of the whole copy (staging allocation included).
    pub wall: Duration,
    pub threads: usize,
    /// A stream could not be synchronised: DMA may still touch the carrier.
    pub dma_uncertain: bool,
}

/// A primary context retained and made current on this thread, released on drop.
#[derive(Debug)]
pub struct DeviceContext<'a> {
    real: &'a Real,
    device: i32,
}

impl<'a> DeviceContext<'a> {
    pub fn enter(real: &'a Real, device: i32) -> Result<DeviceContext<'a>, CopyError> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device ordinal is checked by the driver.
        let r = unsafe { (real.cuDevicePrimaryCtxRetain)(&mut ctx, device) };
        if !r.is_success() {
            return Err(CopyError::Driver {
                call: "cuDevicePrimaryCtxRetain",
                device,
                result: r,
            });
        }
        // SAFETY: the context just retained.
        let r = unsafe { (real.cuCtxSetCurrent)(ctx) };
        if !r.is_success() {
            // SAFETY: undoes the retain above.
            unsafe { (real.cuDevicePrimaryCtxRelease_v2)(device) };
            return Err(CopyError::Driver {
                call: "cuCtxSetCurrent",
                device,
                result: r,
            });
        }
        Ok(DeviceContext { real, device })
    }
}

impl Drop for DeviceContext<'_> {
    fn drop(&mut self) {
        // SAFETY: leaves no context current on this (shim-owned) thread.
        unsafe { (self.real.cuCtxSetCurrent)(std::ptr::null_mut()) };
        // SAFETY: drops the retain `enter` made.
        unsafe { (self.real.cuDevicePrimaryCtxRelease_v2)(self.device) };
    }
}

/// A worker's streams and staging buffers.
struct Lane<'a> {
    real: &'a Real,
    device: i32,
    streams: [CUstream; 2],
    buffers: [*mut u8; 2],
    /// Set when a synchronisation failed: the buffers must not be freed.
    uncertain: bool,
}

impl<'a> Lane<'a> {
    fn new(real: &'a Real, device: i32) -> Result<Lane<'a>, CopyError> {
        let err = |call, result| CopyError::Driver {
            call,
            device,
            result,
        };
        let mut lane = Lane {
            real,
            device,
            streams: [std::ptr::null_mut(); 2],
            buffers: [std::ptr::null_mut(); 2],
            uncertain: false,
        };
        for s in &mut lane.streams {
            // SAFETY: valid out-pointer; a context is current on this thread.
            let r = unsafe { (real.cuStreamCreate)(s, STREAM_NON_BLOCKING) };
            if !r.is_success() {
                return Err(err("cuStreamCreate", r));
            }
        }
        for b in &mut lane.buffers {
            let mut p: *mut core::ffi::c_void = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let r = unsafe { (real.cuMemHostAlloc)(&mut p, CHUNK, 0) };
            if !r.is_success() || p.is_null() {
                return Err(err("cuMemHostAlloc", r));
            }
            *b = p.cast();
        }
        Ok(lane)
    }

    fn sync(&mut self, b: usize) -> Result<(), CopyError> {
        let stream = self.streams.get(b).copied().unwrap_or(std::ptr::null_mut());
        // SAFETY: a stream of ours.
        let r = unsafe { (self.real.cuStreamSynchronize)(stream) };
        if r.is_success() {
            Ok(())
        } else {
            self.uncertain = true;
            Err(CopyError::Driver {
                call: "cuStreamSynchronize",
                device: self.device,
                result: r,
            })
        }
    }

    fn run(&mut self, unit: Unit, dir: Direction) -> Result<(), CopyError> {
        let mut pending: [Option<(usize, usize)>; 2] = [None, None];
        let mut order = VecDeque::with_capacity(2);
        let mut off = 0;
        let mut i = 0usize;
        while off < unit.len {
            let b = i % 2;
            let n = CHUNK.min(unit.len - off);
            if let Some((host, len)) = pending.get_mut(b).and_then(Option::take) {
                self.sync(b)?;
                order.retain(|x| *x != b);
                if dir == Direction::ToHost {
                    self.drain(b, host, len);
                }
            }
            let buf = self.buffers.get(b).copied().unwrap_or(std::ptr::null_mut());
            let stream = self.streams.get(b).copied().unwrap_or(std::ptr::null_mut());
            let dev = unit.dev + off as u64;
            let host = unit.host + off;
            let r = match dir {
                // SAFETY: `buf` is a staging buffer of CHUNK bytes, `dev` a mapped range.
                Direction::ToHost => unsafe {
                    (self.real.cuMemcpyDtoHAsync_v2)(buf.cast(), dev, n, stream)
                },
                Direction::ToDevice => {
                    // SAFETY: `host..host+n` is inside the carrier; `buf` has CHUNK bytes and no
                    // copy is pending on it (synchronised above).
                    unsafe { std::ptr::copy_nonoverlapping(host as *const u8, buf, n) };
                    // SAFETY: as above.
                    unsafe { (self.real.cuMemcpyHtoDAsync_v2)(dev, buf.cast(), n, stream) }
                }
            };
            if !r.is_success() {
                self.uncertain = true;
                return Err(CopyError::Driver {
                    call: match dir {
                        Direction::ToHost => "cuMemcpyDtoHAsync",
                        Direction::ToDevice => "cuMemcpyHtoDAsync",
                    },
                    device: self.device,
                    result: r,
                });
            }
            if let Some(slot) = pending.get_mut(b) {
                *slot = Some((host, n));
            }
            order.push_back(b);
            off += n;
            i += 1;
        }
        while let Some(b) = order.pop_front() {
            if let Some((host, len)) = pending.get_mut(b).and_then(Option::take) {
                self.sync(b)?;
                if dir == Direction::ToHost {
                    self.drain(b, host, len);
                }
            }
        }
        Ok(())
    }

    fn drain(&self, b: usize, host: usize, len: usize) {
        let buf = self.buffers.get(b).copied().unwrap_or(std::ptr::null_mut());
        // SAFETY: the copy into `buf` is synchronised; `host..host+len` is this unit's part of
        // the carrier, written by no other thread.
        unsafe { std::ptr::copy_nonoverlapping(buf, host as *mut u8, len) };
    }
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        if self.uncertain {
            crate::log::log_error!(
                "a copy on device {} could not be confirmed finished; its staging is kept",
                self.device
            );
            return;
        }
        for b in self.buffers {
            if !b.is_null() {
                // SAFETY: our staging buffer; every copy on it is synchronised.
                unsafe { (self.real.cuMemFreeHost)(b.cast()) };
            }
        }
        for s in self.streams {
            if !s.is_null() {
                // SAFETY: our stream, idle.
                unsafe { (self.real.cuStreamDestroy_v2)(s) };
            }
        }
    }
}

/// How many workers per device.
pub fn workers_per_device(devices: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cores.min(16) / devices.max(1)).clamp(1, 8)
}

/// Copies every unit, in parallel across devices and segments. The stats come back also on
/// failure: `dma_uncertain` tells the caller not to free what a copy may still touch.
pub fn copy_all(real: &Real, units: Vec<Unit>, dir: Direction) -> (CopyStats, Option<CopyError>) {
    let start = Instant::now();
    let bytes: u64 = units.iter().map(|u| u.len as u64).sum();
    let mut by_device: Vec<(i32, Mutex<VecDeque<Unit>>)> = Vec::new();
    for u in units {
        match by_device.iter().position(|(d, _)| *d == u.device) {
            Some(i) => {
                if let Some((_, q)) = by_device.get(i) {
                    q.lock().unwrap_or_else(|e| e.into_inner()).push_back(u);
                }
            }
            None => by_device.push((u.device, Mutex::new(VecDeque::from([u])))),
        }
    }
    let per = workers_per_device(by_device.len());
    let failed = AtomicBool::new(false);
    let staging = Mutex::new(Duration::ZERO);
    let uncertain = AtomicBool::new(false);
    let mut threads = 0;
    let first_error: Mutex<Option<CopyError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for (device, queue) in &by_device {
            let n = per.min(queue.lock().unwrap_or_else(|e| e.into_inner()).len());
            for _ in 0..n {
                threads += 1;
                let (failed, staging, uncertain, first_error) =
                    (&failed, &staging, &uncertain, &first_error);
                let work = move || {
                    let result = (|| {
                        let _ctx = DeviceContext::enter(real, *device)?;
                        let t = Instant::now();
                        let mut lane = Lane::new(real, *device)?;
                        {
                            let mut st = staging.lock().unwrap_or_else(|e| e.into_inner());
                            *st = (*st).max(t.elapsed());
                        }
                        let result = (|| {
                            while !failed.load(Ordering::Relaxed) {
                                let unit =
                                    queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                                let Some(unit) = unit else { break };
                                lane.run(unit, dir)?;
                            }
                            Ok(())
                        })();
                        if lane.uncertain {
                            uncertain.store(true, Ordering::Relaxed);
                        }
                        result
                    })();
                    if let Err(e) = result {
                        failed.store(true, Ordering::Relaxed);
                        first_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(e);
                    }
                };
                if let Err(e) = std::thread::Builder::new()
                    .name("cuinterpose-copy".into())
                    .spawn_scoped(s, work)
                {
                    failed.store(true, Ordering::Relaxed);
                    first_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(CopyError::Spawn(e));
                }
            }
        }
    });
    let stats = CopyStats {
        bytes,
        staging: *staging.lock().unwrap_or_else(|e| e.into_inner()),
        wall: start.elapsed(),
        threads,
        dma_uncertain: uncertain.load(Ordering::Relaxed),
    };
    (
        stats,
        first_error.into_inner().unwrap_or_else(|e| e.into_inner()),
    )
}
