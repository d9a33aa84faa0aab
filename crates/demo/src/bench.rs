//! `cuinterpose bench`: what the interposer costs and how fast a suspend and resume move bytes.
//!
//! 1. Overhead ([`Bench::overhead`]): `repetitions` pairs of `cuinterpose-workload bench
//!    --serve-rounds` processes, one without and one with the shim, both pinned to the same CPU
//!    and warmed up, run `rounds` rounds in alternation (one process at a time; which goes first
//!    swaps every round, so that neither side always runs second): a loop of untracked calls
//!    (`cuCtxSynchronize`, a 256-byte `cuMemsetD8` and `cuMemcpyHtoD`; the shim returns these
//!    unwrapped, so an untracked call reaches the driver's own function and what remains is the
//!    machine's noise) and a loop of tracked create/map/set-access/unmap/release cycles. Each
//!    ratio is the median of the rounds' ratios (shim/no-shim, each pair of rounds back to back),
//!    with their spread (10th and 90th percentiles, lowest and highest). Long-lived processes and
//!    short alternating rounds are what make the figure stable: separate processes per run
//!    differ by their placement (CPU, clocks, memory) by more than the shim could cost.
//! 2. Capture ([`Bench::capture`]): a ring group under the shim sharing `size` bytes in all,
//!    suspended and resumed `cycles` times in place (the second cycle reuses the carriers), with
//!    every phase timed and each shim's copy statistics (copy, pinning, carrier first touch) from
//!    its answers to Save and Load; contents verified after the last resume. In the same run, one
//!    process without the shim holding a filled `cuMemAlloc` of the same size, natively locked and
//!    checkpointed, then restored and unlocked, timed; contents verified. The speed-up compares
//!    bytes per second of suspend+resume with native checkpoint+restore.
//! 3. Whole process ([`Bench::whole`]): one process's `cuMemAlloc` memory, plainly and with
//!    `--keep-contexts`, against native.
//! 4. To disk ([`Bench::to_disk`]): checkpoint and restore of a ring group to a directory next to
//!    the directory's own rates.
//! 5. Launch-bound ([`Bench::launch`]): kernel launches per second with and without the shim.
//!
//! Figures only: nothing here passes or fails on a time.

mod capture;
mod disk;
mod overhead;
mod whole;

pub use disk::{DiskBench, PhaseRatio, SecondCheckpoint};

use crate::target::Target;
use anyhow::Context;
use control::capture::{PhaseTiming, Progress, Report};
use control::carrier_choice::Requested;
use control::config::ToolConfig;
use protocol::message::{CarrierMode, CopyStats};
use std::path::Path;
use std::time::Duration;

/// Bound on each workload command: filling and verifying many GiB takes a while.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// Allocations are rounded to this (the usual VMM granularity).
const GRANULE: u64 = 2 << 20;

/// What the benchmark's parts run with (`cuinterpose bench`'s options of the same names).
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Bytes the group shares in all (default: 8 GiB on a GPU, 256 MiB on the fake driver).
    pub size: Option<u64>,
    /// Processes in the group.
    pub processes: usize,
    /// Suspend/resume cycles of the same group.
    pub cycles: usize,
    /// Iterations of each untracked loop per overhead round.
    pub iterations: u64,
    /// Iterations of the tracked cycle per overhead round.
    pub tracked_iterations: u64,
    /// Pairs of overhead (and launch-bound) processes.
    pub repetitions: usize,
    /// Alternating rounds per pair.
    pub rounds: usize,
    /// The CPU both overhead processes are pinned to (default: workload::bench::default_cpu).
    pub cpu: Option<usize>,
    /// Bytes the whole-process case holds (default: 16 GiB on a GPU, 64 MiB on the fake driver).
    pub whole_size: Option<u64>,
    /// Where every suspend leaves the group's bytes.
    pub carrier: Requested,
    /// Threads of each launch-bound process.
    pub launch_threads: usize,
    /// Launches per thread per launch-bound round.
    pub launch_iterations: u64,
}

impl BenchOptions {
    /// The bytes the capture and disk groups share in all.
    fn shared_size(&self, on_gpu: bool) -> u64 {
        self.size
            .unwrap_or(if on_gpu { 8 << 30 } else { 256 << 20 })
    }
}

