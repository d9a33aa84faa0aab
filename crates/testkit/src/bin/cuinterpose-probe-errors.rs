//! `cuinterpose-probe-errors`: runs the error probes (`cuinterpose_testkit::probes`) on one device
//! in this process and prints their results, for the `vmm-errors` scenario, which starts it as it
//! starts a workload (the driver its environment gives, with or without the shim).
//!
//! ```text
//! cuinterpose-probe-errors [--device D] [--skip NAME[,NAME...]]...
//! ```
//!
//! It loads `libcuda.so.1` as the workload does (`dlsym`), initialises it and makes the primary
//! context of `--device` current, then prints `{"cases": [...]}` on stdout, each probe's name on
//! stderr before it runs (a real driver kills the process on some bad pointers). Exit status 0 when
//! every probe ran, 1 when the driver could not be set up, 2 on a usage error (an unknown probe).

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use cuinterpose_testkit::driver::{CuError, Driver, Resolve};
use cuinterpose_testkit::probes::{PROBES, run_all};

#[derive(Parser)]
#[command(
    name = "cuinterpose-probe-errors",
    about = "Run the error probes on one device"
)]
struct Cli {
    /// The device whose primary context the probes use.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Probes to leave out, by name (comma-separated, or the option repeated).
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(unknown) = cli
        .skip
        .iter()
        .find(|n| !PROBES.iter().any(|p| p.name == n.as_str()))
    {
        eprintln!("cuinterpose-probe-errors: no probe {unknown:?}");
        return ExitCode::from(2);
    }
    let driver = match driver_on(cli.device) {
        Ok(driver) => driver,
        Err(e) => {
            eprintln!("cuinterpose-probe-errors: {e}");
            return ExitCode::from(1);
        }
    };
    let skip: Vec<&str> = cli.skip.iter().map(String::as_str).collect();
    let cases = run_all(&driver, cli.device, &skip);
    println!("{}", serde_json::json!({ "cases": cases }));
    ExitCode::SUCCESS
}

/// `libcuda.so.1`, initialised, with the primary context of `device` current on this thread.
fn driver_on(device: i32) -> Result<Driver, String> {
    let driver =
        Driver::load(Path::new("libcuda.so.1"), Resolve::Dlsym).map_err(|e| e.to_string())?;
    let setup = |driver: &Driver| -> Result<(), CuError> {
        driver.init()?;
        driver.use_primary_context(driver.device(device)?)
    };
    setup(&driver).map_err(|e| format!("driver initialisation failed: {e}"))?;
    Ok(driver)
}
