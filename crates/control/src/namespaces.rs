//! The namespaces a checkpointed tree shares with processes outside it, and a restore's way into
//! another process's.
//!
//! A workload started by `cuinterpose run --pid-namespace` has its own PID and mount namespaces
//! and shares the tool's network, IPC and UTS namespaces: CRIU dumps nothing of those and restores
//! the tree into the restoring tool's. In a pod they belong to the pod's sandbox, not to the
//! workload: the network namespace holds the pod's interfaces (which CRIU cannot dump), IPC and
//! UTS are the pod's. So at a checkpoint every one of them that differs from the tool's is
//! recorded in the manifest ([`SharedNamespace`]); the network namespace is dumped as external,
//! and a restore is given a process whose namespaces the tree joins instead (the agent: a process
//! of the placeholder pod). The tree's own PID and mount namespaces are restored from the images,
//! below those of the CRIU that restores them: the tool's, or a container's (crate::container).

use crate::ControlError;
use crate::refuse;
use protocol::manifest::SharedNamespace;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// CRIU's key for the external network namespace (`--external net[INODE]:KEY` at the dump,
/// `--inherit-fd fd[N]:KEY` at the restore).
const NET_KEY: &str = "cuinterpose-net";

fn path(pid: Option<u32>, ns: SharedNamespace) -> PathBuf {
    match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/ns/{}", ns.name())),
        None => PathBuf::from(format!("/proc/self/ns/{}", ns.name())),
    }
}

/// The inode of namespace `ns` of `pid` (`None`: this process), which identifies it.
fn inode(pid: Option<u32>, ns: SharedNamespace) -> Result<u64, ControlError> {
    let path = path(pid, ns);
    std::fs::metadata(&path)
        .map(|m| m.ino())
        .map_err(|source| ControlError::Proc {
            pid: pid.unwrap_or_else(std::process::id),
            path,
            source,
        })
}

/// What a dump must know of the tree's namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shared {
    /// Those the tree's root does not share with the tool, in [`SharedNamespace::ALL`]'s order.
    pub namespaces: Vec<SharedNamespace>,
    /// The inode of the root's network namespace when it is one of them.
    net_inode: Option<u64>,
}

impl Shared {
    /// The namespaces of `root` that are not the tool's.
    pub fn of(root: u32) -> Result<Shared, ControlError> {
        let mut namespaces = Vec::new();
        let mut net_inode = None;
        for ns in SharedNamespace::ALL {
            let theirs = inode(Some(root), ns)?;
            if theirs != inode(None, ns)? {
                namespaces.push(ns);
                if ns == SharedNamespace::Net {
                    net_inode = Some(theirs);
                }
            }
        }
        Ok(Shared {
            namespaces,
            net_inode,
        })
    }

    /// CRIU's dump options: a network namespace of its own is external (not dumped), and not
    /// locked: CRIU would lock it with iptables rules, which are not the tool's to put into a
    /// pod's network (and need iptables, which GPU nodes and containers often lack); a TCP peer
    /// of the tree is inside it and stopped with it, or the capture refused it (crate::tcp).
    pub fn dump_args(&self) -> Vec<OsString> {
        match self.net_inode {
            Some(inode) => [
                "--external",
                &format!("net[{inode}]:{NET_KEY}"),
                "--network-lock",
                "skip",
            ]
            .map(OsString::from)
            .to_vec(),
            None => Vec::new(),
        }
    }
}

/// The namespaces a restore puts the tree into: those of process `pid`, for each namespace the
/// checkpoint lists as shared.
#[derive(Debug)]
pub struct Target {
    pid: u32,
    /// Each namespace with its inode and a descriptor of it (close-on-exec), which CRIU inherits
    /// ([`Target::restore_args`]): a descriptor names it in the CRIU that runs inside a container
    /// too (crate::container), where `/proc/<pid>` of a host PID does not exist.
    joins: Vec<(SharedNamespace, u64, OwnedFd)>,
}

