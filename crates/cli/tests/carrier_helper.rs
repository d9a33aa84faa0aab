//! `cuinterpose suspend --carrier helper` with the real binary on the fake driver: the tool
//! starts the carrier helper of the control directory, the shims save through it (it imports each
//! allocation, copies it into memory it keeps pinned and releases the import), the native
//! checkpoint finds nothing of theirs, and the resume copies the bytes back from it; the next
//! cycle reuses the same helper and its carriers; a helper killed while it holds the bytes, or in
//! the middle of a Load, loses nothing (each process holds its carrier's memfd, and loads from it),
//! and `inspect` shows the helper and its health; the helper gives a carrier back when its
//! process exits, and exits when it holds none.

mod common;

use common::*;
use protocol::message::CARRIER_HELPER_SOCKET;
use std::path::PathBuf;
use testkit::TestEnv;

/// `suspend --carrier helper` of the group under `root`, with the state in the test's directory.
fn helper_suspend(env: &TestEnv, root: u32, keep_contexts: bool) -> ToolRun {
    let mut options = vec!["--carrier", "helper"];
    if keep_contexts {
        options.push("--keep-contexts");
    }
    let args = suspend_args(env, root, &options);
    tool(env, &strs(&args))
}

/// The pid of the carrier helper listening in the environment's control directory.
fn helper_pid(env: &TestEnv) -> Option<u32> {
    let socket = env.control_dir().join(CARRIER_HELPER_SOCKET);
    let wanted = socket.display().to_string();
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                // The tool names the socket through a participant's `/proc/PID/root`.
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.contains(&&b"carrier-helper"[..])
                    && args.iter().any(|a| a.ends_with(wanted.as_bytes()))
            })
        })
        .filter(|pid| alive(*pid))
}

fn helper_log(env: &TestEnv) -> String {
    let path: PathBuf = env.control_dir().join("cuinterpose-carrier.log");
    std::fs::read_to_string(&path).unwrap_or_default()
}

/// `a` and `b` share both ways; `a` also holds a private allocation made without a shareable
/// handle type, which the helper cannot import: `a` saves into its own carrier then.
fn build(tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    create_shared(a, "a0", SIZE);
    create_shared(b, "a1", SIZE);
    share(a, b, "a0", SIZE);
    share(b, a, "a1", SIZE);
    ok(
        a,
        &[
            "fill a0 11",
            "create p 2M --handle-types none",
            "reserve r-p 2M",
            "map p r-p",
            "set-access p --device 0",
            "fill p 15",
        ],
    );
    // Owned `cuMemAlloc` memory: made with a POSIX descriptor handle type, so it goes through
    // the helper like the shared allocations.
    ok(b, &["fill a1 12", "malloc m 2M", "fill m 13"]);
}

fn assert_intact(tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    ok(a, &["verify a0 11", "verify a1 12", "verify p 15"]);
    ok(b, &["verify a0 11", "verify a1 12", "verify m 13"]);
    ok(b, &["fill a0 14"]);
    ok(a, &["verify a0 14", "fill a0 11"]);
}

#[test]
fn a_group_saves_through_the_carrier_helper_cycle_after_cycle() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    build(&tree);
    let (a, b) = (tree.w("a"), tree.w("b"));
    let before = [regions(a), regions(b)];
    assert_eq!(helper_pid(&env), None);

    let run = helper_suspend(&env, tree.root(), false);
    let report = run.ok().json();
    assert_eq!(
        report["saved_bytes"],
        2 * SIZE + (4 << 20),
        "{}",
        run.describe()
    );
    let helper = helper_pid(&env).unwrap_or_else(|| {
        panic!(
            "no carrier helper in {}; its log: {}; {}",
            env.control_dir().display(),
            helper_log(&env),
            run.describe()
        )
    });
    for w in [a, b] {
        assert_eq!(
            usage(&env, w.pid()),
            0,
            "{} natively checkpointed",
            w.name()
        );
    }
    resume(&env, tree.root()).ok();
    assert_eq!([regions(a), regions(b)], before, "addresses changed");
    assert_intact(&tree);

    // The next cycles find the same helper, with the group's carriers kept, and a keep-contexts
    // cycle goes through it too.
    for keep_contexts in [false, true] {
        helper_suspend(&env, tree.root(), keep_contexts).ok();
        assert_eq!(
            helper_pid(&env),
            Some(helper),
            "one helper per control directory"
        );
        resume(&env, tree.root()).ok();
        assert_intact(&tree);
    }
    let log = helper_log(&env);
    assert!(log.contains("carrier helper on"), "{log}");

    // Once the group has exited, the helper gives its carriers back and exits by itself.
    let pids = tree.pids();
    drop(tree);
    for pid in pids {
        wait_gone(pid);
    }
    wait_until("the carrier helper exits", || !alive(helper));
    let log = helper_log(&env);
    assert!(log.contains("its carrier is given back"), "{log}");
    assert!(!env.control_dir().join(CARRIER_HELPER_SOCKET).exists());
}

