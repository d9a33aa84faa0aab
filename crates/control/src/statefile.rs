//! The state file of a suspended group (`cuinterpose.state`): where it lives, the check that a
//! new capture may write one, writing, reading and removing it, and where `resume` and `end`
//! look for it. A capture publishes it before its first destructive step; every recovery starts
//! from it (capture.rs, "The recovery rule").

use crate::{ControlError, Refusal};
use protocol::state::{GroupState, ParticipantState};
use std::path::{Path, PathBuf};

/// Name of the topology file in a state directory.
pub const STATE_FILE: &str = "cuinterpose.state";

/// Largest state file the tool reads back.
pub const STATE_FILE_LIMIT: u64 = protocol::state::MAX_STATE_FILE_LEN;

/// Where a suspended group's state lives unless `--state-dir` says otherwise.
pub fn default_state_dir(root: u32) -> PathBuf {
    std::env::temp_dir().join(format!("cuinterpose-suspended-{root}"))
}

/// Checks, changing nothing (a refused run leaves no directory behind), that `dir` can take the
/// state of a new capture: no state file in it yet, and a directory (or one that can be made)
/// this run can write. Returns the state file's path.
pub(crate) fn check_state_dir(dir: &Path) -> Result<PathBuf, ControlError> {
    let path = dir.join(STATE_FILE);
    if path.exists() {
        // Nothing was touched yet: a refusal, like every other reason not to start.
        return Err(ControlError::Refused(vec![Refusal {
            process: path.display().to_string(),
            reason:
                "already holds a suspended group; resume it first or choose another --state-dir"
                    .into(),
        }]));
    }
    // The nearest directory that exists must be writable; a file on the way is refused.
    let mut existing = dir;
    let problem = loop {
        match std::fs::metadata(existing) {
            Ok(m) if m.is_dir() => {
                break rustix::fs::access(existing, rustix::fs::Access::WRITE_OK)
                    .err()
                    .map(|e| format!("{} cannot be written: {e}", existing.display()));
            }
            Ok(_) => break Some(format!("{} is not a directory", existing.display())),
            Err(_) => match existing.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
                _ => break None,
            },
        }
    };
    match problem {
        None => Ok(path),
        Some(reason) => Err(ControlError::Refused(vec![Refusal {
            process: format!("--state-dir {}", dir.display()),
            reason,
        }])),
    }
}

/// Removes a state file that is of no use any more, and its directory when nothing else is in it.
pub(crate) fn remove_state(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "removing a state file");
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// [`write_state`] of a state at hand.
pub(crate) fn write_state_of(path: &Path, state: &GroupState) -> Result<(), ControlError> {
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ControlError::State {
                path: dir.to_path_buf(),
                source: e.into(),
            })?;
    }
    transport::files::write_atomically(path, &protocol::state::encode(state)).map_err(|e| {
        ControlError::State {
            path: path.to_path_buf(),
            source: e.into(),
        }
    })
}

/// Reads and decodes a state file.
pub fn read_state(path: &Path) -> Result<GroupState, ControlError> {
    let bytes = transport::files::read_bounded(path, STATE_FILE_LIMIT).map_err(|e| {
        ControlError::State {
            path: path.to_path_buf(),
            source: e.into(),
        }
    })?;
    protocol::state::decode(&bytes).map_err(|e| match e {
        // Another tool's state: read before anything changes, so a refusal (docs/design.md,
        // "Versions").
        protocol::ProtocolError::VersionMismatch { .. } => ControlError::Refused(vec![Refusal {
            process: format!("state file {}", path.display()),
            reason: format!("{e}: resume with the tool that suspended the group"),
        }]),
        e => ControlError::State {
            path: path.to_path_buf(),
            source: e.into(),
        },
    })
}

/// A captured process as the state file names it.
pub(crate) fn captured_label(p: &ParticipantState) -> String {
    if p.host_pid == p.ns_pid {
        format!("pid {}", p.host_pid)
    } else {
        format!("pid {} [ns pid {}]", p.host_pid, p.ns_pid)
    }
}

/// [`find_state`] for `root` and a state directory (`end` looks where `resume` does).
pub(crate) fn find_state_in(root: u32, state_dir: &Path) -> Result<PathBuf, ControlError> {
    if let Some(found) = state_candidates(root, state_dir)
        .into_iter()
        .find(|p| p.exists())
    {
        return Ok(found);
    }
    Err(ControlError::Refused(vec![Refusal {
        process: format!("pid {root}"),
        reason: format!(
            "no suspended group: {} does not exist (resumed already, or suspended with another \
             --state-dir)",
            state_dir.join(STATE_FILE).display()
        ),
    }]))
}

/// Where resume looks for the state file of `root`, in order.
fn state_candidates(root: u32, state_dir: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![state_dir.join(STATE_FILE)];
    if state_dir == default_state_dir(root)
        && let Ok(init) = crate::container::namespace_root(root)
        && init != root
    {
        candidates.push(default_state_dir(init).join(STATE_FILE));
    }
    candidates
}

/// The suspension `resume --pid root [--state-dir]` would take up, read for `inspect`: `None`
/// when there is no state file there or it cannot be read (inspect reports, it does not judge).
pub fn suspended_state(root: u32, state_dir: Option<&Path>) -> Option<Suspension> {
    let dir = state_dir.map_or_else(|| default_state_dir(root), Path::to_path_buf);
    let path = state_candidates(root, &dir)
        .into_iter()
        .find(|p| p.exists())?;
    let state = read_state(&path).ok()?;
    Some(Suspension {
        state_file: path,
        mode: state.mode,
    })
}

/// A suspended group's state file and the mode it records.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Suspension {
    pub state_file: std::path::PathBuf,
    pub mode: protocol::state::SuspendMode,
}
