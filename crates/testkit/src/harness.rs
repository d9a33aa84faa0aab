//! Test helpers: start workloads and groups, talk to them, assert on them, and never leak them.
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
//! Every process is started with stdin from `/dev/null`, stdout and stderr to a log file in the
//! test's private directory, its own process group, `LD_LIBRARY_PATH` starting with the fake
//! driver's directory (for [`DriverKind::Fake`]), private `FAKE_CUDA_STATE_DIR` and
//! `CUINTERPOSE_CONTROL_DIR`, the multicast kill switches (`NCCL_NVLS_ENABLE=0`,
//! `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, `NVSHMEM_DISABLE_NVLS=1`), and, with the shim,
//! `LD_PRELOAD` starting with `libcuinterpose.so`. Dropping a [`Workload`] that owns its process
//! kills its whole process group.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::ops::Index;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::driver::Resolve;
use crate::native::{ControlError, Driver};
use crate::reply::Reply;
use crate::wire::{self, WireError};
use control::layout::Layout;

/// How long a workload may take to start listening (driver initialisation included).
pub const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Default bound on one command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// The multicast kill switches set in every process the helpers start (DESIGN.md, GPU rules).
pub const NO_MULTICAST_ENV: [(&str, &str); 3] = [
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
];

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
    /// A build artifact is not there.
    #[error("{path} is missing: {hint}")]
    Missing {
        /// What was looked for.
        path: PathBuf,
        /// How to get it.
        hint: &'static str,
    },
    /// A file, directory or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A workload did not start.
    #[error("workload {workload} did not start: {source}\n--- log ---\n{log}")]
    Start {
        /// The workload's name.
        workload: String,
        /// What went wrong.
        source: WireError,
        /// The end of its log.
        log: String,
    },
    /// Talking to a workload failed.
    #[error("workload {workload}: {source}")]
    Wire {
        /// The workload's name.
        workload: String,
        /// What went wrong.
        source: WireError,
    },
    /// A command that had to succeed failed.
    #[error("workload {workload}: `{line}` failed: {}", describe(reply))]
    Failed {
        /// The workload's name.
        workload: String,
        /// The command.
        line: String,
        /// Its reply.
        reply: Box<Reply>,
    },
    /// A command's result was not the one expected.
    #[error("workload {workload}: `{line}` gave {got}, expected {expected}")]
    Unexpected {
        /// The workload's name.
        workload: String,
        /// The command.
        line: String,
        /// What was expected.
        expected: String,
        /// What came.
        got: String,
    },
    /// A reply lacks a field the helper needs.
    #[error("workload {workload}: reply to `{line}` has no {field}")]
    Field {
        /// The workload's name.
        workload: String,
        /// The command.
        line: String,
        /// The missing field.
        field: &'static str,
    },
    /// The native checkpoint API could not be used.
    #[error(transparent)]
    Native(#[from] ControlError),
}

fn describe(reply: &Reply) -> String {
    let mut s = reply.outcome();
    if let Some(call) = &reply.call {
        s.push_str(&format!(" from {call}"));
    }
    if let Some(m) = &reply.message {
        s.push_str(&format!(": {m}"));
    }
    for (k, v) in &reply.data {
        s.push_str(&format!(" {k}={v}"));
    }
    s
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
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

    fn existing(&self, name: &str, hint: &'static str) -> Result<PathBuf, HarnessError> {
        let path = self.dir.join(name);
        if path.exists() {
            Ok(path)
        } else {
            Err(HarnessError::Missing { path, hint })
        }
    }

    /// `cuinterpose-workload`.
    pub fn workload(&self) -> Result<PathBuf, HarnessError> {
        self.existing(
            "cuinterpose-workload",
            "build first: cargo build --workspace --all-targets",
        )
    }

    /// The first of `candidates` that exists.
    fn first(candidates: Vec<PathBuf>, hint: &'static str) -> Result<PathBuf, HarnessError> {
        match candidates.iter().find(|c| c.exists()) {
            Some(found) => Ok(found.clone()),
            None => Err(HarnessError::Missing {
                path: candidates.into_iter().next().unwrap_or_default(),
                hint,
            }),
        }
    }

    /// The shim, `libcuinterpose.so`: next to the binaries (cargo) or in `../lib` (the release
    /// layout, control::layout).
    pub fn shim(&self) -> Result<PathBuf, HarnessError> {
        Self::first(
            Layout::at(&self.dir).shim_candidates(),
            "build first: cargo build --workspace --all-targets",
        )
    }

    /// The directory holding the fake driver as `libcuda.so.1`: the release layout's test-driver
    /// directory, or in a cargo build a symlink to `../libcuda.so` created on demand.
    pub fn fake_driver_dir(&self) -> Result<PathBuf, HarnessError> {
        let found = Self::first(
            Layout::at(&self.dir).fake_driver_candidates(),
            "build first: cargo build --workspace --all-targets (the fake-cuda crate)",
        )?;
        if found.file_name() == Some(OsStr::new("libcuda.so.1"))
            && let Some(dir) = found.parent()
        {
            return Ok(dir.to_path_buf());
        }
        let dir = self.dir.join("fake-driver");
        std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
        let link = dir.join("libcuda.so.1");
        if std::fs::symlink_metadata(&link).is_err() {
            // Several test processes may race here; whoever loses finds the link in place.
            match std::os::unix::fs::symlink("../libcuda.so", &link) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(format!("cannot create {}", link.display()))(e)),
            }
        }
        Ok(dir)
    }

    /// The fake driver's `libcuda.so.1` path.
    pub fn fake_driver(&self) -> Result<PathBuf, HarnessError> {
        Ok(self.fake_driver_dir()?.join("libcuda.so.1"))
    }
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

