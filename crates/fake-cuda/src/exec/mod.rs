//! Asynchronous execution: stream queues, their workers, events, modules and kernels, and the
//! sticky fault of r580.
//!
//! Work queued on a stream (a kernel, an async copy or memset, a wait on an event or on a
//! memory value, a value write, a host function) goes into that stream's FIFO queue and is run,
//! in order, by a worker thread of the queue (`fake-cuda-strm`, every signal blocked), spawned
//! at the first work queued and ended when the stream or its context goes. The null stream
//! (0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) is one queue per context.
//!
//! A worker holds the driver-state mutex while it checks and touches memory, so an unmap or a
//! free cannot race a kernel's access; it releases it whenever it waits (a sleep, a flag that is
//! not set yet, an event not reached): it waits on the state's condition variable, with a short
//! timeout where memory another process may write is polled.
//!
//! A range a kernel, async copy or memset touches is checked when the work executes (not when it
//! is queued): unmapped, released or freed memory, a reservation with nothing mapped, or memory
//! without access for the stream's device poisons the process, as r580 does: every later call
//! returns `CUDA_ERROR_ILLEGAL_ADDRESS` (the entry prologue checks [`poisoned`]), every queue's
//! work is discarded and every waiter wakes.

pub(crate) mod access;
pub(crate) mod event;
pub(crate) mod kernel;
pub(crate) mod module;
pub(crate) mod ops;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuda_abi::{CUresult, CUstream};

use crate::state::{self, Driver};
use crate::{Res, device};

/// The sticky error of a process whose queued work touched memory it may not.
pub(crate) const FAULT: CUresult = CUresult::ERROR_ILLEGAL_ADDRESS;
/// The name of stream worker threads (at most 15 bytes: the kernel's `comm`).
pub(crate) const WORKER_NAME: &str = "fake-cuda-strm";
/// How long a worker waits before it reads memory again that another stream or process may
/// write (a spinning kernel, `cuStreamWaitValue32`).
const POLL: Duration = Duration::from_micros(500);

static POISONED: AtomicBool = AtomicBool::new(false);

/// Whether queued work of this process faulted (then every call fails with [`FAULT`]).
pub(crate) fn poisoned() -> bool {
    POISONED.load(Ordering::Acquire)
}

/// A host function queued with `cuLaunchHostFunc`.
pub(crate) type HostFn = unsafe extern "C" fn(*mut c_void);

/// Which side of an async copy a pointer is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// Must be memory the device reaches: device memory or pinned host memory.
    Device,
    /// Any host memory, or device memory the device reaches (`cuMemcpyAsync`'s unified
    /// addressing).
    Host,
}

/// One piece of queued work.
#[derive(Debug)]
pub(crate) enum Work {
    Kernel(kernel::Kernel),
    Copy {
        dst: u64,
        dst_side: Side,
        src: u64,
        src_side: Side,
        len: u64,
    },
    Memset {
        dst: u64,
        value: u32,
        width: u64,
        count: u64,
    },
    WaitEvent {
        queue: u64,
        ticket: u64,
    },
    WaitValue {
        addr: u64,
        value: u32,
        flags: u32,
    },
    WriteValue {
        addr: u64,
        value: u32,
    },
    Host {
        f: HostFn,
        data: usize,
    },
}

#[derive(Debug)]
struct Op {
    work: Work,
    /// When the work began to execute (a sleeping kernel counts from here).
    started: Option<Instant>,
}

/// What one execution step of a piece of work came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done,
    /// Not yet: look again after this long (memory to poll, a sleep to end).
    Pending(Duration),
    /// Not yet: look again when the state changes (an event not reached).
    Blocked,
    /// The work touched memory it may not: the process is poisoned.
    Fault,
}

