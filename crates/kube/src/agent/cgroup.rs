//! Finding a pod's processes on the node from their cgroups, as the kubelet lays them out: every
//! container's cgroup path holds the pod's UID (`.../pod<uid>/<container id>` with the cgroupfs
//! driver, `.../kubepods-<qos>-pod<uid with _>.slice/cri-containerd-<id>.scope` with systemd).

use std::collections::HashSet;
use std::path::PathBuf;

/// Why a container's processes could not be found or moved.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no process of container {container:?} (pod UID {uid}) runs on this node")]
    NoProcess { container: String, uid: String },
    #[error(
        "no process of container {container:?} is the init of a PID namespace (its processes: {pids:?})"
    )]
    NoInit { container: String, pids: Vec<u32> },
    #[error(
        "container {container:?} has several PID-namespace inits ({pids:?}); cannot tell which is its root"
    )]
    SeveralInits { container: String, pids: Vec<u32> },
    #[error("moving pid {pid} into {path}: {source}")]
    Move {
        pid: u32,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `/proc` (or a copy of its layout, for tests of the parsing).
#[derive(Debug, Clone)]
pub struct Procfs {
    pub root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Self {
        Procfs {
            root: PathBuf::from("/proc"),
        }
    }
}

/// Whether one cgroup path belongs to the pod of `uid` (and, when given, to the container whose
/// runtime ID is `container_id`).
pub fn path_matches(path: &str, uid: &str, container_id: Option<&str>) -> bool {
    let cgroupfs = format!("pod{uid}");
    let systemd = format!("pod{}.slice", uid.replace('-', "_"));
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let Some(pod_at) = components
        .iter()
        .position(|c| *c == cgroupfs || c.ends_with(&format!("-{systemd}")) || *c == systemd)
    else {
        return false;
    };
    match container_id {
        None => true,
        Some(id) => components[pod_at + 1..].iter().any(|c| {
            *c == id
                || c.strip_suffix(".scope")
                    .is_some_and(|scope| scope.ends_with(&format!("-{id}")))
        }),
    }
}

impl Procfs {
    fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let entries = std::fs::read_dir(&self.root).map_err(|source| CgroupError::Read {
            path: self.root.clone(),
            source,
        })?;
        Ok(entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect())
    }

    /// The cgroup paths of `pid` (one per hierarchy); None when the process is gone.
    fn cgroup_paths(&self, pid: u32) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")).ok()?;
        Some(
            text.lines()
                .filter_map(|line| line.splitn(3, ':').nth(2).map(str::to_string))
                .collect(),
        )
    }

    /// Field `name` of `/proc/<pid>/status` (its first word).
    fn status_field(&self, pid: u32, name: &str) -> Option<String> {
        let status =
            std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        let value = status.lines().find_map(|l| l.strip_prefix(name))?;
        Some(value.trim().to_string())
    }

    /// The PID of `pid` in its innermost PID namespace (`NSpid`'s last field).
    fn innermost_pid(&self, pid: u32) -> Option<u32> {
        self.status_field(pid, "NSpid:")?
            .split_whitespace()
            .last()?
            .parse()
            .ok()
    }

    /// The parent of `pid` (`PPid:`).
    fn parent(&self, pid: u32) -> Option<u32> {
        self.status_field(pid, "PPid:")?.parse().ok()
    }

    /// The processes of one container of the pod of `uid`, in PID order.
    pub fn container_processes(
        &self,
        uid: &str,
        container_id: Option<&str>,
    ) -> Result<Vec<u32>, CgroupError> {
        let mut pids: Vec<u32> = self
            .pids()?
            .into_iter()
            .filter(|&pid| {
                self.cgroup_paths(pid)
                    .is_some_and(|paths| paths.iter().any(|p| path_matches(p, uid, container_id)))
            })
            .collect();
        pids.sort_unstable();
        Ok(pids)
    }

    /// The root of a container's workload: its one process that is PID 1 of a PID namespace (the
    /// container's init; processes started by `kubectl exec` are in the same cgroup but are not),
    /// the outermost one when there are several in one tree (in a container shaped with
    /// `run --pid-namespace`, the launcher is the container's init and the workload an init
    /// below it: the tool's checkpoint finds the workload under the launcher).
    pub fn container_root(
        &self,
        container: &str,
        uid: &str,
        container_id: Option<&str>,
    ) -> Result<u32, CgroupError> {
        let pids = self.container_processes(uid, container_id)?;
        if pids.is_empty() {
            return Err(CgroupError::NoProcess {
                container: container.to_string(),
                uid: uid.to_string(),
            });
        }
        let inits: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&pid| self.innermost_pid(pid) == Some(1))
            .collect();
        let outermost: Vec<u32> = inits
            .iter()
            .copied()
            .filter(|&pid| {
                self.parent(pid)
                    .is_none_or(|parent| !pids.contains(&parent))
            })
            .collect();
        let inits = if outermost.is_empty() {
            inits
        } else {
            outermost
        };
        match inits.as_slice() {
            [root] => Ok(*root),
            [] => Err(CgroupError::NoInit {
                container: container.to_string(),
                pids,
            }),
            _ => Err(CgroupError::SeveralInits {
                container: container.to_string(),
                pids: inits,
            }),
        }
    }
}

