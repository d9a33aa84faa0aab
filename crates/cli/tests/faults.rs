//! Fault injection against the real binary on the fake driver, with real processes, sockets and
//! (for checkpoints to disk) the real CRIU: each numbered failure of issue 13 as a test, plus the
//! smaller ones. Every test checks that the workload is back (or cleaned up) with the documented
//! command, and what the tool said.
//!
//! Steps are held without timing where it matters: the test takes the fake driver's own native
//! lock on a participant (every driver call of it, its shim's included, waits until the test
//! unlocks it), as rollback.rs does. Tests with a PID namespace or CRIU need root, as disk.rs.

mod common;

use common::*;
use protocol::{Phase, Request, Response};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};
use testkit::{TestEnv, Workload};

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

// ---- 3: one tool run per group at a time ----

#[test]
fn a_second_run_on_a_group_is_refused_at_once_naming_the_run_in_progress() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let (a, b) = (tree.w("a").pid(), tree.w("b").pid());
    let native = env.native().unwrap();
    // `a`'s drain waits for the test's native lock: the first suspend stays in progress, with
    // the whole group held.
    native.lock(a, 60_000).unwrap();
    let first = start_tool(&env, &strs(&suspend_args(&env, tree.root(), &[])), &[]);
    wait_until("b is held", || record_of(&env, b).gate.closed);
    for args in [
        suspend_args(&env, tree.root(), &[]),
        resume_args(&env, tree.root(), &[]),
    ] {
        let started = Instant::now();
        let second = tool(&env, &strs(&args));
        second.expect_code(EXIT_REFUSED).stderr_mentions(&[
            "another cuinterpose run is in progress",
            &format!("pid {}:", first.pid()),
            "nothing was changed",
        ]);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the refusal waited for the first run: {:?}",
            started.elapsed()
        );
        assert!(first.is_running(), "the first run ended meanwhile");
    }
    native.unlock(a).unwrap();
    first.finish().ok();

    // Two resumes at once: one resumes, the other is refused (the run in progress, or no
    // suspended group once the first is done); never a failure.
    let runs: Vec<ToolProcess> = (0..2)
        .map(|_| start_tool(&env, &strs(&resume_args(&env, tree.root(), &[])), &[]))
        .collect();
    let mut runs: Vec<ToolRun> = runs.into_iter().map(ToolProcess::finish).collect();
    runs.sort_by_key(|r| r.code);
    runs[0].ok();
    runs[1].expect_code(EXIT_REFUSED);
    assert!(
        runs[1]
            .stderr
            .contains("another cuinterpose run is in progress")
            || runs[1].stderr.contains("no suspended group"),
        "{}",
        runs[1].describe()
    );
    assert_running(&env, &tree, &runs[0]);
    assert_pair(&env, &tree);
    // Nothing stale: the next suspend and resume work.
    tool(&env, &strs(&suspend_args(&env, tree.root(), &[]))).ok();
    tool(&env, &strs(&resume_args(&env, tree.root(), &[]))).ok();
    assert_pair(&env, &tree);
}

// ---- 2: resume finishes from any phase a previous run reached ----

#[test]
fn resume_finishes_a_resume_that_stopped_after_load_or_after_import() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let native = env.native().unwrap();
    let (a, b) = (tree.w("a").pid(), tree.w("b").pid());
    for stop_after_import in [false, true] {
        suspend(&env, tree.root(), &[]).ok();
        // What a resume killed half way leaves: every process natively running again, the
        // shims loaded (and imported), still frozen, the state file in place.
        for pid in [a, b] {
            native.restore(pid, &[]).unwrap();
            native.unlock(pid).unwrap();
        }
        assert_eq!(send_phase(&env, a, Request::Load), Phase::Loaded);
        assert_eq!(send_phase(&env, b, Request::Load), Phase::Loaded);
        if stop_after_import {
            assert_eq!(send_phase(&env, a, Request::Import), Phase::Imported);
            assert_eq!(send_phase(&env, b, Request::Import), Phase::Imported);
        }
        let run = tool(&env, &strs(&resume_args(&env, tree.root(), &[])));
        run.ok();
        assert_running(&env, &tree, &run);
        assert_pair(&env, &tree);
    }
}

// ---- 1: a participant lost while suspended ----

