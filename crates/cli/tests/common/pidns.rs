//! A group for checkpoint to disk: `cuinterpose run --pid-namespace -- cuinterpose-workload tree
//! --processes N`, its ranks attached by socket, checkpointed with `cuinterpose checkpoint` (the
//! real CRIU: root) and brought back with `cuinterpose restore`, the ranks attached again.

use super::{tool_path, tool_with};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;
use testkit::{TestEnv, Workload};

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// CRIU from `$CUINTERPOSE_CRIU` (scripts/test.sh exports it) or `<repo>/.criu/bin/criu`.
pub fn criu() -> PathBuf {
    let path = std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.criu/bin/criu"));
    assert!(
        path.is_file(),
        "CRIU not found at {} (set CUINTERPOSE_CRIU): run scripts/install-criu.sh first",
        path.display()
    );
    path
}

/// What runs the group now.
enum Root {
    /// The launcher, our child, before a checkpoint.
    Launched(Child),
    /// The root of a restored tree (not our child).
    Restored(u32),
    /// Nothing: checkpointed and not restored yet.
    Gone,
}

/// A launched (or restored) tree of `n` workload ranks in a PID namespace of its own.
pub struct PidnsGroup {
    root: Root,
    dir: PathBuf,
    n: usize,
    pub ranks: Vec<Workload>,
}

impl PidnsGroup {
    /// Starts `n` ranks, rank `r` on `devices[r % len]`, with `vars` in every process's
    /// environment (the launcher passes its own on to the workload).
    pub fn start(env: &TestEnv, n: usize, devices: &str, vars: &[(&str, &str)]) -> PidnsGroup {
        let dir = env.socket_dir().join("pidns");
        let workload = env.artifacts().workload().expect("workload binary");
        let log = std::fs::File::create(env.log_dir().join("launcher.log")).expect("log");
        let mut command = env
            .command(&tool_path(env), false)
            .expect("launcher command");
        command.envs(vars.iter().copied());
        command
            .arg("run")
            .arg("--pid-namespace")
            .arg("--")
            .arg(&workload)
            .args(["tree", "--processes", &n.to_string(), "--devices", devices])
            .arg("--listen-dir")
            .arg(&dir)
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut launcher = command.spawn().expect("starting the launcher");
        // Every rank's socket: ranks start in parallel, so the last one may listen first.
        for rank in 0..n {
            testkit::wire::wait_listening(&dir.join(format!("{rank}.sock")), READY_TIMEOUT, || {
                matches!(launcher.try_wait(), Ok(None))
            })
            .unwrap_or_else(|e| {
                panic!(
                    "rank {rank} of the group did not start: {e}\n{}",
                    std::fs::read_to_string(env.log_dir().join("launcher.log")).unwrap_or_default()
                )
            });
        }
        let mut group = PidnsGroup {
            root: Root::Launched(launcher),
            dir,
            n,
            ranks: Vec::new(),
        };
        group.attach();
        group
    }

    fn attach(&mut self) {
        self.ranks = (0..self.n)
            .map(|r| {
                let socket = self.dir.join(format!("{r}.sock"));
                testkit::wire::wait_listening(&socket, READY_TIMEOUT, || true)
                    .unwrap_or_else(|e| panic!("rank {r} does not listen: {e}"));
                Workload::attach(
                    format!("rank{r}"),
                    self.dir.join(format!("{r}.sock")),
                    0,
                    self.dir.join(format!("{r}.log")),
                )
                .expect("attaching to a rank")
            })
            .collect();
    }

    /// The host PID of the tree's root (what `--pid` gets).
    pub fn root(&self) -> u32 {
        match &self.root {
            Root::Launched(child) => child.id(),
            Root::Restored(pid) => *pid,
            Root::Gone => panic!("the group is checkpointed and not restored"),
        }
    }

    /// `cuinterpose checkpoint --pid ROOT --dir DIR --json`, which must succeed; the group is
    /// gone afterwards. Its report.
    pub fn checkpoint(&mut self, env: &TestEnv, dir: &Path) -> Value {
        let root = self.root().to_string();
        let report = tool_json(
            env,
            &[
                "checkpoint",
                "--pid",
                &root,
                "--dir",
                &dir.display().to_string(),
            ],
        );
        if let Root::Launched(child) = &mut self.root {
            control::launch::wait_exit(child.id(), READY_TIMEOUT)
                .unwrap_or_else(|e| panic!("the launcher did not end: {e}"));
            let _ = child.wait();
        }
        self.root = Root::Gone;
        self.ranks.clear();
        report
    }

    /// `cuinterpose restore --dir DIR --json`, which must succeed; the ranks attached again.
    pub fn restore(&mut self, env: &TestEnv, dir: &Path) -> Value {
        let report = tool_json(env, &["restore", "--dir", &dir.display().to_string()]);
        let root = report["root"].as_u64().expect("restored root") as u32;
        self.root = Root::Restored(root);
        self.attach();
        report
    }
}

/// `cuinterpose ARGS --json` with CRIU, which must succeed: its JSON report.
fn tool_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let criu = criu();
    let run = tool_with(
        env,
        &all,
        &[("CUINTERPOSE_CRIU", criu.to_str().expect("utf-8 path"))],
    );
    run.ok().json()
}

impl Drop for PidnsGroup {
    fn drop(&mut self) {
        match &mut self.root {
            Root::Launched(child) => {
                if let Ok(None) = child.try_wait() {
                    // The namespace dies with its init (the launcher's one child).
                    let init = control::discovery::process_tree(child.id())
                        .ok()
                        .and_then(|t| t.get(1).copied());
                    if let Some(init) = init {
                        let _ = control::launch::kill_tree(init, Duration::from_secs(30));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            Root::Restored(pid) => {
                let _ = control::launch::kill_tree(*pid, Duration::from_secs(30));
            }
            Root::Gone => {}
        }
    }
}
