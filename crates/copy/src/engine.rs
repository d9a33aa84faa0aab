//! Host carriers and the copy engine that fills and drains them.
//!
//! The carrier is ordinary anonymous memory (CRIU and native checkpoint see it as process memory),
//! mapped once and reused across cycles: it grows when a capture needs more, and after Thaw its
//! pages are given back lazily unless it is pinned (`MADV_FREE`: kept unless the host needs them,
//! so a next capture usually finds them resident). Transparent huge pages are requested to cut first-touch faults.
//! First touch runs on one thread per core (up to 16) and is timed apart from the copies: on the
//! GPU machine's VM, first touch of fresh memory costs more than the copy itself.
//!
//! Three ways between device and carrier ([`CarrierMode`]), chosen per cycle by
//! `CUINTERPOSE_CARRIER` ([`CarrierPolicy`], read once when the runtime starts):
//! - `registered`: each worker registers one segment of the carrier
//!   (`cuMemHostRegister`), copies it with one asynchronous copy straight to or from the device,
//!   synchronises and unregisters it. No CPU copy, so the rate is the link's; the pinning of one
//!   worker overlaps the transfers of the others. Every segment is unregistered before the phase
//!   answers, so native checkpoint never meets registered carrier memory. A segment whose
//!   registration fails is copied staged instead (counted in the statistics).
//! - `pinned`: the carrier itself is registered once, in [`PIN_PIECE`] pieces, when Save first
//!   needs it or needs it bigger ([`Carrier::ensure_pinned`]), and kept registered across cycles
//!   and native checkpoint (measured to survive it); each worker DMAs one 64 MiB unit straight to
//!   or from it. When the driver refuses a registration the carrier is unregistered and the process
//!   copies staged from then on (logged once). `CUINTERPOSE_CARRIER_RELEASE` ([`CarrierRelease`])
//!   says whether Thaw gives it back.
//! - `staged`: device → small pinned staging buffer (`cuMemcpyDtoHAsync`) → carrier (`memcpy`),
//!   and back. Each worker owns two streams and two staging buffers and double-buffers: while the
//!   DMA of chunk i runs, the CPU moves chunk i-1. The CPU copy caps each worker's rate (about
//!   10 GB/s), so several workers are needed to fill the link.
//!
//!   The staging buffers are small (1 MiB, `CUINTERPOSE_STAGING_CHUNK`) so that a worker's pair
//!   stays in the CPU caches while the DMA and the CPU copy pass through it: on the H200 host,
//!   1 MiB moved 35.0 / 34.5 GB/s (save / load) where 8 MiB moved 28.9 / 29.5 GB/s (2026-12-03,
//!   8 GiB over two processes). Streaming (non-temporal) stores into the carrier were measured
//!   too and gained nothing (30.3 / 27.7 GB/s at 8 MiB, 28.5 / 34.1 at 1 MiB), so they are not
//!   used.
//!
//! - `auto` (default): staged while every Save is followed by a native checkpoint, pinned from
//!   the first Save that is not (`suspend --keep-contexts`) on. The driver re-pins a kept
//!   registration at native restore, which costs about what the faster copies save, so a
//!   process only ever suspended with its native checkpoint copies staged (35 GB/s on the H200);
//!   a keep-contexts cycle skips the native pair and moves its bytes at the link's rate (49 against
//!   33 GB/s end to end for 16 GiB, 2026-12-03). Once pinned the carrier stays pinned (under
//!   `CUINTERPOSE_CARRIER_RELEASE=never`) and later cycles of either kind use it.
//!
//! Work is cut into segments so that several workers share one large allocation; each device gets
//! its own workers with its primary context current.
//!
//! DMA safety: if a stream cannot be synchronised, a copy may still be in flight into the staging
//! buffer or the carrier, so neither is freed, unregistered or reused: the staging buffer is
//! leaked, a registered segment stays registered, the carrier is marked poisoned (never unmapped)
//! and the phase fails.

//!
//! This is the one module of the crate that allows unsafe code: the carrier and the staging
//! buffers are raw host memory that the DMA engine reads and writes while a copy is in flight, so
//! neither Rust's borrows nor the safe driver methods (which take slices for synchronous copies)
//! can describe them; each block says why it is sound.

#![allow(unsafe_code)]

use crate::log::log_warn;
use cuda::DriverTable as Real;
use cuda::owned::{PinnedBuffer, Stream};
use cuda_abi::{CUresult, CUstream};
pub use protocol::message::CarrierMode;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Default size of each of a worker's two staging buffers (one DMA each); see the module docs.
pub const DEFAULT_CHUNK: usize = 1 << 20;

/// How copies reach the carrier (the shim runtime's `ShimConfig` reads it from the environment
/// once, when the runtime starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyConfig {
    /// Which carrier mode each cycle uses.
    pub carrier: CarrierPolicy,
    /// Staging buffer size (staged mode, and the fallbacks of the other two).
    pub chunk: usize,
    /// When a pinned carrier is given back (`CUINTERPOSE_CARRIER_RELEASE`).
    pub release: CarrierRelease,
}

impl Default for CopyConfig {
    fn default() -> CopyConfig {
        CopyConfig {
            carrier: CarrierPolicy::default(),
            chunk: DEFAULT_CHUNK,
            release: CarrierRelease::default(),
        }
    }
}

/// Which [`CarrierMode`] a cycle copies with (`CUINTERPOSE_CARRIER`; see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CarrierPolicy {
    /// Staged until a Save that no native checkpoint follows, pinned from then on.
    #[default]
    Auto,
    /// The same mode in every cycle.
    Always(CarrierMode),
}

