//! In-crate tests. The driver's state is process-wide, so every test that initialises it runs
//! in a process of its own: the test binary re-executes itself for just that test
//! (`--exact <path>`) with `FAKE_CUDA_TEST_ROLE` naming the test and a private
//! `FAKE_CUDA_STATE_DIR`. Cross-process tests start several such processes ("peers", each with
//! a role) and drive them line by line over stdin/stdout (`@@ ` lines).

/// Calls an entry point of this driver with arguments a test built.
macro_rules! cu {
    ($call:expr) => {{
        // SAFETY: test arguments are valid pointers to live locals, or deliberately invalid
        // values (null, bogus handles) that the entry point must refuse without dereferencing.
        unsafe { $call }
    }};
}

mod api;
mod basic;
mod checkpoint;
mod faults;
mod kernels;
mod multicast;
mod r580;
mod share;
mod streams;
mod symbols;
mod vmm;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub(crate) use api::*;

const ROLE_VAR: &str = "FAKE_CUDA_TEST_ROLE";
const PEER_VAR: &str = "FAKE_CUDA_TEST_PEER";
/// How long a peer may stay silent before the test gives up on it.
const PEER_TIMEOUT: Duration = Duration::from_secs(180);

/// The libtest name of a test from its `module_path!()` and function name.
pub(crate) fn test_name(module: &str, name: &str) -> String {
    let module = module.split_once("::").map_or("", |(_, rest)| rest);
    format!("{module}::{name}")
}

/// A private state directory, removed on drop.
#[derive(Debug)]
pub(crate) struct StateDir(pub PathBuf);

impl StateDir {
    pub(crate) fn new(test: &str) -> StateDir {
        // Short, so socket paths under it stay far below the 108-byte limit.
        let name: String = test
            .rsplit("::")
            .next()
            .unwrap_or(test)
            .chars()
            .take(24)
            .collect();
        let dir = std::env::temp_dir().join(format!("fcuda-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        StateDir(dir)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether this process is the isolated run of `test`.
pub(crate) fn is_child(test: &str) -> bool {
    std::env::var(ROLE_VAR).as_deref() == Ok(test)
}

/// This peer's role, in the isolated run of `test`.
pub(crate) fn role(test: &str) -> Option<String> {
    is_child(test).then(|| std::env::var(PEER_VAR).unwrap_or_default())
}

fn command(test: &str, dir: &StateDir, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, test)
        .env("FAKE_CUDA_STATE_DIR", &dir.0)
        .env_remove("FAKE_CUDA_FAIL")
        .env_remove("FAKE_CUDA_DEVICES")
        .env_remove("FAKE_CUDA_MULTICAST")
        .env_remove("FAKE_CUDA_FABRIC")
        .env_remove("FAKE_CUDA_DEVICE_MEMORY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `body` in a process of its own (the isolated run of `test`) with `env` set.
pub(crate) fn isolated(test: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if is_child(test) {
        body();
        return;
    }
    let dir = StateDir::new(test);
    let out = command(test, &dir, env)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "isolated run of {test} failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
}

/// A process running one role of a cross-process test.
#[derive(Debug)]
pub(crate) struct Peer {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    pub(crate) fn spawn(test: &str, role: &str, dir: &StateDir, env: &[(&str, &str)]) -> Peer {
        let mut child = command(test, dir, env)
            .env(PEER_VAR, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest prints "test NAME ... " without a newline before the test runs.
                if let Some((_, msg)) = line.split_once("@@ ")
                    && tx.send(msg.to_owned()).is_err()
                {
                    break;
                }
            }
        });
        Peer {
            name: role.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines: rx,
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next message of the peer.
    pub(crate) fn recv(&mut self) -> String {
        match self.lines.recv_timeout(PEER_TIMEOUT) {
            Ok(line) => line,
            Err(err) => {
                let _ = self.child.kill();
                let status = self.child.wait();
                panic!(
                    "peer {} said nothing more ({err}); exit: {status:?}",
                    self.name
                );
            }
        }
    }

    /// The next message, which must start with `tag`; returns the rest.
    pub(crate) fn expect(&mut self, tag: &str) -> String {
        let line = self.recv();
        match line.strip_prefix(tag) {
            Some(rest) => rest.trim().to_owned(),
            None => panic!("peer {} said {line:?}, expected {tag:?}", self.name),
        }
    }

    /// The next message if one arrives within `wait` (to show that something has *not*
    /// happened yet; never used to wait for something to happen).
    pub(crate) fn recv_within(&mut self, wait: Duration) -> Option<String> {
        self.lines.recv_timeout(wait).ok()
    }

    pub(crate) fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Kills the peer with SIGKILL and reaps it, as a crash would end it.
    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the peer to finish its role successfully.
    pub(crate) fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "peer {} failed: {status:?}", self.name);
    }
}

/// In a peer: says `line` to the test.
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@ {line}").unwrap();
    out.flush().unwrap();
}

/// In a peer: the next line from the test.
pub(crate) fn hear() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    line.trim().to_owned()
}

/// In a peer: waits for the test to send `word`.
pub(crate) fn wait_for(word: &str) {
    let line = hear();
    assert_eq!(line, word, "unexpected instruction");
}

/// Declares a test that runs in a process of its own with the given environment.
macro_rules! isolated_test {
    ($name:ident, $env:expr, $body:block) => {
        #[test]
        fn $name() {
            let test = $crate::tests::test_name(module_path!(), stringify!($name));
            $crate::tests::isolated(&test, $env, || $body);
        }
    };
}
pub(crate) use isolated_test;