/// One stream's queue.
#[derive(Debug)]
struct Queue {
    ctx: u64,
    ops: VecDeque<Op>,
    /// The worker has taken the front work out and is executing it.
    running: bool,
    /// Works queued and completed so far (in order): an event records `submitted` and is
    /// reached once `completed` is there.
    submitted: u64,
    completed: u64,
    /// A worker thread runs for this queue.
    worker: bool,
    /// The stream was destroyed: the worker finishes the queued work, then ends.
    closing: bool,
    /// The context went or the process faulted: the work is discarded, the worker ends.
    cancelled: bool,
}

impl Queue {
    fn busy(&self) -> bool {
        !self.cancelled && (self.running || !self.ops.is_empty())
    }
}

/// The execution state of the process (inside the driver state, under its mutex).
#[derive(Debug, Default)]
pub(crate) struct Exec {
    /// Queues by queue id (ids are never reused, so an event never names a later queue).
    queues: BTreeMap<u64, Queue>,
    /// The queue of each stream key: a stream handle, or a context id for its null stream.
    keys: BTreeMap<u64, u64>,
    pub events: BTreeMap<u64, event::Event>,
    pub modules: BTreeMap<u64, module::Module>,
    pub functions: BTreeMap<u64, module::Function>,
}

/// The queue of a stream key, made on first use.
fn queue_of(d: &mut Driver, key: u64, ctx: u64) -> u64 {
    if let Some(&qid) = d.exec.keys.get(&key)
        && d.exec.queues.contains_key(&qid)
    {
        return qid;
    }
    let qid = d.next_id();
    d.exec.queues.insert(
        qid,
        Queue {
            ctx,
            ops: VecDeque::new(),
            running: false,
            submitted: 0,
            completed: 0,
            worker: false,
            closing: false,
            cancelled: false,
        },
    );
    d.exec.keys.insert(key, qid);
    qid
}

/// The queue of `stream` (checked against the current context) and where its work so far ends:
/// what an event recorded now captures.
pub(crate) fn record_point(d: &mut Driver, stream: CUstream) -> Res<(u64, u64)> {
    let (key, ctx) = device::resolve_stream(d, stream)?;
    let qid = queue_of(d, key, ctx);
    let submitted = d.exec.queues.get(&qid).map_or(0, |q| q.submitted);
    Ok((qid, submitted))
}

/// Whether the work queued on queue `qid` before `ticket` is complete (or discarded).
pub(crate) fn reached(d: &Driver, qid: u64, ticket: u64) -> bool {
    d.exec
        .queues
        .get(&qid)
        .is_none_or(|q| q.cancelled || q.completed >= ticket)
}

/// Queues `work` on `stream` (checked against the current context), starting its worker.
pub(crate) fn enqueue(d: &mut Driver, stream: CUstream, work: Work) -> Res {
    let (key, ctx) = device::resolve_stream(d, stream)?;
    let qid = queue_of(d, key, ctx);
    let Some(q) = d.exec.queues.get_mut(&qid) else {
        return Err(CUresult::ERROR_INVALID_HANDLE);
    };
    if !q.worker {
        // The thread blocks on the state mutex, held here, until this call is done.
        crate::checkpoint::agent::spawn_blocking_signals(WORKER_NAME, move || worker(qid))
            .map_err(|_| CUresult::ERROR_OUT_OF_MEMORY)?;
        q.worker = true;
    }
    q.ops.push_back(Op {
        work,
        started: None,
    });
    q.submitted += 1;
    state::notify();
    Ok(())
}

/// Whether the queue of `stream` has work queued or running.
pub(crate) fn stream_busy(d: &Driver, stream: CUstream) -> Res<bool> {
    let (key, _) = device::resolve_stream(d, stream)?;
    Ok(d.exec
        .keys
        .get(&key)
        .and_then(|qid| d.exec.queues.get(qid))
        .is_some_and(Queue::busy))
}

/// Whether any queue of context `ctx` (destroyed streams still draining included) is busy.
pub(crate) fn ctx_busy(d: &Driver, ctx: u64) -> bool {
    d.exec.queues.values().any(|q| q.ctx == ctx && q.busy())
}

