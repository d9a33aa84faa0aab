//! Every entry the driver table marks gated is gated however the application reaches it: through
//! the global scope (what a program linked with `-lcuda` binds to), `dlsym` on the driver, and the
//! driver's resolver `cuGetProcAddress_v2`. Each route hands out the shim's generated gated
//! wrapper wherever the driver has the entry, and a call through it waits at the closed gate until
//! the gate opens. The list comes from the table, so an entry added there is tested here.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Stdio};
use std::time::{Duration, Instant};

use common::{Launch, Run, SHIM_FILE, Work, assert_untouched};
use protocol::{Request, Response};
use transport::Connection;

/// Reads crates/cuda/src/driver_table.rs for its gated entries: the exact ABI name and, for a
/// versioned variant, the base name and version a resolver is asked for.
macro_rules! interposer_table {
    (
        interception { $($i:ident),* $(,)? }
        wrapped {
            $( #[hook $wh:tt] $w:ident $(= $wb:ident @ $wv:literal)? ( $($wa:ident : $wt:ty),* $(,)? ); )*
        }
        gated { $( $g:ident $(= $gb:ident @ $gv:literal)? ( $($ga:ident : $gt:ty),* $(,)? ); )* }
        called { $( $c:ident $(= $cb:ident @ $cv:literal)? ( $($ca:ident : $ct:ty),* $(,)? ); )* }
    ) => {
        const GATED: &[(&str, Option<(&str, i32)>)] =
            &[$( (stringify!($g), versioned!($($gb, $gv)?)) ),*];
    };
}

macro_rules! versioned {
    () => {
        None
    };
    ($base:ident, $version:literal) => {
        Some((stringify!($base), $version))
    };
}

include!("../../cuda/src/driver_table.rs");

/// `CU_GET_PROC_ADDRESS_DEFAULT` and `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const DEFAULT_STREAM: u32 = 0;
const PER_THREAD: u32 = 2;

/// The resolver request that reaches `name`: `NAME,BASE,VERSION,FLAGS` for tests/c/gated.c. A
/// per-thread variant (`_ptsz`, `_ptds`) is asked for by its base name with the per-thread flag;
/// an unversioned `_v2` by the name without it, at 12.0, where the driver picks `_v2`.
fn spec(name: &str, versioned: Option<(&str, i32)>) -> String {
    let stripped = name
        .strip_suffix("_ptsz")
        .or_else(|| name.strip_suffix("_ptds"));
    let flags = if stripped.is_some() {
        PER_THREAD
    } else {
        DEFAULT_STREAM
    };
    let abi = stripped.unwrap_or(name);
    let (base, version) =
        versioned.unwrap_or_else(|| (abi.strip_suffix("_v2").unwrap_or(abi), 12000));
    format!("{name},{base},{version},{flags}")
}

fn specs() -> Vec<String> {
    GATED.iter().map(|(n, v)| spec(n, *v)).collect()
}

fn launch(work: &Work) -> Launch {
    Launch::new()
        .library_path(work.fake_driver_dir())
        .env("FAKE_CUDA_STATE_DIR", work.state_dir())
        .env("CUINTERPOSE_CONTROL_DIR", work.control_dir())
}

fn names() -> impl Iterator<Item = &'static str> {
    GATED.iter().map(|(name, _)| *name)
}

#[test]
fn every_route_to_a_gated_entry_is_its_gated_wrapper() {
    let work = Work::new();
    let program = work.program("gated", &["gated.c"], &["-pthread"]);
    let mut launch = launch(&work);
    for spec in specs() {
        launch = launch.arg(spec);
    }
    let with = launch.with_shim().run(&program).report();
    let without = launch.run(&program).report();
    let mut from_driver = 0;
    for name in names() {
        // Preloaded, the shim's export is the global scope's definition, whether or not the
        // driver has the entry (without the driver's, the wrapper calls a NOT_FOUND stub).
        let export = with.line(&format!("export.{name}"));
        assert_eq!(
            (export.provider.as_str(), export.sname.as_str()),
            (SHIM_FILE, name),
            "export.{name}\n{}",
            with.run()
        );
        for route in ["dlsym", "procaddr"] {
            let label = format!("{route}.{name}");
            let (w, n) = (with.line(&label), without.line(&label));
            if !n.is_driver() {
                // The driver lacks it: nothing to hand out, with or without the shim.
                assert_untouched(&with, &without, &label);
                continue;
            }
            from_driver += 1;
            // The wrapper of the ABI the driver picked, which the table gates too (a resolver
            // may pick the default-stream twin of a per-thread request).
            assert_eq!(w.provider, SHIM_FILE, "{label}\n{}", with.run());
            assert!(
                names().any(|gated| gated == w.sname),
                "{label}: handed out {}, not a gated wrapper\n{}",
                w.sname,
                with.run()
            );
            if route == "dlsym" {
                assert_eq!(w.sname, name, "{label}: dlsym finds the exact name");
            }
            assert_eq!((w.result, w.status), (n.result, n.status), "{label}");
        }
    }
    assert!(
        from_driver > 20,
        "the fake driver has the launches, copies, memsets, stream memory operations and \
         event records: {from_driver} routes found"
    );
}

