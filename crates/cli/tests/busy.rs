//! Busy workloads (issue 27) with the real binary on the fake driver: processes whose GPU work
//! never pauses (the workload's busy modes: a loop of kernels, a ring of spin-flag exchanges
//! through shared memory, fake-NCCL all-reduces), suspended and resumed or checkpointed to disk and
//! restored at random moments, every result checked by the workloads themselves; a collective
//! that can never complete is refused after the freeze deadline with the group left running; and,
//! first, the fake driver's fault model that makes all of this visible: memory released under a
//! running kernel poisons the context with a sticky `CUDA_ERROR_ILLEGAL_ADDRESS`, and the process
//! lives on.
//!
//! Cycle counts: `CUINTERPOSE_BUSY_CYCLES` (in place, default 50) and
//! `CUINTERPOSE_BUSY_DISK_CYCLES` (to disk, default 10). Moments: `CUINTERPOSE_BUSY_SEED` repeats
//! a run (each test prints its seed).

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use testkit::{Reply, TestEnv, Workload};

/// Elements (u32) of each busy round's data.
const ELEMENTS: u64 = 1024;
/// Bytes of a rank's slot in a multicast object (a ring buffer: flags and data).
const SLOT: u64 = 64 << 10;
/// Bytes of the multicast object and of each member.
const MC: u64 = 2 << 20;
/// How long a busy round may take on a loaded two-core machine.
const ROUND_WAIT_MS: u64 = 120_000;

