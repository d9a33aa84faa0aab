//! `cuinterpose demo`: the main job. A small group of processes under the shim shares GPU memory
//! both ways (a ring: each creates an allocation and exports it to the next), is suspended, shown to
//! hold no GPU memory, resumed, and shown to have kept its contents and its sharing: writes by one
//! process are visible to the other afterwards.
//!
//! With `--to-disk` the group goes through disk instead: it is started as the root of its own PID
//! namespace (`cuinterpose run --pid-namespace`), checkpointed with CRIU, shown to be gone,
//! restored into new processes and verified the same way.
//!
//! It runs on the GPU when the machine has one, otherwise on the bundled fake driver, and says which.

use crate::output::{bytes, print_phases};
use crate::progress::Bars;
use anyhow::{Context, bail, ensure};
use control::capture::{self, Report, ResumeOptions, SuspendOptions};
use control::config::ToolConfig;
use control::disk::{self, CheckpointOptions, DiskReport, RestoreOptions};
use control::native::Driver;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;
use testkit::harness::{Artifacts, DriverKind, Group, TestEnv, Workload, WorkloadOptions};

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
    /// Through disk: start the group in its own PID namespace, checkpoint it with CRIU, restore it
    /// into new processes (CRIU from --criu, $CUINTERPOSE_CRIU, the bundled CRIU, or PATH)
    #[arg(long)]
    to_disk: bool,
    /// The CRIU binary for --to-disk
    #[arg(long, requires = "to_disk")]
    criu: Option<PathBuf>,
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

pub fn demo(args: DemoArgs, config: &ToolConfig) -> anyhow::Result<()> {
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
    if args.to_disk {
        return demo_to_disk(&args, config, &env, &driver, driver_name, on_gpu, size);
    }
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
    let mut suspend_options = SuspendOptions::new(root, config);
    suspend_options.state_dir = state_dir.clone();
    suspend_options.driver = (!on_gpu).then(|| driver.path().to_path_buf());
    let progress = Bars::new(!args.json);
    let suspended = capture::suspend(&suspend_options, &progress).context("suspend")?;
    let during = group_memory(&env, &driver, on_gpu, &pids)?;

    let mut resume_options = ResumeOptions::new(root, config);
    resume_options.state_dir = state_dir;
    resume_options.driver = suspend_options.driver.clone();
    let resumed = capture::resume(&resume_options, &progress).context("resume")?;

    let verified = verify_after(group.members(), "resume").context("verifying after resume")?;
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
pub(crate) fn pick_driver(
    artifacts: &Artifacts,
    force_fake: bool,
) -> anyhow::Result<(DriverKind, Driver)> {
    if !force_fake && let Ok(driver) = Driver::load(None) {
        let fake = artifacts
            .fake_driver()
            .ok()
            .and_then(|f| std::fs::canonicalize(f).ok());
        let is_fake = fake.as_deref() == Some(driver.path());
        if !is_fake && driver.device_count().unwrap_or(0) > 0 {
            return Ok((DriverKind::System, driver));
        }
    }
    let fake: PathBuf = artifacts.fake_driver().context(
        "the bundled fake driver (libcuda.so next to cuinterpose, or lib/cuinterpose/test-driver/ in the release) is missing; build the workspace",
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

pub(crate) fn seed(rank: usize, round: u64) -> u64 {
    1000 * round + rank as u64 + 1
}

/// Contents survived, and sharing is alive both ways: each importer sees the creator's bytes, then
/// writes new ones that the creator sees.
pub(crate) fn verify_after(group: &[Workload], what: &str) -> anyhow::Result<Vec<String>> {
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
            "{region}: a write by rank {importer} after {what} is seen by rank {creator}"
        ));
    }
    Ok(checks)
}

/// What the demo through disk proved, for `--json`.
#[derive(Debug, serde::Serialize)]
struct DiskDemoReport {
    driver: String,
    processes: usize,
    bytes_per_process: u64,
    group_memory_before: u64,
    /// After the dump: the processes are gone, so this is what nothing holds any more.
    group_memory_checkpointed: u64,
    group_memory_restored: u64,
    /// Host PIDs of the dumped processes, each checked to be gone before the restore.
    gone: Vec<u32>,
    checkpoint: DiskReport,
    restore: DiskReport,
    verified: Vec<String>,
}

