//! The default carrier (`--carrier auto`) with the real binary on the fake driver: the carrier
//! helper where the machine allows it, each process's own carrier where `RLIMIT_MEMLOCK` is too
//! small for the helper's pinning or a device has no room for the helper's context (the fake's
//! `FAKE_CUDA_DEVICE_MEMORY`), and `--carrier helper` refused where there is no room; the report
//! and `inspect` say which carrier and why, and what it costs.

mod common;

use common::*;
use protocol::message::CARRIER_HELPER_SOCKET;
use serde_json::Value;
use testkit::TestEnv;

/// One process holding a 4 MiB `cuMemAlloc` allocation filled with 13.
fn one_process(env: &TestEnv) -> Tree {
    let tree = Tree::launch(env, &[Member::shim("a")]);
    ok(tree.w("a"), &["malloc m 4M", "fill m 13"]);
    tree
}

/// The tool with `args`, its `RLIMIT_MEMLOCK` (soft and hard) set to `memlock` bytes and without
/// `CAP_IPC_LOCK` (with which the kernel applies no limit: the tests run as root).
fn tool_memlock(env: &TestEnv, memlock: u64, args: &[String]) -> ToolRun {
    tool_memlock_with(env, memlock, args, &[], false)
}

/// [`tool_memlock`] with the environment `extra`, keeping `CAP_IPC_LOCK` if `ipc_lock` (and the
/// tool has it).
fn tool_memlock_with(
    env: &TestEnv,
    memlock: u64,
    args: &[String],
    extra: &[(&str, &str)],
    ipc_lock: bool,
) -> ToolRun {
    // prlimit sets the limit on itself, then execs setpriv, which drops CAP_IPC_LOCK from the
    // bounding set (root's exec then leaves it out of every set) and execs the tool; the tool
    // inherits both.
    let mut command = env
        .command(std::path::Path::new("prlimit"), false)
        .expect("tool environment");
    command
        .arg(format!("--memlock={memlock}:{memlock}"))
        .arg("--")
        .args(["setpriv", "--bounding-set"])
        .arg(if ipc_lock { "+ipc_lock" } else { "-ipc_lock" })
        .arg("--")
        .arg(tool_path(env))
        .args(args)
        .envs(extra.iter().copied());
    let output = command.output().expect("running prlimit");
    ToolRun {
        args: args.to_vec(),
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `inspect --pid ROOT --state-dir DIR --driver FAKE --json` (the suspend's arguments).
fn inspect(env: &TestEnv, root: u32) -> Value {
    let mut args = suspend_args(env, root, &[]);
    args[0] = "inspect".into();
    tool(env, &strs(&args)).ok().json()
}

fn helper_socket(env: &TestEnv) -> std::path::PathBuf {
    env.control_dir().join(CARRIER_HELPER_SOCKET)
}

#[test]
fn the_default_is_the_carrier_helper_once_prepared_where_the_machine_allows_it() {
    let env = env();
    let tree = one_process(&env);
    let root = tree.root();
    // Not prepared: a helper started by the suspend would pin its carrier inside it, slower
    // than each process's own staged carrier for that cycle (measured on the GPU).
    let before = inspect(&env, root);
    assert_eq!(before["carrier"]["carrier"], "process", "{before:#}");
    let why = before["carrier"]["reason"].as_str().unwrap_or_default();
    assert!(why.contains("not prepared"), "{why}");
    let run = tool_memlock(&env, 8 << 20, &suspend_args(&env, root, &[]));
    let carrier = run.ok().json()["carrier"].clone();
    assert_eq!(carrier["carrier"], "process", "{}", run.describe());
    assert!(
        carrier["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cuinterpose prepare")),
        "{carrier:#}"
    );
    assert_eq!(carrier["pinned_host_bytes"], 0, "{carrier:#}");
    assert!(!helper_socket(&env).exists(), "a helper was started");
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 13"]);

    // Prepared (within an 8 MiB RLIMIT_MEMLOCK, 4 MiB may be pinned): the helper carries the
    // bytes from the first suspend on.
    let prepared = tool_memlock(&env, 8 << 20, &prepare_args(&env, root))
        .ok()
        .json();
    assert_eq!(prepared["carrier"]["carrier"], "helper", "{prepared:#}");
    assert!(
        prepared["carrier"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the fastest")),
        "{prepared:#}"
    );
    let run = tool_memlock(&env, 8 << 20, &suspend_args(&env, root, &[]));
    let report = run.ok().json();
    let carrier = &report["carrier"];
    assert_eq!(carrier["carrier"], "helper", "{}", run.describe());
    assert_eq!(carrier["requested"], "auto");
    assert!(
        carrier["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("the fastest"),
        "{carrier:#}"
    );
    // The measured cost: the helper's carrier of this process, and its context's room.
    assert!(
        carrier["pinned_host_bytes"].as_u64() >= Some(4 << 20),
        "{carrier:#}"
    );
    assert_eq!(carrier["helper_gpu_bytes"], 560u64 << 20);
    assert!(helper_socket(&env).exists(), "no helper was started");
    // Prepared ahead: the Save found the helper's carrier made and pinned.
    assert_eq!(carrier["save"]["carriers_reused"], true, "{carrier:#}");
    let suspended = inspect(&env, root);
    assert_eq!(suspended["carrier"]["carrier"], "helper", "{suspended:#}");
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 13"]);

    // The next cycle finds the helper running, says so, and prints it in the human report.
    let mut args = suspend_args(&env, root, &[]);
    args.retain(|a| a != "--json");
    let run = tool_memlock(&env, 8 << 20, &args);
    assert!(
        run.ok().stdout.contains("carrier cost: "),
        "{}",
        run.describe()
    );
    assert!(
        run.ok()
            .stdout
            .contains("carrier: helper: the fastest: the carrier helper already runs"),
        "{}",
        run.describe()
    );
    assert!(run.stdout.contains("carrier cost: "), "{}", run.describe());
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 13"]);
}

#[test]
fn a_tool_with_cap_ipc_lock_is_not_held_to_the_memlock_limit() {
    if !rustix::thread::capabilities(None).is_ok_and(|caps| {
        caps.effective
            .contains(rustix::thread::CapabilitySet::IPC_LOCK)
    }) {
        eprintln!("skipped: the tests run without CAP_IPC_LOCK (not as root)");
        return;
    }
    let env = env();
    let tree = one_process(&env);
    let root = tree.root();
    // The limit that makes the tool without the capability fall back (below) does not apply:
    // the kernel lets a process with CAP_IPC_LOCK pin past RLIMIT_MEMLOCK, and the helper
    // inherits the tool's capabilities.
    let run = tool_memlock_with(&env, 1 << 20, &prepare_args(&env, root), &[], true);
    let prepared = run.ok().json();
    assert_eq!(
        prepared["carrier"]["carrier"],
        "helper",
        "{}",
        run.describe()
    );
    assert!(helper_socket(&env).exists(), "no helper was started");
    let run = tool_memlock_with(&env, 1 << 20, &suspend_args(&env, root, &[]), &[], true);
    let report = run.ok().json();
    assert_eq!(report["carrier"]["carrier"], "helper", "{}", run.describe());
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 13"]);
}

#[test]
fn too_small_a_memlock_limit_falls_back_to_each_process_carrier() {
    let env = env();
    let tree = one_process(&env);
    let root = tree.root();
    let run = tool_memlock(&env, 1 << 20, &suspend_args(&env, root, &[]));
    let report = run.ok().json();
    let carrier = &report["carrier"];
    assert_eq!(carrier["carrier"], "process", "{}", run.describe());
    let why = carrier["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("RLIMIT_MEMLOCK is 1 MiB and the helper would pin 4 MiB"),
        "{why}"
    );
    // A plain cycle stages: nothing held pinned, no helper context.
    assert_eq!(carrier["pinned_host_bytes"], 0, "{carrier:#}");
    assert_eq!(carrier["helper_gpu_bytes"], 0, "{carrier:#}");
    assert!(!helper_socket(&env).exists(), "a helper was started");
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 13"]);
}

#[test]
fn no_room_for_the_helper_context_falls_back_and_an_explicit_helper_is_refused() {
    // 64 MiB devices: 60 MiB stay free beside the process's 4 MiB, far less than the helper's
    // context needs.
    let env = env().env("FAKE_CUDA_DEVICE_MEMORY", "64M");
    let tree = one_process(&env);
    let root = tree.root();
    let before = inspect(&env, root);
    assert_eq!(before["carrier"]["carrier"], "process", "{before:#}");

    let refused = tool(
        &env,
        &strs(&suspend_args(&env, root, &["--carrier", "helper"])),
    );
    refused.expect_code(EXIT_REFUSED);
    assert!(
        refused
            .stderr
            .contains("--carrier helper refused, nothing was changed")
            && refused
                .stderr
                .contains("device 0 has 60 MiB free of 64 MiB"),
        "{}",
        refused.describe()
    );
    assert!(!helper_socket(&env).exists(), "a helper was started");
    ok(tree.w("a"), &["verify m 13", "fill m 14"]);

    // Prepare finds no room for the helper's context: nothing is started or pinned ahead, and
    // it names the device; the suspend then keeps each process's own carrier.
    let run = tool(&env, &strs(&prepare_args(&env, root)));
    let prepared = run.ok().json();
    assert_eq!(prepared["carrier"]["carrier"], "process", "{prepared:#}");
    let why = prepared["carrier"]["reason"].as_str().unwrap_or_default();
    assert!(why.contains("device 0 has 60 MiB free"), "{why}");
    let run = tool(&env, &strs(&suspend_args(&env, root, &[])));
    let report = run.ok().json();
    assert_eq!(
        report["carrier"]["carrier"],
        "process",
        "{}",
        run.describe()
    );
    assert!(!helper_socket(&env).exists(), "a helper was started");
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 14"]);
}

fn prepare_args(env: &TestEnv, root: u32) -> Vec<String> {
    vec![
        "prepare".into(),
        "--pid".into(),
        root.to_string(),
        "--driver".into(),
        fake_driver(env).display().to_string(),
        "--json".into(),
    ]
}

#[test]
fn prepare_pins_the_carriers_ahead_so_the_first_suspend_pins_nothing() {
    let env = env();
    let tree = one_process(&env);
    let root = tree.root();
    let run = tool_memlock(&env, 8 << 20, &prepare_args(&env, root));
    let prepared = run.ok().json();
    assert_eq!(prepared["carrier"]["carrier"], "helper", "{prepared:#}");
    let process = &prepared["processes"][0];
    assert_eq!(process["bytes"], 4u64 << 20, "{prepared:#}");
    assert!(
        process["pinned_bytes"].as_u64() >= Some(4 << 20),
        "{prepared:#}"
    );
    assert!(process["skipped"].is_null(), "{prepared:#}");
    assert!(helper_socket(&env).exists(), "prepare started no helper");
    // The application runs on while and after its carrier is prepared.
    ok(tree.w("a"), &["verify m 13", "fill m 15"]);

    // The first suspend finds its carrier made and pinned: the Save pins nothing.
    let run = tool_memlock(&env, 8 << 20, &suspend_args(&env, root, &[]));
    let report = run.ok().json();
    let carrier = &report["carrier"];
    assert_eq!(carrier["carrier"], "helper", "{}", run.describe());
    assert_eq!(carrier["save"]["carriers_reused"], true, "{carrier:#}");
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 15"]);

    // A carrier that exists may hold a suspension's bytes: prepare never grows it (the next
    // Save does), and says so.
    ok(tree.w("a"), &["malloc n 4M", "fill n 16"]);
    let run = tool_memlock(&env, 8 << 20, &prepare_args(&env, root));
    let prepared = run.ok().json();
    let process = &prepared["processes"][0];
    assert_eq!(process["pinned_bytes"], 0, "{prepared:#}");
    assert!(
        process["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("already has a carrier")),
        "{prepared:#}"
    );
    tool_memlock(&env, 8 << 20, &suspend_args(&env, root, &[])).ok();
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 15", "verify n 16"]);
}

#[test]
fn prepare_keeps_to_its_budget_and_pins_nothing_for_process_carriers() {
    let env = env();
    let tree = one_process(&env);
    let root = tree.root();
    // A 2 MiB budget holds no 4 MiB carrier: left to the first suspend.
    let run = tool_memlock_with(
        &env,
        8 << 20,
        &prepare_args(&env, root),
        &[("CUINTERPOSE_PIN_AHEAD_MIB", "2")],
        false,
    );
    let prepared = run.ok().json();
    let process = &prepared["processes"][0];
    assert_eq!(process["pinned_bytes"], 0, "{prepared:#}");
    assert!(
        process["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("beyond the budget")),
        "{prepared:#}"
    );

    // Where the machine allows no helper, nothing is pinned ahead, and it says why.
    let run = tool_memlock(&env, 1 << 20, &prepare_args(&env, root));
    let prepared = run.ok().json();
    assert_eq!(prepared["carrier"]["carrier"], "process", "{prepared:#}");
    assert!(
        prepared["nothing_to_pin"]
            .as_str()
            .is_some_and(|s| s.contains("nothing is pinned ahead")),
        "{prepared:#}"
    );
    ok(tree.w("a"), &["verify m 13"]);
}

#[test]
fn prepare_for_keep_contexts_pins_each_process_carrier_ahead() {
    let keep = |args: &mut Vec<String>| args.push("--keep-contexts".into());
    // Unprepared: the first keep-contexts Save makes and pins its carrier.
    let other = env();
    let unprepared = one_process(&other);
    let run = tool_memlock(
        &other,
        8 << 20,
        &suspend_args(&other, unprepared.root(), &["--keep-contexts"]),
    );
    let report = run.ok().json();
    assert_eq!(report["carrier"]["carrier"], "process", "{report:#}");
    assert_eq!(
        report["carrier"]["save"]["carriers_reused"], false,
        "{report:#}"
    );
    resume(&other, unprepared.root()).ok();
    ok(unprepared.w("a"), &["verify m 13"]);

    let env = env();

    // Prepared: each shim pinned its own carrier while the application ran, and no helper was
    // started; the first keep-contexts Save pins nothing.
    let tree = one_process(&env);
    let root = tree.root();
    let mut args = prepare_args(&env, root);
    keep(&mut args);
    let prepared = tool_memlock(&env, 8 << 20, &args).ok().json();
    assert_eq!(prepared["carrier"]["carrier"], "process", "{prepared:#}");
    let process = &prepared["processes"][0];
    assert_eq!(process["bytes"], 4u64 << 20, "{prepared:#}");
    assert!(
        process["pinned_bytes"].as_u64() >= Some(4 << 20),
        "{prepared:#}"
    );
    assert!(process["skipped"].is_null(), "{prepared:#}");
    assert!(
        !helper_socket(&env).exists(),
        "a keep-contexts preparation started a helper"
    );
    ok(tree.w("a"), &["verify m 13", "fill m 15"]);
    let run = tool_memlock(
        &env,
        8 << 20,
        &suspend_args(&env, root, &["--keep-contexts"]),
    );
    let report = run.ok().json();
    assert_eq!(report["carrier"]["carrier"], "process", "{report:#}");
    assert_eq!(
        report["carrier"]["save"]["carriers_reused"], true,
        "{report:#}"
    );
    resume(&env, root).ok();
    ok(tree.w("a"), &["verify m 15"]);

    // Where RLIMIT_MEMLOCK leaves the carrier unpinned, nothing is pinned ahead, and it says why.
    let prepared = tool_memlock(&env, 1 << 20, &args).ok().json();
    assert!(
        prepared["nothing_to_pin"]
            .as_str()
            .is_some_and(|s| s.contains("RLIMIT_MEMLOCK")),
        "{prepared:#}"
    );
    assert_eq!(prepared["processes"].as_array().map(Vec::len), Some(0));
    ok(tree.w("a"), &["verify m 15"]);
}
