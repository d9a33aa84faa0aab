//! `cuinterpose bench`: what the interposer costs and how fast a suspend and resume move bytes.
//!
//! 1. Overhead: `--repetitions` pairs of `cuinterpose-workload bench --serve-rounds` processes,
//!    one without and one with the shim, both pinned to the same CPU and warmed up, run
//!    `--rounds` rounds in alternation (one process at a time; which goes first swaps every
//!    round, so that neither side always runs second): a loop of untracked calls
//!    (`cuCtxSynchronize`, a 256-byte `cuMemsetD8` and `cuMemcpyHtoD`; the shim returns these
//!    unwrapped, so an untracked call reaches the driver's own function and what remains is the
//!    machine's noise) and a loop of tracked create/map/set-access/unmap/release cycles. Each
//!    ratio is the median of the rounds' ratios (shim/no-shim, each pair of rounds back to back),
//!    with their spread (10th and 90th percentiles, lowest and highest). Long-lived processes and
//!    short alternating rounds are what make the figure stable: separate processes per run
//!    differ by their placement (CPU, clocks, memory) by more than the shim could cost.
//! 2. Capture: a ring group under the shim sharing `--size` bytes in all, suspended and resumed
//!    `--cycles` times in place (the second cycle reuses the carriers), with every phase timed and
//!    each shim's copy statistics (copy, pinning, carrier first touch) from its answers to Save and
//!    Load; contents verified after the last resume.
//! 3. Native: in the same run, one process without the shim holding a filled `cuMemAlloc` of the
//!    same size, natively locked and checkpointed, then restored and unlocked, timed; contents
//!    verified. The speed-up compares bytes per second of suspend+resume with native
//!    checkpoint+restore.
//!
//! 4. To disk (`--to-disk DIR`, crate::bench_disk): checkpoint and restore of a ring group to DIR
//!    next to DIR's own rates.
//!
//! Figures only: nothing here passes or fails on a time.

use crate::output::{Align, Table, bytes};
use crate::progress::Bars;
use anyhow::{Context, ensure};
use control::ControlError;
use control::capture::{self, PhaseTiming, Progress, Report, ResumeOptions, SuspendOptions};
use control::config::ToolConfig;
use control::group::PhaseResult;
use control::native::Driver;
use protocol::message::{CarrierMode, CopyStats};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use workload::launch::{Group, Launcher, Programs, WorkloadOptions};

/// Registry memory per tracked allocation (one allocation mapped twice with access for two
/// devices), measured with a counting allocator by `crates/shim-runtime/tests/registry_memory.rs`.
const REGISTRY_BYTES_PER_ALLOCATION: u64 = 621;
/// Bound on each workload command: filling and verifying many GiB takes a while.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// Allocations are rounded to this (the usual VMM granularity).
pub(crate) const GRANULE: u64 = 2 << 20;

const BENCH_HELP: &str = "\
Overhead: --repetitions pairs of warm workload processes, one without and one with the shim, pinned
to one CPU (--cpu), run --rounds rounds in alternation (who goes first swaps every round); RATIO is
the median of the rounds' shim/no-shim ratios, with P10, P90, MIN and MAX: untracked calls
(cuCtxSynchronize, 256-byte cuMemsetD8 and cuMemcpyHtoD; target: ratio <= 1.02) and the tracked
create/map/set-access/unmap/release cycle (<= 1.10).

Capture: a ring group under the shim sharing --size bytes, suspended and resumed --cycles times in
place (the second cycle reuses the host carriers). Save/load copy rates come from the shims' own
statistics (copy wall time; pinning inside it; carrier mapping and first touch apart), whole
suspend and resume from the tool. In the same run, one process without the shim holding a filled
cuMemAlloc of the same size is checkpointed and restored natively; X NATIVE is the bytes per second
of suspend+resume over native checkpoint+restore (H200 targets: copies >= 45 GB/s per GPU,
suspend+resume >= 5x native).

CUINTERPOSE_CARRIER (read by each shim when its runtime starts; the group inherits it from here):
  auto        (default) staged while every suspend has its native checkpoint, pinned from the
              first --keep-contexts suspend on (the whole-process case's second keep-contexts
              cycle shows it; the driver re-pins a pinned carrier at native restore)
  staged      DMA through small pinned staging buffers and a CPU copy to the carrier
              (registering 8 GiB costs more than copying it once)
  registered  each carrier segment is registered (cuMemHostRegister) for its copy and DMA goes
              straight into it; unregistered before the phase answers
  pinned      the carrier is registered once in 256 MiB pieces and kept registered; DMA goes
              straight into it (cycle 1 pays the pinning in its carrier time, later cycles none)
The report says which mode ran.

--to-disk DIR: a ring group of --size bytes is checkpointed to DIR and restored (root and CRIU, as
for `checkpoint`), every phase timed with its bytes; before it, DIR's own sequential write and read
rates are measured with the I/Os the shims use for the checkpoint's block store (2 MiB block files
under temporary names, one syncfs, the renames; as many threads as the group's shims run, O_DIRECT
where DIR takes it), and the save and load rates are given as shares of them (the load reads each
block once and checks its digest as it goes; targets: >= 90% each way on a disk, the digests adding
<= 10%; from tmpfs, a warm checkpoint, load >= 40 GB/s and save >= 20 GB/s). Then a second
checkpoint of the restored group after a tenth of its bytes changed, into the same block store.
Figures only: nothing here passes or fails on a time.";