/// Whether any queue of the process is busy.
pub(crate) fn any_busy(d: &Driver) -> bool {
    d.exec.queues.values().any(Queue::busy)
}

/// Waits (without the lock) until `busy` says no, or `deadline` passes (`CUDA_ERROR_TIMEOUT`);
/// a fault meanwhile is [`FAULT`].
pub(crate) fn wait_idle(deadline: Option<Instant>, busy: impl Fn(&Driver) -> Res<bool>) -> Res {
    state::wait_until(deadline, None, |d, _| {
        if poisoned() {
            return Some(Err(FAULT));
        }
        match busy(d) {
            Ok(true) => None,
            Ok(false) => Some(Ok(())),
            Err(code) => Some(Err(code)),
        }
    })
}

/// Runs `f` once the current context's queued work is complete (synchronous copies and
/// memsets: stronger than the legacy stream's rule, which the fake does not model).
pub(crate) fn after_ctx_idle<R>(mut f: impl FnMut(&mut Driver) -> Res<R>) -> Res<R> {
    state::wait_until(None, None, |d, _| {
        if poisoned() {
            return Some(Err(FAULT));
        }
        let ctx = match device::current(d) {
            Ok((ctx, _)) => ctx,
            Err(code) => return Some(Err(code)),
        };
        if ctx_busy(d, ctx) {
            return None;
        }
        Some(f(d))
    })
}

/// Marks the queues in `qids` cancelled (their work discarded; the workers end) and forgets
/// those that have no worker.
fn cancel(d: &mut Driver, qids: &[u64]) {
    for qid in qids {
        if let Some(q) = d.exec.queues.get_mut(qid) {
            q.ops.clear();
            q.cancelled = true;
        }
    }
    d.exec.keys.retain(|_, qid| !qids.contains(qid));
    d.exec.queues.retain(|_, q| q.worker || !q.cancelled);
    state::notify();
}

/// A context goes: its queues' work is discarded (a running kernel is abandoned), its workers
/// end, its events, modules and functions go.
pub(crate) fn drop_context(d: &mut Driver, ctx: u64) {
    let qids: Vec<u64> = d
        .exec
        .queues
        .iter()
        .filter(|(_, q)| q.ctx == ctx)
        .map(|(&qid, _)| qid)
        .collect();
    cancel(d, &qids);
    d.exec.events.retain(|_, e| e.ctx != ctx);
    let modules: Vec<u64> = d
        .exec
        .modules
        .iter()
        .filter(|(_, m)| m.ctx == ctx)
        .map(|(&id, _)| id)
        .collect();
    d.exec.modules.retain(|id, _| !modules.contains(id));
    d.exec.functions.retain(|_, f| !modules.contains(&f.module));
}

/// A stream is destroyed: its queued work still runs (as on the driver), then its worker ends.
pub(crate) fn close_stream(d: &mut Driver, key: u64) {
    if let Some(qid) = d.exec.keys.remove(&key)
        && let Some(q) = d.exec.queues.get_mut(&qid)
    {
        q.closing = true;
        if !q.worker {
            d.exec.queues.remove(&qid);
        }
    }
    state::notify();
}

/// Poisons the process: the sticky fault, every queue's work discarded, every waiter woken.
fn poison(d: &mut Driver) {
    POISONED.store(true, Ordering::Release);
    let qids: Vec<u64> = d.exec.queues.keys().copied().collect();
    cancel(d, &qids);
}

/// What a worker does next.
enum Step {
    /// Completed a piece of work; look at the next.
    Again,
    /// Nothing to do until the state changes.
    Idle,
    /// Look again after this long.
    Poll(Duration),
    /// Run a host function, without the lock.
    Host(HostFn, usize),
    Exit,
}

