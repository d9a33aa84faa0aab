//! A tree in a container (a root directory and mount namespace other than the tool's, as a pod's
//! containers have after `pivot_root`), and CRIU run inside that container.
//!
//! CRIU restores a tree over the root of the mount namespace it runs in (`--root /`, criu/mod.rs),
//! and takes the tree's own mount namespace as a slave copy of that one. Run from the tool's mount
//! namespace, a tree from a container would come back over the tool's root filesystem, not its
//! own. So for such a tree CRIU runs where the container's root is `/`: the CRIU child enters the
//! container's mount and PID namespaces (`setns`, as `nsenter -m -p` does) before it execs, and
//! from CRIU's side the tree is the local case again: the init of a PID namespace of its own (the
//! workload of `cuinterpose run --pid-namespace` inside the container) over a slave copy of the
//! container's mounts. A restore enters the placeholder container's namespaces the same way, so
//! the restored tree sees the placeholder's root filesystem.
//!
//! The PID namespace is entered too, not the mount namespace alone: CRIU reads `/proc/self` at
//! every step, and in a container's `/proc` (mounted for the container's PID namespace)
//! `/proc/self` of a process outside that namespace does not exist (tried with CRIU 4.2: the exec
//! through `/proc/self/fd` already fails, "No such file or directory"). Entered, the tree is still
//! a PID namespace below CRIU's, whose root is that namespace's init, which is what CRIU dumps and
//! restores. Nothing of the tool's filesystem is reachable by path in there: the CRIU binary, its
//! loader and libraries, the images and the work directory are opened here and passed as inherited
//! descriptors (`/proc/self/fd/N`, criu/mod.rs).
//!
//! The tree can also be the container's own init (an ordinary pod's process, which has no
//! `CAP_SYS_ADMIN` to make a PID namespace of its own). CRIU cannot enter that PID namespace:
//! the tree's root would be the init of CRIU's own namespace, which it cannot dump. So it stays in
//! the tool's PID namespace and runs in a private copy of the container's mount namespace (its
//! mounts made slaves, so nothing propagates back into the container) with a `/proc` of the
//! tool's PID namespace mounted over the container's: the container's root is `/`, `/proc/self`
//! is CRIU's, and the tree is the init of a PID namespace below CRIU's, the local case again. The
//! tree's mount namespace is then the container's own, whose bind mounts CRIU cannot resolve by
//! propagation: every mount that shows a filesystem of the node (a volume, the runtime's bind
//! mounts of `/etc/hosts` or devices) is named external by its mount point and taken at a restore
//! from the container restored into, at the same path; the container's own filesystems (its
//! `/proc`, its tmpfs, its devpts) are dumped and made again by CRIU. Tried with CRIU 4.2 on
//! emulated containers: dumped and restored so, the restored mount table is the original's, over
//! the placeholder's root, with nothing left in the placeholder (CRIU's newer mount engine, not
//! `--mntns-compat-mode`, which left its scratch mounts in the tree's table).

#![allow(unsafe_code)] // CommandExt::pre_exec: the setns(2) before CRIU's exec

use crate::refuse;
use crate::{ControlError, Refusal};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

// Read in procfs, behind the `Procs` seam (namespace_root reads them through it); callers
// outside the crate find them here.
pub use crate::procfs::{RootDir, root_dir};

fn proc_error(pid: u32, path: &Path, source: std::io::Error) -> ControlError {
    ControlError::Proc {
        pid,
        path: path.to_path_buf(),
        source,
    }
}

/// The inode of namespace `ns` (`mnt`, `pid`) of `pid` (`None`: this process).
pub fn namespace(pid: Option<u32>, ns: &str) -> Result<u64, ControlError> {
    let path = match pid {
        Some(pid) => crate::procfs::path(pid, &format!("ns/{ns}")),
        None => format!("/proc/self/ns/{ns}").into(),
    };
    std::fs::metadata(&path)
        .map(|m| m.ino())
        .map_err(|e| proc_error(pid.unwrap_or_else(std::process::id), &path, e))
}

/// `NSpid:` of `pid`: its PID in the tool's PID namespace and in each one below, down to its own.
fn ns_pids(pid: u32) -> Result<Vec<u32>, ControlError> {
    let status = crate::procfs::read(pid, "status")?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default())
}