#[derive(Debug, clap::Args)]
#[command(after_help = BENCH_HELP)]
pub struct BenchArgs {
    /// Bytes the group shares in all, split evenly over its processes (suffixes K, M, G; default:
    /// 8G on a GPU, 256M on the fake driver); the native baseline uses the same size
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Processes in the group (each creates one shared allocation and imports its neighbour's)
    #[arg(long, default_value_t = 2)]
    processes: usize,
    /// Suspend/resume cycles of the same group (the second shows carrier reuse)
    #[arg(long, default_value_t = 2)]
    cycles: usize,
    /// Iterations of each untracked loop per overhead round
    #[arg(long, default_value_t = 10_000)]
    iterations: u64,
    /// Iterations of the tracked cycle per overhead round
    #[arg(long, default_value_t = 200)]
    tracked_iterations: u64,
    /// Pairs of overhead processes (one without, one with the shim), each started afresh
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Alternating rounds per pair of overhead processes (medians over all rounds are reported)
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// The CPU both overhead processes are pinned to (default: the lowest this tool may use,
    /// other than CPU 0 when there is another)
    #[arg(long)]
    cpu: Option<usize>,
    /// Leave out the overhead benchmark
    #[arg(long)]
    no_overhead: bool,
    /// Leave out the capture benchmark and its native baseline
    #[arg(long)]
    no_capture: bool,
    /// Bytes of cuMemAlloc memory the whole-process case holds (default: 16G on a GPU, 64M on the
    /// fake driver)
    #[arg(long, value_parser = parse_size)]
    whole_size: Option<u64>,
    /// Leave out the whole-process case (plain and --keep-contexts, against native)
    #[arg(long)]
    no_whole: bool,
    /// Use the bundled fake driver even when a GPU is present
    #[arg(long)]
    fake: bool,
    /// Print the JSON report instead of tables
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to FILE
    #[arg(long, value_name = "FILE")]
    json_out: Option<PathBuf>,
    /// Where the bytes wait between each suspend and its resume, as `suspend --carrier`
    #[arg(long, value_enum, default_value_t = crate::CarrierPlace::Auto)]
    carrier: crate::CarrierPlace,
    /// Also checkpoint a ring group of --size bytes to DIR and restore it, phase by phase, next
    /// to DIR's own sequential write and read rates measured with the same I/Os (needs root and
    /// CRIU, as `checkpoint` does)
    #[arg(long, value_name = "DIR")]
    to_disk: Option<PathBuf>,
    /// Run only the launch-bound case: --launch-threads threads per process, each issuing
    /// --launch-iterations noop kernel launches and 4 KiB async copies a round on a stream of its
    /// own, with and without the shim, --repetitions pairs x --rounds alternating rounds
    #[arg(long)]
    launch: bool,
    /// Threads of each launch-bound process
    #[arg(long, default_value_t = 4)]
    launch_threads: usize,
    /// Launches (and as many copies) per thread per launch-bound round
    #[arg(long, default_value_t = 20_000)]
    launch_iterations: u64,
}

/// `8G`, `256M`, `4096`, `0x1000`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let value = match digits.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => digits.parse::<u64>(),
    }
    .map_err(|_| format!("{text:?} is not a size (e.g. 8G, 256M, 4096)"))?;
    value
        .checked_mul(1 << shift)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{text:?} is zero or too large"))
}

/// The whole report (`--json`, `--json-out`).
#[derive(Debug, serde::Serialize)]
pub struct BenchReport {
    pub driver: String,
    pub on_gpu: bool,
    /// `--carrier`: where every suspend of the run left its bytes.
    pub carrier: crate::CarrierPlace,
    pub overhead: Option<Overhead>,
    pub capture: Option<Capture>,
    pub whole: Option<Whole>,
    /// `--to-disk DIR`.
    pub disk: Option<crate::bench_disk::DiskBench>,
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
    /// The process's first plain cycle: its carrier is made and first touched in it.
    pub plain_first: WholeRun,
    /// The second: the carrier made by the first is used again, as in every later plain cycle.
    pub plain: WholeRun,
    /// The first `--keep-contexts` cycle: the shim's `auto` carrier is pinned in it (its
    /// registration is part of the suspend).
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
    pub prepared: Option<capture::PrepareReport>,
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
    pub carrier: crate::CarrierPlace,
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

pub fn bench(args: BenchArgs, config: &ToolConfig) -> anyhow::Result<()> {
    ensure!(
        args.processes >= 2,
        "--processes must be at least 2 to share memory both ways"
    );
    ensure!(args.cycles >= 1, "--cycles must be at least 1");
    ensure!(args.repetitions >= 1, "--repetitions must be at least 1");
    let crate::demo::Target {
        on_gpu,
        driver,
        programs,
    } = crate::demo::pick_driver(args.fake)?;
    let driver_name = if on_gpu {
        format!(
            "GPU ({}, driver API {})",
            driver.path().display(),
            driver.version()
        )
    } else {
        format!("fake driver ({})", driver.path().display())
    };
    let tables = !args.json;
    if args.launch {
        return launch_only(&programs, &args, driver_name, on_gpu);
    }
    if tables {
        println!("cuinterpose bench on the {driver_name}");
        if args.carrier == crate::CarrierPlace::Helper {
            println!("every suspend saves through the carrier helper (--carrier helper)");
        }
    }
    let overhead = if args.no_overhead {
        None
    } else {
        let o = overhead(&programs, &args).context("overhead benchmark")?;
        if tables {
            print_overhead(&o);
        }
        Some(o)
    };
    let capture = if args.no_capture {
        None
    } else {
        let c = capture_bench(&programs, &driver, on_gpu, &args, config)
            .context("capture benchmark")?;
        if tables {
            print_capture(&c);
        }
        Some(c)
    };
    let whole = if args.no_whole {
        None
    } else {
        let w = whole_bench(&programs, &driver, on_gpu, &args, config)
            .context("whole-process benchmark")?;
        if tables {
            print_whole(&w);
        }
        Some(w)
    };
    let disk = match &args.to_disk {
        None => None,
        Some(dir) => {
            let size = args
                .size
                .unwrap_or(if on_gpu { 8 << 30 } else { 256 << 20 });
            let d = crate::bench_disk::disk_bench(
                &programs,
                on_gpu,
                &driver,
                dir,
                size,
                args.processes,
                config,
            )
            .context("disk benchmark")?;
            if tables {
                crate::bench_disk::print_disk(&d);
            }
            Some(d)
        }
    };
    let report = BenchReport {
        driver: driver_name,
        on_gpu,
        carrier: args.carrier,
        overhead,
        capture,
        whole,
        disk,
        launch: None,
    };
    write_report(&report, &args)
}

/// Prints (`--json`) and writes (`--json-out`) the report.
fn write_report(report: &BenchReport, args: &BenchArgs) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{json}");
    }
    Ok(())
}

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

