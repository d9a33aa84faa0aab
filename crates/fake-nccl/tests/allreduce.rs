//! All-reduce across rank processes: each a `fake-nccl-rank` loading the fake driver and this
//! library by soname from a private `LD_LIBRARY_PATH`, with a private `FAKE_CUDA_STATE_DIR`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

/// Generous: the machine running the tests may be loaded.
const TIMEOUT: Duration = Duration::from_secs(180);

/// `target/<profile>`, where cargo put this test's executable (in `deps/`) and the libraries.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

/// Builds the fake driver and this library (once per test process) into this test's target
/// directory and profile: cargo builds neither cdylib for an integration test by itself, and a
/// stale one would test old code. Returns `target/<profile>`.
fn built_libraries() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let profile = profile_dir();
        let target = profile.parent().expect("target/<profile>");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "--lib",
            "-p",
            "fake-cuda",
            "-p",
            "fake-nccl",
            "--target-dir",
        ])
        .arg(target);
        match profile.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some(name) => {
                cmd.args(["--profile", name]);
            }
            None => panic!("no profile in {}", profile.display()),
        }
        let out = cmd.output().expect("run cargo build");
        assert!(out.status.success(), "cargo build: {}", describe(&out));
        profile
    })
}

/// A directory of links by soname to the built libraries, and a state directory.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::Builder::new()
            .prefix("fake-nccl")
            .tempdir()
            .expect("tempdir");
        let libs = dir.path().join("lib");
        std::fs::create_dir(&libs).expect("mkdir");
        let profile = built_libraries();
        for (built, soname) in [
            (profile.join("libcuda.so"), "libcuda.so.1"),
            (profile.join("libnccl.so"), "libnccl.so.2"),
        ] {
            assert!(built.exists(), "{} is missing", built.display());
            std::os::unix::fs::symlink(&built, libs.join(soname)).expect("symlink");
        }
        std::fs::create_dir(dir.path().join("state")).expect("mkdir");
        Env { dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fake-nccl-rank"));
        cmd.args(args)
            .env("LD_LIBRARY_PATH", self.dir.path().join("lib"))
            .env("FAKE_CUDA_STATE_DIR", self.dir.path().join("state"))
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn unique_id(&self) -> String {
        let out = self
            .command(&["id"])
            .output()
            .expect("run fake-nccl-rank id");
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn state_files(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.path().join("state"))
            .expect("state dir")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("nccl-"))
            .collect()
    }
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Rank processes, stopped together: when one fails or time runs out, the others are killed
/// (a rank whose peer died would wait for it forever, as with real NCCL).
struct Ranks {
    children: Vec<Child>,
    started: Instant,
}

