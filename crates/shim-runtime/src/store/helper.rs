//! The carrier helper's store: this process's carrier in the carrier helper
//! (`cuinterpose-copy`'s `carrier_helper`), which imports each allocation from a descriptor the
//! shim sends ([`Request::CarrierItem`]) and runs the copy engine in its own process
//! (SaveThroughHelper, and the Load after it). Each allocation's place is its offset in that
//! carrier, kept in its record until Thaw.
//!
//! State ([`crate::capture::Control`]): whether this cycle saved here (`through_helper`, so Load
//! reads here) and this process's own descriptor of the helper's carrier (`helper_copy`), from
//! which Load reads when the helper is gone.

use super::carrier::{self, record};
use super::rebuild::LoadItem;
use super::{ByteStore, Mapped, SaveItem};
use crate::capture::{Capture, HelperCopy, PhaseError, check};
use crate::log::{log_info, log_warn};
use crate::track::Tracking;
use copy::{CarrierMode, CarrierView, Direction, Unit};
use cuda::DriverHandle;
use cuda_abi::handle_type;
use protocol::message::CopyStats;
use protocol::{ErrorCode, Request, Response};
use std::os::fd::AsFd;
use std::time::Duration;

/// The carrier helper's carrier. `native_follows` (Save only) is passed on to this process's own
/// carrier when a cycle cannot save through the helper.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Helper {
    pub(crate) native_follows: bool,
}

impl ByteStore for Helper {
    type Place = u64;
    type Stats = CopyStats;
    type Outcome = (u64, Option<CopyStats>);
    const SAVE: &'static str = "SaveThroughHelper";
    const LOAD: &'static str = "Load";

    /// Every allocation Save would copy is exported to the helper, which copies it into this
    /// process's carrier there. A creation that cannot be exported (made without a shareable
    /// handle type) makes the cycle save into this process's own carrier instead, logged.
    fn save(
        &self,
        t: &Tracking,
        c: &Capture,
        items: Vec<SaveItem>,
    ) -> Result<Self::Outcome, PhaseError> {
        if let Some(private) = items
            .iter()
            .find(|i| !t.lock().get(i.handle).is_some_and(|o| exportable(&o.props)))
        {
            log_info!(
                "allocation {} has no shareable handle type: this cycle saves into the \
                 process's own carrier",
                private.id
            );
            let own = carrier::Carrier {
                native_follows: self.native_follows,
            };
            return own.save(t, c, items);
        }
        if items.is_empty() {
            // Nothing of this process's goes to the helper (it only imports): saved, with no
            // carrier there to hand over, and a Load with nothing to fill.
            let mut control = c.control();
            control.through_helper = true;
            control.helper_copy = None;
            return Ok((0, None));
        }
        let mut allocations = Vec::with_capacity(items.len());
        let mut offset = 0u64;
        for item in &items {
            allocations.push((item.real, item.size, item.device, offset));
            offset += item.size as u64;
        }
        // Saved only once the helper has handed over its carrier: from then on the bytes
        // outlive the helper (docs/design.md, "The carrier helper's death").
        let (stats, shared) = helper_copy(t, &allocations, true, offset)?;
        let Some((fd, length, helper_pid)) = shared else {
            return Err(PhaseError::Internal(
                "the carrier helper handed over no carrier".into(),
            ));
        };
        if length < offset {
            return Err(PhaseError::Helper(format!(
                "the carrier helper (pid {helper_pid}) handed over a carrier of {length} bytes for \
                 {offset} bytes saved; nothing was released"
            )));
        }
        {
            let mut reg = t.lock();
            for (item, (.., offset)) in items.iter().zip(&allocations) {
                if let Some(o) = reg.get_mut(item.handle) {
                    o.carrier = Some(*offset);
                }
            }
        }
        {
            let mut control = c.control();
            control.through_helper = true;
            control.helper_copy = Some(HelperCopy {
                fd,
                length,
                helper_pid,
                allocations: allocations.len() as u64,
                bytes: offset,
            });
        }
        Ok((stats.bytes, Some(record(c, stats))))
    }

    fn place(&self, item: &LoadItem) -> Option<u64> {
        item.carrier
    }

