//! Tables and JSON for the terminal.

use control::capture::Report;
use control::group::InspectReport;
use protocol::state::SuspendMode;

pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// `1.50 GiB`, `12.0 MiB`, `512 B`: the one formatter, shared with what `demo` and `bench` print.
pub use cuinterpose_demo::bytes;

pub fn print_inspect(report: &InspectReport) {
    println!("{:<8} {:<8} {:<22} COMMAND", "PID", "NS PID", "STATUS");
    for p in &report.processes {
        let mut command = p.info.command.clone();
        command.truncate(70);
        println!(
            "{:<8} {:<8} {:<22} {command}",
            p.info.host_pid, p.info.ns_pid, p.status
        );
    }
    println!();
    if report.shared.is_empty() {
        println!("no shared allocations");
    } else {
        println!(
            "{:<14} {:>12} {:>6}  {:<20} IMPORTERS / MAPPINGS",
            "ALLOCATION", "SIZE", "DEVICE", "CREATOR"
        );
        for a in &report.shared {
            // The process table above names the commands; here a process is its PID.
            let importers: Vec<&str> = a.importers.iter().map(|i| short(i)).collect();
            let importers = if importers.is_empty() {
                "-".to_string()
            } else {
                importers.join(", ")
            };
            let creator = short(&a.creator);
            println!(
                "{:<14} {:>12} {:>6}  {creator:<20} {importers}",
                a.id,
                bytes(a.size),
                a.device
            );
            for m in &a.mappings {
                println!("{:<14} {:>12} {:>6}  {:<20}   mapped {m}", "", "", "", "");
            }
        }
    }
    if !report.multicasts.is_empty() {
        println!();
        println!(
            "{:<14} {:>12} {:>6}  {:<20} HOLDERS",
            "MULTICAST", "SIZE", "TEAM", "CREATOR"
        );
        for m in &report.multicasts {
            let team = format!("{}/{}", m.devices_added, m.num_devices);
            println!(
                "{:<14} {:>12} {team:>6}  {:<20} {}",
                m.id,
                bytes(m.size),
                short(&m.creator),
                m.holders.first().map_or("-", String::as_str)
            );
            for h in m.holders.iter().skip(1) {
                println!("{:<14} {:>12} {:>6}  {:<20} {h}", "", "", "", "");
            }
        }
    }
    println!();
    print_memory_paths(report);
    if let Some(s) = &report.suspended {
        let mode = match s.mode {
            SuspendMode::Native => "native checkpoint (contexts saved by the driver)",
            SuspendMode::KeepContexts => "keep-contexts (contexts resident, no native checkpoint)",
        };
        println!("suspended: {mode}, state {}", s.state_file.display());
    }
    for h in &report.carrier_helpers {
        println!(
            "carrier helper: pid {}, socket {}: {}",
            h.pid,
            h.socket.display(),
            h.health
        );
        for c in &h.processes {
            let copy = if c.holds_copy() {
                "holds its own copy"
            } else {
                "holds no copy"
            };
            println!(
                "  {}: {} in {} allocation(s), {copy}",
                short(&c.process),
                bytes(c.bytes),
                c.allocations
            );
        }
    }
    print_carrier(report.carrier.as_ref());
    if report.refusals.is_empty() {
        println!("capture: possible (every CUDA process has the shim and nothing blocks)");
    } else {
        println!("capture: would be refused:");
        for r in &report.refusals {
            println!("  {r}");
        }
    }
}

