//! Shared pieces of the tool-level tests: the real `target/<profile>/cuinterpose` binary run against
//! workload groups on the fake driver, in the environment the testkit gives every process.
//!
//! A group is one process tree under a root the tests own: either `cuinterpose run --
//! cuinterpose-workload tree ...` (every rank with the shim), or a `/bin/sh` root that starts each
//! member in the background with its own environment (with or without the shim, a fault injected
//! in one member, a helper process of the test binary itself). The root's process group is killed
//! when the tree is dropped.
//!
//! Build first: `cargo build --workspace --all-targets` (the tests fail, never skip, without it).

#![allow(dead_code)] // each test binary uses its own part of this module

pub mod helper;
pub mod pidns;

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::harness::{Artifacts, RegionInfo, START_TIMEOUT};
use testkit::{TestEnv, Workload};

/// Bound on one run of the tool: far above what a suspend of a few MiB needs on a loaded machine,
/// low enough that a hang fails the test instead of the whole suite.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(180);

/// Bytes of each shared allocation in the groups (a multiple of the fake's 2 MiB granularity).
pub const SIZE: u64 = 4 << 20;

/// Exit codes the tool documents (`cuinterpose --help`).
pub const EXIT_REFUSED: i32 = 3;
pub const EXIT_ROLLED_BACK: i32 = 4;

/// A test environment on the fake driver whose workloads get the shim.
pub fn env() -> TestEnv {
    TestEnv::fake()
        .expect("artifacts missing: build first with cargo build --workspace --all-targets")
        .with_shim(true)
}

/// `target/<profile>/cuinterpose`.
pub fn tool_path(env: &TestEnv) -> PathBuf {
    tool_in(env.artifacts())
}

/// `target/<profile>/cuinterpose`, for the tests that run the tool outside a [`TestEnv`].
pub fn tool_bin() -> PathBuf {
    tool_in(&Artifacts::locate().expect("artifacts (build the workspace first)"))
}

fn tool_in(artifacts: &Artifacts) -> PathBuf {
    let path = artifacts.dir().join("cuinterpose");
    assert!(
        path.is_file(),
        "{} is missing: build first with cargo build --workspace --all-targets",
        path.display()
    );
    path
}

/// The fake driver the tool loads (`--driver`).
pub fn fake_driver(env: &TestEnv) -> PathBuf {
    env.artifacts()
        .fake_driver()
        .expect("fake driver missing: build first with cargo build --workspace --all-targets")
}

/// One finished run of the tool.
#[derive(Debug)]
pub struct ToolRun {
    pub args: Vec<String>,
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl ToolRun {
    /// The whole run, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "cuinterpose {} exited {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args.join(" "),
            self.code,
            self.stdout,
            self.stderr
        )
    }

    /// Asserts the exit code.
    pub fn expect_code(&self, code: i32) -> &ToolRun {
        assert_eq!(
            self.code,
            code,
            "expected exit code {code}; {}",
            self.describe()
        );
        self
    }

    /// Asserts success.
    pub fn ok(&self) -> &ToolRun {
        self.expect_code(0)
    }

    /// stdout as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}); {}", self.describe()))
    }

    /// Asserts that stderr mentions every one of `parts`.
    pub fn stderr_mentions(&self, parts: &[&str]) -> &ToolRun {
        for part in parts {
            assert!(
                self.stderr.contains(part),
                "stderr does not mention {part:?}; {}",
                self.describe()
            );
        }
        self
    }
}

/// A started tool process (for the tests that stop or kill it half way).
pub struct ToolProcess {
    pub child: Child,
    args: Vec<String>,
    out: PathBuf,
    err: PathBuf,
}

impl ToolProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the tool has not exited yet.
    pub fn is_running(&self) -> bool {
        alive(self.child.id())
    }

    /// Waits (bounded) for the tool to exit and collects its output.
    pub fn finish(mut self) -> ToolRun {
        let deadline = Instant::now() + TOOL_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for cuinterpose") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "cuinterpose {} did not finish within {TOOL_TIMEOUT:?} (killed)\n{}",
                    self.args.join(" "),
                    std::fs::read_to_string(&self.err).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        use std::os::unix::process::ExitStatusExt;
        ToolRun {
            args: self.args.clone(),
            code: status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
        }
    }
}

