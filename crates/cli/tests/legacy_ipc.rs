//! Legacy CUDA IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`) served by the shims over owned
//! `cuMemAlloc` memory (`CUINTERPOSE_ALLOC=vmm`), in real processes over the fake driver: the
//! handle is the shim's virtual one, opens are counted and answer the allocation's base and
//! requested size, a group sharing memory that way is suspended and resumed with every importer
//! seeing its creator's new writes at the same address, and checkpointed to disk and restored
//! (the real CRIU: root); a handle that is not the shim's (memory
//! the driver made) is opened natively and refused at capture, naming the process.

mod common;

use common::*;
use protocol::ipc::IpcHandle;
use std::collections::BTreeMap;
use testkit::Workload;
use testkit::harness::RegionInfo;

const MIB: u64 = 1 << 20;
const ALLOC: &str = "CUINTERPOSE_ALLOC";

/// `CUDA_ERROR_INVALID_CONTEXT`, what r580 answers for an open in the creating process.
const INVALID_CONTEXT: u32 = 201;

fn owned(name: &str) -> Member {
    Member::shim(name).env(ALLOC, "vmm")
}

/// `ipc-get` of `spec` in `from`, sent to `to` as `name`; the handle's bytes.
fn send_handle(from: &Workload, to: &Workload, name: &str, spec: &str) -> [u8; 64] {
    let got = from
        .ok(&format!("ipc-get {name} {spec}"))
        .unwrap_or_else(|e| panic!("{e}\n{}", from.log_tail()));
    let hex = got.str("handle").expect("handle bytes").to_string();
    ok(
        from,
        &[&format!("send-ipc {name} --to {}", to.socket().display())],
    );
    ok(to, &[&format!("wait ipc {name}")]);
    let bytes: Vec<u8> = (0..64)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    bytes.try_into().expect("64 bytes")
}

/// `ipc-open region --blob blob`: the base and size the workload saw.
fn open(w: &Workload, region: &str, blob: &str) -> (u64, u64) {
    let r = w
        .ok(&format!("ipc-open {region} --blob {blob}"))
        .unwrap_or_else(|e| panic!("{e}\n{}", w.log_tail()));
    (r.u64("base").expect("base"), r.u64("size").expect("size"))
}

/// `cuinterpose inspect --json` of the tree.
fn inspect(env: &testkit::TestEnv, tree: &Tree) -> serde_json::Value {
    tool(
        env,
        &["inspect", "--pid", &tree.root().to_string(), "--json"],
    )
    .ok()
    .json()
}

/// The shim's record of the process with host PID `pid` in an inspection.
fn process_of(report: &serde_json::Value, pid: u32) -> serde_json::Value {
    report["snapshots"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["info"]["host_pid"] == pid))
        .map(|p| p["record"].clone())
        .unwrap_or_else(|| panic!("no process {pid} in {report}"))
}