    /// The fresh allocations, exported, are filled by the helper; when it is gone, from this
    /// process's own copy of its carrier ([`load_from_own_copy`]).
    fn fill(
        &self,
        t: &Tracking,
        c: &Capture,
        work: &[Mapped<'_, u64>],
    ) -> Result<CopyStats, PhaseError> {
        if work.is_empty() {
            // Nothing to fill (a Load sent again after its fills were done): the helper, alive
            // or not, is not needed.
            return Ok(CopyStats::default());
        }
        let mut allocations = Vec::with_capacity(work.len());
        let mut retained = Vec::with_capacity(work.len());
        let mut result = Ok(());
        for (map, device, offset) in work {
            let got = copy::enter(&t.real, *device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| {
                    check(
                        || format!("the allocation at {:#x}", map.va()),
                        t.real.mem_retain_allocation_handle(map.va()),
                    )
                });
            match got {
                Ok(real) => {
                    retained.push(real);
                    allocations.push((real, map.size(), *device, *offset));
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let copied = result.and_then(|()| match helper_copy(t, &allocations, false, 0) {
            Ok((stats, _)) => Ok(stats),
            Err(HelperFailure::Gone(why)) => load_from_own_copy(t, c, work, &why),
            Err(HelperFailure::Failed(e)) => Err(e),
        });
        t.release_unpublished(retained);
        copied
    }

    /// The helper's copies are confirmed before it answers, or it poisoned its own carrier and
    /// kept the mappings: ours may be released either way, unless a load from this process's
    /// own copy could not confirm its copies.
    fn in_doubt(&self, c: &Capture) -> bool {
        c.control().carrier_poisoned()
    }

    fn loaded(&self, c: &Capture, rebuilt: Option<(u64, CopyStats)>) -> Self::Outcome {
        rebuilt.map_or((0, None), |(loaded, stats)| {
            (loaded, Some(record(c, stats)))
        })
    }
}

/// The helper's carrier as it handed it over ([`Response::CarrierFd`]): the memfd, its length
/// and the helper's pid.
type HandedCarrier = (std::os::fd::OwnedFd, u64, u32);

/// Why a call to the carrier helper failed.
enum HelperFailure {
    /// The helper is gone (nothing listens, or it died during the call) or is another helper
    /// that never held this process's carrier: the bytes are in this process's own copy.
    Gone(String),
    /// The helper answered an error, or the call failed otherwise.
    Failed(PhaseError),
}

impl From<HelperFailure> for PhaseError {
    fn from(f: HelperFailure) -> PhaseError {
        match f {
            HelperFailure::Gone(why) => PhaseError::Helper(why),
            HelperFailure::Failed(e) => e,
        }
    }
}

/// Whether a transport error means the helper is gone: nothing listens at its socket, or the
/// connection ended under a call (the helper never closes one with a request unanswered).
fn helper_gone(e: &transport::TransportError) -> bool {
    use std::io::ErrorKind;
    match e {
        transport::TransportError::Closed => true,
        transport::TransportError::Io { source, .. } => matches!(
            source.kind(),
            ErrorKind::ConnectionRefused
                | ErrorKind::NotFound
                | ErrorKind::ConnectionReset
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// How long the shim waits for the carrier helper: to connect, and for each answer (a copy of
/// the whole process's memory included).
const HELPER_TIMEOUT: Duration = Duration::from_secs(600);

/// Whether an allocation was made with a POSIX descriptor handle type (so the carrier helper
/// can import it).
fn exportable(props: &protocol::record::AllocationProps) -> bool {
    props.requested_handle_types & handle_type::POSIX_FILE_DESCRIPTOR != 0
}

/// Has the carrier helper give this process's carrier back (after a resume, under
/// `CUINTERPOSE_CARRIER_RELEASE=after-resume`); a failure is logged (the helper gives it
/// back anyway when this process exits).
pub(crate) fn forget_carrier(t: &Tracking) {
    let socket = helper_socket(t);
    let forgot = transport::Connection::connect(&socket, HELPER_TIMEOUT)
        .and_then(|mut c| c.call(&Request::CarrierForget));
    match forgot {
        Ok((Response::Accepted, _)) => {}
        Ok((other, _)) => {
            log_warn!("the carrier helper kept this process's carrier: {other:?}")
        }
        Err(e) => log_warn!("the carrier helper kept this process's carrier: {e}"),
    }
}

/// The carrier helper's socket (in this process's control directory).
fn helper_socket(t: &Tracking) -> std::path::PathBuf {
    t.config.control_dir.join(copy::carrier_helper::SOCKET_NAME)
}

/// Sends `allocations` (driver handle, size, device, offset in the carrier) to the carrier
/// helper and has it copy them into (`to_host`) or out of this process's carrier there.
/// After a copy into it, the helper hands over its carrier ([`Request::CarrierShare`]).
fn helper_copy(
    t: &Tracking,
    allocations: &[(DriverHandle, usize, i32, u64)],
    to_host: bool,
    total: u64,
) -> Result<(CopyStats, Option<HandedCarrier>), HelperFailure> {
    let socket = helper_socket(t);
    let transport_error = |e: transport::TransportError| {
        let message = format!("carrier helper at {}: {e}", socket.display());
        if helper_gone(&e) {
            HelperFailure::Gone(message)
        } else {
            HelperFailure::Failed(PhaseError::Helper(message))
        }
    };
    let mut connection =
        transport::Connection::connect(&socket, HELPER_TIMEOUT).map_err(transport_error)?;
    connection
        .set_timeout(Some(HELPER_TIMEOUT))
        .map_err(transport_error)?;
    let answer = |response: Response| match response {
        Response::Accepted | Response::Copied { .. } | Response::CarrierFd { .. } => Ok(response),
        // Another helper than the one this process saved through (the one it saved
        // through is gone): it holds nothing of this process's.
        Response::Error {
            code: ErrorCode::NotFound,
            message,
        } => Err(HelperFailure::Gone(message)),
        Response::Error { message, .. } => Err(HelperFailure::Failed(PhaseError::Helper(message))),
        other => Err(HelperFailure::Failed(PhaseError::Helper(format!(
            "the carrier helper answered {other:?}"
        )))),
    };
    for &(real, size, device, offset) in allocations {
        let uuid = check(
            || format!("device {device}"),
            t.real
                .device_get(device)
                .and_then(|d| t.real.device_uuid(d)),
        )
        .map_err(HelperFailure::Failed)?;
        let fd = check(
            || format!("an allocation of {size} bytes"),
            t.real.mem_export_fd(real, 0),
        )
        .map_err(HelperFailure::Failed)?;
        let request = Request::CarrierItem {
            offset,
            size: size as u64,
            device: copy::carrier_helper::uuid_bytes(&uuid),
        };
        let (response, _) = connection
            .call_with(&request, Some(fd.as_fd()))
            .map_err(transport_error)?;
        answer(response)?;
    }
    let (response, _) = connection
        .call(&Request::CarrierCopy { to_host, total })
        .map_err(transport_error)?;
    let stats = match answer(response)? {
        Response::Copied { stats } => stats,
        other => {
            return Err(HelperFailure::Failed(PhaseError::Helper(format!(
                "the carrier helper answered {other:?} to a copy"
            ))));
        }
    };
    if !to_host {
        return Ok((stats, None));
    }
    let (response, fd) = connection
        .call(&Request::CarrierShare)
        .map_err(transport_error)?;
    match (answer(response)?, fd) {
        (Response::CarrierFd { length, helper_pid }, Some(fd)) => {
            Ok((stats, Some((fd, length, helper_pid))))
        }
        (other, _) => Err(HelperFailure::Failed(PhaseError::Helper(format!(
            "the carrier helper answered {other:?} when asked for its carrier"
        )))),
    }
}

/// Load's fill when the carrier helper is gone: from this process's own descriptor of the
/// helper's carrier ([`crate::capture::Control::helper_copy`]), mapped read-only and copied staged (nothing
/// is pinned in the application). Where it holds none, says exactly what is lost.
fn load_from_own_copy(
    t: &Tracking,
    c: &Capture,
    work: &[Mapped<'_, u64>],
    why: &str,
) -> Result<CopyStats, PhaseError> {
    let needed = work
        .iter()
        .map(|(map, _, offset)| offset.saturating_add(map.size() as u64))
        .max()
        .unwrap_or(0);
    let (fd, chunk) = {
        let control = c.control();
        let fd = match &control.helper_copy {
            Some(own) => own.fd.try_clone().map_err(|e| {
                PhaseError::Helper(format!("{why}; this process's copy of its carrier: {e}"))
            }),
            None => Err(PhaseError::Helper(format!(
                "the bytes of {} allocations ({needed} bytes) saved through the carrier \
                 helper are lost: {why}, and this process holds no copy of its carrier \
                 (`cuinterpose end --pid <root>` ends the group)",
                work.len()
            ))),
        }?;
        (fd, control.copy.chunk)
    };
    log_warn!("{why}: loading from this process's own copy of the helper's carrier");
    let view = CarrierView::map(fd.as_fd(), needed as usize).map_err(|e| {
        PhaseError::Helper(format!(
            "the bytes of {} allocations ({needed} bytes) saved through the carrier helper \
             are lost: {why}, and this process's copy of its carrier cannot be read: {e} \
             (`cuinterpose end --pid <root>` ends the group)",
            work.len()
        ))
    })?;
    let mut units: Vec<Unit> = Vec::new();
    for (map, device, offset) in work {
        units.extend(copy::segments(
            *device,
            map.va(),
            view.base(),
            *offset as usize,
            map.size(),
        ));
    }
    let (stats, error) = copy::copy_all(
        &t.real,
        units,
        Direction::ToDevice,
        CarrierMode::Staged,
        chunk,
    );
    if stats.dma_uncertain {
        // Fail-stop, as `copy_through`: the fresh allocations may still be written.
        c.control().carrier.poison();
    }
    match error {
        Some(e) => Err(e.into()),
        None => Ok(stats.report((Duration::ZERO, true))),
    }
}
