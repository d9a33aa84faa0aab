//! What the `cuinterpose` tool does, as a library: find a workload's CUDA processes, prove the whole
//! group safe to capture, drive the shims through the capture and rebuild phases around the driver's
//! native checkpoint, and (for checkpoints on disk) CRIU.
//!
//! Fail closed: everything up to the first destructive step is read-only, and a refusal names the
//! process and the reason. A failure after shims released memory but before the native lock is rolled
//! back with the same Load/Import code a resume uses, so the workload keeps running.

pub mod capture;
pub mod carrier_helper;
pub mod config;
pub mod container;
pub mod criu;
pub mod discard;
pub mod discovery;
pub mod disk;
pub mod doctor;
pub mod drain;
pub mod group;
pub mod launch;
pub mod layout;
pub mod namespaces;
pub mod native;
mod parallel;
pub mod procfs;
pub mod remaps;
pub mod runlock;
pub mod tcp;

pub use group::{Group, Refusal};

use cuda_abi::CUresult;
use std::path::PathBuf;

/// The tool's version, sent in HELLO.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Everything that can go wrong in the tool's library layer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no process {0}")]
    NoSuchProcess(u32),
    #[error("reading {path} of pid {pid}: {source}")]
    Proc {
        pid: u32,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no CUDA process under pid {0}")]
    NoCudaProcesses(u32),
    #[error("refused, nothing was changed:\n{}", refusal_lines(.0))]
    Refused(Vec<Refusal>),
    #[error("{process}: {source}")]
    Participant {
        process: String,
        source: transport::TransportError,
    },
    #[error("{process}: protocol error: {message}")]
    Protocol { process: String, message: String },
    #[error("{process}: shim reported {code:?}: {message}")]
    Shim {
        process: String,
        code: protocol::ErrorCode,
        message: String,
    },
    #[error("loading the CUDA driver {name}: {source}")]
    DriverLoad {
        name: String,
        source: libloading::Error,
    },
    #[error("the CUDA driver has no {name}: {source}")]
    DriverSymbol {
        name: &'static str,
        source: libloading::Error,
    },
    #[error("{call} failed: {result}")]
    Driver {
        call: &'static str,
        result: CUresult,
    },
    #[error(transparent)]
    Criu(#[from] criu::CriuError),
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    #[error("{step} failed for {process}: {source}")]
    Step {
        step: &'static str,
        process: String,
        source: Box<ControlError>,
    },
    #[error(
        "{path} (a hard link CRIU made for a file deleted while open): {}",
        detail(what, source.as_ref())
    )]
    LinkRemap {
        path: PathBuf,
        /// What was being done; the cause, when there is one, is `source`.
        what: String,
        source: Option<std::io::Error>,
    },
    #[error("state file {path}: {source}")]
    State { path: PathBuf, source: FileError },
    /// The carrier helper (`suspend --carrier helper`) could not be started or reached.
    #[error("carrier helper at {}: {message}", socket.display())]
    CarrierHelper { socket: PathBuf, message: String },
    #[error("state file {path}: removing it: {source}")]
    Removing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} exited during the capture; the others were rolled back without it: {failure}", processes.join(", "))]
    ParticipantsExited {
        processes: Vec<String>,
        failure: Box<ControlError>,
    },
    #[error("{source}\nnothing was changed")]
    Unchanged { source: Box<ControlError> },
    /// Another tool run holds the capture of one of the group's processes (the shims grant one at
    /// a time); nothing of the other run's was touched.
    #[error("{process}: {message}")]
    AnotherRun { process: String, message: String },
    /// The group could not be drained before `--freeze-timeout`: nothing was released.
    #[error(
        "not drained after {} s; no GPU memory was released (--freeze-timeout sets the limit):\n{}",
        timeout.as_secs_f64(),
        busy.iter().map(|b| format!("  {b}")).collect::<Vec<_>>().join("\n")
    )]
    NotDrained {
        timeout: std::time::Duration,
        busy: Vec<String>,
    },
    #[error(
        "verify: the rebuilt group differs from the captured one; its processes are left frozen \
         (`cuinterpose resume` checks again):\n{}",
        refusal_lines(.0)
    )]
    VerifyFailed(Vec<Refusal>),
    #[error(
        "{failure}\nrolled back: the shims rebuilt what they had released and the workload is running"
    )]
    RolledBack { failure: Box<ControlError> },
    /// A restore that failed after CRIU brought the tree back, before its rebuild finished (the
    /// shims' gates were still closed), and killed the tree: nothing runs, the checkpoint is
    /// unchanged.
    #[error(
        "{failure}\nundone: the restored processes (root pid {root}) were killed before their \
         rebuild finished; the checkpoint is unchanged"
    )]
    RestoreUndone {
        root: u32,
        failure: Box<ControlError>,
    },
    #[error("{failure}\nrollback also failed, the workload needs attention:\n{}", rollback_lines(.rollback))]
    RollbackFailed {
        failure: Box<ControlError>,
        rollback: Vec<ControlError>,
    },
}

/// Why one of the tool's files (a state file, a checkpoint's files) could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    #[error(transparent)]
    Decode(#[from] protocol::ProtocolError),
    #[error("a digest thread panicked")]
    DigestThreadPanicked,
}

/// `what: cause`, either part left out when empty.
fn detail(what: &str, cause: Option<&std::io::Error>) -> String {
    match (what.is_empty(), cause) {
        (_, None) => what.to_string(),
        (true, Some(cause)) => cause.to_string(),
        (false, Some(cause)) => format!("{what}: {cause}"),
    }
}

fn refusal_lines(refusals: &[Refusal]) -> String {
    refusals
        .iter()
        .map(|r| format!("  {r}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rollback_lines(errors: &[ControlError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ControlError {
    /// Whether the workload was left as it was (a refusal, or a completed rollback).
    pub fn workload_untouched(&self) -> bool {
        matches!(
            self,
            ControlError::Refused(_)
                | ControlError::RolledBack { .. }
                | ControlError::RestoreUndone { .. }
                | ControlError::NoCudaProcesses(_)
                | ControlError::NoSuchProcess(_)
                | ControlError::Unchanged { .. }
                | ControlError::AnotherRun { .. }
                | ControlError::NotDrained { .. }
        )
    }
}