#[test]
fn owned_memory_is_shared_through_virtual_handles_with_the_drivers_semantics() {
    let env = env();
    let tree = Tree::launch(&env, &[owned("a"), owned("b")]);
    let (a, b) = (tree.w("a"), tree.w("b"));
    // 3 MiB + 16: backed by 4 MiB.
    let requested = 3 * MIB + 16;
    ok(a, &[&format!("malloc m {requested}"), "fill m 41"]);
    let base_a = regions(a)["m"].base;
    // A handle of an interior pointer names the allocation and the pointer's offset.
    let bytes = send_handle(a, b, "h", "m+8192");
    let handle = IpcHandle::decode(&bytes).expect("a cuinterpose IPC handle");
    assert_eq!(handle.creator_ns_pid, a.pid());
    assert_eq!(handle.offset, 8192);
    assert_eq!(handle.requested, requested);
    assert_eq!(handle.backing, 4 * MIB);
    // The open answers the base of the allocation and its requested size, as the driver does;
    // a second open of the same handle the same address.
    let (base, size) = open(b, "m", "h");
    assert_eq!(
        size, requested,
        "cuMemGetAddressRange of the opened mapping"
    );
    let (again, _) = open(b, "m2", "h");
    assert_eq!(again, base, "opened twice: one mapping");
    ok(b, &["verify m 41"]);
    // One close of two: still mapped.
    ok(b, &["ipc-close m2", "verify m 41", "fill m 42"]);
    ok(a, &["verify m 42"]);
    // Nothing blocks a capture: the open is an import of a shared creation.
    let report = inspect(&env, &tree);
    let record = process_of(&report, b.pid());
    assert_eq!(record["blockers"], serde_json::json!([]), "{report}");
    assert_eq!(
        record["imports"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert_eq!(record["mappings"][0]["address"], base, "{report}");
    // Suspended and resumed: the same addresses, the bytes kept, sharing both ways after.
    let (before_a, before_b) = (regions(a), regions(b));
    let run = suspend(&env, tree.root(), &[]);
    let report = run.ok().json();
    assert_eq!(report["saved_bytes"], 4 * MIB, "{}", run.describe());
    assert_eq!(usage(&env, a.pid()), 0, "memory held while suspended");
    resume(&env, tree.root()).ok();
    assert_eq!(regions(a), before_a);
    assert_eq!(regions(b), before_b);
    assert_eq!(regions(a)["m"].base, base_a);
    ok(b, &["verify m 42", "fill m 43"]);
    ok(a, &["verify m 43", "fill m 44"]);
    ok(b, &["verify m 44"]);
    // The creator opening its own handle: refused as r580 refuses it.
    let own = a.cmd("ipc-open self --blob h").expect("reply");
    assert!(!own.ok, "{}", own.outcome());
    assert_eq!(own.code, Some(INVALID_CONTEXT), "{}", own.outcome());
    // The last close unmaps and frees the range: the opener holds nothing more.
    ok(b, &["ipc-close m"]);
    let after = inspect(&env, &tree);
    let record = process_of(&after, b.pid());
    for part in ["imports", "mappings", "reservations"] {
        assert_eq!(
            record[part],
            serde_json::json!([]),
            "{part} after the last close: {after}"
        );
    }
    // Opened again after the close: mapped anew, the creator's bytes.
    let (_, size) = open(b, "m3", "h");
    assert_eq!(size, requested);
    ok(b, &["verify m3 44", "ipc-close m3"]);
    ok(a, &["free m"]);
}

#[test]
fn memory_freed_by_its_creator_while_opened_elsewhere_stays_readable_and_is_refused_at_capture() {
    let env = env();
    let tree = Tree::launch(&env, &[owned("a"), owned("b")]);
    let (a, b) = (tree.w("a"), tree.w("b"));
    ok(a, &["malloc m 2M", "fill m 51"]);
    send_handle(a, b, "h", "m");
    open(b, "m", "h");
    ok(a, &["free m"]);
    // The driver keeps memory alive while an IPC peer maps it.
    ok(b, &["verify m 51"]);
    // Its creator no longer has it: the opener's import cannot be rebuilt, so capture refuses.
    let run = expect_refusal(&env, &tree, &[(b.pid(), "that its creator")]);
    assert!(
        run.stderr.contains("does not report as exported"),
        "{}",
        run.describe()
    );
    ok(b, &["verify m 51", "ipc-close m"]);
    // Closed, nothing is left to refuse.
    suspend(&env, tree.root(), &[]).ok();
    resume(&env, tree.root()).ok();
}

#[test]
fn a_handle_the_driver_made_is_opened_natively_and_refused_at_capture() {
    let env = env();
    // `a` leaves cuMemAlloc to the driver: its handle is the driver's own.
    let tree = Tree::launch(&env, &[Member::shim("a").env(ALLOC, "native"), owned("b")]);
    let (a, b) = (tree.w("a"), tree.w("b"));
    ok(a, &["malloc m 2M", "fill m 61"]);
    let bytes = send_handle(a, b, "h", "m");
    assert!(!IpcHandle::is_ours(&bytes), "the driver's handle");
    open(b, "m", "h");
    ok(b, &["verify m 61"]);
    let run = expect_refusal(
        &env,
        &tree,
        &[
            (a.pid(), "exported legacy CUDA IPC memory"),
            (b.pid(), "has legacy CUDA IPC memory open"),
        ],
    );
    assert_eq!(
        std::fs::read_dir(state_dir(&env))
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "a state file after a refusal: {}",
        run.describe()
    );
    ok(a, &["fill m 62"]);
    ok(b, &["verify m 62"]);
}

/// Makes a ring of owned processes: rank `r` allocates `m<r>` ((r + 1) MiB), fills it, sends
/// its handle to rank `r + 1`, which opens it. The bytes carried at capture: whole 2 MiB granules.
fn make_ring(w: &[&Workload]) -> u64 {
    let n = w.len();
    for (r, rank) in w.iter().enumerate() {
        ok(
            rank,
            &[
                &format!("malloc m{r} {}", (r as u64 + 1) * MIB),
                &format!("fill m{r} {}", 70 + r),
            ],
        );
    }
    for r in 0..n {
        let next = w[(r + 1) % n];
        send_handle(w[r], next, &format!("h{r}"), &format!("m{r}"));
        open(next, &format!("m{r}"), &format!("h{r}"));
        ok(next, &[&format!("verify m{r} {}", 70 + r)]);
    }
    (0..n as u64)
        .map(|r| (r + 1).next_multiple_of(2) * MIB)
        .sum()
}

/// After a rebuild: every rank's addresses as `before`, and new writes seen both ways across
/// every link of the ring (creator to opener, opener to creator).
fn check_ring(w: &[&Workload], before: &[BTreeMap<String, RegionInfo>], round: u64) {
    let n = w.len();
    for (r, regions_before) in before.iter().enumerate() {
        assert_eq!(
            &regions(w[r]),
            regions_before,
            "rank {r}: addresses changed"
        );
        let next = w[(r + 1) % n];
        let seed = 100 * (round + 1) + r as u64;
        ok(w[r], &[&format!("fill m{r} {seed}")]);
        ok(
            next,
            &[
                &format!("verify m{r} {seed}"),
                &format!("fill m{r} {}", seed + 50),
            ],
        );
        ok(w[r], &[&format!("verify m{r} {}", seed + 50)]);
    }
}

/// A ring of `n` owned processes suspended and resumed twice.
fn ring_suspend_resume(n: usize) {
    let env = env();
    let names: Vec<String> = (0..n).map(|r| format!("p{r}")).collect();
    let members: Vec<Member> = names.iter().map(|n| owned(n)).collect();
    let tree = Tree::launch(&env, &members);
    let w: Vec<&Workload> = names.iter().map(|name| tree.w(name)).collect();
    let carried = make_ring(&w);
    let before: Vec<_> = w.iter().map(|rank| regions(rank)).collect();
    for round in 0..2u64 {
        let run = suspend(&env, tree.root(), &[]);
        assert_eq!(
            run.ok().json()["saved_bytes"],
            carried,
            "{}",
            run.describe()
        );
        resume(&env, tree.root()).ok();
        check_ring(&w, &before, round);
    }
}

/// A ring of `n` owned processes on two devices in a PID namespace of its own, checkpointed to
/// disk (gone) and restored: the handles, which name creators by namespace PID, open again.
fn ring_to_disk(n: usize) {
    let env = env();
    let mut group = pidns::PidnsGroup::start(&env, n, "0,1", &[(ALLOC, "vmm")]);
    let carried = make_ring(&group.ranks.iter().collect::<Vec<_>>());
    let before: Vec<_> = group.ranks.iter().map(regions).collect();
    let dir = env.dir().join("ck");
    group.checkpoint(&env, &dir);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
            .expect("manifest JSON");
    assert_eq!(manifest["bytes"]["saved"], carried, "{manifest}");
    group.restore(&env, &dir);
    let w: Vec<&Workload> = group.ranks.iter().collect();
    check_ring(&w, &before, 0);
    // And once more in place, after the restore.
    let run = suspend(&env, group.root(), &[]);
    assert_eq!(
        run.ok().json()["saved_bytes"],
        carried,
        "{}",
        run.describe()
    );
    resume(&env, group.root()).ok();
    check_ring(&w, &before, 1);
}

#[test]
fn a_legacy_ipc_pair_is_checkpointed_to_disk_and_restored() {
    ring_to_disk(2);
}

#[test]
fn a_legacy_ipc_ring_of_four_is_checkpointed_to_disk_and_restored() {
    ring_to_disk(4);
}

#[test]
fn a_legacy_ipc_pair_is_suspended_and_resumed() {
    ring_suspend_resume(2);
}

#[test]
fn a_legacy_ipc_ring_of_four_is_suspended_and_resumed() {
    ring_suspend_resume(4);
}

#[test]
fn with_the_native_setting_legacy_ipc_is_the_drivers_and_refused() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[
            Member::shim("a").env(ALLOC, "native"),
            Member::shim("b").env(ALLOC, "native"),
        ],
    );
    let (a, b) = (tree.w("a"), tree.w("b"));
    ok(a, &["malloc m 2M", "fill m 81"]);
    let bytes = send_handle(a, b, "h", "m");
    assert!(!IpcHandle::is_ours(&bytes), "the driver's handle");
    open(b, "m", "h");
    ok(b, &["verify m 81"]);
    expect_refusal(
        &env,
        &tree,
        &[
            (a.pid(), "exported legacy CUDA IPC memory"),
            (b.pid(), "has legacy CUDA IPC memory open"),
        ],
    );
    ok(b, &["ipc-close m"]);
    ok(a, &["free m"]);
    suspend(&env, tree.root(), &[]).ok();
    resume(&env, tree.root()).ok();
    ok(a, &["malloc n 2M", "fill n 82"]);
}

