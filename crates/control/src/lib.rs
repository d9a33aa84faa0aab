//! What the `cuinterpose` tool does, as a library: find a workload's CUDA processes, prove the whole
//! group safe to capture, drive the shims through the capture and rebuild phases around the driver's
//! native checkpoint, and (for checkpoints on disk) CRIU.
//!
//! Fail closed: everything up to the first destructive step is read-only, and a refusal names the
//! process and the reason. A failure after shims released memory but before the native lock is rolled
//! back with the same Load/Import code a resume uses, so the workload keeps running.

pub mod capture;
pub mod carrier_choice;
pub mod carrier_helper;
pub mod carrier_policy;
pub mod config;
pub mod container;
pub mod criu;
pub mod discovery;
pub mod disk;
pub mod doctor;
pub mod drain;
pub mod end;
#[cfg(test)]
mod fakes;
pub mod group;
mod group_capture;
pub mod launch;
pub mod layout;
pub mod namespaces;
pub mod native;
mod native_steps;
mod parallel;
mod phases;
pub mod procfs;
pub mod progress;
pub mod remaps;
pub mod restore_thread;
pub mod runlock;
pub mod runtimes;
pub mod safefs;
pub mod statefile;
mod suspend_error;
pub mod tcp;

pub use disk::discard;
pub use group::Group;

use cuda_abi::CUresult;
use std::path::{Path, PathBuf};

/// The tool's version, sent in HELLO.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Everything that can go wrong in the tool's library layer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no process {0}")]
    NoSuchProcess(u32),
    #[error("container {container}: {reason}")]
    Container { container: String, reason: String },
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
    /// Letting a stopped process's restore thread run alone failed (restore_thread.rs).
    #[error("pid {pid}, its restore thread {tid}: {what}: {source}")]
    RestoreThread {
        pid: u32,
        tid: u32,
        what: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Criu(#[from] criu::CriuError),
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    #[error("{step} failed for {process}: {}", without_label(source, process))]
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
    /// A file or directory of the tool's state (a state file, its directory, a checkpoint's
    /// files) that could not be read or written.
    #[error("{}: {source}", state_label(path))]
    State { path: PathBuf, source: FileError },
    /// The carrier helper (`suspend --carrier helper`) could not be started or reached.
    #[error("carrier helper at {}: {message}", socket.display())]
    CarrierHelper { socket: PathBuf, message: String },
    /// `--carrier X` asked for a carrier the machine cannot hold (crate::carrier_choice).
    #[error("--carrier {carrier} refused, nothing was changed: {reason}")]
    CarrierRefused {
        carrier: &'static str,
        reason: String,
    },
    #[error("removing {path}: {source}")]
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
    /// A process's context already holds a sticky error of the application's own work, found by
    /// the drain: the capture is refused, every gate opened again, nothing changed.
    #[error("refused, nothing was changed:\n  {process}: {message}")]
    StickyError { process: String, message: String },
    /// The group could not be drained before `--freeze-timeout`: nothing was released. Its one
    /// source is the capture's freeze (crate::drain, called by group_capture::freeze), which
    /// opens every gate again before the error leaves it; so it classifies as rolled back
    /// (exit 4, docs/recovery.md), and the freeze's rollback wraps it
    /// (capture::SuspendError::RolledBack, or RollbackFailed when a gate did not open again,
    /// which needs attention).
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
    /// A worker thread of a fan-out (crate::parallel) panicked: a bug of the tool, named by the
    /// step it ran; the other workers' results stand.
    #[error("a {step} thread panicked")]
    Panicked { step: &'static str },
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
}

/// Why the tool will not capture a group: the process and the reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Refusal {
    pub process: String,
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.process, self.reason)
    }
}

