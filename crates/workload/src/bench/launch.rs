//! The launch-bound loop of `cuinterpose-workload bench --launch-threads T`: `T` threads, each on
//! a stream of its own, each issuing `iterations` tiny kernel launches (`cuinterpose_noop`) and
//! as many 4 KiB asynchronous host-to-device copies (from page-locked memory), alternately, then
//! synchronising its stream. Every submission passes the shim's gate, so this is what the gate
//! costs an application bound by launches.
//!
//! The threads start together (a barrier, after each made its stream and buffers); a round's
//! time is the slowest thread's, from the barrier to its stream being idle.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use cuda::owned::{PinnedBuffer, Stream};
use cuda_abi::CUcontext;
use serde_json::{Value, json};

use super::BenchError;
use crate::driver::{Api, CuError, Driver};
use crate::kernels::Kernels;

/// Bytes of each copy.
pub const COPY_BYTES: usize = 4096;

/// `CU_STREAM_NON_BLOCKING`: the threads' streams do not wait for one another through the legacy
/// stream.
const NON_BLOCKING: u32 = 1;

fn report_error(e: &CuError) {
    eprintln!("bench: releasing a stream or buffer: {e}");
}

/// The loaded kernels and the context the threads make current.
pub struct LaunchBench {
    kernels: Arc<Kernels>,
    ctx: Context,
    threads: usize,
    iterations: u64,
}

/// The context handle, handed to the round's threads.
#[derive(Clone, Copy)]
struct Context(CUcontext);

#[allow(unsafe_code)] // a driver handle crossing to the round's threads
// SAFETY: a context handle is a process-wide driver value; the threads only make it current.
unsafe impl Send for Context {}
#[allow(unsafe_code)] // as for `Send`
// SAFETY: as for `Send`: the handle is only read.
unsafe impl Sync for Context {}

impl std::fmt::Debug for LaunchBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchBench")
            .field("threads", &self.threads)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl LaunchBench {
    /// Loads the kernels into the current context.
    pub fn new(d: &Driver, threads: usize, iterations: u64) -> Result<LaunchBench, BenchError> {
        let api = d.api();
        Ok(LaunchBench {
            kernels: Arc::new(Kernels::load(api)?),
            ctx: Context(api.ctx_current()?),
            threads: threads.max(1),
            iterations: iterations.max(1),
        })
    }

    /// One round: `{"launch": {...}}` with the launches per second.
    pub fn round(&self, d: &Driver) -> Result<Value, BenchError> {
        let api = *d.api();
        let start = Barrier::new(self.threads);
        let results: Vec<Result<u128, CuError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.threads)
                .map(|_| {
                    let (kernels, start, ctx) = (&self.kernels, &start, self.ctx);
                    scope.spawn(move || thread_round(api, kernels, ctx, start, self.iterations))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Ok(0)))
                .collect()
        });
        let mut slowest = 0u128;
        for r in results {
            slowest = slowest.max(r?);
        }
        let launches = self.threads as u64 * self.iterations;
        let seconds = slowest as f64 / 1e9;
        Ok(json!({
            "launch": {
                "threads": self.threads,
                "iterations": self.iterations,
                "launches": launches,
                "copies": launches,
                "copy_bytes": COPY_BYTES,
                "elapsed_ns": slowest as f64,
                "ns_per_launch": slowest as f64 / launches as f64,
                "launches_per_s": if seconds > 0.0 { launches as f64 / seconds } else { 0.0 },
            }
        }))
    }
}

/// One thread's part of a round: its stream and buffers, then (after the barrier) the timed
/// launches and copies; the nanoseconds from the barrier to an idle stream.
fn thread_round(
    api: Api,
    kernels: &Kernels,
    ctx: Context,
    start: &Barrier,
    iterations: u64,
) -> Result<u128, CuError> {
    // Wait at the barrier whatever happens, so that the other threads are not left waiting.
    let prepared = (|| {
        api.ctx_make_current(ctx.0)?;
        let stream = Stream::new(&api, NON_BLOCKING, report_error)?;
        let host = PinnedBuffer::new(&api, COPY_BYTES, 0, report_error)?;
        let device = api.mem_alloc(COPY_BYTES)?;
        Ok::<_, CuError>((stream, host, device))
    })();
    start.wait();
    let (stream, mut host, device) = prepared?;
    let t = Instant::now();
    let timed = (|| {
        for _ in 0..iterations {
            kernels.noop(&api, stream.raw())?;
            copy_async(&api, &mut host, device, &stream)?;
        }
        stream.synchronize()
    })();
    let elapsed = t.elapsed().as_nanos();
    if let Err(e) = timed {
        // A copy may still be queued on the stream: keep the buffers rather than free them under it.
        stream.leak();
        host.leak();
        return Err(e);
    }
    api.mem_free(device)?;
    Ok(elapsed)
}

/// `cuMemcpyHtoDAsync` of the whole pinned buffer to `device` on `stream`.
fn copy_async(
    api: &Api,
    host: &mut PinnedBuffer<'_>,
    device: u64,
    stream: &Stream<'_>,
) -> Result<(), CuError> {
    let (src, bytes) = (host.as_mut_ptr(), host.len());
    #[allow(unsafe_code)] // an asynchronous copy: the buffer must outlive it
    // SAFETY: `host` is page-locked memory of `bytes` bytes that is never written after its
    // allocation and is freed (or leaked) only after `stream` has been synchronised, so it stays
    // valid and unchanged until the copy has completed.
    unsafe {
        api.memcpy_htod_async(device, src, bytes, stream.raw())
    }
}