/// Per process, what of its device memory goes through the carriers (every allocation the shim
/// created, shared or private) and what is left to the driver's own checkpoint, by kind.
fn print_memory_paths(report: &InspectReport) {
    if report.snapshots.is_empty() {
        return;
    }
    println!("device memory per process: through the carriers / left to the driver's checkpoint");
    for snap in &report.snapshots {
        let created = &snap.record.allocations;
        let carried: u64 = created.iter().map(|a| a.size).sum();
        let driver = if snap.record.unowned.is_empty() {
            "nothing the shim saw".to_string()
        } else {
            snap.record
                .unowned
                .iter()
                .map(|u| format!("{} in {} x {}", bytes(u.bytes), u.allocations, u.kind))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let pinned = match snap.hello.carrier_pinned_bytes {
            0 => String::new(),
            n => format!(" (its carrier holds {} of host memory pinned)", bytes(n)),
        };
        println!(
            "  {}: {} in {} allocation(s) / {driver}{pinned}",
            short(&snap.info.label()),
            bytes(carried),
            created.len()
        );
    }
    println!();
}

/// `pid 12 (python3 x.py)` → `pid 12`.
fn short(label: &str) -> &str {
    label.split(" (").next().unwrap_or(label)
}

pub fn print_report(what: &str, report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    print_phases(&report.phases);
    print_drained(&report.drained);
    println!(
        "{what} {} process(es), {} of device memory through carriers, in {:.1} ms (state: {})",
        report.participants.len(),
        bytes(report.saved_bytes),
        report.total_millis,
        report.state_file.display()
    );
    print_carrier(report.carrier.as_ref());
    for lost in &report.lost {
        println!("left out (exited): {lost}");
    }
    for item in &report.not_rebuilt {
        println!("not rebuilt: {item}");
    }
    Ok(())
}

pub fn print_prepare(report: &control::capture::PrepareReport) {
    print_carrier(Some(&report.carrier));
    if let Some(why) = &report.nothing_to_pin {
        println!("nothing pinned ahead: {why}");
    }
    for p in &report.processes {
        match &p.skipped {
            Some(why) => println!("  {}: not prepared: {why}", short(&p.process)),
            None => println!(
                "  {}: {} of carrier pinned ahead in {:.1} ms",
                short(&p.process),
                bytes(p.pinned_bytes),
                p.pin_millis
            ),
        }
    }
    println!("prepared in {:.1} ms", report.total_millis);
}

pub fn carrier_name(carrier: control::carrier_choice::Carrier) -> &'static str {
    use control::carrier_choice::Carrier;
    match carrier {
        Carrier::Helper => "helper",
        Carrier::Process => "process",
        Carrier::None => "none",
    }
}

/// The carrier a capture used (or a suspend would use), why, and what it holds.
pub fn print_carrier(choice: Option<&control::carrier_choice::CarrierChoice>) {
    let Some(c) = choice else { return };
    println!("carrier: {}: {}", carrier_name(c.carrier), c.reason);
    if c.carrier != control::carrier_choice::Carrier::None {
        println!(
            "carrier cost: {} of host memory pinned, {} of GPU memory per device for the helper's context",
            bytes(c.pinned_host_bytes),
            bytes(c.helper_gpu_bytes)
        );
    }
}

pub fn print_disk_report(
    what: &str,
    report: &control::disk::DiskReport,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    print_phases(&report.report.phases);
    print_drained(&report.report.drained);
    print_carrier(report.report.carrier.as_ref());
    println!(
        "{what} {} process(es) (root pid {}), {} of device memory through carriers, CRIU images {} in {}, {:.1} ms",
        report.report.participants.len(),
        report.root,
        bytes(report.report.saved_bytes),
        bytes(report.image_bytes),
        report.dir.display(),
        report.report.total_millis
    );
    let data = if what == "checkpointed" {
        format!(
            "GPU bytes: {} written, {} shared (already in the block store), {} elided (zero blocks)",
            bytes(report.data_bytes),
            bytes(report.shared_bytes),
            bytes(report.zero_bytes)
        )
    } else {
        format!(
            "GPU bytes: {} read, {} elided (zero blocks)",
            bytes(report.data_bytes),
            bytes(report.zero_bytes)
        )
    };
    println!("{data}");
    if let Some(time) = &report.worker_time {
        println!("{}", worker_time("data-file workers' time", time));
    }
    Ok(())
}

/// `label: setup 2.0%, I/O 41.3%, ...`: where the data-file workers' time went.
pub(crate) fn worker_time(label: &str, time: &control::disk::WorkerTime) -> String {
    let rest = 1.0 - time.setup - time.io - time.digests - time.copy_waits;
    format!(
        "{label}: setup {:.1}%, I/O {:.1}%, digests {:.1}%, copy waits {:.1}%, the rest {:.1}%",
        time.setup * 100.0,
        time.io * 100.0,
        time.digests * 100.0,
        time.copy_waits * 100.0,
        rest * 100.0
    )
}

