//! The whole-process case of `cuinterpose bench`: one workload under the shim holding a filled
//! `cuMemAlloc`, suspended and resumed plainly and with `--keep-contexts`, against the driver's own
//! checkpoint of a process without the shim holding the same bytes.

use super::capture::{Collector, native_baseline};
use super::{BenchOptions, COMMAND_TIMEOUT, Whole, WholeRun};
use crate::target::{Target, apply_carrier, prepare};
use crate::{bytes, gb_per_s};
use anyhow::Context;
use control::capture::{self, ResumeOptions, SuspendOptions};
use control::carrier_choice::Requested;
use control::config::ToolConfig;
use protocol::state::SuspendMode;
use workload::launch::{Launcher, Workload, WorkloadOptions};

/// One workload holding a filled `cuMemAlloc` of `--whole-size` bytes, prepared as a user of the
/// default carrier prepares it (`cuinterpose prepare`, as the group case does), suspended and
/// resumed plainly twice (the first makes the carrier unless it was prepared, the second shows
/// every later plain cycle), then twice with `--keep-contexts` (prepared for them first with the
/// default carrier, else the first pins the carrier; the second shows every later cycle), contents verified after each; then the native baseline of the
/// same bytes.
pub(crate) fn whole(
    target: &Target,
    args: &BenchOptions,
    config: &ToolConfig,
) -> anyhow::Result<Whole> {
    let size = args
        .whole_size
        .unwrap_or(if target.on_gpu { 16 << 30 } else { 64 << 20 });
    let env = Launcher::new(target.programs.clone(), true).context("preparing a directory")?;
    let w = env.spawn(
        WorkloadOptions::new("whole")
            .shim(true)
            .timeout(COMMAND_TIMEOUT),
    )?;
    w.ok(&format!("malloc m {size}"))?;
    w.ok("fill m 77")?;
    let inspected = control::group::inspect(w.pid(), None, config.answer_timeout)
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
    let prepared = if args.carrier == Requested::Auto {
        Some(prepare(
            w.pid(),
            SuspendMode::Native,
            args.carrier,
            target.tool_driver(),
            config,
        )?)
    } else {
        None
    };
    let mut cycles = WholeCycles {
        target,
        args,
        config,
        env: &env,
        w: &w,
        size,
        collector: Collector::new(&capture::Quiet),
        verified: Vec::new(),
    };
    let plain_first = cycles.run(SuspendMode::Native, "plain-1")?;
    let plain = cycles.run(SuspendMode::Native, "plain-2")?;
    // As a user of keep-contexts cycles prepares them (`cuinterpose prepare --keep-contexts`).
    let prepared_keep_contexts = if args.carrier == Requested::Auto {
        Some(prepare(
            w.pid(),
            SuspendMode::KeepContexts,
            args.carrier,
            target.tool_driver(),
            config,
        )?)
    } else {
        None
    };
    let keep_contexts_first = cycles.run(SuspendMode::KeepContexts, "keep-contexts-1")?;
    let keep_contexts = cycles.run(SuspendMode::KeepContexts, "keep-contexts-2")?;
    let mut verified = std::mem::take(&mut cycles.verified);
    drop(cycles);
    // The process's memory is freed before the baseline so both fit on a small device.
    drop(w);
    let native =
        native_baseline(&env, &target.driver, size, &mut verified).context("native baseline")?;
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
        prepared,
        prepared_keep_contexts,
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

/// What every suspend and resume of the whole-process case shares.
struct WholeCycles<'a> {
    target: &'a Target,
    args: &'a BenchOptions,
    config: &'a ToolConfig,
    env: &'a Launcher,
    /// The process, holding `m`.
    w: &'a Workload,
    size: u64,
    collector: Collector<'a>,
    /// A line per cycle whose contents were checked.
    verified: Vec<String>,
}

impl WholeCycles<'_> {
    /// One suspend in `mode` and its resume, state under `whole-<tag>`, contents checked after.
    fn run(&mut self, mode: SuspendMode, tag: &str) -> anyhow::Result<WholeRun> {
        let (pid, size) = (self.w.pid(), self.size);
        let state_dir = self.env.dir().join(format!("whole-{tag}"));
        let mut suspend_options = SuspendOptions::new(pid, self.config);
        suspend_options.state_dir = state_dir.clone();
        suspend_options.driver = self.target.tool_driver();
        apply_carrier(self.args.carrier, &mut suspend_options)?;
        suspend_options.mode = mode;
        let mut suspend = capture::suspend(&suspend_options, &self.collector)
            .with_context(|| format!("suspend ({tag})"))?;
        let carrier = self
            .collector
            .take("save")
            .into_iter()
            .find_map(|(_, r)| r.stats.filter(|s| s.bytes > 0))
            .map(|s| s.mode);
        let mut resume_options = ResumeOptions::new(pid, self.config);
        resume_options.state_dir = state_dir;
        resume_options.driver = suspend_options.driver.clone();
        let mut resume = capture::resume(&resume_options, &capture::Quiet)
            .with_context(|| format!("resume ({tag})"))?;
        self.w
            .assert_pattern("m", 77)
            .with_context(|| format!("contents after the {tag} resume"))?;
        self.verified.push(format!(
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
            carrier_reused: suspend
                .carrier
                .as_ref()
                .and_then(|c| c.save.as_ref())
                .map(|s| s.carriers_reused),
            save_copy_millis: suspend
                .carrier
                .as_ref()
                .and_then(|c| c.save.as_ref())
                .map(|s| s.copy_millis),
            suspend_phases: std::mem::take(&mut suspend.phases),
            resume_phases: std::mem::take(&mut resume.phases),
        })
    }
}