/// `a` and `b` share both ways and each holds a `cuMemAlloc` allocation: every byte of both goes
/// through the helper (no private allocation that would keep one in its own carrier).
fn build_through_helper(tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    create_shared(a, "a0", SIZE);
    create_shared(b, "a1", SIZE);
    share(a, b, "a0", SIZE);
    share(b, a, "a1", SIZE);
    ok(a, &["fill a0 21", "malloc ma 2M", "fill ma 23"]);
    ok(b, &["fill a1 22", "malloc mb 2M", "fill mb 24"]);
}

fn assert_through_helper_intact(tree: &Tree) {
    let (a, b) = (tree.w("a"), tree.w("b"));
    ok(a, &["verify a0 21", "verify a1 22", "verify ma 23"]);
    ok(b, &["verify a0 21", "verify a1 22", "verify mb 24"]);
    ok(b, &["fill a1 25"]);
    ok(a, &["verify a1 25"]);
    ok(b, &["fill a1 22"]);
}

/// `inspect --json` of the tree: its `carrier_helpers`.
fn inspected_helpers(env: &TestEnv, root: u32) -> Vec<serde_json::Value> {
    let root = root.to_string();
    let run = tool(env, &["inspect", "--pid", &root, "--json"]);
    let report = run.ok().json();
    report["carrier_helpers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Sends one phase request to the shim of `pid` directly, as a tool run would before it was
/// killed.
fn send_phase(env: &TestEnv, pid: u32, request: protocol::Request) -> protocol::Phase {
    let path = control_socket(env, pid);
    let mut conn = transport::Connection::connect(&path, std::time::Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("control socket of pid {pid}: {e}"));
    match conn.call(&request) {
        Ok((protocol::Response::PhaseDone { phase, .. }, _)) => phase,
        other => panic!("{request:?} to pid {pid}: {other:?}"),
    }
}

#[test]
fn a_carrier_helper_killed_while_it_holds_the_bytes_loses_nothing() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    build_through_helper(&tree);
    let (a, b) = (tree.w("a"), tree.w("b"));
    let before = [regions(a), regions(b)];
    helper_suspend(&env, tree.root(), false).ok();
    let helper = helper_pid(&env).expect("a carrier helper");

    // inspect names the helper, alive, and what each process saved there and holds itself.
    let helpers = inspected_helpers(&env, tree.root());
    assert_eq!(helpers.len(), 1, "{helpers:?}");
    assert_eq!(helpers[0]["pid"], helper, "{helpers:?}");
    assert_eq!(helpers[0]["alive"], true, "{helpers:?}");
    let socket = env.control_dir().join(CARRIER_HELPER_SOCKET);
    assert!(
        helpers[0]["socket"]
            .as_str()
            .is_some_and(|s| s.ends_with(&socket.display().to_string())),
        "{helpers:?}"
    );
    let clients = helpers[0]["processes"].as_array().unwrap();
    assert_eq!(clients.len(), 2, "{helpers:?}");
    for c in clients {
        assert_eq!(c["allocations"], 2, "{helpers:?}");
        assert_eq!(c["bytes"], SIZE + (2 << 20), "{helpers:?}");
        assert!(
            c["held_bytes"].as_u64() >= c["bytes"].as_u64(),
            "{helpers:?}"
        );
    }

    signal(helper, rustix::process::Signal::KILL);
    wait_gone(helper);
    let helpers = inspected_helpers(&env, tree.root());
    assert_eq!(helpers[0]["pid"], helper, "{helpers:?}");
    assert_eq!(helpers[0]["alive"], false, "{helpers:?}");
    assert!(
        helpers[0]["health"]
            .as_str()
            .is_some_and(|h| h.contains("gone") && h.contains("own copy")),
        "{helpers:?}"
    );
    let root = tree.root().to_string();
    let text = tool(&env, &["inspect", "--pid", &root]);
    let stdout = &text.ok().stdout;
    assert!(
        stdout.contains(&format!("carrier helper: pid {helper}")) && stdout.contains("gone"),
        "{stdout}"
    );

    // The resume loads from the processes' own copies of the helper's carrier.
    resume(&env, tree.root()).ok();
    assert_eq!([regions(a), regions(b)], before, "addresses changed");
    assert_through_helper_intact(&tree);
    assert!(inspected_helpers(&env, tree.root()).is_empty());

    // A new cycle starts a new helper and goes through it.
    helper_suspend(&env, tree.root(), false).ok();
    let second = helper_pid(&env).expect("a new carrier helper");
    assert_ne!(second, helper);
    resume(&env, tree.root()).ok();
    assert_through_helper_intact(&tree);
}

#[test]
fn a_load_whose_carrier_helper_dies_in_the_middle_is_finished_by_resume() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    build_through_helper(&tree);
    let (a, b) = (tree.w("a"), tree.w("b"));
    let before = [regions(a), regions(b)];
    // The helper inherits the suspend's environment: the fake driver kills it inside its first
    // copy back to a device, in the middle of the first Load that reaches it.
    let dies_in_load = [("FAKE_CUDA_FAIL", "cuMemcpyHtoDAsync:1=die")];
    let suspend_dying = |keep_contexts: bool| {
        let mut options = vec!["--carrier", "helper"];
        if keep_contexts {
            options.push("--keep-contexts");
        }
        let args = suspend_args(&env, tree.root(), &options);
        tool_with(&env, &strs(&args), &dies_in_load).ok();
        helper_pid(&env).expect("a carrier helper")
    };

    // A resume killed after `a`'s Load, whose helper died during it: `a` is loaded (from its
    // own copy), `b` is not, the helper is gone. `resume` again finishes.
    let helper = suspend_dying(true);
    assert_eq!(
        send_phase(&env, a.pid(), protocol::Request::Load),
        protocol::Phase::Loaded
    );
    wait_gone(helper);
    assert_eq!(phase_of(&env, b.pid()), protocol::Phase::Released);
    resume(&env, tree.root()).ok();
    assert_eq!([regions(a), regions(b)], before, "addresses changed");
    assert_through_helper_intact(&tree);

    // A whole resume whose helper dies during its Load, with the native checkpoint.
    let helper = suspend_dying(false);
    resume(&env, tree.root()).ok();
    wait_gone(helper);
    assert_eq!([regions(a), regions(b)], before, "addresses changed");
    assert_through_helper_intact(&tree);
    let log = helper_log(&env);
    assert!(
        log.contains("dying in call 1 of cuMemcpyHtoDAsync"),
        "{log}"
    );
}

#[test]
fn a_carrier_helper_that_cannot_start_refuses_the_suspend_and_changes_nothing() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    build(&tree);
    // A directory where the socket cannot be made: the control directory's socket path is
    // taken by a regular file, so the helper cannot bind and exits.
    std::fs::write(
        env.control_dir().join(CARRIER_HELPER_SOCKET),
        b"not a socket",
    )
    .unwrap();
    let run = helper_suspend(&env, tree.root(), false);
    run.expect_code(3)
        .stderr_mentions(&["carrier helper", "nothing was changed"]);
    for w in [tree.w("a"), tree.w("b")] {
        assert_eq!(
            phase_of(&env, w.pid()),
            protocol::Phase::Running,
            "{}",
            w.name()
        );
    }
    assert_intact(&tree);
}
