//! One tool run per group (and per checkpoint directory) at a time.
//!
//! Every command that changes a group takes an exclusive `flock` on one lock file per process of
//! the tree (named by PID and start time, so a recycled PID is another file), and every command on
//! a checkpoint directory one on a file named after the directory, before it changes or reads
//! anything it acts on. A second run finds a lock taken and is refused at once, naming the run
//! that holds it (the holder writes its PID and command line into the file). The kernel releases a
//! lock when its holder dies, however it dies: a dead run is detected, never waited for, and
//! leaves nothing that blocks the next one.
//!
//! The files live in the private directory of the tool's user (`transport::files`), since any
//! run that can act on a group runs as the group's user or as root.

use crate::{ControlError, Refusal, procfs};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Locks held by this run; dropping it releases them (and removes the files).
#[derive(Debug)]
pub struct RunLock {
    held: Vec<(PathBuf, File)>,
}

/// The lock directory the tool's settings name (`ToolConfig::lock_dir`), set once at start.
static CONFIGURED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Takes the lock directory from the tool's settings (`CUINTERPOSE_LOCK_DIR`); called once, at
/// start, before any lock is taken. Without it locks go to the user's private directory.
pub fn configure(config: &crate::config::ToolConfig) {
    if let Some(dir) = &config.lock_dir {
        // A second call (tests in one process) keeps the first directory.
        let _ = CONFIGURED.set(dir.clone());
    }
}

/// Where lock files go: the configured directory, otherwise `locks/` in the user's private
/// directory.
pub fn lock_dir() -> PathBuf {
    CONFIGURED
        .get()
        .cloned()
        .unwrap_or_else(|| transport::files::default_private_dir().join("locks"))
}

impl RunLock {
    /// Locks every process of `tree` for this run.
    pub fn processes(tree: &[u32]) -> Result<RunLock, ControlError> {
        let names: Vec<(String, String)> = tree
            .iter()
            .filter_map(|&pid| {
                // A process that is gone needs no lock: nobody can act on it.
                let stat = procfs::stat(pid)?;
                Some((
                    format!("pid-{pid}-{}.lock", stat.start_time),
                    format!("pid {pid}"),
                ))
            })
            .collect();
        RunLock::take(&names)
    }

    /// Locks the checkpoint directory `dir` (which need not exist yet).
    pub fn directory(dir: &Path) -> Result<RunLock, ControlError> {
        let name = format!("dir-{}.lock", directory_key(dir));
        RunLock::take(&[(name, format!("checkpoint {}", absolute(dir).display()))])
    }

    fn take(names: &[(String, String)]) -> Result<RunLock, ControlError> {
        let dir = lock_dir();
        // The default's parent is the user's private directory, made here if it is not yet.
        if CONFIGURED.get().is_none()
            && let Some(parent) = dir.parent()
        {
            transport::files::ensure_private_dir(parent).map_err(|e| lock_error(parent, e))?;
        }
        transport::files::ensure_private_dir(&dir).map_err(|e| lock_error(&dir, e))?;
        let mut lock = RunLock { held: Vec::new() };
        let mut sorted: Vec<&(String, String)> = names.iter().collect();
        // One order for every run, so two runs on overlapping trees cannot each hold a part.
        sorted.sort();
        sorted.dedup();
        for (name, what) in sorted {
            let path = dir.join(name);
            match lock_one(&path).map_err(|e| lock_error(&path, e))? {
                Locked::Ours(file) => lock.held.push((path, file)),
                Locked::Theirs(holder) => {
                    return Err(ControlError::Refused(vec![Refusal {
                        process: what.clone(),
                        reason: format!(
                            "another cuinterpose run is in progress on it ({holder}); nothing \
                             was changed; run the command again once that run has ended"
                        ),
                    }]));
                }
            }
        }
        Ok(lock)
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still locked: a run that opened the file meanwhile finds it unlinked
        // after its lock and opens the path again (lock_one).
        for (path, _) in &self.held {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn lock_error(path: &Path, e: impl Into<crate::FileError>) -> ControlError {
    ControlError::State {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// One name per checkpoint directory, however it is spelled (its real path, hashed): the name of
/// its lock and of what a restore of it keeps beside the locks (disk/leftovers.rs).
pub fn directory_key(dir: &Path) -> String {
    let digest = protocol::manifest::sha256_hex(absolute(dir).as_os_str().as_encoded_bytes());
    digest.get(..32).unwrap_or(&digest).to_string()
}

fn absolute(dir: &Path) -> PathBuf {
    if let Ok(real) = dir.canonicalize() {
        return real;
    }
    // Not created yet: its parent's real path and its name.
    match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            parent
                .canonicalize()
                .map(|p| p.join(name))
                .unwrap_or_else(|_| dir.to_path_buf())
        }
        _ => dir.to_path_buf(),
    }
}

enum Locked {
    Ours(File),
    /// Who holds it, as its holder wrote.
    Theirs(String),
}

fn lock_one(path: &Path) -> std::io::Result<Locked> {
    use rustix::fs::{FlockOperation, flock};
    loop {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Ok(Locked::Theirs(if holder.is_empty() {
                    "a run that is starting".into()
                } else {
                    holder.to_string()
                }));
            }
            Err(e) => return Err(e.into()),
        }
        // The holder before us may have removed the file after we opened it: ours is then an
        // orphan that nobody else would see, so start over with the path.
        let same = std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.ino() == file.metadata().map(|f| f.ino()).unwrap_or(0));
        if !same {
            continue;
        }
        file.set_len(0)?;
        file.rewind()?;
        let command = std::fs::read(procfs::path(std::process::id(), "cmdline"))
            .map(|raw| {
                raw.split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        writeln!(file, "pid {}: {command}", std::process::id())?;
        return Ok(Locked::Ours(file));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_first_and_free_once_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let Locked::Ours(first) = lock_one(&path).unwrap() else {
            panic!("first lock refused");
        };
        match lock_one(&path).unwrap() {
            Locked::Theirs(holder) => {
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{holder}"
                );
            }
            Locked::Ours(_) => panic!("a second lock on the same file was granted"),
        }
        let _ = std::fs::remove_file(&path);
        drop(first);
        assert!(matches!(lock_one(&path).unwrap(), Locked::Ours(_)));
    }
}