/// Namespace `ns` of `pid`, opened (close-on-exec) for `setns`.
fn open_namespace(pid: u32, ns: &str) -> Result<OwnedFd, ControlError> {
    let path = crate::procfs::path(pid, &format!("ns/{ns}"));
    rustix::fs::open(
        &path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| proc_error(pid, &path, e.into()))
}

/// The mount and PID namespaces of a container, open, for CRIU to run in.
#[derive(Debug)]
pub struct Container {
    /// The process whose namespaces they are (host PID): the launcher of the tree or the tree's
    /// root at a checkpoint, the placeholder at a restore.
    pid: u32,
    mnt: OwnedFd,
    placement: Placement,
}

/// How CRIU runs for a tree in a container (the module comment says why each).
#[derive(Debug)]
enum Placement {
    /// The tree is the init of a PID namespace below the container's: CRIU enters the
    /// container's mount and PID namespaces.
    BelowInit {
        /// `None` when the container's PID namespace is the tool's: only the mount namespace is
        /// entered then.
        pid_ns: Option<OwnedFd>,
        /// How many PID namespaces the container's is below the tool's: a process's PID as
        /// CRIU sees it is entry `level` of its `NSpid:`.
        level: usize,
    },
    /// The tree is the container's own init: CRIU stays in the tool's PID namespace, in a
    /// private copy of the container's mount namespace with the tool's `/proc`.
    Init,
}

impl Container {
    /// The namespaces of `pid`, which runs in `root` (a root directory other than the tool's).
    /// Refused, naming `label`, when its mount namespace is the tool's: a root directory of its
    /// own there is a `chroot`, whose root no CRIU of the tool's mount namespace restores over.
    pub fn open(pid: u32, label: &str) -> Result<Container, ControlError> {
        let mnt = Self::open_mount_namespace(pid, label)?;
        let same_pid_ns = namespace(Some(pid), "pid")? == namespace(None, "pid")?;
        let pid_ns = if same_pid_ns {
            None
        } else {
            Some(open_namespace(pid, "pid")?)
        };
        let pids = ns_pids(pid)?;
        let level = pids.len().saturating_sub(1);
        // CRIU reads the container's `/proc` as its own: it must be the one of the container's PID
        // namespace, where `pid` is its PID there (the same start time tells it is the same
        // process, not another one with that number).
        let inside = pids.last().copied().unwrap_or(pid);
        let seen = crate::discovery::reach_inside(pid, Path::new(&format!("/proc/{inside}/stat")));
        let started = |text: Option<String>| {
            text.and_then(|t| crate::procfs::parse_stat(&t))
                .map(|s| s.start_time)
        };
        let here = started(crate::procfs::read(pid, "stat").ok());
        if here.is_none() || started(std::fs::read_to_string(&seen).ok()) != here {
            return Err(refuse(
                label,
                format!(
                    "the /proc in the root filesystem of pid {pid} is not that of its PID \
                     namespace ({} does not show it), so CRIU cannot run in its namespaces: the \
                     tree must be the init of a PID namespace inside its container (the workload \
                     of `cuinterpose run --pid-namespace` there), and a restore's container must \
                     have its own /proc",
                    seen.display()
                ),
            ));
        }
        Ok(Container {
            pid,
            mnt,
            placement: Placement::BelowInit { pid_ns, level },
        })
    }

    /// The namespaces of `pid`, the container's own init (its root directory other than the
    /// tool's, its parent outside the container): CRIU runs in a copy of its mount namespace
    /// and in the tool's PID namespace. Refused, naming `label`, as [`Container::open`] refuses.
    pub fn open_init(pid: u32, label: &str) -> Result<Container, ControlError> {
        let mnt = Self::open_mount_namespace(pid, label)?;
        Ok(Container {
            pid,
            mnt,
            placement: Placement::Init,
        })
    }

    /// The mount namespace of `pid`, refused (naming `label`) when it is the tool's: a root
    /// directory of its own there is a `chroot`, whose root no CRIU of the tool's mount
    /// namespace restores over.
    fn open_mount_namespace(pid: u32, label: &str) -> Result<OwnedFd, ControlError> {
        if namespace(Some(pid), "mnt")? == namespace(None, "mnt")? {
            return Err(refuse(
                label,
                format!(
                    "pid {pid} runs in a root directory of its own ({}) in this tool's mount \
                     namespace (chroot): CRIU restores a tree over the root of a mount namespace; \
                     run the workload in a mount namespace of its own (a container)",
                    root_dir(Some(pid))?
                ),
            ));
        }
        open_namespace(pid, "mnt")
    }