/// How long the group gets to start, and the launcher to exit after the dump.
const DISK_DEMO_TIMEOUT: Duration = Duration::from_secs(120);

/// The demo through disk (`--to-disk`).
fn demo_to_disk(
    args: &DemoArgs,
    config: &ToolConfig,
    env: &TestEnv,
    driver: &Driver,
    driver_name: String,
    on_gpu: bool,
    size: u64,
) -> anyhow::Result<()> {
    let listen = env.socket_dir().join("disk");
    let mut launched = launch_tree(env, &listen, args.processes)?;
    let ranks = attach_ranks(&listen, args.processes)?;
    ring(&ranks, size).context("sharing memory around the ring")?;
    for (rank, w) in ranks.iter().enumerate() {
        w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
    }
    let ns_pids: Vec<u32> = ranks.iter().map(Workload::pid).collect();
    let before = group_memory(env, driver, on_gpu, &ns_pids)?;

    let dir = env.dir().join("checkpoint");
    let mut capture = SuspendOptions::new(launched.launcher.id(), config);
    capture.driver = (!on_gpu).then(|| driver.path().to_path_buf());
    let progress = Bars::new(!args.json);
    let checkpoint = disk::checkpoint(
        &CheckpointOptions {
            capture: capture.clone(),
            dir: dir.clone(),
            leave_running: false,
            criu: args.criu.clone(),
        },
        &progress,
    )
    .context("checkpoint to disk")?;

    // CRIU ended the tree: the launcher sees its workload killed and exits; every dumped
    // process must be gone before the restore brings them back.
    control::launch::wait_exit(launched.launcher.id(), DISK_DEMO_TIMEOUT)
        .context("waiting for the launcher after the dump")?;
    let _ = launched.launcher.wait();
    let gone: Vec<u32> = checkpoint
        .report
        .participants
        .iter()
        .map(|p| p.host_pid)
        .collect();
    for &pid in &gone {
        ensure!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still exists after the dump"
        );
    }
    let checkpointed = group_memory(env, driver, on_gpu, &ns_pids)?;

    let restore = disk::restore(
        &RestoreOptions {
            dir,
            device_map: Vec::new(),
            criu: args.criu.clone(),
            driver: capture.driver.clone(),
            config: config.clone(),
        },
        &progress,
    )
    .context("restore from disk")?;
    launched.restored = Some(restore.root);
    let ranks = attach_ranks(&listen, args.processes)?;
    let verified = verify_after(&ranks, "restore").context("verifying after the restore")?;
    let restored = group_memory(env, driver, on_gpu, &ns_pids)?;
    if !on_gpu {
        ensure!(
            checkpointed == 0,
            "{} of device memory is still charged after the dump",
            bytes(checkpointed)
        );
        ensure!(
            restored == before,
            "the restored group holds {}, not the {} it held before",
            bytes(restored),
            bytes(before)
        );
    }
    let report = DiskDemoReport {
        driver: driver_name,
        processes: args.processes,
        bytes_per_process: size,
        group_memory_before: before,
        group_memory_checkpointed: checkpointed,
        group_memory_restored: restored,
        gone,
        checkpoint,
        restore,
        verified,
    };
    if args.json {
        crate::output::print_json(&report)
    } else {
        print_disk_demo(&report, on_gpu);
        Ok(())
    }
}

/// The group's launcher and, once restored, the restored tree: both ended when the demo ends.
pub(crate) struct Launched {
    pub(crate) launcher: Child,
    pub(crate) restored: Option<u32>,
}