/// Untracked calls and tracked steps of one `cuinterpose-workload bench` report, by name.
const UNTRACKED: [&str; 3] = [
    "ctx_synchronize_ns",
    "memset_d8_256_ns",
    "memcpy_htod_256_ns",
];
const TRACKED: [&str; 6] = [
    "cycle_ns",
    "create_ns",
    "map_ns",
    "set_access_ns",
    "unmap_ns",
    "release_ns",
];

fn overhead(programs: &Programs, args: &BenchArgs) -> anyhow::Result<Overhead> {
    let env = Launcher::new(programs.clone(), false).context("preparing a directory")?;
    let cpu = args.cpu.or_else(workload::bench::default_cpu);
    // Per round, the reports without and with the shim.
    let mut runs: [Vec<serde_json::Value>; 2] = [Vec::new(), Vec::new()];
    for repetition in 0..args.repetitions {
        let mut pair = [
            Rounds::start(&env, false, &overhead_args(args, cpu), repetition)?,
            Rounds::start(&env, true, &overhead_args(args, cpu), repetition)?,
        ];
        // Both warm up at once (their first round is not reported); then one runs at a time.
        for side in &mut pair {
            side.ready()?;
        }
        for round in 0..args.rounds {
            let order = if (repetition + round) % 2 == 0 {
                [0, 1]
            } else {
                [1, 0]
            };
            for side in order {
                let report = pair[side].round()?;
                runs[side].push(report);
            }
        }
        for side in pair {
            side.finish()?;
        }
    }
    // The (without, with) figures of each round.
    let pairs = |section: &str, key: &str| -> anyhow::Result<Vec<(f64, f64)>> {
        let value = |r: &serde_json::Value| {
            r[section][key]
                .as_f64()
                .with_context(|| format!("the bench report lacks {section}.{key}"))
        };
        runs[0]
            .iter()
            .zip(&runs[1])
            .map(|(without, with)| Ok((value(without)?, value(with)?)))
            .collect()
    };
    let mut untracked = Vec::new();
    let mut loop_sums = vec![(0.0, 0.0); runs[0].len()];
    for key in UNTRACKED {
        let figures = pairs("untracked", key)?;
        for (sum, (without, with)) in loop_sums.iter_mut().zip(&figures) {
            sum.0 += without;
            sum.1 += with;
        }
        untracked.push(Ratio::paired(key.trim_end_matches("_ns"), &figures));
    }
    untracked.push(Ratio::paired("untracked loop", &loop_sums));
    let mut tracked = Vec::new();
    for key in TRACKED {
        tracked.push(Ratio::paired(
            key.trim_end_matches("_ns"),
            &pairs("tracked", key)?,
        ));
    }
    let untracked_ratio = untracked.last().map_or(0.0, |r| r.ratio);
    let tracked_ratio = tracked.first().map_or(0.0, |r| r.ratio);
    Ok(Overhead {
        repetitions: args.repetitions,
        rounds: args.rounds,
        iterations: args.iterations,
        tracked_iterations: args.tracked_iterations,
        cpu,
        untracked,
        tracked,
        untracked_ratio,
        tracked_ratio,
        registry_bytes_per_allocation: REGISTRY_BYTES_PER_ALLOCATION,
        registry_source: "counting allocator, crates/shim-runtime/tests/registry_memory.rs \
                          (one allocation mapped twice, access for two devices)",
    })
}

/// The workload's arguments for the overhead loops.
fn overhead_args(args: &BenchArgs, cpu: Option<usize>) -> Vec<String> {
    let mut list = vec![
        "--iterations".to_string(),
        args.iterations.to_string(),
        "--tracked-iterations".to_string(),
        args.tracked_iterations.to_string(),
    ];
    if let Some(cpu) = cpu {
        list.extend(["--cpu".to_string(), cpu.to_string()]);
    }
    list
}

/// `bench --launch`: the launch-bound case alone, its table or its JSON.
fn launch_only(
    programs: &Programs,
    args: &BenchArgs,
    driver: String,
    on_gpu: bool,
) -> anyhow::Result<()> {
    if !args.json {
        println!("cuinterpose bench --launch on the {driver}");
    }
    let launch = launch_bench(programs, args).context("launch-bound benchmark")?;
    if !args.json {
        print_launch(&launch);
    }
    let report = BenchReport {
        driver,
        on_gpu,
        carrier: args.carrier,
        overhead: None,
        capture: None,
        whole: None,
        disk: None,
        launch: Some(launch),
    };
    write_report(&report, args)
}

