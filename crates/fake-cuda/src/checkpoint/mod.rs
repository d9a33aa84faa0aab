//! The checkpoint API across processes.
//!
//! `cuCheckpointProcess*(pid, ...)` called in one process (the tool) is carried out by the agent
//! of process `pid` ([`agent`], reached through [`client`]). In the target:
//!
//! - **Lock** waits for driver calls in flight, then for every stream of the process to be idle
//!   (both within `timeoutMs`, 0: no limit; on timeout `CUDA_ERROR_TIMEOUT` and the process
//!   keeps running; a process whose queued work faulted: `CUDA_ERROR_ILLEGAL_ADDRESS`); then
//!   every driver call of the application's threads blocks at the [`gate`] until unlock.
//! - **Checkpoint** (LOCKED only) copies the bytes of every allocation this process created into
//!   private anonymous memory, closes every memfd, replaces every device mapping with a reserved
//!   PROT_NONE range at the same address, and withdraws the usage file: the process then holds
//!   no device memory and no descriptor of the fake except the agent's listening socket.
//!   As on r580, an exporter whose memory is mapped by another *running* process does not
//!   checkpoint: the real driver hangs for minutes, the fake returns `CUDA_ERROR_TIMEOUT` after
//!   the lock's timeout (10 s if it was 0), leaving the process locked and unchanged.
//! - **Restore** (CHECKPOINTED only) brings every allocation back at the same address with its
//!   bytes, onto the device the GPU pairs name (by UUID), and publishes the usage again; the
//!   process is LOCKED. A process that was checkpointed holding a live import (a VMM import
//!   still referenced or mapped, or a multicast object: assumed, not measured) fails with
//!   `CUDA_ERROR_NOT_SUPPORTED`, one holding an opened legacy IPC mapping with `CUDA_ERROR_INVALID_VALUE`; it is then
//!   FAILED: unlock gives `CUDA_ERROR_ILLEGAL_STATE` and every driver call fails.
//! - **Unlock** (LOCKED only) lets the application's calls run again.
//!
//! Any other order is `CUDA_ERROR_ILLEGAL_STATE`, as on the real driver.

pub(crate) mod agent;
pub(crate) mod client;
pub(crate) mod gate;
mod wire;

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use cuda_abi::{
    CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUresult,
};

use crate::device::device_by_uuid;
use crate::memory::{Backing, Origin};
use crate::os::{self, Saved};
use crate::state::{self, Driver};
use crate::{Res, exec, read_in, write_out};
use gate::Phase;
use wire::{MAX_PAIRS, Op, Pair, Request};

/// How long an exporter's checkpoint waits for peers to stop mapping its memory when the lock
/// was taken without a timeout.
const DEFAULT_HANG_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(100);

/// Serialises state-changing requests in the target (GetState never waits on it).
static OP_LOCK: Mutex<()> = Mutex::new(());
/// The timeout of the lock now held, in ms.
static LOCK_TIMEOUT_MS: AtomicU32 = AtomicU32::new(0);

/// Why a restore will fail, decided at checkpoint time.
static POISON: Mutex<Option<CUresult>> = Mutex::new(None);

/// Serves one request in the target process.
fn dispatch(request: &Request) -> Res<u64> {
    if request.op == Op::GetState {
        return Ok(u64::from(gate::phase().process_state()));
    }
    let _serial = OP_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    match request.op {
        Op::Lock => {
            let timeout = (request.timeout_ms > 0)
                .then(|| Duration::from_millis(u64::from(request.timeout_ms)));
            lock(timeout)?;
            LOCK_TIMEOUT_MS.store(request.timeout_ms, Ordering::Relaxed);
            Ok(0)
        }
        Op::Checkpoint => checkpoint().map(|()| 0),
        Op::Restore => restore(&request.pairs).map(|()| 0),
        Op::Unlock => gate::transition(Phase::Locked, Phase::Running).map(|()| 0),
        Op::GetState => Ok(0),
    }
}

