//! `cuinterpose bench` runs on the fake driver and writes a well-formed report: every figure a
//! positive number, the copy statistics of both carrier modes present. No timing is judged.

mod common;

use common::tool_bin as tool;
use std::path::Path;
use std::process::Command;

/// A small, quick run: 8 MiB shared, one overhead repetition with few iterations.
fn run_bench(carrier: &str, json_out: &Path) -> serde_json::Value {
    let output = Command::new(tool())
        .args([
            "bench",
            "--fake",
            "--json",
            "--size",
            "8M",
            "--repetitions",
            "1",
            "--rounds",
            "3",
            "--iterations",
            "200",
            "--tracked-iterations",
            "20",
            "--whole-size",
            "8M",
        ])
        .arg("--json-out")
        .arg(json_out)
        // Each process's own carrier, in the mode under test (the default, auto, may choose the
        // carrier helper, which has modes of its own).
        .args(["--carrier", "process"])
        // The shims of the group inherit the tool's environment through the test harness.
        .env("CUINTERPOSE_CARRIER", carrier)
        .output()
        .expect("running cuinterpose bench");
    assert!(
        output.status.success(),
        "cuinterpose bench failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("--json prints one JSON report");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json_out).expect("--json-out file"))
            .expect("--json-out writes JSON");
    assert_eq!(
        printed, written,
        "--json and --json-out give the same report"
    );
    printed
}

fn positive(v: &serde_json::Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x > 0.0, "{what} is {x}");
    x
}

