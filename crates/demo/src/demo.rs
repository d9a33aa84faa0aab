//! `cuinterpose demo`: a small group of processes under the shim shares GPU memory both ways (a
//! ring: each creates an allocation and exports it to the next), is suspended, shown to hold no
//! GPU memory, resumed, and shown to have kept its contents and its sharing: writes by one process
//! are visible to the other afterwards ([`Demo::in_place`]).
//!
//! [`Demo::to_disk`] takes the group through disk instead: it is started as the root of its own
//! PID namespace (`cuinterpose run --pid-namespace`), checkpointed with CRIU, shown to be gone,
//! restored into new processes and verified the same way.
//!
//! [`Sharing`] picks how the memory is made and shared: `vmm` (`cuMemCreate` and POSIX
//! descriptors, each importer mapping its neighbour's allocation), `legacy-ipc` (`cuMemAlloc`, the
//! neighbour opening it with `cuIpcGetMemHandle`/`cuIpcOpenMemHandle`, served by the shims) or
//! `private` (`cuMemAlloc` memory that no other process sees; each process checks its own), or
//! `multicast` ([`Demo::multicast`]: one multicast object every process binds a member to,
//! suspended and resumed in place). `legacy-ipc` and `private` run the group with
//! `CUINTERPOSE_ALLOC=vmm`, so the shim owns that memory whatever the caller's environment says.
//!
//! Multicast is made only when asked for twice: `--sharing multicast` and `--allow-multicast`
//! ([`DemoOptions::allow_multicast`]). On the shared GPU machines of this project a multicast
//! object can take GPUs out of service, so the GPU lane never passes it; the fake-driver tests do.
//! The workload's multicast commands also refuse any driver but the bundled fake.
//!
//! It runs on the GPU when the machine has one, otherwise on the bundled fake driver.

use crate::bytes;
use crate::group::verify_after;
use crate::group::{Launched, Sharing, TREE_TIMEOUT, attach_ranks, launch_tree, ring, seed};
use crate::target::Target;
use anyhow::{Context, bail, ensure};
use control::capture::{self, Progress, Report, ResumeOptions, SuspendOptions};
use control::config::ToolConfig;
use control::disk::{self, CheckpointOptions, DiskReport, RestoreOptions};
use control::native::Driver;
use std::path::{Path, PathBuf};
use workload::launch::{Group, Launcher, Workload, WorkloadOptions};

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Processes in the group (each creates one shared allocation and imports its neighbour's).
    pub processes: usize,
    /// Bytes each process shares (default: 1 GiB on a GPU, 64 MiB on the fake driver).
    pub size: Option<u64>,
    /// The bundled fake driver even when a GPU is present.
    pub fake: bool,
    /// How the group's memory is made and shared.
    pub sharing: Sharing,
    /// The CRIU binary of [`Demo::to_disk`].
    pub criu: Option<PathBuf>,
    /// The user's explicit leave to make multicast objects (`--allow-multicast`): without it
    /// `Sharing::Multicast` is refused before anything runs.
    pub allow_multicast: bool,
}

/// A demo about to run: its driver, and what it will share.
#[derive(Debug)]
pub struct Demo {
    options: DemoOptions,
    target: Target,
    /// Bytes each process shares.
    pub size: u64,
    /// The driver, as the reports name it.
    pub driver_name: String,
}

/// What the demo in place proved.
#[derive(Debug, serde::Serialize)]
pub struct DemoReport {
    pub driver: String,
    pub sharing: Sharing,
    pub processes: usize,
    pub bytes_per_process: u64,
    pub group_memory_before: u64,
    pub group_memory_suspended: u64,
    pub suspend: Report,
    pub resume: Report,
    pub verified: Vec<String>,
}

/// What the multicast demo proved.
#[derive(Debug, serde::Serialize)]
pub struct MulticastDemoReport {
    pub driver: String,
    pub processes: usize,
    pub multicast_bytes: u64,
    pub suspend: Report,
    pub resume: Report,
    pub verified: Vec<String>,
}

/// What the demo through disk proved.
#[derive(Debug, serde::Serialize)]
pub struct DiskDemoReport {
    pub driver: String,
    pub sharing: Sharing,
    pub processes: usize,
    pub bytes_per_process: u64,
    pub group_memory_before: u64,
    /// After the dump: the processes are gone, so this is what nothing holds any more.
    pub group_memory_checkpointed: u64,
    pub group_memory_restored: u64,
    /// Host PIDs of the dumped processes, each checked to be gone before the restore.
    pub gone: Vec<u32>,
    pub checkpoint: DiskReport,
    pub restore: DiskReport,
    pub verified: Vec<String>,
}

