//! `cuinterpose bench --to-disk DIR`: the checkpoint and restore of a ring group to DIR, phase by
//! phase, next to DIR's own write and read rates measured here with the I/Os the shims use for
//! the checkpoint's block store (control::disk::measure_dir: 2 MiB block files, the same threads
//! and `O_DIRECT` choice, one syncfs and the renames), with the ratios. Figures only: nothing here passes or fails on a time.

use crate::demo::{Launched, Sharing, attach_ranks, launch_tree, ring, seed, verify_after};
use crate::output::bytes;
use crate::progress::Bars;
use anyhow::{Context, ensure};
use control::capture::{PhaseTiming, SuspendOptions};
use control::config::ToolConfig;
use control::disk::{self, CheckpointOptions, DirRate, DiskReport, RestoreOptions};
use control::native::Driver;
use std::path::Path;
use std::time::Duration;
use workload::launch::{Launcher, Programs};

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
    /// Its wall time over the first checkpoint's.
    pub time_ratio: f64,
}

#[derive(Debug, serde::Serialize)]
pub struct PhaseRatio {
    pub run: &'static str,
    pub phase: &'static str,
    pub gb_per_s: f64,
    /// `gb_per_s` over the directory's rate in the phase's direction.
    pub of_dir: f64,
}

fn gb_per_s(bytes: u64, millis: f64) -> f64 {
    if millis > 0.0 {
        bytes as f64 / millis / 1e6
    } else {
        0.0
    }
}

