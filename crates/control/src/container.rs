//! A tree in a container (a root directory and mount namespace other than the tool's, as a pod's
//! containers have after `pivot_root`), and CRIU run inside that container.
//!
//! CRIU restores a tree over the root of the mount namespace it runs in (`--root /`, crate::criu),
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
//! descriptors (`/proc/self/fd/N`, crate::criu).

#![allow(unsafe_code)] // CommandExt::pre_exec: the setns(2) before CRIU's exec

use crate::ControlError;
use crate::disk::refuse;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

/// A root directory, known by the device and inode of its directory (comparable across mount
/// namespaces: a bind mount shows the same inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootDir {
    pub dev: u64,
    pub ino: u64,
}

impl std::fmt::Display for RootDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}, inode {}", self.dev, self.ino)
    }
}

fn proc_error(pid: u32, path: &Path, source: std::io::Error) -> ControlError {
    ControlError::Proc {
        pid,
        path: path.to_path_buf(),
        source,
    }
}

/// The root directory of `pid` (`None`: this process).
pub fn root_dir(pid: Option<u32>) -> Result<RootDir, ControlError> {
    let path = match pid {
        Some(pid) => crate::procfs::path(pid, "root"),
        None => "/".into(),
    };
    std::fs::metadata(&path)
        .map(|m| RootDir {
            dev: m.dev(),
            ino: m.ino(),
        })
        .map_err(|e| proc_error(pid.unwrap_or_else(std::process::id), &path, e))
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

/// The mount and PID namespaces of a container, open, for CRIU to run in.
#[derive(Debug)]
pub struct Container {
    /// The process whose namespaces they are (host PID): the launcher of the tree at a checkpoint,
    /// the placeholder at a restore.
    pid: u32,
    mnt: OwnedFd,
    /// `None` when the container's PID namespace is the tool's: only the mount namespace is
    /// entered then.
    pid_ns: Option<OwnedFd>,
    /// How many PID namespaces the container's is below the tool's: a process's PID as CRIU sees
    /// it is entry `level` of its `NSpid:`.
    level: usize,
}

impl Container {
    /// The namespaces of `pid`, which runs in `root` (a root directory other than the tool's).
    /// Refused, naming `label`, when its mount namespace is the tool's: a root directory of its
    /// own there is a `chroot`, whose root no CRIU of the tool's mount namespace restores over.
    pub fn open(pid: u32, label: &str) -> Result<Container, ControlError> {
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
        let open = |ns: &str| {
            let path = crate::procfs::path(pid, &format!("ns/{ns}"));
            rustix::fs::open(
                &path,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| proc_error(pid, &path, e.into()))
        };
        let mnt = open("mnt")?;
        let same_pid_ns = namespace(Some(pid), "pid")? == namespace(None, "pid")?;
        let pid_ns = if same_pid_ns {
            None
        } else {
            Some(open("pid")?)
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
            pid_ns,
            level,
        })
    }

    /// The process whose namespaces these are.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The PID of host process `pid` in the container's PID namespace (what CRIU is given there).
    pub fn pid_inside(&self, pid: u32) -> Result<u32, ControlError> {
        ns_pids(pid)?.get(self.level).copied().ok_or_else(|| {
            refuse(
                &format!("pid {pid}"),
                format!(
                    "is not in the PID namespace of pid {} (its container)",
                    self.pid
                ),
            )
        })
    }

    /// The host PID of the process that is `inside` in the container's PID namespace and whose
    /// parent is in that namespace: the root CRIU restored detached, whose parent is then the
    /// namespace's init (CRIU, its parent, has exited).
    pub fn host_pid(&self, inside: u32) -> Result<u32, ControlError> {
        let ours = namespace(Some(self.pid), "pid")?;
        let entries =
            std::fs::read_dir("/proc").map_err(|e| proc_error(0, Path::new("/proc"), e))?;
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| {
                ns_pids(pid).is_ok_and(|n| n.get(self.level) == Some(&inside))
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
    /// spawns CRIU and waits for it (the parent-death signal of crate::launch::die_with_parent is
    /// tied to that thread, which lives until CRIU has exited). The mount namespace is entered
    /// in the child, single-threaded after the fork as `setns` of a mount namespace requires.
    pub fn run(&self, mut command: Command, inherit: Vec<OwnedFd>) -> std::io::Result<Output> {
        let mnt = self.mnt.try_clone()?;
        let setup = move || {
            inherit_fds(&inherit)?;
            rustix::thread::move_into_link_name_space(
                mnt.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Mount),
            )?;
            Ok(())
        };
        // SAFETY: `setup` runs in the forked child before exec and only makes system calls
        // (fcntl, setns) on descriptors it owns: async-signal-safe, no allocation.
        unsafe { command.pre_exec(setup) };
        let Some(pid_ns) = &self.pid_ns else {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
