//! Peer credentials (`SO_PEERCRED`) and the rule for who may talk to a control socket.
//!
//! This is the crate's only unsafe code. `rustix::net::sockopt::socket_peercred` returns a `UCred`
//! whose `pid` is a `NonZeroI32`, but the kernel reports pid 0 when the peer has no PID in the
//! reader's PID namespace, which is exactly the case of the tool on the host talking to a shim in a
//! container; reading that into a non-zero type is undefined behaviour, so the option is read here
//! into `libc::ucred` instead.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Credentials of the process at the other end of a Unix socket, as the kernel recorded them when
/// the connection was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerCred {
    /// The peer's PID in this process's PID namespace; 0 when it has none there (it lives in a
    /// namespace that this one does not contain).
    pub pid: u32,
    /// The peer's effective UID, mapped into this process's user namespace.
    pub uid: u32,
    /// The peer's effective GID, mapped into this process's user namespace.
    pub gid: u32,
}

/// Whether a peer may use a cuinterpose socket: it runs as the same effective UID as this process,
/// or as root.
pub fn peer_allowed(peer: &PeerCred) -> bool {
    peer.uid == 0 || peer.uid == rustix::process::geteuid().as_raw()
}

/// `getsockopt(SO_PEERCRED)` on a connected Unix socket.
pub(crate) fn peer_cred(socket: BorrowedFd<'_>) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `socket` is a descriptor borrowed for the duration of the call; `cred` and `len` are
    // live locals and `len` is the size of `cred`, so the kernel writes at most that many bytes
    // into it; every bit pattern is a valid `libc::ucred`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED returned {len} bytes"),
        ));
    }
    Ok(PeerCred {
        pid: u32::try_from(cred.pid).unwrap_or(0),
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_uid_and_root_are_allowed_others_are_not() {
        let me = rustix::process::geteuid().as_raw();
        let peer = |uid| PeerCred {
            pid: 1,
            uid,
            gid: 1,
        };
        assert!(peer_allowed(&peer(me)));
        assert!(peer_allowed(&peer(0)));
        let other = if me == 12345 { 12346 } else { 12345 };
        assert!(!peer_allowed(&peer(other)));
        assert!(!peer_allowed(&peer(65534)));
    }

    #[test]
    fn socketpair_reports_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::os::fd::AsFd;
        let cred = peer_cred(a.as_fd()).unwrap();
        assert_eq!(cred.pid, std::process::id());
        assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
        assert_eq!(cred.gid, rustix::process::getegid().as_raw());
    }
}
