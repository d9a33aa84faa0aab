//! Helpers for the shim's process tests: built artifacts, C programs compiled per test, processes
//! run with and without the shim preloaded, and the `report()` lines of tests/c/probe.h.

#![allow(dead_code)] // each test file uses a different subset

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// File name of the shim as `dladdr` reports it.
pub const SHIM_FILE: &str = "libcuinterpose.so";

/// Generous: the machine running the tests may be loaded.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(120);

/// `target/<profile>`, where cargo put this test and the libraries built beside it.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

fn artifact(name: &str, build: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first ({build}, or `cargo build --workspace --all-targets`)",
        path.display()
    );
    path
}

/// The built shim.
pub fn shim() -> PathBuf {
    artifact("libcuinterpose.so", "cargo build -p cuinterpose-shim")
}

/// The built fake driver.
pub fn fake_driver() -> PathBuf {
    artifact("libcuda.so", "cargo build -p fake-cuda")
}

/// The C sources of these tests.
pub fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c")
}

/// A scratch directory holding what one test compiled, its driver directories and its state.
pub struct Work {
    dir: tempfile::TempDir,
}

impl Work {
    pub fn new() -> Work {
        Work {
            dir: tempfile::Builder::new()
                .prefix("cuishim")
                .tempdir()
                .expect("tempdir"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A directory holding the fake driver as `libcuda.so.1` (run time) and `libcuda.so` (link
    /// time), both links to the built `target/<profile>/libcuda.so`.
    pub fn fake_driver_dir(&self) -> PathBuf {
        let dir = self.path("fake-driver");
        if !dir.exists() {
            let driver = fake_driver();
            std::fs::create_dir(&dir).expect("mkdir");
            std::os::unix::fs::symlink(&driver, dir.join("libcuda.so.1")).expect("symlink");
            std::os::unix::fs::symlink(&driver, dir.join("libcuda.so")).expect("symlink");
        }
        dir
    }

    /// A directory holding tests/c/odd_driver.c built as `libcuda.so.1`. Linked
    /// `-Bsymbolic` so that its own function addresses are its own, as a real driver's are.
    pub fn odd_driver_dir(&self) -> PathBuf {
        let dir = self.path("odd-driver");
        if !dir.exists() {
            std::fs::create_dir(&dir).expect("mkdir");
            cc(
                &dir.join("libcuda.so.1"),
                &["odd_driver.c"],
                &[
                    "-shared",
                    "-fPIC",
                    "-Wl,-Bsymbolic",
                    "-Wl,-soname,libcuda.so.1",
                ],
            );
            std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).expect("symlink");
        }
        dir
    }

    /// Compiles `sources` (in tests/c) into the executable `name`, with extra arguments.
    pub fn program(&self, name: &str, sources: &[&str], extra: &[&str]) -> PathBuf {
        let out = self.path(name);
        cc(&out, sources, extra);
        out
    }

    /// Compiles `sources` into the shared library `file` (also its soname).
    pub fn library(&self, file: &str, sources: &[&str], extra: &[&str]) -> PathBuf {
        let out = self.path(file);
        let soname = format!("-Wl,-soname,{file}");
        let mut args = vec!["-shared", "-fPIC", soname.as_str()];
        args.extend_from_slice(extra);
        cc(&out, sources, &args);
        out
    }

    /// The directory for the shim's control sockets (`CUINTERPOSE_CONTROL_DIR`).
    pub fn control_dir(&self) -> PathBuf {
        let dir = self.path("control");
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    /// A fresh state directory for the fake driver.
    pub fn state_dir(&self) -> PathBuf {
        let dir = self.path("state");
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }
}

/// `cc -Wall -Wextra -I tests/c -o out SOURCES ARGS -ldl`.
fn cc(out: &Path, sources: &[&str], args: &[&str]) {
    let dir = sources_dir();
    let mut command = Command::new("cc");
    command
        .args(["-Wall", "-Wextra", "-O1", "-g", "-I"])
        .arg(&dir)
        .arg("-o")
        .arg(out);
    for source in sources {
        command.arg(dir.join(source));
    }
    command.args(args).arg("-ldl");
    let output = command
        .output()
        .expect("running cc (a C compiler is needed for these tests)");
    assert!(
        output.status.success(),
        "cc failed for {}:\n{}",
        out.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn sources_dir() -> PathBuf {
    sources()
}

/// How to run a test process.
#[derive(Default, Clone)]
pub struct Launch {
    /// `LD_PRELOAD`, in order (empty: none).
    pub preload: Vec<PathBuf>,
    /// `LD_LIBRARY_PATH`, in order.
    pub library_path: Vec<PathBuf>,
    /// Further environment.
    pub env: Vec<(String, OsString)>,
    pub args: Vec<OsString>,
}

impl Launch {
    pub fn new() -> Launch {
        Launch::default()
    }

    pub fn preload(mut self, library: impl Into<PathBuf>) -> Launch {
        self.preload.push(library.into());
        self
    }

    pub fn library_path(mut self, dir: impl Into<PathBuf>) -> Launch {
        self.library_path.push(dir.into());
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Launch {
        self.env.push((key.to_string(), value.into()));
        self
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Launch {
        self.args.push(arg.into());
        self
    }

    /// The same launch with the shim preloaded first.
    pub fn with_shim(&self) -> Launch {
        let mut launch = self.clone();
        launch.preload.insert(0, shim());
        launch
    }

    /// The command that runs `program` with this launch's arguments and environment (standard
    /// input null, output piped).
    pub fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command
            .args(&self.args)
            .env_remove("LD_PRELOAD")
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !self.preload.is_empty() {
            command.env("LD_PRELOAD", join(&self.preload));
        }
        if !self.library_path.is_empty() {
            command.env("LD_LIBRARY_PATH", join(&self.library_path));
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
    }

    /// Runs `program` to completion (bounded by a generous timeout).
    pub fn run(&self, program: &Path) -> Run {
        let mut child = self
            .command(program)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let out = std::thread::spawn(move || {
            let mut text = String::new();
            stdout.read_to_string(&mut text).map(|_| text)
        });
        let err = std::thread::spawn(move || {
            let mut text = String::new();
            stderr.read_to_string(&mut text).map(|_| text)
        });
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not finish within {PROCESS_TIMEOUT:?}",
                    program.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Run {
            program: program.display().to_string(),
            preload: join(&self.preload).to_string_lossy().into_owned(),
            status,
            stdout: out.join().expect("stdout reader").expect("stdout utf-8"),
            stderr: err.join().expect("stderr reader").expect("stderr utf-8"),
        }
    }
}

fn join(paths: &[PathBuf]) -> OsString {
    std::env::join_paths(paths).expect("paths without ':'")
}

/// A finished process.
#[derive(Debug)]
pub struct Run {
    pub program: String,
    pub preload: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts a clean exit and parses the report lines.
    pub fn report(&self) -> Report {
        assert!(self.status.success(), "{self:#?}");
        let mut lines = BTreeMap::new();
        for text in self.stdout.lines() {
            if let Some(line) = Line::parse(text) {
                let label = text.split(' ').next().unwrap_or_default().to_string();
                assert!(
                    lines.insert(label, line).is_none(),
                    "duplicate label in {self:#?}"
                );
            }
        }
        Report {
            lines,
            run: format!("{self:#?}"),
        }
    }
}

/// One `report()` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub result: i64,
    pub status: i64,
    pub provider: String,
    pub sname: String,
}

impl Line {
    fn parse(text: &str) -> Option<Line> {
        let mut fields = text.split(' ').skip(1);
        let mut next = |key: &str| fields.next()?.strip_prefix(key).map(str::to_string);
        Some(Line {
            result: next("result=")?.parse().ok()?,
            status: next("status=")?.parse().ok()?,
            provider: next("provider=")?,
            sname: next("sname=")?,
        })
    }

    pub fn is_driver(&self) -> bool {
        self.provider.starts_with("libcuda.so")
    }
}

/// The report lines of one run, by label.
pub struct Report {
    lines: BTreeMap<String, Line>,
    run: String,
}

impl Report {
    pub fn line(&self, label: &str) -> &Line {
        self.lines
            .get(label)
            .unwrap_or_else(|| panic!("no line {label} in {}", self.run))
    }

    pub fn labels(&self) -> impl Iterator<Item = &String> {
        self.lines.keys()
    }

    pub fn run(&self) -> &str {
        &self.run
    }
}

/// The shim handed out its wrapper `wrapper` where, without it, the driver answered; result and
/// status are the driver's.
pub fn assert_wrapped(with: &Report, without: &Report, label: &str, wrapper: &str) {
    let (w, n) = (with.line(label), without.line(label));
    assert_eq!(
        (w.provider.as_str(), w.sname.as_str()),
        (SHIM_FILE, wrapper),
        "{label}: expected the shim's {wrapper}\nwith the shim: {}",
        with.run()
    );
    assert!(
        n.is_driver(),
        "{label}: without the shim the driver answers\n{}",
        without.run()
    );
    assert_eq!(
        (w.result, w.status),
        (n.result, n.status),
        "{label}: result and status unchanged"
    );
}

/// The line is the same with and without the shim, and not the shim's.
pub fn assert_untouched(with: &Report, without: &Report, label: &str) {
    let (w, n) = (with.line(label), without.line(label));
    assert_eq!(
        w,
        n,
        "{label}: untouched by the shim\nwith: {}\nwithout: {}",
        with.run(),
        without.run()
    );
    assert_ne!(w.provider, SHIM_FILE, "{label}");
}

/// The driver handed out a pointer, the shim reported it as not found.
pub fn assert_not_found(with: &Report, without: &Report, label: &str, result: i64, status: i64) {
    let (w, n) = (with.line(label), without.line(label));
    assert!(
        n.is_driver(),
        "{label}: the driver answers without the shim\n{}",
        without.run()
    );
    assert_eq!(
        (w.result, w.status, w.provider.as_str()),
        (result, status, "null"),
        "{label}: reported as not found\n{}",
        with.run()
    );
}

/// Every `call.*` line (results of calls into the driver) is identical with and without the shim.
pub fn assert_calls_identical(with: &Report, without: &Report) {
    let calls: Vec<&String> = without
        .labels()
        .filter(|l| l.starts_with("call."))
        .collect();
    assert!(!calls.is_empty(), "no call lines in {}", without.run());
    for label in calls {
        assert_eq!(
            with.line(label),
            without.line(label),
            "{label}: the driver's own result\nwith: {}\nwithout: {}",
            with.run(),
            without.run()
        );
    }
}
