//! What a restore keeps outside the checkpoint while it runs: CRIU's work directory (its log,
//! statistics and the restored root's pid file) and a record of the tool run that made it. It lives
//! beside the run locks, under the checkpoint directory's key (crate::runlock::directory_key), so
//! that whatever killed a restore, the next run on the same checkpoint finds what it left:
//! - the next `restore` removes a work directory whose tree is gone, and refuses (naming both ways
//!   out) while a tree that restore brought back is still alive;
//! - `restore --cleanup` kills such a tree and removes the work directory.
//!
//! A partly restored tree does not outlive CRIU: CRIU dies with the tool (crate::launch's parent
//! death signal) and the tasks it is restoring die with CRIU. What can outlive a killed restore is
//! a tree CRIU finished, which `resume --pid <root>` brings back (the restore recorded it as a
//! suspended group) or `restore --cleanup` kills.

use super::KILL_TIMEOUT;
use crate::criu::CRIU_PID_FILE;
use crate::state_error;
use crate::statefile::{STATE_FILE, default_state_dir, remove_state};
use crate::{ControlError, Refusal, procfs, runlock};
use std::path::{Path, PathBuf};

/// The tool run that made the work directory: `<pid> <start time in clock ticks after boot>`.
const TOOL_RECORD: &str = "tool";

/// The work directory a restore of `dir` uses.
pub(super) fn work_dir_of(dir: &Path) -> PathBuf {
    runlock::lock_dir()
        .join("restores")
        .join(runlock::directory_key(dir))
}

/// Where CRIU's log of the last failed restore of a checkpoint is kept (its work directory,
/// `work_dir`, is removed): beside it, `<key>.criu-restore.log`, replaced by the next failure.
pub(super) fn kept_log_of(work_dir: &Path) -> PathBuf {
    let mut name = work_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".criu-restore.log");
    work_dir.with_file_name(name)
}

/// Creates the (private, empty) work directory of a restore of `dir`, recording this tool run.
/// The caller holds the directory's lock and has dealt with any previous one ([`check`]).
pub(super) fn create_work_dir(dir: &Path) -> Result<PathBuf, ControlError> {
    let work_dir = work_dir_of(dir);
    let parent = work_dir.parent().unwrap_or(&work_dir);
    transport::files::ensure_private_dir(parent).map_err(|e| state_error(parent, e))?;
    transport::files::ensure_private_dir(&work_dir).map_err(|e| state_error(&work_dir, e))?;
    let pid = std::process::id();
    let start_time = procfs::stat(pid).map_or(0, |s| s.start_time);
    let record = work_dir.join(TOOL_RECORD);
    std::fs::write(&record, format!("{pid} {start_time}\n"))
        .map_err(|e| state_error(&record, e))?;
    Ok(work_dir)
}

/// What an earlier restore of a checkpoint left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub work_dir: PathBuf,
    /// The root of the tree CRIU restored, while it is alive.
    pub restored_root: Option<u32>,
}

/// Finds what an earlier restore of `dir` left, if anything.
pub fn find(dir: &Path) -> Option<Leftover> {
    let work_dir = work_dir_of(dir);
    if !work_dir.is_dir() {
        return None;
    }
    let restored_root = restored_root(&work_dir);
    Some(Leftover {
        work_dir,
        restored_root,
    })
}