/// `cuinterpose demo --sharing MODE --json` (and with `--to-disk`): the group's memory made that
/// way, carried by the shims (4 MiB per process), none held while suspended or after the dump,
/// and verified afterwards: for legacy IPC by the creator and the process that opened it, for
/// private memory by its own process.
fn demo_with(sharing: &str, to_disk: bool) {
    let env = env();
    let mut args = vec!["demo", "--sharing", sharing, "--size", "4194304", "--json"];
    if to_disk {
        args.push("--to-disk");
    }
    let criu = pidns::criu();
    // A caller's CUINTERPOSE_ALLOC=native does not change what the demo shows.
    let run = tool_with(
        &env,
        &args,
        &[
            ("CUINTERPOSE_CRIU", criu.to_str().expect("utf-8 path")),
            (ALLOC, "native"),
        ],
    );
    let report = run.ok().json();
    assert_eq!(report["sharing"], sharing, "{}", run.describe());
    assert_eq!(report["group_memory_before"], 8 * MIB, "{}", run.describe());
    let verified: Vec<String> = report["verified"]
        .as_array()
        .expect("verified")
        .iter()
        .map(|v| v.as_str().expect("a check").to_string())
        .collect();
    assert_eq!(verified.len(), 4, "{verified:?}");
    let first = if sharing == "private" {
        "a0: contents kept in rank 0"
    } else {
        "a0: contents kept in creator rank 0 and importer rank 1"
    };
    assert_eq!(verified[0], first, "{verified:?}");
    if to_disk {
        assert_eq!(report["checkpoint"]["saved_bytes"], 8 * MIB, "{report}");
        assert_eq!(report["group_memory_checkpointed"], 0, "{report}");
        assert_eq!(report["group_memory_restored"], 8 * MIB, "{report}");
    } else {
        assert_eq!(report["suspend"]["saved_bytes"], 8 * MIB, "{report}");
        assert_eq!(report["group_memory_suspended"], 0, "{report}");
    }
}