impl Target {
    /// Opens the namespaces of `pid` that the checkpoint's `shared` list names; refuses (nothing
    /// changed) when `pid` cannot be read.
    pub fn open(pid: u32, shared: &[SharedNamespace]) -> Result<Target, ControlError> {
        let unreadable = |e: &dyn std::fmt::Display| {
            refuse(
                &format!("pid {pid}"),
                format!("its namespaces cannot be joined: {e}"),
            )
        };
        let mut joins = Vec::new();
        for &ns in shared {
            let inode = inode(Some(pid), ns).map_err(|e| unreadable(&e))?;
            let fd = rustix::fs::open(
                path(Some(pid), ns),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| unreadable(&e))?;
            joins.push((ns, inode, fd));
        }
        Ok(Target { pid, joins })
    }

    /// The namespaces joined, in order.
    pub fn namespaces(&self) -> Vec<SharedNamespace> {
        self.joins.iter().map(|(ns, _, _)| *ns).collect()
    }

    /// CRIU's restore options, and the descriptors they name for CRIU to inherit: the network
    /// namespace inherited for the external one of the dump, IPC and UTS joined through
    /// `/proc/self/fd/N` (CRIU then skips the ones in the images).
    pub fn restore_args(&self) -> std::io::Result<(Vec<OsString>, Vec<OwnedFd>)> {
        let mut args: Vec<OsString> = Vec::new();
        let mut fds = Vec::new();
        for (ns, _, fd) in &self.joins {
            let fd = fd.try_clone()?;
            let n = fd.as_raw_fd();
            fds.push(fd);
            if *ns == SharedNamespace::Net {
                args.push("--inherit-fd".into());
                args.push(format!("fd[{n}]:{NET_KEY}").into());
                // Nothing was locked at the dump (Shared::dump_args): nothing to unlock.
                args.push("--network-lock".into());
                args.push("skip".into());
            } else {
                args.push("--join-ns".into());
                args.push(format!("{}:/proc/self/fd/{n}", ns.name()).into());
            }
        }
        Ok((args, fds))
    }

    /// Checks that the restored tree's root is in every namespace it was to join.
    pub fn check_joined(&self, root: u32) -> Result<(), String> {
        for &(ns, wanted, _) in &self.joins {
            match inode(Some(root), ns) {
                Ok(got) if got == wanted => {}
                Ok(got) => {
                    return Err(format!(
                        "the restored root (pid {root}) is in {} namespace {got}, not in {wanted} \
                         of pid {}",
                        ns.name(),
                        self.pid
                    ));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_shares_every_namespace_with_itself() {
        let me = std::process::id();
        let shared = Shared::of(me).unwrap();
        assert!(shared.namespaces.is_empty(), "{shared:?}");
        assert!(shared.dump_args().is_empty());
        let target = Target::open(me, &SharedNamespace::ALL).unwrap();
        assert_eq!(target.namespaces(), SharedNamespace::ALL);
        target.check_joined(me).unwrap();
        let (args, fds) = target.restore_args().unwrap();
        let args: Vec<String> = args.into_iter().map(|a| a.into_string().unwrap()).collect();
        let [net, ipc, uts] = [0, 1, 2].map(|i| fds[i].as_raw_fd());
        assert_eq!(
            args,
            [
                "--inherit-fd".to_string(),
                format!("fd[{net}]:cuinterpose-net"),
                "--network-lock".into(),
                "skip".into(),
                "--join-ns".into(),
                format!("ipc:/proc/self/fd/{ipc}"),
                "--join-ns".into(),
                format!("uts:/proc/self/fd/{uts}"),
            ]
        );
        // Close-on-exec here: only the CRIU child clears it (crate::container::inherit_fds).
        for fd in &fds {
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
    }

    #[test]
    fn a_process_that_is_gone_is_refused() {
        let gone = u32::MAX - 1;
        assert!(Shared::of(gone).is_err());
        let e = Target::open(gone, &[SharedNamespace::Ipc]).unwrap_err();
        assert!(e.to_string().contains("cannot be joined"), "{e}");
    }
}
