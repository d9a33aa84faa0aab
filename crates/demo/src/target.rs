//! The driver the demo and the bench run on, and the programs they start on it.

use anyhow::Context;
use control::capture::SuspendOptions;
use control::carrier_choice::Requested;
use control::layout::Layout;
use control::native::Driver;
use protocol::state::SuspendMode;
use std::path::PathBuf;
use workload::launch::Programs;

/// The driver the demo and the bench run on, and the programs they start on it.
#[derive(Debug)]
pub struct Target {
    /// A GPU's driver, rather than the bundled fake.
    pub on_gpu: bool,
    /// The driver, loaded into this process (for the native checkpoint API and `cuMemGetInfo`).
    pub driver: Driver,
    /// The workload and the shim beside this executable (control::layout), and for the fake the
    /// directory that makes the workloads load it.
    pub programs: Programs,
}

impl Target {
    /// The GPU when a driver with devices loads (unless `force_fake`), else the bundled fake.
    pub fn pick(force_fake: bool) -> anyhow::Result<Target> {
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

    /// The driver library the tool's own steps load: the fake's path on the fake, the loader's
    /// `libcuda.so.1` on a GPU.
    pub(crate) fn tool_driver(&self) -> Option<PathBuf> {
        (!self.on_gpu).then(|| self.driver.path().to_path_buf())
    }
}

/// Sets where a suspend leaves the group's bytes, as `suspend --carrier` does: a carrier helper,
/// should the suspend choose one, is this program's `carrier-helper` loading the suspend's driver.
pub(crate) fn apply_carrier(
    carrier: Requested,
    options: &mut SuspendOptions,
) -> anyhow::Result<()> {
    options.carrier = carrier;
    options.helper = Some(control::carrier_helper::HelperLaunch {
        program: std::env::current_exe()
            .context("finding this program, to start the carrier helper")?,
        driver: options.driver.clone(),
    });
    Ok(())
}

/// Prepares the carriers of the group under `root` for suspends of `mode` as `cuinterpose
/// prepare` does (`--keep-contexts` for [`SuspendMode::KeepContexts`]), with `carrier` and the
/// tool's driver `driver`, within the configured pin-ahead budget.
pub(crate) fn prepare(
    root: u32,
    mode: SuspendMode,
    carrier: Requested,
    driver: Option<PathBuf>,
    config: &control::config::ToolConfig,
) -> anyhow::Result<control::capture::PrepareReport> {
    let mut options = SuspendOptions::new(root, config);
    options.driver = driver;
    options.mode = mode;
    apply_carrier(carrier, &mut options)?;
    control::capture::prepare(&options, config.pin_ahead_budget).context("preparing the carriers")
}

/// `--carrier`'s word for what was asked.
pub fn carrier_flag(carrier: Requested) -> &'static str {
    match carrier {
        Requested::Auto => "auto",
        Requested::Process => "process",
        Requested::Helper => "helper",
    }
}
