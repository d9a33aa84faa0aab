//! All-reduce across rank processes: each a `fake-nccl-rank` loading the fake driver and this
//! library by soname from a private `LD_LIBRARY_PATH`, with a private `FAKE_CUDA_STATE_DIR`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
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
        // The fake driver is a dev-dependency: cargo built its cdylib into deps/ for this test.
        let profile = profile_dir();
        for (built, soname) in [
            (profile.join("deps/libcuda.so"), "libcuda.so.1"),
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

/// Waits for `child` (its stdout already taken or not), killing it after `TIMEOUT`.
fn finish(mut child: Child, started: Instant) -> Output {
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("wait")
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
    let (n, started) = (nranks.to_string(), Instant::now());
    let children: Vec<Child> = (0..nranks)
        .map(|rank| {
            let r = rank.to_string();
            let args = ["allreduce", id.as_str(), n.as_str(), r.as_str(), "100"];
            env.command(&args).spawn().expect("spawn rank")
        })
        .collect();
    let outputs: Vec<Output> = children.into_iter().map(|c| finish(c, started)).collect();
    let mut lines = Vec::new();
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.status.success(), "rank {rank}: {}", describe(out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        lines.push(stdout.lines().last().unwrap_or_default().to_string());
    }
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

/// Every rank but the last enqueues collective 1; the last calls it only once `go` exists. The
/// others must report their stream busy first, and all must then finish with the same results.
fn a_late_rank_holds_its_peers(nranks: u32) {
    let env = Env::new();
    let id = env.unique_id();
    let go = env.dir.path().join("go");
    let (n, started) = (nranks.to_string(), Instant::now());
    let (tx, rx) = mpsc::channel();
    let mut children = Vec::new();
    for rank in 0..nranks {
        let r = rank.to_string();
        let args = [
            "stall",
            id.as_str(),
            n.as_str(),
            r.as_str(),
            go.to_str().unwrap(),
        ];
        let mut child = env.command(&args).spawn().expect("spawn rank");
        let stdout = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let _ = tx.send((rank, line.unwrap_or_default()));
            }
        });
        children.push(child);
    }
    drop(tx);
    let mut busy = 0;
    while busy < nranks - 1 {
        let (rank, line) = rx
            .recv_timeout(TIMEOUT.saturating_sub(started.elapsed()))
            .expect("every early rank reports its stream busy");
        assert_eq!(line, "busy", "rank {rank} before the late rank called");
        busy += 1;
    }
    let late = children.last_mut().unwrap();
    assert!(late.try_wait().unwrap().is_none(), "the late rank exited");
    std::fs::write(&go, b"").expect("write go file");
    let outputs: Vec<Output> = children.into_iter().map(|c| finish(c, started)).collect();
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.status.success(), "rank {rank}: {}", describe(out));
    }
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