/// One line per process: how long from the hold until it was drained, and what was admitted.
fn print_drained(drained: &[control::drain::Drained]) {
    for d in drained {
        let admitted = match d.admitted {
            0 => String::new(),
            n => format!(" ({n} held submissions admitted)"),
        };
        println!(
            "drained {} in {:.1} ms{admitted}",
            short(&d.process),
            d.millis
        );
    }
}

pub fn print_phases(phases: &[control::capture::PhaseTiming]) {
    println!(
        "{:<20} {:>12} {:>12} {:>10}",
        "PHASE", "MS", "BYTES", "GB/S"
    );
    for p in phases {
        let rate = p
            .gigabytes_per_second()
            .map(|r| format!("{r:.2}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<20} {:>12.2} {:>12} {:>10}",
            p.name,
            p.millis,
            bytes(p.bytes),
            rate
        );
    }
}

/// `restore --cleanup`'s report.
pub fn print_cleanup(
    dir: &std::path::Path,
    report: &control::disk::leftovers::CleanupReport,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    match (&report.work_dir, report.killed_root) {
        (None, _) => println!(
            "nothing to clean up: no restore of {} was interrupted",
            dir.display()
        ),
        (Some(work_dir), killed) => {
            if let Some(root) = killed {
                println!("killed the tree an interrupted restore brought back (root pid {root})");
            }
            println!(
                "removed {}; the checkpoint {} is unchanged",
                work_dir.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// `end`'s report.
pub fn print_end(pid: u32, report: &control::end::EndReport, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    let killed = if report.killed.is_empty() {
        "nothing".to_string()
    } else {
        report.killed.join(", ")
    };
    let gone = if report.already_gone.is_empty() {
        String::new()
    } else {
        format!(" ({} had exited already)", report.already_gone.join(", "))
    };
    println!(
        "ended the group under pid {pid}: killed {killed}{gone}; state {} removed",
        report.state_file.display()
    );
    Ok(())
}

/// `discard`'s report.
pub fn print_discard(report: &control::discard::DiscardReport, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    println!(
        "discarded {}: CRIU images {}, {} link remap(s) kept outside it",
        report.dir.display(),
        bytes(report.image_bytes),
        report.link_remaps.len()
    );
    if let Some(store) = &report.store {
        println!(
            "block store: {} block(s) no other checkpoint references removed ({}), {} kept",
            store.blocks,
            bytes(store.bytes),
            store.kept
        );
    }
    if let Some(why) = &report.store_not_collected {
        eprintln!("warning: the block store was not collected: {why}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_counts_read_naturally() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(3 << 20), "3.00 MiB");
        assert_eq!(super::bytes(8 << 30), "8.00 GiB");
    }
}

/// How a [`Table`] column lines up its cells.
#[derive(Debug, Clone, Copy)]
pub enum Align {
    Left,
    Right,
}

/// A table printed row by row: each column a header, a width and an alignment, columns one space
/// apart. Cells come formatted (precision is the caller's).
#[derive(Debug)]
pub struct Table {
    columns: Vec<(&'static str, usize, Align)>,
}

impl Table {
    /// A table of `columns`; prints nothing yet.
    pub fn new(columns: &[(&'static str, usize, Align)]) -> Table {
        Table {
            columns: columns.to_vec(),
        }
    }

    /// Prints the headers.
    pub fn header(&self) {
        let names: Vec<&str> = self.columns.iter().map(|c| c.0).collect();
        self.row(&names);
    }

    /// Prints one row, a cell per column (missing cells are blank).
    pub fn row<S: AsRef<str>>(&self, cells: &[S]) {
        let line: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, &(_, width, align))| {
                let cell = cells.get(i).map_or("", AsRef::as_ref);
                match align {
                    Align::Left => format!("{cell:<width$}"),
                    Align::Right => format!("{cell:>width$}"),
                }
            })
            .collect();
        println!("{}", line.join(" "));
    }
}