/// Locks the process: new driver calls wait, calls in flight end, then every stream's queued
/// work completes, all within `timeout` (`None`: no limit, as the driver documents). A stream
/// still busy at the timeout (a kernel waiting for another process that is locked already, say)
/// is `CUDA_ERROR_TIMEOUT` and the process keeps running. A process whose work faulted cannot
/// be locked: `CUDA_ERROR_ILLEGAL_ADDRESS`, r580's sticky error.
fn lock(timeout: Option<Duration>) -> Res {
    if exec::poisoned() {
        return Err(exec::FAULT);
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    gate::lock(timeout)?;
    match exec::wait_idle(deadline, |d| Ok(exec::any_busy(d))) {
        Ok(()) => Ok(()),
        Err(code) => {
            gate::transition(Phase::Locked, Phase::Running)?;
            Err(code)
        }
    }
}

/// Inodes of memfds this process created that another process may have mapped.
fn shared_inodes(d: &Driver) -> Vec<u64> {
    let vmm = d
        .mem
        .objects
        .values()
        .filter(|o| o.origin == Origin::Created && o.handle_types != 0)
        .map(|o| o.backing.ino);
    let legacy = d.mem.legacy.values().map(|l| l.backing.ino);
    vmm.chain(legacy).collect()
}

/// Pids of other processes that map one of `inodes` (a fake memfd) and are running.
fn mapped_by_running_peers(inodes: &[u64]) -> Vec<i32> {
    let me = os::getpid();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        let maps_one = maps.lines().any(|line| {
            line.contains("/memfd:fake-cuda")
                && line
                    .split_whitespace()
                    .nth(4)
                    .and_then(|ino| ino.parse::<u64>().ok())
                    .is_some_and(|ino| inodes.contains(&ino))
        });
        if !maps_one {
            continue;
        }
        // A peer that is itself locked or checkpointed does not hold the exporter up (on r580
        // "both locked, then both checkpointed" succeeds).
        let state = client::call_result(
            pid,
            &Request {
                op: Op::GetState,
                timeout_ms: 0,
                pairs: Vec::new(),
            },
        );
        let quiet = matches!(
            state.ok().and_then(|s| u32::try_from(s).ok()),
            Some(cuda_abi::process_state::LOCKED | cuda_abi::process_state::CHECKPOINTED)
        );
        if !quiet {
            out.push(pid);
        }
    }
    out
}

fn checkpoint() -> Res {
    gate::require(Phase::Locked)?;
    let timeout = match LOCK_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => DEFAULT_HANG_TIMEOUT,
        ms => Duration::from_millis(u64::from(ms)),
    };
    let deadline = Instant::now() + timeout;
    loop {
        let inodes = state::with(|d| Ok(shared_inodes(d)))?;
        if inodes.is_empty() || mapped_by_running_peers(&inodes).is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(CUresult::ERROR_TIMEOUT);
        }
        std::thread::sleep(POLL);
    }
    state::with(release_everything)?;
    gate::transition(Phase::Locked, Phase::Checkpointed)
}

/// Saves created memory, closes every descriptor, keeps the address ranges reserved.
fn release_everything(d: &mut Driver) -> Res {
    // Copy first, change nothing until every copy succeeded.
    let mut saved_objects = Vec::new();
    for (&h, o) in &d.mem.objects {
        if o.origin == Origin::Created && o.multicast.is_none() {
            let saved = Saved::capture(o.backing.file()?, o.backing.size)
                .map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
            saved_objects.push((h, saved));
        }
    }
    let mut saved_legacy = Vec::new();
    for (&base, l) in &d.mem.legacy {
        let saved = Saved::capture(l.backing.file()?, l.backing.size)
            .map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        saved_legacy.push((base, saved));
    }
    let mut poison = None;
    if d.mem
        .objects
        .values()
        .any(|o| o.origin == Origin::Imported || o.multicast.is_some())
    {
        poison = Some(CUresult::ERROR_NOT_SUPPORTED);
    } else if !d.mem.ipc_open.is_empty() {
        poison = Some(CUresult::ERROR_INVALID_VALUE);
    }
    for (&start, p) in &d.mem.pieces {
        let _ = os::map_none(start, p.size);
    }
    for (&base, l) in &d.mem.legacy {
        let _ = os::map_none(base, l.mapped);
    }
    for (&base, o) in &d.mem.ipc_open {
        let _ = os::map_none(base, o.mapped);
    }
    for o in d.mem.objects.values_mut() {
        o.backing.file = None;
    }
    for (h, saved) in saved_objects {
        if let Some(o) = d.mem.objects.get_mut(&h) {
            o.backing.saved = Some(saved);
        }
    }
    for l in d.mem.legacy.values_mut() {
        l.backing.file = None;
    }
    for (base, saved) in saved_legacy {
        if let Some(l) = d.mem.legacy.get_mut(&base) {
            l.backing.saved = Some(saved);
        }
    }
    for o in d.mem.ipc_open.values_mut() {
        o.backing.file = None;
    }
    d.usage.withdraw();
    *POISON.lock().unwrap_or_else(PoisonError::into_inner) = poison;
    Ok(())
}

/// Old device ordinal -> new, from GPU pairs (identity where no pair names a device).
fn device_map(d: &Driver, pairs: &[Pair]) -> Res<Vec<usize>> {
    let mut map: Vec<usize> = (0..d.devices.len()).collect();
    let mut seen = Vec::new();
    for (old, new) in pairs {
        let old = device_by_uuid(d, old).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        let new = device_by_uuid(d, new).ok_or(CUresult::ERROR_INVALID_VALUE)?;
        if seen.contains(&old) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        seen.push(old);
        if let Some(slot) = map.get_mut(old) {
            *slot = new;
        }
    }
    Ok(map)
}

