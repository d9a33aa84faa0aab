//! Failures after the capture began (exit 4, rolled back) and a tool killed half way (recovered by
//! `cuinterpose resume`), with the real binary on the fake driver. The workload is verified
//! afterwards: contents, sharing both ways, memory back, every shim running.
//!
//! To stop a capture at a chosen step without timing, the tests take the fake driver's own
//! native lock on a participant (from the test process): every driver call of that participant,
//! its shim's included, waits until the test unlocks it, so the tool waits for that participant's
//! answer while the others go on.

mod common;

use common::*;
use protocol::Phase;
use testkit::TestEnv;

#[test]
fn a_copy_failing_during_save_is_rolled_back() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[
            Member::shim("a"),
            Member::shim("b").env("FAKE_CUDA_FAIL", "cuMemcpyDtoHAsync:1"),
        ],
    );
    pair(&tree);
    // Each process's own carrier: the fault is in `b`'s own copy (through a carrier helper, the
    // helper would copy instead).
    let args = suspend_args(&env, tree.root(), &["--carrier", "process"]);
    let run = tool(&env, &strs(&args));
    run.expect_code(EXIT_ROLLED_BACK).stderr_mentions(&[
        &format!("save failed for {}", label(tree.w("b").pid())),
        "cuMemcpyDtoHAsync",
        "rolled back",
    ]);
    assert_running(&env, &tree, &run);
    assert_pair(&env, &tree);
}

#[test]
fn a_release_failing_half_way_is_rolled_back() {
    let env = env();
    // `b` fails releasing its import of `a0` after unmapping it; `a` released everything.
    let tree = Tree::launch(
        &env,
        &[
            Member::shim("a"),
            Member::shim("b").env("FAKE_CUDA_FAIL", "cuMemRelease:1"),
        ],
    );
    pair(&tree);
    let run = suspend(&env, tree.root(), &[]);
    run.expect_code(EXIT_ROLLED_BACK).stderr_mentions(&[
        &format!("release failed for {}", label(tree.w("b").pid())),
        "cuMemRelease",
        "rolled back",
    ]);
    assert_running(&env, &tree, &run);
    assert_pair(&env, &tree);
}

#[test]
fn a_failing_native_lock_is_rolled_back() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    // The tool loads the fake driver too: its first lock fails, then (another run) its second,
    // after the first process was locked (and must be unlocked again).
    for nth in ["1", "2"] {
        let fail = format!("cuCheckpointProcessLock:{nth}");
        let run = suspend(&env, tree.root(), &[("FAKE_CUDA_FAIL", &fail)]);
        run.expect_code(EXIT_ROLLED_BACK).stderr_mentions(&[
            "native lock failed for",
            "cuCheckpointProcessLock",
            "rolled back",
        ]);
        assert_running(&env, &tree, &run);
        assert_pair(&env, &tree);
    }
}

const BIG: u64 = 256 << 20;

/// `d` creates `big` (large enough that its Save takes a while) and shares it with `c` and `i`;
/// `c` creates `a1` and shares it with `d`; `i` only imports.
fn trio(env: &TestEnv) -> Tree {
    let tree = Tree::launch(
        env,
        &[Member::shim("d"), Member::shim("c"), Member::shim("i")],
    );
    let (d, c, i) = (tree.w("d"), tree.w("c"), tree.w("i"));
    create_shared(d, "big", BIG);
    share(d, c, "big", BIG);
    share(d, i, "big", BIG);
    create_shared(c, "a1", SIZE);
    share(c, d, "a1", SIZE);
    ok(d, &["memset big 7", "fill big 21 --len 2M"]);
    ok(
        d,
        &[&format!(
            "fill big 22 --offset {} --len 2M",
            BIG - (2 << 20)
        )],
    );
    ok(c, &["fill a1 23"]);
    tree
}

/// Contents of [`trio`] as seen by `who`.
fn verify_trio(who: &testkit::Workload) {
    ok(
        who,
        &[
            "verify big 21 --len 2M",
            &format!("verify big 22 --offset {} --len 2M", BIG - (2 << 20)),
            &format!("verify big --byte 7 --offset {} --len 2M", 64 << 20),
        ],
    );
}

