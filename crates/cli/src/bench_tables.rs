//! The tables of `cuinterpose bench`, one per part of its report.

use crate::output::{Align, Table, bytes, carrier_name, print_phases, worker_time};
use cuinterpose_demo::bench::{Capture, CopySummary, DiskBench, Launch, Native, Overhead, Whole};
use cuinterpose_demo::target::carrier_flag;

pub fn print_launch(l: &Launch) {
    println!();
    println!(
        "launch-bound: {} pairs of processes x {} alternating rounds, {} threads each issuing {} \
         noop launches and 4 KiB async copies a round on a stream of its own; medians",
        l.repetitions, l.rounds, l.threads, l.iterations
    );
    println!(
        "launches/s without the shim {:.0}, with the shim {:.0}",
        l.without_shim_launches_per_s, l.with_shim_launches_per_s
    );
    println!(
        "ratio {:.3} (time per launch, shim over no shim; P10 {:.3}, P90 {:.3}; target <= 1.02 on \
         the GPU)",
        l.ratio.ratio, l.ratio.ratio_p10, l.ratio.ratio_p90
    );
}

pub fn print_whole(w: &Whole) {
    println!();
    println!(
        "whole process: {} of cuMemAlloc memory, {} (the shim's records hold {})",
        bytes(w.bytes),
        w.memory,
        bytes(w.owned_bytes)
    );
    let table = Table::new(&[
        ("RUN", 16, Align::Left),
        ("SUSPEND MS", 11, Align::Right),
        ("RESUME MS", 11, Align::Right),
        ("SUSP GB/S", 11, Align::Right),
        ("RES GB/S", 11, Align::Right),
        ("SHIM MOVED", 11, Align::Right),
        ("CARRIER", 11, Align::Right),
    ]);
    table.header();
    let runs = [
        ("plain 1", &w.plain_first),
        ("plain 2", &w.plain),
        ("keep-contexts 1", &w.keep_contexts_first),
        ("keep-contexts 2", &w.keep_contexts),
    ];
    for (name, r) in runs {
        table.row(&[
            name.to_string(),
            format!("{:.1}", r.suspend_millis),
            format!("{:.1}", r.resume_millis),
            format!("{:.2}", r.suspend_gb_per_s),
            format!("{:.2}", r.resume_gb_per_s),
            bytes(r.shim_bytes),
            r.carrier
                .map_or("-".to_string(), |m| format!("{m:?}").to_lowercase()),
        ]);
    }
    let n = &w.native;
    table.row(&[
        "native".to_string(),
        format!("{:.1}", n.lock_millis + n.checkpoint_millis),
        format!("{:.1}", n.restore_millis + n.unlock_millis),
        format!("{:.2}", n.checkpoint_gb_per_s),
        format!("{:.2}", n.restore_gb_per_s),
        "-".to_string(),
        "-".to_string(),
    ]);
    println!("phases, ms:");
    for (name, r) in runs {
        for (verb, phases) in [("suspend", &r.suspend_phases), ("resume", &r.resume_phases)] {
            let each: Vec<String> = phases
                .iter()
                .map(|p| match (p.name, r.save_copy_millis) {
                    ("save", Some(copies)) => {
                        format!("save {:.1} (copies {copies:.1})", p.millis)
                    }
                    _ => format!("{} {:.1}", p.name, p.millis),
                })
                .collect();
            println!("  {name} {verb}: {}", each.join(", "));
        }
    }
    for (p, verb) in [
        (&w.prepared, "prepared first (cuinterpose prepare"),
        (
            &w.prepared_keep_contexts,
            "keep-contexts cycles prepared (cuinterpose prepare --keep-contexts",
        ),
    ] {
        if let Some(p) = p {
            let pinned: u64 = p.processes.iter().map(|p| p.pinned_bytes).sum();
            println!(
                "{verb}, {}): {} pinned ahead in {:.1} ms",
                carrier_name(p.carrier.carrier),
                bytes(pinned),
                p.total_millis
            );
        }
    }
    println!(
        "plain suspend+resume: {:.2}x native in the second cycle ({:.2}x in the first{}); \
         targets: >= 10x native every cycle, keep-contexts suspend and resume each >= 50 GB/s",
        w.speedup_vs_native,
        w.speedup_vs_native_first,
        if w.prepared.is_some() {
            ""
        } else {
            ", which makes the carrier"
        }
    );
    for v in &w.verified {
        println!("ok  {v}");
    }
}

