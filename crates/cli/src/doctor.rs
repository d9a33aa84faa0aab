//! `cuinterpose doctor`: prints control::doctor's checks, one line each with what to fix.

use control::doctor::{self, Options, Status};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// The CUDA driver library to check (default: libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// The CRIU binary to check (default: $CUINTERPOSE_CRIU, the bundled CRIU, then criu on PATH)
    #[arg(long)]
    criu: Option<PathBuf>,
    /// Print a JSON report instead of one line per check
    #[arg(long)]
    json: bool,
}

/// Returns whether every check passed or only warned.
pub fn doctor(args: DoctorArgs, config: &control::config::ToolConfig) -> anyhow::Result<bool> {
    let report = doctor::diagnose(&Options {
        driver: args.driver,
        criu: args.criu,
        configured_criu: config.criu.clone(),
    });
    if args.json {
        crate::output::print_json(&report)?;
    } else {
        let width = report
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(0);
        for check in &report.checks {
            let mut line = format!(
                "{:<4}  {:<width$}  {}",
                check.status.as_str(),
                check.name,
                check.detail
            );
            if let Some(fix) = &check.fix {
                line.push_str(&format!(" -> {fix}"));
            }
            println!("{line}");
        }
        let failed = report
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        println!(
            "{}",
            if failed == 0 {
                "doctor: this machine has what cuinterpose needs".to_string()
            } else {
                format!("doctor: {failed} check(s) failed")
            }
        );
    }
    Ok(report.ok)
}
