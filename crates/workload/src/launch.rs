//! Start workloads and process trees, talk to them, and never leak them: the client side of
//! `cuinterpose-workload`, for the tool's `demo` and `bench` and for the tests (`cuinterpose-testkit`
//! builds its test environment on [`Launcher`]).
//!
//! ```no_run
//! use cuinterpose_workload::launch::{Group, Launcher, Programs, WorkloadOptions};
//! let programs = Programs {
//!     workload: "target/debug/cuinterpose-workload".into(),
//!     shim: Some("target/debug/libcuinterpose.so".into()),
//!     driver_dir: None,
//! };
//! let launcher = Launcher::new(programs, true)?;
//! let group = Group::tree(&launcher, 2, WorkloadOptions::new("demo"))?;
//! group.ring(2 << 20)?;
//! group[0].ok("fill a0 7")?;
//! group[1].assert_pattern("a0", 7)?;
//! # Ok::<(), cuinterpose_workload::launch::LaunchError>(())
//! ```
//!
//! Every process is started with stdin from `/dev/null`, stdout and stderr to a log file in the
//! launcher's private directory, its own process group, `LD_LIBRARY_PATH` starting with
//! [`Programs::driver_dir`] when there is one, a private `CUINTERPOSE_CONTROL_DIR`, the multicast
//! kill switches (`NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`,
//! `NVSHMEM_DISABLE_NVLS=1`), and, with the shim, `LD_PRELOAD` starting with `libcuinterpose.so`.
//! Dropping a [`Workload`] that owns its process kills its whole process group.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::ops::Index;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::driver::Resolve;
use crate::reply::Reply;
use crate::wire::{self, WireError};

/// How long a workload may take to start listening (driver initialisation included).
pub const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Default bound on one command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// The multicast kill switches set in every process the launcher starts (docs/design.md, "Rules
/// on the GPU machine").
pub const NO_MULTICAST_ENV: [(&str, &str); 3] = [
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
];

/// Why starting or talking to a workload failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A program or library to start is not there.
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
    /// A reply lacks a field the caller needs.
    #[error("workload {workload}: reply to `{line}` has no {field}")]
    Field {
        /// The workload's name.
        workload: String,
        /// The command.
        line: String,
        /// The missing field.
        field: &'static str,
    },
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

/// An [`LaunchError::Io`] maker for `map_err`.
pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let what = what.into();
    move |source| LaunchError::Io { what, source }
}

/// What the launcher starts, found by its caller (the tool beside its own executable, the tests
/// in the cargo target directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programs {
    /// `cuinterpose-workload`.
    pub workload: PathBuf,
    /// `libcuinterpose.so`, preloaded into workloads started with the shim; `None` when it was not
    /// found (starting a workload with the shim then fails).
    pub shim: Option<PathBuf>,
    /// A directory holding the `libcuda.so.1` the workloads load, put first on `LD_LIBRARY_PATH`;
    /// `None`: whichever the loader finds.
    pub driver_dir: Option<PathBuf>,
}

/// A private world for workloads: a temporary directory for sockets, logs and the shims' control
/// sockets, and the settings every process started from here gets. Removed on drop.
#[derive(Debug)]
pub struct Launcher {
    dir: tempfile::TempDir,
    programs: Programs,
    shim: bool,
    env: Vec<(OsString, OsString)>,
    env_remove: Vec<OsString>,
    names: Mutex<HashSet<String>>,
    groups: AtomicUsize,
}

impl Launcher {
    /// A new launcher whose workloads get the shim when `shim` (unless their options say
    /// otherwise). The directory is under `/tmp` so that socket paths stay short.
    pub fn new(programs: Programs, shim: bool) -> Result<Launcher, LaunchError> {
        let dir = tempfile::Builder::new()
            .prefix("cuitk-")
            .tempdir_in("/tmp")
            .map_err(io("cannot create a temporary directory"))?;
        for sub in ["s", "log", "control"] {
            std::fs::create_dir(dir.path().join(sub)).map_err(io(format!(
                "cannot create {sub} in {}",
                dir.path().display()
            )))?;
        }
        Ok(Launcher {
            dir,
            programs,
            shim,
            env: Vec::new(),
            env_remove: Vec::new(),
            names: Mutex::new(HashSet::new()),
            groups: AtomicUsize::new(0),
        })
    }