impl Drop for Launched {
    fn drop(&mut self) {
        let mut roots: Vec<u32> = self.restored.into_iter().collect();
        if matches!(self.launcher.try_wait(), Ok(None)) {
            // The launcher's child is the namespace's init: killing it ends the namespace.
            if let Some(&init) = control::discovery::process_tree(self.launcher.id())
                .ok()
                .and_then(|tree| tree.get(1).copied())
                .as_ref()
            {
                roots.push(init);
            }
        }
        for root in roots {
            if let Err(e) = control::launch::kill_tree(root, Duration::from_secs(30)) {
                eprintln!("cuinterpose demo: ending pid {root}: {e}");
            }
        }
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

/// `cuinterpose run --pid-namespace -- cuinterpose-workload tree --processes N ...`, every rank
/// on device 0; waits until rank 0 (which waits for the others) answers.
pub(crate) fn launch_tree(
    env: &TestEnv,
    listen: &Path,
    processes: usize,
) -> anyhow::Result<Launched> {
    let me = std::env::current_exe().context("finding this executable")?;
    let workload = env.artifacts().workload()?;
    let log_path = env.log_dir().join("launcher.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    // The shim comes from `run` itself; stdio goes to files (CRIU restores no terminal).
    let mut command = env.command(&me, false)?;
    command
        .arg("run")
        .arg("--pid-namespace")
        .arg("--")
        .arg(&workload)
        .arg("tree")
        .arg("--processes")
        .arg(processes.to_string())
        .arg("--devices")
        .arg("0")
        .arg("--listen-dir")
        .arg(listen)
        .stdout(log.try_clone()?)
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let launcher = command.spawn().context("starting the launcher")?;
    let mut launched = Launched {
        launcher,
        restored: None,
    };
    let ready = testkit::wire::wait_listening(&listen.join("0.sock"), DISK_DEMO_TIMEOUT, || {
        matches!(launched.launcher.try_wait(), Ok(None))
    });
    if let Err(e) = ready {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        bail!("the group did not start: {e}\n{log}");
    }
    Ok(launched)
}

/// Handles on the ranks of a tree listening in `listen` (the original or a restored one).
pub(crate) fn attach_ranks(listen: &Path, processes: usize) -> anyhow::Result<Vec<Workload>> {
    (0..processes)
        .map(|r| {
            Workload::attach(
                format!("rank{r}"),
                listen.join(format!("{r}.sock")),
                0,
                listen.join(format!("{r}.log")),
            )
            .with_context(|| format!("reaching rank {r}"))
        })
        .collect()
}

/// The ring of [`Group::ring`] on attached ranks: rank `i` creates `a<i>` and shares it with
/// rank `(i + 1) % n`, which imports and maps it.
pub(crate) fn ring(ranks: &[Workload], size: u64) -> anyhow::Result<()> {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        w.all_ok(&[
            &format!("create a{i} {size} --handle-types posix"),
            &format!("reserve r-a{i} {size}"),
            &format!("map a{i} r-a{i}"),
            &format!("set-access a{i} --device {}", w.device()),
            &format!("export a{i}"),
        ])?;
    }
    for (i, creator) in ranks.iter().enumerate() {
        let to = (i + 1) % n;
        creator.ok(&format!("send-fd a{i} --to {to}"))?;
        let w = &ranks[to];
        w.all_ok(&[
            &format!("wait fd a{i}"),
            &format!("import a{i} --size {size}"),
            &format!("reserve r-a{i} {size}"),
            &format!("map a{i} r-a{i}"),
            &format!("set-access a{i} --device {}", w.device()),
        ])?;
    }
    Ok(())
}

fn print_disk_demo(report: &DiskDemoReport, on_gpu: bool) {
    println!();
    println!("checkpoint");
    print_phases(&report.checkpoint.report.phases);
    println!("restore");
    print_phases(&report.restore.report.phases);
    println!();
    let what = if on_gpu {
        "GPU memory in use (whole device)"
    } else {
        "device memory held by the group"
    };
    println!(
        "{what}: {} running, {} after the dump, {} restored",
        bytes(report.group_memory_before),
        bytes(report.group_memory_checkpointed),
        bytes(report.group_memory_restored)
    );
    println!(
        "ok  dumped processes {:?} gone before the restore; CRIU images {} in {}",
        report.gone,
        bytes(report.checkpoint.image_bytes),
        report.checkpoint.dir.display()
    );
    for check in &report.verified {
        println!("ok  {check}");
    }
    println!(
        "demo passed: {} processes, {} shared, checkpoint {:.1} ms, restore {:.1} ms",
        report.processes,
        bytes(report.checkpoint.report.shared_bytes),
        report.checkpoint.report.total_millis,
        report.restore.report.total_millis
    );
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
