//! `cuinterpose demo`: the main job. A small group of processes under the shim shares GPU memory
//! both ways (a ring: each creates an allocation and exports it to the next), is suspended, shown to
//! hold no GPU memory, resumed, and shown to have kept its contents and its sharing: writes by one
//! process are visible to the other afterwards.
//!
//! With `--to-disk` the group goes through disk instead: it is started as the root of its own PID
//! namespace (`cuinterpose run --pid-namespace`), checkpointed with CRIU, shown to be gone,
//! restored into new processes and verified the same way.
//!
//! `--sharing` picks how the memory is made and shared: `vmm` (the default: `cuMemCreate` and POSIX
//! descriptors, each importer mapping its neighbour's allocation), `legacy-ipc` (`cuMemAlloc`, the
//! neighbour opening it with `cuIpcGetMemHandle`/`cuIpcOpenMemHandle`, served by the shims) or
//! `private` (`cuMemAlloc` memory that no other process sees; each process checks its own), or
//! `multicast` (one multicast object every process binds a member to, suspended and resumed in
//! place; the bundled fake driver only, refused on any other before any multicast call).
//! `legacy-ipc` and `private` run the group with `CUINTERPOSE_ALLOC=vmm`, so the shim owns that
//! memory whatever the caller's environment says.
//!
//! It runs on the GPU when the machine has one, otherwise on the bundled fake driver, and says which.

use crate::output::{bytes, print_phases};
use crate::progress::Bars;
use anyhow::{Context, bail, ensure};
use control::capture::{self, Report, ResumeOptions, SuspendOptions};
use control::config::ToolConfig;
use control::disk::{self, CheckpointOptions, DiskReport, RestoreOptions};
use control::layout::Layout;
use control::native::Driver;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;
use workload::launch::{Group, Launcher, Programs, Workload, WorkloadOptions};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Processes in the group (each creates one shared allocation and imports its neighbour's):
    /// 2 to 64
    #[arg(long, default_value_t = 2, value_parser = parse_processes)]
    processes: usize,
    /// Bytes each process shares, a multiple of 2 MiB (the allocation granularity) up to 1 TiB
    /// (default: 1 GiB on a GPU, 64 MiB on the fake driver)
    #[arg(long, value_parser = parse_size)]
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
    /// How the group's memory is made and shared: VMM descriptors (cuMemCreate), legacy CUDA IPC
    /// (cuMemAlloc and cuIpcOpenMemHandle), private cuMemAlloc memory shared with nobody, or one
    /// multicast object (in place, on the bundled fake driver only)
    #[arg(long, value_enum, default_value_t = Sharing::Vmm)]
    sharing: Sharing,
}

/// Most processes a demo starts: a group, not a way to fill the machine (each one is a CUDA
/// process with its own context on a GPU).
const MAX_PROCESSES: usize = 64;
/// The allocation granularity every size is a multiple of (`cuMemCreate` refuses other sizes).
const SIZE_GRANULARITY: u64 = 2 << 20;
/// Most bytes a process shares: more than any GPU holds.
const MAX_SIZE: u64 = 1 << 40;

/// `--processes`: 2 (memory shared both ways) to [`MAX_PROCESSES`].
fn parse_processes(text: &str) -> Result<usize, String> {
    text.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (2..=MAX_PROCESSES).contains(n))
        .ok_or_else(|| format!("{text:?} is not a number of processes from 2 to {MAX_PROCESSES}"))
}

/// `--size`: a positive multiple of [`SIZE_GRANULARITY`], at most [`MAX_SIZE`].
fn parse_size(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0 && n % SIZE_GRANULARITY == 0 && n <= MAX_SIZE)
        .ok_or_else(|| {
            format!(
                "{text:?} is not a positive multiple of {SIZE_GRANULARITY} bytes (2 MiB) of at \
                 most {MAX_SIZE} (1 TiB)"
            )
        })
}

/// How the demo group's memory is made and shared (`--sharing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// cuMemCreate, exported as POSIX descriptors and imported by the next rank.
    Vmm,
    /// cuMemAlloc, opened by the next rank through legacy CUDA IPC.
    LegacyIpc,
    /// cuMemAlloc, used by its own rank only.
    Private,
    /// One multicast object, each rank binding a member on its own device; suspended and resumed
    /// in place. The bundled fake driver only: refused on any other driver, before any multicast
    /// call.
    Multicast,
}