fn cycles(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator (splitmix64) for the moments of the cycles.
struct Moments(u64);

impl Moments {
    /// Seeded from `CUINTERPOSE_BUSY_SEED` or the clock; the seed is printed.
    fn new(test: &str) -> Moments {
        let seed = std::env::var("CUINTERPOSE_BUSY_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: seed {seed} (CUINTERPOSE_BUSY_SEED={seed} repeats it)");
        Moments(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Sleeps a random moment of up to `max_ms`.
    fn pause(&mut self, max_ms: u64) {
        std::thread::sleep(Duration::from_millis(self.next() % (max_ms + 1)));
    }
}

/// One command that must succeed; its reply.
fn one(w: &Workload, line: &str) -> Reply {
    w.ok(line)
        .unwrap_or_else(|e| panic!("{}: {line}: {e}\n--- log ---\n{}", w.name(), w.log_tail()))
}

/// No busy thread of `ranks` has seen a wrong result or a failed call.
fn assert_clean(ranks: &[Workload], when: &str) {
    for w in ranks {
        let s = one(w, "busy-status b");
        assert_eq!(
            s.u64("failures"),
            Some(0),
            "{} failed {when}: {}\n--- log ---\n{}",
            w.name(),
            s.to_line(),
            w.log_tail()
        );
    }
}

/// Every busy thread completes `rounds` more rounds (they still run, and still check).
fn progress(ranks: &[Workload], rounds: u64) {
    let passed: Vec<u64> = ranks
        .iter()
        .map(|w| one(w, "busy-status b").u64("passed").unwrap_or(0))
        .collect();
    for (w, p) in ranks.iter().zip(passed) {
        one(
            w,
            &format!("busy-wait b {} --timeout {ROUND_WAIT_MS}", p + rounds),
        );
    }
    assert_clean(ranks, "while running");
}

/// Stops the busy threads of a group: holds every rank at one round ([`hold_all`]), then stops
/// them; every round passed. The round.
fn stop_all(ranks: &[Workload]) -> u64 {
    let hold = hold_all(ranks);
    for w in ranks {
        let stop = one(w, "busy-stop b");
        assert_eq!(
            (stop.u64("failures"), stop.u64("passed")),
            (Some(0), Some(hold)),
            "{}: {}",
            w.name(),
            stop.to_line()
        );
    }
    hold
}

/// How the ranks of a ring share their buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    /// `cuMemCreate` + POSIX descriptors: rank i's `a<i>` imported by rank i+1.
    Vmm,
    /// `cuMemAlloc` + `cuIpcGetMemHandle`: rank i's `m<i>` opened by rank i+1.
    LegacyIpc,
    /// One multicast object: rank i writes its slot through the multicast mapping (every
    /// member gets it) and reads through its own member.
    Multicast,
}

/// What a group runs.
#[derive(Debug, Clone, Copy)]
enum Busy {
    /// One process, one loop of kernels over its allocation.
    Loop,
    /// A ring of `n` ranks.
    Ring(usize, Sharing),
    /// `n` fake-NCCL ranks.
    Nccl(usize),
}

impl Busy {
    fn processes(self) -> usize {
        match self {
            Busy::Loop => 1,
            Busy::Ring(n, _) | Busy::Nccl(n) => n,
        }
    }

    /// The devices of the ranks (multicast: one device per rank).
    fn devices(self) -> String {
        match self {
            Busy::Ring(n, Sharing::Multicast) => {
                (0..n).map(|d| d.to_string()).collect::<Vec<_>>().join(",")
            }
            _ => "0".into(),
        }
    }

    fn env(self) -> TestEnv {
        let env = env().env("FAKE_CUDA_DEVICES", self.processes().max(2).to_string());
        match self {
            Busy::Nccl(_) => env.with_fake_nccl().expect("the fake NCCL"),
            _ => env,
        }
    }
}

/// Builds the sharing of `busy` on `ranks` and starts busy thread `b` in each.
fn start(ranks: &[Workload], busy: Busy) {
    match busy {
        Busy::Loop => {
            let w = &ranks[0];
            one(w, "malloc buf 1M");
            one(w, &format!("busy-loop b buf --elements {}", 64 * ELEMENTS));
        }
        Busy::Ring(n, sharing) => {
            let views = match sharing {
                Sharing::Vmm => ring_vmm(ranks),
                Sharing::LegacyIpc => ring_ipc(ranks),
                Sharing::Multicast => ring_multicast(ranks),
            };
            for (i, (w, v)) in ranks.iter().zip(views).enumerate() {
                let p = (i + n - 1) % n;
                one(
                    w,
                    &format!(
                        "busy-ring b --mine {} --mine-read {} --prev {} --prev-write {} \
                         --rank {i} --prev-rank {p} --elements {ELEMENTS}",
                        v[0], v[1], v[2], v[3]
                    ),
                );
            }
        }
        Busy::Nccl(n) => {
            one(&ranks[0], "nccl-id id");
            for w in &ranks[1..] {
                one(
                    &ranks[0],
                    &format!("send-ipc id --to {}", w.socket().display()),
                );
            }
            for (r, w) in ranks.iter().enumerate() {
                one(w, "wait ipc id");
                one(
                    w,
                    &format!("busy-nccl b --id id --ranks {n} --rank {r} --elements {ELEMENTS}"),
                );
            }
        }
    }
}

/// Per rank: where it writes its buffer, reads its ack flag, reads its predecessor's buffer and
/// writes its predecessor's ack flag.
type Views = Vec<[String; 4]>;

fn ring_vmm(ranks: &[Workload]) -> Views {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        create_shared(w, &format!("a{i}"), SIZE);
        one(w, &format!("memset a{i} 0"));
    }
    for i in 0..n {
        share(&ranks[i], &ranks[(i + 1) % n], &format!("a{i}"), SIZE);
    }
    (0..n)
        .map(|i| {
            let (mine, prev) = (format!("a{i}"), format!("a{}", (i + n - 1) % n));
            [mine.clone(), mine, prev.clone(), prev]
        })
        .collect()
}

fn ring_ipc(ranks: &[Workload]) -> Views {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        one(w, &format!("malloc m{i} 1M"));
        one(w, &format!("memset m{i} 0"));
        one(w, &format!("ipc-get h{i} m{i}"));
    }
    for i in 0..n {
        let next = &ranks[(i + 1) % n];
        one(
            &ranks[i],
            &format!("send-ipc h{i} --to {}", next.socket().display()),
        );
        one(next, &format!("wait ipc h{i}"));
        one(next, &format!("ipc-open m{i} --blob h{i}"));
    }
    (0..n)
        .map(|i| {
            let (mine, prev) = (format!("m{i}"), format!("m{}", (i + n - 1) % n));
            [mine.clone(), mine, prev.clone(), prev]
        })
        .collect()
}