/// Pairs of launch-bound processes (without and with the shim, unpinned: their threads need
/// CPUs of their own), rounds in alternation as for the overhead.
fn launch_bench(programs: &Programs, args: &BenchArgs) -> anyhow::Result<Launch> {
    ensure!(
        args.launch_threads >= 1,
        "--launch-threads must be at least 1"
    );
    let env = Launcher::new(programs.clone(), false).context("preparing a directory")?;
    let bench_args = vec![
        "--launch-threads".to_string(),
        args.launch_threads.to_string(),
        "--iterations".to_string(),
        args.launch_iterations.to_string(),
    ];
    let mut ns = Vec::new();
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for repetition in 0..args.repetitions {
        let mut pair = [
            Rounds::start(&env, false, &bench_args, repetition)?,
            Rounds::start(&env, true, &bench_args, repetition)?,
        ];
        for side in &mut pair {
            side.ready()?;
        }
        for round in 0..args.rounds {
            let order = if (repetition + round) % 2 == 0 {
                [0, 1]
            } else {
                [1, 0]
            };
            let mut figures = [(0.0, 0.0); 2];
            for side in order {
                let report = pair[side].round()?;
                let value = |key: &str| {
                    report["launch"][key]
                        .as_f64()
                        .with_context(|| format!("the launch report lacks launch.{key}"))
                };
                figures[side] = (value("ns_per_launch")?, value("launches_per_s")?);
            }
            ns.push((figures[0].0, figures[1].0));
            for (side, rate) in rates.iter_mut().enumerate() {
                rate.push(figures[side].1);
            }
        }
        for side in pair {
            side.finish()?;
        }
    }
    let [without, with] = rates;
    Ok(Launch {
        repetitions: args.repetitions,
        rounds: args.rounds,
        threads: args.launch_threads,
        iterations: args.launch_iterations,
        without_shim_launches_per_s: median(without),
        with_shim_launches_per_s: median(with),
        ratio: Ratio::paired("ns per launch", &ns),
    })
}

fn print_launch(l: &Launch) {
    println!();
    println!(
        "launch-bound: {} pairs of processes x {} alternating rounds, {} threads each issuing {} \
         noop launches and 4 KiB async copies a round on a stream of its own; medians",
        l.repetitions, l.rounds, l.threads, l.iterations
    );
    println!(
        "launches/s without the shim {:.0}, with the shim {:.0}",
        l.without_shim_launches_per_s, l.with_shim_launches_per_s
    );
    println!(
        "ratio {:.3} (time per launch, shim over no shim; P10 {:.3}, P90 {:.3}; target <= 1.02 on \
         the GPU)",
        l.ratio.ratio, l.ratio.ratio_p10, l.ratio.ratio_p90
    );
}

/// One `cuinterpose-workload bench --serve-rounds` process: a round per `round` line on its
/// stdin, a JSON report per line on its stdout; stderr to a log. Killed on drop.
struct Rounds {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    what: String,
    log: PathBuf,
}

impl Rounds {
    /// Starts one with `bench_args` after `bench --serve-rounds` (warming up: see
    /// [`Rounds::ready`]).
    fn start(
        env: &Launcher,
        shim: bool,
        bench_args: &[String],
        repetition: usize,
    ) -> anyhow::Result<Rounds> {
        let what = format!(
            "cuinterpose-workload bench ({} the shim, pair {})",
            if shim { "with" } else { "without" },
            repetition + 1
        );
        let log = env
            .log_dir()
            .join(format!("overhead-{repetition}-{shim}.log"));
        let mut command = env.command(&env.programs().workload, shim)?;
        command
            .args(["bench", "--serve-rounds"])
            .args(bench_args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(
                std::fs::File::create(&log)
                    .with_context(|| format!("creating {}", log.display()))?,
            );
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            anyhow::bail!("{what}: no pipes to its stdin and stdout");
        };
        Ok(Rounds {
            child,
            stdin,
            stdout: std::io::BufReader::new(stdout),
            what,
            log,
        })
    }

    /// The next line it prints; an error naming its log when it ended instead.
    fn line(&mut self) -> anyhow::Result<String> {
        use std::io::BufRead;
        let mut line = String::new();
        let read = self
            .stdout
            .read_line(&mut line)
            .with_context(|| format!("reading from {}", self.what))?;
        if read == 0 {
            let status = self.child.wait().ok();
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            anyhow::bail!("{} ended ({status:?}): {}", self.what, log.trim());
        }
        Ok(line)
    }

    /// Waits until it is warmed up.
    fn ready(&mut self) -> anyhow::Result<()> {
        let line = self.line()?;
        ensure!(
            line.trim() == workload::bench::READY,
            "{} printed {line:?}, not {:?}",
            self.what,
            workload::bench::READY
        );
        Ok(())
    }

    /// Runs one round and returns its report.
    fn round(&mut self) -> anyhow::Result<serde_json::Value> {
        use std::io::Write;
        writeln!(self.stdin, "round").with_context(|| format!("writing to {}", self.what))?;
        let line = self.line()?;
        serde_json::from_str(&line)
            .with_context(|| format!("{} printed no JSON report: {line:?}", self.what))
    }

    /// Ends it; it must exit successfully.
    fn finish(mut self) -> anyhow::Result<()> {
        use std::io::Write;
        writeln!(self.stdin, "exit").with_context(|| format!("writing to {}", self.what))?;
        let status = self
            .child
            .wait()
            .with_context(|| format!("waiting for {}", self.what))?;
        ensure!(
            status.success(),
            "{} failed: {status}: {}",
            self.what,
            std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .trim()
        );
        Ok(())
    }
}

impl Drop for Rounds {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Forwards progress to the bars and keeps what each shim reported.
struct Collector<'a> {
    bars: &'a Bars,
    results: Mutex<Vec<(&'static str, String, PhaseResult)>>,
}

impl Collector<'_> {
    fn take(&self, step: &str) -> Vec<(String, PhaseResult)> {
        let mut results = self.results.lock().unwrap_or_else(|e| e.into_inner());
        let (wanted, rest): (Vec<_>, Vec<_>) = results.drain(..).partition(|(s, ..)| *s == step);
        *results = rest;
        wanted.into_iter().map(|(_, p, r)| (p, r)).collect()
    }
}

impl Progress for Collector<'_> {
    fn phase_started(&self, name: &'static str, total_bytes: Option<u64>) {
        self.bars.phase_started(name, total_bytes);
    }
    fn advance(&self, bytes: u64) {
        self.bars.advance(bytes);
    }
    fn participant_done(&self, step: &'static str, process: &str, result: &PhaseResult) {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((step, process.to_string(), *result));
    }
    fn phase_finished(&self, timing: &PhaseTiming) {
        self.bars.phase_finished(timing);
    }
}

fn gb_per_s(bytes: u64, millis: f64) -> f64 {
    if millis > 0.0 {
        bytes as f64 / millis / 1e6
    } else {
        0.0
    }
}