impl CarrierPolicy {
    /// Whether a Save pins the carrier: `native_follows` says a native checkpoint (and so a
    /// re-pin at its restore) comes after it, `pinned` that the carrier is pinned already.
    pub fn pins(self, native_follows: bool, pinned: bool) -> bool {
        match self {
            CarrierPolicy::Auto => !native_follows || pinned,
            CarrierPolicy::Always(mode) => mode == CarrierMode::Pinned,
        }
    }

    /// The mode a copy of `needed` carrier bytes runs in, with `pinned` bytes of the carrier
    /// registered: pinned wherever the whole range is (a refused pinning copies staged).
    pub fn mode(self, needed: usize, pinned: usize) -> CarrierMode {
        match self {
            CarrierPolicy::Always(CarrierMode::Registered) => CarrierMode::Registered,
            CarrierPolicy::Always(CarrierMode::Staged) => CarrierMode::Staged,
            CarrierPolicy::Auto | CarrierPolicy::Always(CarrierMode::Pinned)
                if pinned >= needed =>
            {
                CarrierMode::Pinned
            }
            CarrierPolicy::Auto | CarrierPolicy::Always(CarrierMode::Pinned) => CarrierMode::Staged,
        }
    }
}

/// When a pinned carrier's registration and pages are given back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CarrierRelease {
    /// Kept pinned for the life of the process: every later cycle copies at once, with no
    /// registration (the reason to choose pinned carriers; a process suspended once pays for it
    /// in pinned host memory the size of its shared allocations).
    #[default]
    Never,
    /// Unregistered and its pages offered back (`MADV_FREE`) when the group is thawed: the next
    /// cycle registers again.
    AfterResume,
}

/// Work unit size: large allocations are split into segments of this size across workers.
pub const SEGMENT: usize = 64 << 20;
const PAGE: usize = 4096;
/// `CU_MEMHOSTREGISTER_PORTABLE`: registered memory counts as pinned in every context.
const HOST_REGISTER_PORTABLE: u32 = 1;
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

/// Size of each `cuMemHostRegister` of a pinned carrier: one long registration blocks the
/// process's other CUDA calls (a 94 GB call stalled a vLLM process 11.6 s, 1 GB pieces 2.0 s), so
/// the carrier is pinned piece by piece.
pub const PIN_PIECE: usize = 256 << 20;
const _: () = assert!(
    PIN_PIECE.is_multiple_of(SEGMENT),
    "units must not cross pinned pieces"
);

/// The host carrier of a process.
#[derive(Debug, Default)]
pub struct Carrier {
    base: usize,
    len: usize,
    /// Bytes from `base` registered with the driver, in [`PIN_PIECE`] pieces (pinned mode).
    pinned: usize,
    /// A registration was refused once: pinned mode copies staged from then on (logged once).
    pin_refused: bool,
    /// Size of each registered piece (every piece but the last).
    piece: usize,
    /// The device whose primary context registered the pieces (and unregisters them).
    pin_device: i32,
    /// A copy could not be confirmed finished: never unmap or shrink.
    poisoned: bool,
    /// The carrier is a memfd mapped shared (the carrier helper's, [`Carrier::shareable`]): its
    /// descriptor, which the owning process also holds so that the pages outlive the helper.
    memfd: Option<OwnedFd>,
    /// Made as a memfd rather than anonymous memory.
    shareable: bool,
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to).saturating_mul(to)
}

impl Carrier {
    /// Makes room for `len` bytes and touches every page in parallel. Returns the time spent
    /// (allocation plus first touch) and whether the existing carrier was big enough.
    pub fn ensure(&mut self, len: usize) -> Result<(Duration, bool), CopyError> {
        let start = Instant::now();
        if len == 0 {
            return Ok((Duration::ZERO, false));
        }
        let reused = self.len >= len;
        if !reused {
            let want = round_up(len, 2 << 20);
            let (ptr, memfd) = if self.shareable {
                let (ptr, fd) = map_memfd(want)?;
                (ptr, Some(fd))
            } else {
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
                (ptr, None)
            };
            // SAFETY: advice on the mapping just made; failure only means no huge pages.
            let _ = unsafe { rustix::mm::madvise(ptr, want, rustix::mm::Advice::LinuxHugepage) };
            if self.len > 0 && !self.poisoned {
                // SAFETY: the old carrier, which nothing references between phases.
                let _ = unsafe { rustix::mm::munmap(self.base as *mut _, self.len) };
            }
            // A poisoned old carrier stays mapped, and its mapping keeps its pages: only the
            // descriptor goes (holders elsewhere keep theirs).
            self.memfd = memfd;
            self.base = ptr as usize;
            self.len = want;
        }
        touch(self.base, len, touch_threads());
        Ok((start.elapsed(), reused))
    }

