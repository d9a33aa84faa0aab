//! `cuinterpose suspend --keep-contexts` (issue 11) with the real binary on the fake driver: the
//! shims save and release their memory as in every suspend, and the driver's own checkpoint is
//! never taken, which the fake's state shows (each process stays natively RUNNING and keeps the
//! memory the shim does not own, which a native checkpoint would have withdrawn: `cuMemAlloc`
//! memory left to the driver by `CUINTERPOSE_ALLOC=native`).

mod common;

use common::*;
use protocol::{Phase, Request, Response};
use std::time::Duration;
use testkit::{TestEnv, Workload};

/// Private memory per process that the shim does not own (native `cuMemAlloc`), so it stays on
/// the device in the keep mode.
const PRIVATE: u64 = 2 << 20;

/// Members whose `cuMemAlloc` memory the driver makes: the memory the keep mode leaves resident.
fn members() -> [Member; 2] {
    [
        Member::shim("a").env("CUINTERPOSE_ALLOC", "native"),
        Member::shim("b").env("CUINTERPOSE_ALLOC", "native"),
    ]
}

/// `a` and `b` share both ways (`a0` created by `a`, `a1` by `b`) and each holds a private `p`
/// of native `cuMemAlloc` memory.
fn build(tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    create_shared(a, "a0", SIZE);
    create_shared(b, "a1", SIZE);
    share(a, b, "a0", SIZE);
    share(b, a, "a1", SIZE);
    for (w, seed) in [(a, 31), (b, 32)] {
        ok(
            w,
            &[&format!("malloc p {PRIVATE}"), &format!("fill p {seed}")],
        );
    }
    ok(a, &["fill a0 11"]);
    ok(b, &["fill a1 12"]);
}

/// Contents intact through every mapping, and writes go both ways.
fn assert_intact(tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    ok(a, &["verify a0 11", "verify a1 12", "verify p 31"]);
    ok(b, &["verify a0 11", "verify a1 12", "verify p 32"]);
    ok(b, &["fill a0 13"]);
    ok(a, &["verify a0 13", "fill a1 14"]);
    ok(b, &["verify a1 14"]);
    ok(a, &["fill a0 11", "fill a1 12"]);
}

/// `suspend --keep-contexts` of the group under `root`, with the state in the test's directory.
fn keep_suspend(env: &TestEnv, root: u32) -> ToolRun {
    let args = suspend_args(env, root, &["--keep-contexts"]);
    tool(env, &strs(&args))
}

/// `inspect --state-dir` of the test's directory, as JSON.
fn inspect(env: &TestEnv, root: u32) -> serde_json::Value {
    let root = root.to_string();
    let dir = state_dir(env).display().to_string();
    tool(
        env,
        &["inspect", "--pid", &root, "--state-dir", &dir, "--json"],
    )
    .ok()
    .json()
}

/// The host memory `w`'s carrier holds pinned, as inspect reports it.
fn carrier_pinned(env: &TestEnv, root: u32, w: &Workload) -> u64 {
    let report = inspect(env, root);
    report["snapshots"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["info"]["host_pid"] == w.pid()))
        .and_then(|p| p["hello"]["carrier_pinned_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no pinned carrier figure for {} in {report}", w.name()))
}

/// Sends one phase request to the shim of `pid` directly, as a tool run would before it died.
fn send_phase(env: &TestEnv, pid: u32, request: Request) -> Phase {
    let path = control_socket(env, pid);
    let mut conn = transport::Connection::connect(&path, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("control socket of pid {pid}: {e}"));
    match conn.call(&request) {
        Ok((Response::PhaseDone { phase, .. }, _)) => phase,
        other => panic!("{request:?} to pid {pid}: {other:?}"),
    }
}