/// As the multicast tests build it: rank 0 creates the object and hands it to every rank, each
/// binds a member of its own device and maps the object; the slots start zeroed.
fn ring_multicast(ranks: &[Workload]) -> Views {
    let n = ranks.len();
    one(&ranks[0], &format!("mc-create mc {MC} --devices {n}"));
    one(&ranks[0], "export mc");
    for w in &ranks[1..] {
        one(
            &ranks[0],
            &format!("send-fd mc --to {}", w.socket().display()),
        );
        one(w, "wait fd mc");
        one(w, &format!("import mc --size {MC}"));
    }
    for w in ranks {
        one(w, "mc-add-device mc");
    }
    for w in ranks {
        for line in [
            format!("create m {MC} --handle-types posix"),
            format!("reserve r-m {MC}"),
            "map m r-m".into(),
            "set-access m".into(),
            format!("mc-bind-mem mc 0 m --size {MC}"),
            format!("reserve r-mc {MC}"),
            "map mc r-mc".into(),
            "set-access mc".into(),
        ] {
            one(w, &line);
        }
    }
    one(&ranks[0], "memset mc 0");
    (0..n)
        .map(|i| {
            let (s, p) = (i as u64 * SLOT, ((i + n - 1) % n) as u64 * SLOT);
            [
                format!("mc+{s}"),
                format!("m+{s}"),
                format!("m+{p}"),
                format!("mc+{p}"),
            ]
        })
        .collect()
}

/// The ranks of a `run`-started tree (every rank with the shim).
fn tree_ranks(tree: &Tree, n: usize) -> Vec<Workload> {
    (0..n)
        .map(|r| {
            let w = tree.w(&format!("r{r}"));
            Workload::attach(
                format!("busy{r}"),
                w.socket().to_path_buf(),
                w.device(),
                w.log_path().to_path_buf(),
            )
            .expect("attaching to a rank")
        })
        .collect()
}

/// While the group is suspended: no device memory held, every process alive, and no busy thread
/// completes a round (its next submission waits at the gate).
fn assert_quiet(env: &TestEnv, ranks: &[Workload], when: &str) {
    let passed = |w: &Workload| one(w, "busy-status b").u64("passed");
    let before: Vec<_> = ranks.iter().map(passed).collect();
    for w in ranks {
        assert!(alive(w.pid()), "{} died while suspended ({when})", w.name());
        assert_eq!(
            usage(env, w.pid()),
            0,
            "{} holds device memory while suspended ({when})",
            w.name()
        );
    }
    std::thread::sleep(Duration::from_millis(30));
    let after: Vec<_> = ranks.iter().map(passed).collect();
    assert_eq!(before, after, "rounds completed while suspended ({when})");
}

/// Suspends and resumes the busy group in place `count` times per option set (none,
/// `--keep-contexts`, `--carrier helper`), at random moments, checking after each cycle that
/// every rank still runs and has seen no failure; then stops the group, every round passed.
fn in_place(busy: Busy, test: &str) {
    let env = busy.env();
    let n = busy.processes();
    let tree = Tree::run_tree_on(&env, n, &busy.devices());
    let ranks = tree_ranks(&tree, n);
    start(&ranks, busy);
    progress(&ranks, 3);
    let mut moments = Moments::new(test);
    let count = cycles("CUINTERPOSE_BUSY_CYCLES", 50);
    let option_sets: [&[&str]; 3] = [&[], &["--keep-contexts"], &["--carrier", "helper"]];
    for options in option_sets {
        for cycle in 0..count {
            moments.pause(40);
            let run = tool(&env, &strs(&suspend_args(&env, tree.root(), options)));
            assert!(
                run.code == 0,
                "suspend {options:?} cycle {cycle}: {}",
                run.describe()
            );
            assert_quiet(&env, &ranks, &format!("cycle {cycle} of {options:?}"));
            moments.pause(20);
            let run = tool(&env, &strs(&resume_args(&env, tree.root(), &[])));
            assert!(
                run.code == 0,
                "resume {options:?} cycle {cycle}: {}",
                run.describe()
            );
            assert_clean(&ranks, &format!("after cycle {cycle} of {options:?}"));
        }
        progress(&ranks, 2);
    }
    let rounds = stop_all(&ranks);
    eprintln!("{test}: {count} cycles per option set, {rounds} rounds, every one checked");
}