#[test]
fn bench_reports_positive_figures_in_every_carrier_mode() {
    let dir = std::env::temp_dir().join(format!("cuinterpose-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    for (carrier, mode) in [
        ("registered", "Registered"),
        ("staged", "Staged"),
        ("pinned", "Pinned"),
        // The default: the capture's cycles each have their native checkpoint, so staged.
        ("auto", "Staged"),
    ] {
        let report = run_bench(carrier, &dir.join(format!("{carrier}.json")));
        assert_eq!(report["on_gpu"], false);
        let overhead = &report["overhead"];
        for side in ["untracked", "tracked"] {
            let rows = overhead[side].as_array().expect("overhead rows");
            assert!(!rows.is_empty());
            for row in rows {
                positive(&row["without_shim_ns"], "a time without the shim");
                positive(&row["with_shim_ns"], "a time with the shim");
                positive(&row["ratio"], "a ratio");
                // The median lies within the rounds' percentiles, and those within the extremes.
                let f = |key: &str| row[key].as_f64().unwrap_or(f64::NAN);
                let spread = &row["ratio_spread"];
                let (min, max) = (spread[0].as_f64(), spread[1].as_f64());
                let ordered = [
                    min,
                    Some(f("ratio_p10")),
                    Some(f("ratio")),
                    Some(f("ratio_p90")),
                    max,
                ];
                assert!(
                    ordered
                        .windows(2)
                        .all(|w| matches!(w, [Some(a), Some(b)] if a <= b)),
                    "min <= p10 <= median <= p90 <= max: {row}"
                );
            }
        }
        assert_eq!(overhead["rounds"], 3);
        assert_eq!(overhead["registry_bytes_per_allocation"], 621);

        let capture = &report["capture"];
        assert_eq!(capture["shared_bytes"], 8 << 20);
        let cycles = capture["cycles"].as_array().expect("cycles");
        assert_eq!(cycles.len(), 2, "two cycles by default");
        for (i, cycle) in cycles.iter().enumerate() {
            for copy in ["save", "load"] {
                let c = &cycle[copy];
                assert_eq!(c["bytes"], 8 << 20, "{copy} of cycle {}", i + 1);
                positive(&c["copy_gb_per_s"], "a copy rate");
                let shims = c["shims"].as_array().expect("per-shim statistics");
                assert_eq!(shims.len(), 2, "one entry per creator");
                for shim in shims {
                    assert_eq!(shim[1]["mode"], mode, "the mode CUINTERPOSE_CARRIER picked");
                    assert_eq!(shim[1]["staged_fallbacks"], 0);
                }
            }
            positive(&cycle["suspend_gb_per_s"], "the suspend rate");
            positive(&cycle["resume_gb_per_s"], "the resume rate");
            positive(&cycle["speedup_vs_native"], "the ratio to native");
        }
        assert_eq!(
            cycles[1]["save"]["carriers_reused"], true,
            "the second cycle reuses the carriers"
        );
        let native = &capture["native"];
        assert_eq!(native["bytes"], 8 << 20);
        positive(&native["checkpoint_gb_per_s"], "the native checkpoint rate");
        positive(&native["restore_gb_per_s"], "the native restore rate");
        assert_eq!(capture["verified"].as_array().map(Vec::len), Some(3));

        // The whole-process case: one cuMemAlloc process, plain and --keep-contexts, and native.
        let whole = &report["whole"];
        assert_eq!(whole["bytes"], 8 << 20);
        let owned = whole["owned_bytes"].as_u64().expect("owned bytes");
        let memory = if owned >= 8 << 20 { "owned" } else { "native" };
        assert_eq!(
            whole["memory"], memory,
            "the way the memory went, from inspect"
        );
        for run in [
            "plain_first",
            "plain",
            "keep_contexts_first",
            "keep_contexts",
        ] {
            let r = &whole[run];
            positive(&r["suspend_millis"], "a whole-process suspend time");
            positive(&r["resume_millis"], "a whole-process resume time");
            positive(&r["suspend_gb_per_s"], "a whole-process suspend rate");
            positive(&r["resume_gb_per_s"], "a whole-process resume rate");
            let moved = if memory == "owned" { 8 << 20 } else { 0 };
            assert_eq!(r["shim_bytes"], moved, "{run}: what the shim moved");
            // `auto` pins for the cycles that skip the native checkpoint, and only for them.
            let expected = match (memory, carrier, run) {
                ("native", ..) => serde_json::Value::Null,
                (_, "auto", "plain_first" | "plain") => "Staged".into(),
                (_, "auto", _) => "Pinned".into(),
                _ => mode.into(),
            };
            assert_eq!(
                r["carrier"], expected,
                "{carrier}, {run}: the carrier Save used"
            );
        }
        assert_eq!(whole["native"]["bytes"], 8 << 20);
        // Each process's own carrier asked for: nothing prepared ahead, so the first cycle of
        // each kind makes (or pins) its carrier and the second reuses it.
        assert_eq!(whole["prepared"], serde_json::Value::Null);
        assert_eq!(whole["prepared_keep_contexts"], serde_json::Value::Null);
        if memory == "owned" {
            for (run, reused) in [
                ("plain_first", false),
                ("plain", true),
                ("keep_contexts_first", carrier != "auto"),
                ("keep_contexts", true),
            ] {
                assert_eq!(whole[run]["carrier_reused"], reused, "{carrier}, {run}");
            }
        }
        positive(
            &whole["speedup_vs_native"],
            "the whole-process ratio to native",
        );
        positive(
            &whole["speedup_vs_native_first"],
            "the whole-process ratio to native, first cycle",
        );
        assert_eq!(whole["verified"].as_array().map(Vec::len), Some(5));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_prints_the_whole_process_table() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let json_out = dir.path().join("whole.json");
    let output = Command::new(tool())
        .args([
            "bench",
            "--fake",
            "--no-overhead",
            "--no-capture",
            "--whole-size",
            "4M",
        ])
        .arg("--json-out")
        .arg(&json_out)
        .output()
        .expect("running cuinterpose bench");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cuinterpose bench failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "whole process: 4.00 MiB of cuMemAlloc memory,",
        "RUN",
        "plain 1 ",
        "plain 2 ",
        "keep-contexts 1 ",
        "keep-contexts 2 ",
        "native ",
        // The default carrier: prepared first, as a user of it does, and said so.
        "prepared first (cuinterpose prepare, ",
        "keep-contexts cycles prepared (cuinterpose prepare --keep-contexts, process): 4.00 MiB \
         pinned ahead in ",
        "x native in the second cycle (",
        "targets: >= 10x native every cycle",
        // Each run's phases, so that a slower cycle shows where its time went.
        "phases, ms:",
        "  plain 2 suspend: inspect ",
        "  plain 2 resume: inspect ",
        "ok  whole (plain-1): 4.00 MiB of cuMemAlloc memory kept",
        "ok  whole (plain-2): 4.00 MiB of cuMemAlloc memory kept",
        "ok  whole (keep-contexts-1): 4.00 MiB of cuMemAlloc memory kept",
        "ok  whole (keep-contexts-2): 4.00 MiB of cuMemAlloc memory kept",
        "ok  native: 4.00 MiB of cuMemAlloc memory kept across checkpoint and restore",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    // Prepared for them, the first keep-contexts cycle pins nothing: its carrier was pinned ahead
    // (without preparation it pins there: `bench_reports_positive_figures_in_every_carrier_mode`).
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_out).expect("--json-out file"))
            .expect("--json-out writes JSON");
    let whole = &report["whole"];
    for run in [
        "plain_first",
        "plain",
        "keep_contexts_first",
        "keep_contexts",
    ] {
        let phase_names = |key: &str| -> Vec<String> {
            whole[run][key]
                .as_array()
                .unwrap_or_else(|| panic!("no {run}.{key} in {whole:#}"))
                .iter()
                .map(|p| p["name"].as_str().unwrap_or_default().to_string())
                .collect()
        };
        assert!(
            phase_names("suspend_phases").iter().any(|n| n == "save"),
            "{run}: {whole:#}"
        );
        assert!(
            phase_names("resume_phases").iter().any(|n| n == "load"),
            "{run}: {whole:#}"
        );
        // The Save's copies alone: measured, and inside the phase that ran them.
        let save = whole[run]["suspend_phases"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "save"))
            .and_then(|p| p["millis"].as_f64())
            .unwrap_or_default();
        let copies = whole[run]["save_copy_millis"].as_f64();
        assert!(
            copies.is_some_and(|c| c > 0.0 && c <= save),
            "{run}: copies {copies:?} of a save of {save} ms"
        );
    }
    let prepared = &whole["prepared_keep_contexts"]["processes"][0];
    assert!(
        prepared["pinned_bytes"].as_u64() >= Some(4 << 20),
        "{prepared:#}"
    );
    if whole["memory"] == "owned" {
        assert_eq!(
            whole["keep_contexts_first"]["carrier"], "Pinned",
            "{whole:#}"
        );
        assert_eq!(
            whole["keep_contexts_first"]["carrier_reused"], true,
            "{whole:#}"
        );
    }
}

