//! The capture's own state and its errors: what the control worker keeps between the phase
//! requests of one capture ([`Control`], behind [`Capture`]), and why a phase fails
//! ([`PhaseError`]). The phases themselves are `phases.rs` (and the byte stores `store/`, the
//! drain `drain.rs`, the multicast steps `multicast.rs`); they work on the registry through
//! [`Tracking`], which says which phase the process is in.

use crate::datafile::DataFileError;
use crate::registry::VHandle;
use crate::track::{FetchError, Tracking};
use copy::CopyError;
use cuda::CudaError;
use cuda_abi::CUresult;
use protocol::ErrorCode;
use protocol::message::{CopyStats, DataFile};
use protocol::record::Phase;
use std::sync::{Mutex, MutexGuard};

/// The capture job: its state, used by the control worker only.
#[derive(Debug)]
pub struct Capture {
    control: Mutex<Control>,
}

impl Capture {
    /// A capture that copies as `copy` says.
    pub fn new(copy: copy::CopyConfig) -> Capture {
        Capture {
            control: Mutex::new(Control {
                copy,
                ..Control::default()
            }),
        }
    }

    /// The capture's state (only the control worker takes it, one phase at a time).
    pub(crate) fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Figures of the last copying phase.
    pub fn last_stats(&self) -> CopyStats {
        self.control().last
    }
}

/// Phase machinery the control worker owns.
#[derive(Debug, Default)]
pub struct Control {
    pub(crate) carrier: copy::Carrier,
    /// How copies reach the carrier (`CUINTERPOSE_CARRIER` and the staging knobs, from the
    /// runtime's [`crate::config::Config`]).
    pub(crate) copy: copy::CopyConfig,
    /// Figures of the last phase that copied, for the log and for benchmarks.
    pub(crate) last: CopyStats,
    /// This capture's Release started here (so every creator was sent Release too, and may have
    /// recreated its allocations since); until the next successful Import or Thaw.
    pub(crate) release_started: bool,
    /// Imports whose creator has exited: they cannot be rebuilt, stay unmapped, and do not keep
    /// Thaw from bringing back the rest (`cuinterpose resume --allow-lost`).
    pub(crate) lost_imports: std::collections::HashSet<VHandle>,
    /// The data file this capture's SaveTo wrote (checkpoint to disk), until Thaw: the bytes of
    /// the allocations it lists are there, not in the carrier (process memory, so a process
    /// restored by CRIU still knows it).
    pub(crate) streamed: Option<DataFile>,
    /// The per-thread stack size of each device's context that Release set to zero, to put back
    /// at Thaw (`Capture::shrink_stacks`, phases.rs).
    pub(crate) shrunk_stacks: Vec<(i32, usize)>,
    /// This cycle's Save went to the carrier helper: Load copies back from it.
    pub(crate) through_helper: bool,
    /// The helper's carrier, as a descriptor this process holds from its SaveThroughHelper
    /// until its Thaw: the pages outlive the helper, and a Load whose helper is gone reads them
    /// here (`store::helper`).
    pub(crate) helper_copy: Option<HelperCopy>,
}

impl Control {
    pub(crate) fn carrier_poisoned(&self) -> bool {
        self.carrier.is_poisoned()
    }
}

/// Why a phase failed.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    #[error("{request} is not valid in phase {phase:?}")]
    WrongPhase { request: &'static str, phase: Phase },
    #[error("{0}")]
    NotRebuilt(String),
    #[error("checkpoint is blocked: this process {}", .0.join("; "))]
    Blocked(Vec<String>),
    #[error("{inside} tracked calls still in flight after {timeout_ms} ms; not frozen")]
    Timeout { inside: u32, timeout_ms: u32 },
    #[error("not drained after {timeout_ms} ms ({}); not frozen", .busy.join("; "))]
    NotDrained { busy: Vec<String>, timeout_ms: u32 },
    #[error(
        "the context of device {device} holds an error of the application's own work ({error})"
    )]
    Sticky { device: i32, error: String },
    #[error("{call} failed for {what}: {result}")]
    Driver {
        call: &'static str,
        what: String,
        result: CUresult,
    },
    #[error(transparent)]
    Copy(#[from] CopyError),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    DataFile(#[from] DataFileError),
    #[error("{0}")]
    Internal(String),
    /// The carrier helper could not be reached or failed; its message says which.
    #[error("{0}")]
    Helper(String),
    /// A carrier to pin ahead that is not pinned: the message says why (the policy, the driver).
    #[error("{0}")]
    NotPinned(String),
}

impl PhaseError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PhaseError::WrongPhase { .. } | PhaseError::NotRebuilt(_) | PhaseError::Blocked(_) => {
                ErrorCode::WrongPhase
            }
            PhaseError::Timeout { .. } | PhaseError::NotDrained { .. } => ErrorCode::Timeout,
            PhaseError::Sticky { .. } => ErrorCode::Sticky,
            PhaseError::Driver { .. }
            | PhaseError::Copy(_)
            | PhaseError::DataFile(DataFileError::Copy(_)) => ErrorCode::Driver,
            PhaseError::DataFile(_) => ErrorCode::Internal,
            PhaseError::Fetch(FetchError::NotFound { .. }) => ErrorCode::NotFound,
            PhaseError::Fetch(_) => ErrorCode::Peer,
            PhaseError::Internal(_) | PhaseError::NotPinned(_) => ErrorCode::Internal,
            PhaseError::Helper(_) => ErrorCode::Peer,
        }
    }
}

/// The phase error of a failed driver call, naming what it was for.
pub(crate) fn check<T>(
    what: impl FnOnce() -> String,
    r: Result<T, CudaError>,
) -> Result<T, PhaseError> {
    r.map_err(|e| PhaseError::Driver {
        call: e.call,
        what: what(),
        result: e.result,
    })
}

/// What a process holds of its bytes saved through the carrier helper ([`Control::helper_copy`]).
#[derive(Debug)]
pub(crate) struct HelperCopy {
    /// The helper's carrier (a memfd), shared with it.
    pub(crate) fd: std::os::fd::OwnedFd,
    /// Its length when it was handed over.
    pub(crate) length: u64,
    /// The helper's pid as it reported it.
    pub(crate) helper_pid: u32,
    /// Allocations saved there this cycle, and their bytes.
    pub(crate) allocations: u64,
    pub(crate) bytes: u64,
}

impl HelperCopy {
    /// What `inspect` shows of it ([`protocol::message::HelloReply::carrier_helper`]).
    pub(crate) fn hold(&self) -> protocol::message::HelperHold {
        protocol::message::HelperHold {
            helper_pid: self.helper_pid,
            allocations: self.allocations,
            bytes: self.bytes,
            held_bytes: self.length,
        }
    }
}

/// The phase of the process, as its registry records it.
impl Tracking {
    pub(crate) fn expect_phase(
        &self,
        request: &'static str,
        allowed: &[Phase],
    ) -> Result<Phase, PhaseError> {
        let phase = self.lock().phase();
        if allowed.contains(&phase) {
            Ok(phase)
        } else {
            Err(PhaseError::WrongPhase { request, phase })
        }
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.lock().phase = Some(phase);
    }
}
