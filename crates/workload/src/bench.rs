//! `cuinterpose-workload bench`: the overhead loops, run in one process on one context.
//!
//! - untracked: `cuCtxSynchronize`, `cuMemsetD8` of 256 bytes and `cuMemcpyHtoD` of 256 bytes on a
//!   `cuMemAlloc` buffer (no kernels, so the same loop runs on every driver); these entry points are
//!   returned unwrapped by the shim, so their cost must not change with it;
//! - tracked: `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` + `cuMemUnmap` + `cuMemRelease` of one
//!   granule into a reservation made once, with the time of each call.
//!
//! - launch-bound (`--launch-threads T`, module [`launch`]): `T` threads each issuing tiny kernel
//!   launches and 4 KiB asynchronous copies on a stream of its own; a round runs only this loop.
//!
//! One round runs both loops; a first round is run and discarded before any is reported (the
//! driver's and the shim's start-up, caches, clocks). Without `--rounds` the result is one JSON
//! object; with `--rounds`, the process answers `round` lines on stdin with one JSON line each,
//! so that the tool can alternate rounds of a process with the shim and one without it (each
//! process stays warm; a slow phase of the machine hits both alike).
//!
//! What is held equal between the two processes, since only the shim may differ: the host buffer
//! of the copies is page-aligned on the heap (on the stack its alignment would move with the size
//! of the environment, which `LD_PRELOAD` changes), and with `--cpu` the measuring thread is pinned
//! to one CPU once the driver is initialised (the tool gives both processes the same one).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use cuda_abi::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemLocation, access_flags,
    granularity_flags, handle_type,
};
use serde_json::{Value, json};

use crate::driver::{self, CuError, Driver, LoadError, Resolve};

pub mod launch;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The device.
    pub device: i32,
    /// How entry points are resolved.
    pub resolve: Resolve,
    /// The driver library.
    pub library: PathBuf,
    /// Iterations of each untracked loop per round.
    pub untracked_iterations: u64,
    /// Iterations of the tracked cycle per round.
    pub tracked_iterations: u64,
    /// Bytes per tracked allocation (rounded up to the granularity; 0: one granule).
    pub size: u64,
    /// The CPU the measuring thread is pinned to, if any.
    pub cpu: Option<usize>,
    /// Threads of the launch-bound loop; `Some`: each round runs that loop instead of the
    /// overhead loops (`untracked_iterations` launches and copies per thread).
    pub launch_threads: Option<usize>,
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The driver could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] CuError),
    /// Pinning the thread, or the round protocol on stdin and stdout, failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

fn per_iteration(total_ns: u128, n: u64) -> f64 {
    total_ns as f64 / n.max(1) as f64
}

/// The source of the host-to-device copies, page-aligned (see the module comment).
#[repr(C, align(4096))]
struct HostBuffer([u8; 256]);