fn summarize_copies(results: Vec<(String, PhaseResult)>) -> CopySummary {
    let shims: Vec<(String, CopyStats)> = results
        .into_iter()
        .filter_map(|(p, r)| Some((p, r.stats?)))
        .collect();
    let max = |f: fn(&CopyStats) -> u64| shims.iter().map(|(_, s)| f(s)).max().unwrap_or(0);
    let mut modes: Vec<String> = shims
        .iter()
        .map(|(_, s)| format!("{:?}", s.mode).to_lowercase())
        .collect();
    modes.sort();
    modes.dedup();
    let bytes = shims.iter().map(|(_, s)| s.bytes).sum();
    let copy_millis = max(|s| s.copy_micros) as f64 / 1e3;
    CopySummary {
        mode: modes.join("+"),
        bytes,
        copy_millis,
        copy_gb_per_s: gb_per_s(bytes, copy_millis),
        pin_millis: max(|s| s.pin_micros) as f64 / 1e3,
        carrier_millis: max(|s| s.carrier_micros) as f64 / 1e3,
        carriers_reused: !shims.is_empty() && shims.iter().all(|(_, s)| s.carrier_reused),
        threads: shims.iter().map(|(_, s)| s.threads).max().unwrap_or(0),
        staged_fallbacks: shims.iter().map(|(_, s)| s.staged_fallbacks).sum(),
        shims,
    }
}

fn seed(rank: usize) -> u64 {
    7000 + rank as u64
}

fn capture_bench(
    programs: &Programs,
    driver: &Driver,
    on_gpu: bool,
    args: &BenchArgs,
    config: &ToolConfig,
) -> anyhow::Result<Capture> {
    let total = args
        .size
        .unwrap_or(if on_gpu { 8 << 30 } else { 256 << 20 });
    let per = (total / args.processes as u64)
        .div_ceil(GRANULE)
        .max(1)
        .saturating_mul(GRANULE);
    let env = Launcher::new(programs.clone(), true).context("preparing a directory")?;
    let tool_driver = (!on_gpu).then(|| driver.path().to_path_buf());
    let bars = Bars::new(!args.json);
    let collector = Collector {
        bars: &bars,
        results: Mutex::new(Vec::new()),
    };
    let cycles = Cycles {
        args,
        config,
        per,
        tool_driver: &tool_driver,
        collector: &collector,
    };
    let mut verified = Vec::new();
    let auto = args.carrier == crate::CarrierPlace::Auto;
    let (mut main, prepared) = cycles
        .run(&env, args.carrier, auto, &mut verified)
        .context("the capture cycles")?;
    // Auto's choice against each carrier asked for, each on a fresh group (and so a fresh
    // carrier helper: its first cycle pins again).
    let mut comparison = Vec::new();
    if auto {
        for carrier in [crate::CarrierPlace::Process, crate::CarrierPlace::Helper] {
            let fresh = Launcher::new(programs.clone(), true).context("preparing a directory")?;
            match cycles.run(&fresh, carrier, false, &mut verified) {
                Ok((cycles, _)) => comparison.push(CarrierRun {
                    carrier,
                    cycles,
                    refused: None,
                }),
                Err(e)
                    if e.chain().any(|c| {
                        matches!(
                            c.downcast_ref::<ControlError>(),
                            Some(ControlError::CarrierRefused { .. })
                        )
                    }) =>
                {
                    comparison.push(CarrierRun {
                        carrier,
                        cycles: Vec::new(),
                        refused: Some(format!("{e:#}")),
                    })
                }
                Err(e) => {
                    return Err(
                        e.context(format!("the cycles with --carrier {}", place_name(carrier)))
                    );
                }
            }
        }
    }

    let native = native_baseline(&env, driver, total, &mut verified).context("native baseline")?;
    let native_rate = gb_per_s(
        native.bytes,
        native.lock_millis
            + native.checkpoint_millis
            + native.restore_millis
            + native.unlock_millis,
    );
    for c in main
        .iter_mut()
        .chain(comparison.iter_mut().flat_map(|r| r.cycles.iter_mut()))
    {
        let ours = gb_per_s(
            c.suspend.saved_bytes,
            c.suspend.total_millis + c.resume.total_millis,
        );
        c.speedup_vs_native = if native_rate > 0.0 {
            ours / native_rate
        } else {
            0.0
        };
    }
    Ok(Capture {
        processes: args.processes,
        bytes_per_process: per,
        shared_bytes: per * args.processes as u64,
        cycles: main,
        prepared,
        comparison,
        native,
        verified,
    })
}

/// What every run of the capture's cycles shares.
struct Cycles<'a> {
    args: &'a BenchArgs,
    config: &'a ToolConfig,
    /// Bytes each process shares.
    per: u64,
    tool_driver: &'a Option<PathBuf>,
    collector: &'a Collector<'a>,
}

