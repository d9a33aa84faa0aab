//! The resolver rule against a driver built to return awkward answers (tests/c/odd_driver.c):
//! future ABIs, pointers that are not symbol starts, non-success statuses and results, and the
//! CUDA 13.1 multicast bind. Independent of the fake driver, so every case is deterministic.

mod common;

use common::{Launch, Work, assert_not_found, assert_untouched, assert_wrapped};

fn odd_runs(version: Option<&str>) -> (common::Report, common::Report) {
    let work = Work::new();
    let driver = work.odd_driver_dir();
    let program = work.program(
        "odd_main",
        &["odd_main.c"],
        &["-L", driver.to_str().expect("utf-8 path"), "-lcuda"],
    );
    let mut launch = Launch::new().library_path(&driver);
    if let Some(version) = version {
        launch = launch.env("ODD_DRIVER_VERSION", version);
    }
    let with = launch.with_shim().run(&program).report();
    let without = launch.run(&program).report();
    (with, without)
}

#[test]
fn wrapper_is_chosen_by_the_symbol_the_driver_returned() {
    let (with, without) = odd_runs(None);
    assert_wrapped(&with, &without, "v2.cuMemCreate.12000", "cuMemCreate");
    // The driver picked the 13.1 device-explicit ABI: the matching wrapper, not the v1 one.
    assert_wrapped(
        &with,
        &without,
        "v2.cuMulticastBindMem.12010",
        "cuMulticastBindMem",
    );
    assert_wrapped(
        &with,
        &without,
        "v2.cuMulticastBindMem.13010",
        "cuMulticastBindMem_v2",
    );
    assert_wrapped(
        &with,
        &without,
        "v2.cuGetProcAddress",
        "cuGetProcAddress_v2",
    );
}

#[test]
fn tracked_function_in_an_unknown_abi_is_not_found() {
    let (with, without) = odd_runs(None);
    assert_eq!(without.line("v2.cuMemCreate.13010").sname, "cuMemCreate_v9");
    // v2: CUDA_SUCCESS, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; v1: CUDA_ERROR_NOT_FOUND.
    assert_not_found(&with, &without, "v2.cuMemCreate.13010", 0, 1);
    assert_not_found(&with, &without, "v1.cuMemCreate.13010", 500, -1);
    // A pointer into the middle of a function names no symbol: not identifiable, not handed out.
    assert_eq!(without.line("v2.cuMemMap").sname, "?");
    assert_not_found(&with, &without, "v2.cuMemMap", 0, 1);
}

#[test]
fn untracked_unknown_abi_and_unsuccessful_answers_pass_untouched() {
    let (with, without) = odd_runs(None);
    assert_untouched(&with, &without, "v2.cuMemcpyHtoD");
    // Status VERSION_NOT_SUFFICIENT with a pointer, and an error result with a pointer: the real
    // resolver's answer is left exactly as it was, even for tracked functions.
    assert_untouched(&with, &without, "v2.cuMemRelease");
    assert_untouched(&with, &without, "v2.cuMemUnmap");
}

#[test]
fn ptsz_resolver_asks_for_per_thread_variants_unless_a_stream_flag_is_given() {
    let (with, without) = odd_runs(None);
    assert_eq!(
        without.line("resolver.ptsz").provider,
        "null",
        "this driver has no _ptsz resolver"
    );
    assert_eq!(with.line("resolver.ptsz").sname, "cuGetProcAddress_v2_ptsz");
    // A submission entry is gated: the wrapper of exactly the ABI the driver picked (the
    // per-thread-stream variant unless the caller asked for the legacy stream).
    let default = with.line("ptsz.cuMemcpyHtoDAsync");
    assert_eq!(
        default.provider,
        common::SHIM_FILE,
        "gated: the shim's wrapper"
    );
    assert_eq!(default.sname, "cuMemcpyHtoDAsync_v2_ptsz");
    assert_eq!(
        with.line("ptsz.legacy.cuMemcpyHtoDAsync").sname,
        "cuMemcpyHtoDAsync_v2"
    );
    let v2 = with.line("v2.cuMemcpyHtoDAsync");
    assert_eq!(v2.provider, common::SHIM_FILE);
    assert_eq!(v2.sname, "cuMemcpyHtoDAsync_v2");
    assert_eq!(
        without.line("v2.cuMemcpyHtoDAsync").sname,
        "cuMemcpyHtoDAsync_v2"
    );
}

#[test]
fn versioned_real_functions_come_from_the_drivers_resolver() {
    let (with, without) = odd_runs(None);
    assert_eq!(
        with.line("addr.cuMulticastBindMem_v2").provider,
        common::SHIM_FILE
    );
    // Through the wrappers, each ABI reaches its own driver function.
    for label in [
        "call.cuMemCreate",
        "call.cuMulticastBindMem",
        "call.cuMulticastBindMem_v2",
    ] {
        assert_eq!(with.line(label), without.line(label), "{label}");
    }
    assert_eq!(with.line("call.cuMulticastBindMem_v2").result, 7002);
    assert_eq!(
        with.line("call.cuMemCreate").result,
        7100,
        "cuMemCreate by its exact name, not _v9"
    );
}

#[test]
fn abi_the_driver_does_not_offer_is_never_guessed_from_a_name() {
    // A 13.0 driver: its resolver does not offer the 13.1 ABI, so the real-table entry is the
    // NOT_FOUND stub even though an ELF symbol named cuMulticastBindMem_v2 exists.
    let (with, without) = odd_runs(Some("13000"));
    assert_eq!(without.line("call.cuMulticastBindMem_v2").result, 7002);
    assert_eq!(with.line("call.cuMulticastBindMem_v2").result, 500);
    assert_eq!(with.line("call.cuMulticastBindMem").result, 7001);
    // Versions above the driver's: the driver's INVALID_VALUE, untouched.
    assert_untouched(&with, &without, "v2.cuMulticastBindMem.13010");
    assert_untouched(&with, &without, "v2.cuMemCreate.13010");
}
