//! The workload's own behaviour on the fake driver: grammar and error replies, scripts, descriptor
//! passing, trees and their clean exit, kill-on-drop, the fake's accounting, the bench, and the
//! native API on processes that cannot be checkpointed.

use std::time::{Duration, Instant};

use cuinterpose_testkit::driver::Resolve;
use cuinterpose_testkit::harness::{Group, TestEnv, WorkloadOptions, fake_usage_in};
use cuinterpose_testkit::native::{self, ControlError, ProcessState};

fn env() -> TestEnv {
    TestEnv::fake().expect("test environment")
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    gone(pid)
}

#[test]
fn replies_name_the_error_kind() {
    let env = env();
    let w = env.spawn(WorkloadOptions::new("w")).unwrap();
    assert_eq!(w.cmd("frobnicate").unwrap().outcome(), "usage");
    assert_eq!(w.cmd("create a").unwrap().outcome(), "usage");
    assert_eq!(
        w.cmd("create a 2M --colour red").unwrap().outcome(),
        "usage"
    );
    assert_eq!(w.cmd("map nothing r").unwrap().outcome(), "state");
    assert_eq!(w.cmd("recv-fd x").unwrap().outcome(), "io");
    assert_eq!(
        w.cmd("wait fd never --timeout 50").unwrap().outcome(),
        "timeout"
    );
    let bad = w.cmd("create a 1").unwrap();
    assert_eq!(bad.outcome(), "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(bad.call.as_deref(), Some("cuMemCreate"));
    assert_eq!(bad.code, Some(1));
    // The workload is still fine after all that.
    w.ok("create a 2M").unwrap();
    let info = w.ok("info").unwrap();
    assert_eq!(info.u64("pid"), Some(u64::from(w.pid())));
    assert!(info.str("libcuda").unwrap().contains("libcuda.so"));
    assert_eq!(info.data.get("shim"), Some(&serde_json::json!(false)));
}

#[test]
fn a_batch_answers_every_command_in_order() {
    let env = env();
    let w = env.spawn(WorkloadOptions::new("w")).unwrap();
    let replies = w
        .batch(&[
            "create a 2M",
            "reserve r 4M",
            "map a r --size 2M",
            "map a r+2M --as second",
            "set-access r 4M",
            "fill a 5",
            "verify second 5",
            "verify second 6",
            "memset second 7",
            "verify a --byte 7",
        ])
        .unwrap();
    let outcomes: Vec<String> = replies.iter().map(|r| r.outcome()).collect();
    assert_eq!(
        outcomes,
        [
            "ok", "ok", "ok", "ok", "ok", "ok", "ok", "mismatch", "ok", "ok"
        ]
    );
    let mismatch = &replies[7];
    assert_eq!(mismatch.u64("offset"), Some(0));
    let regions = w.regions().unwrap();
    assert_eq!(regions["second"].base, regions["r"].base + (2 << 20));
    assert_eq!(regions["a"].kind, "mapping");
}

#[test]
fn a_script_runs_before_serving_and_a_failing_one_exits_1() {
    let env = env();
    let script = env.dir().join("setup.cmds");
    std::fs::write(
        &script,
        "# a comment\ncreate a 2M\nreserve r 2M\nmap a r\nset-access a\nfill a 9\n\n",
    )
    .unwrap();
    let w = env
        .spawn(WorkloadOptions::new("scripted").script(&script))
        .unwrap();
    w.assert_pattern("a", 9).unwrap();

    let bad = env.dir().join("bad.cmds");
    std::fs::write(&bad, "create a 2M\ncreate b 1\ncreate c 2M\n").unwrap();
    let program = env.artifacts().workload().unwrap();
    let out = env
        .command(&program, false)
        .unwrap()
        .args(["serve", "--script"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[1].contains("CUDA_ERROR_INVALID_VALUE"), "{stdout}");
}

#[test]
fn descriptors_and_ipc_handles_travel_between_workloads() {
    let env = env();
    let a = env.spawn(WorkloadOptions::new("a")).unwrap();
    let b = env
        .spawn(WorkloadOptions::new("b").resolve(Resolve::GetProcAddress))
        .unwrap();
    assert_eq!(b.ok("info").unwrap().str("resolve"), Some("getprocaddress"));
    let to_b = format!("--to {}", b.socket().display());
    a.all_ok(&[
        "create x 2M",
        "export x --as fx",
        &format!("send-fd fx {to_b} --as got"),
        "malloc m 2M",
        "fill m 3",
        "ipc-get h m",
        &format!("send-ipc h {to_b}"),
    ])
    .unwrap();
    b.all_ok(&[
        "wait fd got --timeout 1000",
        "import x --fd got --size 2M",
        "reserve r 2M",
        "map x r",
        "set-access x",
        "wait ipc h --timeout 1000",
        "ipc-open m --blob h",
        "verify m 3",
        "close-fd got",
        "ipc-close m",
    ])
    .unwrap();
    // A peer that is not there is an i/o error, and the sender carries on.
    assert_eq!(
        a.cmd(&format!(
            "send-fd fx --to {}/nobody.sock",
            env.dir().display()
        ))
        .unwrap()
        .outcome(),
        "io"
    );
    a.ok("close-fd fx").unwrap();
    assert_eq!(a.cmd("close-fd fx").unwrap().outcome(), "state");
}

#[test]
fn exit_ends_the_process_with_its_code_and_removes_the_socket() {
    let env = env();
    let mut w = env.spawn(WorkloadOptions::new("w")).unwrap();
    let socket = w.socket().to_path_buf();
    w.ok("exit 3").unwrap();
    let status = w
        .wait_exit(Duration::from_secs(30))
        .unwrap()
        .expect("exited");
    assert_eq!(status.code(), Some(3));
    assert!(!socket.exists());
}

#[test]
fn dropping_a_workload_kills_it() {
    let env = env();
    let pid = {
        let w = env.spawn(WorkloadOptions::new("w")).unwrap();
        w.pid()
    };
    assert!(wait_gone(pid, Duration::from_secs(10)));
}

#[test]
fn tree_children_exit_when_the_root_dies() {
    let env = env();
    let g = Group::tree(&env, 3, WorkloadOptions::new("t")).unwrap();
    let pids: Vec<u32> = g.members().iter().map(|w| w.pid()).collect();
    assert_eq!(pids.len(), 3);
    assert_eq!(g[2].ok("info").unwrap().u64("rank"), Some(2));
    // Rank addressing by number inside the tree.
    g[1].all_ok(&["create x 2M", "export x", "send-fd x --to 2"])
        .unwrap();
    g[2].ok("import x").unwrap();
    // Kill only the root process, not its group: the children must notice and exit.
    let root = rustix::process::Pid::from_raw(pids[0] as i32).unwrap();
    rustix::process::kill_process(root, rustix::process::Signal::KILL).unwrap();
    for pid in &pids[1..] {
        assert!(
            wait_gone(*pid, Duration::from_secs(20)),
            "tree child {pid} outlived its root"
        );
    }
}

#[test]
fn tree_exit_stops_the_children() {
    let env = env();
    let mut g = Group::tree(&env, 3, WorkloadOptions::new("t")).unwrap();
    let pids: Vec<u32> = g.members().iter().map(|w| w.pid()).collect();
    g[0].ok("exit").unwrap();
    let status = g.members_mut()[0]
        .wait_exit(Duration::from_secs(30))
        .unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    for pid in &pids[1..] {
        assert!(wait_gone(*pid, Duration::from_secs(20)));
    }
}

#[test]
fn fake_accounting_follows_allocations() {
    let env = env();
    let w = env.spawn(WorkloadOptions::new("w")).unwrap();
    let before = env.fake_usage(w.pid(), 0).unwrap();
    w.all_ok(&["create a 4M", "malloc m 2M"]).unwrap();
    let after = env.fake_usage(w.pid(), 0).unwrap();
    assert!(after >= before + (6 << 20), "{before} -> {after}");
    assert_eq!(env.fake_usage(w.pid(), 1).unwrap(), 0);
    // Another state directory knows nothing of it.
    let other = tempfile::tempdir().unwrap();
    assert_eq!(fake_usage_in(other.path(), w.pid(), 0).unwrap(), 0);
    w.all_ok(&["release a", "free m"]).unwrap();
    assert_eq!(env.fake_usage(w.pid(), 0).unwrap(), before);
}

#[test]
fn bench_prints_one_report() {
    let env = env();
    let program = env.artifacts().workload().unwrap();
    let out = env
        .command(&program, false)
        .unwrap()
        .args([
            "bench",
            "--iterations",
            "200",
            "--tracked-iterations",
            "20",
            "--resolve",
            "getprocaddress",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["resolve"], "getprocaddress");
    assert_eq!(report["tracked"]["iterations"], 20);
    for key in [
        "ctx_synchronize_ns",
        "memset_d8_256_ns",
        "memcpy_htod_256_ns",
    ] {
        assert!(report["untracked"][key].as_f64().unwrap() > 0.0, "{key}");
    }
    assert!(report["tracked"]["cycle_ns"].as_f64().unwrap() > 0.0);
}

#[test]
fn native_state_of_running_and_foreign_processes() {
    let env = env();
    let native = env.native().unwrap();
    let w = env.spawn(WorkloadOptions::new("w")).unwrap();
    assert_eq!(native.state(w.pid()).unwrap(), ProcessState::Running);
    // A process that never initialised the driver is not a CUDA process.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let err = native.state(sleeper.id()).unwrap_err();
    assert!(
        matches!(err, ControlError::Driver { .. }),
        "unexpected {err}"
    );
    assert_eq!(native::outcome(&err), "CUDA_ERROR_INVALID_VALUE");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn sharing_helpers_build_pair_and_ring() {
    let env = env();
    let pair = Group::sharing_pair(&env, 2 << 20).unwrap();
    pair[0].ok("fill a0 1").unwrap();
    pair[1].assert_pattern("a0", 1).unwrap();
    pair[0].ok("fill a1 2").unwrap();
    pair[1].assert_pattern("a1", 2).unwrap();
    let ring = Group::sharing_ring(&env, 3, 2 << 20).unwrap();
    ring[2].ok("fill a2 4").unwrap();
    ring[0].assert_pattern("a2", 4).unwrap();
    assert_eq!(
        ring[1].expect("verify a0 5", "mismatch").unwrap().outcome(),
        "mismatch"
    );
}

#[test]
fn uuid_names_the_device_of_an_ordinal() {
    let env = env();
    let w = env.spawn(WorkloadOptions::new("w")).unwrap();
    let zero = w.ok("uuid").unwrap();
    assert_eq!(zero.u64("device"), Some(0));
    let one = w.ok("uuid --device 1").unwrap();
    let (a, b) = (zero.str("uuid").unwrap(), one.str("uuid").unwrap());
    assert_eq!(a.len(), 32);
    assert_ne!(a, b);
    // The fake's device n ends in n (its README).
    assert!(b.ends_with("00000001"), "{b}");
    w.expect("uuid --device 9", "CUDA_ERROR_INVALID_DEVICE")
        .unwrap();
}
