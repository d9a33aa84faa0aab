//! Multicast objects across processes (issue 16) with the real binary on the fake driver (never
//! on a GPU: the workload's `mc-*` commands refuse any other driver): a group whose ranks share
//! one multicast object, each rank binding a member of its own device (by allocation or by
//! address), is suspended and resumed and keeps working through the multicast mapping; each
//! refusal; a participant killed during the multicast rebuild is named with the step.

mod common;

use common::*;
use testkit::{TestEnv, Workload};

/// Bytes of the multicast object and of each member (two 2 MiB granules).
const MC: u64 = 4 << 20;

/// `n` ranks, rank r on device r.
fn env_of(n: usize) -> TestEnv {
    env().env("FAKE_CUDA_DEVICES", n.max(2).to_string())
}

fn devices(n: usize) -> String {
    (0..n).map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

/// Rank 0 creates the multicast object `mc` for `n` devices and hands it to every other rank;
/// every rank adds its device, creates its member `m` (shared by even ranks, private by odd
/// ones), binds it (even ranks by allocation, odd ranks by address) and maps `mc`.
fn build(ranks: &[&Workload]) {
    let n = ranks.len();
    ok(
        ranks[0],
        &[&format!("mc-create mc {MC} --devices {n}"), "export mc"],
    );
    for w in &ranks[1..] {
        let peer = w.socket().display().to_string();
        ok(ranks[0], &[&format!("send-fd mc --to {peer}")]);
        ok(w, &["wait fd mc", &format!("import mc --size {MC}")]);
    }
    for w in ranks {
        ok(w, &["mc-add-device mc"]);
    }
    for (r, w) in ranks.iter().enumerate() {
        let types = if r % 2 == 0 { "posix" } else { "none" };
        ok(
            w,
            &[
                &format!("create m {MC} --handle-types {types}"),
                &format!("reserve r-m {MC}"),
                "map m r-m",
                "set-access m",
            ],
        );
        if r % 2 == 0 {
            ok(w, &["export m", &format!("mc-bind-mem mc 0 m --size {MC}")]);
        } else {
            ok(w, &["mc-bind-addr mc 0 m"]);
        }
        ok(
            w,
            &[
                &format!("reserve r-mc {MC}"),
                "map mc r-mc",
                "set-access mc",
            ],
        );
    }
}

/// A write through rank `from`'s multicast mapping reaches every rank's member.
fn through(ranks: &[&Workload], from: usize, seed: u64) {
    ok(ranks[from], &[&format!("fill mc {seed}")]);
    for w in ranks {
        ok(w, &[&format!("verify m {seed}")]);
    }
}

fn records(env: &TestEnv, root: u32) -> serde_json::Value {
    tool(env, &["inspect", "--pid", &root.to_string(), "--json"])
        .ok()
        .json()
}

fn suspend_resume(n: usize) {
    let env = env_of(n);
    let tree = Tree::run_tree_on(&env, n, &devices(n));
    let ranks: Vec<&Workload> = (0..n).map(|r| tree.w(&format!("r{r}"))).collect();
    build(&ranks);
    through(&ranks, 0, 21);
    let inspected = records(&env, tree.root());
    // Every rank reports the object, its devices and its binding; the creator its properties.
    let snapshots = inspected["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), n, "{inspected}");
    for s in snapshots {
        let mc = &s["record"]["multicasts"][0];
        assert_eq!(mc["size"], MC, "{s}");
        assert_eq!(mc["devices"].as_array().map(Vec::len), Some(1), "{s}");
        assert_eq!(mc["bindings"].as_array().map(Vec::len), Some(1), "{s}");
    }
    assert!(
        inspected["refusals"].as_array().is_none_or(Vec::is_empty),
        "{inspected}"
    );
    let group = &inspected["multicasts"][0];
    assert_eq!(
        (&group["num_devices"], &group["devices_added"]),
        (&serde_json::json!(n), &serde_json::json!(n)),
        "{inspected}"
    );
    assert_eq!(
        group["holders"].as_array().map(Vec::len),
        Some(n),
        "{inspected}"
    );
    let table = tool(&env, &["inspect", "--pid", &tree.root().to_string()]);
    assert!(
        table
            .ok()
            .stdout
            .lines()
            .any(|l| l.contains(&format!("{n}/{n}")) && l.contains("4.00 MiB")),
        "{}",
        table.describe()
    );
    let before: Vec<_> = ranks.iter().map(|w| regions(w)).collect();

    let run = suspend(&env, tree.root(), &[]);
    run.ok();
    for w in &ranks {
        assert_eq!(
            usage(&env, w.pid()),
            0,
            "{} holds memory; {}",
            w.name(),
            run.describe()
        );
    }
    let run = resume(&env, tree.root());
    let report = run.ok().json();
    let phases: Vec<&str> = report["phases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for step in [
        "multicast-create",
        "multicast-import",
        "multicast-add-devices",
        "multicast-bind",
    ] {
        assert!(phases.contains(&step), "{step} in {phases:?}");
    }
    for (w, before) in ranks.iter().zip(&before) {
        assert_eq!(&regions(w), before, "{}: addresses changed", w.name());
        ok(w, &["verify m 21"]);
    }
    // The rebuilt object works from every rank, and the records are the captured ones.
    for from in 0..n {
        through(&ranks, from, 30 + from as u64);
    }
    let after = records(&env, tree.root());
    for (a, b) in snapshots.iter().zip(after["snapshots"].as_array().unwrap()) {
        assert_eq!(a["record"]["multicasts"], b["record"]["multicasts"]);
        assert_eq!(a["record"]["mappings"], b["record"]["mappings"]);
    }
}

#[test]
fn two_ranks_with_a_multicast_object_suspend_and_resume() {
    suspend_resume(2);
}

#[test]
fn four_ranks_with_a_multicast_object_suspend_and_resume() {
    suspend_resume(4);
}

/// Runs `suspend`, which must refuse naming `pid` and `reason`, and leaves the group running.
fn refused(env: &TestEnv, tree: &Tree, pid: u32, reason: &str) {
    let run = suspend(env, tree.root(), &[]);
    run.expect_code(EXIT_REFUSED);
    assert!(
        run.stderr
            .lines()
            .any(|l| l.trim_start().starts_with(&label(pid)) && l.contains(reason)),
        "{reason} for {}: {}",
        label(pid),
        run.describe()
    );
    assert!(
        !state_dir(env).join("cuinterpose.state").exists(),
        "a refused suspend left a state file"
    );
}

#[test]
fn an_incomplete_team_is_refused_naming_the_creator() {
    let env = env_of(2);
    let tree = Tree::run_tree_on(&env, 2, "0,1");
    let (a, b) = (tree.w("r0"), tree.w("r1"));
    ok(a, &[&format!("mc-create mc {MC} --devices 2"), "export mc"]);
    ok(a, &[&format!("send-fd mc --to {}", b.socket().display())]);
    ok(b, &["wait fd mc", &format!("import mc --size {MC}")]);
    ok(a, &["mc-add-device mc"]);
    refused(&env, &tree, a.pid(), "team is incomplete: 1 of 2 devices");
    // Completed, the same group is captured.
    ok(b, &["mc-add-device mc"]);
    suspend(&env, tree.root(), &[]).ok();
    resume(&env, tree.root()).ok();
}

#[test]
fn bindings_the_shim_cannot_rebuild_are_refused_before_anything_changes() {
    let env = env_of(2);
    let tree = Tree::run_tree_on(&env, 2, "0,1");
    let a = tree.w("r0");
    // numDevices 1: the team is complete with one device.
    ok(
        a,
        &[
            &format!("mc-create mc {MC} --devices 1"),
            "mc-add-device mc",
            // Memory the shim no longer owns: bound, then released by the application (the
            // binding keeps it alive in the driver; the shim has nothing to rebuild it from).
            &format!("create x {MC}"),
            &format!("mc-bind-mem mc 0 x --size {MC}"),
            "release x",
        ],
    );
    refused(&env, &tree, a.pid(), "bound memory the shim does not own");
    ok(a, &[&format!("mc-unbind mc 0 {MC}")]);
    suspend(&env, tree.root(), &[]).ok();
    resume(&env, tree.root()).ok();
    // Handle types other than POSIX descriptors.
    ok(
        a,
        &[&format!(
            "mc-create fab {MC} --devices 1 --handle-types posix+fabric"
        )],
    );
    refused(&env, &tree, a.pid(), "not only POSIX descriptors");
}

#[test]
fn a_participant_killed_during_the_multicast_rebuild_is_named_with_the_step() {
    // Rank 1 imports the multicast object once while the test sets the group up; its second
    // import is the Import step of the rebuild, and the fake driver kills rank 1 inside it. Rank 0
    // creates the object and imports nothing, so the rule touches rank 1 only.
    let env = env_of(2).env("FAKE_CUDA_FAIL", "cuMemImportFromShareableHandle:2=die");
    let tree = Tree::run_tree_on(&env, 2, "0,1");
    let ranks = [tree.w("r0"), tree.w("r1")];
    // Private members only: rank 1's only import is the multicast object's.
    ok(
        ranks[0],
        &[&format!("mc-create mc {MC} --devices 2"), "export mc"],
    );
    ok(
        ranks[0],
        &[&format!("send-fd mc --to {}", ranks[1].socket().display())],
    );
    ok(ranks[1], &["wait fd mc", &format!("import mc --size {MC}")]);
    for w in ranks {
        ok(w, &["mc-add-device mc"]);
    }
    for w in ranks {
        ok(
            w,
            &[
                &format!("create m {MC} --handle-types none"),
                &format!("reserve r-m {MC}"),
                "map m r-m",
                "set-access m",
                "mc-bind-addr mc 0 m",
                &format!("reserve r-mc {MC}"),
                "map mc r-mc",
                "set-access mc",
            ],
        );
    }
    through(&ranks, 0, 41);
    let victim = ranks[1].pid();
    suspend(&env, tree.root(), &[]).ok();
    let run = resume(&env, tree.root());
    assert_ne!(run.code, 0, "{}", run.describe());
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains("multicast-import") && l.contains(&label(victim))),
        "the step and the process are named: {}",
        run.describe()
    );
    assert!(
        std::fs::read_to_string(ranks[1].log_path())
            .is_ok_and(|l| l.contains("dying in call 2 of cuMemImportFromShareableHandle")),
        "rank 1 died where the rule says"
    );
}

