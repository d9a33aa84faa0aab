//! `cuinterpose bench --to-disk DIR`: the checkpoint and restore of a ring group to DIR, phase by
//! phase, next to DIR's own write and read rates measured here with the I/Os the shims use for
//! the checkpoint's block store (control::disk::measure_dir: 2 MiB block files, the same threads
//! and `O_DIRECT` choice, one syncfs and the renames), with the ratios. Figures only: nothing here passes or fails on a time.

use super::GRANULE;
use crate::group::verify_after;
use crate::group::{Launched, Sharing, TREE_TIMEOUT, attach_ranks, launch_tree, ring, seed};
use crate::target::Target;
use crate::{bytes, gb_per_s};
use anyhow::{Context, ensure};
use control::capture::{PhaseTiming, Progress, SuspendOptions};
use control::config::ToolConfig;
use control::disk::{self, CheckpointOptions, DirRate, DiskReport, RestoreOptions};
use std::path::{Path, PathBuf};
use workload::launch::{Launcher, Workload};

/// What `bench --to-disk` measured.
#[derive(Debug, serde::Serialize)]
pub struct DiskBench {
    pub dir: std::path::PathBuf,
    pub processes: usize,
    pub bytes_per_process: u64,
    /// The directory's own rates, measured with the data files' I/Os.
    pub dir_rate: DirRate,
    pub dir_write_gb_per_s: f64,
    pub dir_read_gb_per_s: f64,
    pub checkpoint: DiskReport,
    pub restore: DiskReport,
    /// A second checkpoint of the restored group after a tenth of its bytes changed, into the
    /// same block store.
    pub second: SecondCheckpoint,
    /// Each byte-moving phase of the checkpoint and the restore against the directory's rate in
    /// the same direction (save against write; load, which
    /// reads each data file once and checks its digests, against read).
    pub ratios: Vec<PhaseRatio>,
}

/// The second checkpoint of `bench --to-disk`.
#[derive(Debug, serde::Serialize)]
pub struct SecondCheckpoint {
    /// Bytes changed (rewritten with another pattern) before it, over all processes.
    pub changed_bytes: u64,
    pub report: DiskReport,
    /// Its bytes written over the first checkpoint's.
    pub written_ratio: f64,
    /// Its wall time over the first checkpoint's. The second leaves the group running (it is
    /// rebuilt in place from the store: a native restore and a load of every byte), the first
    /// ends it, so this is more than the work the shared blocks save; `save_ratio` is that.
    pub time_ratio: f64,
    /// Its save phase (device memory into the store: every block hashed, only new ones written)
    /// over the first's.
    pub save_ratio: f64,
}

/// One byte-moving phase against the directory's rate.
#[derive(Debug, serde::Serialize)]
pub struct PhaseRatio {
    pub run: &'static str,
    pub phase: &'static str,
    pub gb_per_s: f64,
    /// `gb_per_s` over the directory's rate in the phase's direction.
    pub of_dir: f64,
}

/// Runs the disk benchmark in `dir` with `size` bytes shared in all over `processes`.
pub(crate) fn disk(
    target: &Target,
    dir: &Path,
    size: u64,
    processes: usize,
    config: &ToolConfig,
    progress: &dyn Progress,
) -> anyhow::Result<DiskBench> {
    let per = size.div_ceil(processes as u64).next_multiple_of(GRANULE);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir_rate = disk::measure_dir(dir, per * processes as u64, processes)
        .with_context(|| format!("measuring {}", dir.display()))?;
    let env = Launcher::new(target.programs.clone(), true).context("bench environment")?;
    let run = DiskRun {
        listen: env.socket_dir().join("disk-bench"),
        processes,
        per,
        config,
        progress,
        driver: target.tool_driver(),
    };
    let checkpoint_dir = dir.join(format!("cuinterpose-bench-{}", std::process::id()));
    let second_dir = dir.join(format!("cuinterpose-bench-{}-2", std::process::id()));
    let mut launched = launch_tree(&env, &run.listen, processes, Sharing::Vmm)?;
    let (checkpoint, restore) = run.checkpoint_and_restore(&mut launched, &checkpoint_dir)?;
    let ranks = attach_ranks(&run.listen, processes)?;
    let second = verify_after(&ranks, "restore", Sharing::Vmm)
        .and_then(|_| run.second_checkpoint(&ranks, restore.root, &second_dir));
    drop(launched);
    if second_dir.exists() {
        control::discard::discard(&second_dir)
            .with_context(|| format!("removing {}", second_dir.display()))?;
    }
    control::discard::discard(&checkpoint_dir)
        .with_context(|| format!("removing {}", checkpoint_dir.display()))?;
    let (changed, second) =
        second.context("verifying after the restore, then the second checkpoint")?;
    let second = SecondCheckpoint {
        changed_bytes: changed * processes as u64,
        written_ratio: ratio(second.data_bytes, checkpoint.data_bytes),
        time_ratio: if checkpoint.report.total_millis > 0.0 {
            second.report.total_millis / checkpoint.report.total_millis
        } else {
            0.0
        },
        save_ratio: match (save_millis(&second), save_millis(&checkpoint)) {
            (Some(again), Some(first)) if first > 0.0 => again / first,
            _ => 0.0,
        },
        report: second,
    };
    ensure!(
        checkpoint.report.saved_bytes == per * processes as u64,
        "the checkpoint saved {} of {}",
        bytes(checkpoint.report.saved_bytes),
        bytes(per * processes as u64)
    );
    let write = gb_per_s(dir_rate.bytes, dir_rate.write_millis);
    let read = gb_per_s(dir_rate.bytes, dir_rate.read_millis);
    Ok(DiskBench {
        dir: dir.to_path_buf(),
        processes,
        bytes_per_process: per,
        dir_rate,
        dir_write_gb_per_s: write,
        dir_read_gb_per_s: read,
        ratios: phase_ratios(&checkpoint, &restore, write, read),
        checkpoint,
        restore,
        second,
    })
}