fn worker(qid: u64) {
    let mut g = state::lock();
    loop {
        let Some(d) = g.as_mut() else {
            return;
        };
        match step(d, qid) {
            Step::Again => state::notify(),
            Step::Idle => g = state::wait(g, None),
            Step::Poll(t) => g = state::wait(g, Some(t)),
            Step::Host(f, data) => {
                drop(g);
                // SAFETY: the application queued `f` with `data` (cuLaunchHostFunc) to be
                // called exactly so, on a driver thread, in stream order.
                unsafe { f(data as *mut c_void) };
                g = state::lock();
                if let Some(d) = g.as_mut() {
                    finish(d, qid);
                }
                state::notify();
            }
            Step::Exit => {
                d.exec.queues.remove(&qid);
                state::notify();
                return;
            }
        }
    }
}

fn finish(d: &mut Driver, qid: u64) {
    if let Some(q) = d.exec.queues.get_mut(&qid) {
        q.running = false;
        q.completed += 1;
    }
}

/// One step of queue `qid`'s worker, under the lock.
fn step(d: &mut Driver, qid: u64) -> Step {
    let Some(q) = d.exec.queues.get_mut(&qid) else {
        return Step::Exit;
    };
    if q.cancelled {
        return Step::Exit;
    }
    let Some(mut op) = q.ops.pop_front() else {
        return if q.closing { Step::Exit } else { Step::Idle };
    };
    q.running = true;
    let ctx = q.ctx;
    if let Work::Host { f, data } = op.work {
        return Step::Host(f, data);
    }
    let device = d.contexts.ctx_device(ctx).unwrap_or(0);
    let outcome = run(d, device, &mut op);
    match outcome {
        Outcome::Done => {
            finish(d, qid);
            Step::Again
        }
        Outcome::Pending(_) | Outcome::Blocked => {
            if let Some(q) = d.exec.queues.get_mut(&qid) {
                q.running = false;
                q.ops.push_front(op);
            }
            match outcome {
                Outcome::Pending(t) => Step::Poll(t),
                _ => Step::Idle,
            }
        }
        Outcome::Fault => {
            poison(d);
            Step::Exit
        }
    }
}

/// Whether `v` satisfies `cuStreamWaitValue32`'s condition (`flags` without modifier bits).
pub(crate) fn wait_value_met(v: u32, value: u32, flags: u32) -> bool {
    use cuda_abi::stream_wait_value as w;
    match flags & !w::FLUSH {
        w::GEQ => (v.wrapping_sub(value) as i32) >= 0,
        w::EQ => v == value,
        w::AND => v & value != 0,
        _ => !(v | value) != 0,
    }
}

fn run(d: &mut Driver, device: usize, op: &mut Op) -> Outcome {
    let done = |r: Result<(), access::Fault>| match r {
        Ok(()) => Outcome::Done,
        Err(access::Fault) => Outcome::Fault,
    };
    match &op.work {
        Work::Kernel(k) => kernel::run(d, device, k, &mut op.started),
        &Work::Copy {
            dst,
            dst_side,
            src,
            src_side,
            len,
        } => done(access::copy(
            d,
            device,
            (dst, dst_side),
            (src, src_side),
            len,
        )),
        &Work::Memset {
            dst,
            value,
            width,
            count,
        } => done(access::memset(d, device, dst, value, width, count)),
        &Work::WaitEvent { queue, ticket } => {
            if reached(d, queue, ticket) {
                Outcome::Done
            } else {
                Outcome::Blocked
            }
        }
        &Work::WaitValue { addr, value, flags } => match access::read_u32(d, device, addr) {
            Err(access::Fault) => Outcome::Fault,
            Ok(v) if wait_value_met(v, value, flags) => Outcome::Done,
            Ok(_) => Outcome::Pending(POLL),
        },
        &Work::WriteValue { addr, value } => {
            done(access::write(d, device, addr, &value.to_le_bytes()))
        }
        Work::Host { .. } => Outcome::Done,
    }
}

/// The polling interval of memory another party may write, for kernels.
pub(crate) const fn poll_interval() -> Duration {
    POLL
}