#[test]
fn demo_multicast_passes_on_the_fake_driver() {
    let env = env();
    let run = tool(
        &env,
        &[
            "demo",
            "--sharing",
            "multicast",
            "--allow-multicast",
            "--processes",
            "3",
            "--size",
            "4194304",
        ],
    );
    assert!(
        run.ok()
            .stdout
            .contains("demo passed: 3 processes kept one multicast object of 4.00 MiB"),
        "{}",
        run.describe()
    );
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.contains("multicast mapping reached all 3 members"))
            .count(),
        4,
        "{}",
        run.describe()
    );
}

#[test]
fn a_capture_failing_after_release_rebuilds_the_multicast_object_and_runs_on() {
    let env = env_of(2);
    let tree = Tree::run_tree_on(&env, 2, "0,1");
    let ranks = [tree.w("r0"), tree.w("r1")];
    build(&ranks);
    through(&ranks, 1, 61);
    // The tool's native lock fails after every shim released its memory and multicast objects:
    // the rollback sends Load, Import and the four multicast steps, then Thaw.
    let run = suspend(
        &env,
        tree.root(),
        &[("FAKE_CUDA_FAIL", "cuCheckpointProcessLock:1")],
    );
    run.expect_code(EXIT_ROLLED_BACK)
        .stderr_mentions(&["native lock failed for", "rolled back"]);
    for w in ranks {
        assert_eq!(phase_of(&env, w.pid()), protocol::Phase::Running);
        ok(w, &["verify m 61"]);
    }
    through(&ranks, 0, 62);
    through(&ranks, 1, 63);
}