    /// Descriptor `fd` (0, 1 or 2) of the container's process when it is a pipe (a runtime's
    /// pipe to its monitor, as runc and Podman give a container's stdio without a terminal),
    /// opened again through `/proc` with the same access: the restored tree's own end of its
    /// stdio pipe is replaced by it (`--inherit-fd`, criu/mod.rs), so its output goes where the
    /// container's goes. `None` when it is no pipe (a file, a terminal: CRIU's own pipe stays).
    pub fn stdio_pipe(&self, fd: u32) -> Option<OwnedFd> {
        let link = std::fs::read_link(crate::procfs::path(self.pid, &format!("fd/{fd}"))).ok()?;
        if !link.to_string_lossy().starts_with("pipe:[") {
            return None;
        }
        let info = crate::procfs::read(self.pid, &format!("fdinfo/{fd}")).ok()?;
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())?;
        let access = match flags & 0o3 {
            0 => rustix::fs::OFlags::RDONLY,
            1 => rustix::fs::OFlags::WRONLY,
            _ => rustix::fs::OFlags::RDWR,
        };
        // Non-blocking: a write end with no reader left fails at once instead of waiting for
        // one (open(2) of a FIFO); blocking again afterwards, as the pipe was.
        let end = rustix::fs::open(
            crate::procfs::path(self.pid, &format!("fd/{fd}")),
            access | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NONBLOCK,
            rustix::fs::Mode::empty(),
        )
        .ok()?;
        let status = rustix::fs::fcntl_getfl(&end).ok()?;
        rustix::fs::fcntl_setfl(&end, status - rustix::fs::OFlags::NONBLOCK).ok()?;
        Some(end)
    }

    /// Whether the tree is the container's own init (CRIU in the tool's PID namespace, the
    /// node's mounts named external).
    pub fn is_init(&self) -> bool {
        matches!(self.placement, Placement::Init)
    }

    /// The process whose namespaces these are.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The PID of host process `pid` as CRIU sees it: in the container's PID namespace when CRIU
    /// enters it, else the host PID itself.
    pub fn pid_inside(&self, pid: u32) -> Result<u32, ControlError> {
        let Placement::BelowInit { level, .. } = self.placement else {
            return Ok(pid);
        };
        ns_pids(pid)?.get(level).copied().ok_or_else(|| {
            refuse(
                &format!("pid {pid}"),
                format!(
                    "is not in the PID namespace of pid {} (its container)",
                    self.pid
                ),
            )
        })
    }

    /// Whether CRIU runs in the container's PID namespace, so that the PIDs it writes are the
    /// container's, not host PIDs.
    pub fn enters_pid_namespace(&self) -> bool {
        matches!(self.placement, Placement::BelowInit { .. })
    }

    /// The host PID of the process that is `inside` in the container's PID namespace and whose
    /// parent is in that namespace: the root CRIU restored detached, whose parent is then the
    /// namespace's init (CRIU, its parent, has exited). `inside` itself when CRIU ran in the
    /// tool's PID namespace.
    pub fn host_pid(&self, inside: u32) -> Result<u32, ControlError> {
        let Placement::BelowInit { level, .. } = self.placement else {
            return Ok(inside);
        };
        let ours = namespace(Some(self.pid), "pid")?;
        let entries =
            std::fs::read_dir("/proc").map_err(|e| proc_error(0, Path::new("/proc"), e))?;
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| {
                ns_pids(pid).is_ok_and(|n| n.get(level) == Some(&inside))
                    && crate::procfs::stat(pid)
                        .is_some_and(|s| namespace(Some(s.ppid), "pid").is_ok_and(|p| p == ours))
            })
            .ok_or(ControlError::NoSuchProcess(inside))
    }

    /// Runs `command` (CRIU) inside the container's mount and PID namespaces, with the
    /// descriptors `inherit` (opened close-on-exec) inherited under their numbers, and waits for
    /// it.
    ///
    /// `setns` into a PID namespace applies to the children created afterwards, and the thread
    /// that calls it can never go back to its own namespace: so a thread of its own enters it,
    /// spawns CRIU and waits for it (the parent-death signal of `launch::die_with_parent` is
    /// tied to that thread, which lives until CRIU has exited). The mount namespace is entered
    /// in the child, single-threaded after the fork as `setns` of a mount namespace requires.
    ///
    /// For the container's own init, the child then takes a private copy of that mount
    /// namespace, makes its mounts slaves (nothing it mounts reaches the container) and mounts a
    /// `/proc` of the tool's PID namespace over the container's, and CRIU stays in the tool's PID
    /// namespace.
    pub fn run(&self, command: Command, inherit: Vec<OwnedFd>) -> std::io::Result<Output> {
        self.run_with(command, inherit, Vec::new())
    }

    /// [`Container::run`] for a restore into this container: CRIU itself joins the container's
    /// cgroups in every hierarchy mounted here (cgroup v1 controllers and named hierarchies, and
    /// the unified one) before it execs, so the tree it restores is made inside them, as the
    /// container's own processes are, and dies with the container. (CRIU runs with
    /// `--manage-cgroups=ignore`: left alone, the tree would stay in the tool's cgroups, outside
    /// the runtime's limits and out of reach of its `kill`/`rm`.) Fails, naming the directory,
    /// when a hierarchy's `cgroup.procs` cannot be opened: before CRIU runs, nothing changed.
    pub fn run_joining_cgroups(
        &self,
        command: Command,
        inherit: Vec<OwnedFd>,
    ) -> Result<std::io::Result<Output>, ControlError> {
        let procs = cgroup_dirs(self.pid)?
            .into_iter()
            .map(|dir| {
                let path = dir.join("cgroup.procs");
                rustix::fs::open(
                    &path,
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .map_err(|e| proc_error(self.pid, &path, e.into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.run_with(command, inherit, procs))
    }

    fn run_with(
        &self,
        mut command: Command,
        inherit: Vec<OwnedFd>,
        cgroup_procs: Vec<OwnedFd>,
    ) -> std::io::Result<Output> {
        let mnt = self.mnt.try_clone()?;
        let own_proc = self.is_init();
        let setup = move || {
            // "0" moves the writer (this child, CRIU after its exec) into that cgroup.
            for procs in &cgroup_procs {
                rustix::io::write(procs, b"0")?;
            }
            inherit_fds(&inherit)?;
            rustix::thread::move_into_link_name_space(
                mnt.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Mount),
            )?;
            if own_proc {
                // SAFETY: unshare(2) of the mount namespace in the single-threaded child
                // before exec: it changes only this process's view of mounts.
                unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
                rustix::mount::mount_change(
                    c"/",
                    rustix::mount::MountPropagationFlags::DOWNSTREAM
                        | rustix::mount::MountPropagationFlags::REC,
                )?;
                rustix::mount::mount(
                    c"proc",
                    c"/proc",
                    c"proc",
                    rustix::mount::MountFlags::NOSUID
                        | rustix::mount::MountFlags::NODEV
                        | rustix::mount::MountFlags::NOEXEC,
                    None,
                )?;
            }
            Ok(())
        };
        // SAFETY: `setup` runs in the forked child before exec and only makes system calls
        // (write, fcntl, setns, unshare, mount) on descriptors it owns and constant strings:
        // async-signal-safe, no allocation.
        unsafe { command.pre_exec(setup) };
        let Placement::BelowInit {
            pid_ns: Some(pid_ns),
            ..
        } = &self.placement
        else {
            return command.output();
        };
        let pid_ns = pid_ns.as_fd();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    rustix::thread::move_into_link_name_space(
                        pid_ns,
                        Some(rustix::thread::LinkNameSpaceType::ProcessID),
                    )?;
                    command.output()
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the CRIU thread panicked")))
        })
    }
}

