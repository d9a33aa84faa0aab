//! `cuMemAlloc` owned by the shim (`CUINTERPOSE_ALLOC=vmm`), in real processes over the fake
//! driver: the memory is carried through the suspend like shared memory (the suspend report counts
//! its granularity-rounded backing), none is held while suspended, and it comes back at the same
//! address with the same bytes, writable; with the native setting the driver's checkpoint keeps it.

mod common;

use common::*;

const MIB: u64 = 1 << 20;

fn suspend_and_resume_private_malloc(alloc: &str, carried: u64) {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a").env("CUINTERPOSE_ALLOC", alloc)]);
    let a = tree.w("a");
    // 3 MiB: backed by 4 MiB of 2 MiB granularity when owned.
    ok(a, &["malloc m 3M", "fill m 41"]);
    // No allocation handle behind cuMemAlloc memory, owned or not: the same INVALID_VALUE.
    let retained = a.cmd("retain-from-address rh m").unwrap();
    assert!(!retained.ok, "{}", retained.outcome());
    assert_eq!(retained.code, Some(1), "{}", retained.outcome());
    let before = regions(a);
    let run = suspend(&env, tree.root(), &[]);
    let report = run.ok().json();
    assert_eq!(report["saved_bytes"], carried, "{}", run.describe());
    assert_eq!(usage(&env, a.pid()), 0, "memory held while suspended");
    let run = resume(&env, tree.root());
    let report = run.ok().json();
    assert_eq!(report["saved_bytes"], carried, "{}", run.describe());
    assert_eq!(regions(a), before, "addresses changed");
    ok(a, &["verify m 41", "fill m 42", "verify m 42", "free m"]);
}

#[test]
fn owned_cu_mem_alloc_is_carried_and_comes_back_at_its_address() {
    suspend_and_resume_private_malloc("vmm", 4 * MIB);
}

#[test]
fn native_cu_mem_alloc_is_left_to_the_native_checkpoint() {
    suspend_and_resume_private_malloc("native", 0);
}

/// A private `cuMemCreate` allocation (made with no shareable handle type, never exported) is
/// carried like a shared one: none of it is held while suspended, and it comes back at its address
/// with its bytes, beside native `cuMemAlloc` memory, which the driver's checkpoint keeps.
#[test]
fn a_private_cu_mem_create_allocation_is_carried_through_a_suspend() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[Member::shim("a").env("CUINTERPOSE_ALLOC", "native")],
    );
    let a = tree.w("a");
    ok(
        a,
        &[
            "create p 4M --handle-types none",
            "reserve r-p 4M",
            "map p r-p",
            "set-access p --device 0",
            "fill p 51",
            "malloc m 2M",
            "fill m 52",
        ],
    );
    let before = regions(a);
    let run = suspend(&env, tree.root(), &[]);
    let report = run.ok().json();
    assert_eq!(report["saved_bytes"], 4 * MIB, "{}", run.describe());
    assert_eq!(
        report["participants"][0]["created"],
        1,
        "{}",
        run.describe()
    );
    assert_eq!(
        report["participants"][0]["created_shared"],
        0,
        "{}",
        run.describe()
    );
    // What the shim itself reports having copied and released, not the tool's count.
    for phase in ["save", "release"] {
        let moved = report["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == phase)
            .map(|p| p["bytes"].clone());
        assert_eq!(moved, Some((4 * MIB).into()), "{phase}: {}", run.describe());
    }
    assert_eq!(usage(&env, a.pid()), 0, "memory held while suspended");
    let run = resume(&env, tree.root());
    assert_eq!(
        run.ok().json()["saved_bytes"],
        4 * MIB,
        "{}",
        run.describe()
    );
    assert_eq!(regions(a), before, "addresses changed");
    ok(
        a,
        &["verify p 51", "verify m 52", "fill p 53", "verify p 53"],
    );
}

/// The `unowned` list of the one process under `root`, from `inspect --json`: (kind, allocations,
/// bytes), and the text `inspect` prints.
fn unowned(env: &testkit::TestEnv, root: u32) -> (Vec<(String, u64, u64)>, String) {
    let root = root.to_string();
    let json = tool(env, &["inspect", "--pid", &root, "--json"])
        .ok()
        .json();
    let list = json["snapshots"][0]["record"]["unowned"]
        .as_array()
        .expect("an unowned list")
        .iter()
        .map(|u| {
            (
                u["kind"].as_str().expect("kind").to_string(),
                u["allocations"].as_u64().expect("allocations"),
                u["bytes"].as_u64().expect("bytes"),
            )
        })
        .collect();
    let text = tool(env, &["inspect", "--pid", &root]).ok().stdout.clone();
    (list, text)
}