/// Starts a suspend of [`trio`] (with `extra` arguments) and stops it in its release phase: `d`
/// and `i` released, the tool waiting for `c`, which the test holds with the native lock. Returns
/// the tool (still running).
fn stop_in_release(env: &TestEnv, tree: &Tree, extra: &[&str]) -> ToolProcess {
    let native = env.native().unwrap();
    let (d, c, i) = (tree.w("d").pid(), tree.w("c").pid(), tree.w("i").pid());
    let args = suspend_args(env, tree.root(), extra);
    let tool = start_tool(env, &strs(&args), &[]);
    // Hold `d` in its Save: the tool then waits for it while `c` and `i` finish theirs.
    wait_until("d is frozen", || phase_of(env, d) == Phase::Frozen);
    native.lock(d, 60_000).unwrap();
    wait_until("c and i saved", || {
        phase_of(env, c) == Phase::Saved && phase_of(env, i) == Phase::Saved
    });
    assert_eq!(
        phase_of(env, d),
        Phase::Frozen,
        "d finished its Save of {BIG} bytes before the test's lock landed"
    );
    // Hold `c` too (idle now, the lock is immediate), then let `d` finish: Release goes out to
    // everyone, `c` stays in it.
    native.lock(c, 60_000).unwrap();
    native.unlock(d).unwrap();
    wait_until("d and i released", || {
        phase_of(env, d) == Phase::Released && phase_of(env, i) == Phase::Released
    });
    assert_eq!(phase_of(env, c), Phase::Saved, "c's Release is held");
    assert!(tool.is_running(), "the tool ended while c was held");
    tool
}

#[test]
fn a_participant_that_dies_after_release_began_is_reported_and_the_others_rolled_back() {
    let env = env();
    let mut tree = trio(&env);
    let tool = stop_in_release(&env, &tree, &[]);
    let i = tree.w("i").pid();
    signal(i, rustix::process::Signal::KILL);
    wait_gone(i);
    env.native().unwrap().unlock(tree.w("c").pid()).unwrap();
    let run = tool.finish();
    run.expect_code(EXIT_ROLLED_BACK).stderr_mentions(&[
        &label(i),
        "exited during the capture",
        "rolled back",
    ]);
    tree.workloads.remove("i");
    assert_running(&env, &tree, &run);
    let (d, c) = (tree.w("d"), tree.w("c"));
    verify_trio(d);
    verify_trio(c);
    ok(d, &["verify a1 23", "fill a1 24", "fill big 25 --len 2M"]);
    ok(c, &["verify a1 24", "verify big 25 --len 2M"]);
    assert!(usage(&env, d.pid()) >= BIG, "d holds no memory");
}

#[test]
fn resume_recovers_a_group_whose_tool_was_killed_after_release() {
    resume_recovers_after_a_kill_in_release(&[]);
}

/// The same with the bytes in the carrier helper (`--carrier helper`), which outlives the tool
/// that started it: a new tool run's resume loads them back from it.
#[test]
fn resume_recovers_a_group_carried_by_the_helper_whose_tool_was_killed_after_release() {
    resume_recovers_after_a_kill_in_release(&["--carrier", "helper"]);
}

fn resume_recovers_after_a_kill_in_release(extra: &[&str]) {
    let env = env();
    let tree = trio(&env);
    let mut tool = stop_in_release(&env, &tree, extra);
    signal(tool.pid(), rustix::process::Signal::KILL);
    let _ = tool.child.wait();
    let c = tree.w("c").pid();
    env.native().unwrap().unlock(c).unwrap();
    // `c` finishes the Release the dead tool asked for: the whole group is released, natively
    // running, with its state file.
    wait_until("c released", || phase_of(&env, c) == Phase::Released);
    assert!(
        state_dir(&env).join("cuinterpose.state").exists(),
        "no state file after the tool was killed in release"
    );
    if extra.contains(&"helper") {
        assert!(
            env.control_dir()
                .join(protocol::message::CARRIER_HELPER_SOCKET)
                .exists(),
            "the carrier helper outlives the tool that started it"
        );
    }
    for w in tree.workloads.values() {
        assert_eq!(usage(&env, w.pid()), 0, "{} still holds memory", w.name());
    }

    let run = resume(&env, tree.root());
    let report = run.ok().json();
    assert_eq!(report["saved_bytes"], BIG + SIZE, "{}", run.describe());
    assert_running(&env, &tree, &run);
    for name in ["d", "c", "i"] {
        verify_trio(tree.w(name));
    }
    let (d, c, i) = (tree.w("d"), tree.w("c"), tree.w("i"));
    ok(d, &["verify a1 23"]);
    ok(i, &["fill big 26 --len 2M"]);
    ok(d, &["verify big 26 --len 2M"]);
    ok(c, &["verify big 26 --len 2M", "fill a1 27"]);
    ok(d, &["verify a1 27"]);
    assert!(usage(&env, d.pid()) >= BIG, "d holds no memory");
}

#[test]
fn resume_finishes_a_resume_that_stopped_between_native_restore_and_unlock() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let run = suspend(&env, tree.root(), &[]);
    run.ok();
    // As a resume killed half way leaves it: `a` restored natively (LOCKED), `b` still
    // CHECKPOINTED, both shims released.
    let native = env.native().unwrap();
    let a = tree.w("a").pid();
    native.restore(a, &[]).unwrap();
    assert_eq!(
        native.state(a).unwrap(),
        testkit::native::ProcessState::Locked
    );
    let run = resume(&env, tree.root());
    run.ok();
    assert_running(&env, &tree, &run);
    assert_pair(&env, &tree);
}
