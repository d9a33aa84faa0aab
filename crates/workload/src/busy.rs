//! The busy modes: work that keeps the GPU busy on a background thread of the workload and checks
//! its own results every round, as a training loop, a pair of processes spinning on each other's
//! flags, or NCCL ranks would, so that the tool can be shown acting on a process that does not
//! cooperate.
//!
//! - [`LoopSpec`]: kernels over one allocation of the process (iota, add, checksum into a result
//!   buffer of the loop's own, copied back and compared with the host's sum);
//! - [`RingSpec`]: one rank of a ring exchanging through shared memory with spin-flag kernels;
//! - [`NcclSpec`]: one rank of a group of all-reduces through `libnccl.so.2`.
//!
//! Each runs on its own thread, with the process's context made current there and a stream of
//! its own. Rounds count from 1. A round may start only while it is at or below the *hold* (if
//! one is set): a group of ranks is stopped by holding every rank at the same round (each rank
//! completes exactly that many rounds, so none waits for a round its peers never run), then
//! stopping them. A failed driver call ends the thread (a context error is sticky); a wrong result
//! is counted and the rounds go on.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cuda_abi::{CUcontext, CUdeviceptr, CUstream};
use serde_json::{Value, json};

use crate::driver::{Api, CuError};
use crate::kernels::{Kernels, iota_checksum};
use crate::nccl::{Comm, Nccl, NcclError, UNIQUE_ID_BYTES};

/// `CU_STREAM_NON_BLOCKING`: the busy stream does not wait for the legacy stream the command
/// thread's copies use.
const NON_BLOCKING: u32 = 1;

/// The ring's layout in each rank's shared buffer: the ready flag, the ack flag and the data,
/// each at its own offset (flags on separate 256-byte lines).
pub const RING_READY: u64 = 0;
/// See [`RING_READY`].
pub const RING_ACK: u64 = 256;
/// See [`RING_READY`].
pub const RING_DATA: u64 = 512;

/// What went wrong in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The round (from 1; 0: setting up).
    pub round: u64,
    /// What was being done or checked.
    pub what: String,
    /// The driver's name of the error, for a failed driver call.
    pub error: Option<String>,
    /// The failed call.
    pub call: Option<String>,
    /// The expected and the actual value, for a wrong result.
    pub expected: Option<u64>,
    /// See `expected`.
    pub actual: Option<u64>,
}

impl Failure {
    fn driver(api: &Api, round: u64, what: &str, e: CuError) -> Failure {
        Failure {
            round,
            what: what.to_owned(),
            error: Some(api.error_name(e.result)),
            call: Some(e.call.to_owned()),
            expected: None,
            actual: None,
        }
    }

    fn nccl(round: u64, what: &str, e: NcclError) -> Failure {
        let call = match &e {
            NcclError::Call { call, .. } => Some((*call).to_owned()),
            NcclError::Load { .. } => None,
        };
        Failure {
            round,
            what: format!("{what}: {e}"),
            error: Some(e.to_string()),
            call,
            expected: None,
            actual: None,
        }
    }

    fn mismatch(round: u64, what: String, expected: u64, actual: u64) -> Failure {
        Failure {
            round,
            what,
            error: None,
            call: None,
            expected: Some(expected),
            actual: Some(actual),
        }
    }

    /// Whether the failure ends the rounds (a failed call: the context's error is sticky, or
    /// the communicator is unusable).
    fn is_fatal(&self) -> bool {
        self.error.is_some()
    }

    /// The failure as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "round": self.round,
            "what": self.what,
            "error": self.error,
            "call": self.call,
            "expected": self.expected,
            "actual": self.actual,
        })
    }
}

/// The counters a busy thread shares with the command thread.
#[derive(Debug, Default, Clone)]
pub struct Counters {
    /// The last round started.
    pub started: u64,
    /// Rounds completed without a failure.
    pub passed: u64,
    /// Rounds that failed.
    pub failures: u64,
    /// The first failure.
    pub first_failure: Option<Failure>,
    /// The hold: no round above it starts.
    pub hold: Option<u64>,
    /// Whether the thread waits at the hold.
    pub holding: bool,
    /// Whether a stop was asked for.
    pub stop: bool,
    /// Whether the thread has ended.
    pub finished: bool,
}

impl Counters {
    /// The counters as JSON fields of a reply.
    pub fn to_json(&self) -> Value {
        json!({
            "started": self.started,
            "iterations": self.passed + self.failures,
            "passed": self.passed,
            "failures": self.failures,
            "first_failure": self.first_failure.as_ref().map(Failure::to_json),
            "hold": self.hold,
            "holding": self.holding,
            "finished": self.finished,
        })
    }
}

