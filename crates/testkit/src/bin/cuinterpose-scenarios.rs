//! `cuinterpose-scenarios`: runs the scenario list on the fake driver or the system's driver and
//! prints one row per outcome.
//!
//! ```text
//! cuinterpose-scenarios [--list] [--json] [--shim] [--driver auto|fake|system] [--skip-hangs]
//!                       [--size BYTES] [--hang-limit-s 20] [--lock-timeout-ms 10000]
//!                       [--artifacts DIR] [NAME...]
//! ```
//!
//! `auto` uses the system's `libcuda.so.1` when the loader finds one, else the fake driver next to
//! this binary. Scenarios that may hang on a real driver run last. Exit status 0 when every
//! scenario ran (whatever its outcome), 2 on a usage or start-up error.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Parser;
use cuinterpose_testkit::grammar::parse_number;
use cuinterpose_testkit::harness::{Artifacts, DriverKind};
use cuinterpose_testkit::scenarios::{self, Settings};

#[derive(Parser)]
#[command(name = "cuinterpose-scenarios", about = "Run the testkit scenarios")]
struct Cli {
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// One JSON object per outcome instead of a table.
    #[arg(long)]
    json: bool,
    /// Preload the shim into every workload.
    #[arg(long)]
    shim: bool,
    /// auto, fake or system.
    #[arg(long, default_value = "auto")]
    driver: String,
    /// Leave out the scenarios that may hang on a real driver.
    #[arg(long)]
    skip_hangs: bool,
    /// Bytes per allocation (suffixes K, M, G), rounded up to the granularity.
    #[arg(long, default_value = "4M")]
    size: String,
    /// Seconds a native call may run before it is reported as a hang.
    #[arg(long, default_value_t = 20)]
    hang_limit_s: u64,
    /// timeoutMs of every native lock.
    #[arg(long, default_value_t = 10_000)]
    lock_timeout_ms: u32,
    /// Where cuinterpose-workload, libcuinterpose.so and the fake driver are (default: next to
    /// this binary).
    #[arg(long)]
    artifacts: Option<PathBuf>,
    /// Scenarios to run (default: all).
    names: Vec<String>,
}

fn system_driver_present() -> bool {
    cuinterpose_testkit::native::system_library_present()
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuinterpose-scenarios: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.list {
        for s in scenarios::SCENARIOS {
            let mark = if s.hangs { " [may hang]" } else { "" };
            println!("{:<36} {}{mark}", s.name, s.about);
        }
        return Ok(());
    }
    let driver = match cli.driver.as_str() {
        "fake" => DriverKind::Fake,
        "system" => DriverKind::System,
        "auto" if system_driver_present() => DriverKind::System,
        "auto" => DriverKind::Fake,
        other => return Err(anyhow!("unknown driver {other:?} (auto, fake, system)")),
    };
    let artifacts = match cli.artifacts {
        Some(dir) => Artifacts::at(dir),
        None => Artifacts::locate()?,
    };
    let settings = Settings {
        artifacts,
        driver,
        shim: cli.shim,
        size: parse_number(&cli.size).context("--size")?,
        hang_limit: Duration::from_secs(cli.hang_limit_s),
        lock_timeout_ms: cli.lock_timeout_ms,
    };
    let chosen = scenarios::select(&cli.names, cli.skip_hangs).map_err(|e| anyhow!(e))?;
    if !cli.json {
        println!(
            "driver: {}  shim: {}  size: {}",
            driver.as_str(),
            if settings.shim { "yes" } else { "no" },
            settings.size
        );
        println!("{:<52} {:<8} {:<60} r580", "scenario", "seconds", "outcome");
    }
    for scenario in chosen {
        for outcome in scenarios::run(scenario, &settings) {
            if cli.json {
                println!("{}", outcome.to_json(&settings));
            } else {
                println!(
                    "{:<52} {:<8.2} {:<60} {}",
                    outcome.label(),
                    outcome.seconds,
                    outcome.outcome,
                    outcome.r580
                );
            }
        }
    }
    Ok(())
}