/// The benchmark on its driver; each part is run on its own.
#[derive(Debug)]
pub struct Bench {
    options: BenchOptions,
    target: Target,
    /// The driver, as the report names it.
    pub driver_name: String,
}

impl Bench {
    /// Picks the driver: a GPU's unless `fake` or there is none, else the bundled fake.
    pub fn new(options: BenchOptions, fake: bool) -> anyhow::Result<Bench> {
        let target = Target::pick(fake)?;
        let driver_name = if target.on_gpu {
            format!(
                "GPU ({}, driver API {})",
                target.driver.path().display(),
                target.driver.version()
            )
        } else {
            format!("fake driver ({})", target.driver.path().display())
        };
        Ok(Bench {
            options,
            target,
            driver_name,
        })
    }

    /// Whether it runs on a GPU's driver rather than the bundled fake.
    pub fn on_gpu(&self) -> bool {
        self.target.on_gpu
    }

    /// The overhead of the shim on untracked calls and on the tracked cycle.
    pub fn overhead(&self) -> anyhow::Result<Overhead> {
        overhead::overhead(&self.target.programs, &self.options).context("overhead benchmark")
    }

    /// The launch-bound case.
    pub fn launch(&self) -> anyhow::Result<Launch> {
        overhead::launch(&self.target.programs, &self.options).context("launch-bound benchmark")
    }

    /// The capture cycles and their native baseline; `progress` sees every phase.
    pub fn capture(&self, config: &ToolConfig, progress: &dyn Progress) -> anyhow::Result<Capture> {
        capture::capture(&self.target, &self.options, config, progress).context("capture benchmark")
    }

    /// The whole-process case.
    pub fn whole(&self, config: &ToolConfig) -> anyhow::Result<Whole> {
        whole::whole(&self.target, &self.options, config).context("whole-process benchmark")
    }

    /// The checkpoint and restore to `dir`; `progress` sees every phase.
    pub fn to_disk(
        &self,
        dir: &Path,
        config: &ToolConfig,
        progress: &dyn Progress,
    ) -> anyhow::Result<DiskBench> {
        let size = self.options.shared_size(self.target.on_gpu);
        disk::disk(
            &self.target,
            dir,
            size,
            self.options.processes,
            config,
            progress,
        )
        .context("disk benchmark")
    }
}

/// The whole report (`bench --json`, `--json-out`).
#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    pub driver: String,
    pub on_gpu: bool,
    /// `--carrier`: where every suspend of the run left its bytes.
    pub carrier: Requested,
    pub overhead: Option<Overhead>,
    pub capture: Option<Capture>,
    pub whole: Option<Whole>,
    /// `--to-disk DIR`.
    pub disk: Option<DiskBench>,
    /// `--launch`.
    pub launch: Option<Launch>,
}

/// The launch-bound case: launches per second with and without the shim, alternating rounds.
#[derive(Debug, serde::Serialize)]
pub struct Launch {
    pub repetitions: usize,
    pub rounds: usize,
    pub threads: usize,
    /// Launches (and as many 4 KiB copies) per thread per round.
    pub iterations: u64,
    /// Medians over the rounds.
    pub without_shim_launches_per_s: f64,
    pub with_shim_launches_per_s: f64,
    /// Time per launch, shim over no shim: the median of the rounds' ratios (target <= 1.02 on
    /// a GPU), with its spread.
    pub ratio: Ratio,
}

/// One process holding `bytes` of `cuMemAlloc` memory, suspended and resumed under the shim
/// plainly and with `--keep-contexts`, against the driver's own checkpoint of a process without
/// the shim holding the same bytes.
#[derive(Debug, serde::Serialize)]
pub struct Whole {
    pub bytes: u64,
    /// `owned` when the shim's records hold the allocation (it moves through the carriers),
    /// `native` when they do not (it goes through the driver's checkpoint, or stays resident with
    /// `--keep-contexts`), read from inspect before the first suspend.
    pub memory: String,
    /// Bytes of the process's allocations the shim's records hold.
    pub owned_bytes: u64,
    /// With the default carrier, the preparation before the first cycle (`cuinterpose
    /// prepare`), as the group case does.
    pub prepared: Option<control::capture::PrepareReport>,
    /// With the default carrier, the preparation for the keep-contexts cycles after the plain
    /// ones (`cuinterpose prepare --keep-contexts`: the shim pins its own carrier ahead).
    pub prepared_keep_contexts: Option<control::capture::PrepareReport>,
    /// The process's first plain cycle: its carrier is made and first touched in it.
    pub plain_first: WholeRun,
    /// The second: the carrier made by the first is used again, as in every later plain cycle.
    pub plain: WholeRun,
    /// The first `--keep-contexts` cycle: the shim's `auto` carrier is pinned in it (its
    /// registration is part of the suspend) unless it was prepared.
    pub keep_contexts_first: WholeRun,
    /// The second: the carrier pinned by the first is used again, as in every later cycle.
    pub keep_contexts: WholeRun,
    pub native: Native,
    /// Native lock+checkpoint+restore+unlock time over the second plain cycle's suspend+resume
    /// time (target on the H200: at least 10).
    pub speedup_vs_native: f64,
    /// The same over the first plain cycle's.
    pub speedup_vs_native_first: f64,
    pub verified: Vec<String>,
}

