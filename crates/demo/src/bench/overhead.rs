//! The overhead and the launch-bound cases of `cuinterpose bench`: pairs of long-lived
//! `cuinterpose-workload bench --serve-rounds` processes, one without and one with the shim, run
//! rounds in alternation, and the rounds' figures are paired.

use super::{BenchOptions, Launch, Overhead, Ratio, median};
use anyhow::{Context, ensure};
use std::path::PathBuf;
use workload::launch::{Launcher, Programs};

/// Registry memory per tracked allocation (one allocation mapped twice with access for two
/// devices), measured with a counting allocator by `crates/shim-runtime/tests/registry_memory.rs`.
const REGISTRY_BYTES_PER_ALLOCATION: u64 = 621;

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

/// `--repetitions` pairs of overhead processes, `--rounds` alternating rounds each.
pub(crate) fn overhead(programs: &Programs, args: &BenchOptions) -> anyhow::Result<Overhead> {
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
fn overhead_args(args: &BenchOptions, cpu: Option<usize>) -> Vec<String> {
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

/// Pairs of launch-bound processes (without and with the shim, unpinned: their threads need
/// CPUs of their own), rounds in alternation as for the overhead.
pub(crate) fn launch(programs: &Programs, args: &BenchOptions) -> anyhow::Result<Launch> {
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
