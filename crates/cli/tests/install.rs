//! What a user meets after installing: `doctor` on the fake driver and with no driver, the tool
//! finding its bundled CRIU with no variable set, and the completions and manual pages generated
//! from the argument definitions.

mod common;

use common::tool_bin as tool;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};
use testkit::harness::Artifacts;

/// `doctor`'s exit code when a check fails (`cuinterpose --help`).
const EXIT_CHECK_FAILED: i32 = 6;

fn artifacts() -> Artifacts {
    Artifacts::locate().expect("artifacts (build the workspace first)")
}

/// The tool with none of its variables set and `PATH` without any CRIU, as on a fresh machine.
fn bare(args: &[&str]) -> Command {
    let mut command = Command::new(tool());
    command.args(args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CUINTERPOSE_") {
            command.env_remove(&key);
        }
    }
    command.env("PATH", "/usr/bin:/bin");
    command
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn find<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {report:#}"))
}

const CHECKS: [&str; 15] = [
    "driver",
    "checkpoint-api",
    "gpus",
    "shim",
    "criu",
    "criu-check",
    "kernel-checkpoint-restore",
    "pidfd",
    "ptrace-scope",
    "privileges",
    "control-dir",
    "dev-shm",
    "transparent-hugepages",
    "memlock",
    "host-memory",
];

#[test]
fn doctor_passes_the_driver_checks_on_the_fake_driver() {
    let driver = artifacts().fake_driver().expect("fake driver");
    let state = tempfile::tempdir().expect("tempdir");
    let output = bare(&["doctor", "--json", "--driver"])
        .arg(&driver)
        .env("FAKE_CUDA_DEVICES", "2")
        .env("FAKE_CUDA_STATE_DIR", state.path())
        .output()
        .expect("running doctor");
    let report = json(&output);
    for name in CHECKS {
        let check = find(&report, name);
        assert!(
            ["ok", "warn", "fail", "skip"].contains(&check["status"].as_str().unwrap_or("")),
            "{check}"
        );
        assert!(
            check["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{check}"
        );
        if check["status"] == "fail" || check["status"] == "warn" {
            assert!(check["fix"].is_string(), "a {check} without a fix");
        }
    }
    for name in ["driver", "checkpoint-api", "gpus", "shim", "criu"] {
        assert_eq!(find(&report, name)["status"], "ok", "{report:#}");
    }
    // The GPU memory of the fake devices was compared with the host's.
    assert_ne!(find(&report, "host-memory")["status"], "skip", "{report:#}");
    let gpus = report["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2, "{report:#}");
    for gpu in gpus {
        assert!(gpu["name"].as_str().is_some_and(|n| !n.is_empty()), "{gpu}");
        assert!(
            gpu["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")),
            "{gpu}"
        );
        assert!(gpu["memory_total"].as_u64().is_some_and(|t| t > 0), "{gpu}");
    }
    let expected = if report["ok"] == true {
        0
    } else {
        EXIT_CHECK_FAILED
    };
    assert_eq!(output.status.code(), Some(expected), "{report:#}");
}

#[test]
fn doctor_fails_without_a_driver_and_says_what_to_fix() {
    let output = bare(&["doctor", "--driver", "/nonexistent/libcuda.so.1"])
        .output()
        .expect("running doctor");
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(EXIT_CHECK_FAILED), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        CHECKS.len() + 1,
        "one line per check and a verdict:\n{text}"
    );
    let driver = lines
        .iter()
        .find(|l| l.split_whitespace().nth(1) == Some("driver"))
        .expect("a driver line");
    assert!(driver.starts_with("fail"), "{driver}");
    assert!(
        driver.contains("/nonexistent/libcuda.so.1") && driver.contains(" -> "),
        "{driver}"
    );
    for name in ["checkpoint-api", "gpus"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("skip") && l.split_whitespace().nth(1) == Some(name)),
            "{name} skipped without a driver:\n{text}"
        );
    }
    assert!(text.contains("check(s) failed"), "{text}");

    let output = bare(&["doctor", "--json", "--driver", "/nonexistent/libcuda.so.1"])
        .output()
        .expect("running doctor --json");
    let report = json(&output);
    assert_eq!(report["ok"], false);
    assert_eq!(find(&report, "driver")["status"], "fail");
    assert_eq!(output.status.code(), Some(EXIT_CHECK_FAILED));
}

#[test]
fn the_checkouts_criu_is_found_with_no_variable_set() {
    // target/<profile>/cuinterpose in a checkout: the .criu/ that scripts/bootstrap.sh installs.
    let checkout = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let criu = std::fs::canonicalize(checkout.join(".criu/bin/criu"))
        .expect(".criu/bin/criu (run scripts/bootstrap.sh first)");
    let output = bare(&["doctor", "--json", "--driver", "/nonexistent/libcuda.so.1"])
        .output()
        .expect("running doctor");
    let report = json(&output);
    let found = find(&report, "criu");
    assert_eq!(found["status"], "ok", "{report:#}");
    let detail = found["detail"].as_str().expect("detail");
    let program = PathBuf::from(detail.split_whitespace().next().expect("path"));
    assert_eq!(std::fs::canonicalize(program).ok(), Some(criu), "{detail}");
}

#[test]
fn completions_and_manual_pages_are_generated_from_the_arguments() {
    for shell in ["bash", "zsh", "fish"] {
        let output = bare(&["completions", shell]).output().expect("completions");
        assert!(output.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&output.stdout);
        for word in ["doctor", "checkpoint", "freeze-timeout", "device-map"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let output = bare(&["man"]).output().expect("man");
    let page = String::from_utf8_lossy(&output.stdout);
    assert!(page.contains(".TH cuinterpose 1"), "{page}");
    assert!(page.contains("doctor"), "{page}");

    let dir = tempfile::tempdir().expect("tempdir");
    let status = bare(&["man", "--dir"])
        .arg(dir.path())
        .status()
        .expect("man --dir");
    assert!(status.success());
    let checkpoint = std::fs::read_to_string(dir.path().join("cuinterpose-checkpoint.1"))
        .expect("cuinterpose-checkpoint.1");
    assert!(checkpoint.contains("freeze\\-timeout"), "{checkpoint}");
    assert!(checkpoint.contains("SECONDS"), "{checkpoint}");
    assert!(dir.path().join("cuinterpose.1").is_file());
    assert!(
        !dir.path().join("cuinterpose-abi-layout.1").exists(),
        "hidden commands have no page"
    );
}