/// One suspend and resume of the whole-process case.
#[derive(Debug, serde::Serialize)]
pub struct WholeRun {
    pub suspend_millis: f64,
    pub resume_millis: f64,
    /// The held bytes over each step's time (target with --keep-contexts on the H200: at least
    /// 40 GB/s each).
    pub suspend_gb_per_s: f64,
    pub resume_gb_per_s: f64,
    /// What the shim moved through its carriers.
    pub shim_bytes: u64,
    /// How the shim's Save reached its carrier (none when it moved nothing).
    pub carrier: Option<CarrierMode>,
    /// Whether every carrier the Save used existed before it (made by an earlier cycle or
    /// prepared ahead, pinned where pinned): such a Save makes and pins nothing.
    pub carrier_reused: Option<bool>,
    /// The copies of the suspend's Save alone (the slowest shim's), against the phase's time:
    /// what the Save spent around them.
    pub save_copy_millis: Option<f64>,
    /// The suspend's and the resume's phases, so that a cycle slower than another shows which
    /// step it lost its time in (the copies, or the driver's native checkpoint and restore).
    pub suspend_phases: Vec<PhaseTiming>,
    pub resume_phases: Vec<PhaseTiming>,
}

/// Medians of the overhead rounds, nanoseconds per iteration.
#[derive(Debug, serde::Serialize)]
pub struct Overhead {
    /// Pairs of processes.
    pub repetitions: usize,
    /// Alternating rounds per pair.
    pub rounds: usize,
    /// Iterations per round.
    pub iterations: u64,
    pub tracked_iterations: u64,
    /// The CPU both processes of a pair were pinned to.
    pub cpu: Option<usize>,
    /// Untracked calls, one line per call and their sum.
    pub untracked: Vec<Ratio>,
    /// The tracked cycle and its calls.
    pub tracked: Vec<Ratio>,
    /// Targets: untracked sum ≤ 1.02, tracked cycle ≤ 1.10.
    pub untracked_ratio: f64,
    pub tracked_ratio: f64,
    pub registry_bytes_per_allocation: u64,
    pub registry_source: &'static str,
}

/// One measured line: without and with the shim (medians over the rounds), the median of the
/// rounds' ratios and their spread.
#[derive(Debug, serde::Serialize)]
pub struct Ratio {
    pub name: String,
    pub without_shim_ns: f64,
    pub with_shim_ns: f64,
    /// Median over the rounds of (with shim / without shim), each pair of rounds back to back.
    pub ratio: f64,
    /// 10th and 90th percentiles of the rounds' ratios.
    pub ratio_p10: f64,
    pub ratio_p90: f64,
    /// Lowest and highest ratio of a round.
    pub ratio_spread: (f64, f64),
}

impl Ratio {
    /// From the rounds' figures `(without, with)`.
    fn paired(name: &str, pairs: &[(f64, f64)]) -> Ratio {
        let mut ratios: Vec<f64> = pairs
            .iter()
            .map(|&(without, with)| if without > 0.0 { with / without } else { 0.0 })
            .collect();
        ratios.sort_by(f64::total_cmp);
        Ratio {
            name: name.into(),
            without_shim_ns: median(pairs.iter().map(|p| p.0).collect()),
            with_shim_ns: median(pairs.iter().map(|p| p.1).collect()),
            ratio: quantile(&ratios, 0.5),
            ratio_p10: quantile(&ratios, 0.1),
            ratio_p90: quantile(&ratios, 0.9),
            ratio_spread: (quantile(&ratios, 0.0), quantile(&ratios, 1.0)),
        }
    }
}