    /// Pinned mode: makes room for `len` bytes as [`Carrier::ensure`] does and keeps
    /// `[base, base + len)` registered in pieces of `piece` bytes ([`PIN_PIECE`] outside tests),
    /// registering only the pieces not registered yet (a carrier
    /// of an earlier cycle costs nothing). A carrier that must grow is unregistered and unmapped
    /// first. Returns the time spent (mapping, touch and registration), whether the carrier was
    /// reused as it was (big enough and pinned already: nothing was made or registered), and
    /// whether it is pinned; `false` when the driver refused a registration
    /// (`RLIMIT_MEMLOCK`, no memory): the caller copies staged, and later cycles do not retry.
    pub fn ensure_pinned(
        &mut self,
        real: &Real,
        len: usize,
        piece: usize,
        device: i32,
    ) -> Result<(Duration, bool, bool), CopyError> {
        let start = Instant::now();
        if len > self.len && self.pinned > 0 {
            self.unpin(real)?;
        }
        let (_, reused) = self.ensure(len)?;
        if self.pin_refused {
            return Ok((start.elapsed(), reused, false));
        }
        let want = round_up(len, PAGE).min(self.len);
        let piece = round_up(piece.max(PAGE), PAGE);
        if self.pinned >= want {
            return Ok((start.elapsed(), reused, true));
        }
        // The driver registers host memory for a context: one must be current on this thread.
        let _ctx = enter(real, device)?;
        self.pin_device = device;
        // Registered now: not the carrier of an earlier cycle as it was.
        let reused = false;
        while self.pinned < want {
            let n = piece.min(self.len - self.pinned);
            let at = (self.base + self.pinned) as *mut core::ffi::c_void;
            // SAFETY: `at..at+n` lies inside the carrier mapping, which stays mapped while any
            // piece is registered (grown only after `unpin`); pieces never overlap. Portable:
            // pinned for every context, so the workers of every device DMA into it directly.
            let r = unsafe { (real.cuMemHostRegister_v2)(at, n, HOST_REGISTER_PORTABLE) };
            if !r.is_success() {
                log_warn!(
                    "cuMemHostRegister of {n} bytes of the carrier failed: {r}; copying staged \
                     from now on"
                );
                self.pin_refused = true;
                // The pieces already registered stay usable only with all of them: let them go.
                self.unpin(real)?;
                return Ok((start.elapsed(), reused, false));
            }
            self.pinned += n;
            self.piece = piece;
        }
        Ok((start.elapsed(), reused, true))
    }

    /// Unregisters every registered piece (no copy may be running into the carrier).
    pub fn unpin(&mut self, real: &Real) -> Result<(), CopyError> {
        if self.poisoned {
            // A copy may still reach it: it stays registered and mapped.
            return Ok(());
        }
        if self.pinned == 0 {
            return Ok(());
        }
        let _ctx = enter(real, self.pin_device)?;
        let mut at = 0;
        while at < self.pinned {
            let n = self.piece.min(self.pinned - at);
            // SAFETY: a piece registered by `ensure_pinned`, with no copy pending on it.
            let r = unsafe { (real.cuMemHostUnregister)((self.base + at) as *mut _) };
            if !r.is_success() {
                // Some pieces are still registered: the mapping must never go away.
                self.poisoned = true;
                return Err(CopyError::Driver {
                    call: "cuMemHostUnregister",
                    device: self.pin_device,
                    result: r,
                });
            }
            at += n;
        }
        self.pinned = 0;
        Ok(())
    }

    /// Gives the whole carrier back: unregistered and unmapped (no copy may be running into it).
    /// A poisoned carrier stays mapped (a copy may still reach it).
    pub fn free(&mut self, real: &Real) -> Result<(), CopyError> {
        self.unpin(real)?;
        if self.poisoned || self.len == 0 {
            return Ok(());
        }
        // SAFETY: our own mapping, nothing registered in it any more and no copy running.
        let _ = unsafe { rustix::mm::munmap(self.base as *mut _, self.len) };
        self.base = 0;
        self.len = 0;
        self.memfd = None;
        Ok(())
    }

    /// A carrier made as a memfd mapped shared instead of anonymous memory, so that its
    /// descriptor can be handed to another process ([`Carrier::memfd`]): the carrier helper's,
    /// whose pages must outlive it (docs/design.md, "The carrier helper's death").
    pub fn shareable() -> Carrier {
        Carrier {
            shareable: true,
            ..Carrier::default()
        }
    }

    /// The memfd behind a [`Carrier::shareable`] carrier, once mapped.
    pub fn memfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.memfd.as_ref().map(|fd| fd.as_fd())
    }

    /// Bytes mapped (the most a copy may reach from [`Carrier::base`]).
    pub fn mapped(&self) -> usize {
        self.len
    }

    /// Bytes of the carrier held pinned.
    pub fn pinned(&self) -> usize {
        self.pinned
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
    /// A pinned carrier keeps its pages: they stay registered for the next cycle.
    pub fn discard(&self) {
        if self.len > 0 && !self.poisoned && self.pinned == 0 {
            // SAFETY: our own mapping; MADV_FREE keeps it mapped, only its contents may go.
            let _ = unsafe {
                rustix::mm::madvise(self.base as *mut _, self.len, rustix::mm::Advice::LinuxFree)
            };
        }
    }
}

/// A fresh memfd of `len` bytes mapped shared, read and write.
fn map_memfd(len: usize) -> Result<(*mut core::ffi::c_void, OwnedFd), CopyError> {
    let failed = |source| CopyError::Carrier { len, source };
    let fd = rustix::fs::memfd_create("cuinterpose-carrier", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(failed)?;
    rustix::fs::ftruncate(&fd, len as u64).map_err(failed)?;
    // SAFETY: a fresh shared mapping of a file only this function has seen; no existing memory
    // is touched. Not NORESERVE: a shared file mapping takes its pages from the file.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &fd,
            0,
        )
    }
    .map_err(failed)?;
    Ok((ptr, fd))
}