impl Demo {
    /// Picks the driver and the size; refuses multicast unless the user allowed it, before any
    /// process starts.
    pub fn new(options: DemoOptions) -> anyhow::Result<Demo> {
        if options.sharing == Sharing::Multicast && !options.allow_multicast {
            bail!(
                "--sharing multicast makes multicast objects, which on a shared GPU machine can \
                 take GPUs out of service: add --allow-multicast to make them (on the bundled \
                 fake driver; the workload refuses them on any other)"
            );
        }
        let target = Target::pick(options.fake)?;
        let size = options
            .size
            .unwrap_or(if target.on_gpu { 1 << 30 } else { 64 << 20 });
        let driver_name = if target.on_gpu {
            format!(
                "GPU ({}, driver API {})",
                target.driver.path().display(),
                target.driver.version()
            )
        } else {
            format!(
                "fake driver ({}; no GPU found)",
                target.driver.path().display()
            )
        };
        Ok(Demo {
            options,
            target,
            size,
            driver_name,
        })
    }

    /// Whether it runs on a GPU's driver rather than the bundled fake.
    pub fn on_gpu(&self) -> bool {
        self.target.on_gpu
    }

    /// The demo's directory, with the shim.
    fn launcher(&self) -> anyhow::Result<Launcher> {
        Launcher::new(self.target.programs.clone(), true).context("preparing the demo's directory")
    }

    /// The ring started, filled, suspended and resumed in place, and checked.
    pub fn in_place(
        &self,
        config: &ToolConfig,
        progress: &dyn Progress,
    ) -> anyhow::Result<DemoReport> {
        let (options, size) = (&self.options, self.size);
        let env = self.launcher()?;
        // Before the group starts: what other processes hold on the device is not the group's.
        let gauge = GroupMemory::measure(&self.target.driver)?;
        let mut workload = WorkloadOptions::new("demo").shim(true);
        if let Some((key, value)) = options.sharing.env() {
            workload = workload.env(key, value);
        }
        let group = Group::tree(&env, options.processes, workload)
            .context("starting the workload group")?;
        ring(group.members(), size, options.sharing).context("sharing memory around the ring")?;
        fill(group.members())?;
        let before = gauge.now()?;

        let (suspend, resume) = self.cycle(&env, group[0].pid(), config);
        let suspended = capture::suspend(&suspend, progress).context("suspend")?;
        let during = gauge.now()?;
        let resumed = capture::resume(&resume, progress).context("resume")?;

        let verified = verify_after(group.members(), "resume", options.sharing)
            .context("verifying after resume")?;
        if !self.target.on_gpu && during != 0 {
            bail!(
                "the suspended group still holds {} of device memory",
                bytes(during)
            );
        }
        Ok(DemoReport {
            driver: self.driver_name.clone(),
            sharing: options.sharing,
            processes: options.processes,
            bytes_per_process: size,
            group_memory_before: before,
            group_memory_suspended: during,
            suspend: suspended,
            resume: resumed,
            verified,
        })
    }

    /// The options of a suspend and its resume of the group under `root`, their state in `env`'s
    /// directory.
    fn cycle(
        &self,
        env: &Launcher,
        root: u32,
        config: &ToolConfig,
    ) -> (SuspendOptions, ResumeOptions) {
        let state_dir = env.dir().join("state");
        let mut suspend = SuspendOptions::new(root, config);
        suspend.state_dir = state_dir.clone();
        suspend.driver = self.target.tool_driver();
        let mut resume = ResumeOptions::new(root, config);
        resume.state_dir = state_dir;
        resume.driver = suspend.driver.clone();
        (suspend, resume)
    }

    /// The multicast demo (`Sharing::Multicast`, allowed by [`Demo::new`]). Rank 0 creates a
    /// multicast object for one device per process and hands it to the others through the shim's
    /// tickets; every rank adds its device, binds a member (even ranks by allocation, odd ranks by
    /// address) and maps the object. A write through one rank's multicast mapping reaches every
    /// member before the suspend and, from every rank, after the resume.
    pub fn multicast(
        &self,
        config: &ToolConfig,
        progress: &dyn Progress,
    ) -> anyhow::Result<MulticastDemoReport> {
        let n = self.options.processes;
        // One fake device per process: a device joins a multicast team once.
        let env = self
            .launcher()?
            .env("FAKE_CUDA_DEVICES", n.max(2).to_string());
        // Whole 2 MiB granules.
        let size = self.size.div_ceil(2 << 20) * (2 << 20);
        let group = multicast_group(&env, n, size)?;
        let ranks = group.members();
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
        let (suspend, resume) = self.cycle(&env, ranks[0].pid(), config);
        let suspended = capture::suspend(&suspend, progress).context("suspend")?;
        let resumed = capture::resume(&resume, progress).context("resume")?;
        for from in 0..n {
            through(from, seed(from, 2), "after resume")?;
        }
        Ok(MulticastDemoReport {
            driver: self.driver_name.clone(),
            processes: n,
            multicast_bytes: size,
            suspend: suspended,
            resume: resumed,
            verified,
        })
    }