impl Drop for ToolProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the tool with `args` in the environment of `env` (fake driver first on the library
/// path, the test's directories), plus `extra` variables.
pub fn start_tool(env: &TestEnv, args: &[&str], extra: &[(&str, &str)]) -> ToolProcess {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut cmd = env
        .command(&tool_path(env), false)
        .expect("tool environment");
    cmd.args(args);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = env.log_dir().join(format!("tool-{n}.out"));
    let err = env.log_dir().join(format!("tool-{n}.err"));
    cmd.stdout(std::fs::File::create(&out).expect("tool stdout file"));
    cmd.stderr(std::fs::File::create(&err).expect("tool stderr file"));
    let child = cmd.spawn().expect("starting cuinterpose");
    ToolProcess {
        child,
        args: args.iter().map(|s| s.to_string()).collect(),
        out,
        err,
    }
}

/// Runs the tool to the end.
pub fn tool(env: &TestEnv, args: &[&str]) -> ToolRun {
    start_tool(env, args, &[]).finish()
}

/// Runs the tool to the end with extra environment.
pub fn tool_with(env: &TestEnv, args: &[&str], extra: &[(&str, &str)]) -> ToolRun {
    start_tool(env, args, extra).finish()
}

/// The state directory of a test.
pub fn state_dir(env: &TestEnv) -> PathBuf {
    env.dir().join("state")
}

/// The arguments of `suspend --pid ROOT --state-dir DIR --driver FAKE --json` and `options`.
pub fn suspend_args(env: &TestEnv, root: u32, options: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "suspend".into(),
        "--pid".into(),
        root.to_string(),
        "--state-dir".into(),
        state_dir(env).display().to_string(),
        "--driver".into(),
        fake_driver(env).display().to_string(),
        "--json".into(),
    ];
    args.extend(options.iter().map(|o| o.to_string()));
    args
}

/// The arguments of `resume --pid ROOT --state-dir DIR --driver FAKE --json` and `options`.
pub fn resume_args(env: &TestEnv, root: u32, options: &[&str]) -> Vec<String> {
    let mut args = suspend_args(env, root, options);
    args[0] = "resume".into();
    args
}

/// Arguments as the tool helpers take them.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `suspend --pid ROOT --state-dir DIR --driver FAKE --json` with the environment `extra`.
pub fn suspend(env: &TestEnv, root: u32, extra: &[(&str, &str)]) -> ToolRun {
    tool_with(env, &strs(&suspend_args(env, root, &[])), extra)
}

/// `resume --pid ROOT --state-dir DIR --driver FAKE --json`.
pub fn resume(env: &TestEnv, root: u32) -> ToolRun {
    tool(env, &strs(&resume_args(env, root, &[])))
}

/// Suspends the tree and expects a refusal naming each `pid` for a reason containing its `reason`.
pub fn expect_refusal(env: &TestEnv, tree: &Tree, refused: &[(u32, &str)]) -> ToolRun {
    let run = suspend(env, tree.root(), &[]);
    run.expect_code(EXIT_REFUSED);
    for (pid, reason) in refused {
        let line = run
            .stderr
            .lines()
            .find(|l| l.trim_start().starts_with(&label(*pid)) && l.contains(reason));
        assert!(
            line.is_some(),
            "no refusal line naming pid {pid} with {reason:?}; {}",
            run.describe()
        );
    }
    run
}

/// What a member of a [`Tree`] runs.
#[derive(Debug, Clone)]
pub enum Role {
    /// `cuinterpose-workload serve`.
    Workload,
    /// This test binary's helper process ([`helper`]) in the given role.
    Helper(&'static str),
}

/// One member of a [`Tree`].
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub role: Role,
    pub shim: bool,
    pub env: Vec<(String, String)>,
}

impl Member {
    /// A workload with the shim.
    pub fn shim(name: &str) -> Member {
        Member {
            name: name.into(),
            role: Role::Workload,
            shim: true,
            env: Vec::new(),
        }
    }

    /// A CUDA workload without the shim.
    pub fn plain(name: &str) -> Member {
        Member {
            shim: false,
            ..Member::shim(name)
        }
    }

    /// A helper process of the test binary.
    pub fn helper(name: &str, role: &'static str, shim: bool) -> Member {
        Member {
            name: name.into(),
            role: Role::Helper(role),
            shim,
            env: Vec::new(),
        }
    }