impl Ranks {
    fn new() -> Ranks {
        Ranks {
            children: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Whether some rank has exited unsuccessfully, or time is up.
    fn failing(&mut self) -> bool {
        let failed = self.children.iter_mut().any(|c| {
            c.try_wait()
                .expect("try_wait")
                .is_some_and(|status| !status.success())
        });
        failed || self.started.elapsed() > TIMEOUT
    }

    /// Waits for every rank (the stdout of those whose stdout was taken comes back empty).
    fn finish(mut self) -> Vec<Output> {
        loop {
            let all_exited = self
                .children
                .iter_mut()
                .all(|c| c.try_wait().expect("try_wait").is_some());
            if all_exited {
                break;
            }
            if self.failing() {
                for child in &mut self.children {
                    let _ = child.kill();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.children
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait"))
            .collect()
    }
}

/// Panics with every rank's output unless all succeeded.
fn assert_all_succeeded(outputs: &[Output]) {
    if outputs.iter().all(|o| o.status.success()) {
        return;
    }
    let report: Vec<String> = outputs
        .iter()
        .enumerate()
        .map(|(rank, out)| format!("rank {rank}: {}", describe(out)))
        .collect();
    panic!("a rank failed:\n{}", report.join("\n"));
}

/// The last line of every rank, `ok <checksum>`: asserts they are all there and all equal.
fn assert_same_results(lines: &[String]) {
    for (rank, line) in lines.iter().enumerate() {
        assert!(line.starts_with("ok "), "rank {rank}: {line:?}");
    }
    assert!(
        lines.windows(2).all(|w| w[0] == w[1]),
        "ranks' results differ: {lines:?}"
    );
}

fn all_reduce_across(nranks: u32) {
    let env = Env::new();
    let id = env.unique_id();
    let n = nranks.to_string();
    let mut ranks = Ranks::new();
    for rank in 0..nranks {
        let r = rank.to_string();
        let args = ["allreduce", id.as_str(), n.as_str(), r.as_str(), "100"];
        ranks
            .children
            .push(env.command(&args).spawn().expect("spawn rank"));
    }
    let outputs = ranks.finish();
    assert_all_succeeded(&outputs);
    let lines: Vec<String> = outputs
        .iter()
        .map(|out| {
            let stdout = String::from_utf8_lossy(&out.stdout);
            stdout.lines().last().unwrap_or_default().to_string()
        })
        .collect();
    assert_same_results(&lines);
    assert_eq!(
        env.state_files(),
        Vec::<String>::new(),
        "the region outlived its ranks"
    );
}

#[test]
fn two_ranks_all_reduce_a_hundred_times() {
    all_reduce_across(2);
}

#[test]
fn four_ranks_all_reduce_a_hundred_times() {
    all_reduce_across(4);
}

/// Starts the ranks of a stall run; their stdout lines come through the returned channel.
fn start_stall(env: &Env, nranks: u32, go: &Path) -> (Ranks, mpsc::Receiver<(u32, String)>) {
    let id = env.unique_id();
    let n = nranks.to_string();
    let (tx, rx) = mpsc::channel();
    let mut ranks = Ranks::new();
    for rank in 0..nranks {
        let r = rank.to_string();
        let args = ["stall", &id, &n, &r, go.to_str().unwrap()];
        let mut child = env.command(&args).spawn().expect("spawn rank");
        let stdout = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let _ = tx.send((rank, line.unwrap_or_default()));
            }
        });
        ranks.children.push(child);
    }
    (ranks, rx)
}

/// Every rank but the last enqueues collective 1; the last calls it only once `go` exists. The
/// others must report their stream busy first (still busy a second into the collective), and
/// all must then finish with the same results.
fn a_late_rank_holds_its_peers(nranks: u32) {
    let env = Env::new();
    let go = env.dir.path().join("go");
    let (mut ranks, rx) = start_stall(&env, nranks, &go);
    let mut busy = 0;
    while busy < nranks - 1 && !ranks.failing() {
        if let Ok((rank, line)) = rx.recv_timeout(Duration::from_millis(100)) {
            assert_eq!(line, "busy", "rank {rank} before the late rank called");
            busy += 1;
        }
    }
    if busy == nranks - 1 {
        let late = ranks.children.last_mut().unwrap();
        assert!(
            late.try_wait().unwrap().is_none(),
            "the late rank exited before it was let go"
        );
        std::fs::write(&go, b"").expect("write go file");
    }
    let outputs = ranks.finish();
    assert_all_succeeded(&outputs);
    assert_eq!(busy, nranks - 1, "every early rank reports its stream busy");
    let mut last = vec![String::new(); nranks as usize];
    for (rank, line) in rx.iter() {
        assert!(line.starts_with("ok "), "rank {rank}: {line:?}");
        last[rank as usize] = line;
    }
    assert_same_results(&last);
}

#[test]
fn two_ranks_one_late() {
    a_late_rank_holds_its_peers(2);
}

#[test]
fn four_ranks_one_late() {
    a_late_rank_holds_its_peers(4);
}

#[test]
fn a_rank_alone_gives_up_after_the_init_timeout() {
    let env = Env::new();
    let id = env.unique_id();
    let started = Instant::now();
    let out = env
        .command(&["allreduce", &id, "2", "0", "1"])
        .env("FAKE_NCCL_INIT_TIMEOUT", "0.5")
        .output()
        .expect("run rank");
    assert!(!out.status.success(), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ncclCommInitRank returned ncclResult 2: ranks [1] of 2 did not join"),
        "{}",
        describe(&out)
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        env.state_files(),
        Vec::<String>::new(),
        "the lone rank's region outlived it"
    );
}

#[test]
fn a_failed_launch_is_an_unhandled_cuda_error() {
    let env = Env::new();
    let id = env.unique_id();
    let mut ranks = Ranks::new();
    for rank in ["0", "1"] {
        let mut cmd = env.command(&["allreduce", &id, "2", rank, "1"]);
        if rank == "0" {
            // Its second launch: the collective is then enqueued in part.
            cmd.env("FAKE_CUDA_FAIL", "cuLaunchKernel:2");
        }
        ranks.children.push(cmd.spawn().expect("spawn rank"));
    }
    let outputs = ranks.finish();
    let stderr = String::from_utf8_lossy(&outputs[0].stderr);
    assert!(
        stderr.contains(
            "ncclAllReduce returned ncclResult 1: cuLaunchKernel failed: \
             CUDA_ERROR_OUT_OF_MEMORY(2)"
        ),
        "{}",
        describe(&outputs[0])
    );
}
