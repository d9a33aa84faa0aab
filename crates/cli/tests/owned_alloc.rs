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
    assert_eq!(report["shared_bytes"], carried, "{}", run.describe());
    assert_eq!(usage(&env, a.pid()), 0, "memory held while suspended");
    let run = resume(&env, tree.root());
    let report = run.ok().json();
    assert_eq!(report["shared_bytes"], carried, "{}", run.describe());
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
        run.ok().json()["shared_bytes"],
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