/// Another process's carrier, mapped read-only from its memfd ([`Carrier::memfd`]): where a
/// Load reads the bytes the carrier helper saved when the helper is gone. Unmapped on drop.
#[derive(Debug)]
pub struct CarrierView {
    base: usize,
    len: usize,
}

impl CarrierView {
    /// Maps the first `len` bytes of `fd` (which must be at least that long: checked here, so
    /// that no read past the file's end can fault).
    pub fn map(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> Result<CarrierView, CopyError> {
        let failed = |source| CopyError::Carrier { len, source };
        let size = rustix::fs::fstat(fd).map_err(failed)?.st_size;
        if u64::try_from(size).unwrap_or(0) < len as u64 || len == 0 {
            return Err(failed(rustix::io::Errno::RANGE));
        }
        // SAFETY: a fresh read-only shared mapping of `len` bytes of a file at least that long;
        // no existing memory is touched, and nothing is written through it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(failed)?;
        Ok(CarrierView {
            base: ptr as usize,
            len,
        })
    }

    pub fn base(&self) -> usize {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for CarrierView {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made. Only staged copies read a view, by CPU into a staging
        // buffer before each DMA starts, so once `copy_all` has joined its workers nothing reads
        // it any more, whatever became of the DMAs.
        let _ = unsafe { rustix::mm::munmap(self.base as *mut _, self.len) };
    }
}

/// Threads for first touch: one per core, up to 16 (page faults of fresh memory scale with cores;
/// on a VM whose memory grows on first touch they are most of the carrier's cost).
fn touch_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().min(16))
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

/// Splits the `len`-byte region that sits at `offset` in the carrier (based at `base`) into
/// units that never cross a multiple of [`SEGMENT`] in the carrier. A pinned carrier is
/// registered in [`PIN_PIECE`] pieces, a multiple of [`SEGMENT`], so every unit lies inside one
/// registration: the driver refuses a copy whose host range spans two (r580 answers
/// `CUDA_ERROR_INVALID_VALUE`; regions are packed at granularity offsets, so without the cut a
/// unit of a 2 MiB-aligned region runs over a piece boundary).
pub fn segments(device: i32, dev: u64, base: usize, offset: usize, len: usize) -> Vec<Unit> {
    let mut out = Vec::with_capacity(len.div_ceil(SEGMENT) + 1);
    let mut off = 0;
    while off < len {
        let at = offset + off;
        let n = (SEGMENT - at % SEGMENT).min(len - off);
        out.push(Unit {
            device,
            dev: dev + off as u64,
            host: base + at,
            len: n,
        });
        off += n;
    }
    out
}

/// What the copy engine measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyStats {
    pub mode: CarrierMode,
    pub bytes: u64,
    /// Longest time a worker spent pinning: allocating its staging, or registering and
    /// unregistering carrier segments.
    pub pin: Duration,
    /// Wall time of the whole copy (pinning included).
    pub wall: Duration,
    pub threads: usize,
    /// Segments copied staged because their registration failed.
    pub staged_fallbacks: u32,
    /// A stream could not be synchronised: DMA may still touch the carrier.
    pub dma_uncertain: bool,
}

impl CopyStats {
    /// The figures as a phase reports them, with `carrier`: the carrier's preparation time and
    /// whether an earlier cycle's carrier was reused.
    pub fn report(&self, carrier: (Duration, bool)) -> protocol::message::CopyStats {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        protocol::message::CopyStats {
            mode: self.mode,
            bytes: self.bytes,
            threads: u32::try_from(self.threads).unwrap_or(u32::MAX),
            carrier_micros: micros(carrier.0),
            carrier_reused: carrier.1,
            pin_micros: micros(self.pin),
            copy_micros: micros(self.wall),
            staged_fallbacks: self.staged_fallbacks,
        }
    }
}

/// A primary context retained and made current on this thread, released on drop.
pub type DeviceContext<'a> = cuda::owned::PrimaryContext<'a>;

/// Where a failed cleanup of the shim's own driver objects goes: the log.
pub fn log_cleanup(e: &cuda::CudaError) {
    log_warn!("cleanup of a shim-owned driver object failed: {e}");
}

/// Enters `device`'s primary context on this thread.
pub fn enter(real: &Real, device: i32) -> Result<DeviceContext<'_>, CopyError> {
    DeviceContext::enter(real, device, log_cleanup).map_err(|e| CopyError::Driver {
        call: e.call,
        device,
        result: e.result,
    })
}

/// A worker's streams, and its staging buffers once a staged copy needs them. Dropping it frees
/// the buffers and destroys the streams (fields drop in order: buffers first), unless a copy
/// could not be confirmed finished.
struct Lane<'a> {
    real: &'a Real,
    device: i32,
    /// Empty until [`Lane::staging`] allocates the two.
    buffers: Vec<PinnedBuffer<'a>>,
    streams: Vec<Stream<'a>>,
    /// Size of each staging buffer.
    chunk: usize,
    /// Set when a synchronisation failed: the buffers must not be freed.
    uncertain: bool,
    /// Time spent pinning (staging allocation, segment registration and unregistration).
    pin: Duration,
    staged_fallbacks: u32,
}

