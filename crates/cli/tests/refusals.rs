//! Every refusal of `cuinterpose suspend` (exit 3): the process and the reason named, nothing
//! changed, the workload still running and sharing. Fake driver only (multicast among them).

mod common;

use common::*;
use testkit::TestEnv;

/// The helper processes of this file (see `common::helper`).
#[test]
#[ignore = "helper process, started by the tests of this file"]
fn helper_process() {
    common::helper::main();
}

/// After a refusal: no state file, every shim still running, the contents kept, and new writes
/// visible both ways.
fn assert_untouched(env: &TestEnv, tree: &Tree, run: &ToolRun) {
    assert!(
        !state_dir(env).join("cuinterpose.state").exists(),
        "a refused suspend left a state file; {}",
        run.describe()
    );
    let report = tool(
        env,
        &["inspect", "--pid", &tree.root().to_string(), "--json"],
    );
    for s in report.ok().json()["snapshots"].as_array().unwrap() {
        assert_eq!(
            s["record"]["phase"], "Running",
            "a shim is not running after the refusal: {s:#}"
        );
    }
    let (a, b) = (tree.w("a"), tree.w("b"));
    for w in [a, b] {
        assert!(
            usage(env, w.pid()) >= SIZE,
            "{} lost its memory after the refusal",
            w.name()
        );
    }
    ok(a, &["verify a0 11", "verify a1 12"]);
    ok(b, &["verify a0 11", "verify a1 12", "fill a0 13"]);
    ok(a, &["verify a0 13", "fill a1 14"]);
    ok(b, &["verify a1 14"]);
}

#[test]
fn a_cuda_process_without_the_shim_is_refused() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[Member::shim("a"), Member::shim("b"), Member::plain("c")],
    );
    pair(&tree);
    ok(tree.w("c"), &["create x 2M --handle-types none"]);
    let c = tree.w("c").pid();
    let run = expect_refusal(
        &env,
        &tree,
        &[(c, "does not have libcuinterpose.so loaded")],
    );
    assert_untouched(&env, &tree, &run);
}

#[test]
fn a_live_foreign_import_is_refused() {
    let env = env();
    // The exporter runs without the shim, outside the tree; the importer is a shim process.
    let foreign = env
        .spawn(testkit::WorkloadOptions::new("x").shim(false))
        .unwrap();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    create_shared(&foreign, "f", SIZE);
    share(&foreign, tree.w("a"), "f", SIZE);
    ok(&foreign, &["fill f 21"]);
    ok(tree.w("a"), &["verify f 21"]);
    let run = expect_refusal(&env, &tree, &[(tree.w("a").pid(), "foreign import")]);
    assert_untouched(&env, &tree, &run);
    // The foreign sharing still works both ways.
    ok(tree.w("a"), &["verify f 21", "fill f 22"]);
    ok(&foreign, &["verify f 22"]);
}

#[test]
fn fabric_handles_exported_and_imported_are_refused() {
    let env = env();
    let mut tree = Tree::launch(
        &env,
        &[
            Member::shim("a"),
            Member::shim("b"),
            Member::helper("fab", "fabric-import", true),
        ],
    );
    pair(&tree);
    let a = tree.w("a");
    ok(
        a,
        &[
            "create fab 2M --handle-types fabric",
            "reserve r-fab 2M",
            "map fab r-fab",
            "set-access fab --device 0",
            "fill fab 31",
        ],
    );
    let exported = a.ok("export fab --type fabric").unwrap();
    let hex = exported.str("fabric").expect("fabric handle").to_string();
    let dir = env.dir().join("helper-fab");
    std::fs::write(dir.join("fabric.tmp"), format!("{hex}\n")).unwrap();
    std::fs::rename(dir.join("fabric.tmp"), dir.join(helper::FABRIC_FILE)).unwrap();
    let importer = tree.helper(&env, "fab");
    let run = expect_refusal(
        &env,
        &tree,
        &[
            (tree.w("a").pid(), "exported allocation"),
            (
                importer,
                "imported an allocation (size unknown until mapped) with unsupported handle type 0x8",
            ),
        ],
    );
    assert_untouched(&env, &tree, &run);
    ok(tree.w("a"), &["verify fab 31"]);
    assert!(alive(importer), "the FABRIC importer died");
}