fn phases(run: &ToolRun) -> Vec<String> {
    run.json()["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// Each process is natively RUNNING and holds exactly its private memory: what the shims owned is
/// released, and no native checkpoint withdrew the rest.
fn assert_kept(env: &TestEnv, workloads: &[&Workload], run: &ToolRun) {
    let native = env.native().unwrap();
    for w in workloads {
        assert_eq!(
            native.state(w.pid()).unwrap(),
            testkit::native::ProcessState::Running,
            "{} natively; {}",
            w.name(),
            run.describe()
        );
        assert_eq!(
            usage(env, w.pid()),
            PRIVATE,
            "{} holds other than its private memory while suspended; {}",
            w.name(),
            run.describe()
        );
        assert!(alive(w.pid()), "{} died while suspended", w.name());
    }
}

#[test]
fn keep_contexts_suspends_and_resumes_a_pair_without_the_native_checkpoint() {
    let env = env();
    let tree = Tree::launch(&env, &members());
    build(&tree);
    let (a, b) = (tree.w("a"), tree.w("b"));
    let before = [regions(a), regions(b)];
    for w in [a, b] {
        assert_eq!(carrier_pinned(&env, tree.root(), w), 0, "{}", w.name());
    }

    let run = keep_suspend(&env, tree.root());
    let report = run.ok().json();
    assert_eq!(report["saved_bytes"], 2 * SIZE, "{}", run.describe());
    let names = phases(&run);
    assert!(names.iter().any(|n| n == "release"), "{names:?}");
    assert!(!names.iter().any(|n| n == "native-checkpoint"), "{names:?}");
    assert_kept(&env, &[a, b], &run);
    let shown = inspect(&env, tree.root());
    assert_eq!(shown["suspended"]["mode"], "keep-contexts", "{shown}");
    for w in [a, b] {
        assert_eq!(phase_of(&env, w.pid()), Phase::Released, "{}", w.name());
    }

    // The application's tracked calls wait at the shim's gate while suspended, as after a plain
    // suspend, and go through once the group is resumed.
    let socket = a.socket().to_path_buf();
    let held = std::thread::spawn(move || {
        testkit::wire::call_one(&socket, "create late 2M", Duration::from_secs(60))
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !held.is_finished(),
        "a tracked call ran while the group was suspended with --keep-contexts"
    );

    let run = resume(&env, tree.root());
    run.ok();
    let late = held.join().unwrap().expect("the held call's reply");
    assert!(late.ok, "the held call failed after resume: {late:?}");
    ok(a, &["release late"]);
    let names = phases(&run);
    assert!(names.iter().any(|n| n == "load"), "{names:?}");
    assert!(!names.iter().any(|n| n == "native-restore"), "{names:?}");
    assert!(!state_dir(&env).join("cuinterpose.state").exists());
    assert!(inspect(&env, tree.root()).get("suspended").is_none());
    assert_eq!([regions(a), regions(b)], before, "addresses changed");
    for w in [a, b] {
        assert_eq!(phase_of(&env, w.pid()), Phase::Running, "{}", w.name());
        assert!(usage(&env, w.pid()) >= SIZE + PRIVATE, "{}", w.name());
    }
    assert_intact(&tree);
    // The default carrier (`auto`) was pinned by this cycle, which skipped the native
    // checkpoint, and stays pinned for the next: each creator's carrier holds its allocation.
    for w in [a, b] {
        assert_eq!(carrier_pinned(&env, tree.root(), w), SIZE, "{}", w.name());
    }

    // A normal suspend of the same group still takes the native checkpoint, and inspect says so.
    let run = suspend(&env, tree.root(), &[]);
    run.ok();
    assert!(phases(&run).iter().any(|n| n == "native-checkpoint"));
    assert_eq!(inspect(&env, tree.root())["suspended"]["mode"], "native");
    for w in [a, b] {
        assert_eq!(
            usage(&env, w.pid()),
            0,
            "{} natively checkpointed",
            w.name()
        );
    }
    resume(&env, tree.root()).ok();
    assert_intact(&tree);
    for w in [a, b] {
        assert_eq!(
            carrier_pinned(&env, tree.root(), w),
            SIZE,
            "{} kept",
            w.name()
        );
    }
}

#[test]
fn resume_finishes_a_keep_contexts_suspend_from_any_phase_a_fault_left() {
    let env = env();
    let tree = Tree::launch(&env, &members());
    build(&tree);
    let (a, b) = (tree.w("a").pid(), tree.w("b").pid());
    // What a suspend killed after its release, or a resume killed after load or after import,
    // leaves: the shims in that phase, the state file in keep mode, every process natively
    // running (nothing native was ever done).
    for stop_after in [None, Some(Request::Load), Some(Request::Import)] {
        let run = keep_suspend(&env, tree.root());
        run.ok();
        if let Some(step) = &stop_after {
            if matches!(step, Request::Import) {
                for pid in [a, b] {
                    assert_eq!(send_phase(&env, pid, Request::Load), Phase::Loaded);
                }
            }
            for pid in [a, b] {
                send_phase(&env, pid, step.clone());
            }
        }
        let run = resume(&env, tree.root());
        run.ok();
        assert!(
            !phases(&run).iter().any(|n| n == "native-restore"),
            "{stop_after:?}: {}",
            run.describe()
        );
        let native = env.native().unwrap();
        for pid in [a, b] {
            assert_eq!(phase_of(&env, pid), Phase::Running, "{stop_after:?}");
            assert_eq!(
                native.state(pid).unwrap(),
                testkit::native::ProcessState::Running
            );
        }
        assert_intact(&tree);
    }
}

/// Found on the H200: a process whose allocations are packed in its carrier at 2 MiB offsets
/// (a small one, then one larger than a pinned piece of 256 MiB) had every keep-contexts Save
/// refused by the driver (a copy unit crossed from one registered piece into the next), after a
/// plain cycle had run fine. The fake refuses such copies as r580 does; the cycles must pass.
#[test]
fn keep_contexts_moves_allocations_that_straddle_the_carriers_pinned_pieces() {
    const BIG: u64 = 300 << 20;
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a")]);
    let a = tree.w("a");
    ok(
        a,
        &[
            &format!("malloc small {PRIVATE}"),
            &format!("malloc big {BIG}"),
            "fill small 41",
            "fill big 42",
        ],
    );
    let check = |when: &str| {
        for line in ["verify small 41", "verify big 42"] {
            a.ok(line).unwrap_or_else(|e| panic!("{when}: {e}"));
        }
    };
    suspend(&env, tree.root(), &[]).ok();
    resume(&env, tree.root()).ok();
    check("after a plain cycle");
    for cycle in 0..2 {
        let run = keep_suspend(&env, tree.root());
        let report = run.ok().json();
        assert_eq!(report["saved_bytes"], PRIVATE + BIG, "{}", run.describe());
        resume(&env, tree.root()).ok();
        check(&format!("after keep-contexts cycle {cycle}"));
        assert_eq!(carrier_pinned(&env, tree.root(), a), PRIVATE + BIG);
    }
}