/// Runs the disk benchmark with `size` bytes shared in all over `processes`.
pub fn disk_bench(
    programs: &Programs,
    on_gpu: bool,
    driver: &Driver,
    dir: &Path,
    size: u64,
    processes: usize,
    config: &ToolConfig,
) -> anyhow::Result<DiskBench> {
    let per = size
        .div_ceil(processes as u64)
        .next_multiple_of(super::bench::GRANULE);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir_rate = disk::measure_dir(dir, per * processes as u64, processes)
        .with_context(|| format!("measuring {}", dir.display()))?;
    let env = Launcher::new(programs.clone(), true).context("bench environment")?;
    let listen = env.socket_dir().join("disk-bench");
    let mut launched: Launched = launch_tree(&env, &listen, processes, Sharing::Vmm)?;
    let ranks = attach_ranks(&listen, processes)?;
    ring(&ranks, per, Sharing::Vmm).context("sharing memory around the ring")?;
    for (rank, w) in ranks.iter().enumerate() {
        w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
    }
    let checkpoint_dir = dir.join(format!("cuinterpose-bench-{}", std::process::id()));
    let mut capture = SuspendOptions::new(launched.launcher.id(), config);
    capture.driver = (!on_gpu).then(|| driver.path().to_path_buf());
    let progress = Bars::new(true);
    let checkpoint = disk::checkpoint(
        &CheckpointOptions {
            capture: capture.clone(),
            dir: checkpoint_dir.clone(),
            leave_running: false,
            criu: None,
            self_contained: false,
        },
        &progress,
    )
    .context("checkpoint to disk")?;
    control::launch::wait_exit(launched.launcher.id(), Duration::from_secs(120))
        .context("waiting for the launcher after the dump")?;
    let _ = launched.launcher.wait();
    let restore = disk::restore(
        &RestoreOptions {
            driver: capture.driver.clone(),
            ..RestoreOptions::new(checkpoint_dir.clone(), config)
        },
        &progress,
    );
    let restore = match restore {
        Ok(r) => r,
        Err(e) => {
            let _ = control::discard::discard(&checkpoint_dir);
            return Err(e).context("restore from disk");
        }
    };
    launched.restored = Some(restore.root);
    let ranks = attach_ranks(&listen, processes)?;
    let verified = verify_after(&ranks, "restore", Sharing::Vmm);
    // The second checkpoint: every allocation back to what the first checkpoint stored (the
    // verification wrote another pattern), then its first tenth (whole blocks) rewritten with
    // another pattern.
    let second_dir = dir.join(format!("cuinterpose-bench-{}-2", std::process::id()));
    let changed = (per / 10)
        .next_multiple_of(protocol::message::DATA_ALIGN)
        .min(per);
    let second = verified.and_then(|_| {
        for (rank, w) in ranks.iter().enumerate() {
            w.ok(&format!("fill a{rank} {}", seed(rank, 1)))?;
            w.ok(&format!(
                "fill a{rank} {} --offset 0 --len {changed}",
                seed(rank, 3)
            ))?;
        }
        let mut again = SuspendOptions::new(restore.root, config);
        again.driver = capture.driver.clone();
        disk::checkpoint(
            &CheckpointOptions {
                capture: again,
                dir: second_dir.clone(),
                leave_running: true,
                criu: None,
                self_contained: false,
            },
            &progress,
        )
        .context("second checkpoint to disk")
    });
    drop(launched);
    if second_dir.exists() {
        control::discard::discard(&second_dir)
            .with_context(|| format!("removing {}", second_dir.display()))?;
    }
    control::discard::discard(&checkpoint_dir)
        .with_context(|| format!("removing {}", checkpoint_dir.display()))?;
    let second = second.context("verifying after the restore, then the second checkpoint")?;
    let second = SecondCheckpoint {
        changed_bytes: changed * processes as u64,
        written_ratio: ratio(second.data_bytes, checkpoint.data_bytes),
        time_ratio: if checkpoint.report.total_millis > 0.0 {
            second.report.total_millis / checkpoint.report.total_millis
        } else {
            0.0
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
    Ok(DiskBench {
        dir: dir.to_path_buf(),
        processes,
        bytes_per_process: per,
        dir_rate,
        dir_write_gb_per_s: write,
        dir_read_gb_per_s: read,
        checkpoint,
        restore,
        second,
        ratios,
    })
}

fn ratio(a: u64, b: u64) -> f64 {
    if b > 0 { a as f64 / b as f64 } else { 0.0 }
}

pub fn print_disk(b: &DiskBench) {
    println!();
    println!(
        "to disk: {} ({} processes x {}), directory {} ({}): write {:.2} GB/s, read {:.2} GB/s \
         (block files of {}, {} threads: the block store's I/Os)",
        bytes(b.bytes_per_process * b.processes as u64),
        b.processes,
        bytes(b.bytes_per_process),
        b.dir.display(),
        if b.dir_rate.direct {
            "O_DIRECT"
        } else {
            "buffered"
        },
        b.dir_write_gb_per_s,
        b.dir_read_gb_per_s,
        bytes(protocol::message::DATA_ALIGN),
        b.dir_rate.threads
    );
    for (run, report) in [("checkpoint", &b.checkpoint), ("restore", &b.restore)] {
        println!("{run}: {:.1} ms", report.report.total_millis);
        for t in &report.report.phases {
            let rate = t
                .gigabytes_per_second()
                .map(|r| format!("{r:>7.2} GB/s"))
                .unwrap_or_default();
            println!(
                "  {:<20} {:>10.1} ms {:>10} {rate}",
                t.name,
                t.millis,
                if t.bytes > 0 {
                    bytes(t.bytes)
                } else {
                    String::new()
                }
            );
        }
    }
    println!(
        "GPU bytes: {} written, {} shared (already in the block store), {} of zero blocks elided",
        bytes(b.checkpoint.data_bytes),
        bytes(b.checkpoint.shared_bytes),
        bytes(b.checkpoint.zero_bytes)
    );
    let s = &b.second;
    println!(
        "second checkpoint, {} changed: {} written, {} shared, {} elided, {:.1} ms \
         (written {:.0}% of the first's, time {:.0}% of the first's)",
        bytes(s.changed_bytes),
        bytes(s.report.data_bytes),
        bytes(s.report.shared_bytes),
        bytes(s.report.zero_bytes),
        s.report.report.total_millis,
        s.written_ratio * 100.0,
        s.time_ratio * 100.0
    );
    for r in &b.ratios {
        println!(
            "  {} {}: {:.2} GB/s = {:.0}% of the directory's rate",
            r.run,
            r.phase,
            r.gb_per_s,
            r.of_dir * 100.0
        );
    }
    for (streaming, share) in [
        ("save", b.checkpoint.digest_share),
        ("load", b.restore.digest_share),
    ] {
        if let Some(share) = share {
            println!(
                "  digests: {:.1}% of the {streaming}'s worker time (at most what they cost it; \
                 target <= 10%)",
                share * 100.0
            );
        }
    }
}
