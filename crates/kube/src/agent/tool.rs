//! The agent's whole call surface into `cuinterpose-control` (checkpoint, restore, discard), and the
//! mapping of its errors to the outcomes the `Checkpoint` conditions carry. Kept in this one module
//! so that a change of the control crate's API touches nothing else here.

use control::capture::{PhaseTiming as ControlPhase, Quiet, SuspendOptions};
use control::config::ToolConfig;
use control::disk::{self, CheckpointOptions, RestoreOptions};
use control::{Classified, ErrorClass};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the agent runs the tool on its node.
#[derive(Debug, Clone)]
pub struct ToolOptions {
    /// The CRIU binary (None: as the tool looks it up: `$CUINTERPOSE_CRIU`, the bundled one, then
    /// `criu` on PATH).
    pub criu: Option<PathBuf>,
    /// The CUDA driver library (None: `libcuda.so.1` from the loader's path).
    pub driver: Option<PathBuf>,
    /// Time the shims get to finish tracked calls in flight.
    pub freeze_timeout: Duration,
    /// The tool's settings, read once at the agent's start (`ToolConfig::from_env`).
    pub config: ToolConfig,
}

/// What the tool said about the workload when it did not succeed: its [`ErrorClass`] (the CLI's
/// exit codes 3, 4, 5 and 1), as the conditions of a `Checkpoint` carry it ([`failure_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Refused before anything changed (exit 3).
    Refused,
    /// Failed and rolled back: the workload runs as before (exit 4).
    RolledBack,
    /// Failed after the native lock or while rebuilding (exit 5), or unexpectedly (exit 1: what
    /// it left of the workload is not known).
    NeedsAttention,
}

/// A run that did not succeed: its kind and the tool's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailure {
    pub failure: Failure,
    pub message: String,
}

/// One phase of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub name: String,
    pub millis: f64,
    pub bytes: Option<u64>,
}

/// What a successful checkpoint or restore reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReport {
    pub phases: Vec<Phase>,
    pub image_bytes: u64,
    /// Host PID of the dumped or the restored tree's root.
    pub root: u32,
    pub total_millis: f64,
    /// `net`, `ipc`, `uts`: the namespaces the tree shared with its pod (checkpoint) or joined
    /// (restore).
    pub namespaces: Vec<&'static str>,
}

/// The outcome the agent reports for a class of the tool's errors. The class is the tool's own
/// (`Classified::class` of a `ControlError` or of a verb's own error type: `CheckpointError`,
/// which takes a failed capture's from its `SuspendError`, `RestoreError`, `DiscardError`; the
/// CLI's exit codes follow the same): the agent never classifies an error by its own rule, so
/// the two front ends cannot disagree about what a failure left.
///
/// The conditions have no type for the CLI's exit 1 (an unexpected error: an I/O error, a
/// participant that went away, a bug): what it left of the workload is not known, so it is not
/// `RolledBack` (which tells the user the workload runs as before and nothing is to be done)
/// but `NeedsAttention`, whose message says what failed.
fn failure_of(class: ErrorClass) -> Failure {
    match class {
        ErrorClass::Refused => Failure::Refused,
        ErrorClass::RolledBack => Failure::RolledBack,
        ErrorClass::NeedsAttention | ErrorClass::Error => Failure::NeedsAttention,
    }
}

/// A failure of the tool, of any verb's error type, by the class it gives itself, with its
/// message.
fn failure<E: Classified>(error: E) -> ToolFailure {
    ToolFailure {
        failure: failure_of(error.class()),
        message: error.to_string(),
    }
}

fn phases(phases: &[ControlPhase]) -> Vec<Phase> {
    phases
        .iter()
        .map(|p| Phase {
            name: p.name.to_string(),
            millis: p.millis,
            bytes: (p.bytes > 0).then_some(p.bytes),
        })
        .collect()
}

fn report(report: disk::DiskReport) -> ToolReport {
    ToolReport {
        phases: phases(&report.report.phases),
        image_bytes: report.image_bytes,
        root: report.root,
        total_millis: report.report.total_millis,
        namespaces: report.shared_namespaces.iter().map(|n| n.name()).collect(),
    }
}

/// Checkpoints the tree under `root` into `dir` (blocking).
pub fn checkpoint(
    options: &ToolOptions,
    root: u32,
    dir: &Path,
    leave_running: bool,
) -> Result<ToolReport, ToolFailure> {
    let mut capture = SuspendOptions::new(root, &options.config);
    capture.freeze_timeout = options.freeze_timeout;
    capture.driver = options.driver.clone();
    let options = CheckpointOptions {
        capture,
        dir: dir.to_path_buf(),
        leave_running,
        criu: options.criu.clone(),
        self_contained: false,
    };
    disk::checkpoint(&options, &Quiet)
        .map(report)
        .map_err(failure)
}