impl Sharing {
    /// The environment the group's processes need: the shim owns `cuMemAlloc` memory for the
    /// modes built on it.
    fn env(self) -> Option<(&'static str, &'static str)> {
        match self {
            Sharing::Vmm | Sharing::Multicast => None,
            Sharing::LegacyIpc | Sharing::Private => Some(("CUINTERPOSE_ALLOC", "vmm")),
        }
    }

    /// The rank that reads and writes rank `creator`'s memory in a group of `n`.
    fn peer(self, creator: usize, n: usize) -> usize {
        match self {
            Sharing::Vmm | Sharing::LegacyIpc | Sharing::Multicast => (creator + 1) % n,
            Sharing::Private => creator,
        }
    }
}

/// What the demo proved, for `--json`.
#[derive(Debug, serde::Serialize)]
struct DemoReport {
    driver: String,
    sharing: Sharing,
    processes: usize,
    bytes_per_process: u64,
    group_memory_before: u64,
    group_memory_suspended: u64,
    suspend: Report,
    resume: Report,
    verified: Vec<String>,
}

pub fn demo(args: DemoArgs, config: &ToolConfig) -> anyhow::Result<()> {
    let multicast = args.sharing == Sharing::Multicast;
    if multicast && args.to_disk {
        return Err(crate::Usage(
            "--sharing multicast runs in place only (the multicast demo suspends and resumes; \
             multicast groups go to disk with `cuinterpose checkpoint`)"
                .into(),
        )
        .into());
    }
    let Target {
        on_gpu,
        driver,
        programs,
    } = pick_driver(args.fake)?;
    // Decided by what the driver library is, before anything else runs.
    if multicast && !driver.is_bundled_fake() {
        bail!(
            "--sharing multicast runs on the bundled fake driver only, and {} is not it: a multicast \
             object on the GPU machines of this project can take shared GPUs out of service, so \
             cuinterpose never makes one there (add --fake to run it on the fake driver)",
            driver.path().display()
        );
    }
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
            "cuinterpose demo on the {driver_name}: {} processes, {} {} by each",
            args.processes,
            bytes(size),
            match args.sharing {
                Sharing::Vmm => "shared through VMM descriptors",
                Sharing::LegacyIpc => "shared through legacy CUDA IPC",
                Sharing::Private => "held privately",
                Sharing::Multicast => "bound to one multicast object",
            }
        );
    }
    let env = Launcher::new(programs, true).context("preparing the demo's directory")?;
    // Before the group starts: what other processes hold on the device is not the group's.
    let gauge = GroupMemory::measure(&driver)?;
    if multicast {
        return demo_multicast(&args, config, env, &driver, driver_name, size);
    }
    if args.to_disk {
        return demo_to_disk(&args, config, &env, &gauge, driver_name, on_gpu, size);
    }
    let report = demo_in_place(
        &args,
        config,
        &env,
        (&driver, on_gpu),
        &gauge,
        driver_name,
        size,
    )?;
    if args.json {
        crate::output::print_json(&report)
    } else {
        print_demo(&report, on_gpu);
        Ok(())
    }
}

/// The ring started, filled, suspended and resumed in place, and checked.
fn demo_in_place(
    args: &DemoArgs,
    config: &ToolConfig,
    env: &Launcher,
    (driver, on_gpu): (&Driver, bool),
    gauge: &GroupMemory,
    driver_name: String,
    size: u64,
) -> anyhow::Result<DemoReport> {
    let mut options = WorkloadOptions::new("demo").shim(true);
    if let Some((key, value)) = args.sharing.env() {
        options = options.env(key, value);
    }
    let group = Group::tree(env, args.processes, options).context("starting the workload group")?;
    ring(group.members(), size, args.sharing).context("sharing memory around the ring")?;
    let root = group[0].pid();
    for (rank, w) in group.members().iter().enumerate() {
        w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
    }
    let before = gauge.now()?;

    let state_dir = env.dir().join("state");
    let mut suspend_options = SuspendOptions::new(root, config);
    suspend_options.state_dir = state_dir.clone();
    suspend_options.driver = (!on_gpu).then(|| driver.path().to_path_buf());
    let progress = Bars::new(!args.json);
    let suspended = capture::suspend(&suspend_options, &progress).context("suspend")?;
    let during = gauge.now()?;

    let mut resume_options = ResumeOptions::new(root, config);
    resume_options.state_dir = state_dir;
    resume_options.driver = suspend_options.driver.clone();
    let resumed = capture::resume(&resume_options, &progress).context("resume")?;

    let verified =
        verify_after(group.members(), "resume", args.sharing).context("verifying after resume")?;
    if !on_gpu && during != 0 {
        bail!(
            "the suspended group still holds {} of device memory",
            bytes(during)
        );
    }
    Ok(DemoReport {
        driver: driver_name,
        sharing: args.sharing,
        processes: args.processes,
        bytes_per_process: size,
        group_memory_before: before,
        group_memory_suspended: during,
        suspend: suspended,
        resume: resumed,
        verified,
    })
}