#[test]
fn a_busy_loop_whose_memory_is_freed_under_it_fails_with_a_sticky_illegal_address() {
    let env = env().with_shim(false);
    let w = env
        .spawn(testkit::WorkloadOptions::new("freed"))
        .expect("a workload");
    one(&w, "malloc buf 1M");
    one(&w, &format!("busy-loop b buf --elements {}", 64 * ELEMENTS));
    one(&w, "busy-wait b 5 --timeout 60000");
    // Released under the running loop, as a shim without a drain releases memory.
    one(&w, "free buf");
    let stopped = stopped_with_failure(&w);
    let first = &stopped["first_failure"];
    assert_eq!(first["error"], "CUDA_ERROR_ILLEGAL_ADDRESS", "{stopped}");
    // Sticky: every later call of the process fails the same way, and the process lives.
    w.expect("sync", "CUDA_ERROR_ILLEGAL_ADDRESS")
        .expect("a sticky error");
    w.expect("malloc again 2M", "CUDA_ERROR_ILLEGAL_ADDRESS")
        .expect("a sticky error");
    one(&w, "ping");
}

#[test]
fn a_busy_loop_whose_mapping_is_unmapped_under_it_fails_with_a_sticky_illegal_address() {
    let env = env().with_shim(false);
    let w = env
        .spawn(testkit::WorkloadOptions::new("unmapped"))
        .expect("a workload");
    for line in [
        "create h 2M --handle-types none",
        "reserve r 2M",
        "map h r --as m",
        "set-access m",
    ] {
        one(&w, line);
    }
    one(&w, &format!("busy-loop b m --elements {}", 64 * ELEMENTS));
    one(&w, "busy-wait b 5 --timeout 60000");
    one(&w, "unmap m");
    let stopped = stopped_with_failure(&w);
    assert_eq!(
        stopped["first_failure"]["error"], "CUDA_ERROR_ILLEGAL_ADDRESS",
        "{stopped}"
    );
    w.expect("sync", "CUDA_ERROR_ILLEGAL_ADDRESS")
        .expect("a sticky error");
    one(&w, "ping");
}

/// Waits until busy thread `b` ends by itself (a failed call ends it; it is not asked to stop, so
/// that it runs into the missing memory), then stops it; its reply's fields.
fn stopped_with_failure(w: &Workload) -> Value {
    wait_until("the busy loop fails on the missing memory", || {
        one(w, "busy-status b").data.get("finished") == Some(&Value::Bool(true))
    });
    let stop = one(w, "busy-stop b --timeout 60000");
    let fields = Value::Object(stop.data.clone());
    assert!(
        stop.u64("failures").unwrap_or(0) >= 1,
        "no failure after the memory went: {fields}"
    );
    assert_eq!(fields["finished"], true, "{fields}");
    fields
}

/// Ring sizes of the ring tests: `CUINTERPOSE_BUSY_RINGS` (e.g. `2,8`), default 2, 4 and 8. Rings of
/// 8 drain since a stall admits only into processes at rest (control/src/drain.rs; before,
/// admitting into every process made a chase that most cycles of a ring of 8 never finished); at
/// CI's cycle counts (scripts/test.sh) the rings of 8 of all three sharings, in place and to disk,
/// take about 100 s on 2 cores.
fn ring_sizes() -> Vec<usize> {
    std::env::var("CUINTERPOSE_BUSY_RINGS")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .expect("CUINTERPOSE_BUSY_RINGS: ring sizes")
                })
                .collect()
        })
        .unwrap_or_else(|| vec![2, 4, 8])
}

#[test]
fn a_busy_process_is_suspended_and_resumed_at_random_moments() {
    in_place(Busy::Loop, "busy loop");
}

#[test]
fn busy_vmm_rings_are_suspended_and_resumed() {
    for n in ring_sizes() {
        in_place(Busy::Ring(n, Sharing::Vmm), &format!("vmm ring of {n}"));
    }
}

#[test]
fn busy_legacy_ipc_rings_are_suspended_and_resumed() {
    for n in ring_sizes() {
        in_place(
            Busy::Ring(n, Sharing::LegacyIpc),
            &format!("legacy IPC ring of {n}"),
        );
    }
}

#[test]
fn busy_multicast_rings_are_suspended_and_resumed() {
    for n in ring_sizes() {
        in_place(
            Busy::Ring(n, Sharing::Multicast),
            &format!("multicast ring of {n}"),
        );
    }
}

#[test]
fn fake_nccl_groups_of_2_and_4_are_suspended_and_resumed() {
    for n in [2, 4] {
        in_place(Busy::Nccl(n), &format!("NCCL group of {n}"));
    }
}