impl Cycles<'_> {
    /// Starts a ring group in `env`, prepares its carriers if `prepare` (`cuinterpose prepare`),
    /// suspends and resumes it `--cycles` times with `carrier`, and checks its contents after the
    /// last resume (a line per rank in `verified`).
    fn run(
        &self,
        env: &Launcher,
        carrier: crate::CarrierPlace,
        prepare: bool,
        verified: &mut Vec<String>,
    ) -> anyhow::Result<(Vec<Cycle>, Option<capture::PrepareReport>)> {
        let (args, collector) = (self.args, self.collector);
        let options = WorkloadOptions::new("bench")
            .shim(true)
            .timeout(COMMAND_TIMEOUT);
        let group = Group::tree(env, args.processes, options).context("starting the group")?;
        group
            .ring(self.per)
            .context("sharing memory around the ring")?;
        for (rank, w) in group.members().iter().enumerate() {
            w.ok(&format!("fill a{rank} {}", seed(rank)))?;
        }
        let root = group[0].pid();
        let prepared = if prepare {
            let mut options = SuspendOptions::new(root, self.config);
            options.driver = self.tool_driver.clone();
            carrier.apply(&mut options)?;
            Some(
                capture::prepare(&options, self.config.pin_ahead_budget)
                    .context("preparing the carriers")?,
            )
        } else {
            None
        };
        let mut cycles = Vec::new();
        for cycle in 1..=args.cycles {
            let state_dir = env.dir().join(format!("state-{cycle}"));
            let mut suspend_options = SuspendOptions::new(root, self.config);
            suspend_options.state_dir = state_dir.clone();
            suspend_options.driver = self.tool_driver.clone();
            carrier.apply(&mut suspend_options)?;
            let suspend = capture::suspend(&suspend_options, collector)
                .with_context(|| format!("suspend, cycle {cycle}"))?;
            let save = summarize_copies(collector.take("save"));
            let mut resume_options = ResumeOptions::new(root, self.config);
            resume_options.state_dir = state_dir;
            resume_options.driver = self.tool_driver.clone();
            let resume = capture::resume(&resume_options, collector)
                .with_context(|| format!("resume, cycle {cycle}"))?;
            let load = summarize_copies(collector.take("load"));
            collector.take("");
            cycles.push(Cycle {
                cycle,
                suspend_gb_per_s: gb_per_s(suspend.saved_bytes, suspend.total_millis),
                resume_gb_per_s: gb_per_s(resume.saved_bytes, resume.total_millis),
                speedup_vs_native: 0.0,
                suspend,
                resume,
                save,
                load,
            });
        }
        for (rank, w) in group.members().iter().enumerate() {
            w.assert_pattern(&format!("a{rank}"), seed(rank))
                .with_context(|| format!("contents of a{rank} after the last resume"))?;
            verified.push(format!(
                "a{rank}: contents kept in rank {rank} after {} cycles (--carrier {})",
                args.cycles,
                place_name(carrier)
            ));
        }
        // The group's memory goes before the next run, so that each fits on a small device.
        drop(group);
        Ok((cycles, prepared))
    }
}

/// The whole-process case: one workload under the shim holding a filled `cuMemAlloc` of the size
/// asked, suspended and resumed plainly twice (the first makes the carrier, the second shows every
/// later plain cycle), then twice with `--keep-contexts` (the first pins the carrier, the second
/// shows every later cycle), contents verified after each; then the native baseline of the same
/// bytes.
fn whole_bench(
    programs: &Programs,
    driver: &Driver,
    on_gpu: bool,
    args: &BenchArgs,
    config: &ToolConfig,
) -> anyhow::Result<Whole> {
    let size = args
        .whole_size
        .unwrap_or(if on_gpu { 16 << 30 } else { 64 << 20 });
    let env = Launcher::new(programs.clone(), true).context("preparing a directory")?;
    let w = env.spawn(
        WorkloadOptions::new("whole")
            .shim(true)
            .timeout(COMMAND_TIMEOUT),
    )?;
    w.ok(&format!("malloc m {size}"))?;
    w.ok("fill m 77")?;
    let pid = w.pid();
    let inspected = control::group::inspect(pid, None, config.answer_timeout)
        .context("inspecting the process")?;
    let owned_bytes: u64 = inspected
        .snapshots
        .iter()
        .flat_map(|s| &s.record.allocations)
        .map(|a| a.size)
        .sum();
    let memory = if owned_bytes >= size {
        "owned"
    } else {
        "native"
    };
    let tool_driver = (!on_gpu).then(|| driver.path().to_path_buf());
    let mut verified = Vec::new();
    let bars = Bars::new(false);
    let collector = Collector {
        bars: &bars,
        results: Mutex::new(Vec::new()),
    };
    let mut run = |mode: protocol::state::SuspendMode, tag: &str| -> anyhow::Result<WholeRun> {
        let state_dir = env.dir().join(format!("whole-{tag}"));
        let mut suspend_options = SuspendOptions::new(pid, config);
        suspend_options.state_dir = state_dir.clone();
        suspend_options.driver = tool_driver.clone();
        args.carrier.apply(&mut suspend_options)?;
        suspend_options.mode = mode;
        let suspend = capture::suspend(&suspend_options, &collector)
            .with_context(|| format!("suspend ({tag})"))?;
        let carrier = collector
            .take("save")
            .into_iter()
            .find_map(|(_, r)| r.stats.filter(|s| s.bytes > 0))
            .map(|s| s.mode);
        let mut resume_options = ResumeOptions::new(pid, config);
        resume_options.state_dir = state_dir;
        resume_options.driver = tool_driver.clone();
        let resume = capture::resume(&resume_options, &capture::Quiet)
            .with_context(|| format!("resume ({tag})"))?;
        w.assert_pattern("m", 77)
            .with_context(|| format!("contents after the {tag} resume"))?;
        verified.push(format!(
            "whole ({tag}): {} of cuMemAlloc memory kept",
            bytes(size)
        ));
        Ok(WholeRun {
            suspend_gb_per_s: gb_per_s(size, suspend.total_millis),
            resume_gb_per_s: gb_per_s(size, resume.total_millis),
            suspend_millis: suspend.total_millis,
            resume_millis: resume.total_millis,
            shim_bytes: suspend.saved_bytes,
            carrier,
        })
    };
    let plain_first = run(protocol::state::SuspendMode::Native, "plain-1")?;
    let plain = run(protocol::state::SuspendMode::Native, "plain-2")?;
    let keep_contexts_first = run(
        protocol::state::SuspendMode::KeepContexts,
        "keep-contexts-1",
    )?;
    let keep_contexts = run(
        protocol::state::SuspendMode::KeepContexts,
        "keep-contexts-2",
    )?;
    // The process's memory is freed before the baseline so both fit on a small device.
    drop(w);
    let native = native_baseline(&env, driver, size, &mut verified).context("native baseline")?;
    let native_millis = native.lock_millis
        + native.checkpoint_millis
        + native.restore_millis
        + native.unlock_millis;
    let ratio = |r: &WholeRun| {
        let ours = r.suspend_millis + r.resume_millis;
        if ours > 0.0 {
            native_millis / ours
        } else {
            0.0
        }
    };
    Ok(Whole {
        bytes: size,
        memory: memory.to_string(),
        owned_bytes,
        speedup_vs_native: ratio(&plain),
        speedup_vs_native_first: ratio(&plain_first),
        plain_first,
        plain,
        keep_contexts_first,
        keep_contexts,
        native,
        verified,
    })
}

