//! The capture's error: `suspend`'s, and the capture inside a `checkpoint`
//! (`disk::checkpoint::CheckpointError::NotCaptured`). A module of its own below the capture
//! (crate::group_capture) and the rollback (crate::phases) that produce it and the verbs
//! (crate::capture, crate::disk) that return it, so that none of them reaches back up for it.

use crate::{Classified, ControlError, ErrorClass, rollback_lines};

/// Why `suspend` failed (and the capture of a `checkpoint`, which wraps it), in the order it can:
/// before the capture changed anything, then in the capture, rolled back or not. Nothing fails
/// after the capture: the report only reads what the carriers hold.
#[derive(Debug, thiserror::Error)]
pub enum SuspendError {
    /// Refused, or failed, before anything changed (the run lock, the state directory, the
    /// group's discovery and checks, the driver, the carrier and its helper; another run holding
    /// a process, or a context with a sticky error, found by the drain once every gate it closed
    /// is open again): the error says what, and its class is the error's own.
    #[error(transparent)]
    NotStarted(#[from] ControlError),
    /// The capture failed after the freeze began (a drain past `--freeze-timeout`, the state
    /// file, the save, the release, the native lock or checkpoint) and was rolled back: the
    /// shims rebuilt what they had released, every gate is open again, the state file is gone.
    /// `failure` names the participants that exited meanwhile
    /// (`ControlError::ParticipantsExited`), left out of the rollback.
    #[error(
        "{failure}\nrolled back: the shims rebuilt what they had released and the workload is running"
    )]
    RolledBack { failure: Box<ControlError> },
    /// The capture failed and its rollback failed too (`rollback`: every error it met): the
    /// workload needs attention; a state file already written is kept, so that
    /// `cuinterpose resume` can try again from it.
    #[error("{failure}\nrollback also failed, the workload needs attention:\n{}", rollback_lines(.rollback))]
    RollbackFailed {
        failure: Box<ControlError>,
        rollback: Vec<ControlError>,
    },
}

impl Classified for SuspendError {
    fn class(&self) -> ErrorClass {
        match self {
            SuspendError::NotStarted(cause) => cause.class(),
            SuspendError::RolledBack { .. } => ErrorClass::RolledBack,
            SuspendError::RollbackFailed { .. } => ErrorClass::NeedsAttention,
        }
    }
}