/// A file or directory of the tool's state that could not be used.
pub(crate) fn state_error(path: &Path, e: impl Into<FileError>) -> ControlError {
    ControlError::State {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// A refusal of one thing, the workload unchanged.
pub(crate) fn refuse(process: &str, reason: String) -> ControlError {
    ControlError::Refused(vec![Refusal {
        process: process.to_string(),
        reason,
    }])
}

/// `source`'s message without a leading `process: `: a step's error names the process already,
/// and the participant's own error (ControlError::Participant, Shim, Protocol) begins with it.
fn without_label(source: &ControlError, process: &str) -> String {
    let text = source.to_string();
    match text
        .strip_prefix(process)
        .and_then(|rest| rest.strip_prefix(": "))
    {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

/// `state file PATH` for a state file, the path alone for anything else (a directory is no
/// state file).
fn state_label(path: &std::path::Path) -> String {
    if path.file_name() == Some(std::ffi::OsStr::new(protocol::state::STATE_FILE_NAME)) {
        format!("state file {}", path.display())
    } else {
        path.display().to_string()
    }
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

pub(crate) fn rollback_lines(errors: &[ControlError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a failed operation left of the workload: the classes the CLI's exit codes (3, 4, 5, 1)
/// document, decided here, next to the errors, so that a new variant is classified where it is
/// added rather than falling through to `Error` in a binary's match. The one classification of
/// every front end: the CLI maps it to its exit code, the Kubernetes agent to the condition it
/// sets (`crates/kube/src/agent/tool.rs`); neither classifies an error by its own rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Refused before anything changed: the workload runs as before.
    Refused,
    /// Failed, then rolled back (a restore: what it brought back was killed): the workload runs
    /// as before, the checkpoint is unchanged.
    RolledBack,
    /// Failed after the native lock, while rebuilding, or while ending: the workload needs
    /// attention.
    NeedsAttention,
    /// Anything else (an I/O error, a participant that went away): what it left is not known.
    Error,
}

/// An error that says what it left of the workload: `ControlError` and each verb's own error type
/// (`SuspendError`, `ResumeError`, `PrepareError`, `EndError`, `CheckpointError`, `RestoreError`,
/// `DiscardError`). One trait rather than a `class` of each type's own, so that the CLI and the
/// Kubernetes agent classify any verb's failure the same one way (the CLI's `exit_for` by a table
/// of these types, the agent's `failure` by one generic function), and a new verb's error type
/// joins both by implementing it. `Error + Send + Sync + 'static`: what `anyhow` needs to wrap
/// it and to find it again under the verbs' context.
pub trait Classified: std::error::Error + Send + Sync + 'static {
    /// What this failure left of the workload (the CLI's exit code, the agent's condition).
    fn class(&self) -> ErrorClass;
}

impl Classified for ControlError {
    fn class(&self) -> ErrorClass {
        match self {
            // Nothing was changed: a refusal, a process or driver that is not there.
            ControlError::Refused(_)
            | ControlError::NoCudaProcesses(_)
            | ControlError::NoSuchProcess(_)
            | ControlError::Container { .. }
            | ControlError::Unchanged { .. }
            | ControlError::CarrierRefused { .. }
            | ControlError::AnotherRun { .. }
            | ControlError::StickyError { .. }
            | ControlError::DriverLoad { .. }
            | ControlError::DriverSymbol { .. } => ErrorClass::Refused,
            // Undone: the workload runs as before. A drain past its deadline released nothing
            // and every gate it closed is open again (its variant says why that holds wherever
            // it is returned).
            ControlError::NotDrained { .. } => ErrorClass::RolledBack,
            ControlError::Step { .. } | ControlError::VerifyFailed(_) => ErrorClass::NeedsAttention,
            // Listed rather than `_`, so that a new variant must be classified.
            ControlError::Proc { .. }
            | ControlError::Participant { .. }
            | ControlError::Protocol { .. }
            | ControlError::Shim { .. }
            | ControlError::Driver { .. }
            | ControlError::RestoreThread { .. }
            | ControlError::Criu(_)
            | ControlError::Launch(_)
            | ControlError::LinkRemap { .. }
            | ControlError::State { .. }
            | ControlError::CarrierHelper { .. }
            | ControlError::Removing { .. }
            | ControlError::ParticipantsExited { .. }
            | ControlError::Panicked { .. } => ErrorClass::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which variant `error` is, by an exhaustive match (no `_`): a variant added to
    /// `ControlError` does not compile here until it is given a number, and
    /// `every_variant_is_classified_as_the_exit_codes_document` then fails until it lists a case
    /// of it.
    fn variant(error: &ControlError) -> usize {
        match error {
            ControlError::NoSuchProcess(_) => 0,
            ControlError::Container { .. } => 1,
            ControlError::Proc { .. } => 2,
            ControlError::NoCudaProcesses(_) => 3,
            ControlError::Refused(_) => 4,
            ControlError::Participant { .. } => 5,
            ControlError::Protocol { .. } => 6,
            ControlError::Shim { .. } => 7,
            ControlError::DriverLoad { .. } => 8,
            ControlError::DriverSymbol { .. } => 9,
            ControlError::Driver { .. } => 10,
            ControlError::RestoreThread { .. } => 11,
            ControlError::Criu(_) => 12,
            ControlError::Launch(_) => 13,
            ControlError::Step { .. } => 14,
            ControlError::LinkRemap { .. } => 15,
            ControlError::State { .. } => 16,
            ControlError::CarrierHelper { .. } => 17,
            ControlError::CarrierRefused { .. } => 18,
            ControlError::Removing { .. } => 19,
            ControlError::ParticipantsExited { .. } => 20,
            ControlError::Unchanged { .. } => 21,
            ControlError::AnotherRun { .. } => 22,
            ControlError::StickyError { .. } => 23,
            ControlError::NotDrained { .. } => 24,
            ControlError::VerifyFailed(_) => 25,
            ControlError::Panicked { .. } => 26,
        }
    }

    /// How many variants [`variant`] numbers.
    const VARIANTS: usize = 27;

    /// One error of every variant, with the class the exit codes (docs/recovery.md) give it.
    fn every_variant() -> Vec<(ControlError, ErrorClass)> {
        use ErrorClass::{Error, NeedsAttention, Refused, RolledBack};
        let inner = || Box::new(ControlError::NoSuchProcess(7));
        let io = || std::io::Error::other("denied");
        let refusal = || {
            vec![Refusal {
                process: "pid 7".into(),
                reason: "r".into(),
            }]
        };
        vec![
            (ControlError::NoSuchProcess(7), Refused),
            (
                ControlError::Container {
                    container: "c".into(),
                    reason: "not running".into(),
                },
                Refused,
            ),
            (
                ControlError::Proc {
                    pid: 7,
                    path: "/proc/7/maps".into(),
                    source: io(),
                },
                Error,
            ),
            (ControlError::NoCudaProcesses(7), Refused),
            (ControlError::Refused(refusal()), Refused),
            (
                ControlError::Participant {
                    process: "pid 7".into(),
                    source: transport::TransportError::Timeout,
                },
                Error,
            ),
            (
                ControlError::Protocol {
                    process: "pid 7".into(),
                    message: "closed".into(),
                },
                Error,
            ),
            (
                ControlError::Shim {
                    process: "pid 7".into(),
                    code: protocol::ErrorCode::Internal,
                    message: "m".into(),
                },
                Error,
            ),
            (
                ControlError::DriverLoad {
                    name: "libcuda.so.1".into(),
                    source: libloading::Error::DlOpenUnknown,
                },
                Refused,
            ),
            (
                ControlError::DriverSymbol {
                    name: "cuCheckpointProcessLock",
                    source: libloading::Error::DlSymUnknown,
                },
                Refused,
            ),
            (
                ControlError::Driver {
                    call: "cuCheckpointProcessLock",
                    result: CUresult::ERROR_INVALID_VALUE,
                },
                Error,
            ),
            (
                ControlError::RestoreThread {
                    pid: 7,
                    tid: 8,
                    what: "PTRACE_SEIZE",
                    source: io(),
                },
                Error,
            ),
            (
                ControlError::Criu(criu::CriuError::NotFound {
                    looked: "PATH".into(),
                }),
                Error,
            ),
            (ControlError::Launch(launch::LaunchError::Wait(io())), Error),
            (
                ControlError::Step {
                    step: "native restore",
                    process: "pid 7".into(),
                    source: inner(),
                },
                NeedsAttention,
            ),
            (
                ControlError::LinkRemap {
                    path: "/l".into(),
                    what: "linking".into(),
                    source: None,
                },
                Error,
            ),
            (
                ControlError::State {
                    path: "/s".into(),
                    source: FileError::Io(io()),
                },
                Error,
            ),
            (
                ControlError::CarrierHelper {
                    socket: "/h.sock".into(),
                    message: "gone".into(),
                },
                Error,
            ),
            (
                ControlError::CarrierRefused {
                    carrier: "helper",
                    reason: "r".into(),
                },
                Refused,
            ),
            (
                ControlError::Removing {
                    path: "/d".into(),
                    source: io(),
                },
                Error,
            ),
            (
                ControlError::ParticipantsExited {
                    processes: vec!["pid 7".into()],
                    failure: inner(),
                },
                Error,
            ),
            (ControlError::Unchanged { source: inner() }, Refused),
            (
                ControlError::AnotherRun {
                    process: "pid 7".into(),
                    message: "m".into(),
                },
                Refused,
            ),
            (
                ControlError::StickyError {
                    process: "pid 7".into(),
                    message: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                },
                Refused,
            ),
            (
                ControlError::NotDrained {
                    timeout: std::time::Duration::from_secs(2),
                    busy: vec![],
                },
                RolledBack,
            ),
            (ControlError::VerifyFailed(refusal()), NeedsAttention),
            (ControlError::Panicked { step: "dump" }, Error),
        ]
    }

    /// The exit codes users script against (docs/recovery.md), pinned per variant: a variant
    /// moved to another class fails here before an integration test has to catch it, and every
    /// variant is listed (a new one fails until it is).
    #[test]
    fn every_variant_is_classified_as_the_exit_codes_document() {
        let cases = every_variant();
        let mut seen = [false; VARIANTS];
        for (error, class) in &cases {
            seen[variant(error)] = true;
            assert_eq!(error.class(), *class, "{error:?}");
        }
        let missing: Vec<usize> = (0..VARIANTS).filter(|&i| !seen[i]).collect();
        assert!(missing.is_empty(), "variants without a case: {missing:?}");
        assert_eq!(cases.len(), VARIANTS, "one case per variant");
    }

    /// A suspend's rollback is classified by what it says was done after the failure (rolled
    /// back, rollback failed), whatever the failure: here, where every variant has a case.
    #[test]
    fn a_rollback_is_classified_by_what_it_says_was_done() {
        use crate::capture::SuspendError;
        for (cause, _) in every_variant() {
            let rolled = SuspendError::RolledBack {
                failure: Box::new(cause),
            };
            assert_eq!(rolled.class(), ErrorClass::RolledBack, "{rolled:?}");
        }
        for (cause, _) in every_variant() {
            let failed = SuspendError::RollbackFailed {
                failure: Box::new(cause),
                rollback: vec![],
            };
            assert_eq!(failed.class(), ErrorClass::NeedsAttention, "{failed:?}");
        }
    }

    /// Each verb's own error type, and `ControlError`, is `Classified` (one that stopped being
    /// would not compile here) and gives through the trait object the class its variant has: the
    /// CLI and the agent classify them only through the trait.
    #[test]
    fn every_verb_error_is_classified() {
        use crate::capture::{PrepareError, ResumeError, SuspendError};
        use crate::disk::{CheckpointError, RestoreError};
        use crate::{discard::DiscardError, end::EndError};
        let cause = || ControlError::NoSuchProcess(7);
        let cases: [(&dyn Classified, ErrorClass); 9] = [
            (&cause(), ErrorClass::Refused),
            (&SuspendError::NotStarted(cause()), ErrorClass::Refused),
            (
                &SuspendError::RolledBack {
                    failure: Box::new(cause()),
                },
                ErrorClass::RolledBack,
            ),
            (&ResumeError::NotRebuilt(cause()), ErrorClass::Refused),
            (&PrepareError::Helper(cause()), ErrorClass::Refused),
            (
                &EndError::NotEnded {
                    processes: vec!["pid 7".into()],
                    waited: std::time::Duration::from_secs(30),
                },
                ErrorClass::NeedsAttention,
            ),
            (
                &CheckpointError::Suspended(cause()),
                ErrorClass::NeedsAttention,
            ),
            (
                &RestoreError::Undone {
                    root: 7,
                    failure: Box::new(cause()),
                },
                ErrorClass::RolledBack,
            ),
            (
                &DiscardError::Removing {
                    path: "/c/pages-1.img".into(),
                    source: std::io::Error::other("denied"),
                },
                ErrorClass::Error,
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(error.class(), expected, "{error}");
        }
    }

    /// Issue 29 item 11: a step's error names the process once, and only a state file is called
    /// one.
    #[test]
    fn errors_say_the_process_once_and_name_directories_as_they_are() {
        let step = ControlError::Step {
            step: "native restore",
            process: "pid 7 (python)".into(),
            source: Box::new(ControlError::Protocol {
                process: "pid 7 (python)".into(),
                message: "closed".into(),
            }),
        };
        assert_eq!(
            step.to_string(),
            "native restore failed for pid 7 (python): protocol error: closed"
        );
        let io = || FileError::Io(std::io::Error::other("denied"));
        let dir = ControlError::State {
            path: "/ckpt/images".into(),
            source: io(),
        };
        assert_eq!(dir.to_string(), "/ckpt/images: denied");
        let state = ControlError::State {
            path: "/tmp/s/cuinterpose.state".into(),
            source: io(),
        };
        assert_eq!(
            state.to_string(),
            "state file /tmp/s/cuinterpose.state: denied"
        );
    }
}
