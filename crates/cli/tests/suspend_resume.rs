//! `cuinterpose suspend` and `cuinterpose resume` (issue 4) with the real binary on the fake
//! driver, and `cuinterpose demo`.

mod common;

use common::*;
use std::collections::BTreeSet;
use testkit::Workload;

/// Seeds of the patterns: allocation `k` of rank `r`, written in round `round`.
fn seed(round: u64, r: usize, k: u64) -> u64 {
    round * 1000 + r as u64 * 10 + k
}

/// Builds the topology of `round_trip` and returns the bytes its ranks created (shared and private).
///
/// - a ring: rank i creates `a<i>` (access for device 0 read-write and device 1 read-only) and
///   rank i+1 imports and maps it;
/// - rank i creates `b<i>` (twice the size), rank i-1 imports it and maps it twice: whole as
///   `b<i>` and its upper half again as `b<i>-upper` (a partial mapping);
/// - with 3 or more ranks, rank 1 hands its import of `a0` on to rank 2 as `c0` (an import of an
///   import), which maps it;
/// - every rank has a private allocation `p` (native checkpoint keeps it).
fn build(ranks: &[&Workload]) -> u64 {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        create_shared(w, &format!("a{i}"), SIZE);
        ok(w, &[&format!("set-access a{i} --device 0:rw --device 1:r")]);
        create_shared(w, &format!("b{i}"), 2 * SIZE);
        ok(
            w,
            &[
                "create p 2M --handle-types none",
                "reserve r-p 2M",
                "map p r-p",
                "set-access p --device 0",
            ],
        );
    }
    for i in 0..n {
        share(ranks[i], ranks[(i + 1) % n], &format!("a{i}"), SIZE);
        let to = ranks[(i + n - 1) % n];
        share(ranks[i], to, &format!("b{i}"), 2 * SIZE);
        ok(
            to,
            &[
                &format!("reserve r2-b{i} {SIZE}"),
                &format!("map b{i} r2-b{i} --alloc-offset {SIZE} --size {SIZE} --as b{i}-upper"),
                &format!("set-access b{i}-upper --device 0:rw --device 1:rw"),
            ],
        );
    }
    if n >= 3 {
        ok(ranks[1], &["close-fd a0", "export a0"]);
        ok(
            ranks[1],
            &[&format!(
                "send-fd a0 --to {} --as c0",
                ranks[2].socket().display()
            )],
        );
        ok(
            ranks[2],
            &[
                &format!("import c0 --size {SIZE}"),
                &format!("reserve r-c0 {SIZE}"),
                "map c0 r-c0",
                "set-access c0 --device 0",
            ],
        );
    }
    // What the carriers move: each rank's shared a and b, and its private p (2 MiB) too.
    n as u64 * (3 * SIZE + (2 << 20))
}

fn fill(ranks: &[&Workload], round: u64) {
    for (i, w) in ranks.iter().enumerate() {
        ok(
            w,
            &[
                &format!("fill a{i} {}", seed(round, i, 1)),
                &format!("fill b{i} {}", seed(round, i, 2)),
                &format!("fill p {}", seed(round, i, 3)),
            ],
        );
    }
}

/// Every process sees every pattern of `round` through each of its mappings.
fn verify(ranks: &[&Workload], round: u64) {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        let next = ranks[(i + 1) % n];
        let previous = ranks[(i + n - 1) % n];
        for (who, line) in [
            (*w, format!("verify a{i} {}", seed(round, i, 1))),
            (next, format!("verify a{i} {}", seed(round, i, 1))),
            (*w, format!("verify b{i} {}", seed(round, i, 2))),
            (previous, format!("verify b{i} {}", seed(round, i, 2))),
            (
                previous,
                format!(
                    "verify b{i}-upper {} --pattern-offset {SIZE}",
                    seed(round, i, 2)
                ),
            ),
            (*w, format!("verify p {}", seed(round, i, 3))),
        ] {
            ok(who, &[&line]);
        }
    }
    if n >= 3 {
        ok(ranks[2], &[&format!("verify c0 {}", seed(round, 0, 1))]);
    }
}

/// After the resume, new writes go both ways: importers write, creators read, then the other way.
fn writes_both_ways(ranks: &[&Workload]) {
    let n = ranks.len();
    for i in 0..n {
        let next = ranks[(i + 1) % n];
        let previous = ranks[(i + n - 1) % n];
        ok(next, &[&format!("fill a{i} {}", seed(7, i, 1))]);
        ok(ranks[i], &[&format!("verify a{i} {}", seed(7, i, 1))]);
        ok(
            previous,
            &[&format!(
                "fill b{i}-upper {} --pattern-offset {SIZE}",
                seed(8, i, 2)
            )],
        );
        ok(
            ranks[i],
            &[&format!(
                "verify b{i} {} --offset {SIZE} --pattern-offset {SIZE}",
                seed(8, i, 2)
            )],
        );
        ok(ranks[i], &[&format!("fill b{i} {}", seed(9, i, 2))]);
        ok(previous, &[&format!("verify b{i} {}", seed(9, i, 2))]);
    }
    if n >= 3 {
        ok(ranks[2], &[&format!("fill c0 {}", seed(10, 0, 1))]);
        ok(ranks[0], &[&format!("verify a0 {}", seed(10, 0, 1))]);
        ok(ranks[1], &[&format!("verify a0 {}", seed(10, 0, 1))]);
    }
}