fn print_whole(w: &Whole) {
    println!();
    println!(
        "whole process: {} of cuMemAlloc memory, {} (the shim's records hold {})",
        bytes(w.bytes),
        w.memory,
        bytes(w.owned_bytes)
    );
    let table = Table::new(&[
        ("RUN", 16, Align::Left),
        ("SUSPEND MS", 11, Align::Right),
        ("RESUME MS", 11, Align::Right),
        ("SUSP GB/S", 11, Align::Right),
        ("RES GB/S", 11, Align::Right),
        ("SHIM MOVED", 11, Align::Right),
        ("CARRIER", 11, Align::Right),
    ]);
    table.header();
    for (name, r) in [
        ("plain 1", &w.plain_first),
        ("plain 2", &w.plain),
        ("keep-contexts 1", &w.keep_contexts_first),
        ("keep-contexts 2", &w.keep_contexts),
    ] {
        table.row(&[
            name.to_string(),
            format!("{:.1}", r.suspend_millis),
            format!("{:.1}", r.resume_millis),
            format!("{:.2}", r.suspend_gb_per_s),
            format!("{:.2}", r.resume_gb_per_s),
            bytes(r.shim_bytes),
            r.carrier
                .map_or("-".to_string(), |m| format!("{m:?}").to_lowercase()),
        ]);
    }
    let n = &w.native;
    table.row(&[
        "native".to_string(),
        format!("{:.1}", n.lock_millis + n.checkpoint_millis),
        format!("{:.1}", n.restore_millis + n.unlock_millis),
        format!("{:.2}", n.checkpoint_gb_per_s),
        format!("{:.2}", n.restore_gb_per_s),
        "-".to_string(),
        "-".to_string(),
    ]);
    println!(
        "plain suspend+resume: {:.2}x native in the second cycle ({:.2}x in the first, which makes \
         the carrier); targets on the H200: >= 10x native, keep-contexts suspend and resume each \
         >= 40 GB/s",
        w.speedup_vs_native, w.speedup_vs_native_first
    );
    for v in &w.verified {
        println!("ok  {v}");
    }
}

/// One process without the shim, a filled `cuMemAlloc` of `size` bytes, checkpointed and
/// restored natively by this process.
fn native_baseline(
    env: &Launcher,
    driver: &Driver,
    size: u64,
    verified: &mut Vec<String>,
) -> anyhow::Result<Native> {
    let w = env.spawn(
        WorkloadOptions::new("native")
            .shim(false)
            .timeout(COMMAND_TIMEOUT),
    )?;
    w.ok(&format!("malloc m {size}"))?;
    w.ok("fill m 99")?;
    let pid = w.pid();
    let timed = |f: &dyn Fn() -> Result<(), control::ControlError>| {
        let start = Instant::now();
        f().map(|()| start.elapsed().as_secs_f64() * 1e3)
    };
    let lock_millis = timed(&|| driver.lock(pid, 10_000)).context("native lock")?;
    let checkpoint_millis = timed(&|| driver.checkpoint(pid)).context("native checkpoint")?;
    let restore_millis = timed(&|| driver.restore(pid, &[])).context("native restore")?;
    let unlock_millis = timed(&|| driver.unlock(pid)).context("native unlock")?;
    w.assert_pattern("m", 99)
        .context("contents after native restore")?;
    verified.push(format!(
        "native: {} of cuMemAlloc memory kept across checkpoint and restore",
        bytes(size)
    ));
    Ok(Native {
        bytes: size,
        lock_millis,
        checkpoint_millis,
        restore_millis,
        unlock_millis,
        checkpoint_gb_per_s: gb_per_s(size, lock_millis + checkpoint_millis),
        restore_gb_per_s: gb_per_s(size, restore_millis + unlock_millis),
    })
}

fn print_overhead(o: &Overhead) {
    println!();
    let cpu = o
        .cpu
        .map_or_else(|| "unpinned".to_string(), |c| format!("pinned to CPU {c}"));
    println!(
        "overhead: {} pairs of processes x {} alternating rounds ({cpu}), medians, ns per \
         iteration ({} untracked, {} tracked iterations a round); RATIO is the median of the \
         rounds' ratios, P10 and P90 their percentiles, MIN and MAX their extremes",
        o.repetitions, o.rounds, o.iterations, o.tracked_iterations
    );
    let table = Table::new(&[
        ("CALL", 22, Align::Left),
        ("NO SHIM", 12, Align::Right),
        ("SHIM", 12, Align::Right),
        ("RATIO", 8, Align::Right),
        ("P10", 8, Align::Right),
        ("P90", 8, Align::Right),
        ("MIN", 8, Align::Right),
        ("MAX", 8, Align::Right),
    ]);
    table.header();
    for r in o.untracked.iter().chain(&o.tracked) {
        table.row(&[
            r.name.clone(),
            format!("{:.1}", r.without_shim_ns),
            format!("{:.1}", r.with_shim_ns),
            format!("{:.3}", r.ratio),
            format!("{:.3}", r.ratio_p10),
            format!("{:.3}", r.ratio_p90),
            format!("{:.3}", r.ratio_spread.0),
            format!("{:.3}", r.ratio_spread.1),
        ]);
    }
    println!(
        "untracked ratio {:.3} (target <= 1.02), tracked cycle ratio {:.3} (target <= 1.10)",
        o.untracked_ratio, o.tracked_ratio
    );
    println!(
        "registry memory: {} bytes per tracked allocation ({})",
        o.registry_bytes_per_allocation, o.registry_source
    );
}