/// `bench --to-disk DIR`: the directory's own rates, the checkpoint's and the restore's phases
/// with bytes, a ratio for every phase that streams data files, a second checkpoint after a
/// tenth of the bytes changed, and nothing but the block store's lock left in DIR.
#[test]
fn bench_to_disk_reports_phases_next_to_the_directory_rate() {
    let criu = std::env::var_os("CUINTERPOSE_CRIU")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.criu/bin/criu"));
    assert!(
        criu.is_file(),
        "CRIU not found at {} (set CUINTERPOSE_CRIU): run scripts/install-criu.sh first",
        criu.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(tool())
        .args([
            "bench",
            "--fake",
            "--json",
            "--no-overhead",
            "--no-capture",
            "--no-whole",
            "--size",
            "16M",
            "--to-disk",
        ])
        .arg(dir.path())
        .env("CUINTERPOSE_CRIU", &criu)
        .output()
        .expect("running cuinterpose bench");
    assert!(
        output.status.success(),
        "cuinterpose bench --to-disk failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    let disk = &report["disk"];
    positive(&disk["dir_write_gb_per_s"], "directory write rate");
    positive(&disk["dir_read_gb_per_s"], "directory read rate");
    assert_eq!(disk["dir_rate"]["bytes"], 16 << 20);
    let ratios: Vec<(String, String)> = disk["ratios"]
        .as_array()
        .expect("ratios")
        .iter()
        .map(|r| {
            positive(&r["gb_per_s"], "phase rate");
            positive(&r["of_dir"], "ratio");
            (
                r["run"].as_str().expect("run").to_string(),
                r["phase"].as_str().expect("phase").to_string(),
            )
        })
        .collect();
    // The restore reads each data file once: the shims check the digests as they load.
    assert!(
        !ratios.iter().any(|(_, p)| p == "verify-data"),
        "a pass of its own over the data files: {ratios:?}"
    );
    for wanted in [("checkpoint", "save"), ("restore", "load")] {
        assert!(
            ratios
                .iter()
                .any(|(r, p)| (r.as_str(), p.as_str()) == wanted),
            "{wanted:?} in {ratios:?}"
        );
    }
    let save = disk["checkpoint"]["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .find(|p| p["name"] == "save")
        .expect("save phase");
    assert_eq!(save["bytes"], 16 << 20);
    assert_eq!(disk["checkpoint"]["data_bytes"], 16 << 20);
    // How the shims' workers spent the streaming: each part measured (hashing 16 MiB, reading
    // or writing it, making the pinned buffers and waiting for copies all take time), each a
    // share, and together no more than the whole.
    for run in ["checkpoint", "restore"] {
        let time = &disk[run]["worker_time"];
        let shares: Vec<f64> = ["setup", "io", "digests", "copy_waits"]
            .iter()
            .map(|part| {
                time[part]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{run}: {part} in {time}"))
            })
            .collect();
        assert!(shares.iter().all(|&s| s > 0.0 && s <= 1.0), "{run}: {time}");
        assert!(shares.iter().sum::<f64>() <= 1.0 + 1e-9, "{run}: {time}");
    }
    // The second checkpoint, after a tenth of the bytes changed (whole 2 MiB blocks: 2 MiB of
    // each process's 8 MiB), writes only the changed blocks and references the rest.
    let second = &disk["second"];
    let changed = second["changed_bytes"].as_u64().expect("changed bytes");
    assert_eq!(changed, 4 << 20, "{second}");
    assert_eq!(second["report"]["data_bytes"], changed, "{second}");
    assert_eq!(
        second["report"]["shared_bytes"],
        (16 << 20) - changed,
        "{second}"
    );
    assert_eq!(second["written_ratio"], 0.25, "{second}");
    positive(&second["time_ratio"], "time against the first");
    // Both checkpoints discarded, their blocks with them: only the store's lock is left.
    let mut left = Vec::new();
    for entry in walkdir(dir.path()) {
        if !entry.is_dir() && !entry.ends_with(".cuinterpose-blocks/.lock") {
            left.push(entry);
        }
    }
    assert!(left.is_empty(), "left in the directory: {left:?}");
}

/// Every path under `dir`.
fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walkdir(&path));
        }
        out.push(path);
    }
    out
}

