//! What a checkpoint to disk refuses before the capture starts: a workload that is not the root of
//! its own PID namespace, a used directory, a controlling terminal, a root filesystem other than
//! the tool's, a large deleted mapping.

use super::{refuse, state_error};
use crate::discovery;
use crate::{ControlError, Refusal};
use std::path::Path;

/// The init of the workload's PID namespace: `root` itself, or its only child that is one.
pub fn namespace_root(root: u32) -> Result<u32, ControlError> {
    let info = discovery::describe(root)?;
    if info.ns_pid == 1 {
        return Ok(root);
    }
    let inits: Vec<u32> = discovery::process_tree(root)?
        .into_iter()
        .skip(1)
        .filter_map(|pid| discovery::describe(pid).ok())
        .filter(|p| p.ns_pid == 1 && p.pid_namespace != info.pid_namespace)
        .map(|p| p.host_pid)
        .collect();
    match inits.as_slice() {
        [init] => Ok(*init),
        _ => Err(ControlError::Refused(vec![Refusal {
            process: info.label(),
            reason: "checkpoint to disk needs the workload as the root of its own PID namespace \
                     (start it with `cuinterpose run --pid-namespace`)"
                .into(),
        }])),
    }
}

/// Checks that `dir` can take a new checkpoint: absent or empty, so that images of an earlier dump
/// can never mix with the new ones.
///
/// An incomplete checkpoint (one that failed or was killed, with its marker) is removed first, as
/// `cuinterpose discard` would: the caller holds the directory's lock, so no checkpoint is
/// writing it.
pub(super) fn check_new_dir(dir: &Path) -> Result<(), ControlError> {
    if dir.join(super::INCOMPLETE_MARKER).exists() {
        let removed = crate::discard::discard_unlocked(dir)?;
        tracing::warn!(dir = %removed.dir.display(), "removed an incomplete checkpoint");
    }
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(refuse(
                    &format!("--dir {}", dir.display()),
                    "is not empty (it may hold a checkpoint); choose a new directory".into(),
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(state_error(dir, e)),
    }
}

/// Listening socket paths of the tree (as the processes name them): CRIU binds them again at
/// restore, so stale files must be gone by then.
pub(super) fn tree_sockets(tree: &[u32]) -> Vec<(u32, Vec<String>)> {
    tree.iter()
        .map(|&pid| {
            let paths = discovery::listening_sockets(pid).unwrap_or_default();
            (
                pid,
                paths
                    .into_iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect(),
            )
        })
        .collect()
}

/// CRIU's default `--ghost-limit`: a deleted file up to this size is saved into the images.
const CRIU_GHOST_LIMIT: u64 = 1 << 20;

/// Processes that map a large file deleted or replaced since they mapped it (a rebuilt binary or
/// library): CRIU saves a deleted file only up to its ghost limit and otherwise fails the dump
/// ("Can't create link remap"), so the capture is refused before it changes anything. Memfds (the
/// fake driver's memory, the shim's tickets), shared mappings of `/dev/zero` (how anonymous shared
/// memory shows, the NVIDIA driver makes them) and System V segments are "(deleted)" by nature, and
/// CRIU saves them as shared memory.
pub(super) fn replaced_mappings(tree: &[u32]) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    for &pid in tree {
        let Ok(maps) = crate::procfs::read(pid, "maps") else {
            continue;
        };
        let mut files: Vec<&str> = maps
            .lines()
            .filter_map(|line| {
                let range = line.split_whitespace().next()?;
                let path = line.splitn(6, char::is_whitespace).nth(5)?.trim_start();
                let path = path.strip_suffix(" (deleted)")?;
                if !path.starts_with('/')
                    || path.starts_with("/memfd:")
                    || path == "/dev/zero"
                    || path.starts_with("/SYSV")
                {
                    return None;
                }
                // The mapped file itself, through /proc (root may follow these links).
                let size =
                    std::fs::metadata(crate::procfs::path(pid, &format!("map_files/{range}")))
                        .map(|m| m.len())
                        .unwrap_or(u64::MAX);
                (size > CRIU_GHOST_LIMIT).then_some(path)
            })
            .collect();
        files.sort_unstable();
        files.dedup();
        if let Some(first) = files.first() {
            let label = discovery::describe(pid)
                .map(|i| i.label())
                .unwrap_or_else(|_| format!("pid {pid}"));
            refusals.push(Refusal {
                process: label,
                reason: format!(
                    "maps {first}{}, deleted or replaced since it was loaded and larger than \
                     CRIU saves; the dump would fail (restart the workload)",
                    if files.len() > 1 {
                        format!(" and {} other files", files.len() - 1)
                    } else {
                        String::new()
                    }
                ),
            });
        }
    }
    refusals
}