fn print_copy(what: &str, c: &CopySummary) {
    println!(
        "  {what:<5} {:>10} {:>9.1} ms {:>8.2} GB/s   pin {:>8.1} ms   carrier {:>8.1} ms{}   {} threads, {}{}",
        bytes(c.bytes),
        c.copy_millis,
        c.copy_gb_per_s,
        c.pin_millis,
        c.carrier_millis,
        if c.carriers_reused { " (reused)" } else { "" },
        c.threads,
        c.mode,
        if c.staged_fallbacks > 0 {
            format!(", {} staged fallbacks", c.staged_fallbacks)
        } else {
            String::new()
        }
    );
}

fn place_name(place: crate::CarrierPlace) -> &'static str {
    match place {
        crate::CarrierPlace::Auto => "auto",
        crate::CarrierPlace::Process => "process",
        crate::CarrierPlace::Helper => "helper",
    }
}

fn print_capture(c: &Capture) {
    println!();
    println!(
        "capture: {} processes, {} shared by each, {} in all",
        c.processes,
        bytes(c.bytes_per_process),
        bytes(c.shared_bytes)
    );
    for cycle in &c.cycles {
        println!();
        println!("cycle {}: suspend", cycle.cycle);
        crate::output::print_phases(&cycle.suspend.phases);
        println!("cycle {}: resume", cycle.cycle);
        crate::output::print_phases(&cycle.resume.phases);
        println!(
            "cycle {}: copies inside the shims (slowest shim)",
            cycle.cycle
        );
        print_copy("save", &cycle.save);
        print_copy("load", &cycle.load);
    }
    let n = &c.native;
    println!();
    println!(
        "native baseline ({} cuMemAlloc, no shim): lock {:.1} ms, checkpoint {:.1} ms, restore {:.1} ms, unlock {:.1} ms",
        bytes(n.bytes),
        n.lock_millis,
        n.checkpoint_millis,
        n.restore_millis,
        n.unlock_millis
    );
    println!();
    let table = Table::new(&[
        ("CYCLE", 6, Align::Left),
        ("SAVE GB/S", 11, Align::Right),
        ("LOAD GB/S", 11, Align::Right),
        ("SUSPEND MS", 11, Align::Right),
        ("RESUME MS", 11, Align::Right),
        ("SUSP GB/S", 11, Align::Right),
        ("RES GB/S", 11, Align::Right),
        ("X NATIVE", 9, Align::Right),
    ]);
    table.header();
    for cycle in &c.cycles {
        table.row(&[
            cycle.cycle.to_string(),
            format!("{:.2}", cycle.save.copy_gb_per_s),
            format!("{:.2}", cycle.load.copy_gb_per_s),
            format!("{:.1}", cycle.suspend.total_millis),
            format!("{:.1}", cycle.resume.total_millis),
            format!("{:.2}", cycle.suspend_gb_per_s),
            format!("{:.2}", cycle.resume_gb_per_s),
            format!("{:.2}", cycle.speedup_vs_native),
        ]);
    }
    table.row(&[
        "native".to_string(),
        "-".to_string(),
        "-".to_string(),
        format!("{:.1}", n.lock_millis + n.checkpoint_millis),
        format!("{:.1}", n.restore_millis + n.unlock_millis),
        format!("{:.2}", n.checkpoint_gb_per_s),
        format!("{:.2}", n.restore_gb_per_s),
        "1.00".to_string(),
    ]);
    println!(
        "targets on the H200: save and load copies >= 45 GB/s per GPU; suspend+resume >= 5x native"
    );
    if !c.comparison.is_empty() {
        println!();
        println!("carriers compared (each on a fresh group; the default's choice first):");
        let table = Table::new(&[
            ("CARRIER", 22, Align::Left),
            ("CYCLE", 6, Align::Left),
            ("SUSPEND MS", 11, Align::Right),
            ("RESUME MS", 11, Align::Right),
            ("X NATIVE", 9, Align::Right),
            ("PINNED HOST", 12, Align::Right),
            ("HELPER GPU", 12, Align::Right),
        ]);
        table.header();
        let runs = std::iter::once(("auto", c.cycles.as_slice(), None)).chain(
            c.comparison.iter().map(|r| {
                (
                    place_name(r.carrier),
                    r.cycles.as_slice(),
                    r.refused.as_deref(),
                )
            }),
        );
        for (name, cycles, refused) in runs {
            if let Some(why) = refused {
                println!("{name:<22} refused: {why}");
            }
            for cycle in cycles {
                let choice = cycle.suspend.carrier.as_ref();
                let chosen = choice.map_or(String::new(), |ch| {
                    format!("{name} ({})", crate::output::carrier_name(ch.carrier))
                });
                table.row(&[
                    chosen,
                    cycle.cycle.to_string(),
                    format!("{:.1}", cycle.suspend.total_millis),
                    format!("{:.1}", cycle.resume.total_millis),
                    format!("{:.2}", cycle.speedup_vs_native),
                    bytes(choice.map_or(0, |ch| ch.pinned_host_bytes)),
                    bytes(choice.map_or(0, |ch| ch.helper_gpu_bytes)),
                ]);
            }
        }
        if let Some(p) = &c.prepared {
            let pinned: u64 = p.processes.iter().map(|p| p.pinned_bytes).sum();
            println!(
                "auto's group was prepared first (cuinterpose prepare): {} pinned ahead in {:.1} ms",
                bytes(pinned),
                p.total_millis
            );
        }
        if let Some(choice) = c.cycles.first().and_then(|c| c.suspend.carrier.as_ref()) {
            println!(
                "auto chose {}: {}",
                crate::output::carrier_name(choice.carrier),
                choice.reason
            );
        }
    }
    for v in &c.verified {
        println!("ok  {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999T").is_err());
    }

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
