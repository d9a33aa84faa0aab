//! Test helpers: the test environment ([`TestEnv`], a [`Launcher`] on the fake driver or the
//! system's, hermetic), where the build artifacts are ([`Artifacts`]), and the fake driver's
//! accounting. Workloads and groups are `cuinterpose-workload`'s own client ([`Workload`],
//! [`Group`]), re-exported here.
//!
//! ```no_run
//! use cuinterpose_testkit::{Group, TestEnv};
//! let env = TestEnv::fake()?;
//! let group = Group::sharing_pair(&env, 2 << 20)?;
//! group[0].ok("fill a0 7")?;
//! group[1].assert_pattern("a0", 7)?;
//! # Ok::<(), cuinterpose_testkit::harness::HarnessError>(())
//! ```
//!
//! Beyond what every [`Launcher`] sets, a test environment starts every process with
//! `LD_LIBRARY_PATH` starting with the fake driver's directory and a private `FAKE_CUDA_STATE_DIR`
//! (for [`DriverKind::Fake`]), and without the inherited `FAKE_CUDA_*` knobs.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use control::layout::Layout;
pub use workload::launch::{
    COMMAND_TIMEOUT, Group, LaunchError, Launcher, NO_MULTICAST_ENV, Programs, RegionInfo,
    START_TIMEOUT, Workload, WorkloadOptions, io,
};

use crate::native::{ControlError, Driver};

/// Fake-driver knobs removed from the inherited environment, so that tests are hermetic (a test
/// sets what it needs through [`TestEnv::env`] or [`WorkloadOptions::env`]).
const FAKE_KNOBS: [&str; 5] = [
    "FAKE_CUDA_DEVICES",
    "FAKE_CUDA_DEVICE_MEMORY",
    "FAKE_CUDA_STATE_DIR",
    "FAKE_CUDA_MULTICAST",
    "FAKE_CUDA_FAIL",
];

/// Why a helper failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Starting or talking to a workload failed, or an artifact is missing.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The native checkpoint API could not be used.
    #[error(transparent)]
    Native(#[from] ControlError),
    /// The error probes' process (`cuinterpose-probe-errors`) ended other than with its cases or
    /// by a probe.
    #[error("{what}\n--- log ---\n{log}")]
    Probes {
        /// What went wrong.
        what: String,
        /// Its stderr.
        log: String,
    },
}

/// Which `libcuda.so.1` the workloads load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// The fake driver of this build (`target/<profile>/fake-driver/libcuda.so.1`).
    Fake,
    /// Whatever the loader finds (the real driver on a GPU machine).
    System,
}

impl DriverKind {
    /// `fake` or `system`.
    pub fn as_str(self) -> &'static str {
        match self {
            DriverKind::Fake => "fake",
            DriverKind::System => "system",
        }
    }
}

/// Where the build artifacts are: `target/<profile>/` (or wherever the binaries were carried).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifacts {
    dir: PathBuf,
}

impl Artifacts {
    /// The directory of the running executable, or its parent when that is `deps/` (a test
    /// binary). `CARGO_TARGET_DIR` is not consulted: the profile is only known from the executable.
    pub fn locate() -> Result<Artifacts, HarnessError> {
        let exe = std::env::current_exe().map_err(io("cannot find the running executable"))?;
        let mut dir = exe
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        if dir.file_name() == Some(OsStr::new("deps")) {
            dir.pop();
        }
        Ok(Artifacts { dir })
    }