/// The directories of `pid`'s cgroups in this tool's mount namespace, one per hierarchy of
/// `/proc/PID/cgroup` that is mounted here (a v1 hierarchy by its controllers or `name=`, the
/// unified one by its type), each the mount point joined with the cgroup's path below the
/// mount's root. A hierarchy mounted nowhere here is left out: no process of the tool's can be
/// put into it, and the tree is then where CRIU is. (Also the Kubernetes agent's: it moves a tree
/// it restored into its placeholder container's cgroups.)
pub fn cgroup_dirs(pid: u32) -> Result<Vec<std::path::PathBuf>, ControlError> {
    let own = std::path::PathBuf::from("/proc/self/mountinfo");
    let table =
        std::fs::read_to_string(&own).map_err(|e| proc_error(std::process::id(), &own, e))?;
    // (root, mount point, fstype, super options) of every cgroup mount.
    let cgroup_mounts: Vec<(String, String, String, String)> = table
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut l = left.split(' ');
            let root = unescape_mountinfo(l.nth(3)?);
            let point = unescape_mountinfo(l.next()?);
            let mut r = right.split(' ');
            let fstype = r.next()?.to_string();
            let options = r.nth(1)?.to_string();
            fstype
                .starts_with("cgroup")
                .then_some((root, point, fstype, options))
        })
        .collect();
    let text = crate::procfs::read(pid, "cgroup")?;
    let mut dirs = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let found = cgroup_mounts.iter().find(|(_, _, fstype, options)| {
            if controllers.is_empty() {
                return fstype == "cgroup2";
            }
            let options: Vec<&str> = options.split(',').collect();
            fstype == "cgroup" && controllers.split(',').all(|c| options.contains(&c))
        });
        let Some((root, point, _, _)) = found else {
            continue;
        };
        let Some(below) = path.strip_prefix(root.as_str()) else {
            continue;
        };
        dirs.push(Path::new(point).join(below.trim_start_matches('/')));
    }
    Ok(dirs)
}