#[test]
fn a_participant_lost_while_suspended_is_named_and_allow_lost_brings_back_the_others() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[Member::shim("a"), Member::shim("b"), Member::shim("z")],
    );
    pair(&tree);
    let (a, b, z) = (tree.w("a"), tree.w("b"), tree.w("z"));
    // `z` creates `zz`, imported by both survivors, and imports `a0`.
    create_shared(z, "zz", SIZE);
    share(z, a, "zz", SIZE);
    share(z, b, "zz", SIZE);
    share(a, z, "a0", SIZE);
    ok(z, &["fill zz 31"]);
    suspend(&env, tree.root(), &[]).ok();
    let z_pid = z.pid();
    signal(z_pid, rustix::process::Signal::KILL);
    wait_gone(z_pid);

    let plain = tool(&env, &strs(&resume_args(&env, tree.root(), &[])));
    plain.expect_code(EXIT_REFUSED).stderr_mentions(&[
        &format!("pid {z_pid}"),
        "has exited since",
        "--allow-lost",
    ]);
    assert_eq!(
        phase_of(&env, a.pid()),
        Phase::Released,
        "{}",
        plain.describe()
    );
    assert!(state_dir(&env).join("cuinterpose.state").exists());

    let run = tool(
        &env,
        &strs(&resume_args(&env, tree.root(), &["--allow-lost"])),
    );
    let report = run.ok().json();
    let lost: Vec<String> = serde_json::from_value(report["lost"].clone()).unwrap();
    assert_eq!(lost, vec![format!("pid {z_pid}")], "{}", run.describe());
    let not_rebuilt: Vec<String> = serde_json::from_value(report["not_rebuilt"].clone()).unwrap();
    assert_eq!(not_rebuilt.len(), 2, "{not_rebuilt:?}");
    for who in [a.pid(), b.pid()] {
        assert!(
            not_rebuilt
                .iter()
                .any(|l| l.starts_with(&format!("pid {who}:"))
                    && l.contains(&format!("pid {z_pid}"))),
            "{not_rebuilt:?}"
        );
    }
    let mut survivors = tree;
    survivors.workloads.remove("z");
    assert_running(&env, &survivors, &run);
    assert_pair(&env, &survivors);
}

// ---- 6: the peer descriptor service under connection floods ----

/// Opens `n` connections to the shim of `pid`, sends `request` on each and keeps them open.
fn hold_connections(
    env: &TestEnv,
    pid: u32,
    n: usize,
    request: &Request,
) -> Vec<transport::Connection> {
    let path = control_socket(env, pid);
    let mut held = Vec::new();
    for _ in 0..n {
        let Ok(mut conn) = transport::Connection::connect(&path, Duration::from_secs(5)) else {
            continue;
        };
        // Refused ones get an answer (busy) and are closed by the shim; served ones stay.
        if conn.call(request).is_ok() {
            held.push(conn);
        }
    }
    held
}