/// A test's private world: a temporary directory for sockets, logs, the fake driver's state and
/// the shim's control sockets, and the settings every process of the test is started with.
#[derive(Debug)]
pub struct TestEnv {
    dir: tempfile::TempDir,
    artifacts: Artifacts,
    driver: DriverKind,
    shim: bool,
    env: Vec<(OsString, OsString)>,
    names: Mutex<HashSet<String>>,
    groups: AtomicUsize,
}

impl TestEnv {
    /// A new environment. The directory is under `/tmp` so socket paths stay short.
    pub fn new(
        artifacts: Artifacts,
        driver: DriverKind,
        shim: bool,
    ) -> Result<TestEnv, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("cuitk-")
            .tempdir_in("/tmp")
            .map_err(io("cannot create a temporary directory"))?;
        for sub in ["s", "log", "fake", "control"] {
            std::fs::create_dir(dir.path().join(sub))
                .map_err(io(format!("cannot create {sub} in the test directory")))?;
        }
        Ok(TestEnv {
            dir,
            artifacts,
            driver,
            shim,
            env: Vec::new(),
            names: Mutex::new(HashSet::new()),
            groups: AtomicUsize::new(0),
        })
    }

    /// Reserves a workload name (names pick socket and log paths, so they must be unique).
    fn claim(&self, name: &str) -> Result<(), HarnessError> {
        let fresh = self
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        if fresh {
            Ok(())
        } else {
            Err(HarnessError::Io {
                what: format!("workload name {name:?}"),
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "already used in this test environment",
                ),
            })
        }
    }

    /// A fresh prefix for the members of a helper-built group (`g1`, `g2`, ...).
    pub fn group_prefix(&self) -> String {
        format!("g{}", self.groups.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// The fake driver, no shim, artifacts next to the running test binary.
    pub fn fake() -> Result<TestEnv, HarnessError> {
        TestEnv::new(Artifacts::locate()?, DriverKind::Fake, false)
    }

    /// Whether workloads get the shim unless their options say otherwise.
    pub fn with_shim(mut self, shim: bool) -> TestEnv {
        self.shim = shim;
        self
    }

    /// An environment variable for every process started from here.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> TestEnv {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The test's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where workload sockets go.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir().join("s")
    }

    /// Where logs go.
    pub fn log_dir(&self) -> PathBuf {
        self.dir().join("log")
    }

    /// `FAKE_CUDA_STATE_DIR` of every process.
    pub fn fake_state_dir(&self) -> PathBuf {
        self.dir().join("fake")
    }

    /// `CUINTERPOSE_CONTROL_DIR` of every process.
    pub fn control_dir(&self) -> PathBuf {
        self.dir().join("control")
    }

    /// The artifacts.
    pub fn artifacts(&self) -> &Artifacts {
        &self.artifacts
    }

    /// The driver kind.
    pub fn driver(&self) -> DriverKind {
        self.driver
    }

    /// Whether workloads get the shim by default.
    pub fn shim(&self) -> bool {
        self.shim
    }

    /// The native checkpoint API of this environment's driver, loaded into this process.
    pub fn native(&self) -> Result<Arc<Driver>, HarnessError> {
        shared_native(&self.artifacts, self.driver)
    }

    /// A command for `program` with this environment applied (driver path, private directories,
    /// multicast switches, the shim if `shim`): for starting other programs of the project (the
    /// CLI) the same way workloads are started.
    pub fn command(&self, program: &Path, shim: bool) -> Result<Command, HarnessError> {
        let mut cmd = Command::new(program);
        for knob in FAKE_KNOBS {
            cmd.env_remove(knob);
        }
        if self.driver == DriverKind::Fake {
            let fake_dir = self.artifacts.fake_driver_dir()?;
            cmd.env("LD_LIBRARY_PATH", prepend(&fake_dir, "LD_LIBRARY_PATH"));
            cmd.env("FAKE_CUDA_STATE_DIR", self.fake_state_dir());
        }
        cmd.env("CUINTERPOSE_CONTROL_DIR", self.control_dir());
        for (k, v) in NO_MULTICAST_ENV {
            cmd.env(k, v);
        }
        if shim {
            cmd.env("LD_PRELOAD", prepend(&self.artifacts.shim()?, "LD_PRELOAD"));
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null());
        Ok(cmd)
    }

    /// Bytes the fake driver charges to `pid` on `device` (its usage file in
    /// [`TestEnv::fake_state_dir`], counted only while its owner holds the file's lock, as the
    /// fake's own accounting does; 0 for a process with no live file, e.g. a checkpointed one).
    pub fn fake_usage(&self, pid: u32, device: i32) -> Result<u64, HarnessError> {
        fake_usage_in(&self.fake_state_dir(), pid, device)
    }

    /// Starts a workload (see [`Workload::spawn`]).
    pub fn spawn(&self, options: WorkloadOptions) -> Result<Workload, HarnessError> {
        Workload::spawn(self, options)
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
                return Err(io(format!("cannot lock {}", entry.path().display()))(
                    e.into(),
                ));
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

/// `first` followed by the current value of `var` (colon-separated), if any.
fn prepend(first: &Path, var: &str) -> OsString {
    let mut value = OsString::from(first);
    if let Some(old) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(old);
    }
    value
}

/// How to start one workload.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// Names its socket (`<name>.sock`) and log (`<name>.log`); unique within a [`TestEnv`].
    pub name: String,
    /// The device whose primary context it uses.
    pub device: i32,
    /// How it resolves driver entry points.
    pub resolve: Resolve,
    /// With the shim preloaded; `None` takes the [`TestEnv`]'s default.
    pub shim: Option<bool>,
    /// Extra environment.
    pub env: Vec<(OsString, OsString)>,
    /// A script to run before serving.
    pub script: Option<PathBuf>,
    /// Bound on each command.
    pub timeout: Duration,
}