/// One mount of a `mountinfo` table: its superblock's device (`major:minor`) and its mount point.
struct Mount {
    device: String,
    mount_point: String,
}

/// The mounts of `/proc/<pid>/mountinfo`, in the table's order.
fn mounts(pid: u32) -> Result<Vec<Mount>, ControlError> {
    Ok(crate::procfs::read(pid, "mountinfo")?
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let device = fields.nth(2)?.to_string();
            let mount_point = unescape_mountinfo(fields.nth(1)?);
            Some(Mount {
                device,
                mount_point,
            })
        })
        .collect())
}

/// A `mountinfo` path field as a path: the kernel writes space, tab, newline and backslash as
/// three octal digits after a backslash.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Container {
    /// For the container's own init: the mount points of its mount namespace that show a
    /// filesystem the node has mounted (its device is in the mount table of PID 1, the node's
    /// init), in table order, the root left out (a restore runs over the placeholder's root).
    /// CRIU cannot resolve these bind mounts from a copy of the container's own namespace, so
    /// they are named external and a restore takes each from the placeholder at the same path:
    /// the pod's volumes and the runtime's bind mounts belong to the pod, not to the tree.
    /// Everything else (the container's `/proc`, its tmpfs, devpts, mqueue) CRIU dumps and
    /// makes again.
    ///
    /// Refused, naming `label`: a node mount below `/proc` (CRIU would find it again in the
    /// `/proc` it runs with, the tool's, not the placeholder's), and a mount point CRIU's
    /// `mnt[...]` syntax cannot carry (`]`).
    pub fn node_mounts(&self, label: &str) -> Result<Vec<String>, ControlError> {
        let node: std::collections::HashSet<String> =
            mounts(1)?.into_iter().map(|m| m.device).collect();
        let mut points: Vec<String> = Vec::new();
        for mount in mounts(self.pid)? {
            if mount.mount_point == "/" || !node.contains(&mount.device) {
                continue;
            }
            if mount.mount_point.starts_with("/proc/") || mount.mount_point.contains(']') {
                return Err(refuse(
                    label,
                    format!(
                        "its container mounts a filesystem of the node at {:?}, which a restore \
                         could not take from the placeholder there (below /proc, or a `]` in \
                         the path)",
                        mount.mount_point
                    ),
                ));
            }
            if !points.contains(&mount.mount_point) {
                points.push(mount.mount_point);
            }
        }
        Ok(points)
    }

    /// Refuses, naming `label`, a container to restore into without a `/run` directory, where
    /// CRIU, restoring a tree into a network namespace it joins, mounts a private tmpfs for the
    /// iptables lock (`/run/xtables.lock`) and fails half way without one. Images have one.
    pub fn check_run_dir(&self, label: &str) -> Result<(), ControlError> {
        let run = crate::discovery::reach_inside(self.pid, Path::new("/run"));
        if run.is_dir() {
            return Ok(());
        }
        Err(refuse(
            label,
            "its root filesystem has no /run directory, which CRIU needs to restore a tree into \
             its network namespace (a private iptables lock is mounted there)"
                .into(),
        ))
    }

    /// Refuses, naming `label`, a container to restore a tree below its init into whose
    /// `/proc/sys` is read-only: an unprivileged container (runc's and Podman's default
    /// `readonlyPaths`). CRIU runs inside that container and writes the restored tree's
    /// namespace settings there (tried with CRIU 4.2 in runc: "Can't open sysctl
    /// kernel/hostname: Read-only file system", half way through the restore); a privileged
    /// container (`podman run --privileged`) has it writable.
    pub fn check_writable_proc_sys(&self, label: &str) -> Result<(), ControlError> {
        let table = crate::procfs::read(self.pid, "mountinfo")?;
        let read_only = table.lines().any(|line| {
            let mut fields = line.split(' ');
            let point = fields.nth(4).map(unescape_mountinfo);
            let options = fields.next().unwrap_or_default();
            point.as_deref() == Some("/proc/sys") && options.split(',').any(|o| o == "ro")
        });
        if !read_only {
            return Ok(());
        }
        Err(refuse(
            label,
            "its container mounts /proc/sys read-only (an unprivileged container), where CRIU, \
             run inside it to restore a tree below its init, must set the tree's namespaces: \
             restore into a privileged container (podman run --privileged)"
                .into(),
        ))
    }

    /// Refuses, naming `label`, a container to restore into that lacks a mount point the
    /// checkpoint's tree took from its own container's node mounts (CRIU would fail half way).
    pub fn check_mount_points(&self, wanted: &[String], label: &str) -> Result<(), ControlError> {
        let present: std::collections::HashSet<String> = mounts(self.pid)?
            .into_iter()
            .map(|m| m.mount_point)
            .collect();
        let missing: Vec<&str> = wanted
            .iter()
            .filter(|w| !present.contains(*w))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(refuse(
            label,
            format!(
                "has no mount at {}, where the checkpointed container had a volume or bind \
                 mount of the node; the container to restore into must mount the same paths",
                missing.join(", ")
            ),
        ))
    }
}