/// Memory the shim does not own is listed by `inspect`, per kind, as it is made and freed, and a
/// suspend leaves it to the driver's checkpoint with its contents.
#[test]
fn inspect_lists_the_device_memory_left_to_the_drivers_checkpoint() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[Member::shim("a").env("CUINTERPOSE_ALLOC", "native")],
    );
    let a = tree.w("a");
    ok(
        a,
        &[
            "malloc m 3M",
            "malloc g 2M --kind managed",
            "malloc s 4M --kind async",
            // 4 rows of 2 KiB: the pitch is 2 KiB (a multiple of 512), 8 KiB in all.
            "malloc p 8192 --kind pitch",
            "create c 2M --handle-types none",
            "reserve r-c 2M",
            "map c r-c",
            "set-access c --device 0",
        ],
    );
    for (name, seed) in [("m", 61), ("g", 62), ("s", 63), ("p", 64), ("c", 65)] {
        ok(a, &[&format!("fill {name} {seed}")]);
    }
    let (list, text) = unowned(&env, tree.root());
    let entry = |kind: &str, n: u64, bytes: u64| (kind.to_string(), n, bytes);
    assert_eq!(
        list,
        [
            entry("DriverAlloc", 1, 3 * MIB),
            entry("Pitched", 1, 8192),
            entry("Managed", 1, 2 * MIB),
            entry("StreamOrdered", 1, 4 * MIB),
        ]
    );
    assert!(
        text.contains("2.00 MiB in 1 allocation(s) / 3.00 MiB in 1 x cuMemAlloc by the driver"),
        "{text}"
    );
    assert!(text.contains("cuMemAllocAsync"), "{text}");
    ok(a, &["free s --async", "free g"]);
    let (list, _) = unowned(&env, tree.root());
    assert_eq!(
        list,
        [entry("DriverAlloc", 1, 3 * MIB), entry("Pitched", 1, 8192)]
    );
    // The shim carries its own creation; the driver's checkpoint keeps the rest.
    let run = suspend(&env, tree.root(), &[]);
    assert_eq!(
        run.ok().json()["saved_bytes"],
        2 * MIB,
        "{}",
        run.describe()
    );
    resume(&env, tree.root()).ok();
    ok(
        a,
        &[
            "verify m 61",
            "verify p 64",
            "verify c 65",
            "free m",
            "free p",
        ],
    );
    let (list, _) = unowned(&env, tree.root());
    assert!(list.is_empty(), "{list:?}");
}

/// `cuCtxEnablePeerAccess` reaches cuMemAlloc memory implicitly; on owned memory the shim grants
/// the peer device access to the context's allocations made before and after the enable, the
/// grants survive a suspend/resume, and the disable takes them back.
#[test]
fn peer_access_reaches_owned_cu_mem_alloc_memory_before_and_after_a_suspend() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("a")]);
    let a = tree.w("a");
    let access = |region: &str| -> String {
        let r = a
            .ok(&format!("get-access {region} --device 1"))
            .unwrap_or_else(|e| panic!("{e}"));
        r.str("access").expect("access").to_string()
    };
    ok(a, &["malloc m 2M", "fill m 21"]);
    assert_eq!(access("m"), "none", "device 1 before any peer access");
    ok(a, &["peer-access enable 1", "malloc n 2M", "fill n 22"]);
    assert_eq!(access("m"), "rw", "granted at the enable");
    assert_eq!(access("n"), "rw", "granted at the allocation");
    let run = suspend(&env, tree.root(), &[]);
    assert_eq!(
        run.ok().json()["saved_bytes"],
        4 * MIB,
        "{}",
        run.describe()
    );
    resume(&env, tree.root()).ok();
    assert_eq!(access("m"), "rw", "replayed at rebuild");
    assert_eq!(access("n"), "rw", "replayed at rebuild");
    ok(a, &["verify m 21", "verify n 22", "peer-access disable 1"]);
    assert_eq!(access("m"), "none");
    assert_eq!(access("n"), "none");
    let twice = a.cmd("peer-access disable 1").expect("reply");
    assert_eq!(
        twice.code,
        Some(705),
        "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: {}",
        twice.outcome()
    );
}