/// CRIU for the to-disk cycles: `$CUINTERPOSE_CRIU` or `<repo>/.criu/bin/criu`.
fn criu() -> PathBuf {
    let path = std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.criu/bin/criu"));
    assert!(
        path.is_file(),
        "CRIU not found at {} (set CUINTERPOSE_CRIU): run scripts/install-criu.sh first",
        path.display()
    );
    path
}

/// A restored tree (not our child): killed at the end.
struct Restored(Option<u32>);

impl Drop for Restored {
    fn drop(&mut self) {
        if let Some(root) = self.0 {
            let _ = control::launch::kill_tree(root, Duration::from_secs(30));
        }
    }
}

/// Checkpoints the busy group under `root` into `dir` and restores it; the restored root.
fn disk_cycle(env: &TestEnv, root: u32, dir: &Path, criu: &Path) -> u32 {
    let criu = criu.display().to_string();
    let vars = [("CUINTERPOSE_CRIU", criu.as_str())];
    let dir_arg = dir.display().to_string();
    let pid = root.to_string();
    let run = tool_with(
        env,
        &["checkpoint", "--pid", &pid, "--dir", &dir_arg, "--json"],
        &vars,
    );
    assert!(run.code == 0, "checkpoint: {}", run.describe());
    let run = tool_with(env, &["restore", "--dir", &dir_arg, "--json"], &vars);
    assert!(run.code == 0, "restore: {}", run.describe());
    run.json()["root"].as_u64().expect("restored root") as u32
}

/// Checkpoints the busy group to disk and restores it `count` times at random moments; the
/// restored ranks go on with their rounds, every one checked.
fn to_disk(busy: Busy, test: &str) {
    let env = busy.env();
    let n = busy.processes();
    let criu = criu();
    let dir = env.socket_dir().join("t");
    let mut launcher = start_namespace(
        &env,
        "launcher",
        &dir,
        (n, &busy.devices()),
        &[],
        Duration::from_secs(120),
    );
    let devices = |r: usize| if busy.devices() == "0" { 0 } else { r as i32 };
    let ranks = attach_ranks(&dir, n, "rank", devices);
    start(&ranks, busy);
    progress(&ranks, 3);
    let mut moments = Moments::new(test);
    let mut root = launcher.id();
    let mut restored = Restored(None);
    for cycle in 0..cycles("CUINTERPOSE_BUSY_DISK_CYCLES", 10) {
        moments.pause(40);
        let ck = env.dir().join(format!("ck{cycle}"));
        let new_root = disk_cycle(&env, root, &ck, &criu);
        if cycle == 0 {
            let _ = launcher.wait();
        }
        let _ = std::fs::remove_dir_all(&ck);
        root = new_root;
        // The previous root went with the checkpoint: only the new one is ours to kill.
        restored.0 = Some(root);
        let ranks = attach_ranks(&dir, n, "rank", devices);
        assert_clean(&ranks, &format!("after disk cycle {cycle}"));
        progress(&ranks, 2);
    }
    let ranks = attach_ranks(&dir, n, "rank", devices);
    let rounds = stop_all(&ranks);
    eprintln!("{test}: {rounds} rounds through the disk cycles, every one checked");
    drop(restored);
    end_namespace(&mut launcher);
}

#[test]
fn a_busy_process_is_checkpointed_to_disk_and_restored() {
    to_disk(Busy::Loop, "busy loop to disk");
}

#[test]
fn busy_rings_are_checkpointed_to_disk_and_restored() {
    for sharing in [Sharing::Vmm, Sharing::LegacyIpc, Sharing::Multicast] {
        for n in ring_sizes() {
            to_disk(
                Busy::Ring(n, sharing),
                &format!("{sharing:?} ring of {n} to disk"),
            );
        }
    }
}

#[test]
fn fake_nccl_groups_are_checkpointed_to_disk_and_restored() {
    for n in [2, 4] {
        to_disk(Busy::Nccl(n), &format!("NCCL group of {n} to disk"));
    }
}