    /// The demo through disk: the tree checkpointed, shown gone, restored and checked.
    pub fn to_disk(
        &self,
        config: &ToolConfig,
        progress: &dyn Progress,
    ) -> anyhow::Result<DiskDemoReport> {
        let options = &self.options;
        let env = self.launcher()?;
        // Before the group starts: what other processes hold on the device is not the group's.
        let gauge = GroupMemory::measure(&self.target.driver)?;
        let listen = env.socket_dir().join("disk");
        let mut launched = launch_tree(&env, &listen, options.processes, options.sharing)?;
        let ranks = attach_ranks(&listen, options.processes)?;
        ring(&ranks, self.size, options.sharing).context("sharing memory around the ring")?;
        fill(&ranks)?;
        let before = gauge.now()?;

        let dir = env.dir().join("checkpoint");
        let mut capture = SuspendOptions::new(launched.launcher.id(), config);
        capture.driver = self.target.tool_driver();
        let checkpoint = disk::checkpoint(
            &CheckpointOptions {
                capture: capture.clone(),
                dir: dir.clone(),
                leave_running: false,
                criu: options.criu.clone(),
                self_contained: false,
            },
            progress,
        )
        .context("checkpoint to disk")?;
        let gone = wait_gone(&mut launched, &checkpoint)?;
        let checkpointed = gauge.now()?;

        let restore = disk::restore(
            &RestoreOptions {
                criu: options.criu.clone(),
                driver: capture.driver.clone(),
                ..RestoreOptions::new(dir, config)
            },
            progress,
        )
        .context("restore from disk")?;
        launched.restored = Some(restore.root);
        let ranks = attach_ranks(&listen, options.processes)?;
        let verified = verify_after(&ranks, "restore", options.sharing)
            .context("verifying after the restore")?;
        let restored = gauge.now()?;
        if !self.target.on_gpu {
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
        Ok(DiskDemoReport {
            driver: self.driver_name.clone(),
            sharing: options.sharing,
            processes: options.processes,
            bytes_per_process: self.size,
            group_memory_before: before,
            group_memory_checkpointed: checkpointed,
            group_memory_restored: restored,
            gone,
            checkpoint,
            restore,
            verified,
        })
    }
}

/// Every rank `r` fills its `a<r>` with its first pattern.
fn fill(ranks: &[Workload]) -> anyhow::Result<()> {
    for (rank, w) in ranks.iter().enumerate() {
        w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
    }
    Ok(())
}

/// `n` ranks, one per fake device, each holding an allocation `m` of `size` bound into the
/// multicast object `mc` that rank 0 created, and `mc` mapped.
fn multicast_group(env: &Launcher, n: usize, size: u64) -> anyhow::Result<Group> {
    let devices: Vec<i32> = (0..n).map(|d| d as i32).collect();
    let group = Group::tree_on(env, n, WorkloadOptions::new("demo-mc").shim(true), &devices)
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
    Ok(group)
}

/// CRIU ended the tree: the launcher sees its workload killed and exits; every dumped process
/// must be gone before the restore brings them back. Their host PIDs.
fn wait_gone(launched: &mut Launched, checkpoint: &DiskReport) -> anyhow::Result<Vec<u32>> {
    control::launch::wait_exit(launched.launcher.id(), TREE_TIMEOUT)
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
    Ok(gone)
}

/// The group's device memory: what device 0 has in use (`cuMemGetInfo` in this process, on the
/// fake driver as on a GPU) beyond what it had before the group started. On a GPU that is the whole
/// device's, other processes on the machine included; on the fake driver that of every live
/// process sharing its state directory (this process and the group it started), where this
/// process holds none.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_is_refused_before_anything_unless_allowed() {
        let options = DemoOptions {
            processes: 2,
            size: None,
            fake: true,
            sharing: Sharing::Multicast,
            criu: None,
            allow_multicast: false,
        };
        // Refused before a driver is looked for: this test process has none beside it.
        let refused = Demo::new(options).expect_err("multicast without leave");
        assert!(
            refused.to_string().contains("add --allow-multicast"),
            "{refused:#}"
        );
    }
}