/// A fresh backing holding `saved`, for device `device`.
fn rebuild(old: &Backing, device: usize, start: u64) -> Res<Backing> {
    let mut trailer = old.trailer;
    if trailer.kind != crate::memory::BackingKind::Multicast {
        trailer.device = device as u32;
    }
    trailer.creator_start = start;
    let fresh = Backing::create(trailer).map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
    if let (Some(saved), Some(file)) = (&old.saved, &fresh.file) {
        saved
            .write_to(file)
            .map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
    }
    Ok(fresh)
}

/// On r580 a process that CRIU brought back holds none of the mappings the driver makes (pinned
/// host memory, UVM) until the driver's restore: a thread that touches one first crashes the
/// process (measured: a JAX loop's main thread in a device-to-host copy, SIGSEGV right after
/// CRIU's restore). CRIU's CUDA plugin keeps every thread stopped but the restore thread while it
/// restores. The fake cannot fault exactly where the driver would, so it refuses the restore of a
/// process that CRIU restored (its start token changed) while any other thread of it runs:
/// `CUDA_ERROR_ILLEGAL_STATE`, and the process stays CHECKPOINTED. A restore in place (no CRIU)
/// runs with the application's threads running, as on the real driver.
fn refuse_running_threads_after_criu() -> Res {
    let (pid, token) = state::with(|d| Ok((d.pid, d.start_token)))?;
    if os::start_token(pid).is_none_or(|now| now == token) {
        return Ok(());
    }
    let me = os::gettid();
    let running: Vec<i32> = os::threads_of_self()
        .into_iter()
        .filter(|&(tid, state)| tid != me && !matches!(state, 'T' | 't' | 'Z' | 'X'))
        .map(|(tid, _)| tid)
        .collect();
    if running.is_empty() {
        return Ok(());
    }
    eprintln!(
        "fake-cuda: restore refused: CRIU restored this process and threads {running:?} run \
         (on r580 a thread that touches driver-mapped host memory before the restore crashes \
         the process: keep it stopped but for its restore thread)"
    );
    Err(CUresult::ERROR_ILLEGAL_STATE)
}

fn restore(pairs: &[Pair]) -> Res {
    gate::require(Phase::Checkpointed)?;
    refuse_running_threads_after_criu()?;
    let map = state::with(|d| device_map(d, pairs))?;
    let poison = POISON.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(code) = poison {
        gate::transition(Phase::Checkpointed, Phase::Failed)?;
        return Err(code);
    }
    let remap = |dev: usize| map.get(dev).copied().unwrap_or(dev);
    let result = state::with(|d| {
        let start = os::start_token(d.pid).unwrap_or(d.start_token);
        // Charges per new device must fit next to every other live process.
        let mut need = vec![0u64; d.devices.len()];
        for (dev, &n) in d.usage.bytes.iter().enumerate() {
            if let Some(slot) = need.get_mut(remap(dev)) {
                *slot += n;
            }
        }
        for (dev, &n) in need.iter().enumerate() {
            let total = d.devices.get(dev).map_or(0, |x| x.total);
            let others: u64 = crate::accounting::read_live(&d.config.state_dir)
                .iter()
                .filter(|r| r.pid as i32 != d.pid)
                .map(|r| r.devices.get(dev).copied().unwrap_or(0))
                .sum();
            if n > total.saturating_sub(others) {
                return Err(CUresult::ERROR_OUT_OF_MEMORY);
            }
        }
        // Build every backing before touching anything, so a failure leaves it CHECKPOINTED.
        let mut objects = Vec::new();
        for (&h, o) in &d.mem.objects {
            if o.origin == Origin::Created && o.multicast.is_none() {
                objects.push((h, rebuild(&o.backing, remap(o.device), start)?));
            }
        }
        let mut legacy = Vec::new();
        for (&base, l) in &d.mem.legacy {
            legacy.push((base, rebuild(&l.backing, remap(l.device), start)?));
        }
        for (h, backing) in objects {
            if let Some(o) = d.mem.objects.get_mut(&h) {
                o.device = remap(o.device);
                o.backing = backing;
            }
        }
        for (base, backing) in legacy {
            if let Some(l) = d.mem.legacy.get_mut(&base) {
                l.device = remap(l.device);
                l.backing = backing;
            }
        }
        let mut mapped = true;
        for (&start, p) in d.mem.pieces.iter_mut() {
            let mut access = vec![0u32; p.access.len()];
            for (dev, &flags) in p.access.iter().enumerate() {
                if let Some(slot) = access.get_mut(remap(dev)) {
                    *slot = (*slot).max(flags);
                }
            }
            p.access = access;
            let prot = p.prot();
            let file = d
                .mem
                .objects
                .get(&p.handle)
                .and_then(|o| o.backing.file.as_ref());
            mapped &=
                file.is_some_and(|f| os::map_shared(start, p.size, f, p.offset, prot).is_ok());
        }
        for (&base, l) in &d.mem.legacy {
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            mapped &= l
                .backing
                .file
                .as_ref()
                .is_some_and(|f| os::map_shared(base, l.mapped, f, 0, rw).is_ok());
        }
        d.contexts.remap(&map);
        d.start_token = start;
        if d.usage.reinstate(start, &map).is_err() {
            eprintln!("fake-cuda: cannot publish device usage after restore");
        }
        Ok(mapped)
    });
    match result {
        Ok(true) => gate::transition(Phase::Checkpointed, Phase::Locked),
        Ok(false) => {
            gate::transition(Phase::Checkpointed, Phase::Failed)?;
            Err(CUresult::ERROR_OUT_OF_MEMORY)
        }
        Err(code) => Err(code),
    }
}