/// Moves every process in `pids` into each of the cgroup directories `cgroups` (one per
/// hierarchy: the processes a restore created join the placeholder container's cgroups, so that
/// its limits and accounting hold them).
pub fn move_into(cgroups: &[PathBuf], pids: &[u32]) -> Result<(), CgroupError> {
    for cgroup in cgroups {
        let procs = cgroup.join("cgroup.procs");
        let mut moved = HashSet::new();
        for &pid in pids {
            if moved.insert(pid) {
                std::fs::write(&procs, pid.to_string()).map_err(|source| CgroupError::Move {
                    pid,
                    path: procs.clone(),
                    source,
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    #[test]
    fn cgroupfs_driver_paths() {
        let path = format!("/kubepods/burstable/pod{UID}/abc123");
        assert!(path_matches(&path, UID, None));
        assert!(path_matches(&path, UID, Some("abc123")));
        assert!(!path_matches(&path, UID, Some("abc12")));
        assert!(!path_matches(
            &format!("/kubepods/pod{UID}x/abc123"),
            UID,
            None
        ));
        assert!(!path_matches(
            "/kubepods/burstable/podother/abc123",
            UID,
            None
        ));
    }

    #[test]
    fn systemd_driver_paths() {
        let uid = UID.replace('-', "_");
        let path = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-abc123.scope"
        );
        assert!(path_matches(&path, UID, None));
        assert!(path_matches(&path, UID, Some("abc123")));
        assert!(!path_matches(&path, UID, Some("bc123")));
        let guaranteed = format!("/kubepods.slice/kubepods-pod{uid}.slice/crio-abc123.scope");
        assert!(path_matches(&guaranteed, UID, Some("abc123")));
    }

    fn fake_process(root: &Path, pid: u32, cgroup: &str, nspid: &str) {
        fake_child(root, pid, 1, cgroup, nspid);
    }

    fn fake_child(root: &Path, pid: u32, parent: u32, cgroup: &str, nspid: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
        std::fs::write(
            dir.join("status"),
            format!("Name:\tx\nPPid:\t{parent}\nNSpid:\t{nspid}\n"),
        )
        .unwrap();
    }

    /// A container shaped with `run --pid-namespace`: the launcher is the container's init and
    /// the workload an init below it; the root is the launcher.
    #[test]
    fn the_root_of_a_launcher_and_its_workload_is_the_launcher() {
        let proc = tempfile::tempdir().unwrap();
        let container = format!("/kubepods/pod{UID}/c1");
        fake_child(proc.path(), 100, 90, &container, "100 1");
        fake_child(proc.path(), 101, 100, &container, "101 2 1");
        fake_child(proc.path(), 102, 101, &container, "102 3 2");
        let procfs = Procfs {
            root: proc.path().to_path_buf(),
        };
        assert_eq!(procfs.container_root("main", UID, Some("c1")).unwrap(), 100);
    }

    #[test]
    fn the_root_is_the_containers_namespace_init() {
        let proc = tempfile::tempdir().unwrap();
        let container = format!("/kubepods/pod{UID}/c1");
        fake_process(proc.path(), 100, &container, "100 1");
        fake_process(proc.path(), 101, &container, "101 2");
        // Started by `kubectl exec`: same cgroup, not an init.
        fake_process(proc.path(), 150, &container, "150 7");
        fake_process(proc.path(), 200, &format!("/kubepods/pod{UID}/c2"), "200 1");
        fake_process(proc.path(), 300, "/system.slice/other", "300");
        let procfs = Procfs {
            root: proc.path().to_path_buf(),
        };
        assert_eq!(
            procfs.container_processes(UID, Some("c1")).unwrap(),
            [100, 101, 150]
        );
        assert_eq!(
            procfs.container_processes(UID, None).unwrap(),
            [100, 101, 150, 200]
        );
        assert_eq!(procfs.container_root("main", UID, Some("c1")).unwrap(), 100);
        let error = procfs.container_root("main", UID, None).unwrap_err();
        assert!(
            matches!(error, CgroupError::SeveralInits { ref pids, .. } if pids == &[100, 200]),
            "{error}"
        );
        let error = procfs.container_root("gone", UID, Some("c9")).unwrap_err();
        assert!(matches!(error, CgroupError::NoProcess { .. }), "{error}");
    }

    #[test]
    fn a_container_without_an_init_is_named() {
        let proc = tempfile::tempdir().unwrap();
        fake_process(proc.path(), 10, &format!("/kubepods/pod{UID}/c1"), "10");
        let procfs = Procfs {
            root: proc.path().to_path_buf(),
        };
        let error = procfs
            .container_root("main", UID, Some("c1"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "no process of container \"main\" is the init of a PID namespace (its processes: [10])"
        );
    }
}