/// Runs `command` in the tool's namespaces with the descriptors `inherit` (opened close-on-exec)
/// inherited under their numbers, and waits for it.
pub fn run_here(mut command: Command, inherit: Vec<OwnedFd>) -> std::io::Result<Output> {
    if !inherit.is_empty() {
        let setup = move || inherit_fds(&inherit);
        // SAFETY: `setup` runs in the forked child before exec and only calls fcntl(2) on
        // descriptors it owns: async-signal-safe, no allocation.
        unsafe { command.pre_exec(setup) };
    }
    command.output()
}

/// Clears close-on-exec on each descriptor, in the child before exec: so only the program this
/// child execs gets them, not every other child the tool starts meanwhile.
fn inherit_fds(fds: &[OwnedFd]) -> std::io::Result<()> {
    for fd in fds {
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
    }
    Ok(())
}

/// The init of the workload's PID namespace: `root` itself, or its only descendant that is one.
/// When `root` is the init of a container (its root directory not the tool's) with one such
/// descendant, that one: the workload of `cuinterpose run --pid-namespace` in the container,
/// whose launcher is the container's init (the module docs say why CRIU needs it so).
pub fn namespace_root(root: u32) -> Result<u32, ControlError> {
    namespace_root_in(&crate::procfs::Proc, root)
}