    /// Whether workloads get the shim unless their options say otherwise.
    pub fn with_shim(mut self, shim: bool) -> Launcher {
        self.shim = shim;
        self
    }

    /// An environment variable for every process started from here (set after the launcher's
    /// own, so it may override them).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Launcher {
        self.env.push((key.into(), value.into()));
        self
    }

    /// An inherited environment variable that no process started from here gets (unless
    /// [`Launcher::env`] sets it).
    pub fn env_remove(mut self, key: impl Into<OsString>) -> Launcher {
        self.env_remove.push(key.into());
        self
    }

    /// Reserves a workload name (names pick socket and log paths, so they must be unique).
    fn claim(&self, name: &str) -> Result<(), LaunchError> {
        let fresh = self
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        if fresh {
            Ok(())
        } else {
            Err(LaunchError::Io {
                what: format!("workload name {name:?}"),
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "already used in this launcher",
                ),
            })
        }
    }

    /// A fresh prefix for the members of a helper-built group (`g1`, `g2`, ...).
    pub fn group_prefix(&self) -> String {
        format!("g{}", self.groups.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// The private directory.
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

    /// `CUINTERPOSE_CONTROL_DIR` of every process.
    pub fn control_dir(&self) -> PathBuf {
        self.dir().join("control")
    }

    /// What is started.
    pub fn programs(&self) -> &Programs {
        &self.programs
    }

    /// Whether workloads get the shim by default.
    pub fn shim(&self) -> bool {
        self.shim
    }

    /// A command for `program` with this launcher's environment (driver directory, control
    /// directory, multicast switches, the shim if `shim`): for starting other programs of the
    /// project (the tool itself, under `run`) the same way workloads are started.
    pub fn command(&self, program: &Path, shim: bool) -> Result<Command, LaunchError> {
        let mut cmd = Command::new(program);
        for key in &self.env_remove {
            cmd.env_remove(key);
        }
        if let Some(dir) = &self.programs.driver_dir {
            cmd.env("LD_LIBRARY_PATH", prepend(dir, "LD_LIBRARY_PATH"));
        }
        cmd.env("CUINTERPOSE_CONTROL_DIR", self.control_dir());
        for (k, v) in NO_MULTICAST_ENV {
            cmd.env(k, v);
        }
        if shim {
            let library = self.programs.shim.as_ref().ok_or(LaunchError::Missing {
                path: PathBuf::from("libcuinterpose.so"),
                hint: "build the workspace (cargo build --workspace), or reinstall the release",
            })?;
            cmd.env("LD_PRELOAD", prepend(library, "LD_PRELOAD"));
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null());
        Ok(cmd)
    }

    /// Starts a workload (see [`Workload::spawn`]).
    pub fn spawn(&self, options: WorkloadOptions) -> Result<Workload, LaunchError> {
        Workload::spawn(self, options)
    }
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
    /// Names its socket (`<name>.sock`) and log (`<name>.log`); unique within a [`Launcher`].
    pub name: String,
    /// The device whose primary context it uses.
    pub device: i32,
    /// How it resolves driver entry points.
    pub resolve: Resolve,
    /// With the shim preloaded; `None` takes the [`Launcher`]'s default.
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
    pub fn spawn(env: &Launcher, options: WorkloadOptions) -> Result<Workload, LaunchError> {
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
        env: &Launcher,
        options: &WorkloadOptions,
        args: Vec<OsString>,
        socket: PathBuf,
        device: i32,
    ) -> Result<Workload, LaunchError> {
        let program = env.programs.workload.clone();
        if !program.exists() {
            return Err(LaunchError::Missing {
                path: program,
                hint: "build the workspace (cargo build --workspace), or reinstall the release",
            });
        }
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
            return Err(LaunchError::Start {
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
    ) -> Result<Workload, LaunchError> {
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
            .ok_or_else(|| LaunchError::Field {
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

    fn wire_err(&self, source: WireError) -> LaunchError {
        LaunchError::Wire {
            workload: self.name.clone(),
            source,
        }
    }

    /// Sends one command; the reply may say it failed.
    pub fn cmd(&self, line: &str) -> Result<Reply, LaunchError> {
        wire::call_one(&self.socket, line, self.timeout).map_err(|e| self.wire_err(e))
    }

    /// Sends commands on one connection; one reply each.
    pub fn batch(&self, lines: &[&str]) -> Result<Vec<Reply>, LaunchError> {
        wire::call(&self.socket, lines, None, self.timeout).map_err(|e| self.wire_err(e))
    }

    /// Sends one command that must succeed.
    pub fn ok(&self, line: &str) -> Result<Reply, LaunchError> {
        let reply = self.cmd(line)?;
        if reply.ok {
            Ok(reply)
        } else {
            Err(LaunchError::Failed {
                workload: self.name.clone(),
                line: line.to_owned(),
                reply: Box::new(reply),
            })
        }
    }

    /// Sends commands that must all succeed, in order, each on its own connection (so a failure
    /// stops the rest).
    pub fn all_ok(&self, lines: &[&str]) -> Result<Vec<Reply>, LaunchError> {
        lines.iter().map(|l| self.ok(l)).collect()
    }

    /// Sends one command whose outcome must be `expected` (`ok`, `CUDA_ERROR_...`, `mismatch`...).
    pub fn expect(&self, line: &str, expected: &str) -> Result<Reply, LaunchError> {
        let reply = self.cmd(line)?;
        if reply.outcome() == expected {
            Ok(reply)
        } else {
            Err(LaunchError::Unexpected {
                workload: self.name.clone(),
                line: line.to_owned(),
                expected: expected.to_owned(),
                got: describe(&reply),
            })
        }
    }

    /// Checks that `region` holds the pattern of `seed` (from its start to its end).
    pub fn assert_pattern(&self, region: &str, seed: u64) -> Result<(), LaunchError> {
        self.ok(&format!("verify {region} {seed}")).map(|_| ())
    }

    /// Every region this workload holds, by name.
    pub fn regions(&self) -> Result<std::collections::BTreeMap<String, RegionInfo>, LaunchError> {
        let reply = self.ok("addresses")?;
        let missing = || LaunchError::Field {
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
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, LaunchError> {
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
    pub fn exit(mut self) -> Result<Option<ExitStatus>, LaunchError> {
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
        env: &Launcher,
        n: usize,
        options: impl Fn(usize) -> WorkloadOptions,
    ) -> Result<Group, LaunchError> {
        let members = (0..n)
            .map(|r| Workload::spawn(env, options(r)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Group { members })
    }

    /// One process tree of `n` ranks (`cuinterpose-workload tree`): the root is rank 0 and owns
    /// the processes; every rank uses `options.device` and `options.resolve`.
    pub fn tree(env: &Launcher, n: usize, options: WorkloadOptions) -> Result<Group, LaunchError> {
        let device = options.device;
        Group::tree_on(env, n, options, &[device])
    }

    /// [`Group::tree`] with rank `r` on `devices[r % devices.len()]` (the workload's `--devices`).
    pub fn tree_on(
        env: &Launcher,
        n: usize,
        options: WorkloadOptions,
        devices: &[i32],
    ) -> Result<Group, LaunchError> {
        let device_of = |rank: usize| {
            devices
                .get(rank % devices.len().max(1))
                .copied()
                .unwrap_or(0)
        };
        let list: Vec<String> = devices.iter().map(ToString::to_string).collect();
        let dir = env.socket_dir().join(&options.name);
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
    pub fn sharing_pair(env: &Launcher, size: u64) -> Result<Group, LaunchError> {
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
    pub fn sharing_ring(env: &Launcher, n: usize, size: u64) -> Result<Group, LaunchError> {
        let prefix = env.group_prefix();
        let g = Group::spawn(env, n, |r| WorkloadOptions::new(format!("{prefix}w{r}")))?;
        g.ring(size)?;
        Ok(g)
    }

    /// Builds the ring topology of [`Group::sharing_ring`] on these members.
    pub fn ring(&self, size: u64) -> Result<(), LaunchError> {
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
    pub fn create_shared(&self, rank: usize, name: &str, size: u64) -> Result<(), LaunchError> {
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
    pub fn share(&self, from: usize, to: usize, name: &str, size: u64) -> Result<(), LaunchError> {
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