pub fn print_overhead(o: &Overhead) {
    println!();
    let cpu = o
        .cpu
        .map_or_else(|| "unpinned".to_string(), |c| format!("pinned to CPU {c}"));
    println!(
        "overhead: {} pairs of processes x {} alternating rounds ({cpu}), medians, ns per \
         iteration ({} untracked, {} tracked iterations a round); RATIO is the median of the \
         rounds' ratios, P10 and P90 their percentiles, MIN and MAX their extremes",
        o.repetitions, o.rounds, o.iterations, o.tracked_iterations
    );
    let table = Table::new(&[
        ("CALL", 22, Align::Left),
        ("NO SHIM", 12, Align::Right),
        ("SHIM", 12, Align::Right),
        ("RATIO", 8, Align::Right),
        ("P10", 8, Align::Right),
        ("P90", 8, Align::Right),
        ("MIN", 8, Align::Right),
        ("MAX", 8, Align::Right),
    ]);
    table.header();
    for r in o.untracked.iter().chain(&o.tracked) {
        table.row(&[
            r.name.clone(),
            format!("{:.1}", r.without_shim_ns),
            format!("{:.1}", r.with_shim_ns),
            format!("{:.3}", r.ratio),
            format!("{:.3}", r.ratio_p10),
            format!("{:.3}", r.ratio_p90),
            format!("{:.3}", r.ratio_spread.0),
            format!("{:.3}", r.ratio_spread.1),
        ]);
    }
    println!(
        "untracked ratio {:.3} (target <= 1.02), tracked cycle ratio {:.3} (target <= 1.10)",
        o.untracked_ratio, o.tracked_ratio
    );
    println!(
        "registry memory: {} bytes per tracked allocation ({})",
        o.registry_bytes_per_allocation, o.registry_source
    );
}

fn print_copy(what: &str, c: &CopySummary) {
    println!(
        "  {what:<5} {:>10} {:>9.1} ms {:>8.2} GB/s   pin {:>8.1} ms   carrier {:>8.1} ms{}   {} threads, {}{}",
        bytes(c.bytes),
        c.copy_millis,
        c.copy_gb_per_s,
        c.pin_millis,
        c.carrier_millis,
        if c.carriers_reused { " (reused)" } else { "" },
        c.threads,
        c.mode,
        if c.staged_fallbacks > 0 {
            format!(", {} staged fallbacks", c.staged_fallbacks)
        } else {
            String::new()
        }
    );
}

/// The capture's phases and copies per cycle, its native baseline, the cycles against it and,
/// with `--carrier auto`, the carriers compared.
pub fn print_capture(c: &Capture) {
    print_cycles(c);
    print_native(&c.native);
    print_rates(c);
    if !c.comparison.is_empty() {
        print_comparison(c);
    }
    for v in &c.verified {
        println!("ok  {v}");
    }
}

/// Each cycle's phases and the shims' copies.
fn print_cycles(c: &Capture) {
    println!();
    println!(
        "capture: {} processes, {} shared by each, {} in all",
        c.processes,
        bytes(c.bytes_per_process),
        bytes(c.shared_bytes)
    );
    for cycle in &c.cycles {
        println!();
        println!("cycle {}: suspend", cycle.cycle);
        print_phases(&cycle.suspend.phases);
        println!("cycle {}: resume", cycle.cycle);
        print_phases(&cycle.resume.phases);
        println!(
            "cycle {}: copies inside the shims (slowest shim)",
            cycle.cycle
        );
        print_copy("save", &cycle.save);
        print_copy("load", &cycle.load);
    }
}

/// The native baseline's steps.
fn print_native(n: &Native) {
    println!();
    println!(
        "native baseline ({} cuMemAlloc, no shim): lock {:.1} ms, checkpoint {:.1} ms, restore {:.1} ms, unlock {:.1} ms",
        bytes(n.bytes),
        n.lock_millis,
        n.checkpoint_millis,
        n.restore_millis,
        n.unlock_millis
    );
}