#[test]
fn held_connections_never_starve_the_peer_descriptor_service() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let (a, b) = (tree.w("a"), tree.w("b"));
    let flood = [
        Request::Inspect,
        Request::GetFd {
            id: protocol::record::AllocationId([0xde; 16]),
        },
    ];
    for (round, request) in flood.iter().enumerate() {
        let held = hold_connections(&env, a.pid(), 64, request);
        assert!(!held.is_empty(), "no connection served");
        // The application's own import from `a` works while they are held.
        let name = format!("n{round}");
        create_shared(a, &name, SIZE);
        ok(a, &[&format!("fill {name} 4{round}")]);
        share(a, b, &name, SIZE);
        ok(b, &[&format!("verify {name} 4{round}")]);
        if matches!(request, Request::Inspect) {
            // The tool's places are taken: it is refused with that one reason.
            let run = tool(
                &env,
                &["inspect", "--pid", &tree.root().to_string(), "--json"],
            );
            let report = run.ok().json();
            let refusals = report["refusals"].as_array().unwrap();
            // One reason, for `a` only: `b`'s imports from `a` are not refused as foreign.
            assert_eq!(refusals.len(), 1, "{report:#}");
            let reason = refusals[0]["reason"].as_str().unwrap();
            assert!(reason.contains("busy: 8 tool connections"), "{reason}");
        }
        drop(held);
        // Once they are gone the tool is served again.
        wait_until("the tool is served", || {
            let run = tool(
                &env,
                &["inspect", "--pid", &tree.root().to_string(), "--json"],
            );
            let served = run.code == 0
                && run.json()["refusals"]
                    .as_array()
                    .is_some_and(|r| r.is_empty());
            if !served {
                eprintln!("not served yet: {}", run.describe());
            }
            served
        });
    }
    // Idle connections that never ask anything are closed by the shim on their own.
    let path = control_socket(&env, a.pid());
    let mut idle: Vec<std::os::unix::net::UnixStream> = (0..64)
        .filter_map(|_| std::os::unix::net::UnixStream::connect(&path).ok())
        .collect();
    assert!(!idle.is_empty());
    let closed_by = Instant::now() + Duration::from_secs(10);
    for s in &mut idle {
        s.set_read_timeout(Some(
            closed_by
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .unwrap();
        let mut byte = [0u8; 1];
        assert!(
            matches!(s.read(&mut byte), Ok(0)),
            "an idle connection was not closed by the shim"
        );
    }
    let run = suspend(&env, tree.root(), &[]);
    run.ok();
    tool(&env, &strs(&resume_args(&env, tree.root(), &[]))).ok();
    assert_pair(&env, &tree);
}

// ---- smaller: exit codes and refusals that leave nothing behind ----

#[test]
fn bad_input_is_refused_with_exit_3_and_leaves_no_directory() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let root = tree.root().to_string();
    let driver = fake_driver(&env).display().to_string();

    // --pid 0, with the default state directory: refused, and no directory made for it.
    let default_dir = std::env::temp_dir().join("cuinterpose-suspended-0");
    let _ = std::fs::remove_dir(&default_dir);
    tool(&env, &["suspend", "--pid", "0", "--driver", &driver])
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&["no process 0"]);
    assert!(!default_dir.exists(), "{} was made", default_dir.display());

    // A --state-dir that is a file, and one under a file.
    let file = env.dir().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for dir in [file.clone(), file.join("below")] {
        tool(
            &env,
            &[
                "suspend",
                "--pid",
                &root,
                "--state-dir",
                &dir.display().to_string(),
                "--driver",
                &driver,
            ],
        )
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&["is not a directory"]);
    }
    // A --driver that cannot be loaded.
    let state = state_dir(&env).display().to_string();
    tool(
        &env,
        &[
            "suspend",
            "--pid",
            &root,
            "--state-dir",
            &state,
            "--driver",
            "/nonexistent/libcuda.so.1",
        ],
    )
    .expect_code(EXIT_REFUSED)
    .stderr_mentions(&["/nonexistent/libcuda.so.1"]);
    // A refused suspend (the state directory stays absent).
    assert!(
        !state_dir(&env).exists(),
        "a refused suspend made its state directory"
    );
    for w in tree.workloads.values() {
        assert_eq!(phase_of(&env, w.pid()), Phase::Running);
    }

    // A corrupt state file: resume refuses it, changing nothing.
    suspend(&env, tree.root(), &[]).ok();
    let path = state_dir(&env).join("cuinterpose.state");
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0xff;
    std::fs::write(&path, &bad).unwrap();
    tool(&env, &strs(&resume_args(&env, tree.root(), &[])))
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&["state file", "nothing was changed"]);
    assert_eq!(phase_of(&env, tree.w("a").pid()), Phase::Released);
    std::fs::write(&path, &good).unwrap();
    let run = tool(&env, &strs(&resume_args(&env, tree.root(), &[])));
    run.ok();
    assert_running(&env, &tree, &run);
    assert_pair(&env, &tree);
}

// ---- 5: control sockets that cannot collide or be squatted ----

