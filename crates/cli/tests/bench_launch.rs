//! `cuinterpose bench --launch` (issue 27) runs on the fake driver: launches per second without
//! and with the shim and their ratio are printed, as text and in `--json`, each a positive number.
//! No timing is judged (the target, <= 1.02, is the GPU lane's).

mod common;

use common::tool_bin as tool;
use std::process::{Command, Output};

/// A small, quick run: one pair of processes, two rounds of 200 launches per thread.
fn run(json: bool) -> Output {
    let mut command = Command::new(tool());
    command.args([
        "bench",
        "--launch",
        "--fake",
        "--repetitions",
        "1",
        "--rounds",
        "2",
        "--launch-threads",
        "3",
        "--launch-iterations",
        "200",
    ]);
    if json {
        command.arg("--json");
    }
    let output = command
        .output()
        .expect("running cuinterpose bench --launch");
    assert!(
        output.status.success(),
        "cuinterpose bench --launch failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn positive(value: &serde_json::Value, what: &str) -> f64 {
    let v = value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"));
    assert!(v > 0.0 && v.is_finite(), "{what} = {v}");
    v
}

#[test]
fn the_launch_bound_case_reports_both_rates_and_their_ratio_in_json() {
    let out = run(true);
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("bench --launch --json prints JSON");
    let launch = &report["launch"];
    positive(
        &launch["without_shim_launches_per_s"],
        "launches/s without the shim",
    );
    positive(
        &launch["with_shim_launches_per_s"],
        "launches/s with the shim",
    );
    positive(&launch["ratio"]["ratio"], "the ratio");
    positive(
        &launch["ratio"]["without_shim_ns"],
        "ns per launch without the shim",
    );
    positive(
        &launch["ratio"]["with_shim_ns"],
        "ns per launch with the shim",
    );
    assert_eq!(launch["threads"], 3, "{report}");
    assert_eq!(launch["iterations"], 200, "{report}");
    assert_eq!(launch["rounds"], 2, "{report}");
    // Only the launch-bound case ran.
    for other in ["overhead", "capture", "whole", "disk"] {
        assert!(report[other].is_null(), "{other} ran too: {report}");
    }
}

#[test]
fn the_launch_bound_case_prints_both_rates_and_their_ratio_as_text() {
    let out = run(false);
    let text = String::from_utf8_lossy(&out.stdout);
    let rates = text
        .lines()
        .find(|l| l.starts_with("launches/s without the shim"))
        .unwrap_or_else(|| panic!("no launches/s line:\n{text}"));
    let numbers: Vec<f64> = rates
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "{rates}");
    assert!(numbers.iter().all(|&n| n > 0.0), "{rates}");
    let ratio = text
        .lines()
        .find_map(|l| l.strip_prefix("ratio "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no ratio line:\n{text}"));
    assert!(ratio > 0.0, "{text}");
}