    /// Artifacts in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Artifacts {
        Artifacts { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cuinterpose-workload`, whether or not it is there.
    pub fn workload_path(&self) -> PathBuf {
        self.dir.join(workload::PROGRAM)
    }

    /// `cuinterpose-workload`.
    pub fn workload(&self) -> Result<PathBuf, HarnessError> {
        let path = self.workload_path();
        if path.exists() {
            Ok(path)
        } else {
            Err(missing(path, BUILD_FIRST))
        }
    }

    /// The shim, `libcuinterpose.so`: next to the binaries (cargo) or in `../lib` (the release
    /// layout, control::layout).
    pub fn shim(&self) -> Result<PathBuf, HarnessError> {
        let candidates = Layout::at(&self.dir).shim_candidates();
        match candidates.iter().find(|c| c.exists()) {
            Some(found) => Ok(found.clone()),
            None => Err(missing(
                candidates.into_iter().next().unwrap_or_default(),
                BUILD_FIRST,
            )),
        }
    }

    /// The directory holding the fake driver as `libcuda.so.1` ([`Layout::fake_driver_dir`]).
    pub fn fake_driver_dir(&self) -> Result<PathBuf, HarnessError> {
        let layout = Layout::at(&self.dir);
        match layout.fake_driver_dir() {
            Ok(Some(dir)) => Ok(dir),
            Ok(None) => Err(missing(
                layout
                    .fake_driver_candidates()
                    .into_iter()
                    .next()
                    .unwrap_or_default(),
                "build first: cargo build --workspace --all-targets (the fake-cuda crate)",
            )),
            Err(e) => Err(io(format!(
                "cannot make the fake driver's directory in {}",
                self.dir.display()
            ))(e)
            .into()),
        }
    }

    /// The fake driver's `libcuda.so.1` path.
    pub fn fake_driver(&self) -> Result<PathBuf, HarnessError> {
        Ok(self.fake_driver_dir()?.join("libcuda.so.1"))
    }

    /// A directory holding the fake NCCL (crate `fake-nccl`, cargo's `libnccl.so`) as
    /// `libnccl.so.2`, the name programs load: `<dir>/fake-nccl/`, made on first use.
    pub fn fake_nccl_dir(&self) -> Result<PathBuf, HarnessError> {
        let built = self.dir.join("libnccl.so");
        if !built.exists() {
            return Err(missing(
                built,
                "build first: cargo build --workspace --all-targets (the fake-nccl crate)",
            ));
        }
        let dir = self.dir.join("fake-nccl");
        let link = dir.join("libnccl.so.2");
        if !link.exists() {
            std::fs::create_dir_all(&dir)
                .map_err(io(format!("cannot create {}", dir.display())))?;
            // Another test may make it at the same time: a link that appeared meanwhile is fine.
            if let Err(e) = std::os::unix::fs::symlink(&built, &link)
                && e.kind() != std::io::ErrorKind::AlreadyExists
            {
                return Err(io(format!("cannot link {}", link.display()))(e).into());
            }
        }
        Ok(dir)
    }
}

const BUILD_FIRST: &str = "build first: cargo build --workspace --all-targets";

fn missing(path: PathBuf, hint: &'static str) -> HarnessError {
    LaunchError::Missing { path, hint }.into()
}

/// The native checkpoint API, loaded once per process and driver kind.
pub fn shared_native(artifacts: &Artifacts, kind: DriverKind) -> Result<Arc<Driver>, HarnessError> {
    static FAKE: OnceLock<Arc<Driver>> = OnceLock::new();
    static SYSTEM: OnceLock<Arc<Driver>> = OnceLock::new();
    let (cell, path) = match kind {
        DriverKind::Fake => (&FAKE, artifacts.fake_driver()?),
        DriverKind::System => (&SYSTEM, PathBuf::from("libcuda.so.1")),
    };
    if let Some(n) = cell.get() {
        return Ok(Arc::clone(n));
    }
    let loaded = Arc::new(Driver::load(Some(&path))?);
    Ok(Arc::clone(cell.get_or_init(|| loaded)))
}

/// A test's private world: a [`Launcher`] (sockets, logs, the shims' control sockets), the fake
/// driver's state directory, and the settings every process of the test is started with. Every
/// [`Launcher`] method is available on it.
#[derive(Debug)]
pub struct TestEnv {
    launcher: Launcher,
    artifacts: Artifacts,
    driver: DriverKind,
}

impl Deref for TestEnv {
    type Target = Launcher;
    fn deref(&self) -> &Launcher {
        &self.launcher
    }
}

impl TestEnv {
    /// A new environment. The directory is under `/tmp` so socket paths stay short.
    pub fn new(
        artifacts: Artifacts,
        driver: DriverKind,
        shim: bool,
    ) -> Result<TestEnv, HarnessError> {
        let programs = Programs {
            workload: artifacts.workload_path(),
            shim: artifacts.shim().ok(),
            driver_dir: match driver {
                DriverKind::Fake => Some(artifacts.fake_driver_dir()?),
                DriverKind::System => None,
            },
        };
        let mut launcher = Launcher::new(programs, shim)?;
        for knob in FAKE_KNOBS {
            launcher = launcher.env_remove(knob);
        }
        let fake_state = launcher.dir().join("fake");
        std::fs::create_dir(&fake_state).map_err(io("cannot create fake in the test directory"))?;
        if driver == DriverKind::Fake {
            launcher = launcher.env("FAKE_CUDA_STATE_DIR", fake_state);
        }
        Ok(TestEnv {
            launcher,
            artifacts,
            driver,
        })
    }

    /// The fake driver, no shim, artifacts next to the running test binary.
    pub fn fake() -> Result<TestEnv, HarnessError> {
        TestEnv::new(Artifacts::locate()?, DriverKind::Fake, false)
    }

    /// Whether workloads get the shim unless their options say otherwise.
    pub fn with_shim(mut self, shim: bool) -> TestEnv {
        self.launcher = self.launcher.with_shim(shim);
        self
    }

    /// An environment variable for every process started from here.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> TestEnv {
        self.launcher = self.launcher.env(key, value);
        self
    }

    /// Every process finds the fake NCCL ([`Artifacts::fake_nccl_dir`]) as `libnccl.so.2`, after
    /// the fake driver on `LD_LIBRARY_PATH`.
    pub fn with_fake_nccl(self) -> Result<TestEnv, HarnessError> {
        let nccl = self.artifacts.fake_nccl_dir()?;
        let mut path = std::ffi::OsString::new();
        if let Some(driver) = &self.programs().driver_dir {
            path.push(driver);
            path.push(":");
        }
        path.push(nccl);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            path.push(":");
            path.push(old);
        }
        Ok(self.env("LD_LIBRARY_PATH", path))
    }

    /// `FAKE_CUDA_STATE_DIR` of every process.
    pub fn fake_state_dir(&self) -> PathBuf {
        self.dir().join("fake")
    }

    /// The artifacts.
    pub fn artifacts(&self) -> &Artifacts {
        &self.artifacts
    }

    /// The driver kind.
    pub fn driver(&self) -> DriverKind {
        self.driver
    }

    /// The native checkpoint API of this environment's driver, loaded into this process.
    pub fn native(&self) -> Result<Arc<Driver>, HarnessError> {
        shared_native(&self.artifacts, self.driver)
    }

    /// Bytes the fake driver charges to `pid` on `device` (its usage file in
    /// [`TestEnv::fake_state_dir`], counted only while its owner holds the file's lock, as the
    /// fake's own accounting does; 0 for a process with no live file, e.g. a checkpointed one).
    pub fn fake_usage(&self, pid: u32, device: i32) -> Result<u64, HarnessError> {
        fake_usage_in(&self.fake_state_dir(), pid, device)
    }
}

/// Reads the fake driver's usage files (format: `crates/fake-cuda/src/accounting.rs`):
/// `usage-<pid>-<start>` holding `fake-cuda-usage 1`, `pid`, `start`, `devices N` and one
/// `device <ordinal> <bytes>` line per device. A file counts only while its owner holds an
/// exclusive `flock` on it.
pub fn fake_usage_in(dir: &Path, pid: u32, device: i32) -> Result<u64, HarnessError> {
    let entries = std::fs::read_dir(dir).map_err(io(format!("cannot read {}", dir.display())))?;
    let prefix = format!("usage-{pid}-");
    let mut total = 0u64;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let Ok(file) = File::open(entry.path()) else {
            continue;
        };
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
            // Nobody holds the owner's lock: not live.
            Ok(()) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => {
                return Err(io(format!("cannot lock {}", entry.path().display()))(e.into()).into());
            }
        }
        let text = std::fs::read_to_string(entry.path())
            .map_err(io(format!("cannot read {}", entry.path().display())))?;
        let wanted = format!("device {device} ");
        total += text
            .lines()
            .find_map(|l| l.strip_prefix(&wanted))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}