/// The capture benchmark.
#[derive(Debug, serde::Serialize)]
pub struct Capture {
    pub processes: usize,
    pub bytes_per_process: u64,
    pub shared_bytes: u64,
    /// With `--carrier` (the default, auto, chooses by what the machine has; each suspend
    /// report's `carrier` says which, why, and what it holds).
    pub cycles: Vec<Cycle>,
    /// With `--carrier auto`: `cuinterpose prepare` before the first cycle, as the guide has it
    /// (the comparison's runs are not prepared: their first cycles pin).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prepared: Option<control::capture::PrepareReport>,
    /// With `--carrier auto`: the same cycles of a fresh group with each carrier asked for, for
    /// comparison.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub comparison: Vec<CarrierRun>,
    pub native: Native,
    pub verified: Vec<String>,
}

/// The capture's cycles of a fresh group with one carrier asked for.
#[derive(Debug, serde::Serialize)]
pub struct CarrierRun {
    pub carrier: Requested,
    pub cycles: Vec<Cycle>,
    /// Why the machine refused the carrier (no cycle ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// One suspend and resume of the group.
#[derive(Debug, serde::Serialize)]
pub struct Cycle {
    pub cycle: usize,
    pub suspend: Report,
    pub resume: Report,
    pub save: CopySummary,
    pub load: CopySummary,
    pub suspend_gb_per_s: f64,
    pub resume_gb_per_s: f64,
    /// Bytes per second of suspend+resume over native checkpoint+restore of the same bytes
    /// (target on the H200: at least 5).
    pub speedup_vs_native: f64,
}

/// The shims' own figures for one copying phase over the group (they copy in parallel).
#[derive(Debug, Default, serde::Serialize)]
pub struct CopySummary {
    /// `registered`, `staged`, or both when the shims differ.
    pub mode: String,
    pub bytes: u64,
    /// Slowest shim's copy time, and the group's bytes over it.
    pub copy_millis: f64,
    pub copy_gb_per_s: f64,
    /// Slowest worker's pinning (staging allocation or segment registration), inside the copy.
    pub pin_millis: f64,
    /// Slowest shim's carrier mapping and first touch (Save only), before the copy.
    pub carrier_millis: f64,
    pub carriers_reused: bool,
    pub threads: u32,
    pub staged_fallbacks: u32,
    pub shims: Vec<(String, CopyStats)>,
}

/// Native checkpoint and restore of one unshared allocation.
#[derive(Debug, serde::Serialize)]
pub struct Native {
    pub bytes: u64,
    pub lock_millis: f64,
    pub checkpoint_millis: f64,
    pub restore_millis: f64,
    pub unlock_millis: f64,
    /// Lock + checkpoint, and restore + unlock.
    pub checkpoint_gb_per_s: f64,
    pub restore_gb_per_s: f64,
}

/// The median (0 when empty).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    quantile(&values, 0.5)
}

/// The `q` quantile (0 to 1) of sorted values, interpolated between neighbours (0 when empty).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    let position = q.clamp(0.0, 1.0) * last as f64;
    let (low, high) = (position.floor() as usize, position.ceil() as usize);
    sorted[low] + (sorted[high] - sorted[low]) * (position - low as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_neighbours() {
        let sorted = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0];
        assert_eq!(quantile(&sorted, 0.0), 1.0);
        assert_eq!(quantile(&sorted, 0.1), 2.0);
        assert_eq!(quantile(&sorted, 0.9), 10.0);
        assert_eq!(quantile(&sorted, 1.0), 11.0);
        assert_eq!(quantile(&[1.0, 2.0], 0.25), 1.25);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn ratios_are_paired_per_round() {
        // The median of the rounds' ratios (1.5, 1.0, 0.5) is 1.0; the ratio of the medians
        // (3 / 2) would say 1.5.
        let r = Ratio::paired("x", &[(2.0, 3.0), (4.0, 4.0), (2.0, 1.0)]);
        assert_eq!(r.ratio, 1.0);
        assert_eq!(r.ratio_spread, (0.5, 1.5));
        assert_eq!((r.without_shim_ns, r.with_shim_ns), (2.0, 3.0));
        assert!((r.ratio_p10 - 0.6).abs() < 1e-12 && (r.ratio_p90 - 1.4).abs() < 1e-12);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
