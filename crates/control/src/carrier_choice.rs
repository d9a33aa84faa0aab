//! The carrier choice as the tool's callers see it: the policy (crate::carrier_policy, re-exported
//! here) and what `inspect` says of the carrier, which reads an inspection of the group and so
//! sits above it (crate::group).

pub use crate::carrier_policy::{Carrier, CarrierChoice, Requested};

use crate::carrier_policy::{Machine, choose, device_rooms, host_facts};
use crate::group::InspectReport;
use protocol::state::SuspendMode;

/// What `inspect` says of the carrier: for a suspended group, the one its suspension used (the
/// shims say whether they saved through a helper) and what is held pinned now; for a running one,
/// the carrier a plain `suspend --carrier auto` would choose now, with `driver` (the library the
/// tool loads) asked for each device's free memory. `None` where the group has no shim that
/// answered.
pub fn for_inspect(
    report: &InspectReport,
    driver: Option<&std::path::Path>,
    context_bytes: u64,
) -> Result<Option<CarrierChoice>, crate::ControlError> {
    if report.snapshots.is_empty() {
        return Ok(None);
    }
    let mut machine = host_facts();
    let pinned: u64 = report
        .snapshots
        .iter()
        .map(|s| {
            s.hello.carrier_pinned_bytes
                + s.hello.carrier_helper.as_ref().map_or(0, |h| h.held_bytes)
        })
        .sum();
    if report.suspended.is_some() {
        let helper = !report.carrier_helpers.is_empty();
        return Ok(Some(CarrierChoice {
            carrier: if helper {
                Carrier::Helper
            } else {
                Carrier::Process
            },
            requested: Requested::Auto,
            reason: format!(
                "used by this suspension ({}), as the shims report it",
                if helper {
                    "they saved through a carrier helper"
                } else {
                    "each saved into its own carrier"
                }
            ),
            pinned_host_bytes: pinned,
            helper_gpu_bytes: if helper { context_bytes } else { 0 },
            machine: Machine {
                devices: Vec::new(),
                ..machine
            },
            save: None,
        }));
    }
    let need = report
        .snapshots
        .iter()
        .flat_map(|s| &s.record.allocations)
        .map(|a| a.size)
        .sum();
    let driver = crate::native::Driver::load(driver)?;
    machine.devices = device_rooms(&driver)?;
    machine.helper_running = report.snapshots.iter().all(|s| {
        s.info
            .control_socket
            .as_deref()
            .and_then(std::path::Path::parent)
            .is_some_and(|dir| {
                std::os::unix::net::UnixStream::connect(
                    dir.join(protocol::message::CARRIER_HELPER_SOCKET),
                )
                .is_ok()
            })
    });
    choose(
        Requested::Auto,
        SuspendMode::Native,
        need,
        machine,
        context_bytes,
    )
    .map(Some)
    .map_err(|reason| crate::ControlError::CarrierRefused {
        carrier: "auto",
        reason,
    })
}
