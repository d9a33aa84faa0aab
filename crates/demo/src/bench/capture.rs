//! The capture case of `cuinterpose bench`: a ring group under the shim suspended and resumed in
//! place, every phase timed with the shims' own copy statistics, against the driver's native
//! checkpoint of the same bytes.

use super::{
    BenchOptions, COMMAND_TIMEOUT, Capture, CarrierRun, CopySummary, Cycle, GRANULE, Native,
};
use crate::target::{self, Target, apply_carrier, carrier_flag};
use crate::{bytes, gb_per_s};
use anyhow::Context;
use control::ControlError;
use control::capture::{self, PhaseTiming, Progress, ResumeOptions, SuspendOptions};
use control::carrier_choice::Requested;
use control::config::ToolConfig;
use control::group::PhaseResult;
use control::native::Driver;
use protocol::message::CopyStats;
use protocol::state::SuspendMode;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;
use workload::launch::{Group, Launcher, Programs, WorkloadOptions};

/// Forwards progress to the caller's and keeps what each shim reported.
pub(crate) struct Collector<'a> {
    bars: &'a dyn Progress,
    results: Mutex<Vec<(&'static str, String, PhaseResult)>>,
}

impl<'a> Collector<'a> {
    pub(crate) fn new(bars: &'a dyn Progress) -> Collector<'a> {
        Collector {
            bars,
            results: Mutex::new(Vec::new()),
        }
    }

    /// What each shim reported for `step` since the last take.
    pub(crate) fn take(&self, step: &str) -> Vec<(String, PhaseResult)> {
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

/// The pattern rank `rank` of a bench group holds.
fn seed(rank: usize) -> u64 {
    7000 + rank as u64
}

/// `--cycles` suspends and resumes of a ring group with `--carrier`; with `auto`, the same of a
/// fresh group with each carrier asked for; and the native baseline of the same bytes.
pub(crate) fn capture(
    target: &Target,
    args: &BenchOptions,
    config: &ToolConfig,
    progress: &dyn Progress,
) -> anyhow::Result<Capture> {
    let total = args.shared_size(target.on_gpu);
    let per = (total / args.processes as u64)
        .div_ceil(GRANULE)
        .max(1)
        .saturating_mul(GRANULE);
    let env = Launcher::new(target.programs.clone(), true).context("preparing a directory")?;
    let collector = Collector::new(progress);
    let cycles = Cycles {
        args,
        config,
        per,
        tool_driver: &target.tool_driver(),
        collector: &collector,
    };
    let mut verified = Vec::new();
    let auto = args.carrier == Requested::Auto;
    let (mut main, prepared) = cycles
        .run(&env, args.carrier, auto, &mut verified)
        .context("the capture cycles")?;
    let mut comparison = Vec::new();
    if auto {
        comparison = compare_carriers(&cycles, &target.programs, &mut verified)?;
    }
    let native =
        native_baseline(&env, &target.driver, total, &mut verified).context("native baseline")?;
    let runs = main
        .iter_mut()
        .chain(comparison.iter_mut().flat_map(|r| r.cycles.iter_mut()));
    set_speedups(runs, &native);
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

/// Auto's choice against each carrier asked for, each on a fresh group (and so a fresh carrier
/// helper: its first cycle pins again); a carrier the machine refuses is a run with no cycles.
fn compare_carriers(
    cycles: &Cycles<'_>,
    programs: &Programs,
    verified: &mut Vec<String>,
) -> anyhow::Result<Vec<CarrierRun>> {
    let mut comparison = Vec::new();
    for carrier in [Requested::Process, Requested::Helper] {
        let fresh = Launcher::new(programs.clone(), true).context("preparing a directory")?;
        match cycles.run(&fresh, carrier, false, verified) {
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
                return Err(e.context(format!(
                    "the cycles with --carrier {}",
                    carrier_flag(carrier)
                )));
            }
        }
    }
    Ok(comparison)
}

/// Each cycle's bytes per second of suspend+resume over the native checkpoint+restore's.
fn set_speedups<'a>(cycles: impl Iterator<Item = &'a mut Cycle>, native: &Native) {
    let native_rate = gb_per_s(
        native.bytes,
        native.lock_millis
            + native.checkpoint_millis
            + native.restore_millis
            + native.unlock_millis,
    );
    for c in cycles {
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
}

/// What every run of the capture's cycles shares.
struct Cycles<'a> {
    args: &'a BenchOptions,
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
        carrier: Requested,
        prepare: bool,
        verified: &mut Vec<String>,
    ) -> anyhow::Result<(Vec<Cycle>, Option<control::capture::PrepareReport>)> {
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
            Some(target::prepare(
                root,
                SuspendMode::Native,
                carrier,
                self.tool_driver.clone(),
                self.config,
            )?)
        } else {
            None
        };
        let mut cycles = Vec::new();
        for cycle in 1..=args.cycles {
            let state_dir = env.dir().join(format!("state-{cycle}"));
            let mut suspend_options = SuspendOptions::new(root, self.config);
            suspend_options.state_dir = state_dir.clone();
            suspend_options.driver = self.tool_driver.clone();
            apply_carrier(carrier, &mut suspend_options)?;
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
                carrier_flag(carrier)
            ));
        }
        // The group's memory goes before the next run, so that each fits on a small device.
        drop(group);
        Ok((cycles, prepared))
    }
}

/// One process without the shim, a filled `cuMemAlloc` of `size` bytes, checkpointed and
/// restored natively by this process.
pub(crate) fn native_baseline(
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