/// Restores the checkpoint in `dir` into new processes (blocking), in the namespaces of process
/// `namespaces_of` (a process of the placeholder pod) that the checkpointed tree had apart from
/// the agent's.
pub fn restore(
    options: &ToolOptions,
    dir: &Path,
    device_map: Vec<(u32, u32)>,
    namespaces_of: u32,
) -> Result<ToolReport, ToolFailure> {
    let options = RestoreOptions {
        device_map,
        namespaces_of: Some(namespaces_of),
        criu: options.criu.clone(),
        driver: options.driver.clone(),
        ..RestoreOptions::new(dir.to_path_buf(), &options.config)
    };
    disk::restore(&options, &Quiet).map(report).map_err(failure)
}

/// Deletes the checkpoint in `dir` with the files it keeps outside it (blocking); the message
/// says what went.
pub fn discard(dir: &Path) -> Result<String, ToolFailure> {
    control::discard::discard(dir)
        .map(|r| {
            let store = r.store.map_or_else(String::new, |s| {
                format!(
                    ", {} unreferenced block(s) of the store ({} bytes)",
                    s.blocks, s.bytes
                )
            });
            format!(
                "discarded {}: {} bytes of CRIU images, {} link remap(s){store}",
                r.dir.display(),
                r.image_bytes,
                r.link_remaps.len()
            )
        })
        .map_err(failure)
}

/// The processes of the tree under `root` (to move a restored tree into its pod's cgroup).
pub fn process_tree(root: u32) -> Result<Vec<u32>, ToolFailure> {
    control::discovery::process_tree(root).map_err(failure)
}

/// The directories of `pid`'s cgroups, one per hierarchy mounted on this node (every v1
/// controller and named hierarchy, and the unified one): where a restored tree joins its
/// placeholder container.
pub fn cgroup_dirs(pid: u32) -> Result<Vec<PathBuf>, ToolFailure> {
    control::container::cgroup_dirs(pid).map_err(failure)
}

