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
