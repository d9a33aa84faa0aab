//! `cuinterpose demo`: the main job. A small group of processes under the shim shares GPU memory
//! both ways (a ring: each creates an allocation and exports it to the next), is suspended, shown to
//! hold no GPU memory, resumed, and shown to have kept its contents and its sharing: writes by one
//! process are visible to the other afterwards.
//!
//! It runs on the GPU when the machine has one, otherwise on the bundled fake driver, and says which.

use crate::output::{bytes, print_phases};
use crate::progress::Bars;
use anyhow::{Context, bail, ensure};
use control::capture::{self, Report, ResumeOptions, SuspendOptions};
use control::native::Driver;
use std::path::{Path, PathBuf};
use testkit::harness::{Artifacts, DriverKind, Group, TestEnv, WorkloadOptions};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Processes in the group (each creates one shared allocation and imports its neighbour's)
    #[arg(long, default_value_t = 2)]
    processes: usize,
    /// Bytes each process shares (default: 1 GiB on a GPU, 64 MiB on the fake driver)
    #[arg(long)]
    size: Option<u64>,
    /// Use the bundled fake driver even when a GPU is present
    #[arg(long)]
    fake: bool,
    /// Print a JSON report instead of tables
    #[arg(long)]
    json: bool,
}

/// What the demo proved, for `--json`.
#[derive(Debug, serde::Serialize)]
struct DemoReport {
    driver: String,
    processes: usize,
    bytes_per_process: u64,
    group_memory_before: u64,
    group_memory_suspended: u64,
    suspend: Report,
    resume: Report,
    verified: Vec<String>,
}

pub fn demo(args: DemoArgs) -> anyhow::Result<()> {
    ensure!(
        args.processes >= 2,
        "--processes must be at least 2 to share memory both ways"
    );
    let here = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .context("no executable dir")?;
    let artifacts = Artifacts::at(&here);
    let (kind, driver) = pick_driver(&artifacts, args.fake)?;
    let on_gpu = kind == DriverKind::System;
    let size = args.size.unwrap_or(if on_gpu { 1 << 30 } else { 64 << 20 });
    let driver_name = if on_gpu {
        format!(
            "GPU ({}, driver API {})",
            driver.path().display(),
            driver.version()
        )
    } else {
        format!("fake driver ({}; no GPU found)", driver.path().display())
    };
    if !args.json {
        println!(
            "cuinterpose demo on the {driver_name}: {} processes, {} shared by each",
            args.processes,
            bytes(size)
        );
    }

    let env = TestEnv::new(artifacts, kind, true).context("preparing the demo's directory")?;
    let group = Group::tree(
        &env,
        args.processes,
        WorkloadOptions::new("demo").shim(true),
    )
    .context("starting the workload group")?;
    group.ring(size).context("sharing memory around the ring")?;
    let root = group[0].pid();
    let pids: Vec<u32> = group.members().iter().map(|w| w.pid()).collect();
    for (rank, w) in group.members().iter().enumerate() {
        w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
    }
    let before = group_memory(&env, &driver, on_gpu, &pids)?;

    let state_dir = env.dir().join("state");
    let mut suspend_options = SuspendOptions::new(root);
    suspend_options.state_dir = state_dir.clone();
    suspend_options.driver = (!on_gpu).then(|| driver.path().to_path_buf());
    let progress = Bars::new(!args.json);
    let suspended = capture::suspend(&suspend_options, &progress).context("suspend")?;
    let during = group_memory(&env, &driver, on_gpu, &pids)?;

    let mut resume_options = ResumeOptions::new(root);
    resume_options.state_dir = state_dir;
    resume_options.driver = suspend_options.driver.clone();
    let resumed = capture::resume(&resume_options, &progress).context("resume")?;

    let verified = verify_after_resume(&group).context("verifying after resume")?;
    if !on_gpu && during != 0 {
        bail!(
            "the suspended group still holds {} of device memory",
            bytes(during)
        );
    }
    let report = DemoReport {
        driver: driver_name,
        processes: args.processes,
        bytes_per_process: size,
        group_memory_before: before,
        group_memory_suspended: during,
        suspend: suspended,
        resume: resumed,
        verified,
    };
    if args.json {
        crate::output::print_json(&report)
    } else {
        print_demo(&report, on_gpu);
        Ok(())
    }
}

/// The GPU when a driver with devices loads, else the bundled fake.
fn pick_driver(artifacts: &Artifacts, force_fake: bool) -> anyhow::Result<(DriverKind, Driver)> {
    if !force_fake {
        if let Ok(driver) = Driver::load(None) {
            let fake = std::fs::canonicalize(artifacts.dir().join("libcuda.so")).ok();
            let is_fake = fake.as_deref() == Some(driver.path());
            if !is_fake && driver.device_count().unwrap_or(0) > 0 {
                return Ok((DriverKind::System, driver));
            }
        }
    }
    let fake: PathBuf = artifacts.fake_driver().context(
        "the bundled fake driver (libcuda.so next to cuinterpose) is missing; build the workspace",
    )?;
    let driver = Driver::load(Some(&fake)).context("loading the fake driver")?;
    Ok((DriverKind::Fake, driver))
}

/// Device memory the group holds: the fake driver's per-process accounting, or on a GPU the
/// device's used memory (`cuMemGetInfo`, which also counts other processes on the machine).
fn group_memory(env: &TestEnv, driver: &Driver, on_gpu: bool, pids: &[u32]) -> anyhow::Result<u64> {
    if on_gpu {
        let (free, total) = driver.memory_info(0)?;
        return Ok(total - free);
    }
    let mut sum = 0;
    for &pid in pids {
        for device in 0..driver.device_count()? {
            sum += env.fake_usage(pid, device as i32)?;
        }
    }
    Ok(sum)
}

fn seed(rank: usize, round: u64) -> u64 {
    1000 * round + rank as u64 + 1
}

/// Contents survived, and sharing is alive both ways: each importer sees the creator's bytes, then
/// writes new ones that the creator sees.
fn verify_after_resume(group: &Group) -> anyhow::Result<Vec<String>> {
    let n = group.len();
    let mut checks = Vec::new();
    for creator in 0..n {
        let importer = (creator + 1) % n;
        let region = format!("a{creator}");
        group[creator].assert_pattern(&region, seed(creator, 1))?;
        group[importer].assert_pattern(&region, seed(creator, 1))?;
        checks.push(format!(
            "{region}: contents kept in creator rank {creator} and importer rank {importer}"
        ));
        group[importer].ok(&format!("fill {region} {}", seed(creator, 2)))?;
        group[creator].assert_pattern(&region, seed(creator, 2))?;
        checks.push(format!(
            "{region}: a write by rank {importer} after resume is seen by rank {creator}"
        ));
    }
    Ok(checks)
}

fn print_demo(report: &DemoReport, on_gpu: bool) {
    println!();
    println!("suspend");
    print_phases(&report.suspend.phases);
    println!("resume");
    print_phases(&report.resume.phases);
    println!();
    let what = if on_gpu {
        "GPU memory in use (whole device)"
    } else {
        "device memory held by the group"
    };
    println!(
        "{what}: {} running, {} suspended",
        bytes(report.group_memory_before),
        bytes(report.group_memory_suspended)
    );
    for check in &report.verified {
        println!("ok  {check}");
    }
    println!(
        "demo passed: {} processes, {} shared, suspend {:.1} ms, resume {:.1} ms",
        report.processes,
        bytes(report.suspend.shared_bytes),
        report.suspend.total_millis,
        report.resume.total_millis
    );
}
