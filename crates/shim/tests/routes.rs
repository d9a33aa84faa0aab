//! Every route to a driver entry point ends at the shim's wrapper for tracked functions and at the
//! driver's own function for untracked ones; calls through the wrappers return the driver's own
//! results. Each program runs twice, with and without the shim, on the fake driver.

mod common;

use common::{
    Launch, Report, SHIM_FILE, Work, assert_calls_identical, assert_not_found, assert_untouched,
    assert_wrapped,
};

fn path_str(path: &std::path::Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Runs `program` on the fake driver with and without the shim, with the driver's state and the
/// shim's control sockets in the test's own directories.
fn both(work: &Work, program: &std::path::Path, launch: Launch) -> (Report, Report) {
    let launch = launch
        .library_path(work.fake_driver_dir())
        .env("FAKE_CUDA_STATE_DIR", work.state_dir())
        .env("CUINTERPOSE_CONTROL_DIR", work.control_dir());
    let with = launch.with_shim().run(program).report();
    let without = launch.run(program).report();
    (with, without)
}

#[test]
fn direct_link_binds_to_the_wrappers() {
    let work = Work::new();
    let driver = work.fake_driver_dir();
    let program = work.program(
        "direct",
        &["direct.c"],
        &["-L", path_str(&driver), "-lcuda"],
    );
    let (with, without) = both(&work, &program, Launch::new());
    // The runtime starts at the first successful cuInit routed to it, not before.
    assert_eq!(with.line("runtime.before_init").status, 0, "{}", with.run());
    assert_eq!(with.line("runtime.after_init").status, 1, "{}", with.run());
    assert_eq!(without.line("runtime.after_init").status, 0);
    for (label, wrapper) in [
        ("addr.cuMemCreate", "cuMemCreate"),
        ("addr.cuMemMap", "cuMemMap"),
        ("addr.cuInit", "cuInit"),
        ("addr.cuGetProcAddress_v2", "cuGetProcAddress_v2"),
    ] {
        assert_wrapped(&with, &without, label, wrapper);
    }
    assert_untouched(&with, &without, "addr.cuMemGetAllocationGranularity");
    assert_untouched(&with, &without, "addr.cuDriverGetVersion");
    assert_calls_identical(&with, &without);
    assert_eq!(with.line("call.cuMemCreate.ok").result, 0, "{}", with.run());
    assert_eq!(
        with.line("call.cuMemCreate.ok").status,
        1,
        "a handle was returned"
    );
    assert_ne!(with.line("call.cuMemCreate.null_handle").result, 0);
}

#[test]
fn dlsym_on_the_driver_returns_wrappers() {
    let work = Work::new();
    let plugin = work.library("libplugin.so", &["plugin.c"], &[]);
    let program = work.program("dlopen", &["dlopen.c"], &[]);
    let (with, without) = both(&work, &program, Launch::new().arg(&plugin));
    for name in [
        "cuInit",
        "cuMemCreate",
        "cuMemMap",
        "cuMemFree_v2",
        "cuIpcOpenMemHandle_v2",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuMemcpyHtoD_v2",
    ] {
        assert_wrapped(&with, &without, &format!("dlsym.{name}"), name);
    }
    // Untracked, unknown, the export table, and an exact legacy name (no wrapper for that ABI).
    for name in [
        "cuDriverGetVersion",
        "cuGetExportTable",
        "cuNoSuchFunction",
        "cuIpcOpenMemHandle",
    ] {
        assert_untouched(&with, &without, &format!("dlsym.{name}"));
    }
    assert_eq!(
        with.line("dlsym.cuNoSuchFunction").status,
        1,
        "dlerror() still reports the miss"
    );
    // The driver is RTLD_LOCAL: the global scope has only the shim's definition.
    assert_eq!(without.line("default.cuMemCreate").provider, "null");
    assert_eq!(with.line("default.cuMemCreate").provider, SHIM_FILE);
    // A same-named symbol in a library that is not the driver is never substituted.
    assert_untouched(&with, &without, "plugin.cuMemCreate");
    assert_eq!(with.line("plugin.cuMemCreate").provider, "libplugin.so");
    assert_eq!(with.line("call.plugin.cuMemCreate").result, 4242);
    // The wrappers found the real functions of a driver the program opened RTLD_LOCAL.
    assert_calls_identical(&with, &without);
}

/// The driver's resolvers, called through the PLT (`plt`) or found with `dlsym(handle)` on a
/// driver opened `RTLD_LOCAL` (`dlsym`).
fn check_resolvers(with: &Report, without: &Report) {
    assert_wrapped(with, without, "resolver.v2", "cuGetProcAddress_v2");
    for (label, wrapper) in [
        ("v2.cuInit", "cuInit"),
        ("v2.cuMemCreate", "cuMemCreate"),
        ("v2.cuMemMap", "cuMemMap"),
        ("v2.cuMemFree", "cuMemFree_v2"),
        ("v2.cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"),
        ("v2.cuMulticastBindMem", "cuMulticastBindMem"),
        ("v2.no_status.cuMemCreate", "cuMemCreate"),
        ("v2.cuGetProcAddress", "cuGetProcAddress_v2"),
        ("v2.cuGetProcAddress.old", "cuGetProcAddress"),
        ("v1.cuMemCreate", "cuMemCreate"),
        ("v1.cuGetProcAddress", "cuGetProcAddress_v2"),
        ("v2.ptds.cuMemCreate", "cuMemCreate"),
        ("v2.legacy.cuMemCreate", "cuMemCreate"),
        ("nested.cuMemCreate", "cuMemCreate"),
        // Submissions are gated: the wrapper of the ABI the driver picked.
        ("v2.cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
        ("v1.cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
        ("v2.ptds.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2"),
    ] {
        assert_wrapped(with, without, label, wrapper);
    }
    for label in [
        "v2.cuMemGetAllocationGranularity",
        "v2.cuCtxCreate",
        "v2.cuGetExportTable",
        "v2.cuNoSuchFunction",
        "v2.too_new",
        "v2.not_yet",
        "v2.bad_flags",
        "v1.cuNoSuchFunction",
    ] {
        assert_untouched(with, without, label);
    }
    assert!(
        with.line("v2.cuMemGetAllocationGranularity").is_driver(),
        "untracked: the driver's own pointer"
    );
    assert_eq!(
        with.line("v2.too_new").result,
        1,
        "CUDA_ERROR_INVALID_VALUE, untouched"
    );
    // The pre-11.0 cuIpcOpenMemHandle ABI has no wrapper: reported as not found, never handed out.
    assert_not_found(with, without, "v2.cuIpcOpenMemHandle.old_abi", 0, 1);
    assert_not_found(with, without, "v1.cuIpcOpenMemHandle.old_abi", 500, -1);
    assert_calls_identical(with, without);
    check_ptsz(with, without);
}

/// `cuGetProcAddress_v2_ptsz` answers as `_v2` with the per-thread flag (the fake driver hands
/// out the same functions for both streams; tests/resolver_rule.rs has a driver that does not).
fn check_ptsz(with: &Report, without: &Report) {
    if without.line("resolver.ptsz").is_driver() {
        assert_wrapped(with, without, "resolver.ptsz", "cuGetProcAddress_v2_ptsz");
    }
    if with.line("resolver.ptsz").provider == SHIM_FILE {
        for (ptsz, v2) in [
            ("ptsz.cuMemCreate", "v2.ptds.cuMemCreate"),
            ("ptsz.cuMemcpyHtoDAsync", "v2.ptds.cuMemcpyHtoDAsync"),
            ("ptsz.legacy.cuMemCreate", "v2.legacy.cuMemCreate"),
        ] {
            assert_eq!(with.line(ptsz), with.line(v2), "{ptsz}\n{}", with.run());
        }
    } else {
        // Found through the driver, which lacks it: nothing to substitute.
        assert_untouched(with, without, "resolver.ptsz");
    }
}

#[test]
fn resolvers_through_the_plt_return_wrappers() {
    let work = Work::new();
    let driver = work.fake_driver_dir();
    let program = work.program(
        "procaddr",
        &["procaddr.c"],
        &["-L", path_str(&driver), "-lcuda"],
    );
    let (with, without) = both(&work, &program, Launch::new());
    check_resolvers(&with, &without);
    // Bound by name, the shim's own export answers whether or not the driver has one.
    assert_eq!(with.line("resolver.ptsz").provider, SHIM_FILE);
    assert_eq!(with.line("resolver.ptsz").sname, "cuGetProcAddress_v2_ptsz");
}

#[test]
fn resolvers_found_with_dlsym_return_wrappers() {
    let work = Work::new();
    let program = work.program("procaddr_dlsym", &["procaddr.c"], &["-DVIA_DLSYM"]);
    let (with, without) = both(&work, &program, Launch::new());
    check_resolvers(&with, &without);
}

#[test]
fn own_wrapper_addresses_cannot_be_preempted() {
    // The executable exports its own cuMemCreate, first in the global scope. The addresses the
    // shim hands out are still its own (-Bsymbolic), and they reach the driver.
    let work = Work::new();
    let program = work.program("selfdef", &["selfdef.c"], &["-rdynamic"]);
    let (with, without) = both(&work, &program, Launch::new());
    assert_wrapped(&with, &without, "dlsym.cuMemCreate", "cuMemCreate");
    assert_wrapped(&with, &without, "v2.cuMemCreate", "cuMemCreate");
    assert_calls_identical(&with, &without);
    assert_eq!(with.line("call.own.cuMemCreate").result, 31337);
    assert_ne!(with.line("call.dlsym.cuMemCreate").result, 31337);
}

/// The stand-in runtime (tests/c/cudart.c) as `libcudart.so.12`, and a program bound to it.
fn runtime_program(work: &Work) -> (std::path::PathBuf, std::path::PathBuf) {
    let runtime = work.library("libcudart.so.12", &["cudart.c"], &[]);
    let dir = runtime.parent().expect("dir").to_path_buf();
    std::os::unix::fs::symlink("libcudart.so.12", dir.join("libcudart.so")).expect("symlink");
    let program = work.program(
        "cudart_main",
        &["cudart_main.c"],
        &["-L", path_str(&dir), "-lcudart"],
    );
    (dir, program)
}

fn check_runtime_resolvers(with: &Report, without: &Report) {
    assert_eq!(
        with.line("addr.cudaGetDriverEntryPoint").provider,
        SHIM_FILE
    );
    assert_eq!(
        with.line("dlsym.cudaGetDriverEntryPoint").provider,
        SHIM_FILE
    );
    assert_eq!(
        with.line("dlsym.cudaGetDriverEntryPointByVersion").provider,
        SHIM_FILE
    );
    assert_untouched(with, without, "dlsym.cudaRuntimeGetVersion");
    for (label, wrapper) in [
        ("ep.cuMemCreate", "cuMemCreate"),
        ("ep.cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"),
        ("ep_ptsz.cuMemCreate", "cuMemCreate"),
        ("bv.cuMemCreate", "cuMemCreate"),
        ("bv_ptsz.cuMemMap", "cuMemMap"),
        ("dlsym_ep.cuMemCreate", "cuMemCreate"),
        ("dlsym_ep.cuInit", "cuInit"),
        ("ep.cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
        ("ep_ptsz.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2"),
        ("bv.cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
    ] {
        assert_wrapped(with, without, label, wrapper);
    }
    for label in ["ep.cuNoSuchFunction", "bv.too_new"] {
        assert_untouched(with, without, label);
    }
    assert_calls_identical(with, without);
}

#[test]
fn runtime_resolvers_return_wrappers() {
    let work = Work::new();
    let (dir, program) = runtime_program(&work);
    // The runtime finds the driver's resolver through dlsym, so the shim's cuGetProcAddress_v2
    // already substitutes, and the runtime-level layer sees its own wrappers.
    let (with, without) = both(&work, &program, Launch::new().library_path(&dir));
    check_runtime_resolvers(&with, &without);
    // The nested driver resolver already reported the old ABI as not found.
    assert_not_found(&with, &without, "bv.cuIpcOpenMemHandle.old_abi", 0, 1);
}

#[test]
fn runtime_resolvers_substitute_when_the_runtime_bypassed_dlsym() {
    let work = Work::new();
    let (dir, program) = runtime_program(&work);
    // The runtime reached the driver's resolver without the dlsym hook: the runtime-level layer
    // alone applies the rule.
    let launch = Launch::new()
        .library_path(&dir)
        .env("FAKE_CUDART_BYPASS", "1");
    let (with, without) = both(&work, &program, launch);
    check_runtime_resolvers(&with, &without);
    assert_not_found(&with, &without, "bv.cuIpcOpenMemHandle.old_abi", 0, 1);
}

#[test]
fn runtime_older_than_12_has_no_status_argument() {
    // A CUDA 11 runtime and a caller passing three arguments (the fourth register is garbage,
    // here 0x1): the shim must neither read nor write it, and still substitutes.
    let work = Work::new();
    let (dir, program) = runtime_program(&work);
    let launch = Launch::new()
        .library_path(&dir)
        .env("FAKE_CUDART_BYPASS", "1")
        .env("FAKE_CUDART_VERSION", "11080")
        .arg("old");
    let (with, without) = both(&work, &program, launch);
    assert_wrapped(&with, &without, "old.cuMemCreate", "cuMemCreate");
    assert_wrapped(
        &with,
        &without,
        "old.cuIpcOpenMemHandle",
        "cuIpcOpenMemHandle_v2",
    );
    assert_wrapped(&with, &without, "old.cuMemcpyHtoD", "cuMemcpyHtoD_v2");
}