/// Whether the process has a controlling terminal (CRIU then needs `--shell-job`).
pub(super) fn has_terminal(pid: u32) -> bool {
    crate::procfs::stat(pid).is_some_and(|s| s.tty_nr != 0)
}

/// The processes of the tree whose root directory is not the tool's (a container's root
/// filesystem). A restore brings the tree back over the restoring tool's root (CRIU's `--root /`,
/// crate::criu), where such a process would find files that are not its own, or none: so the
/// checkpoint refuses them before anything changes, instead of stopping a workload that no
/// restore could bring back as it was (docs/design.md, "Namespaces", says what restoring into a
/// container's filesystem needs). A root directory is known by the device and inode of
/// `/proc/<pid>/root`; a workload of `cuinterpose run --pid-namespace` has a mount namespace of its
/// own over the same root, which passes.
pub(super) fn foreign_roots(tree: &[u32]) -> Vec<Refusal> {
    use std::os::unix::fs::MetadataExt;
    let identity = |path: &Path| std::fs::metadata(path).map(|m| (m.dev(), m.ino()));
    let Ok(ours) = identity(Path::new("/")) else {
        return Vec::new();
    };
    tree.iter()
        .filter_map(|&pid| {
            // A process gone meanwhile has no root to compare; the capture finds it gone.
            let theirs = identity(&crate::procfs::path(pid, "root")).ok()?;
            (theirs != ours).then(|| Refusal {
                process: discovery::describe(pid)
                    .map(|i| i.label())
                    .unwrap_or_else(|_| format!("pid {pid}")),
                reason: format!(
                    "runs in a root filesystem of its own (device {}, inode {}; this tool's: \
                     device {}, inode {}), as in a container: a restore would bring it back over \
                     this tool's root, where its files are not its own; run the tool where the \
                     workload's root is `/` (inside its container)",
                    theirs.0, theirs.1, ours.0, ours.1
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A process chrooted into a copy of `sleep` and its libraries (on tmpfs, another filesystem)
    /// is refused; this process is not.
    #[test]
    fn a_process_in_a_root_filesystem_of_its_own_is_refused() {
        let me = std::process::id();
        assert!(foreign_roots(&[me]).is_empty());
        let root = tempfile::Builder::new()
            .prefix("cuinterpose-root-")
            .tempdir_in("/dev/shm")
            .expect("a directory on /dev/shm");
        let sleep = which("sleep");
        let mut files = vec![sleep.clone()];
        let ldd = Command::new("ldd").arg(&sleep).output().expect("ldd");
        files.extend(
            String::from_utf8_lossy(&ldd.stdout)
                .split_whitespace()
                .filter(|w| w.starts_with('/'))
                .map(std::path::PathBuf::from),
        );
        for file in &files {
            let target = root.path().join(file.strip_prefix("/").expect("absolute"));
            std::fs::create_dir_all(target.parent().expect("a parent")).expect("mkdir");
            std::fs::copy(file, &target).expect("copying into the new root");
        }
        let mut child = Command::new("chroot")
            .arg(root.path())
            .arg(&sleep)
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .expect("chroot (root only)");
        let pid = child.id();
        // Until chroot has execed sleep, the child's root is still ours.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let refused = loop {
            let refused = foreign_roots(&[me, pid]);
            if !refused.is_empty() || std::time::Instant::now() > deadline {
                break refused;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].process.contains(&pid.to_string()), "{refused:?}");
        assert!(
            refused[0].reason.contains("root filesystem of its own"),
            "{refused:?}"
        );
    }

    fn which(program: &str) -> std::path::PathBuf {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(program))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{program} on PATH"))
    }
}