/// `bench --carrier helper`: every suspend saves through the carrier helper; its copies are
/// DMA into memory it keeps pinned (mode Pinned in every shim's figures), its carriers are reused
/// by the second cycle, and the whole-process case keeps its bytes.
#[test]
fn bench_through_the_carrier_helper_reports_pinned_copies_and_reused_carriers() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let json_out = dir.path().join("helper.json");
    let output = Command::new(tool())
        .args([
            "bench",
            "--fake",
            "--no-overhead",
            "--carrier",
            "helper",
            "--size",
            "8M",
            "--whole-size",
            "4M",
            "--json",
        ])
        .arg("--json-out")
        .arg(&json_out)
        .output()
        .expect("running cuinterpose bench");
    assert!(
        output.status.success(),
        "cuinterpose bench --carrier helper failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["carrier"], "helper");
    let cycles = report["capture"]["cycles"].as_array().expect("cycles");
    for (i, cycle) in cycles.iter().enumerate() {
        for copy in ["save", "load"] {
            let shims = cycle[copy]["shims"]
                .as_array()
                .expect("per-shim statistics");
            assert_eq!(shims.len(), 2, "{copy} of cycle {}", i + 1);
            for shim in shims {
                assert_eq!(
                    shim[1]["mode"],
                    "Pinned",
                    "{copy} of cycle {}: {shim}",
                    i + 1
                );
            }
        }
    }
    assert_eq!(
        cycles[1]["save"]["carriers_reused"], true,
        "the second cycle reuses the helper's carriers"
    );
    let verified = report["whole"]["verified"].as_array().expect("verified");
    assert!(
        verified
            .iter()
            .any(|v| v.as_str().is_some_and(|s| s.starts_with("whole (plain-2)"))),
        "{verified:?}"
    );
}

/// The default bench (`--carrier auto`): the capture's cycles with auto's choice, then the same
/// cycles of a fresh group with each carrier asked for, each against native, each suspend report
/// saying its carrier and what it holds.
#[test]
fn the_default_bench_compares_auto_with_each_carrier() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let json_out = dir.path().join("auto.json");
    let output = Command::new(tool())
        .args([
            "bench",
            "--fake",
            "--no-overhead",
            "--no-whole",
            "--size",
            "4M",
            "--json",
        ])
        .arg("--json-out")
        .arg(&json_out)
        .output()
        .expect("running cuinterpose bench");
    assert!(
        output.status.success(),
        "cuinterpose bench failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["carrier"], "auto");
    let capture = &report["capture"];
    let chosen = capture["cycles"][0]["suspend"]["carrier"]["carrier"].clone();
    assert!(
        chosen == "helper" || chosen == "process",
        "auto chose {chosen}"
    );
    // Auto's group is prepared first: where auto chose the helper, its first Save pins nothing.
    let prepared = &capture["prepared"];
    assert_eq!(prepared["carrier"]["carrier"], chosen, "{prepared}");
    if chosen == "helper" {
        assert_eq!(
            capture["cycles"][0]["suspend"]["carrier"]["save"]["carriers_reused"], true,
            "{prepared}"
        );
    }
    let comparison = capture["comparison"].as_array().expect("a comparison");
    let asked: Vec<&str> = comparison
        .iter()
        .map(|r| r["carrier"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(asked, ["process", "helper"]);
    for run in comparison {
        let cycles = run["cycles"].as_array().expect("cycles");
        assert_eq!(cycles.len(), 2, "{run}");
        for cycle in cycles {
            let carrier = &cycle["suspend"]["carrier"];
            assert_eq!(carrier["carrier"], run["carrier"], "{carrier}");
            assert_eq!(carrier["requested"], run["carrier"], "{carrier}");
            positive(&cycle["speedup_vs_native"], "the ratio to native");
        }
        // The helper's cost is stated: its carrier pinned, its context's room on the GPU; not
        // prepared, its first Save made its carrier.
        if run["carrier"] == "helper" {
            let carrier = &cycles[0]["suspend"]["carrier"];
            assert_eq!(carrier["save"]["carriers_reused"], false, "{carrier}");
            assert!(
                carrier["pinned_host_bytes"].as_u64() >= Some(4 << 20),
                "{carrier}"
            );
            assert!(carrier["helper_gpu_bytes"].as_u64() > Some(0), "{carrier}");
        }
    }
}