/// What every step of the disk benchmark shares.
struct DiskRun<'a> {
    /// Where the tree's ranks listen.
    listen: PathBuf,
    processes: usize,
    /// Bytes each process shares.
    per: u64,
    config: &'a ToolConfig,
    progress: &'a dyn Progress,
    /// The driver library of the tool's own steps.
    driver: Option<PathBuf>,
}

impl DiskRun<'_> {
    /// The launched tree shares and fills its ring, is checkpointed to `checkpoint_dir` (which
    /// ends it) and restored from it (the checkpoint is discarded if the restore fails).
    fn checkpoint_and_restore(
        &self,
        launched: &mut Launched,
        checkpoint_dir: &Path,
    ) -> anyhow::Result<(DiskReport, DiskReport)> {
        let ranks = attach_ranks(&self.listen, self.processes)?;
        ring(&ranks, self.per, Sharing::Vmm).context("sharing memory around the ring")?;
        for (rank, w) in ranks.iter().enumerate() {
            w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
        }
        let mut capture = SuspendOptions::new(launched.launcher.id(), self.config);
        capture.driver = self.driver.clone();
        let checkpoint = disk::checkpoint(
            &CheckpointOptions {
                capture,
                dir: checkpoint_dir.to_path_buf(),
                leave_running: false,
                criu: None,
                self_contained: false,
            },
            self.progress,
        )
        .context("checkpoint to disk")?;
        control::launch::wait_exit(launched.launcher.id(), TREE_TIMEOUT)
            .context("waiting for the launcher after the dump")?;
        let _ = launched.launcher.wait();
        let restore = disk::restore(
            &RestoreOptions {
                driver: self.driver.clone(),
                ..RestoreOptions::new(checkpoint_dir.to_path_buf(), self.config)
            },
            self.progress,
        );
        let restore = match restore {
            Ok(r) => r,
            Err(e) => {
                let _ = control::discard::discard(checkpoint_dir);
                return Err(e).context("restore from disk");
            }
        };
        launched.restored = Some(restore.root);
        Ok((checkpoint, restore))
    }

    /// The second checkpoint, into `second_dir` beside the first (so into the same block store),
    /// leaving the restored group running: every allocation back to what the first checkpoint
    /// stored (the verification wrote another pattern), then its first tenth (whole blocks)
    /// rewritten with another pattern. The bytes changed per process, and its report.
    fn second_checkpoint(
        &self,
        ranks: &[Workload],
        root: u32,
        second_dir: &Path,
    ) -> anyhow::Result<(u64, DiskReport)> {
        let changed = (self.per / 10)
            .next_multiple_of(protocol::message::DATA_ALIGN)
            .min(self.per);
        for (rank, w) in ranks.iter().enumerate() {
            w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
            w.ok(&format!(
                "fill a{rank} {} --offset 0 --len {changed}",
                seed(rank, 3)
            ))?;
        }
        let mut again = SuspendOptions::new(root, self.config);
        again.driver = self.driver.clone();
        let report = disk::checkpoint(
            &CheckpointOptions {
                capture: again,
                dir: second_dir.to_path_buf(),
                leave_running: true,
                criu: None,
                self_contained: false,
            },
            self.progress,
        )
        .context("second checkpoint to disk")?;
        Ok((changed, report))
    }
}

/// Each byte-moving phase against the directory's rate in its direction: the checkpoint's save
/// against `write`, the restore's verify-data and load against `read`.
fn phase_ratios(
    checkpoint: &DiskReport,
    restore: &DiskReport,
    write: f64,
    read: f64,
) -> Vec<PhaseRatio> {
    let mut ratios = Vec::new();
    let mut add = |run: &'static str, t: &PhaseTiming, of: f64| {
        let rate = gb_per_s(t.bytes, t.millis);
        ratios.push(PhaseRatio {
            run,
            phase: t.name,
            gb_per_s: rate,
            of_dir: if of > 0.0 { rate / of } else { 0.0 },
        });
    };
    for t in &checkpoint.report.phases {
        if t.name == "save" {
            add("checkpoint", t, write);
        }
    }
    for t in &restore.report.phases {
        if t.name == "verify-data" || t.name == "load" {
            add("restore", t, read);
        }
    }
    ratios
}

/// Milliseconds of a checkpoint's save phase.
fn save_millis(report: &DiskReport) -> Option<f64> {
    report
        .report
        .phases
        .iter()
        .find(|p| p.name == "save")
        .map(|p| p.millis)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b > 0 { a as f64 / b as f64 } else { 0.0 }
}