/// A warmed-up benchmark: the driver, the copy buffers and the tracked cycle's reservation.
pub struct Bench {
    d: Driver,
    options: BenchOptions,
    buf: CUdeviceptr,
    host: Box<HostBuffer>,
    prop: CUmemAllocationProp,
    size: u64,
    va: CUdeviceptr,
    access: [CUmemAccessDesc; 1],
    launch: Option<launch::LaunchBench>,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench")
            .field("options", &self.options)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Bench {
    /// Loads the driver, pins the thread (`options.cpu`), makes the buffers and the reservation,
    /// and runs one round that is not reported.
    pub fn start(options: &BenchOptions) -> Result<Bench, BenchError> {
        let d = Driver::load(&options.library, options.resolve)?;
        d.init()?;
        let dev = d.device(options.device)?;
        d.use_primary_context(dev)?;
        // Pinned only now: the threads the driver and the shim start at initialisation inherit
        // the mask of the thread that starts them, and must not compete for the measuring CPU.
        if let Some(cpu) = options.cpu {
            let mut set = rustix::thread::CpuSet::new();
            set.set(cpu);
            rustix::thread::sched_setaffinity(None, &set).map_err(|e| BenchError::Io {
                what: "pinning the measuring thread (--cpu)",
                source: e.into(),
            })?;
        }
        let buf = d.malloc(4096)?;
        let prop = driver::device_prop(options.device, handle_type::POSIX_FILE_DESCRIPTOR);
        let g = d.granularity(&prop, granularity_flags::MINIMUM)?.max(1);
        let size = options.size.max(1).div_ceil(g) * g;
        let va = d.address_reserve(size, 0, 0)?;
        let access = [CUmemAccessDesc {
            location: CUmemLocation {
                type_: cuda_abi::location_type::DEVICE,
                id: options.device,
            },
            flags: access_flags::PROT_READWRITE,
        }];
        let launch = match options.launch_threads {
            Some(threads) => Some(launch::LaunchBench::new(
                &d,
                threads,
                options.untracked_iterations,
            )?),
            None => None,
        };
        let bench = Bench {
            launch,
            d,
            options: options.clone(),
            buf,
            host: Box::new(HostBuffer([0x5a; 256])),
            prop,
            size,
            va,
            access,
        };
        bench.round()?;
        Ok(bench)
    }

    /// One round: both loops, as `{"untracked": {...}, "tracked": {...}}` (ns per iteration).
    pub fn round(&self) -> Result<Value, BenchError> {
        if let Some(launch) = &self.launch {
            return launch.round(&self.d);
        }
        let (d, buf, host) = (&self.d, self.buf, &self.host.0);
        let n = self.options.untracked_iterations.max(1);
        let t = Instant::now();
        for _ in 0..n {
            d.synchronize()?;
        }
        let sync_ns = per_iteration(t.elapsed().as_nanos(), n);
        let t = Instant::now();
        for _ in 0..n {
            d.memset(buf, 1, 256)?;
        }
        d.synchronize()?;
        let memset_ns = per_iteration(t.elapsed().as_nanos(), n);
        let t = Instant::now();
        for _ in 0..n {
            d.copy_to_device(buf, host)?;
        }
        d.synchronize()?;
        let copy_ns = per_iteration(t.elapsed().as_nanos(), n);

        let (size, va) = (self.size, self.va);
        let m = self.options.tracked_iterations.max(1);
        let mut steps = [0u128; 5];
        let t = Instant::now();
        for _ in 0..m {
            let t0 = Instant::now();
            let h = d.mem_create(size, &self.prop)?;
            let t1 = Instant::now();
            d.map(va, size, 0, h)?;
            let t2 = Instant::now();
            d.set_access(va, size, &self.access)?;
            let t3 = Instant::now();
            d.unmap(va, size)?;
            let t4 = Instant::now();
            d.mem_release(h)?;
            let t5 = Instant::now();
            for (slot, (a, b)) in
                steps
                    .iter_mut()
                    .zip([(t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)])
            {
                *slot += (b - a).as_nanos();
            }
        }
        let cycle_ns = per_iteration(t.elapsed().as_nanos(), m);
        Ok(json!({
            "untracked": {
                "iterations": n,
                "ctx_synchronize_ns": sync_ns,
                "memset_d8_256_ns": memset_ns,
                "memcpy_htod_256_ns": copy_ns,
            },
            "tracked": {
                "iterations": m,
                "size": size,
                "cycle_ns": cycle_ns,
                "create_ns": per_iteration(steps[0], m),
                "map_ns": per_iteration(steps[1], m),
                "set_access_ns": per_iteration(steps[2], m),
                "unmap_ns": per_iteration(steps[3], m),
                "release_ns": per_iteration(steps[4], m),
            },
        }))
    }

    /// A round with what ran it: `bench`, `resolve`, `device` and `cpu` beside its figures.
    pub fn report(&self, mut round: Value) -> Value {
        round["bench"] = json!(if self.launch.is_some() {
            "launch"
        } else {
            "overhead"
        });
        round["resolve"] = json!(self.options.resolve.as_str());
        round["device"] = json!(self.options.device);
        round["cpu"] = json!(self.options.cpu);
        round
    }

    /// Frees the buffer and the reservation.
    pub fn finish(self) -> Result<(), BenchError> {
        self.d.free(self.buf)?;
        self.d.address_free(self.va, self.size)?;
        Ok(())
    }
}

/// Runs one reported round and returns its report.
pub fn run(options: &BenchOptions) -> Result<Value, BenchError> {
    let bench = Bench::start(options)?;
    let report = bench.report(bench.round()?);
    bench.finish()?;
    Ok(report)
}

/// The line a process in round mode prints once warmed up, before it reads any command.
pub const READY: &str = "ready";

/// Round mode: prints [`READY`], then answers each `round` line of `input` with one report line
/// (a JSON object) on `output`, until `exit` or the end of `input`.
pub fn serve_rounds(
    options: &BenchOptions,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<(), BenchError> {
    let io = |what| move |source| BenchError::Io { what, source };
    let bench = Bench::start(options)?;
    writeln!(output, "{READY}")
        .and_then(|()| output.flush())
        .map_err(io("writing to stdout"))?;
    for line in input.lines() {
        match line.map_err(io("reading stdin"))?.trim() {
            "round" => {
                let report = bench.report(bench.round()?);
                writeln!(output, "{report}")
                    .and_then(|()| output.flush())
                    .map_err(io("writing to stdout"))?;
            }
            "exit" => break,
            other => {
                return Err(BenchError::Io {
                    what: "reading stdin",
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("unknown command {other:?} (round or exit)"),
                    ),
                });
            }
        }
    }
    bench.finish()
}

/// The CPU to pin both processes of a comparison to when none is named: the lowest this process
/// may run on, other than CPU 0 when there is another (CPU 0 takes most of a machine's interrupts
/// and housekeeping). `None` when the affinity cannot be read.
pub fn default_cpu() -> Option<usize> {
    let allowed = rustix::thread::sched_getaffinity(None).ok()?;
    let mut cpus = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
    let first = cpus.next()?;
    Some(if first == 0 {
        cpus.next().unwrap_or(0)
    } else {
        first
    })
}