/// Rank 1 never calls the collective rank 0 has enqueued: the freeze cannot drain rank 0's
/// stream, so the tool refuses after its deadline with exit 4 and releases nothing; the group
/// still runs, and once rank 1 calls it the collective completes and checks.
#[test]
fn a_collective_that_can_never_complete_is_refused_after_the_deadline() {
    let busy = Busy::Nccl(2);
    let env = busy.env();
    let tree = Tree::run_tree_on(&env, 2, &busy.devices());
    let ranks = tree_ranks(&tree, 2);
    start(&ranks, busy);
    progress(&ranks, 3);
    let held = hold_all(&ranks);
    // Rank 0 enqueues round held + 1; rank 1 stays held at `held`.
    one(&ranks[0], &format!("busy-hold b {}", held + 1));
    std::thread::sleep(Duration::from_millis(200));
    let s = one(&ranks[0], "busy-status b");
    assert_eq!(s.u64("started"), Some(held + 1), "{}", s.to_line());
    assert_eq!(s.u64("passed"), Some(held), "{}", s.to_line());

    let run = tool(
        &env,
        &strs(&suspend_args(&env, tree.root(), &["--freeze-timeout", "2"])),
    );
    run.expect_code(EXIT_ROLLED_BACK);
    // The refusal names the process whose work cannot drain.
    run.stderr_mentions(&[&format!("pid {}", ranks[0].pid())]);
    for w in &ranks {
        assert!(usage(&env, w.pid()) > 0, "{} lost its memory", w.name());
    }
    // Nothing moved: rank 0 still waits in its collective; rank 1 joins and both complete it.
    let s = one(&ranks[0], "busy-status b");
    assert_eq!(s.u64("passed"), Some(held), "{}", s.to_line());
    one(&ranks[1], &format!("busy-hold b {}", held + 1));
    for w in &ranks {
        one(
            w,
            &format!("busy-wait b {} --timeout {ROUND_WAIT_MS}", held + 1),
        );
    }
    for w in &ranks {
        one(w, "busy-release b");
    }
    progress(&ranks, 5);
    stop_all(&ranks);
}

/// Holds every rank at the same round, the highest any has started (so that none waits for a
/// round a peer never runs), and waits until each has completed it; the round.
fn hold_all(ranks: &[Workload]) -> u64 {
    let mut hold = 0;
    loop {
        let holds: Vec<u64> = ranks
            .iter()
            .map(|w| {
                one(w, &format!("busy-hold b {hold}"))
                    .u64("hold")
                    .unwrap_or(0)
            })
            .collect();
        let highest = holds.iter().copied().max().unwrap_or(0);
        if highest == hold && holds.iter().all(|&h| h == hold) {
            break;
        }
        hold = highest;
    }
    for w in ranks {
        one(w, &format!("busy-wait b {hold} --timeout {ROUND_WAIT_MS}"));
    }
    hold
}

/// A process whose context already holds a sticky error (its own kernel touched memory freed
/// under it) cannot be drained: the capture is refused before anything changes, naming the
/// process and the error, and the group runs on (issue 29).
#[test]
fn a_context_holding_a_sticky_error_is_refused_before_anything_changes() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a"), Member::shim("b")]);
    pair(&tree);
    let (a, b) = (tree.w("a"), tree.w("b"));
    one(a, "malloc buf 1M");
    one(a, &format!("busy-loop b buf --elements {}", 64 * ELEMENTS));
    one(a, "busy-wait b 5 --timeout 60000");
    // Freed under the running loop, whose next kernel faults. The free may itself come after
    // the fault and return it (sticky: every later call does), so either answer is right.
    if let Err(e) = a.ok("free buf") {
        assert!(
            e.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
            "free buf: {e}"
        );
    }
    let stopped = stopped_with_failure(a);
    assert_eq!(
        stopped["first_failure"]["error"], "CUDA_ERROR_ILLEGAL_ADDRESS",
        "{stopped}"
    );
    let run = tool(&env, &strs(&suspend_args(&env, tree.root(), &[])));
    run.expect_code(EXIT_REFUSED).stderr_mentions(&[
        &format!("pid {}", a.pid()),
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "nothing was changed",
    ]);
    for w in [a, b] {
        let record = record_of(&env, w.pid());
        assert_eq!(record.phase, protocol::Phase::Running, "{}", w.name());
        assert!(!record.gate.closed, "{}: its gate stayed closed", w.name());
    }
    // `b` was never touched: its work and its sharing go on.
    ok(b, &["fill a0 9", "verify a0 9"]);
}