impl WorkloadOptions {
    /// Defaults: device 0, `dlsym`, the environment's shim setting, no script.
    pub fn new(name: impl Into<String>) -> WorkloadOptions {
        WorkloadOptions {
            name: name.into(),
            device: 0,
            resolve: Resolve::Dlsym,
            shim: None,
            env: Vec::new(),
            script: None,
            timeout: COMMAND_TIMEOUT,
        }
    }

    /// Uses `device`.
    pub fn device(mut self, device: i32) -> WorkloadOptions {
        self.device = device;
        self
    }

    /// Resolves entry points through `resolve`.
    pub fn resolve(mut self, resolve: Resolve) -> WorkloadOptions {
        self.resolve = resolve;
        self
    }

    /// With or without the shim, whatever the environment says.
    pub fn shim(mut self, shim: bool) -> WorkloadOptions {
        self.shim = Some(shim);
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> WorkloadOptions {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs `script` before serving.
    pub fn script(mut self, script: impl Into<PathBuf>) -> WorkloadOptions {
        self.script = Some(script.into());
        self
    }

    /// Bounds each command by `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> WorkloadOptions {
        self.timeout = timeout;
        self
    }
}

/// A region as `addresses` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// `reservation`, `mapping`, `malloc` or `ipc`.
    pub kind: String,
    /// Device address.
    pub base: u64,
    /// Bytes.
    pub size: u64,
}