/// `0=1,1=0` → [(0, 1), (1, 0)], as `cuinterpose restore --device-map` reads it.
pub fn parse_device_map(text: &str) -> Result<Vec<(u32, u32)>, String> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let (old, new) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not OLD=NEW"))?;
            let parse = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{s:?} is not a device ordinal"))
            };
            Ok((parse(old)?, parse(new)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use control::capture::SuspendError;
    use control::disk::{CheckpointError, RestoreError};
    use control::{ControlError, Refusal};

    /// Every class maps to one outcome, and only an error that left the workload as it was is
    /// reported as refused or rolled back.
    #[test]
    fn each_class_has_its_outcome() {
        assert_eq!(failure_of(ErrorClass::Refused), Failure::Refused);
        assert_eq!(failure_of(ErrorClass::RolledBack), Failure::RolledBack);
        assert_eq!(
            failure_of(ErrorClass::NeedsAttention),
            Failure::NeedsAttention
        );
        assert_eq!(failure_of(ErrorClass::Error), Failure::NeedsAttention);
    }

    /// The agent's outcome of representative errors is the one their `class()` gives, among
    /// them those its own rule used to decide otherwise (issue 31): a process that is not there,
    /// another run, a sticky error, a failure before anything changed are refusals (exit 3), not
    /// rollbacks; a drain past its deadline is rolled back (exit 4); an unreadable state file or
    /// a panicked worker (exit 1) needs attention.
    #[test]
    fn outcomes_follow_the_tool_classes() {
        let inner = || Box::new(ControlError::NoSuchProcess(7));
        let cases = [
            (
                ControlError::Refused(vec![Refusal {
                    process: "pid 7".into(),
                    reason: "no shim".into(),
                }]),
                Failure::Refused,
            ),
            (ControlError::NoCudaProcesses(7), Failure::Refused),
            (ControlError::NoSuchProcess(7), Failure::Refused),
            (
                ControlError::AnotherRun {
                    process: "pid 7".into(),
                    message: "held".into(),
                },
                Failure::Refused,
            ),
            (
                ControlError::StickyError {
                    process: "pid 7".into(),
                    message: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                },
                Failure::Refused,
            ),
            (
                ControlError::Unchanged { source: inner() },
                Failure::Refused,
            ),
            // A drain past its deadline: every gate open again, nothing released (exit 4).
            (
                ControlError::NotDrained {
                    timeout: Duration::from_secs(2),
                    busy: vec!["pid 7: a kernel that never ends".into()],
                },
                Failure::RolledBack,
            ),
            (
                ControlError::State {
                    path: "/s/cuinterpose.state".into(),
                    source: control::FileError::Io(std::io::Error::other("denied")),
                },
                Failure::NeedsAttention,
            ),
            (
                ControlError::Panicked { step: "dump" },
                Failure::NeedsAttention,
            ),
        ];
        for (error, expected) in cases {
            let message = error.to_string();
            let class = error.class();
            let reported = failure(error);
            assert_eq!(reported.failure, failure_of(class), "{message}");
            assert_eq!(reported.failure, expected, "{message}");
            assert_eq!(reported.message, message);
        }
    }

    /// A checkpoint's failure takes the class of its own error (`CheckpointError::class`), with
    /// its message: a refusal before the capture or in it (the suspend's own error,
    /// `SuspendError`, by its class) is refused, a capture or a dump rolled back is rolled back,
    /// a failed rollback and a tree not ended once the checkpoint was complete need attention. (A group left suspended takes its driver error's class, pinned in the control
    /// crate: this crate has no driver types to make one.)
    #[test]
    fn checkpoint_failures_follow_their_class() {
        let inner = || Box::new(ControlError::NoSuchProcess(7));
        let cases = [
            (
                CheckpointError::NotStarted(ControlError::Refused(vec![Refusal {
                    process: "pid 7".into(),
                    reason: "has a controlling terminal".into(),
                }])),
                Failure::Refused,
            ),
            (
                CheckpointError::NotCaptured(SuspendError::NotStarted(ControlError::AnotherRun {
                    process: "pid 7".into(),
                    message: "held".into(),
                })),
                Failure::Refused,
            ),
            (
                CheckpointError::NotCaptured(SuspendError::RolledBack { failure: inner() }),
                Failure::RolledBack,
            ),
            (
                CheckpointError::NotCaptured(SuspendError::RollbackFailed {
                    failure: inner(),
                    rollback: vec![],
                }),
                Failure::NeedsAttention,
            ),
            (
                CheckpointError::RolledBack { failure: inner() },
                Failure::RolledBack,
            ),
            (
                CheckpointError::RollbackFailed {
                    failure: inner(),
                    rollback: inner(),
                },
                Failure::NeedsAttention,
            ),
            (
                CheckpointError::Complete(ControlError::Step {
                    step: "stopping the dumped tree (the checkpoint is complete)",
                    process: "pid 7".into(),
                    source: inner(),
                }),
                Failure::NeedsAttention,
            ),
        ];
        for (error, expected) in cases {
            let message = error.to_string();
            let reported = failure(error);
            assert_eq!(reported.failure, expected, "{message}");
            assert_eq!(reported.message, message);
        }
    }

    /// A restore's failure takes the class of its own error (`RestoreError::class`), with its
    /// message: a refusal before CRIU ran is refused, CRIU's failure and an undone rebuild are
    /// rolled back, a restored tree that could not be killed needs attention.
    #[test]
    fn restore_failures_follow_their_class() {
        let inner = || Box::new(ControlError::NoSuchProcess(7));
        let cases = [
            (
                RestoreError::NotRestored(ControlError::Refused(vec![Refusal {
                    process: "checkpoint".into(),
                    reason: "was taken on CUDA driver API 1".into(),
                }])),
                Failure::Refused,
            ),
            (
                RestoreError::CriuFailed {
                    status: "exit status 1".into(),
                    log: "/l".into(),
                    tail: String::new(),
                },
                Failure::RolledBack,
            ),
            (
                RestoreError::Untracked(ControlError::Criu(control::criu::CriuError::NoPid(
                    "restore",
                ))),
                Failure::NeedsAttention,
            ),
            (
                RestoreError::Undone {
                    root: 9,
                    failure: inner(),
                },
                Failure::RolledBack,
            ),
            (
                RestoreError::NotUndone {
                    root: 9,
                    failure: inner(),
                },
                Failure::NeedsAttention,
            ),
        ];
        for (error, expected) in cases {
            let message = error.to_string();
            let reported = failure(error);
            assert_eq!(reported.failure, expected, "{message}");
            assert_eq!(reported.message, message);
        }
    }

    /// A discard's failure takes the class of its own error (`DiscardError::class`): a directory
    /// that is not there is refused, nothing removed, with the tool's message.
    #[test]
    fn discard_failures_follow_their_class() {
        let dir = std::env::temp_dir().join(format!(
            "cuinterpose-agent-no-such-checkpoint-{}",
            std::process::id()
        ));
        let missing = discard(&dir).unwrap_err();
        assert_eq!(missing.failure, Failure::Refused, "{}", missing.message);
        assert!(
            missing.message.contains("does not exist"),
            "{}",
            missing.message
        );
    }

    #[test]
    fn device_maps() {
        assert_eq!(parse_device_map("0=1,1=0"), Ok(vec![(0, 1), (1, 0)]));
        assert_eq!(parse_device_map(""), Ok(vec![]));
        assert!(parse_device_map("0:1").is_err());
        assert!(parse_device_map("a=1").is_err());
    }
}
