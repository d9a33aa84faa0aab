//! `cuinterpose-workload bench`: the overhead loops, run in one process on one context.
//!
//! - untracked: `cuCtxSynchronize`, `cuMemsetD8` of 256 bytes and `cuMemcpyHtoD` of 256 bytes on a
//!   `cuMemAlloc` buffer (no kernels, so the same loop runs on the fake driver and a GPU); these
//!   entry points are returned unwrapped by the shim, so their cost must not change with it;
//! - tracked: `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` + `cuMemUnmap` + `cuMemRelease` of one
//!   granule into a reservation made once, with the time of each call.
//!
//! The result is one JSON object; the CLI runs it with and without the shim and prints ratios.

use std::path::PathBuf;
use std::time::Instant;

use cuda_abi::{CUmemAccessDesc, CUmemLocation, access_flags, granularity_flags, handle_type};
use serde_json::{Value, json};

use crate::driver::{self, CuError, Driver, LoadError, Resolve};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The device.
    pub device: i32,
    /// How entry points are resolved.
    pub resolve: Resolve,
    /// The driver library.
    pub library: PathBuf,
    /// Iterations of each untracked loop.
    pub untracked_iterations: u64,
    /// Iterations of the tracked cycle.
    pub tracked_iterations: u64,
    /// Bytes per tracked allocation (rounded up to the granularity; 0: one granule).
    pub size: u64,
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
}

fn per_iteration(total_ns: u128, n: u64) -> f64 {
    total_ns as f64 / n.max(1) as f64
}

/// Runs both loops and returns the report.
pub fn run(options: &BenchOptions) -> Result<Value, BenchError> {
    let d = Driver::load(&options.library, options.resolve)?;
    d.init()?;
    let dev = d.device(options.device)?;
    d.use_primary_context(dev)?;

    let buf = d.malloc(4096)?;
    let host = [0x5au8; 256];
    let warm = (options.untracked_iterations / 10).max(1);
    for _ in 0..warm {
        d.synchronize()?;
        d.memset(buf, 1, 256)?;
        d.copy_to_device(buf, &host)?;
    }
    let n = options.untracked_iterations.max(1);
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
        d.copy_to_device(buf, &host)?;
    }
    d.synchronize()?;
    let copy_ns = per_iteration(t.elapsed().as_nanos(), n);
    d.free(buf)?;

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
    let cycle = |steps: &mut [u128; 5]| -> Result<(), CuError> {
        let t0 = Instant::now();
        let h = d.mem_create(size, &prop)?;
        let t1 = Instant::now();
        d.map(va, size, 0, h)?;
        let t2 = Instant::now();
        d.set_access(va, size, &access)?;
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
        Ok(())
    };
    let mut ignored = [0u128; 5];
    for _ in 0..(options.tracked_iterations / 10).max(1) {
        cycle(&mut ignored)?;
    }
    let m = options.tracked_iterations.max(1);
    let mut steps = [0u128; 5];
    let t = Instant::now();
    for _ in 0..m {
        cycle(&mut steps)?;
    }
    let cycle_ns = per_iteration(t.elapsed().as_nanos(), m);
    d.address_free(va, size)?;

    Ok(json!({
        "bench": "overhead",
        "resolve": options.resolve.as_str(),
        "device": options.device,
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