/// How the tool finds the driver: `--driver PATH`, or `libcuda.so.1` from the library path the
/// test environment starts it with (the fake driver's directory first).
#[derive(Clone, Copy, PartialEq, Eq)]
enum DriverArg {
    Explicit,
    LibraryPath,
}

fn round_trip(n: usize, driver: DriverArg) {
    let env = env();
    let tree = Tree::run_tree(&env, n);
    let ranks: Vec<&Workload> = (0..n).map(|r| tree.w(&format!("r{r}"))).collect();
    let carried = build(&ranks);
    fill(&ranks, 1);
    verify(&ranks, 1);
    let before: Vec<_> = ranks.iter().map(|w| regions(w)).collect();
    for w in &ranks {
        assert!(usage(&env, w.pid()) > 0, "{} holds no memory", w.name());
    }

    let state = state_dir(&env).display().to_string();
    let root = tree.root().to_string();
    let mut args = vec!["--pid", &root, "--state-dir", &state, "--json"];
    let fake = fake_driver(&env).display().to_string();
    if driver == DriverArg::Explicit {
        args.extend(["--driver", &fake]);
    }
    let run = tool(&env, &[&["suspend"], &args[..]].concat());
    let report = run.ok().json();
    let pids: BTreeSet<u64> = report["participants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["host_pid"].as_u64().unwrap())
        .collect();
    let expected: BTreeSet<u64> = ranks.iter().map(|w| u64::from(w.pid())).collect();
    assert_eq!(pids, expected, "participants\n{}", run.describe());
    assert_eq!(report["saved_bytes"], carried, "{}", run.describe());
    let state_file = state_dir(&env).join("cuinterpose.state");
    assert!(state_file.exists(), "no state file after suspend");
    // Suspended: no device memory anywhere in the group, every process alive.
    for w in &ranks {
        assert_eq!(
            usage(&env, w.pid()),
            0,
            "{} still holds device memory while suspended",
            w.name()
        );
        assert!(alive(w.pid()), "{} died while suspended", w.name());
    }

    // A second suspend of the suspended group refuses and changes nothing.
    let again = tool(&env, &[&["suspend"], &args[..]].concat());
    again
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&["already holds a suspended group"]);
    assert!(
        state_file.exists(),
        "a refused suspend removed the state file"
    );

    // A state file of another format version (a tool of another version suspended the group) is
    // refused before anything changes; the group stays suspended for the tool that can read it.
    let written = std::fs::read(&state_file).unwrap();
    let mut other = written.clone();
    let theirs = protocol::state::STATE_VERSION + 1;
    other[8..10].copy_from_slice(&theirs.to_le_bytes());
    std::fs::write(&state_file, &other).unwrap();
    tool(&env, &[&["resume"], &args[..]].concat())
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&[
            "version mismatch",
            &format!("theirs {theirs}"),
            "resume with the tool that suspended the group",
        ]);
    for w in &ranks {
        assert_eq!(usage(&env, w.pid()), 0, "{} was touched", w.name());
    }
    std::fs::write(&state_file, &written).unwrap();

    let run = tool(&env, &[&["resume"], &args[..]].concat());
    let report = run.ok().json();
    assert_eq!(report["saved_bytes"], carried, "{}", run.describe());
    assert!(!state_file.exists(), "state file left after resume");
    for (w, before) in ranks.iter().zip(&before) {
        assert_eq!(&regions(w), before, "{}: addresses changed", w.name());
        assert!(usage(&env, w.pid()) > 0, "{} holds no memory", w.name());
    }
    verify(&ranks, 1);
    writes_both_ways(&ranks);

    // Nothing is suspended any more: a second resume refuses and changes nothing.
    let again = resume(&env, tree.root());
    again
        .expect_code(EXIT_REFUSED)
        .stderr_mentions(&["no suspended group"]);
    ok(ranks[0], &[&format!("verify b0 {}", seed(9, 0, 2))]);
}

#[test]
fn two_processes_suspend_and_resume_through_the_cli() {
    round_trip(2, DriverArg::Explicit);
}

#[test]
fn four_processes_suspend_and_resume_through_the_cli() {
    round_trip(4, DriverArg::LibraryPath);
}

#[test]
fn demo_passes_on_the_fake_driver() {
    let env = env();
    let run = tool(&env, &["demo", "--size", "4194304"]);
    assert!(
        run.ok().stdout.contains("demo passed: 2 processes"),
        "{}",
        run.describe()
    );
    assert!(run.stdout.contains("fake driver"), "{}", run.describe());
}

#[test]
fn demo_with_four_processes_reports_no_memory_held_while_suspended() {
    let env = env();
    let run = tool(
        &env,
        &["demo", "--processes", "4", "--size", "4194304", "--json"],
    );
    let report = run.ok().json();
    assert_eq!(report["processes"], 4, "{}", run.describe());
    assert_eq!(
        report["group_memory_before"],
        4 * SIZE,
        "{}",
        run.describe()
    );
    assert_eq!(report["group_memory_suspended"], 0, "{}", run.describe());
    assert_eq!(
        report["verified"].as_array().map(Vec::len),
        Some(8),
        "{}",
        run.describe()
    );
    assert_eq!(report["suspend"]["saved_bytes"], 4 * SIZE);
}
