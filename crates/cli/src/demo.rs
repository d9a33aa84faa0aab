//! `cuinterpose demo`: its arguments, the run (cuinterpose_demo::demo) and its report. The group
//! is started, shared, suspended and resumed (or checkpointed and restored with `--to-disk`) and
//! checked; `--sharing` picks how its memory is shared, and `--sharing multicast` needs
//! `--allow-multicast` (multicast objects are never made on the GPU lane's machines).
//!
//! It runs on the GPU when the machine has one, otherwise on the bundled fake driver, and says which.

use crate::output::{bytes, print_json, print_phases};
use crate::progress::Bars;
use control::config::ToolConfig;
use cuinterpose_demo::demo::{Demo, DemoOptions, DemoReport, DiskDemoReport, MulticastDemoReport};
use cuinterpose_demo::group::Sharing;
use std::path::PathBuf;

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
    /// multicast object (in place, with --allow-multicast, on the bundled fake driver only)
    #[arg(long, value_enum, default_value_t = Sharing::Vmm,
          requires_if("multicast", "allow_multicast"))]
    sharing: Sharing,
    /// Let --sharing multicast make multicast objects. Never on a shared GPU machine: a multicast
    /// object there can take GPUs out of service (the GPU lane never passes this; the fake-driver
    /// tests do), and the workload refuses multicast on any driver but the bundled fake
    #[arg(long)]
    allow_multicast: bool,
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

pub fn demo(args: DemoArgs, config: &ToolConfig) -> anyhow::Result<()> {
    if args.sharing == Sharing::Multicast && args.to_disk {
        return Err(crate::Usage(
            "--sharing multicast runs in place only (the multicast demo suspends and resumes; \
             multicast groups go to disk with `cuinterpose checkpoint`)"
                .into(),
        )
        .into());
    }
    let demo = Demo::new(DemoOptions {
        processes: args.processes,
        size: args.size,
        fake: args.fake,
        sharing: args.sharing,
        criu: args.criu.clone(),
        allow_multicast: args.allow_multicast,
    })?;
    let on_gpu = demo.on_gpu();
    if !args.json {
        println!(
            "cuinterpose demo on the {}: {} processes, {} {} by each",
            demo.driver_name,
            args.processes,
            bytes(demo.size),
            match args.sharing {
                Sharing::Vmm => "shared through VMM descriptors",
                Sharing::LegacyIpc => "shared through legacy CUDA IPC",
                Sharing::Private => "held privately",
                Sharing::Multicast => "bound to one multicast object",
            }
        );
    }
    let progress = Bars::new(!args.json);
    if args.sharing == Sharing::Multicast {
        let report = demo.multicast(config, &progress)?;
        return if args.json {
            print_json(&report)
        } else {
            print_multicast_demo(&report);
            Ok(())
        };
    }
    if args.to_disk {
        let report = demo.to_disk(config, &progress)?;
        return if args.json {
            print_json(&report)
        } else {
            print_disk_demo(&report, on_gpu);
            Ok(())
        };
    }
    let report = demo.in_place(config, &progress)?;
    if args.json {
        print_json(&report)
    } else {
        print_demo(&report, on_gpu);
        Ok(())
    }
}

fn print_multicast_demo(report: &MulticastDemoReport) {
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
        "demo passed: {} processes kept one multicast object of {} across suspend and resume",
        report.processes,
        bytes(report.multicast_bytes)
    );
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