#[test]
fn demo_sharing_legacy_ipc() {
    demo_with("legacy-ipc", false);
}

#[test]
fn demo_sharing_legacy_ipc_to_disk() {
    demo_with("legacy-ipc", true);
}

#[test]
fn demo_sharing_private() {
    demo_with("private", false);
}

#[test]
fn demo_sharing_private_to_disk() {
    demo_with("private", true);
}

/// `pointer-attrs` of `spec` in `w`: the attributes by name.
fn pointer_attrs(w: &Workload, spec: &str) -> Vec<(&'static str, u64)> {
    let reply = w.cmd(&format!("pointer-attrs {spec}")).unwrap();
    assert!(reply.ok, "{}: {}", w.name(), reply.outcome());
    [
        "memory_type",
        "device",
        "legacy_ipc",
        "range_start",
        "range_size",
        "mapped",
    ]
    .into_iter()
    .map(|k| {
        (
            k,
            reply
                .u64(k)
                .unwrap_or_else(|| panic!("no {k}: {}", reply.outcome())),
        )
    })
    .collect()
}

/// `cuPointerGetAttribute(s)` answer for owned memory (VMM underneath) what the driver answers for
/// its own cuMemAlloc memory: device memory of its device, legacy-IPC capable, the range of the
/// requested size from the base (also from an interior pointer), mapped; and for a mapping opened
/// through a virtual IPC handle what the driver answers for an opened IPC mapping; the same again
/// after a suspend.
#[test]
fn pointer_attributes_of_owned_memory_are_those_of_cu_mem_alloc_memory() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[
            owned("a"),
            owned("b"),
            Member::shim("n").env(ALLOC, "native"),
            Member::shim("nb").env(ALLOC, "native"),
        ],
    );
    let (a, b, n, nb) = (tree.w("a"), tree.w("b"), tree.w("n"), tree.w("nb"));
    let requested = 3 * MIB + 16;
    for w in [a, n] {
        ok(w, &[&format!("malloc m {requested}")]);
    }
    send_handle(a, b, "h", "m");
    open(b, "m", "h");
    send_handle(n, nb, "h", "m");
    open(nb, "m", "h");
    let expected = |w: &Workload, legacy: u64| {
        vec![
            ("memory_type", 2),
            ("device", 0),
            ("legacy_ipc", legacy),
            ("range_start", regions(w)["m"].base),
            ("range_size", requested),
            ("mapped", 1),
        ]
    };
    let check = |members: &[(&Workload, u64)], round: &str| {
        for (w, legacy) in members {
            for spec in ["m", "m+8192"] {
                assert_eq!(
                    pointer_attrs(w, spec),
                    expected(w, *legacy),
                    "{} {spec}, {round}",
                    w.name()
                );
            }
        }
    };
    check(&[(a, 1), (n, 1), (b, 0), (nb, 0)], "before");
    // Native legacy IPC is refused at capture: the native pair lets its memory go first.
    ok(nb, &["ipc-close m"]);
    ok(n, &["free m"]);
    suspend(&env, tree.root(), &[]).ok();
    resume(&env, tree.root()).ok();
    check(&[(a, 1), (b, 0)], "after a suspend");
}