/// Each cycle's rates against the native baseline's.
fn print_rates(c: &Capture) {
    let n = &c.native;
    println!();
    let table = Table::new(&[
        ("CYCLE", 6, Align::Left),
        ("SAVE GB/S", 11, Align::Right),
        ("LOAD GB/S", 11, Align::Right),
        ("SUSPEND MS", 11, Align::Right),
        ("RESUME MS", 11, Align::Right),
        ("SUSP GB/S", 11, Align::Right),
        ("RES GB/S", 11, Align::Right),
        ("X NATIVE", 9, Align::Right),
    ]);
    table.header();
    for cycle in &c.cycles {
        table.row(&[
            cycle.cycle.to_string(),
            format!("{:.2}", cycle.save.copy_gb_per_s),
            format!("{:.2}", cycle.load.copy_gb_per_s),
            format!("{:.1}", cycle.suspend.total_millis),
            format!("{:.1}", cycle.resume.total_millis),
            format!("{:.2}", cycle.suspend_gb_per_s),
            format!("{:.2}", cycle.resume_gb_per_s),
            format!("{:.2}", cycle.speedup_vs_native),
        ]);
    }
    table.row(&[
        "native".to_string(),
        "-".to_string(),
        "-".to_string(),
        format!("{:.1}", n.lock_millis + n.checkpoint_millis),
        format!("{:.1}", n.restore_millis + n.unlock_millis),
        format!("{:.2}", n.checkpoint_gb_per_s),
        format!("{:.2}", n.restore_gb_per_s),
        "1.00".to_string(),
    ]);
    println!(
        "targets on the H200: save and load copies >= 45 GB/s per GPU; suspend+resume >= 5x native"
    );
}

/// The cycles of each carrier, auto's choice first, and why auto chose it.
fn print_comparison(c: &Capture) {
    println!();
    println!("carriers compared (each on a fresh group; the default's choice first):");
    let table = Table::new(&[
        ("CARRIER", 22, Align::Left),
        ("CYCLE", 6, Align::Left),
        ("SUSPEND MS", 11, Align::Right),
        ("RESUME MS", 11, Align::Right),
        ("X NATIVE", 9, Align::Right),
        ("PINNED HOST", 12, Align::Right),
        ("HELPER GPU", 12, Align::Right),
    ]);
    table.header();
    let runs =
        std::iter::once(("auto", c.cycles.as_slice(), None)).chain(c.comparison.iter().map(|r| {
            (
                carrier_flag(r.carrier),
                r.cycles.as_slice(),
                r.refused.as_deref(),
            )
        }));
    for (name, cycles, refused) in runs {
        if let Some(why) = refused {
            println!("{name:<22} refused: {why}");
        }
        for cycle in cycles {
            let choice = cycle.suspend.carrier.as_ref();
            let chosen = choice.map_or(String::new(), |ch| {
                format!("{name} ({})", carrier_name(ch.carrier))
            });
            table.row(&[
                chosen,
                cycle.cycle.to_string(),
                format!("{:.1}", cycle.suspend.total_millis),
                format!("{:.1}", cycle.resume.total_millis),
                format!("{:.2}", cycle.speedup_vs_native),
                bytes(choice.map_or(0, |ch| ch.pinned_host_bytes)),
                bytes(choice.map_or(0, |ch| ch.helper_gpu_bytes)),
            ]);
        }
    }
    if let Some(p) = &c.prepared {
        let pinned: u64 = p.processes.iter().map(|p| p.pinned_bytes).sum();
        println!(
            "auto's group was prepared first (cuinterpose prepare): {} pinned ahead in {:.1} ms",
            bytes(pinned),
            p.total_millis
        );
    }
    if let Some(choice) = c.cycles.first().and_then(|c| c.suspend.carrier.as_ref()) {
        println!(
            "auto chose {}: {}",
            carrier_name(choice.carrier),
            choice.reason
        );
    }
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
         (written {:.0}% of the first's, save {:.0}% of the first's; the whole checkpoint {:.0}%: \
         it leaves the group running, rebuilt in place from the store)",
        bytes(s.changed_bytes),
        bytes(s.report.data_bytes),
        bytes(s.report.shared_bytes),
        bytes(s.report.zero_bytes),
        s.report.report.total_millis,
        s.written_ratio * 100.0,
        s.save_ratio * 100.0,
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
    for (streaming, time) in [
        ("save", &b.checkpoint.worker_time),
        ("load", &b.restore.worker_time),
    ] {
        if let Some(time) = time {
            let label = format!("  {streaming} workers' time");
            println!("{}", worker_time(&label, time));
            println!(
                "  digests: {:.1}% of the {streaming}'s worker time (at most what they cost it; \
                 target <= 10%)",
                time.digests * 100.0
            );
        }
    }
}
