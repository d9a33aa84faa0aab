//! What a checkpoint to disk refuses before the capture starts: a workload that is not the root of
//! its own PID namespace, a used directory, a controlling terminal, a tree over more than one root
//! filesystem or outside any container's namespaces, a large deleted mapping.

use crate::container::{self, Container};
use crate::discovery;
use crate::refuse;
use crate::{ControlError, Refusal};
use std::path::Path;

/// Checks that `dir` can take a new checkpoint: absent or empty, so that images of an earlier dump
/// can never mix with the new ones.
///
/// An incomplete checkpoint (one that failed or was killed, with its marker) is removed first, as
/// `cuinterpose discard` would: the caller holds the directory's lock, so no checkpoint is
/// writing it.
pub(super) fn check_new_dir(dir: &Path) -> Result<(), ControlError> {
    if dir.join(super::INCOMPLETE_MARKER).exists() {
        let removed = super::discard::discard_unlocked(dir)
            .map_err(super::discard::DiscardError::into_control)?;
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
        // A file, or a directory the tool cannot read: nothing has changed yet.
        Err(e) => Err(refuse(
            &format!("--dir {}", dir.display()),
            format!("cannot be used for a checkpoint: {e}"),
        )),
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

/// Where CRIU must run for the tree under `root` (the init of its PID namespace): `None`, the
/// tool's namespaces, when the tree's root directory is the tool's (a workload of
/// `cuinterpose run --pid-namespace` started here: a mount namespace of its own over the same
/// root); else the container whose root directory it runs in (crate::container), found as the
/// namespaces of `root`'s parent: the launcher, `cuinterpose run --pid-namespace` inside the
/// container.
///
/// Refused before anything changes, each process named: a process of the tree in another root
/// directory than the tree's root, or (in a container) in another mount namespace, since a
/// restore brings the whole tree back over one root; and a root directory of its own in the
/// tool's mount namespace (a `chroot`, crate::container::Container::open), whose root no CRIU
/// restores over.
pub(super) fn container_of(root: u32, tree: &[u32]) -> Result<Option<Container>, ControlError> {
    let label = |pid: u32| {
        discovery::describe(pid)
            .map(|i| i.label())
            .unwrap_or_else(|_| format!("pid {pid}"))
    };
    let root_dir = container::root_dir(Some(root))?;
    let root_mnt = container::namespace(Some(root), "mnt")?;
    let ours = container::root_dir(None)?;
    let in_container = root_dir != ours;
    let mut refusals = Vec::new();
    for &pid in tree.iter().filter(|&&p| p != root) {
        // A process gone meanwhile has no root to compare; the capture finds it gone.
        let (Ok(dir), Ok(mnt)) = (
            container::root_dir(Some(pid)),
            container::namespace(Some(pid), "mnt"),
        ) else {
            continue;
        };
        if dir != root_dir {
            refusals.push(Refusal {
                process: label(pid),
                reason: format!(
                    "runs in a root directory ({dir}) other than the tree's root (pid {root}, \
                     {root_dir}): a restore brings the whole tree back over one root"
                ),
            });
        } else if in_container && mnt != root_mnt {
            refusals.push(Refusal {
                process: label(pid),
                reason: format!(
                    "runs in a mount namespace ({mnt}) other than the tree's root (pid {root}, \
                     {root_mnt}), in a container: not supported"
                ),
            });
        }
    }
    if !refusals.is_empty() {
        return Err(ControlError::Refused(refusals));
    }
    if !in_container {
        return Ok(None);
    }
    let parent = crate::procfs::stat(root)
        .map(|s| s.ppid)
        .ok_or(ControlError::NoSuchProcess(root))?;
    // `cuinterpose run --pid-namespace` inside the container gives its workload a mount namespace
    // of its own (control::launch): a root whose parent shares its root filesystem from another
    // mount namespace is such a workload, the init of a PID namespace below the container's, and
    // CRIU runs inside the container's namespaces, its parent's. Otherwise (the parent in another
    // root filesystem, as a runtime is, or in the same mount namespace) the root is the
    // container's own init (an ordinary pod's process), dumped from a copy of the container's
    // mount namespace.
    let below_launcher = container::root_dir(Some(parent))? == root_dir
        && container::namespace(Some(parent), "mnt")? != root_mnt;
    if below_launcher {
        Container::open(parent, &label(root)).map(Some)
    } else {
        Container::open_init(root, &label(root)).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A process chrooted into a copy of `sleep` and its libraries (on tmpfs, another filesystem):
    /// in this process's tree it is refused (two roots in one tree), and as a tree's root too
    /// (a root of its own in this tool's mount namespace, a chroot); this process alone needs no
    /// container.
    #[test]
    fn a_tree_over_two_roots_or_outside_its_container_is_refused() {
        let me = std::process::id();
        assert!(container_of(me, &[me]).unwrap().is_none());
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
        while crate::container::root_dir(Some(pid)).ok() == crate::container::root_dir(None).ok() {
            assert!(std::time::Instant::now() < deadline, "chroot did not run");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let two_roots = container_of(me, &[me, pid]);
        let outside = container_of(pid, &[pid]);
        let _ = child.kill();
        let _ = child.wait();
        let refusals = |r: Result<Option<Container>, ControlError>| match r {
            Err(ControlError::Refused(list)) => list,
            other => panic!("not refused: {other:?}"),
        };
        let two_roots = refusals(two_roots);
        assert_eq!(two_roots.len(), 1, "{two_roots:?}");
        assert!(
            two_roots[0].process.contains(&pid.to_string()),
            "{two_roots:?}"
        );
        assert!(
            two_roots[0].reason.contains("other than the tree's root"),
            "{two_roots:?}"
        );
        let outside = refusals(outside);
        assert!(outside[0].reason.contains("chroot"), "{outside:?}");
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
