//! Every scenario on the fake driver, with the outcome the fake must give. The fake reproduces
//! r580 (docs/measurements.md) except where its README says otherwise: the exporter that the real
//! driver hangs on times out instead.

use cuinterpose_testkit::scenarios::{self, Outcome, Settings};

fn run(name: &str) -> Vec<Outcome> {
    let settings = Settings::fake().expect("artifacts next to the test binary");
    scenarios::run_named(name, &settings).expect("a known scenario")
}

fn outcome(name: &str) -> String {
    let rows = run(name);
    assert_eq!(rows.len(), 1, "{name}: one outcome expected, got {rows:?}");
    rows[0].outcome.clone()
}

#[test]
fn share_both_ways() {
    assert_eq!(outcome("share-both-ways"), "ok");
}

#[test]
fn share_both_ways_getprocaddress() {
    assert_eq!(outcome("share-both-ways-getprocaddress"), "ok");
}

#[test]
fn share_ring4() {
    assert_eq!(outcome("share-ring4"), "ok");
}

#[test]
fn share_tree4() {
    assert_eq!(outcome("share-tree4"), "ok");
}

/// The fake's code for every probe: r580's as measured on 2026-12-02 (H200, 580.159.04, under
/// the shim, which passes these codes through). Where r580 kills the process instead (the
/// scenario's `crash`), the fake returns the code the shim returns (the fake's README lists them).
const VMM_ERRORS: &[(&str, &str)] = &[
    ("create.size-zero", "CUDA_ERROR_INVALID_VALUE"),
    ("create.size-unaligned", "CUDA_ERROR_INVALID_VALUE"),
    ("create.null-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("create.null-prop", "CUDA_ERROR_INVALID_VALUE"),
    ("create.bad-device", "CUDA_ERROR_INVALID_DEVICE"),
    ("create.bad-location-type", "CUDA_ERROR_INVALID_VALUE"),
    ("create.bad-allocation-type", "CUDA_ERROR_INVALID_VALUE"),
    ("create.nonzero-flags", "CUDA_ERROR_INVALID_VALUE"),
    ("create.too-large", "CUDA_ERROR_OUT_OF_MEMORY"),
    ("release.zero-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("release.twice", "CUDA_ERROR_INVALID_VALUE"),
    ("reserve.size-zero", "CUDA_ERROR_INVALID_VALUE"),
    ("reserve.size-unaligned", "CUDA_ERROR_INVALID_VALUE"),
    ("reserve.null-ptr", "CUDA_ERROR_INVALID_VALUE"),
    (
        "reserve.alignment-not-power-of-two",
        "CUDA_ERROR_INVALID_VALUE",
    ),
    ("reserve.nonzero-flags", "CUDA_ERROR_INVALID_VALUE"),
    ("address-free.twice", "CUDA_ERROR_INVALID_VALUE"),
    ("address-free.partial", "CUDA_ERROR_INVALID_VALUE"),
    ("map.unreserved-address", "CUDA_ERROR_INVALID_VALUE"),
    ("map.offset-unaligned", "CUDA_ERROR_NOT_SUPPORTED"),
    ("map.size-unaligned", "CUDA_ERROR_NOT_SUPPORTED"),
    ("map.size-zero", "CUDA_ERROR_INVALID_VALUE"),
    ("map.beyond-allocation", "CUDA_ERROR_NOT_SUPPORTED"),
    ("map.offset-beyond-allocation", "CUDA_ERROR_NOT_SUPPORTED"),
    ("map.beyond-reservation", "CUDA_ERROR_INVALID_VALUE"),
    ("map.already-mapped", "CUDA_ERROR_INVALID_VALUE"),
    ("map.released-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("map.zero-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("map.nonzero-flags", "CUDA_ERROR_INVALID_VALUE"),
    ("unmap.not-mapped", "CUDA_SUCCESS"),
    ("unmap.partial", "CUDA_ERROR_INVALID_VALUE"),
    ("set-access.not-mapped", "CUDA_ERROR_INVALID_VALUE"),
    ("set-access.null-desc", "CUDA_ERROR_INVALID_VALUE"),
    ("set-access.zero-count", "CUDA_ERROR_INVALID_VALUE"),
    ("set-access.bad-device", "CUDA_ERROR_INVALID_VALUE"),
    ("set-access.bad-location-type", "CUDA_ERROR_INVALID_VALUE"),
    ("set-access.bad-flags", "CUDA_ERROR_INVALID_VALUE"),
    ("set-access.size-unaligned", "CUDA_ERROR_INVALID_VALUE"),
    ("get-access.not-mapped", "CUDA_ERROR_INVALID_VALUE"),
    ("get-access.null-flags", "CUDA_ERROR_INVALID_VALUE"),
    ("export.type-not-requested", "CUDA_ERROR_INVALID_VALUE"),
    ("export.fabric-not-requested", "CUDA_ERROR_INVALID_VALUE"),
    ("export.null-out", "CUDA_ERROR_INVALID_VALUE"),
    ("export.zero-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("export.released-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("import.negative-fd", "CUDA_ERROR_UNKNOWN"),
    ("import.unopened-fd", "CUDA_ERROR_UNKNOWN"),
    ("import.not-a-cuda-fd", "CUDA_ERROR_UNKNOWN"),
    ("import.null-out", "CUDA_ERROR_INVALID_VALUE"),
    ("import.bad-handle-type", "CUDA_ERROR_INVALID_VALUE"),
    ("retain.not-mapped", "CUDA_ERROR_INVALID_VALUE"),
    ("retain.null-out", "CUDA_ERROR_INVALID_VALUE"),
    ("get-props.zero-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("get-props.released-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("get-props.null-out", "CUDA_ERROR_INVALID_VALUE"),
    ("granularity.null-prop", "CUDA_ERROR_INVALID_VALUE"),
    ("granularity.null-out", "CUDA_ERROR_INVALID_VALUE"),
    ("granularity.bad-option", "CUDA_ERROR_INVALID_VALUE"),
    ("granularity.bad-device", "CUDA_SUCCESS"),
    ("malloc.size-zero", "CUDA_ERROR_INVALID_VALUE"),
    ("free.reserved-not-allocated", "CUDA_ERROR_INVALID_VALUE"),
    ("ipc.get-on-vmm", "CUDA_ERROR_INVALID_VALUE"),
    ("ipc.open-zero-handle", "CUDA_ERROR_INVALID_VALUE"),
    ("ipc.open-own-handle", "CUDA_ERROR_INVALID_CONTEXT"),
    ("ipc.close-not-opened", "CUDA_ERROR_INVALID_VALUE"),
    ("address-free.while-mapped", "CUDA_ERROR_INVALID_VALUE"),
];

#[test]
fn vmm_errors() {
    let got: Vec<(String, String)> = run("vmm-errors")
        .into_iter()
        .map(|o| (o.case.unwrap_or_default(), o.outcome))
        .collect();
    let expected: Vec<(String, String)> = VMM_ERRORS
        .iter()
        .map(|(c, r)| ((*c).to_owned(), (*r).to_owned()))
        .collect();
    let wrong: Vec<String> = expected
        .iter()
        .zip(&got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("{}: expected {}, got {} ({})", e.0, e.1, g.1, g.0))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(got.len(), expected.len(), "probe list changed: {got:?}");
}

#[test]
fn checkpoint_roundtrip() {
    assert_eq!(outcome("checkpoint-roundtrip"), "ok");
}

/// The fake has two devices: the process's device 0 is the machine's device 1 after the swap.
#[test]
fn device_remap() {
    assert_eq!(outcome("device-remap"), "ok");
}

#[test]
fn importer_live_import() {
    assert_eq!(
        outcome("importer-live-import"),
        "restore=CUDA_ERROR_NOT_SUPPORTED unlock=CUDA_ERROR_ILLEGAL_STATE"
    );
}

#[test]
fn importer_unmapped_holding() {
    assert_eq!(
        outcome("importer-unmapped-holding"),
        "restore=CUDA_ERROR_NOT_SUPPORTED unlock=CUDA_ERROR_ILLEGAL_STATE"
    );
}

#[test]
fn importer_released() {
    assert_eq!(outcome("importer-released"), "ok");
}

#[test]
fn importer_released_creator_unmapped() {
    assert_eq!(outcome("importer-released-creator-unmapped"), "ok");
}

#[test]
fn fd_held_by_third() {
    assert_eq!(outcome("fd-held-by-third"), "ok");
}

#[test]
fn legacy_ipc_importer() {
    assert_eq!(
        outcome("legacy-ipc-importer"),
        "restore=CUDA_ERROR_INVALID_VALUE unlock=CUDA_ERROR_ILLEGAL_STATE"
    );
}

#[test]
fn pointer_attributes() {
    assert_eq!(outcome("pointer-attributes"), "ok");
}

/// Under the shim, where cuMemAlloc memory is VMM, and its legacy IPC virtual.
#[test]
fn pointer_attributes_under_the_shim() {
    let mut settings = Settings::fake().expect("artifacts next to the test binary");
    settings.shim = true;
    let rows = scenarios::run_named("pointer-attributes", &settings).expect("a known scenario");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].outcome, "ok");
}

#[test]
fn both_locked() {
    assert_eq!(
        outcome("both-locked"),
        "b:restore=CUDA_ERROR_NOT_SUPPORTED b:unlock=CUDA_ERROR_ILLEGAL_STATE"
    );
}

/// The real driver hangs here; the fake returns CUDA_ERROR_TIMEOUT from the checkpoint once the
/// lock's timeout (10 s) has passed and leaves the process locked, so the unlock succeeds.
#[test]
fn exporter_live_import() {
    assert_eq!(
        outcome("exporter-live-import"),
        "checkpoint=CUDA_ERROR_TIMEOUT"
    );
}

#[test]
fn every_scenario_has_a_test_here() {
    let source = include_str!("scenarios.rs");
    for s in scenarios::SCENARIOS {
        assert!(
            source.contains(&format!("\"{}\"", s.name)),
            "scenario {} has no test in tests/scenarios.rs",
            s.name
        );
    }
}