/// A running workload (or one rank of a tree), reached through its socket.
#[derive(Debug)]
pub struct Workload {
    name: String,
    socket: PathBuf,
    pid: u32,
    device: i32,
    log: PathBuf,
    process: Option<Child>,
    timeout: Duration,
}

impl Workload {
    /// Starts `cuinterpose-workload serve` and waits until it answers (driver initialised, context
    /// current, socket bound).
    pub fn spawn(env: &TestEnv, options: WorkloadOptions) -> Result<Workload, HarnessError> {
        let socket = env.socket_dir().join(format!("{}.sock", options.name));
        let mut args: Vec<OsString> = vec![
            "serve".into(),
            "--listen".into(),
            socket.clone().into(),
            "--device".into(),
            options.device.to_string().into(),
            "--resolve".into(),
            options.resolve.as_str().into(),
        ];
        if let Some(script) = &options.script {
            args.push("--script".into());
            args.push(script.clone().into());
        }
        Workload::start(env, &options, args, socket, options.device)
    }

    fn start(
        env: &TestEnv,
        options: &WorkloadOptions,
        args: Vec<OsString>,
        socket: PathBuf,
        device: i32,
    ) -> Result<Workload, HarnessError> {
        let program = env.artifacts.workload()?;
        env.claim(&options.name)?;
        let shim = options.shim.unwrap_or(env.shim);
        let mut cmd = env.command(&program, shim)?;
        cmd.args(&args);
        for (k, v) in &options.env {
            cmd.env(k, v);
        }
        let log = env.log_dir().join(format!("{}.log", options.name));
        let out = File::create(&log).map_err(io(format!("cannot create {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io("cannot duplicate a log descriptor"))?;
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.stdout(out).stderr(err);
        let mut child = cmd
            .spawn()
            .map_err(io(format!("cannot start {}", program.display())))?;
        let ready = wire::wait_listening(&socket, START_TIMEOUT, || {
            matches!(child.try_wait(), Ok(None))
        });
        let mut workload = Workload {
            name: options.name.clone(),
            socket,
            pid: child.id(),
            device,
            log,
            process: Some(child),
            timeout: options.timeout,
        };
        // The answer must come from the process just started, not from another one that happens
        // to listen on the path.
        let ready = ready.and_then(|reply| match reply.u64("pid") {
            Some(p) if p == u64::from(workload.pid) => Ok(()),
            other => Err(WireError::Protocol(format!(
                "{} is answered by pid {other:?}, not by the new process {}",
                workload.socket.display(),
                workload.pid
            ))),
        });
        if let Err(source) = ready {
            workload.kill();
            return Err(HarnessError::Start {
                workload: workload.name.clone(),
                source,
                log: workload.log_tail(),
            });
        }
        Ok(workload)
    }

    /// A handle on a workload that someone else started (a tree rank), listening on `socket`.
    pub fn attach(
        name: impl Into<String>,
        socket: PathBuf,
        device: i32,
        log: PathBuf,
    ) -> Result<Workload, HarnessError> {
        let mut w = Workload {
            name: name.into(),
            socket,
            pid: 0,
            device,
            log,
            process: None,
            timeout: COMMAND_TIMEOUT,
        };
        let info = w.ok("info")?;
        w.pid = info
            .u64("pid")
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| HarnessError::Field {
                workload: w.name.clone(),
                line: "info".into(),
                field: "pid",
            })?;
        Ok(w)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its host PID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The device of its context.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last 4 KiB of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(4096);
        String::from_utf8_lossy(text.get(start..).unwrap_or(&[])).into_owned()
    }

    fn wire_err(&self, source: WireError) -> HarnessError {
        HarnessError::Wire {
            workload: self.name.clone(),
            source,
        }
    }

    /// Sends one command; the reply may say it failed.
    pub fn cmd(&self, line: &str) -> Result<Reply, HarnessError> {
        wire::call_one(&self.socket, line, self.timeout).map_err(|e| self.wire_err(e))
    }

    /// Sends commands on one connection; one reply each.
    pub fn batch(&self, lines: &[&str]) -> Result<Vec<Reply>, HarnessError> {
        wire::call(&self.socket, lines, None, self.timeout).map_err(|e| self.wire_err(e))
    }

    /// Sends one command that must succeed.
    pub fn ok(&self, line: &str) -> Result<Reply, HarnessError> {
        let reply = self.cmd(line)?;
        if reply.ok {
            Ok(reply)
        } else {
            Err(HarnessError::Failed {
                workload: self.name.clone(),
                line: line.to_owned(),
                reply: Box::new(reply),
            })
        }
    }

    /// Sends commands that must all succeed, in order, each on its own connection (so a failure
    /// stops the rest).
    pub fn all_ok(&self, lines: &[&str]) -> Result<Vec<Reply>, HarnessError> {
        lines.iter().map(|l| self.ok(l)).collect()
    }

    /// Sends one command whose outcome must be `expected` (`ok`, `CUDA_ERROR_...`, `mismatch`...).
    pub fn expect(&self, line: &str, expected: &str) -> Result<Reply, HarnessError> {
        let reply = self.cmd(line)?;
        if reply.outcome() == expected {
            Ok(reply)
        } else {
            Err(HarnessError::Unexpected {
                workload: self.name.clone(),
                line: line.to_owned(),
                expected: expected.to_owned(),
                got: describe(&reply),
            })
        }
    }

    /// Checks that `region` holds the pattern of `seed` (from its start to its end).
    pub fn assert_pattern(&self, region: &str, seed: u64) -> Result<(), HarnessError> {
        self.ok(&format!("verify {region} {seed}")).map(|_| ())
    }

    /// Every region this workload holds, by name.
    pub fn regions(&self) -> Result<std::collections::BTreeMap<String, RegionInfo>, HarnessError> {
        let reply = self.ok("addresses")?;
        let missing = || HarnessError::Field {
            workload: self.name.clone(),
            line: "addresses".into(),
            field: "regions",
        };
        let regions = reply
            .data
            .get("regions")
            .and_then(|v| v.as_object())
            .ok_or_else(missing)?;
        regions
            .iter()
            .map(|(name, v)| {
                let kind = v.get("kind").and_then(|k| k.as_str()).ok_or_else(missing)?;
                let base = v.get("base").and_then(|k| k.as_u64()).ok_or_else(missing)?;
                let size = v.get("size").and_then(|k| k.as_u64()).ok_or_else(missing)?;
                Ok((
                    name.clone(),
                    RegionInfo {
                        kind: kind.to_owned(),
                        base,
                        size,
                    },
                ))
            })
            .collect()
    }

    /// Whether the process still runs (always `true` for an attached rank).
    pub fn is_alive(&mut self) -> bool {
        match &mut self.process {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Waits up to `timeout` for the owned process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, HarnessError> {
        let Some(child) = &mut self.process else {
            return Ok(None);
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().map_err(io("cannot wait for a workload"))? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `exit` and waits for the process to end.
    pub fn exit(mut self) -> Result<Option<ExitStatus>, HarnessError> {
        self.ok("exit")?;
        self.wait_exit(Duration::from_secs(30))
    }

    /// Kills the process group of an owned process and reaps it (bounded: a process stuck in the
    /// driver may not die at once; it is then left to the system rather than hanging the test).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.process.take() {
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.kill();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Several workloads: separate processes, or the ranks of one process tree.
#[derive(Debug)]
pub struct Group {
    members: Vec<Workload>,
}

impl Index<usize> for Group {
    type Output = Workload;
    fn index(&self, rank: usize) -> &Workload {
        &self.members[rank]
    }
}

impl Group {
    /// `n` separate workloads; `options(rank)` describes each.
    pub fn spawn(
        env: &TestEnv,
        n: usize,
        options: impl Fn(usize) -> WorkloadOptions,
    ) -> Result<Group, HarnessError> {
        let members = (0..n)
            .map(|r| Workload::spawn(env, options(r)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Group { members })
    }

    /// One process tree of `n` ranks (`cuinterpose-workload tree`): the root is rank 0 and owns
    /// the processes; every rank uses `options.device` and `options.resolve`.
    pub fn tree(env: &TestEnv, n: usize, options: WorkloadOptions) -> Result<Group, HarnessError> {
        let device = options.device;
        Group::tree_on(env, n, options, &[device])
    }

    /// [`Group::tree`] with rank `r` on `devices[r % devices.len()]` (the workload's `--devices`).
    pub fn tree_on(
        env: &TestEnv,
        n: usize,
        options: WorkloadOptions,
        devices: &[i32],
    ) -> Result<Group, HarnessError> {
        let dir = env.socket_dir().join(&options.name);
        let device_of = |rank: usize| {
            devices
                .get(rank % devices.len().max(1))
                .copied()
                .unwrap_or(0)
        };
        let list: Vec<String> = devices.iter().map(ToString::to_string).collect();
        let args: Vec<OsString> = vec![
            "tree".into(),
            "--processes".into(),
            n.to_string().into(),
            "--listen-dir".into(),
            dir.clone().into(),
            "--devices".into(),
            list.join(",").into(),
            "--resolve".into(),
            options.resolve.as_str().into(),
        ];
        let root = Workload::start(env, &options, args, dir.join("0.sock"), device_of(0))?;
        let mut members = vec![root];
        for rank in 1..n {
            members.push(Workload::attach(
                format!("{}.{rank}", options.name),
                dir.join(format!("{rank}.sock")),
                device_of(rank),
                dir.join(format!("{rank}.log")),
            )?);
        }
        Ok(Group { members })
    }

    /// A sharing pair, both ways (members named `g<N>w0`, `g<N>w1`): rank 0 creates `a0` and
    /// rank 1 `a1` (`size` bytes each,
    /// POSIX-capable); each exports its allocation to the other, which imports it; both map both
    /// (region names `a0`, `a1` in each process) with read-write access. Exported descriptors stay
    /// open in the creators.
    pub fn sharing_pair(env: &TestEnv, size: u64) -> Result<Group, HarnessError> {
        let prefix = env.group_prefix();
        let g = Group::spawn(env, 2, |r| WorkloadOptions::new(format!("{prefix}w{r}")))?;
        g.create_shared(0, "a0", size)?;
        g.create_shared(1, "a1", size)?;
        g.share(0, 1, "a0", size)?;
        g.share(1, 0, "a1", size)?;
        Ok(g)
    }

    /// A sharing ring of `n`: rank `i` creates `a<i>`, exports it to rank `(i + 1) % n`, which
    /// imports and maps it.
    pub fn sharing_ring(env: &TestEnv, n: usize, size: u64) -> Result<Group, HarnessError> {
        let prefix = env.group_prefix();
        let g = Group::spawn(env, n, |r| WorkloadOptions::new(format!("{prefix}w{r}")))?;
        g.ring(size)?;
        Ok(g)
    }

    /// Builds the ring topology of [`Group::sharing_ring`] on these members.
    pub fn ring(&self, size: u64) -> Result<(), HarnessError> {
        let n = self.len();
        for i in 0..n {
            self.create_shared(i, &format!("a{i}"), size)?;
        }
        for i in 0..n {
            self.share(i, (i + 1) % n, &format!("a{i}"), size)?;
        }
        Ok(())
    }

    /// In `rank`: creates `name` (POSIX-capable), reserves `r-<name>`, maps it as region `name`,
    /// grants read-write access to its device, exports it (descriptor `name`).
    pub fn create_shared(&self, rank: usize, name: &str, size: u64) -> Result<(), HarnessError> {
        let w = &self[rank];
        w.all_ok(&[
            &format!("create {name} {size} --handle-types posix"),
            &format!("reserve r-{name} {size}"),
            &format!("map {name} r-{name}"),
            &format!("set-access {name} --device {}", w.device()),
            &format!("export {name}"),
        ])?;
        Ok(())
    }

    /// Sends descriptor `name` from `from` to `to`, which imports it and maps it like
    /// [`Group::create_shared`] does (region `name`).
    pub fn share(&self, from: usize, to: usize, name: &str, size: u64) -> Result<(), HarnessError> {
        let peer = self[to].socket().display().to_string();
        self[from].ok(&format!("send-fd {name} --to {peer}"))?;
        let w = &self[to];
        w.all_ok(&[
            &format!("import {name} --size {size}"),
            &format!("reserve r-{name} {size}"),
            &format!("map {name} r-{name}"),
            &format!("set-access {name} --device {}", w.device()),
        ])?;
        Ok(())
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the group is empty.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members, by rank.
    pub fn members(&self) -> &[Workload] {
        &self.members
    }

    /// The members, mutable (to kill or wait for one).
    pub fn members_mut(&mut self) -> &mut [Workload] {
        &mut self.members
    }

    /// The members, owned.
    pub fn into_members(self) -> Vec<Workload> {
        self.members
    }
}