/// The driver the demo and the bench run on, and the programs they start on it.
pub(crate) struct Target {
    /// A GPU's driver, rather than the bundled fake.
    pub on_gpu: bool,
    /// The driver, loaded into this process (for the native checkpoint API and `cuMemGetInfo`).
    pub driver: Driver,
    /// The workload and the shim beside this executable (control::layout), and for the fake the
    /// directory that makes the workloads load it.
    pub programs: Programs,
}

/// The GPU when a driver with devices loads, else the bundled fake.
pub(crate) fn pick_driver(force_fake: bool) -> anyhow::Result<Target> {
    let layout = Layout::current().context("no executable dir")?;
    let mut programs = Programs {
        workload: layout.dir().join(workload::PROGRAM),
        shim: layout.shim_candidates().into_iter().find(|p| p.exists()),
        driver_dir: None,
    };
    let fake_dir = layout.fake_driver_dir();
    if !force_fake && let Ok(driver) = Driver::load(None) {
        let fake = fake_dir
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .and_then(|dir| std::fs::canonicalize(dir.join("libcuda.so.1")).ok());
        let is_fake = fake.as_deref() == Some(driver.path());
        if !is_fake && driver.device_count().unwrap_or(0) > 0 {
            return Ok(Target {
                on_gpu: true,
                driver,
                programs,
            });
        }
    }
    let dir: PathBuf = fake_dir
        .context("preparing the bundled fake driver's directory")?
        .context(
            "the bundled fake driver (libcuda.so next to cuinterpose, or lib/cuinterpose/test-driver/ in the release) is missing; build the workspace",
        )?;
    let driver =
        Driver::load(Some(&dir.join("libcuda.so.1"))).context("loading the fake driver")?;
    programs.driver_dir = Some(dir);
    Ok(Target {
        on_gpu: false,
        driver,
        programs,
    })
}

/// Device memory in use on device 0, as the driver reports it (`cuMemGetInfo` in this process):
/// on a GPU the whole device's, other processes on the machine included; on the fake driver that
/// of every live process sharing its state directory (this process and the group it started),
/// where this process holds none.
/// The group's device memory: what device 0 has in use (`cuMemGetInfo`, on the fake driver as on
/// a GPU) beyond what it had before the group started.
struct GroupMemory<'a> {
    driver: &'a Driver,
    baseline: u64,
}