#[test]
fn the_default_control_directory_is_private_and_a_bad_one_is_reported() {
    let env = env();
    // Our own runtime directory, as systemd makes it, and one that others could write.
    let runtime = env.dir().join("xdg");
    let open = env.dir().join("xdg-open");
    for dir in [&runtime, &open] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    std::fs::create_dir(open.join("cuinterpose")).unwrap();
    std::fs::set_permissions(
        open.join("cuinterpose"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let tree = Tree::launch(
        &env,
        &[
            // An empty CUINTERPOSE_CONTROL_DIR is no setting: the default applies.
            Member::shim("p")
                .env("CUINTERPOSE_CONTROL_DIR", "")
                .env("XDG_RUNTIME_DIR", &runtime.display().to_string()),
            Member::shim("q")
                .env("CUINTERPOSE_CONTROL_DIR", "")
                .env("XDG_RUNTIME_DIR", &open.display().to_string()),
        ],
    );
    let (p, q) = (tree.w("p"), tree.w("q"));
    create_shared(p, "x", SIZE);
    create_shared(q, "y", SIZE);
    let dir = runtime.join("cuinterpose");
    let meta = std::fs::metadata(&dir).expect("the default control directory");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o700
    );
    let socket = dir.join(format!(
        "cuinterpose-{}-{}.sock",
        pid_namespace(p.pid()),
        p.pid()
    ));
    assert!(socket.exists(), "{} missing", socket.display());

    let report = tool(
        &env,
        &["inspect", "--pid", &tree.root().to_string(), "--json"],
    );
    let report = report.ok().json();
    let status = |pid: u32| {
        report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["info"]["host_pid"] == pid)
            .map(|x| x["status"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(status(p.pid()), "cuda+shim", "{report:#}");
    assert_eq!(status(q.pid()), "shim loaded, runtime off", "{report:#}");
    let log = std::fs::read_to_string(env.log_dir().join("q.log")).unwrap();
    assert!(
        log.contains("runtime not started") && log.contains("NOT tracked"),
        "the shim did not say it loudly:\n{log}"
    );
    // A capture refuses the process whose runtime is off, naming it.
    suspend(&env, tree.root(), &[])
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&[&label(q.pid()), "no control socket"]);
}

// ---- with a PID namespace and CRIU (root) ----

fn criu() -> PathBuf {
    std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.criu/bin/criu"))
}

/// `cuinterpose run --pid-namespace -- cuinterpose-workload tree --processes 1` with its rank
/// listening in `dir`; the launcher is our child.
struct Namespaced {
    launcher: Child,
    rank: Workload,
    dir: PathBuf,
}

impl Namespaced {
    fn start(env: &TestEnv, name: &str) -> Namespaced {
        let dir = env.socket_dir().join(name);
        // The fake driver names its checkpoint agent by namespace PID in its state directory:
        // each namespace gets its own (the control directory stays the one of the environment).
        let fake = fake_dir(env, name);
        let fake = fake.to_str().expect("utf-8 path");
        let launcher = start_namespace(
            env,
            name,
            &dir,
            (1, "0"),
            &[("FAKE_CUDA_STATE_DIR", fake)],
            START_TIMEOUT,
        );
        let rank = attach_ranks(&dir, 1, &format!("{name}-r"), |_| 0).remove(0);
        create_shared(&rank, "m", SIZE);
        ok(&rank, &["fill m 51"]);
        Namespaced {
            launcher,
            rank,
            dir,
        }
    }

    /// The init of the namespace (the rank), by host PID.
    fn init(&self) -> u32 {
        namespace_init(self.launcher.id()).expect("the namespace init")
    }
}

impl Drop for Namespaced {
    fn drop(&mut self) {
        end_namespace(&mut self.launcher);
    }
}

const START_TIMEOUT: Duration = testkit::harness::START_TIMEOUT;

/// The fake driver's state directory of the namespaced group `name`.
fn fake_dir(env: &TestEnv, name: &str) -> PathBuf {
    let dir = env.dir().join(format!("fake-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the tool on the namespaced group `name` (with its fake driver state).
fn tool_on(env: &TestEnv, name: &str, args: &[&str]) -> ToolRun {
    let fake = fake_dir(env, name).display().to_string();
    tool_with(env, args, &[("FAKE_CUDA_STATE_DIR", &fake)])
}

#[test]
fn two_pid_namespace_workloads_sharing_a_control_directory_are_both_capturable() {
    let env = env();
    let one = Namespaced::start(&env, "one");
    let two = Namespaced::start(&env, "two");
    let driver = fake_driver(&env).display().to_string();
    for (name, group) in [("one", &one), ("two", &two)] {
        let pid = group.launcher.id().to_string();
        let report = tool_on(&env, name, &["inspect", "--pid", &pid, "--json"])
            .ok()
            .json();
        let refusals = report["refusals"].as_array().unwrap();
        assert!(refusals.is_empty(), "{report:#}");
        let state = env.dir().join(format!("state-{pid}")).display().to_string();
        tool_on(
            &env,
            name,
            &[
                "suspend",
                "--pid",
                &pid,
                "--state-dir",
                &state,
                "--driver",
                &driver,
            ],
        )
        .ok();
        tool_on(
            &env,
            name,
            &[
                "resume",
                "--pid",
                &pid,
                "--state-dir",
                &state,
                "--driver",
                &driver,
            ],
        )
        .ok();
        ok(&group.rank, &["verify m 51"]);
    }
    // Both inits are ns pid 1, with two names in the one directory.
    let names: Vec<String> = std::fs::read_dir(env.control_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-1.sock"))
        .collect();
    assert_eq!(names.len(), 2, "{names:?} ({})", two.dir.display());
}

#[test]
fn sigkill_of_the_launcher_leaves_the_workload_running_as_documented() {
    let env = env();
    let mut group = Namespaced::start(&env, "orphan");
    let init = group.init();
    signal(group.launcher.id(), rustix::process::Signal::KILL);
    let _ = group.launcher.wait();
    // Documented (README, `run --pid-namespace`): the workload runs on, like a container whose
    // runtime was killed; it stays reachable and capturable by its init's pid, and ends with it.
    ok(&group.rank, &["verify m 51"]);
    let report = tool_on(
        &env,
        "orphan",
        &["inspect", "--pid", &init.to_string(), "--json"],
    )
    .ok()
    .json();
    assert!(
        report["refusals"].as_array().unwrap().is_empty(),
        "{report:#}"
    );
    control::launch::kill_tree(init, Duration::from_secs(30)).unwrap();
    assert!(!alive(init));
}

/// A CRIU that answers `--version` like the real one and fails every dump after writing part of
/// an image: a dump that fails half way (a full disk).
fn failing_criu(env: &TestEnv) -> PathBuf {
    let path = env.dir().join("failing-criu");
    std::fs::write(
        &path,
        "#!/bin/sh\n\
         case \"$1\" in\n\
         --version) echo 'Version: 4.2'; exit 0;;\n\
         dump) shift; while [ $# -gt 0 ]; do [ \"$1\" = --images-dir ] && d=\"$2\"; shift; done;\n\
               head -c 65536 /dev/zero > \"$d/pages-1.img\"; echo 'Error (fake): No space left on device' > \"$d/dump.log\"; exit 1;;\n\
         esac\n\
         exit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

fn checkpoint_args(
    pid: u32,
    dir: &Path,
    criu: &Path,
    driver: &Path,
    leave_running: bool,
) -> Vec<String> {
    let mut args = vec![
        "checkpoint".to_string(),
        "--pid".into(),
        pid.to_string(),
        "--dir".into(),
        dir.display().to_string(),
        "--criu".into(),
        criu.display().to_string(),
        "--driver".into(),
        driver.display().to_string(),
    ];
    if leave_running {
        args.push("--leave-running".into());
    }
    args
}

#[test]
fn a_failed_or_killed_checkpoint_leaves_nothing_that_resume_discard_or_a_new_checkpoint_cannot_handle()
 {
    let env = env();
    let group = Namespaced::start(&env, "ck");
    let pid = group.launcher.id();
    let driver = fake_driver(&env);
    let dir = env.dir().join("ck");

    // A dump that fails half way: rolled back, an incomplete checkpoint left that discard removes.
    let bad = failing_criu(&env);
    tool_on(
        &env,
        "ck",
        &strs(&checkpoint_args(pid, &dir, &bad, &driver, false)),
    )
    .expect_code(EXIT_ROLLED_BACK)
    .stderr_mentions(&["No space left on device", "rolled back"]);
    ok(&group.rank, &["verify m 51"]);
    assert!(dir.join("cuinterpose.incomplete").exists());
    tool_on(
        &env,
        "ck",
        &[
            "restore",
            "--dir",
            &dir.display().to_string(),
            "--criu",
            &criu().display().to_string(),
        ],
    )
    .expect_code(EXIT_REFUSED)
    .stderr_mentions(&["incomplete checkpoint", "discard"]);
    tool_on(
        &env,
        "ck",
        &["discard", "--dir", &dir.display().to_string()],
    )
    .ok();
    assert!(!dir.exists(), "discard left {}", dir.display());

    // Failed again, then a checkpoint into the same directory takes its place.
    tool_on(
        &env,
        "ck",
        &strs(&checkpoint_args(pid, &dir, &bad, &driver, false)),
    )
    .expect_code(EXIT_ROLLED_BACK);
    tool_on(
        &env,
        "ck",
        &strs(&checkpoint_args(pid, &dir, &criu(), &driver, true)),
    )
    .ok();
    assert!(dir.join("manifest.json").exists());
    assert!(!dir.join("cuinterpose.incomplete").exists());
    ok(&group.rank, &["verify m 51"]);
    tool_on(
        &env,
        "ck",
        &["discard", "--dir", &dir.display().to_string()],
    )
    .ok();

    // Killed during CRIU's dump: `resume` brings the workload back (the tree continued, the
    // state found where the checkpoint kept it), and the directory is taken by the next one.
    let args = checkpoint_args(pid, &dir, &criu(), &driver, false);
    let fake = fake_dir(&env, "ck").display().to_string();
    let mut killed = start_tool(&env, &strs(&args), &[("FAKE_CUDA_STATE_DIR", &fake)]);
    wait_until("CRIU dumps", || {
        dir.join("images").join("dump.log").exists()
    });
    signal(killed.pid(), rustix::process::Signal::KILL);
    let status = killed.child.wait().unwrap();
    assert!(
        !status.success(),
        "the checkpoint finished before it was killed"
    );
    let run = tool(
        &env,
        &[
            "resume",
            "--pid",
            &pid.to_string(),
            "--driver",
            &driver.display().to_string(),
            "--json",
        ],
    );
    run.ok();
    ok(&group.rank, &["verify m 51", "fill m 52"]);
    tool_on(
        &env,
        "ck",
        &strs(&checkpoint_args(pid, &dir, &criu(), &driver, true)),
    )
    .ok();
    ok(&group.rank, &["verify m 52"]);
    tool_on(
        &env,
        "ck",
        &["discard", "--dir", &dir.display().to_string()],
    )
    .ok();
    assert!(!dir.exists());
}

// ---- issue 29 item 10: every ordinary bad input gets its exit code ----

const EXIT_USAGE: i32 = 2;

/// Each bad input of issue 29's item 10 exits with its documented code (2: a bad argument or
/// setting, 3: no such process or refused) and says what is wrong; `demo`'s bad values are
/// refused by the argument parser, before any process starts.
#[test]
fn every_ordinary_bad_input_gets_its_exit_code() {
    let env = env();
    let file = env.dir().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let file_arg = file.display().to_string();
    let driver = fake_driver(&env).display().to_string();
    let criu = criu().display().to_string();
    let dir = env.dir().join("ck").display().to_string();
    for pid in ["0", "4294967295", &gone_pid().to_string()] {
        tool(
            &env,
            &[
                "checkpoint",
                "--pid",
                pid,
                "--dir",
                &dir,
                "--criu",
                &criu,
                "--driver",
                &driver,
            ],
        )
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&[&format!("no process {pid}")]);
    }
    for setting in [file_arg.as_str(), "/proc/1"] {
        tool_with(
            &env,
            &["inspect", "--pid", "1"],
            &[("CUINTERPOSE_LOCK_DIR", setting)],
        )
        .expect_code(EXIT_USAGE)
        .stderr_mentions(&["CUINTERPOSE_LOCK_DIR", "create its locks in"]);
    }
    for (args, message) in [
        (
            vec!["run", "--", "/nonexistent"],
            "/nonexistent: no such executable file",
        ),
        (
            vec!["run", "--", "no-such-program-29"],
            "no such executable file in PATH",
        ),
        (
            vec!["run", "--pid-namespace", "--", "/nonexistent"],
            "no such executable file",
        ),
        (
            vec!["run", "--shim", "/nonexistent", "--", "true"],
            "not found",
        ),
        (
            vec!["run", "--control-dir", &file_arg, "--", "true"],
            "--control-dir",
        ),
        (vec!["demo", "--fake", "--size", "0"], "--size"),
        (vec!["demo", "--fake", "--size", "1"], "multiple of 2097152"),
        (
            vec!["demo", "--fake", "--size", "18446744073709551615"],
            "--size",
        ),
        (vec!["demo", "--fake", "--processes", "0"], "from 2 to 64"),
        (vec!["demo", "--fake", "--processes", "1"], "from 2 to 64"),
        (
            vec!["demo", "--fake", "--processes", "100000"],
            "from 2 to 64",
        ),
        (
            vec![
                "demo",
                "--fake",
                "--sharing",
                "multicast",
                "--allow-multicast",
                "--to-disk",
            ],
            "runs in place only",
        ),
        (
            vec!["demo", "--fake", "--sharing", "multicast"],
            "--allow-multicast",
        ),
        (
            vec!["carrier-helper", "--socket", &file_arg],
            "not a socket",
        ),
        (
            vec!["carrier-helper", "--socket", "/nonexistent/dir/s.sock"],
            "is not a directory",
        ),
    ] {
        let run = tool(&env, &args);
        run.expect_code(EXIT_USAGE).stderr_mentions(&[message]);
        assert!(!run.stderr.contains("unexpected"), "{}", run.describe());
    }
    // A state file that is a FIFO: refused at once, its cause said once.
    let fifo_dir = env.dir().join("fifo-state");
    std::fs::create_dir_all(&fifo_dir).unwrap();
    let fifo = fifo_dir.join("cuinterpose.state");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let me = std::process::id().to_string();
    let fifo_dir = fifo_dir.display().to_string();
    let run = tool(&env, &["resume", "--pid", &me, "--state-dir", &fifo_dir]);
    run.expect_code(EXIT_REFUSED)
        .stderr_mentions(&["a fifo", "nothing was changed"]);
    assert_eq!(
        run.stderr.matches("a fifo").count(),
        1,
        "{}",
        run.describe()
    );
    let help = tool(&env, &["demo", "--help"]);
    assert!(help.stdout.contains("2 to 64"), "{}", help.describe());
}

/// A pid no process has: one that existed and was reaped.
fn gone_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// `checkpoint --dir` naming a file is refused (exit 3) before anything changes.
#[test]
fn a_checkpoint_into_a_file_is_refused() {
    let env = env();
    let group = Namespaced::start(&env, "ns");
    let file = env.dir().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let driver = fake_driver(&env);
    let run = tool_on(
        &env,
        "ns",
        &strs(&checkpoint_args(
            group.init(),
            &file,
            &criu(),
            &driver,
            false,
        )),
    );
    run.expect_code(EXIT_REFUSED)
        .stderr_mentions(&["cannot be used for a checkpoint", "Not a directory"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    ok(&group.rank, &["verify m 51"]);
}

// ---- issue 29 item 7: --allow-lost and a multicast object missing a member ----

/// `--allow-lost` on a group whose multicast object lost a member (its device added by the
/// lost process) is refused before anything changes, naming why; the group stays suspended as it
/// was (its state file, every survivor's phase).
#[test]
fn allow_lost_refuses_a_multicast_object_missing_a_member_before_anything_changes() {
    const MC: u64 = 4 << 20;
    let env = env().env("FAKE_CUDA_DEVICES", "3");
    let tree = Tree::run_tree_on(&env, 3, "0,1,2");
    let ranks: Vec<&Workload> = (0..3).map(|r| tree.w(&format!("r{r}"))).collect();
    ok(
        ranks[0],
        &[&format!("mc-create mc {MC} --devices 3"), "export mc"],
    );
    for w in &ranks[1..] {
        let peer = w.socket().display().to_string();
        ok(ranks[0], &[&format!("send-fd mc --to {peer}")]);
        ok(w, &["wait fd mc", &format!("import mc --size {MC}")]);
    }
    for w in &ranks {
        ok(w, &["mc-add-device mc"]);
    }
    for w in &ranks {
        ok(
            w,
            &[
                &format!("create m {MC} --handle-types posix"),
                &format!("reserve r-m {MC}"),
                "map m r-m",
                "set-access m",
                "export m",
                &format!("mc-bind-mem mc 0 m --size {MC}"),
            ],
        );
    }
    suspend(&env, tree.root(), &[]).ok();
    let lost = ranks[2].pid();
    signal(lost, rustix::process::Signal::KILL);
    wait_gone(lost);
    let phases = |ranks: &[&Workload]| -> Vec<Phase> {
        ranks[..2].iter().map(|w| phase_of(&env, w.pid())).collect()
    };
    let before = phases(&ranks);
    let run = tool(
        &env,
        &strs(&resume_args(&env, tree.root(), &["--allow-lost"])),
    );
    run.expect_code(EXIT_REFUSED).stderr_mentions(&[
        "multicast object",
        &format!("pid {lost}"),
        "cannot be rebuilt without it",
        "nothing was changed",
    ]);
    assert_eq!(phases(&ranks), before, "{}", run.describe());
    assert!(state_dir(&env).join("cuinterpose.state").exists());

    // The one command the refusal names: `end` kills the survivors and the tree's root, and
    // removes the state; a resume then finds no suspended group.
    let state = state_dir(&env).display().to_string();
    let root = tree.root().to_string();
    let ended = tool(
        &env,
        &["end", "--pid", &root, "--state-dir", &state, "--json"],
    );
    ended.ok();
    let report = ended.json();
    let killed: Vec<&str> = report["killed"]
        .as_array()
        .expect("killed")
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    for w in &ranks[..2] {
        assert!(
            killed
                .iter()
                .any(|k| k.contains(&format!("pid {}", w.pid()))),
            "{}",
            ended.describe()
        );
        wait_gone(w.pid());
    }
    assert!(
        report["already_gone"]
            .to_string()
            .contains(&format!("pid {lost}")),
        "{}",
        ended.describe()
    );
    assert!(!state_dir(&env).join("cuinterpose.state").exists());
    tool(&env, &strs(&resume_args(&env, tree.root(), &[])))
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&["no suspended group"]);
}

/// `end` of a group that is not suspended is refused and kills nothing.
#[test]
fn end_refuses_a_running_group_and_kills_nothing() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let state = state_dir(&env).display().to_string();
    let root = tree.root().to_string();
    tool(&env, &["end", "--pid", &root, "--state-dir", &state])
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&["no suspended group"]);
    assert_pair(&env, &tree);
}

// ---- issue 29, item 11: stopped processes ----

/// The state letter of `/proc/PID/stat` (`T`: stopped).
fn proc_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    stat[stat.rfind(')').expect("comm") + 1..]
        .split_whitespace()
        .next()
        .and_then(|s| s.chars().next())
        .expect("state")
}

#[test]
fn a_stopped_participant_is_refused_as_stopped_and_nothing_changes() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let (a, b) = (tree.w("a").pid(), tree.w("b").pid());
    signal(a, rustix::process::Signal::STOP);
    wait_until("a is stopped", || proc_state(a) == 'T');
    let run = tool(&env, &strs(&suspend_args(&env, tree.root(), &[])));
    run.expect_code(EXIT_REFUSED).stderr_mentions(&[
        &format!("pid {a}"),
        "is stopped (state T",
        &format!("kill -CONT {a}"),
        "nothing was changed",
    ]);
    assert!(
        !run.stderr.contains("does not answer"),
        "{}",
        run.describe()
    );
    // inspect names it the same way.
    let root = tree.root().to_string();
    let inspected = tool(&env, &["inspect", "--pid", &root]);
    assert!(
        inspected.stdout.contains("stopped") && inspected.stdout.contains("is stopped (state T"),
        "{}",
        inspected.describe()
    );
    assert_eq!(phase_of(&env, b), Phase::Running);
    assert_eq!(
        proc_state(a),
        'T',
        "the tool continued a process it refused"
    );
    signal(a, rustix::process::Signal::CONT);
    wait_until("a runs", || proc_state(a) != 'T');
    assert_eq!(phase_of(&env, a), Phase::Running);
    assert_pair(&env, &tree);
    suspend(&env, tree.root(), &[]).ok();
    resume(&env, tree.root()).ok();
    assert_pair(&env, &tree);
}

#[test]
fn resume_continues_only_the_stopped_processes_of_the_group() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let (a, b) = (tree.w("a").pid(), tree.w("b").pid());
    suspend(&env, tree.root(), &[]).ok();
    // `a` stopped as an interrupted dump leaves it; the tree's root, which is not of the group
    // (no CUDA, not captured, in the tool's PID namespace), stopped by someone else.
    signal(a, rustix::process::Signal::STOP);
    signal(tree.root(), rustix::process::Signal::STOP);
    wait_until("a and the root are stopped", || {
        proc_state(a) == 'T' && proc_state(tree.root()) == 'T'
    });
    let run = resume(&env, tree.root());
    run.ok();
    assert_ne!(proc_state(a), 'T', "a captured process was left stopped");
    assert_eq!(
        proc_state(tree.root()),
        'T',
        "resume continued a process outside the group"
    );
    signal(tree.root(), rustix::process::Signal::CONT);
    assert_running(&env, &tree, &run);
    assert_eq!(phase_of(&env, b), Phase::Running);
    assert_pair(&env, &tree);
}
