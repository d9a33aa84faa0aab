//! `cuinterpose end`: the one command for a suspended group that cannot be brought back (bytes
//! lost with the carrier helper, a multicast object missing a member that `--allow-lost` cannot
//! rebuild, or simply a job the user gives up): its processes are killed and its state removed,
//! so that nothing is left frozen, stopped or recorded.
//!
//! Fail closed: only a group with a state file (what `resume` would take up) is ended, under the
//! tree's run lock (no capture or resume of it runs meanwhile), and only processes that are
//! provably the group's are killed: the captured processes still alive with the namespace PID the
//! state recorded, the processes of the workload's own PID namespaces, and the tree's root when
//! one of those is under it. A root whose tree holds none of them (every captured process has
//! exited, or the PID was reused) is not touched: only the state is removed.

use crate::config::ToolConfig;
use crate::discovery;
use crate::group_capture::lock_tree;
use crate::statefile::{
    captured_label, default_state_dir, find_state_in, read_state, remove_state,
};
use crate::{Classified, ControlError, ErrorClass};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What `end` acts on.
#[derive(Debug, Clone)]
pub struct EndOptions {
    /// The root given to `suspend` (or the restored root).
    pub root: u32,
    /// Where the state file is (the default directory of `root` unless `--state-dir`).
    pub state_dir: PathBuf,
    /// The tool's settings.
    pub config: ToolConfig,
}

impl EndOptions {
    pub fn new(root: u32, config: &ToolConfig) -> EndOptions {
        EndOptions {
            root,
            state_dir: default_state_dir(root),
            config: config.clone(),
        }
    }
}

/// What `end` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndReport {
    /// The processes killed, labelled as the state file names them (or by PID for the others).
    pub killed: Vec<String>,
    /// Captured processes that had exited already.
    pub already_gone: Vec<String>,
    /// The state file removed.
    pub state_file: PathBuf,
}