impl<'a> Lane<'a> {
    fn new(real: &'a Real, device: i32, chunk: usize) -> Result<Lane<'a>, CopyError> {
        let mut lane = Lane {
            real,
            device,
            buffers: Vec::with_capacity(2),
            streams: Vec::with_capacity(2),
            chunk,
            uncertain: false,
            pin: Duration::ZERO,
            staged_fallbacks: 0,
        };
        for _ in 0..2 {
            // A context is current on this thread.
            let stream = Stream::new(real, STREAM_NON_BLOCKING, log_cleanup)
                .map_err(|e| lane.error(e.call, e.result))?;
            lane.streams.push(stream);
        }
        Ok(lane)
    }

    fn error(&self, call: &'static str, result: CUresult) -> CopyError {
        CopyError::Driver {
            call,
            device: self.device,
            result,
        }
    }

    /// Allocates the two staging buffers on first use.
    fn staging(&mut self) -> Result<(), CopyError> {
        let t = Instant::now();
        while self.buffers.len() < 2 {
            match PinnedBuffer::new(self.real, self.chunk, 0, log_cleanup) {
                Ok(buffer) => self.buffers.push(buffer),
                Err(e) => {
                    self.pin += t.elapsed();
                    return Err(self.error(e.call, e.result));
                }
            }
        }
        self.pin += t.elapsed();
        Ok(())
    }

    fn stream(&self, b: usize) -> CUstream {
        self.streams
            .get(b)
            .map_or(std::ptr::null_mut(), Stream::raw)
    }

    /// Staging buffer `b` (null before [`Lane::staging`]).
    fn buffer(&mut self, b: usize) -> *mut u8 {
        self.buffers
            .get_mut(b)
            .map_or(std::ptr::null_mut(), PinnedBuffer::as_mut_ptr)
    }

    fn sync(&mut self, b: usize) -> Result<(), CopyError> {
        let synced = match self.streams.get(b) {
            Some(stream) => stream.synchronize(),
            None => Err(cuda::CudaError {
                call: "cuStreamSynchronize",
                result: CUresult::ERROR_INVALID_HANDLE,
            }),
        };
        synced.map_err(|e| {
            self.uncertain = true;
            self.error(e.call, e.result)
        })
    }

    fn run(&mut self, unit: Unit, dir: Direction, mode: CarrierMode) -> Result<(), CopyError> {
        match mode {
            CarrierMode::Registered => self.run_registered(unit, dir),
            CarrierMode::Pinned => self.run_pinned(unit, dir),
            CarrierMode::Staged => {
                self.staging()?;
                self.run_staged(unit, dir)
            }
        }
    }

    /// Registers the unit's part of the carrier, copies it in one asynchronous copy, and
    /// unregisters it; falls back to staging when the driver refuses the registration.
    fn run_registered(&mut self, unit: Unit, dir: Direction) -> Result<(), CopyError> {
        let host = unit.host as *mut core::ffi::c_void;
        let t = Instant::now();
        // SAFETY: `host..host+len` lies inside the carrier mapping, which outlives the copy; no
        // other worker registers an overlapping range (units are disjoint, page-aligned).
        let r = unsafe { (self.real.cuMemHostRegister_v2)(host, unit.len, 0) };
        self.pin += t.elapsed();
        if !r.is_success() {
            if self.staged_fallbacks == 0 {
                log_warn!(
                    "cuMemHostRegister of a carrier segment failed on device {}: {r}; copying staged",
                    self.device
                );
            }
            self.staged_fallbacks += 1;
            self.staging()?;
            return self.run_staged(unit, dir);
        }
        let stream = self.stream(0);
        let (call, r) = match dir {
            // SAFETY: `host` is registered for `len` bytes inside the carrier, `dev` a mapped range
            // of at least `len` bytes; the copy is synchronised before the range is unregistered.
            Direction::ToHost => ("cuMemcpyDtoHAsync", unsafe {
                (self.real.cuMemcpyDtoHAsync_v2)(host, unit.dev, unit.len, stream)
            }),
            // SAFETY: as above, the other way.
            Direction::ToDevice => ("cuMemcpyHtoDAsync", unsafe {
                (self.real.cuMemcpyHtoDAsync_v2)(unit.dev, host, unit.len, stream)
            }),
        };
        // Whether or not the copy was queued, the stream must be idle before the range is let go.
        let synced = self.sync(0);
        if synced.is_ok() {
            let t = Instant::now();
            // SAFETY: registered above; no copy is pending on it (the stream is synchronised).
            let u = unsafe { (self.real.cuMemHostUnregister)(host) };
            self.pin += t.elapsed();
            if !u.is_success() {
                return Err(self.error("cuMemHostUnregister", u));
            }
        }
        if !r.is_success() {
            return Err(self.error(call, r));
        }
        synced
    }

    /// Copies the unit in one asynchronous copy straight to or from the carrier, which
    /// [`Carrier::ensure_pinned`] registered for the whole copy (units are [`SEGMENT`], 64 MiB:
    /// the chunk size that reached 55.2 GB/s on the H200, against 48-49 with 1 MiB).
    fn run_pinned(&mut self, unit: Unit, dir: Direction) -> Result<(), CopyError> {
        let host = unit.host as *mut core::ffi::c_void;
        let stream = self.stream(0);
        let (call, r) = match dir {
            // SAFETY: `host..host+len` is inside the carrier, registered and mapped for the whole
            // copy; `dev` is a mapped range of at least `len` bytes; synchronised below.
            Direction::ToHost => ("cuMemcpyDtoHAsync", unsafe {
                (self.real.cuMemcpyDtoHAsync_v2)(host, unit.dev, unit.len, stream)
            }),
            // SAFETY: as above, the other way.
            Direction::ToDevice => ("cuMemcpyHtoDAsync", unsafe {
                (self.real.cuMemcpyHtoDAsync_v2)(unit.dev, host, unit.len, stream)
            }),
        };
        let synced = self.sync(0);
        if !r.is_success() {
            return Err(self.error(call, r));
        }
        synced
    }

    fn run_staged(&mut self, unit: Unit, dir: Direction) -> Result<(), CopyError> {
        let mut pending: [Option<(usize, usize)>; 2] = [None, None];
        let mut order = VecDeque::with_capacity(2);
        let mut off = 0;
        let mut i = 0usize;
        while off < unit.len {
            let b = i % 2;
            let n = self.chunk.min(unit.len - off);
            if let Some((host, len)) = pending.get_mut(b).and_then(Option::take) {
                self.sync(b)?;
                order.retain(|x| *x != b);
                if dir == Direction::ToHost {
                    self.drain(b, host, len);
                }
            }
            let buf = self.buffer(b);
            let stream = self.stream(b);
            let dev = unit.dev + off as u64;
            let host = unit.host + off;
            let r = match dir {
                // SAFETY: `buf` is a staging buffer of `chunk` bytes, `dev` a mapped range.
                Direction::ToHost => unsafe {
                    (self.real.cuMemcpyDtoHAsync_v2)(buf.cast(), dev, n, stream)
                },
                Direction::ToDevice => {
                    // SAFETY: `host..host+n` is inside the carrier; `buf` has `chunk` bytes and no
                    // copy is pending on it (synchronised above).
                    unsafe { std::ptr::copy_nonoverlapping(host as *const u8, buf, n) };
                    // SAFETY: as above.
                    unsafe { (self.real.cuMemcpyHtoDAsync_v2)(dev, buf.cast(), n, stream) }
                }
            };
            if !r.is_success() {
                self.uncertain = true;
                return Err(self.error(
                    match dir {
                        Direction::ToHost => "cuMemcpyDtoHAsync",
                        Direction::ToDevice => "cuMemcpyHtoDAsync",
                    },
                    r,
                ));
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

    fn drain(&mut self, b: usize, host: usize, len: usize) {
        let buf = self.buffer(b);
        // SAFETY: the copy into `buf` is synchronised; `host..host+len` is this unit's part of
        // the carrier, written by no other thread.
        unsafe { std::ptr::copy_nonoverlapping(buf, host as *mut u8, len) };
    }
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        if self.uncertain {
            crate::log::log_error!(
                "a copy on device {} could not be confirmed finished; its staging and carrier \
                 segment are kept",
                self.device
            );
            // DMA may still reach them: kept for the life of the process.
            for buffer in self.buffers.drain(..) {
                buffer.leak();
            }
            for stream in self.streams.drain(..) {
                stream.leak();
            }
        }
        // Otherwise every copy is synchronised: the fields' own drops free and destroy them.
    }
}

/// How many workers per device.
pub fn workers_per_device(devices: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cores.min(16) / devices.max(1)).clamp(1, 8)
}

/// Copies every unit, in parallel across devices and segments. The stats come back also on
/// failure: `dma_uncertain` tells the caller not to free what a copy may still touch.
pub fn copy_all(
    real: &Real,
    units: Vec<Unit>,
    dir: Direction,
    mode: CarrierMode,
    chunk: usize,
) -> (CopyStats, Option<CopyError>) {
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
    let pin = Mutex::new(Duration::ZERO);
    let fallbacks = AtomicU32::new(0);
    let uncertain = AtomicBool::new(false);
    let mut threads = 0;
    let first_error: Mutex<Option<CopyError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for (device, queue) in &by_device {
            let n = per.min(queue.lock().unwrap_or_else(|e| e.into_inner()).len());
            for _ in 0..n {
                threads += 1;
                let (failed, pin, fallbacks, uncertain, first_error) =
                    (&failed, &pin, &fallbacks, &uncertain, &first_error);
                let work = move || {
                    let result = (|| {
                        let _ctx = enter(real, *device)?;
                        let mut lane = Lane::new(real, *device, chunk)?;
                        let result = (|| {
                            while !failed.load(Ordering::Relaxed) {
                                let unit =
                                    queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                                let Some(unit) = unit else { break };
                                lane.run(unit, dir, mode)?;
                            }
                            Ok(())
                        })();
                        {
                            let mut p = pin.lock().unwrap_or_else(|e| e.into_inner());
                            *p = (*p).max(lane.pin);
                        }
                        fallbacks.fetch_add(lane.staged_fallbacks, Ordering::Relaxed);
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
        mode,
        bytes,
        pin: *pin.lock().unwrap_or_else(|e| e.into_inner()),
        wall: start.elapsed(),
        threads,
        staged_fallbacks: fallbacks.load(Ordering::Relaxed),
        dma_uncertain: uncertain.load(Ordering::Relaxed),
    };
    (
        stats,
        first_error.into_inner().unwrap_or_else(|e| e.into_inner()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_abi::{CUmemAllocationProp, CUmemLocation, location_type};
    use testdriver::refuse_register;

    /// A mapped test-driver allocation of `len` bytes holding `pattern(i)` at byte i.
    fn device_buffer(real: &Real, len: usize, salt: u8) -> u64 {
        let prop = CUmemAllocationProp {
            type_: cuda_abi::allocation_type::PINNED,
            location: CUmemLocation {
                type_: location_type::DEVICE,
                id: 0,
            },
            ..Default::default()
        };
        let (mut h, mut va) = (0u64, 0u64);
        // SAFETY: valid out-pointer and props.
        assert!(unsafe { (real.cuMemCreate)(&mut h, len, &prop, 0) }.is_success());
        // SAFETY: valid out-pointer.
        assert!(unsafe { (real.cuMemAddressReserve)(&mut va, len, 0, 0, 0) }.is_success());
        // SAFETY: the reservation and handle just made, both `len` bytes.
        assert!(unsafe { (real.cuMemMap)(va, len, 0, h, 0) }.is_success());
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ salt)
            .collect();
        // SAFETY: `bytes` has `len` bytes, `va` a mapping of `len` bytes.
        let r = unsafe { (real.cuMemcpyHtoD_v2)(va, bytes.as_ptr().cast(), len) };
        assert!(r.is_success());
        va
    }

    fn read_device(real: &Real, va: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: `out` has `len` bytes, `va` a mapping of `len` bytes.
        let r = unsafe { (real.cuMemcpyDtoH_v2)(out.as_mut_ptr().cast(), va, len) };
        assert!(r.is_success());
        out
    }

    /// Saves a buffer of two segments and a bit into the carrier, wipes it, loads it back.
    fn round_trip(
        real: &Real,
        mode: CarrierMode,
        chunk: usize,
        salt: u8,
    ) -> (CopyStats, CopyStats) {
        let len = SEGMENT + (4 << 20);
        let va = device_buffer(real, len, salt);
        let before = read_device(real, va, len);
        let mut carrier = Carrier::default();
        let (_, reused) = carrier.ensure(len).expect("carrier");
        assert!(!reused);
        let units = segments(0, va, carrier.base(), 0, len);
        assert_eq!(units.len(), 2);
        let (saved, error) = copy_all(real, units.clone(), Direction::ToHost, mode, chunk);
        assert!(error.is_none(), "{error:?}");
        // SAFETY: the carrier holds `len` bytes just written by the copy engine.
        let host = unsafe { std::slice::from_raw_parts(carrier.base() as *const u8, len) };
        assert!(
            host == before.as_slice(),
            "the carrier holds the device bytes"
        );
        let zeros = vec![0u8; len];
        // SAFETY: as in device_buffer.
        let r = unsafe { (real.cuMemcpyHtoD_v2)(va, zeros.as_ptr().cast(), len) };
        assert!(r.is_success());
        let (loaded, error) = copy_all(real, units, Direction::ToDevice, mode, chunk);
        assert!(error.is_none(), "{error:?}");
        assert!(
            read_device(real, va, len) == before,
            "the device got its bytes back"
        );
        let (_, reused) = carrier.ensure(len).expect("carrier again");
        assert!(reused, "a big enough carrier is used again");
        (saved, loaded)
    }

    #[test]
    fn units_never_cross_a_segment_of_the_carrier() {
        // A 200 MiB region packed 2 MiB past a segment boundary (as regions after a 2 MiB one
        // are): cut at each multiple of SEGMENT in the carrier, so none spans two pinned pieces.
        let (base, offset, len) = (1 << 30, SEGMENT + (2 << 20), 200 << 20);
        let units = segments(3, 0x7000_0000, base, offset, len);
        let lens: Vec<usize> = units.iter().map(|u| u.len).collect();
        assert_eq!(
            lens,
            [SEGMENT - (2 << 20), SEGMENT, SEGMENT, 10 << 20],
            "{units:?}"
        );
        let mut next = (0x7000_0000u64, base + offset);
        for u in &units {
            assert_eq!((u.device, u.dev, u.host), (3, next.0, next.1));
            let first = (u.host - base) / SEGMENT;
            let last = (u.host - base + u.len - 1) / SEGMENT;
            assert_eq!(first, last, "{u:?} crosses a segment");
            next = (u.dev + u.len as u64, u.host + u.len);
        }
        assert_eq!(next.1, base + offset + len);
    }

    #[test]
    fn both_carrier_modes_move_every_byte_both_ways() {
        let real = testdriver::real();
        for (mode, chunk, salt) in [
            (CarrierMode::Registered, DEFAULT_CHUNK, 1),
            (CarrierMode::Staged, DEFAULT_CHUNK, 2),
            (CarrierMode::Staged, 8 << 20, 4),
            // A chunk that does not divide the segments: the last DMA of each is short.
            (CarrierMode::Staged, 3 << 20, 5),
        ] {
            let (saved, loaded) = round_trip(&real, mode, chunk, salt);
            for stats in [saved, loaded] {
                assert_eq!(stats.mode, mode);
                assert_eq!(stats.bytes, (SEGMENT + (4 << 20)) as u64);
                assert_eq!(stats.staged_fallbacks, 0);
                assert!(stats.threads >= 1);
                assert!(!stats.dma_uncertain);
            }
        }
    }

    #[test]
    fn a_refused_registration_falls_back_to_staging() {
        let mut real = testdriver::real();
        real.cuMemHostRegister_v2 = refuse_register;
        let (saved, loaded) = round_trip(&real, CarrierMode::Registered, DEFAULT_CHUNK, 3);
        assert_eq!(saved.staged_fallbacks, 2, "both segments went staged");
        assert_eq!(loaded.staged_fallbacks, 2);
    }

    /// The test driver's own registration calls, counted by the wrappers below.
    static REAL_REGISTER: std::sync::OnceLock<(
        unsafe extern "C" fn(*mut core::ffi::c_void, usize, core::ffi::c_uint) -> CUresult,
        unsafe extern "C" fn(*mut core::ffi::c_void) -> CUresult,
    )> = std::sync::OnceLock::new();
    static REGISTERED: AtomicU32 = AtomicU32::new(0);
    static UNREGISTERED: AtomicU32 = AtomicU32::new(0);
    static PINNED_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    unsafe extern "C" fn count_register(
        p: *mut core::ffi::c_void,
        n: usize,
        flags: core::ffi::c_uint,
    ) -> CUresult {
        let (register, _) = REAL_REGISTER.get().expect("wrapped");
        // SAFETY: forwards the caller's arguments unchanged.
        let r = unsafe { register(p, n, flags) };
        if r.is_success() {
            REGISTERED.fetch_add(1, Ordering::SeqCst);
            PINNED_BYTES.fetch_add(n, Ordering::SeqCst);
        }
        r
    }

    unsafe extern "C" fn count_unregister(p: *mut core::ffi::c_void) -> CUresult {
        let (_, unregister) = REAL_REGISTER.get().expect("wrapped");
        // SAFETY: forwards the caller's argument unchanged.
        let r = unsafe { unregister(p) };
        if r.is_success() {
            UNREGISTERED.fetch_add(1, Ordering::SeqCst);
        }
        r
    }

    /// Three save/load cycles through one pinned carrier: every byte moves both ways, the carrier
    /// is registered once in [`PIN_PIECE`] pieces and never again, growing it re-registers it
    /// whole, and `unpin` gives every piece back.
    #[test]
    fn a_pinned_carrier_is_registered_once_and_kept_across_cycles() {
        let mut real = testdriver::real();
        REAL_REGISTER.get_or_init(|| (real.cuMemHostRegister_v2, real.cuMemHostUnregister));
        real.cuMemHostRegister_v2 = count_register;
        real.cuMemHostUnregister = count_unregister;
        // Four pieces of 4 MiB, the last one 2 MiB (the carrier is a multiple of 2 MiB).
        let piece = 4 << 20;
        let len = 3 * piece + (1 << 20);
        let va = device_buffer(&real, len, 7);
        let before = read_device(&real, va, len);
        let mut carrier = Carrier::default();
        for cycle in 0..3 {
            let (_, reused, pinned) = carrier
                .ensure_pinned(&real, len, piece, 0)
                .expect("carrier");
            assert!(pinned);
            assert_eq!(reused, cycle > 0, "cycle {cycle}");
            assert_eq!(
                REGISTERED.load(Ordering::SeqCst),
                4,
                "cycle {cycle}: pinned once"
            );
            assert_eq!(UNREGISTERED.load(Ordering::SeqCst), 0);
            assert_eq!(carrier.pinned(), round_up(len, 2 << 20));
            let units = segments(0, va, carrier.base(), 0, len);
            let (saved, error) = copy_all(
                &real,
                units.clone(),
                Direction::ToHost,
                CarrierMode::Pinned,
                DEFAULT_CHUNK,
            );
            assert!(error.is_none(), "{error:?}");
            assert_eq!(saved.mode, CarrierMode::Pinned);
            assert_eq!(saved.bytes, len as u64);
            // SAFETY: the carrier holds `len` bytes just written by the copy engine.
            let host = unsafe { std::slice::from_raw_parts(carrier.base() as *const u8, len) };
            assert!(
                host == before.as_slice(),
                "cycle {cycle}: carrier holds the bytes"
            );
            let zeros = vec![0u8; len];
            // SAFETY: `zeros` has `len` bytes, `va` a mapping of `len` bytes.
            assert!(unsafe { (real.cuMemcpyHtoD_v2)(va, zeros.as_ptr().cast(), len) }.is_success());
            carrier.discard();
            let (loaded, error) = copy_all(
                &real,
                units,
                Direction::ToDevice,
                CarrierMode::Pinned,
                DEFAULT_CHUNK,
            );
            assert!(error.is_none(), "{error:?}");
            assert_eq!(loaded.staged_fallbacks, 0);
            assert!(
                read_device(&real, va, len) == before,
                "cycle {cycle}: device bytes back"
            );
        }
        // Growing unregisters the old pieces and registers the new carrier in pieces.
        let (_, reused, pinned) = carrier
            .ensure_pinned(&real, len + piece, piece, 0)
            .expect("grow");
        assert!(pinned && !reused);
        assert_eq!(UNREGISTERED.load(Ordering::SeqCst), 4);
        assert_eq!(REGISTERED.load(Ordering::SeqCst), 4 + 5);
        let carried = round_up(len, 2 << 20);
        let grown = round_up(len + piece, 2 << 20);
        assert_eq!(PINNED_BYTES.load(Ordering::SeqCst), carried + grown);
        assert_eq!(carrier.pinned(), grown);
        carrier.unpin(&real).expect("unpin");
        assert_eq!(carrier.pinned(), 0);
        assert_eq!(UNREGISTERED.load(Ordering::SeqCst), 4 + 5);
    }

    /// A refused registration: the carrier says it is not pinned (the phase copies staged), does
    /// not retry at the next cycle, and holds nothing registered.
    #[test]
    fn a_refused_pinning_leaves_the_carrier_unpinned_for_good() {
        let mut real = testdriver::real();
        real.cuMemHostRegister_v2 = refuse_register;
        let mut carrier = Carrier::default();
        for _ in 0..2 {
            let (_, _, pinned) = carrier
                .ensure_pinned(&real, SEGMENT, PIN_PIECE, 0)
                .expect("carrier");
            assert!(!pinned);
            assert_eq!(carrier.pinned(), 0);
        }
    }
}