/// [`namespace_root`] on `machine`.
pub(crate) fn namespace_root_in(
    machine: &dyn crate::discovery::ProcessTree,
    root: u32,
) -> Result<u32, ControlError> {
    // Pid 0, a pid past the kernel's limit or one that exited: no such process (exit 3), not an
    // error reading /proc. (`/proc/<pid>/stat` of a live process, a zombie included, is always
    // readable, so one that cannot be read is not there.)
    if root == 0 || machine.stat(root).is_none() {
        return Err(ControlError::NoSuchProcess(root));
    }
    let info = machine.describe(root)?;
    let inits = || -> Result<Vec<u32>, ControlError> {
        Ok(machine
            .tree(root)?
            .into_iter()
            .skip(1)
            // A zombie (a restored tree's root the container's init has not reaped) is no init.
            .filter(|&pid| !machine.exited(pid))
            .filter_map(|pid| machine.describe(pid).ok())
            .filter(|p| p.ns_pid == 1 && p.pid_namespace != info.pid_namespace)
            .map(|p| p.host_pid)
            .collect())
    };
    if info.ns_pid == 1 {
        if machine.root_dir(Some(root))? != machine.root_dir(None)?
            && let [init] = inits()?.as_slice()
        {
            return Ok(*init);
        }
        return Ok(root);
    }
    match inits()?.as_slice() {
        [init] => Ok(*init),
        _ => Err(ControlError::Refused(vec![Refusal {
            process: info.label(),
            reason: "checkpoint to disk needs the workload as the root of its own PID namespace \
                     (start it with `cuinterpose run --pid-namespace`)"
                .into(),
        }])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/plain/path"), "/plain/path");
        assert_eq!(unescape_mountinfo(r"/a\040b\011c"), "/a b\tc");
        assert_eq!(unescape_mountinfo(r"/back\134slash"), r"/back\slash");
        // Not an escape: fewer than three octal digits, or not octal.
        assert_eq!(unescape_mountinfo(r"/x\04"), r"/x\04");
        assert_eq!(unescape_mountinfo(r"/x\089"), r"/x\089");
    }

    /// This process's cgroup directories, found through the mounts here, each list it.
    #[test]
    fn a_process_is_found_in_its_cgroup_directories() {
        let me = std::process::id();
        let dirs = cgroup_dirs(me).unwrap();
        assert!(!dirs.is_empty(), "no cgroup hierarchy mounted here");
        for dir in &dirs {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
            assert!(
                procs.lines().any(|l| l == me.to_string()),
                "{} does not list pid {me}",
                dir.display()
            );
        }
    }

    #[test]
    fn this_process_is_not_a_container() {
        let me = std::process::id();
        assert_eq!(root_dir(Some(me)).unwrap(), root_dir(None).unwrap());
        let e = Container::open(me, "me").unwrap_err();
        assert!(e.to_string().contains("chroot"), "{e}");
    }

    /// A program run inside a container (here `unshare --mount --pid --fork --mount-proc`: a
    /// mount and PID namespace of its own, its `/proc` the new namespace's) is in both, sees its
    /// `/proc/self` (which CRIU needs), finds an inherited descriptor, and is not a host PID there.
    #[test]
    fn a_program_runs_inside_the_containers_namespaces() {
        let mut runtime = Command::new("unshare")
            .args(["--mount", "--pid", "--fork", "--kill-child", "--mount-proc"])
            .args(["--propagation", "private", "sleep", "60"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("unshare (root only)");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let init = loop {
            let init = crate::discovery::process_tree(runtime.id())
                .ok()
                .and_then(|t| t.get(1).copied())
                .filter(|&p| namespace(Some(p), "mnt").ok() != namespace(None, "mnt").ok())
                // Only once it runs `sleep`: before its exec, unshare's child may not have
                // mounted the namespace's /proc yet.
                .filter(|&p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm"))
                        .is_ok_and(|c| c.trim() == "sleep")
                });
            if let Some(init) = init {
                break init;
            }
            assert!(std::time::Instant::now() < deadline, "unshare did not run");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let container = Container::open(init, "init").unwrap();
        assert_eq!(container.pid_inside(init).unwrap(), 1);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("marker"), b"here").unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let n = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let mut command = Command::new("sh");
        command.arg("-c").arg(format!(
            "readlink /proc/self/ns/mnt /proc/self/ns/pid && cat /proc/self/fd/{n}/marker"
        ));
        // Read while the container lives: once it is killed its /proc entries are gone.
        let expected = |ns: &str| {
            let link = std::fs::read_link(crate::procfs::path(init, &format!("ns/{ns}")));
            link.map(|l| l.to_string_lossy().into_owned())
                .expect("the container's namespace link")
        };
        let (mnt, pid) = (expected("mnt"), expected("pid"));
        let out = container.run(command, vec![fd]);
        let _ = runtime.kill();
        let _ = runtime.wait();
        let out = out.unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first().copied(), Some(mnt.as_str()), "{text}");
        assert_eq!(lines.get(1).copied(), Some(pid.as_str()), "{text}");
        assert_eq!(lines.get(2).copied(), Some("here"), "{text}");
    }

    /// A program run with an inherited descriptor finds it under its number, close-on-exec
    /// cleared in the child only.
    #[test]
    fn an_inherited_descriptor_reaches_the_program() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("marker"), b"here").unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let n = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let mut command = Command::new("cat");
        command.arg(format!("/proc/self/fd/{n}/marker"));
        let out = run_here(command, vec![fd]).unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"here");
    }

    /// A process of the scripted machine: host pid `pid`, `ns_pid` in PID namespace `ns`, in
    /// state `state`.
    fn process(
        pid: u32,
        ns_pid: u32,
        ns: u64,
        state: char,
    ) -> (crate::discovery::ProcessInfo, Option<char>, bool) {
        let info = crate::discovery::ProcessInfo {
            ns_pid,
            pid_namespace: ns,
            ..crate::fakes::cuda_process(pid)
        };
        (info, Some(state), true)
    }

    fn machine(
        processes: Vec<(crate::discovery::ProcessInfo, Option<char>, bool)>,
    ) -> crate::fakes::Machine {
        crate::fakes::Machine {
            processes,
            ..crate::fakes::Machine::default()
        }
    }

    const HOST: u64 = crate::fakes::TOOL_PID_NAMESPACE;

    #[test]
    fn no_root_of_a_process_that_is_not_there() {
        let gone = crate::fakes::Machine {
            processes: vec![(crate::fakes::cuda_process(100), None, false)],
            ..crate::fakes::Machine::default()
        };
        for (machine, pid) in [(&gone, 0), (&gone, 77), (&gone, 100)] {
            let error = namespace_root_in(machine, pid).unwrap_err();
            assert!(
                matches!(error, ControlError::NoSuchProcess(p) if p == pid),
                "{error}"
            );
        }
    }

    /// `cuinterpose run --pid-namespace` on the host: the launcher given, the workload's init
    /// the one below it in a namespace of its own; a zombie init (a restored tree's root not
    /// reaped yet) is none.
    #[test]
    fn a_launcher_on_the_host_gives_the_init_below_it() {
        let launcher = machine(vec![
            process(100, 100, HOST, 'S'),
            process(101, 1, 9, 'S'),
            process(102, 2, 9, 'S'),
        ]);
        assert_eq!(namespace_root_in(&launcher, 100).unwrap(), 101);
        let with_zombie = machine(vec![
            process(100, 100, HOST, 'S'),
            process(101, 1, 9, 'Z'),
            process(103, 1, 10, 'S'),
        ]);
        assert_eq!(namespace_root_in(&with_zombie, 100).unwrap(), 103);
    }

    /// An init given is the root, unless it is a container's (its root directory not the
    /// tool's) with exactly one init below it: the workload of `run --pid-namespace` in the
    /// container, under the launcher that is the container's init.
    #[test]
    fn an_init_is_the_root_unless_it_is_a_containers_with_the_workload_below() {
        let tree = vec![process(200, 1, 9, 'S'), process(201, 1, 10, 'S')];
        assert_eq!(namespace_root_in(&machine(tree.clone()), 200).unwrap(), 200);
        let container = RootDir { dev: 1, ino: 99 };
        let in_container = crate::fakes::Machine {
            roots: vec![(200, container), (201, container)],
            ..machine(tree)
        };
        assert_eq!(namespace_root_in(&in_container, 200).unwrap(), 201);
        let alone = crate::fakes::Machine {
            roots: vec![(200, container)],
            ..machine(vec![process(200, 1, 9, 'S'), process(202, 5, 9, 'S')])
        };
        assert_eq!(namespace_root_in(&alone, 200).unwrap(), 200);
    }

    /// A root that is no init with no single init below it cannot be dumped by CRIU: refused,
    /// naming the process and what to do.
    #[test]
    fn a_workload_without_a_namespace_of_its_own_is_refused() {
        for tree in [
            vec![process(100, 100, HOST, 'S'), process(101, 101, HOST, 'S')],
            vec![
                process(100, 100, HOST, 'S'),
                process(101, 1, 9, 'S'),
                process(102, 1, 10, 'S'),
            ],
        ] {
            let error = namespace_root_in(&machine(tree), 100).unwrap_err();
            let ControlError::Refused(refusals) = &error else {
                panic!("{error}");
            };
            assert_eq!(refusals.len(), 1);
            assert_eq!(refusals[0].process, "pid 100 (w)");
            assert!(
                refusals[0]
                    .reason
                    .contains("cuinterpose run --pid-namespace"),
                "{}",
                refusals[0].reason
            );
        }
    }
}