fn reserved_zero(words: &[u64]) -> Res {
    if words.iter().all(|&w| w == 0) {
        Ok(())
    } else {
        Err(CUresult::ERROR_INVALID_VALUE)
    }
}

fn simple(pid: c_int, op: Op, timeout_ms: u32) -> Res {
    client::call_result(
        pid,
        &Request {
            op,
            timeout_ms,
            pairs: Vec::new(),
        },
    )
    .map(|_| ())
}

pub(crate) unsafe fn process_lock(pid: c_int, args: *mut CUcheckpointLockArgs) -> Res {
    let timeout_ms = if args.is_null() {
        0
    } else {
        // SAFETY: non-null; the caller passes readable lock arguments.
        let a = unsafe { read_in(args.cast_const()) }?;
        reserved_zero(&a.reserved1)?;
        reserved_zero(&[u64::from(a.reserved0)])?;
        a.timeoutMs
    };
    simple(pid, Op::Lock, timeout_ms)
}

pub(crate) unsafe fn process_checkpoint(pid: c_int, args: *mut CUcheckpointCheckpointArgs) -> Res {
    if !args.is_null() {
        // SAFETY: non-null; the caller passes readable checkpoint arguments.
        let a = unsafe { read_in(args.cast_const()) }?;
        reserved_zero(&a.reserved)?;
    }
    simple(pid, Op::Checkpoint, 0)
}

pub(crate) unsafe fn process_restore(pid: c_int, args: *mut CUcheckpointRestoreArgs) -> Res {
    let mut pairs = Vec::new();
    if !args.is_null() {
        // SAFETY: non-null; the caller passes readable restore arguments.
        let a = unsafe { read_in(args.cast_const()) }?;
        if a.reserved.iter().any(|&b| b != 0) {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        reserved_zero(&[a.reserved1])?;
        let count = a.gpuPairsCount as usize;
        if count > 0 {
            if a.gpuPairs.is_null() || count > MAX_PAIRS {
                return Err(CUresult::ERROR_INVALID_VALUE);
            }
            // SAFETY: the caller passes `gpuPairsCount` readable pairs at `gpuPairs`.
            let raw = unsafe { std::slice::from_raw_parts(a.gpuPairs.cast_const(), count) };
            for pair in raw {
                pairs.push((
                    pair.oldUuid.bytes.map(|b| b as u8),
                    pair.newUuid.bytes.map(|b| b as u8),
                ));
            }
        }
    }
    client::call_result(
        pid,
        &Request {
            op: Op::Restore,
            timeout_ms: 0,
            pairs,
        },
    )
    .map(|_| ())
}

pub(crate) unsafe fn process_unlock(pid: c_int, args: *mut CUcheckpointUnlockArgs) -> Res {
    if !args.is_null() {
        // SAFETY: non-null; the caller passes readable unlock arguments.
        let a = unsafe { read_in(args.cast_const()) }?;
        reserved_zero(&a.reserved)?;
    }
    simple(pid, Op::Unlock, 0)
}

pub(crate) unsafe fn process_get_state(pid: c_int, state: *mut u32) -> Res {
    if state.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let value = client::call_result(
        pid,
        &Request {
            op: Op::GetState,
            timeout_ms: 0,
            pairs: Vec::new(),
        },
    )?;
    // SAFETY: checked non-null; the caller passes a writable CUprocessState.
    unsafe { write_out(state, value as u32) }
}

pub(crate) unsafe fn process_get_restore_thread_id(pid: c_int, tid: *mut c_int) -> Res {
    if tid.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let value = client::restore_thread(pid)?;
    // SAFETY: checked non-null; the caller passes a writable int.
    unsafe { write_out(tid, value) }
}