/// Reads lines of the program's output into `seen` up to `until`.
fn read_until(out: &mut BufReader<ChildStdout>, seen: &mut String, until: &str) {
    loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).expect("read the program's output");
        assert!(n > 0, "the program ended before {until:?}:\n{seen}");
        seen.push_str(&line);
        if line.trim_end() == until {
            return;
        }
    }
}

/// The one control socket in `dir`, once the runtime listens on it.
fn control_socket(dir: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let socket = std::fs::read_dir(dir)
            .expect("control dir")
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|ext| ext == "sock"));
        if let Some(socket) = socket {
            return socket;
        }
        assert!(Instant::now() < deadline, "no control socket in {dir:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn waiting(connection: &mut Connection) -> u32 {
    match connection.call(&Request::Drain { wait_ms: 1 }) {
        Ok((Response::Drain(report), None)) => report.waiting,
        other => panic!("Drain: {other:?}"),
    }
}

#[test]
fn every_call_through_every_route_waits_at_the_closed_gate() {
    let work = Work::new();
    let program = work.program("gated", &["gated.c"], &["-pthread"]);
    let mut launch = launch(&work).with_shim().arg("hold");
    for spec in specs() {
        launch = launch.arg(spec);
    }
    let mut child = launch
        .command(&program)
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn tests/c/gated.c");
    let mut input = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = String::new();
    read_until(&mut out, &mut seen, "ready");

    let socket = control_socket(&work.control_dir());
    let mut connection = Connection::connect(&socket, Duration::from_secs(20)).expect("connect");
    let hello = Request::Hello {
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    assert!(matches!(
        connection.call(&hello),
        Ok((Response::Hello(_), None))
    ));
    match connection.call(&Request::Hold) {
        Ok((Response::Drain(_), None)) => {}
        other => panic!("Hold: {other:?}"),
    }
    writeln!(input, "closed").expect("tell the program");
    read_until(&mut out, &mut seen, "held");
    let passed: Vec<&str> = seen.lines().filter(|l| l.starts_with("passed ")).collect();
    assert!(passed.is_empty(), "through the closed gate: {passed:?}");
    let calls = seen
        .lines()
        .filter(|l| !l.contains("provider=null") && !l.starts_with("call."))
        .filter(|l| l.contains(" provider="))
        .count();
    assert!(calls >= names().count(), "{seen}");
    // Every call is at the gate, none lost on the way.
    let deadline = Instant::now() + Duration::from_secs(20);
    while waiting(&mut connection) < u32::try_from(calls).expect("count") {
        assert!(
            Instant::now() < deadline,
            "{calls} calls, not all at the gate"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    match connection.call(&Request::Thaw) {
        Ok((Response::PhaseDone { .. }, None)) => {}
        other => panic!("Thaw: {other:?}"),
    }
    writeln!(input, "open").expect("tell the program");
    read_until(&mut out, &mut seen, &format!("released {calls} of {calls}"));
    let status = child.wait().expect("wait");
    let run = Run {
        program: program.display().to_string(),
        preload: SHIM_FILE.to_string(),
        status,
        stdout: seen,
        stderr: String::new(),
    };
    // Each route's pointer was the gated wrapper (the other test checks the same lines).
    let report = run.report();
    for name in names() {
        assert_eq!(report.line(&format!("export.{name}")).sname, name);
    }
}