/// The pid in CRIU's pid file, if that process is alive and started after the tool run that made
/// the work directory (so a pid reused by an older process is never taken for the tree).
fn restored_root(work_dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(work_dir.join(CRIU_PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let tool_started: u64 = std::fs::read_to_string(work_dir.join(TOOL_RECORD))
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let stat = procfs::stat(pid)?;
    (!procfs::exited(pid) && stat.start_time >= tool_started).then_some(pid)
}

/// Before a restore of `dir` (directory lock held): a leftover work directory whose tree is gone is
/// removed; a tree a killed restore brought back and that still runs is a refusal naming the two
/// ways out.
pub(super) fn check(dir: &Path) -> Result<(), ControlError> {
    let Some(leftover) = find(dir) else {
        return Ok(());
    };
    if let Some(root) = leftover.restored_root {
        return Err(ControlError::Refused(vec![Refusal {
            process: format!(
                "the tree an earlier restore of {} brought back (root pid {root})",
                dir.display()
            ),
            reason: format!(
                "it is still alive; nothing was changed: `cuinterpose resume --pid {root}` brings it \
                 back, `cuinterpose restore --dir {} --cleanup` kills it",
                dir.display()
            ),
        }]));
    }
    tracing::info!(work_dir = %leftover.work_dir.display(), "removing the work directory of an earlier, interrupted restore");
    remove(&leftover.work_dir)
}

/// What `restore --cleanup` did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CleanupReport {
    pub dir: PathBuf,
    /// The work directory removed, if there was one.
    pub work_dir: Option<PathBuf>,
    /// The root of the restored tree killed, if one was alive.
    pub killed_root: Option<u32>,
}

/// `restore --cleanup`: kills the tree an interrupted restore of `dir` left alive and removes its
/// work directory (and the record that let `resume` continue it). The checkpoint is not touched.
pub fn cleanup(dir: &Path) -> Result<CleanupReport, ControlError> {
    let _lock = runlock::RunLock::directory(dir)?;
    let mut report = CleanupReport {
        dir: dir.to_path_buf(),
        ..CleanupReport::default()
    };
    let Some(leftover) = find(dir) else {
        return Ok(report);
    };
    if let Some(root) = leftover.restored_root {
        crate::launch::kill_tree(root, KILL_TIMEOUT).map_err(|source| ControlError::Step {
            step: "restore --cleanup (killing the restored tree)",
            process: format!("the restored tree (root pid {root})"),
            source: Box::new(source.into()),
        })?;
        let state = default_state_dir(root).join(STATE_FILE);
        super::datafiles::remove_record(&state);
        remove_state(&state);
        report.killed_root = Some(root);
    }
    remove(&leftover.work_dir)?;
    report.work_dir = Some(leftover.work_dir);
    Ok(report)
}

fn remove(work_dir: &Path) -> Result<(), ControlError> {
    match std::fs::remove_dir_all(work_dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ControlError::Removing {
            path: work_dir.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// One test (the lock directory is process-wide configuration): a leftover without a live
    /// tree is removed by the next restore's check; one with a live tree is refused by it and
    /// killed by cleanup.
    #[test]
    fn leftovers_are_removed_and_a_live_restored_tree_is_refused_then_killed() {
        let locks = tempfile::tempdir().unwrap();
        runlock::configure(&crate::config::ToolConfig {
            lock_dir: Some(locks.path().to_path_buf()),
            ..crate::config::ToolConfig::default()
        });
        let checkpoint = tempfile::tempdir().unwrap();
        let dir = checkpoint.path();
        assert_eq!(find(dir), None);
        let _lock = runlock::RunLock::directory(dir).unwrap();

        // Killed before CRIU wrote its pid file: nothing alive, the next restore clears it.
        let work_dir = create_work_dir(dir).unwrap();
        assert_eq!(
            find(dir),
            Some(Leftover {
                work_dir: work_dir.clone(),
                restored_root: None
            })
        );
        check(dir).unwrap();
        assert!(!work_dir.exists());

        // A pid file naming a process older than the tool run is not taken for the tree.
        let work_dir = create_work_dir(dir).unwrap();
        std::fs::write(work_dir.join(CRIU_PID_FILE), "1\n").unwrap();
        assert_eq!(find(dir).unwrap().restored_root, None);

        // A tree CRIU finished and that still runs (a child started after the record).
        let mut tree = Command::new("sleep")
            .arg("300")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        std::fs::write(work_dir.join(CRIU_PID_FILE), format!("{}\n", tree.id())).unwrap();
        assert_eq!(find(dir).unwrap().restored_root, Some(tree.id()));
        let refused = check(dir).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("root pid {}", tree.id())),
            "{refused}"
        );
        assert!(refused.contains("--cleanup"), "{refused}");
        assert!(work_dir.exists(), "a refusal changes nothing");
        drop(_lock);

        let report = cleanup(dir).unwrap();
        assert_eq!(report.killed_root, Some(tree.id()));
        assert_eq!(report.work_dir.as_deref(), Some(work_dir.as_path()));
        assert!(!tree.wait().unwrap().success(), "the tree was killed");
        assert!(!work_dir.exists());
        assert_eq!(find(dir), None);
        // Nothing left: a second cleanup is a no-op.
        let again = cleanup(dir).unwrap();
        assert_eq!((again.killed_root, again.work_dir), (None, None));
    }
}