impl<'a> GroupMemory<'a> {
    fn measure(driver: &'a Driver) -> anyhow::Result<GroupMemory<'a>> {
        Ok(GroupMemory {
            driver,
            baseline: device_memory_used(driver)?,
        })
    }

    fn now(&self) -> anyhow::Result<u64> {
        Ok(device_memory_used(self.driver)?.saturating_sub(self.baseline))
    }
}

fn device_memory_used(driver: &Driver) -> anyhow::Result<u64> {
    let (free, total) = driver
        .memory_info(0)
        .context("asking the driver for device memory use (cuMemGetInfo)")?;
    Ok(total.saturating_sub(free))
}

pub(crate) fn seed(rank: usize, round: u64) -> u64 {
    1000 * round + rank as u64 + 1
}

/// Contents survived, and sharing is alive both ways: each importer sees the creator's bytes, then
/// writes new ones that the creator sees (for private memory the creator is its own reader).
pub(crate) fn verify_after(
    group: &[Workload],
    what: &str,
    sharing: Sharing,
) -> anyhow::Result<Vec<String>> {
    let n = group.len();
    let mut checks = Vec::new();
    for creator in 0..n {
        let importer = sharing.peer(creator, n);
        let region = format!("a{creator}");
        group[creator].assert_pattern(&region, seed(creator, 1))?;
        if importer == creator {
            checks.push(format!("{region}: contents kept in rank {creator}"));
        } else {
            group[importer].assert_pattern(&region, seed(creator, 1))?;
            checks.push(format!(
                "{region}: contents kept in creator rank {creator} and importer rank {importer}"
            ));
        }
        group[importer].ok(&format!("fill {region} {}", seed(creator, 2)))?;
        group[creator].assert_pattern(&region, seed(creator, 2))?;
        checks.push(if importer == creator {
            format!("{region}: rank {creator} reads back what it wrote after {what}")
        } else {
            format!("{region}: a write by rank {importer} after {what} is seen by rank {creator}")
        });
    }
    Ok(checks)
}

/// What the multicast demo proved, for `--json`.
#[derive(Debug, serde::Serialize)]
struct MulticastDemoReport {
    driver: String,
    processes: usize,
    multicast_bytes: u64,
    suspend: Report,
    resume: Report,
    verified: Vec<String>,
}

/// The multicast demo (`--sharing multicast`, on the bundled fake driver only: `demo` refused any other
/// driver before calling this). Rank 0 creates a multicast object for one device per process and
/// hands it to the others through the shim's tickets; every rank adds its device, binds a member
/// (even ranks by allocation, odd ranks by address) and maps the object. A write through one
/// rank's multicast mapping reaches every member before the suspend and, from every rank, after
/// the resume.
fn demo_multicast(
    args: &DemoArgs,
    config: &ToolConfig,
    env: Launcher,
    driver: &Driver,
    driver_name: String,
    size: u64,
) -> anyhow::Result<()> {
    let n = args.processes;
    // One fake device per process: a device joins a multicast team once.
    let env = env.env("FAKE_CUDA_DEVICES", n.max(2).to_string());
    let devices: Vec<i32> = (0..n).map(|d| d as i32).collect();
    // Whole 2 MiB granules.
    let size = size.div_ceil(2 << 20) * (2 << 20);
    let group = Group::tree_on(
        &env,
        n,
        WorkloadOptions::new("demo-mc").shim(true),
        &devices,
    )
    .context("starting the workload group")?;
    let ranks = group.members();
    ranks[0].all_ok(&[&format!("mc-create mc {size} --devices {n}"), "export mc"])?;
    for w in &ranks[1..] {
        ranks[0].ok(&format!("send-fd mc --to {}", w.socket().display()))?;
        w.all_ok(&["wait fd mc", &format!("import mc --size {size}")])?;
    }
    for w in ranks {
        w.ok("mc-add-device mc")?;
    }
    for (r, w) in ranks.iter().enumerate() {
        let bind = if r % 2 == 0 {
            format!("mc-bind-mem mc 0 m --size {size}")
        } else {
            "mc-bind-addr mc 0 m".to_string()
        };
        w.all_ok(&[
            &format!("create m {size} --handle-types posix"),
            &format!("reserve r-m {size}"),
            "map m r-m",
            "set-access m",
            &bind,
            &format!("reserve r-mc {size}"),
            "map mc r-mc",
            "set-access mc",
        ])?;
    }
    let mut verified = Vec::new();
    let mut through = |from: usize, seed: u64, what: &str| -> anyhow::Result<()> {
        ranks[from].ok(&format!("fill mc {seed}"))?;
        for w in ranks {
            w.assert_pattern("m", seed)?;
        }
        verified.push(format!(
            "{what}: a write through rank {from}'s multicast mapping reached all {n} members"
        ));
        Ok(())
    };
    through(0, seed(0, 1), "before suspend")?;

    let root = ranks[0].pid();
    let state_dir = env.dir().join("state");
    let mut suspend_options = SuspendOptions::new(root, config);
    suspend_options.state_dir = state_dir.clone();
    suspend_options.driver = Some(driver.path().to_path_buf());
    let progress = Bars::new(!args.json);
    let suspended = capture::suspend(&suspend_options, &progress).context("suspend")?;
    let mut resume_options = ResumeOptions::new(root, config);
    resume_options.state_dir = state_dir;
    resume_options.driver = suspend_options.driver.clone();
    let resumed = capture::resume(&resume_options, &progress).context("resume")?;
    for from in 0..n {
        through(from, seed(from, 2), "after resume")?;
    }
    let report = MulticastDemoReport {
        driver: driver_name,
        processes: n,
        multicast_bytes: size,
        suspend: suspended,
        resume: resumed,
        verified,
    };
    if args.json {
        crate::output::print_json(&report)
    } else {
        println!();
        println!("suspend");
        print_phases(&report.suspend.phases);
        println!();
        println!("resume");
        print_phases(&report.resume.phases);
        println!();
        for line in &report.verified {
            println!("ok  {line}");
        }
        println!(
            "demo passed: {n} processes kept one multicast object of {} across suspend and resume",
            bytes(size)
        );
        Ok(())
    }
}

/// What the demo through disk proved, for `--json`.
#[derive(Debug, serde::Serialize)]
struct DiskDemoReport {
    driver: String,
    sharing: Sharing,
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
    env: &Launcher,
    gauge: &GroupMemory<'_>,
    driver_name: String,
    on_gpu: bool,
    size: u64,
) -> anyhow::Result<()> {
    let driver = gauge.driver;
    let listen = env.socket_dir().join("disk");
    let mut launched = launch_tree(env, &listen, args.processes, args.sharing)?;
    let ranks = attach_ranks(&listen, args.processes)?;
    ring(&ranks, size, args.sharing).context("sharing memory around the ring")?;
    for (rank, w) in ranks.iter().enumerate() {
        w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
    }
    let before = gauge.now()?;

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
            self_contained: false,
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
    let checkpointed = gauge.now()?;

    let restore = disk::restore(
        &RestoreOptions {
            criu: args.criu.clone(),
            driver: capture.driver.clone(),
            ..RestoreOptions::new(dir, config)
        },
        &progress,
    )
    .context("restore from disk")?;
    launched.restored = Some(restore.root);
    let ranks = attach_ranks(&listen, args.processes)?;
    let verified =
        verify_after(&ranks, "restore", args.sharing).context("verifying after the restore")?;
    let restored = gauge.now()?;
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
        sharing: args.sharing,
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
    env: &Launcher,
    listen: &Path,
    processes: usize,
    sharing: Sharing,
) -> anyhow::Result<Launched> {
    let me = std::env::current_exe().context("finding this executable")?;
    let program = &env.programs().workload;
    ensure!(
        program.exists(),
        "{} is missing: build the workspace, or reinstall the release",
        program.display()
    );
    let log_path = env.log_dir().join("launcher.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    // The shim comes from `run` itself; stdio goes to files (CRIU restores no terminal).
    let mut command = env.command(&me, false)?;
    command.envs(sharing.env());
    command
        .arg("run")
        .arg("--pid-namespace")
        .arg("--")
        .arg(program)
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
    let ready = workload::wire::wait_listening(&listen.join("0.sock"), DISK_DEMO_TIMEOUT, || {
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

/// The group's memory: rank `i` makes `a<i>` and, unless it is private, shares it with rank
/// `(i + 1) % n`, which maps it as `a<i>` too.
pub(crate) fn ring(ranks: &[Workload], size: u64, sharing: Sharing) -> anyhow::Result<()> {
    match sharing {
        Sharing::Vmm => vmm_ring(ranks, size),
        Sharing::LegacyIpc => ipc_ring(ranks, size),
        Sharing::Private => {
            for (i, w) in ranks.iter().enumerate() {
                w.ok(&format!("malloc a{i} {size}"))?;
            }
            Ok(())
        }
        // `demo` sends multicast groups to `demo_multicast` before any ring is built.
        Sharing::Multicast => bail!("a multicast group is not built around a ring"),
    }
}

/// Legacy IPC around the ring: rank `i` allocates `a<i>` with `cuMemAlloc` and sends its
/// `cuIpcGetMemHandle` to rank `(i + 1) % n`, which opens it as region `a<i>`.
fn ipc_ring(ranks: &[Workload], size: u64) -> anyhow::Result<()> {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        w.all_ok(&[
            &format!("malloc a{i} {size}"),
            &format!("ipc-get h{i} a{i}"),
        ])?;
    }
    for (i, creator) in ranks.iter().enumerate() {
        let to = &ranks[(i + 1) % n];
        creator.ok(&format!("send-ipc h{i} --to {}", to.socket().display()))?;
        to.all_ok(&[
            &format!("wait ipc h{i}"),
            &format!("ipc-open a{i} --blob h{i}"),
        ])?;
    }
    Ok(())
}

/// VMM descriptors around the ring (as [`Group::ring`] on attached ranks): rank `i` creates `a<i>`
/// and shares it with rank `(i + 1) % n`, which imports and maps it.
fn vmm_ring(ranks: &[Workload], size: u64) -> anyhow::Result<()> {
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
        bytes(report.checkpoint.report.saved_bytes),
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
        bytes(report.suspend.saved_bytes),
        report.suspend.total_millis,
        report.resume.total_millis
    );
}
