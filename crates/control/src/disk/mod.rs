//! Checkpoint to disk and restore into new processes: the capture of a suspend, then a CRIU dump of
//! the process tree; on restore, CRIU brings the tree back, then native restore (optionally onto other
//! GPUs) and the same rebuild a resume does.
//!
//! A checkpoint directory holds `manifest.json`, `cuinterpose.state` and `images/` (CRIU's); the
//! GPU bytes are blocks in the block store beside it ([`store`]), or with `--self-contained` in
//! `data/` (one data file per creating process: [`datafiles`]). Restore
//! checks all of it before it changes anything, and never writes into the directory except CRIU's own
//! restore log.
//!
//! One module per job: what is refused before a dump ([`preflight`]), the dump ([`checkpoint`]),
//! the image digests ([`digests`]), the manifest ([`manifest`]), the GPUs and the device map
//! ([`devices`]), a directory's own rates for `bench --to-disk` ([`rate`]), the restore ([`restore`]) and what an interrupted restore leaves ([`leftovers`]).

mod checkpoint;
mod datafiles;
mod devices;
mod digests;
pub mod discard;
pub mod leftovers;
mod manifest;
mod preflight;
mod rate;
mod restore;
pub mod signing;
pub mod store;

pub use crate::container::namespace_root;
pub use checkpoint::{CheckpointError, INCOMPLETE_MARKER, checkpoint};
pub use datafiles::{
    DATA_DIR, DATA_FILES_RECORD, DataFiles, WorkerTime, remove_record, workers_for,
};
pub use digests::IMAGE_DIGESTS;
pub(crate) use manifest::read_manifest;
pub use rate::{DirRate, measure_dir};
pub use restore::{RestoreError, RestoreOptions, restore};
pub use signing::SIGNATURE_FILE;

use crate::criu::Criu;
use crate::group_capture::SuspendOptions;
use crate::progress::Report;
use crate::{ControlError, refuse};
use std::path::{Path, PathBuf};

/// Sub-directory of CRIU's images in a checkpoint directory.
pub const IMAGES_DIR: &str = "images";

/// Options of `cuinterpose checkpoint`.
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    pub capture: SuspendOptions,
    pub dir: PathBuf,
    pub leave_running: bool,
    pub criu: Option<PathBuf>,
    /// Keep the GPU bytes in data files in the directory (`checkpoint --self-contained`) instead
    /// of the block store beside it ([`store`]).
    pub self_contained: bool,
}

/// What a checkpoint or restore did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiskReport {
    #[serde(flatten)]
    pub report: Report,
    pub dir: PathBuf,
    pub image_bytes: u64,
    /// Bytes of GPU memory written at a checkpoint (to data files, or blocks the store did not
    /// hold yet), read at a restore.
    pub data_bytes: u64,
    /// At a checkpoint into a block store: bytes of blocks the store held already (another
    /// checkpoint's, another process's, or repeated in this one), referenced, not written.
    pub shared_bytes: u64,
    /// Bytes of zero blocks neither written nor read (set to zero on the device at restore).
    pub zero_bytes: u64,
    /// Host PID of the tree's root: the dumped one, or the restored one.
    pub root: u32,
    /// The namespaces the tree shared with processes outside it (checkpoint), or joined
    /// (restore: those of `--namespaces-of`); see [`crate::namespaces`].
    pub shared_namespaces: Vec<protocol::manifest::SharedNamespace>,
    /// Where CRIU ran (crate::container): in the tool's namespaces, or in a container's, the
    /// tree's at a checkpoint and the one of `--namespaces-of` at a restore.
    pub placement: protocol::manifest::CriuPlacement,
    /// How the shims' data-file workers spent their time (the save at a checkpoint, the load at a
    /// restore: setup, I/O, digests, waits for copies); `None` when no bytes were streamed.
    pub worker_time: Option<WorkerTime>,
}

/// A checkpoint directory that cannot be restored: a refusal, since nothing was changed yet.
pub(crate) fn damaged(path: &Path, e: impl std::fmt::Display) -> ControlError {
    refuse(&format!("checkpoint {}", path.display()), e.to_string())
}

/// CRIU, or a refusal (nothing has changed when it is looked for).
pub(crate) fn locate_criu(
    explicit: Option<&Path>,
    config: &crate::config::ToolConfig,
) -> Result<Criu, ControlError> {
    Criu::locate(explicit, config.criu.as_deref()).map_err(|e| refuse("criu", e.to_string()))
}

/// How long the restored tree gets to disappear after SIGKILL.
pub(crate) const KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
