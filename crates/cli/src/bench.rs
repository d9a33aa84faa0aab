//! `cuinterpose bench`: its arguments, the parts it runs (cuinterpose_demo::bench) and their
//! tables (crate::bench_tables) or JSON report. Each part's table is printed as the part ends.

use crate::bench_tables::{print_capture, print_disk, print_launch, print_overhead, print_whole};
use crate::progress::Bars;
use anyhow::{Context, ensure};
use control::config::ToolConfig;
use cuinterpose_demo::bench::{Bench, BenchOptions, BenchReport};
use std::path::PathBuf;

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

pub fn bench(args: BenchArgs, config: &ToolConfig) -> anyhow::Result<()> {
    ensure!(
        args.processes >= 2,
        "--processes must be at least 2 to share memory both ways"
    );
    ensure!(args.cycles >= 1, "--cycles must be at least 1");
    ensure!(args.repetitions >= 1, "--repetitions must be at least 1");
    let bench = Bench::new(args.options(), args.fake)?;
    let tables = !args.json;
    let mut report = BenchReport {
        driver: bench.driver_name.clone(),
        on_gpu: bench.on_gpu(),
        carrier: args.carrier.into(),
        overhead: None,
        capture: None,
        whole: None,
        disk: None,
        launch: None,
    };
    if args.launch {
        if tables {
            println!("cuinterpose bench --launch on the {}", bench.driver_name);
        }
        let launch = bench.launch()?;
        if tables {
            print_launch(&launch);
        }
        report.launch = Some(launch);
        return write_report(&report, &args);
    }
    if tables {
        println!("cuinterpose bench on the {}", bench.driver_name);
        if args.carrier == crate::CarrierPlace::Helper {
            println!("every suspend saves through the carrier helper (--carrier helper)");
        }
    }
    run_parts(&bench, &args, config, &mut report)?;
    write_report(&report, &args)
}

/// The parts the arguments leave in, in order, each table printed as its part ends.
fn run_parts(
    bench: &Bench,
    args: &BenchArgs,
    config: &ToolConfig,
    report: &mut BenchReport,
) -> anyhow::Result<()> {
    let tables = !args.json;
    if !args.no_overhead {
        let o = bench.overhead()?;
        if tables {
            print_overhead(&o);
        }
        report.overhead = Some(o);
    }
    if !args.no_capture {
        let c = bench.capture(config, &Bars::new(tables))?;
        if tables {
            print_capture(&c);
        }
        report.capture = Some(c);
    }
    if !args.no_whole {
        let w = bench.whole(config)?;
        if tables {
            print_whole(&w);
        }
        report.whole = Some(w);
    }
    if let Some(dir) = &args.to_disk {
        let d = bench.to_disk(dir, config, &Bars::new(true))?;
        if tables {
            print_disk(&d);
        }
        report.disk = Some(d);
    }
    Ok(())
}

impl BenchArgs {
    /// What the parts run with.
    fn options(&self) -> BenchOptions {
        BenchOptions {
            size: self.size,
            processes: self.processes,
            cycles: self.cycles,
            iterations: self.iterations,
            tracked_iterations: self.tracked_iterations,
            repetitions: self.repetitions,
            rounds: self.rounds,
            cpu: self.cpu,
            whole_size: self.whole_size,
            carrier: self.carrier.into(),
            launch_threads: self.launch_threads,
            launch_iterations: self.launch_iterations,
        }
    }
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
}
