//! What `cuinterpose demo` and `cuinterpose bench` run: groups of workloads
//! (`cuinterpose-workload`) that share GPU memory, suspended and resumed in place or checkpointed
//! to disk and restored, checked and timed. Each run returns a report; the tool (crates/cli)
//! parses the verbs' arguments and prints the reports.
//!
//! - [`demo`]: the demo's three runs (in place, multicast, through disk) and their reports;
//! - [`bench`]: the benchmark's parts (overhead, capture, whole process, to disk, launch-bound)
//!   and their reports;
//! - [`target`]: the driver both run on (a GPU's, else the bundled fake) and the programs they
//!   start;
//! - [`group`]: the ring of shared memory both build, and the process tree of the runs through
//!   disk.
//!
//! Runs start `cuinterpose run` and `cuinterpose carrier-helper` from their own executable, so they
//! run inside the `cuinterpose` binary.

#![forbid(unsafe_code)]

pub mod bench;
pub mod demo;
pub mod group;
pub mod target;

/// `1.50 GiB`, `12.0 MiB`, `512 B`: sizes in the lines of `verified`, in error messages, and in
/// the tool's tables (`cli`'s output uses this one).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Bytes per second over a time in milliseconds, in GB/s (0 for no time).
fn gb_per_s(bytes: u64, millis: f64) -> f64 {
    if millis > 0.0 {
        bytes as f64 / millis / 1e6
    } else {
        0.0
    }
}