#[derive(Debug, Default)]
struct Progress {
    counters: Mutex<Counters>,
    changed: Condvar,
}

impl Progress {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until round `round` may start; `false` when the thread is to stop instead.
    fn may_start(&self, round: u64) -> bool {
        let mut c = self.lock();
        loop {
            if c.stop {
                return false;
            }
            if c.hold.is_none_or(|h| round <= h) {
                c.holding = false;
                c.started = round;
                return true;
            }
            if !c.holding {
                c.holding = true;
                self.changed.notify_all();
            }
            c = self.changed.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn record(&self, outcome: Result<(), Failure>) -> bool {
        let mut c = self.lock();
        let fatal = match outcome {
            Ok(()) => {
                c.passed += 1;
                false
            }
            Err(f) => {
                c.failures += 1;
                let fatal = f.is_fatal();
                c.first_failure.get_or_insert(f);
                fatal
            }
        };
        self.changed.notify_all();
        fatal
    }
}

/// The work of one round, on the busy thread.
trait Rounds: Send {
    /// Sets up on the busy thread (streams, buffers, communicators).
    fn setup(&mut self) -> Result<(), Failure>;
    /// Runs and checks round `round`.
    fn round(&mut self, round: u64) -> Result<(), Failure>;
    /// Frees what setup made (after the last round; errors are ignored: the context may hold a
    /// sticky error).
    fn teardown(&mut self);
}

/// A busy thread.
#[derive(Debug)]
pub struct Busy {
    kind: &'static str,
    progress: Arc<Progress>,
    thread: Option<JoinHandle<()>>,
}

impl Busy {
    fn start(
        kind: &'static str,
        api: Api,
        ctx: CUcontext,
        mut work: Box<dyn Rounds>,
    ) -> std::io::Result<Busy> {
        let progress = Arc::new(Progress::default());
        let shared = Arc::clone(&progress);
        let ctx = SendContext(ctx);
        let thread = std::thread::Builder::new()
            .name(format!("busy-{kind}"))
            .spawn(move || {
                let ctx = ctx;
                let setup = api
                    .ctx_make_current(ctx.0)
                    .map_err(|e| Failure::driver(&api, 0, "making the context current", e))
                    .and_then(|()| work.setup());
                if let Err(f) = setup {
                    shared.record(Err(f));
                } else {
                    let mut round = 1;
                    while shared.may_start(round) {
                        if shared.record(work.round(round)) {
                            break;
                        }
                        round += 1;
                    }
                }
                work.teardown();
                shared.lock().finished = true;
                shared.changed.notify_all();
            })?;
        Ok(Busy {
            kind,
            progress,
            thread: Some(thread),
        })
    }

    /// The mode: `loop`, `ring` or `nccl`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// A copy of the counters.
    pub fn counters(&self) -> Counters {
        self.progress.lock().clone()
    }

    /// Holds the thread at `round`, or at the round it has started if that is higher; returns the
    /// hold.
    pub fn hold(&self, round: u64) -> u64 {
        let mut c = self.progress.lock();
        let hold = round.max(c.started);
        c.hold = Some(hold);
        self.progress.changed.notify_all();
        hold
    }

    /// Lifts the hold.
    pub fn release(&self) {
        self.progress.lock().hold = None;
        self.progress.changed.notify_all();
    }

    /// Waits until the thread has completed round `round` (or ended), at most `timeout`.
    pub fn wait_round(&self, round: u64, timeout: Duration) -> Counters {
        let deadline = Instant::now() + timeout;
        let mut c = self.progress.lock();
        while c.passed + c.failures < round && !c.finished {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            c = self
                .progress
                .changed
                .wait_timeout(c, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        c.clone()
    }

    /// Asks the thread to stop before its next round and waits for it, at most `timeout`:
    /// `Ok` with the final counters once it has ended, `Err` with the current ones if it has not
    /// (a round waiting for a peer that never comes; the thread is left running).
    pub fn stop(&mut self, timeout: Duration) -> Result<Counters, Box<Counters>> {
        let deadline = Instant::now() + timeout;
        {
            let mut c = self.progress.lock();
            c.stop = true;
            self.progress.changed.notify_all();
            while !c.finished {
                let now = Instant::now();
                if now >= deadline {
                    return Err(Box::new(c.clone()));
                }
                c = self
                    .progress
                    .changed
                    .wait_timeout(c, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        Ok(self.counters())
    }
}

/// The context handle, moved to the busy thread.
struct SendContext(CUcontext);

#[allow(unsafe_code)] // a driver handle crossing to the busy thread
// SAFETY: a context handle is a process-wide driver value; the busy thread only makes it current.
unsafe impl Send for SendContext {}

/// The start of the iota of `rank` in `round`: distinct per rank and round.
pub fn data_start(rank: u32, round: u64) -> u32 {
    rank.wrapping_mul(0x9E37_79B9) ^ (round as u32).wrapping_mul(0x85EB_CA6B)
}

/// A stream, a result word and the kernels: what every mode's thread holds.
struct Device {
    api: Api,
    kernels: Arc<Kernels>,
    stream: CUstream,
    result: CUdeviceptr,
}

#[allow(unsafe_code)] // a driver handle crossing to the busy thread
// SAFETY: the stream and the result buffer are driver handles and device addresses of this
// process, used only by the busy thread that owns the `Device`.
unsafe impl Send for Device {}

impl Device {
    fn new(api: Api, kernels: Arc<Kernels>) -> Device {
        Device {
            api,
            kernels,
            stream: std::ptr::null_mut(),
            result: 0,
        }
    }

    fn setup(&mut self) -> Result<(), Failure> {
        let api = self.api;
        self.stream = api
            .stream_create(NON_BLOCKING)
            .map_err(|e| Failure::driver(&api, 0, "creating the stream", e))?;
        self.result = api
            .mem_alloc(8)
            .map_err(|e| Failure::driver(&api, 0, "allocating the result word", e))?;
        Ok(())
    }

    fn teardown(&mut self) {
        if !self.stream.is_null() {
            let _ = self.api.stream_synchronize(self.stream);
            let _ = self.api.stream_destroy(self.stream);
            self.stream = std::ptr::null_mut();
        }
        if self.result != 0 {
            let _ = self.api.mem_free(self.result);
            self.result = 0;
        }
    }

    fn fail(&self, round: u64, what: &str) -> impl FnOnce(CuError) -> Failure {
        let api = self.api;
        move |e| Failure::driver(&api, round, what, e)
    }

    /// Synchronises the stream and reads the result word.
    fn result_word(&self, round: u64) -> Result<u64, Failure> {
        self.api
            .stream_synchronize(self.stream)
            .map_err(self.fail(round, "waiting for the round's kernels"))?;
        let mut word = [0u8; 8];
        self.api
            .memcpy_dtoh(&mut word, self.result)
            .map_err(self.fail(round, "copying the checksum back"))?;
        Ok(u64::from_le_bytes(word))
    }
}

/// A loop of kernels over `elements` u32 of the allocation at `base`.
#[derive(Debug, Clone, Copy)]
pub struct LoopSpec {
    /// The allocation (the caller's; the loop does not own it).
    pub base: CUdeviceptr,
    /// Elements (u32) the kernels cover.
    pub elements: u64,
}

struct LoopRounds {
    spec: LoopSpec,
    device: Device,
}

impl Rounds for LoopRounds {
    fn setup(&mut self) -> Result<(), Failure> {
        self.device.setup()
    }

    fn round(&mut self, round: u64) -> Result<(), Failure> {
        let d = &self.device;
        let (api, k, s) = (&d.api, &d.kernels, d.stream);
        let LoopSpec { base, elements } = self.spec;
        let start = data_start(0x5eed, round);
        let addend = round as u32;
        k.iota_u32(api, s, base, elements, start)
            .map_err(d.fail(round, "launching iota"))?;
        k.add_u32(api, s, base, base, elements, addend)
            .map_err(d.fail(round, "launching add"))?;
        k.checksum_u32(api, s, base, elements, d.result)
            .map_err(d.fail(round, "launching checksum"))?;
        let actual = d.result_word(round)?;
        let expected = iota_checksum(start.wrapping_add(addend), elements);
        if actual != expected {
            return Err(Failure::mismatch(
                round,
                "checksum of the loop's buffer".into(),
                expected,
                actual,
            ));
        }
        Ok(())
    }

    fn teardown(&mut self) {
        self.device.teardown();
    }
}

/// One rank of a ring. Each round `k`: wait until the successor has acknowledged round `k - 1`
/// (its ack flag in this rank's buffer), write this rank's data and set the ready flag to `k`,
/// spin until the predecessor's ready flag reaches `k`, checksum its data and compare with the
/// host's sum, and set the predecessor's ack flag to `k`. Every wait is a spin kernel on the
/// device, so a rank's stream really waits for its peers' launches.
#[derive(Debug, Clone, Copy)]
pub struct RingSpec {
    /// This rank's buffer, as this rank writes it (a multicast address broadcasts).
    pub mine: CUdeviceptr,
    /// This rank's buffer, as it reads its ack flag.
    pub mine_read: CUdeviceptr,
    /// The predecessor's buffer, as this rank reads it.
    pub prev: CUdeviceptr,
    /// The predecessor's buffer, as this rank writes its ack flag.
    pub prev_write: CUdeviceptr,
    /// This rank's number (its data's seed).
    pub rank: u32,
    /// The predecessor's number.
    pub prev_rank: u32,
    /// Elements (u32) of data per round.
    pub elements: u64,
}

struct RingRounds {
    spec: RingSpec,
    device: Device,
}

impl Rounds for RingRounds {
    fn setup(&mut self) -> Result<(), Failure> {
        self.device.setup()
    }

    fn round(&mut self, round: u64) -> Result<(), Failure> {
        let d = &self.device;
        let (api, k, s) = (&d.api, &d.kernels, d.stream);
        let r = self.spec;
        let flag = round as u32;
        if round > 1 {
            k.spin_until_u32(api, s, r.mine_read + RING_ACK, flag - 1)
                .map_err(d.fail(round, "launching the wait for the successor's ack"))?;
        }
        let start = data_start(r.rank, round);
        k.iota_u32(api, s, r.mine + RING_DATA, r.elements, start)
            .map_err(d.fail(round, "launching iota"))?;
        k.set_u32(api, s, r.mine + RING_READY, flag)
            .map_err(d.fail(round, "launching the ready flag"))?;
        k.spin_until_u32(api, s, r.prev + RING_READY, flag)
            .map_err(d.fail(round, "launching the wait for the predecessor"))?;
        k.checksum_u32(api, s, r.prev + RING_DATA, r.elements, d.result)
            .map_err(d.fail(round, "launching checksum"))?;
        k.set_u32(api, s, r.prev_write + RING_ACK, flag)
            .map_err(d.fail(round, "launching the ack flag"))?;
        let actual = d.result_word(round)?;
        let expected = iota_checksum(data_start(r.prev_rank, round), r.elements);
        if actual != expected {
            return Err(Failure::mismatch(
                round,
                format!("checksum of rank {}'s data", r.prev_rank),
                expected,
                actual,
            ));
        }
        Ok(())
    }

    fn teardown(&mut self) {
        self.device.teardown();
    }
}

/// One rank of a group of all-reduces: each round fills its send buffer with its iota, all-reduces
/// (sum of u32) into its receive buffer, copies it back and compares every element with the sum
/// of every rank's iota.
#[derive(Debug, Clone, Copy)]
pub struct NcclSpec {
    /// The communicator's id (from rank 0's `ncclGetUniqueId`).
    pub id: [u8; UNIQUE_ID_BYTES],
    /// Ranks in the communicator.
    pub ranks: u32,
    /// This rank.
    pub rank: u32,
    /// Elements (u32) per all-reduce.
    pub elements: u64,
}

struct NcclRounds {
    spec: NcclSpec,
    nccl: Arc<Nccl>,
    device: Device,
    comm: Comm,
    send: CUdeviceptr,
    recv: CUdeviceptr,
}

#[allow(unsafe_code)] // a driver handle crossing to the busy thread
// SAFETY: the communicator and the buffers are used by the owning busy thread only.
unsafe impl Send for NcclRounds {}

impl NcclRounds {
    /// The sum every rank's receive buffer holds at element `i` in `round`.
    fn expected(&self, round: u64, i: u64) -> u32 {
        (0..self.spec.ranks).fold(0u32, |sum, r| {
            sum.wrapping_add(data_start(r, round).wrapping_add(i as u32))
        })
    }
}

impl Rounds for NcclRounds {
    fn setup(&mut self) -> Result<(), Failure> {
        self.device.setup()?;
        let api = self.device.api;
        let bytes = (self.spec.elements * 4) as usize;
        self.send = api
            .mem_alloc(bytes)
            .map_err(|e| Failure::driver(&api, 0, "allocating the send buffer", e))?;
        self.recv = api
            .mem_alloc(bytes)
            .map_err(|e| Failure::driver(&api, 0, "allocating the receive buffer", e))?;
        let (ranks, rank) = (self.spec.ranks as i32, self.spec.rank as i32);
        self.comm = self
            .nccl
            .comm_init_rank(ranks, &self.spec.id, rank)
            .map_err(|e| Failure::nccl(0, "joining the communicator", e))?;
        Ok(())
    }

    fn round(&mut self, round: u64) -> Result<(), Failure> {
        let d = &self.device;
        let (api, k, s) = (&d.api, &d.kernels, d.stream);
        let n = self.spec.elements;
        k.iota_u32(api, s, self.send, n, data_start(self.spec.rank, round))
            .map_err(d.fail(round, "launching iota"))?;
        self.nccl
            .all_reduce_sum_u32(self.send, self.recv, n as usize, self.comm, s)
            .map_err(|e| Failure::nccl(round, "enqueueing the all-reduce", e))?;
        api.stream_synchronize(s)
            .map_err(d.fail(round, "waiting for the all-reduce"))?;
        let mut host = vec![0u8; (n * 4) as usize];
        api.memcpy_dtoh(&mut host, self.recv)
            .map_err(d.fail(round, "copying the result back"))?;
        for (i, chunk) in host.chunks_exact(4).enumerate() {
            let actual = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let expected = self.expected(round, i as u64);
            if actual != expected {
                return Err(Failure::mismatch(
                    round,
                    format!("element {i} of the all-reduce"),
                    u64::from(expected),
                    u64::from(actual),
                ));
            }
        }
        Ok(())
    }

    fn teardown(&mut self) {
        if !self.comm.is_null() {
            // Only after the stream is idle: the communicator's kernels may still run.
            let _ = self.device.api.stream_synchronize(self.device.stream);
            let _ = self.nccl.comm_destroy(self.comm);
            self.comm = std::ptr::null_mut();
        }
        for buffer in [&mut self.send, &mut self.recv] {
            if *buffer != 0 {
                let _ = self.device.api.mem_free(*buffer);
                *buffer = 0;
            }
        }
        self.device.teardown();
    }
}

/// Starts a loop (see [`LoopSpec`]) on a new thread in context `ctx`.
pub fn start_loop(
    api: Api,
    kernels: Arc<Kernels>,
    ctx: CUcontext,
    spec: LoopSpec,
) -> std::io::Result<Busy> {
    let device = Device::new(api, kernels);
    Busy::start("loop", api, ctx, Box::new(LoopRounds { spec, device }))
}

/// Starts a ring rank (see [`RingSpec`]) on a new thread in context `ctx`.
pub fn start_ring(
    api: Api,
    kernels: Arc<Kernels>,
    ctx: CUcontext,
    spec: RingSpec,
) -> std::io::Result<Busy> {
    let device = Device::new(api, kernels);
    Busy::start("ring", api, ctx, Box::new(RingRounds { spec, device }))
}

/// Starts an all-reduce rank (see [`NcclSpec`]) on a new thread in context `ctx`.
pub fn start_nccl(
    api: Api,
    kernels: Arc<Kernels>,
    nccl: Arc<Nccl>,
    ctx: CUcontext,
    spec: NcclSpec,
) -> std::io::Result<Busy> {
    let rounds = NcclRounds {
        spec,
        nccl,
        device: Device::new(api, kernels),
        comm: std::ptr::null_mut(),
        send: 0,
        recv: 0,
    };
    Busy::start("nccl", api, ctx, Box::new(rounds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_differs_per_rank_and_round() {
        assert_ne!(data_start(0, 1), data_start(1, 1));
        assert_ne!(data_start(0, 1), data_start(0, 2));
    }

    #[test]
    fn a_hold_stops_rounds_above_it_and_a_stop_ends_the_wait() {
        let progress = Arc::new(Progress::default());
        progress.lock().hold = Some(2);
        assert!(progress.may_start(1));
        assert!(progress.may_start(2));
        let waiting = Arc::clone(&progress);
        let t = std::thread::spawn(move || waiting.may_start(3));
        while !progress.lock().holding {
            std::thread::yield_now();
        }
        progress.lock().stop = true;
        progress.changed.notify_all();
        assert!(!t.join().unwrap());
        assert_eq!(progress.lock().started, 2);
    }

    #[test]
    fn a_failed_call_is_fatal_and_a_mismatch_is_not() {
        let progress = Progress::default();
        assert!(!progress.record(Err(Failure::mismatch(1, "x".into(), 1, 2))));
        let call = Failure {
            error: Some("CUDA_ERROR_ILLEGAL_ADDRESS".into()),
            ..Failure::mismatch(2, "y".into(), 0, 0)
        };
        assert!(progress.record(Err(call)));
        let c = progress.lock();
        assert_eq!(c.failures, 2);
        assert_eq!(c.first_failure.as_ref().map(|f| f.round), Some(1));
    }
}