#[test]
fn legacy_ipc_export_and_open_mapping_are_refused() {
    let env = env();
    // With cuMemAlloc left to the driver, legacy IPC is the driver's (owned memory's is the
    // shim's: tests/legacy_ipc.rs).
    let native = |name| Member::shim(name).env("CUINTERPOSE_ALLOC", "native");
    let tree = Tree::launch(&env, &[native("a"), native("b")]);
    pair(&tree);
    let (a, b) = (tree.w("a"), tree.w("b"));
    ok(a, &["malloc m 2M", "fill m 41", "ipc-get h m"]);
    ok(a, &[&format!("send-ipc h --to {}", b.socket().display())]);
    ok(b, &["wait ipc h", "ipc-open h", "verify h 41"]);
    let run = expect_refusal(
        &env,
        &tree,
        &[
            (a.pid(), "exported legacy CUDA IPC memory"),
            (b.pid(), "legacy CUDA IPC memory open"),
        ],
    );
    assert_untouched(&env, &tree, &run);
    ok(a, &["fill m 42"]);
    ok(b, &["verify h 42"]);
}

#[test]
fn a_multicast_object_with_an_incomplete_team_is_refused() {
    let env = env();
    let mut tree = Tree::launch(
        &env,
        &[
            Member::shim("a"),
            Member::shim("b"),
            Member::helper("mc", "multicast", true),
        ],
    );
    let mc = tree.helper(&env, "mc");
    pair(&tree);
    let run = expect_refusal(
        &env,
        &tree,
        &[(mc, "whose team is incomplete: 0 of 1 devices")],
    );
    assert_untouched(&env, &tree, &run);
    assert!(alive(mc), "the multicast process died");
}

#[test]
fn a_participant_that_does_not_answer_is_refused_within_the_timeout() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let b = tree.w("b").pid();
    // `b`'s shim stops answering: its socket file is moved aside and a listener that never
    // reads takes its path (the tool finds the path among `b`'s sockets and connects there). A
    // stopped process is named as stopped instead (faults.rs).
    let socket = control_socket(&env, b);
    let aside = socket.with_extension("aside");
    std::fs::rename(&socket, &aside).unwrap();
    let silent = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // The knob keeps the test short; the default (10 s) is bounded the same way, see inspect.
    let run = suspend(
        &env,
        tree.root(),
        &[("CUINTERPOSE_ANSWER_TIMEOUT_MS", "1500")],
    );
    run.expect_code(EXIT_REFUSED);
    assert!(
        run.stderr
            .lines()
            .any(|l| l.trim_start().starts_with(&label(b))
                && l.contains("does not answer on its control socket (no reply within 1.5s)")),
        "{}",
        run.describe()
    );
    let inspect = tool(
        &env,
        &["inspect", "--pid", &tree.root().to_string(), "--json"],
    );
    let report = inspect.ok().json();
    let refusals = report["refusals"].as_array().unwrap();
    assert!(
        refusals.iter().any(|r| r["process"]
            .as_str()
            .is_some_and(|p| p.starts_with(&label(b)))
            && r["reason"].as_str().is_some_and(|r| r.contains("10s"))),
        "{report:#}"
    );
    drop(silent);
    std::fs::remove_file(&socket).unwrap();
    std::fs::rename(&aside, &socket).unwrap();
    assert_untouched(&env, &tree, &run);
}

#[test]
fn a_tracked_call_in_flight_is_refused() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let a = tree.w("a");
    // The driver's own lock (taken here, in the test) holds every driver call of `a`: a tracked
    // call made now stays inside the shim until the unlock, as a slow driver call would.
    let native = env.native().unwrap();
    native.lock(a.pid(), 60_000).unwrap();
    let pid = a.pid();
    let stuck = std::thread::scope(|scope| {
        let call = scope.spawn(|| a.cmd("create late 2M --handle-types posix"));
        wait_until("the tracked call is in flight", || {
            let run = tool(&env, &["inspect", "--pid", &pid.to_string(), "--json"]);
            run.ok().json()["snapshots"][0]["record"]["calls_in_flight"] == 1
        });
        let run = expect_refusal(&env, &tree, &[(pid, "1 tracked CUDA call(s) in flight")]);
        native.unlock(pid).unwrap();
        let reply = call.join().unwrap().unwrap();
        assert!(reply.ok, "the held call failed after the unlock: {reply:?}");
        run
    });
    assert_untouched(&env, &tree, &stuck);
}

#[test]
fn a_shim_of_another_protocol_version_is_refused() {
    let env = env();
    let mut tree = Tree::launch(
        &env,
        &[
            Member::shim("a"),
            Member::shim("b"),
            Member::helper("old", "old-shim", true),
        ],
    );
    let old = tree.helper(&env, "old");
    pair(&tree);
    let run = expect_refusal(&env, &tree, &[(old, "protocol version mismatch")]);
    assert!(
        run.stderr
            .contains("tool and shim must be the same version"),
        "{}",
        run.describe()
    );
    assert_untouched(&env, &tree, &run);
}