    pub fn env(mut self, key: &str, value: &str) -> Member {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// A process tree the test owns: a root and the workloads under it, attached by socket.
pub struct Tree {
    root: Child,
    /// Workload members by name (helpers are not listed).
    pub workloads: BTreeMap<String, Workload>,
    /// Host PIDs of the helper members by name.
    pub helpers: BTreeMap<String, u32>,
}

impl Tree {
    /// `cuinterpose run -- cuinterpose-workload tree --processes n ...`: the tool execs the
    /// workload in place, so the root is rank 0 itself; ranks are named `r0`, `r1`, ...
    pub fn run_tree(env: &TestEnv, n: usize) -> Tree {
        Tree::run_tree_on(env, n, "0")
    }

    /// [`Tree::run_tree`] with the ranks on `devices` (the workload's `--devices` list).
    pub fn run_tree_on(env: &TestEnv, n: usize, devices: &str) -> Tree {
        let dir = env.socket_dir().join("tree");
        let workload = env.artifacts().workload().expect("workload binary");
        let mut cmd = env
            .command(&tool_path(env), false)
            .expect("tool environment");
        cmd.arg("run")
            .arg("--")
            .arg(&workload)
            .args(["tree", "--processes", &n.to_string(), "--listen-dir"])
            .arg(&dir)
            .args(["--devices", devices]);
        let root = spawn_root(env, cmd, "tree-root");
        let mut tree = Tree {
            root,
            workloads: BTreeMap::new(),
            helpers: BTreeMap::new(),
        };
        for rank in 0..n {
            let w = tree.attach(
                &format!("r{rank}"),
                dir.join(format!("{rank}.sock")),
                dir.join(format!("{rank}.log")),
            );
            tree.workloads.insert(format!("r{rank}"), w);
        }
        tree
    }

    /// A `/bin/sh` root starting each member in the background, then waiting for them.
    pub fn launch(env: &TestEnv, members: &[Member]) -> Tree {
        let workload = env.artifacts().workload().expect("workload binary");
        let shim = env.artifacts().shim().expect("shim library");
        let me = std::env::current_exe().expect("test binary");
        let mut script = String::new();
        for m in members {
            let log = env.log_dir().join(format!("{}.log", m.name));
            let mut line = String::new();
            if m.shim {
                line.push_str(&format!("LD_PRELOAD={} ", quote(&shim)));
            }
            for (k, v) in &m.env {
                line.push_str(&format!("{k}={} ", quote(Path::new(v))));
            }
            match m.role {
                Role::Workload => line.push_str(&format!(
                    "{} serve --listen {}",
                    quote(&workload),
                    quote(&env.socket_dir().join(format!("{}.sock", m.name)))
                )),
                Role::Helper(role) => line.push_str(&format!(
                    "{}={role} {}={} {} --ignored --exact helper_process --nocapture --test-threads 1",
                    helper::ROLE_ENV,
                    helper::DIR_ENV,
                    quote(&helper_dir(env, &m.name)),
                    quote(&me)
                )),
            }
            line.push_str(&format!(" >{} 2>&1 &\n", quote(&log)));
            script.push_str(&line);
            if let Role::Helper(_) = m.role {
                std::fs::create_dir_all(helper_dir(env, &m.name)).expect("helper directory");
            }
        }
        script.push_str("wait\n");
        let mut cmd = env
            .command(Path::new("/bin/sh"), false)
            .expect("sh environment");
        cmd.arg("-c").arg(&script);
        let root = spawn_root(env, cmd, "sh-root");
        let mut tree = Tree {
            root,
            workloads: BTreeMap::new(),
            helpers: BTreeMap::new(),
        };
        for m in members {
            match m.role {
                Role::Workload => {
                    let w = tree.attach(
                        &m.name,
                        env.socket_dir().join(format!("{}.sock", m.name)),
                        env.log_dir().join(format!("{}.log", m.name)),
                    );
                    tree.workloads.insert(m.name.clone(), w);
                }
                // Waited for by `helper()`: some need the test's hand first.
                Role::Helper(_) => {}
            }
        }
        tree
    }

    fn attach(&mut self, name: &str, socket: PathBuf, log: PathBuf) -> Workload {
        let root = &mut self.root;
        testkit::wire::wait_listening(&socket, START_TIMEOUT, || {
            matches!(root.try_wait(), Ok(None))
        })
        .unwrap_or_else(|e| {
            panic!(
                "member {name} did not start: {e}\n--- log ---\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Workload::attach(name, socket, 0, log).unwrap_or_else(|e| panic!("attach {name}: {e}"))
    }

    /// Waits until helper `name` is ready; its host PID.
    pub fn helper(&mut self, env: &TestEnv, name: &str) -> u32 {
        let ready = helper_dir(env, name).join(helper::READY_FILE);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let pid = text.trim().parse().expect("helper pid");
                self.helpers.insert(name.to_string(), pid);
                return pid;
            }
            let log = env.log_dir().join(format!("{name}.log"));
            assert!(
                Instant::now() < deadline && matches!(self.root.try_wait(), Ok(None)),
                "helper {name} did not get ready\n--- log ---\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The root's host PID (what `--pid` gets).
    pub fn root(&self) -> u32 {
        self.root.id()
    }

    /// A workload member.
    pub fn w(&self, name: &str) -> &Workload {
        self.workloads
            .get(name)
            .unwrap_or_else(|| panic!("no member {name}"))
    }

    /// Host PIDs of every CUDA member (workloads and helpers).
    pub fn pids(&self) -> Vec<u32> {
        self.workloads
            .values()
            .map(Workload::pid)
            .chain(self.helpers.values().copied())
            .collect()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.root.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.root.kill();
        let _ = self.root.wait();
    }
}

fn spawn_root(env: &TestEnv, mut cmd: Command, name: &str) -> Child {
    let log = env.log_dir().join(format!("{name}.log"));
    let out = std::fs::File::create(&log).expect("root log");
    let err = out.try_clone().expect("root log");
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    cmd.spawn().expect("starting the tree's root")
}

fn helper_dir(env: &TestEnv, name: &str) -> PathBuf {
    env.dir().join(format!("helper-{name}"))
}

/// Single-quoted for sh (test paths hold no quote).
fn quote(path: &Path) -> String {
    let text = path.display().to_string();
    assert!(!text.contains('\''), "path with a quote: {text}");
    format!("'{text}'")
}

/// Sends a signal to one process.
pub fn signal(pid: u32, signal: rustix::process::Signal) {
    let target = rustix::process::Pid::from_raw(pid as i32).expect("pid");
    rustix::process::kill_process(target, signal)
        .unwrap_or_else(|e| panic!("signal {signal:?} to {pid}: {e}"));
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat.get(stat.rfind(')')? + 1..)?.to_string();
            rest.split_whitespace().next().map(|s| s != "Z" && s != "X")
        })
        .unwrap_or(false)
}

/// Waits until `pid` has exited (killed by the test), bounded.
pub fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} does not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `what` until it holds (bounded by `TOOL_TIMEOUT`); `describe` says what was awaited.
pub fn wait_until(describe: &str, mut what: impl FnMut() -> bool) {
    let deadline = Instant::now() + TOOL_TIMEOUT;
    while !what() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {describe}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The fake's accounting of a process over both devices.
pub fn usage(env: &TestEnv, pid: u32) -> u64 {
    (0..2)
        .map(|d| env.fake_usage(pid, d).expect("fake usage"))
        .sum()
}

/// The `addresses` of a workload, regions by name.
pub fn regions(w: &Workload) -> BTreeMap<String, RegionInfo> {
    w.regions()
        .unwrap_or_else(|e| panic!("addresses of {}: {e}", w.name()))
}

/// Runs commands that must succeed on a workload, with the failure named.
pub fn ok(w: &Workload, lines: &[&str]) {
    for line in lines {
        w.ok(line)
            .unwrap_or_else(|e| panic!("{e}\n--- log ---\n{}", w.log_tail()));
    }
}

/// Sends descriptor `name` from `from` to `to`, which imports it as `name`, reserves `r-<name>`
/// and maps it there with read-write access to device 0 (`testkit::Group::share`, for members
/// of a [`Tree`]).
pub fn share(from: &Workload, to: &Workload, name: &str, size: u64) {
    let peer = to.socket().display().to_string();
    ok(from, &[&format!("send-fd {name} --to {peer}")]);
    ok(
        to,
        &[
            &format!("wait fd {name}"),
            &format!("import {name} --size {size}"),
            &format!("reserve r-{name} {size}"),
            &format!("map {name} r-{name}"),
            &format!("set-access {name} --device 0"),
        ],
    );
}

/// Creates `name` (POSIX-shareable), reserves and maps it with read-write access, exports it.
pub fn create_shared(w: &Workload, name: &str, size: u64) {
    ok(
        w,
        &[
            &format!("create {name} {size} --handle-types posix"),
            &format!("reserve r-{name} {size}"),
            &format!("map {name} r-{name}"),
            &format!("set-access {name} --device 0"),
            &format!("export {name}"),
        ],
    );
}

/// Reads a whole file, or says which one failed.
pub fn read(path: &Path) -> String {
    let mut s = String::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_string(&mut s))
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    s
}

/// A child process whose process group is killed on drop.
pub struct Owned(pub Child);

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` in its own process group with output to `<log dir>/<name>.log`.
pub fn spawn_owned(env: &TestEnv, cmd: Command, name: &str) -> Owned {
    Owned(spawn_root(env, cmd, name))
}

/// `pid 1234 (`: how the tool's labels start for a process.
pub fn label(pid: u32) -> String {
    format!("pid {pid} (")
}

/// `pid 1234: 0x...+0x...`: how the tool's inspect shows a mapping.
pub fn mapping(pid: u32, region: &RegionInfo) -> String {
    format!("pid {pid}: {:#x}+{:#x}", region.base, region.size)
}

/// The phase a participant's shim reports, asked directly on its control socket (faster than a
/// tool run, for the tests that follow a capture step by step).
pub fn phase_of(env: &TestEnv, pid: u32) -> protocol::Phase {
    record_of(env, pid).phase
}

/// What the shim of `pid` answers to INSPECT.
pub fn record_of(env: &TestEnv, pid: u32) -> protocol::ProcessRecord {
    let path = control_socket(env, pid);
    let mut conn = transport::Connection::connect(&path, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("control socket of pid {pid}: {e}"));
    match conn.call(&protocol::Request::Inspect) {
        Ok((protocol::Response::Records(record), _)) => record,
        other => panic!("inspect of pid {pid}: {other:?}"),
    }
}

/// Inode of the PID namespace of `pid` (`/proc/<pid>/ns/pid` is `pid:[<inode>]`).
pub fn pid_namespace(pid: u32) -> u64 {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).expect("ns/pid link");
    link.to_str()
        .and_then(|l| l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok())
        .unwrap_or_else(|| panic!("unexpected ns/pid link {}", link.display()))
}

/// The control socket the shim of `pid` (a process of the test's own PID namespace) binds:
/// `cuinterpose-<pid namespace inode>-<pid>.sock` in the environment's control directory.
pub fn control_socket(env: &TestEnv, pid: u32) -> PathBuf {
    env.control_dir()
        .join(format!("cuinterpose-{}-{pid}.sock", pid_namespace(pid)))
}

/// Starts `cuinterpose run --pid-namespace -- cuinterpose-workload tree --processes N --devices
/// DEVICES --listen-dir DIR` (with `extra` variables) in its own process group, logging to
/// `<log dir>/<name>.log`, and waits until every rank listens in `dir` (`<r>.sock`, logs
/// `<r>.log`) within `timeout`. The launcher is the caller's child; [`end_namespace`] ends it.
pub fn start_namespace(
    env: &TestEnv,
    name: &str,
    dir: &Path,
    spec: (usize, &str),
    extra: &[(&str, &str)],
    timeout: Duration,
) -> Child {
    start_namespace_under(env, name, dir, spec, extra, timeout, &[])
}

/// [`start_namespace`] with the launcher run by `wrapper` (a program and its arguments, which
/// then exec the launcher: `unshare --net --ipc --uts --`, as a pod's sandbox gives its
/// containers namespaces of their own).
pub fn start_namespace_under(
    env: &TestEnv,
    name: &str,
    dir: &Path,
    spec: (usize, &str),
    extra: &[(&str, &str)],
    timeout: Duration,
    wrapper: &[&str],
) -> Child {
    start_under(
        env,
        name,
        dir,
        spec,
        extra,
        timeout,
        (wrapper, &["--pid-namespace"]),
    )
}

/// [`start_namespace_under`] with `run`'s own options given: none makes the workload the
/// process `wrapper` execs (a container's init, as the webhook shapes a container that cannot
/// make a PID namespace), `--pid-namespace` the init of a PID namespace below it.
pub fn start_under(
    env: &TestEnv,
    name: &str,
    dir: &Path,
    (processes, devices): (usize, &str),
    extra: &[(&str, &str)],
    timeout: Duration,
    (wrapper, run_options): (&[&str], &[&str]),
) -> Child {
    let workload = env.artifacts().workload().expect("workload binary");
    let log_path = env.log_dir().join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).expect("launcher log");
    let tool = tool_path(env);
    let mut command = match wrapper.split_first() {
        None => env.command(&tool, false),
        Some((program, args)) => env.command(Path::new(program), false).map(|mut c| {
            c.args(args).arg(&tool);
            c
        }),
    }
    .expect("launcher command");
    command.envs(extra.iter().copied());
    command
        .arg("run")
        .args(run_options)
        .arg("--")
        .arg(&workload)
        .args(["tree", "--processes", &processes.to_string()])
        .args(["--devices", devices, "--listen-dir"])
        .arg(dir)
        .stdout(log.try_clone().expect("launcher log"))
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut launcher = command.spawn().expect("starting the launcher");
    for r in 0..processes {
        testkit::wire::wait_listening(&dir.join(format!("{r}.sock")), timeout, || {
            matches!(launcher.try_wait(), Ok(None))
        })
        .unwrap_or_else(|e| {
            panic!(
                "{name}: rank {r} did not start: {e}\n--- launcher ---\n{}\n--- rank {r} ---\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default(),
                std::fs::read_to_string(dir.join(format!("{r}.log"))).unwrap_or_default()
            )
        });
    }
    launcher
}

/// Handles on the ranks of a tree listening in `dir` (the original or a restored one), named
/// `<prefix><r>`, rank `r` on `device(r)`.
pub fn attach_ranks(
    dir: &Path,
    processes: usize,
    prefix: &str,
    device: impl Fn(usize) -> i32,
) -> Vec<Workload> {
    (0..processes)
        .map(|r| {
            Workload::attach(
                format!("{prefix}{r}"),
                dir.join(format!("{r}.sock")),
                device(r),
                dir.join(format!("{r}.log")),
            )
            .unwrap_or_else(|e| panic!("attaching to rank {r}: {e}"))
        })
        .collect()
}

/// The init of the PID namespace a launcher started (its first child), by host PID.
pub fn namespace_init(launcher: u32) -> Option<u32> {
    control::discovery::process_tree(launcher)
        .ok()?
        .get(1)
        .copied()
}

/// Ends a still running launcher and its namespace: the launcher's process group holds only the
/// launcher, and the namespace dies with its init, so the init's tree is killed first.
pub fn end_namespace(launcher: &mut Child) {
    if let Ok(None) = launcher.try_wait() {
        if let Some(init) = namespace_init(launcher.id()) {
            let _ = control::launch::kill_tree(init, Duration::from_secs(30));
        }
        let _ = launcher.kill();
        let _ = launcher.wait();
    }
}

/// Members `a` and `b` of `tree` share both ways: `a0` created by `a`, `a1` by `b`, each mapped in
/// both, filled with seeds 11 and 12.
pub fn pair(tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    create_shared(a, "a0", SIZE);
    create_shared(b, "a1", SIZE);
    share(a, b, "a0", SIZE);
    share(b, a, "a1", SIZE);
    ok(a, &["fill a0 11"]);
    ok(b, &["fill a1 12"]);
}

/// The [`pair`] kept its memory and contents and shares both ways (left with its first seeds).
pub fn assert_pair(env: &TestEnv, tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    assert!(usage(env, a.pid()) >= SIZE, "a holds no memory");
    assert!(usage(env, b.pid()) >= SIZE, "b holds no memory");
    ok(a, &["verify a0 11", "verify a1 12"]);
    ok(b, &["verify a0 11", "verify a1 12", "fill a0 13"]);
    ok(a, &["verify a0 13", "fill a1 14"]);
    ok(b, &["verify a1 14"]);
    // Back to the patterns the next check of the same pair expects.
    ok(a, &["fill a0 11", "fill a1 12"]);
}

/// Every shim of the tree runs, nothing is natively locked, no state file is left after `run`.
pub fn assert_running(env: &TestEnv, tree: &Tree, run: &ToolRun) {
    assert!(
        !state_dir(env).join("cuinterpose.state").exists(),
        "state file left; {}",
        run.describe()
    );
    let native = env.native().unwrap();
    for w in tree.workloads.values() {
        assert_eq!(
            phase_of(env, w.pid()),
            protocol::Phase::Running,
            "{} is not running; {}",
            w.name(),
            run.describe()
        );
        assert_eq!(
            native.state(w.pid()).unwrap(),
            testkit::native::ProcessState::Running,
            "{} natively",
            w.name()
        );
    }
}