/// Why `end` failed, in the order it can: before anything was killed, while waiting for the
/// killed processes, after they were gone.
#[derive(Debug, thiserror::Error)]
pub enum EndError {
    /// The tree's run lock could not be taken (another run holds it) or its state file could not
    /// be found or read: nothing was killed.
    #[error(transparent)]
    NotStarted(#[from] ControlError),
    /// Processes of the group still alive after SIGKILL and a wait; the state file was kept.
    #[error(
        "{} still alive {} s after SIGKILL (uninterruptible in the kernel or the driver); the \
         state file was kept: run `cuinterpose end` again",
        processes.join(", "),
        waited.as_secs()
    )]
    NotEnded {
        processes: Vec<String>,
        waited: Duration,
    },
    /// Every process is gone, but the state file could not be removed.
    #[error("removing {path}: {source}")]
    StateKept {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Classified for EndError {
    fn class(&self) -> ErrorClass {
        match self {
            EndError::NotStarted(cause) => cause.class(),
            // Processes that may still hold the GPU: someone has to look.
            EndError::NotEnded { .. } => ErrorClass::NeedsAttention,
            EndError::StateKept { .. } => ErrorClass::Error,
        }
    }
}

/// How long the killed processes may take to be gone (a process in uninterruptible sleep inside
/// the driver dies when the call returns).
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Ends the suspended group under `options.root`: kills its processes, waits until they are gone,
/// removes its state (and a checkpoint's record of data files beside it).
pub fn end(options: &EndOptions) -> Result<EndReport, EndError> {
    let _lock = lock_tree(options.root)?;
    let state_path = find_state_in(options.root, &options.state_dir)?;
    let state = read_state(&state_path)?;
    let ours = discovery::pid_namespace(std::process::id());
    let mut victims: Vec<(u32, String)> = Vec::new();
    let mut already_gone = Vec::new();
    for p in &state.participants {
        let same = discovery::describe(p.host_pid).is_ok_and(|info| info.ns_pid == p.ns_pid)
            && !crate::procfs::exited(p.host_pid);
        if same {
            victims.push((p.host_pid, captured_label(p)));
        } else {
            already_gone.push(captured_label(p));
        }
    }
    // The workload's own PID namespaces (a `run --pid-namespace` job, a restored checkpoint):
    // every process in them is the job's, its init included.
    let namespaces: Vec<u64> = victims
        .iter()
        .filter_map(|&(pid, _)| discovery::pid_namespace(pid))
        .filter(|ns| Some(*ns) != ours)
        .collect();
    let tree = discovery::process_tree(options.root).unwrap_or_default();
    let holds_group = tree.iter().any(|pid| {
        victims.iter().any(|(v, _)| v == pid)
            || discovery::pid_namespace(*pid).is_some_and(|ns| namespaces.contains(&ns))
    });
    if holds_group {
        for &pid in &tree {
            let in_workload =
                discovery::pid_namespace(pid).is_some_and(|ns| namespaces.contains(&ns));
            if (pid == options.root || in_workload) && !victims.iter().any(|(v, _)| *v == pid) {
                victims.push((pid, format!("pid {pid}")));
            }
        }
    }
    for &(pid, _) in &victims {
        kill(pid);
    }
    wait_gone(&victims)?;
    crate::disk::remove_record(&state_path);
    std::fs::remove_file(&state_path).map_err(|e| EndError::StateKept {
        path: state_path.clone(),
        source: e,
    })?;
    if options.state_dir == default_state_dir(options.root) {
        remove_state(&state_path);
    }
    Ok(EndReport {
        killed: victims.into_iter().map(|(_, label)| label).collect(),
        already_gone,
        state_file: state_path,
    })
}

/// SIGKILL to `pid`; one that is gone already is not an error (it is what is wanted).
fn kill(pid: u32) {
    let Some(pid) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    if let Err(e) = rustix::process::kill_process(pid, rustix::process::Signal::KILL)
        && e != rustix::io::Errno::SRCH
    {
        tracing::warn!(pid = pid.as_raw_nonzero().get(), error = %e, "kill -KILL");
    }
}

/// Waits until every killed process has exited (a zombie counts: it runs nothing and holds no
/// GPU memory once its parent reaps it); an error naming those still alive after [`EXIT_WAIT`].
fn wait_gone(victims: &[(u32, String)]) -> Result<(), EndError> {
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        let alive: Vec<&String> = victims
            .iter()
            .filter(|(pid, _)| !crate::procfs::exited(*pid))
            .map(|(_, label)| label)
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(EndError::NotEnded {
                processes: alive.into_iter().cloned().collect(),
                waited: EXIT_WAIT,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `end`'s failures by what they left: a run lock held elsewhere refuses (3), processes
    /// still alive need attention (5), a state file left behind is an error (1).
    #[test]
    fn each_end_failure_is_classified_by_what_it_left() {
        let another_run = EndError::from(ControlError::AnotherRun {
            process: "pid 7".into(),
            message: "held".into(),
        });
        assert_eq!(another_run.class(), ErrorClass::Refused);
        let unreadable = EndError::from(ControlError::State {
            path: "/s/cuinterpose.state".into(),
            source: std::io::Error::other("denied").into(),
        });
        assert_eq!(unreadable.class(), ErrorClass::Error);
        let alive = EndError::NotEnded {
            processes: vec!["pid 7 (python)".into()],
            waited: EXIT_WAIT,
        };
        assert_eq!(alive.class(), ErrorClass::NeedsAttention);
        assert_eq!(
            alive.to_string(),
            "pid 7 (python) still alive 30 s after SIGKILL (uninterruptible in the kernel or the \
             driver); the state file was kept: run `cuinterpose end` again"
        );
        let kept = EndError::StateKept {
            path: "/s/cuinterpose.state".into(),
            source: std::io::Error::other("busy"),
        };
        assert_eq!(kept.class(), ErrorClass::Error);
    }
}
