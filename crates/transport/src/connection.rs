//! One connected control-socket stream and its framing.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use protocol::message::{
    self, FrameHeader, HEADER_LEN, MAX_BODY_LEN, decode_request, decode_response,
};
use protocol::{ErrorCode, ProtocolError, Request, Response};
use rustix::io::Errno;
use rustix::net::sockopt::{self, Timeout};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::peer::{PeerCred, peer_allowed, peer_cred};
use crate::{MAX_SOCKET_PATH_LEN, TransportError};

/// Control-message room for one descriptor and one more: the extra slot lets a second descriptor
/// arrive whole so that it is seen (and closed), instead of only a truncation flag; anything beyond
/// that sets `MSG_CTRUNC`, which is refused too.
const RECV_FD_SPACE: usize = rustix::cmsg_space!(ScmRights(2));
const SEND_FD_SPACE: usize = rustix::cmsg_space!(ScmRights(1));

/// A connected `AF_UNIX` stream socket speaking cuinterpose frames. Close-on-exec.
#[derive(Debug)]
pub struct Connection {
    stream: UnixStream,
    /// Set when an operation failed after part of a frame went through (see the crate docs).
    broken: bool,
    /// The version of the last frame received, when it was refused for not being ours: what
    /// [`Connection::refuse_version`] answers.
    refused_version: Option<u16>,
}

/// A frame as it came off the socket, with every descriptor that came with it (already owned, so
/// that an early return closes them).
struct RawFrame {
    header: FrameHeader,
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Connection {
    /// Connects to the socket at `path`. `timeout` bounds the connect itself (a listener whose
    /// queue is full makes a blocking connect wait; `SO_SNDTIMEO` set before `connect` bounds it on
    /// Linux) and then every later blocking send and receive, until [`Connection::set_timeout`]
    /// changes it. A zero timeout is refused.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Connection, TransportError> {
        let addr = socket_addr(path)?;
        let context = || format!("connect to {}", path.display());
        let socket = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| TransportError::io(context(), e))?;
        for which in [Timeout::Send, Timeout::Recv] {
            sockopt::set_socket_timeout(&socket, which, Some(timeout))
                .map_err(|e| TransportError::io(format!("{}: set timeout", context()), e))?;
        }
        loop {
            match rustix::net::connect(&socket, &addr) {
                Ok(()) => break,
                Err(Errno::INTR) => continue,
                // A connect interrupted after the kernel queued it completes in the background.
                Err(Errno::ISCONN) => break,
                Err(Errno::AGAIN) => return Err(TransportError::Timeout),
                Err(e) => return Err(TransportError::io(context(), e)),
            }
        }
        Ok(Connection::from_stream(UnixStream::from(socket)))
    }

    /// Wraps an accepted or otherwise connected stream (std's streams are close-on-exec).
    pub fn from_stream(stream: UnixStream) -> Connection {
        Connection {
            stream,
            broken: false,
            refused_version: None,
        }
    }

    /// Sets the bound of every later blocking send and receive; `None` waits forever. A zero
    /// duration is refused (the kernel would read it as "forever").
    pub fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), TransportError> {
        self.stream
            .set_read_timeout(timeout)
            .and_then(|()| self.stream.set_write_timeout(timeout))
            .map_err(|e| TransportError::io("set socket timeout", e))
    }

    /// The peer's credentials (`SO_PEERCRED`), as recorded when the connection was made.
    pub fn peer(&self) -> Result<PeerCred, TransportError> {
        peer_cred(self.stream.as_fd()).map_err(|e| TransportError::io("SO_PEERCRED", e))
    }

    /// The peer's credentials if [`peer_allowed`] admits them, else [`TransportError::PeerDenied`].
    /// Servers call this on every accepted connection before reading from it.
    pub fn check_peer(&self) -> Result<PeerCred, TransportError> {
        let peer = self.peer()?;
        if peer_allowed(&peer) {
            Ok(peer)
        } else {
            Err(TransportError::PeerDenied {
                pid: peer.pid,
                uid: peer.uid,
            })
        }
    }

    /// Sends one request frame.
    pub fn send_request(&mut self, request: &Request) -> Result<(), TransportError> {
        self.send_request_with(request, None)
    }

    /// Sends one request frame with `fd`, which must be given exactly when the request carries a
    /// descriptor ([`Request::carries_fd`]). The descriptor is only borrowed.
    pub fn send_request_with(
        &mut self,
        request: &Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), TransportError> {
        match (request.carries_fd(), fd.is_some()) {
            (true, false) => return Err(TransportError::MissingFd),
            (false, true) => return Err(TransportError::UnexpectedFd),
            _ => {}
        }
        self.send_frame(&message::encode_request(request), fd)
    }

    /// Receives one request frame. `Err(Closed)` when the peer closed the connection between
    /// frames; a descriptor on a request is refused ([`TransportError::UnexpectedFd`]) and closed.
    pub fn recv_request(&mut self) -> Result<Request, TransportError> {
        let frame = self.recv_frame(false)?;
        if !frame.fds.is_empty() {
            return Err(self.poison(TransportError::UnexpectedFd));
        }
        decode_request(&frame.header, &frame.body).map_err(|e| self.poison(e.into()))
    }

    /// Receives one request frame and its descriptor, which must come exactly with the requests
    /// that carry one ([`Request::carries_fd`]); any other pairing is refused and the descriptor
    /// closed. The descriptor is close-on-exec and owned by the caller.
    pub fn recv_request_with_fd(&mut self) -> Result<(Request, Option<OwnedFd>), TransportError> {
        let mut frame = self.recv_frame(true)?;
        let request =
            decode_request(&frame.header, &frame.body).map_err(|e| self.poison(e.into()))?;
        let fd = frame.fds.pop();
        match (request.carries_fd(), &fd) {
            (true, None) => Err(self.poison(TransportError::MissingFd)),
            (false, Some(_)) => Err(self.poison(TransportError::UnexpectedFd)),
            _ => Ok((request, fd)),
        }
    }

    /// Answers a peer whose frame was just refused for its protocol version
    /// ([`ProtocolError::VersionMismatch`]) with one `Error` frame of this build's version, which
    /// the peer's own header check reports as a version mismatch (a connection closed without a
    /// word would only say that the other end hung up). Consumes the connection, whose stream is
    /// out of step; refuses ([`TransportError::Broken`]) when no frame was refused for its version.
    pub fn refuse_version(self) -> Result<(), TransportError> {
        let Some(theirs) = self.refused_version else {
            return Err(TransportError::Broken);
        };
        let frame = message::encode_response(&Response::Error {
            code: ErrorCode::Denied,
            message: format!(
                "protocol version {theirs} is not this build's {}: tool and shim must be the same version",
                message::PROTOCOL_VERSION
            ),
        });
        // `broken` was set by the refused read, which left the peer's body unread; nothing of a
        // frame of ours went out, so a whole frame of ours is still in step for the peer.
        self.send_all(&frame, None, &mut 0)
    }

    /// Sends one response frame; `fd` must be given exactly when the response carries one
    /// ([`Response::carries_fd`]). The descriptor is only borrowed: the caller closes its copy.
    pub fn send_response(
        &mut self,
        response: &Response,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), TransportError> {
        match (response.carries_fd(), fd.is_some()) {
            (true, false) => return Err(TransportError::MissingFd),
            (false, true) => return Err(TransportError::UnexpectedFd),
            _ => {}
        }
        self.send_frame(&message::encode_response(response), fd)
    }

    /// Receives one response frame and the descriptor that came with it (exactly when the response
    /// carries one, [`Response::carries_fd`]). The descriptor is close-on-exec and owned by the caller.
    pub fn recv_response(&mut self) -> Result<(Response, Option<OwnedFd>), TransportError> {
        let mut frame = self.recv_frame(true)?;
        let response =
            decode_response(&frame.header, &frame.body).map_err(|e| self.poison(e.into()))?;
        let fd = frame.fds.pop();
        match (response.carries_fd(), &fd) {
            (true, None) => Err(self.poison(TransportError::MissingFd)),
            (false, Some(_)) => Err(self.poison(TransportError::UnexpectedFd)),
            _ => Ok((response, fd)),
        }
    }

    /// Sends a request and receives its response.
    pub fn call(
        &mut self,
        request: &Request,
    ) -> Result<(Response, Option<OwnedFd>), TransportError> {
        self.call_with(request, None)
    }

    /// Sends a request with its descriptor ([`Connection::send_request_with`]) and receives its
    /// response.
    pub fn call_with(
        &mut self,
        request: &Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(Response, Option<OwnedFd>), TransportError> {
        self.send_request_with(request, fd)?;
        self.recv_response()
    }

    fn poison(&mut self, error: TransportError) -> TransportError {
        self.broken = true;
        error
    }

    fn usable(&self) -> Result<(), TransportError> {
        if self.broken {
            Err(TransportError::Broken)
        } else {
            Ok(())
        }
    }

    fn send_frame(
        &mut self,
        frame: &[u8],
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), TransportError> {
        self.usable()?;
        let body_len = frame.len().saturating_sub(HEADER_LEN);
        if body_len > MAX_BODY_LEN as usize {
            // The receiver would refuse it after reading the header; refusing here keeps the
            // connection usable and names the real problem on the side that has it.
            return Err(ProtocolError::TooLarge {
                length: body_len as u64,
                limit: u64::from(MAX_BODY_LEN),
            }
            .into());
        }
        let mut sent = 0;
        let result = self.send_all(frame, fd, &mut sent);
        if result.is_err() && sent > 0 {
            self.broken = true;
        }
        result
    }

    fn send_all(
        &self,
        frame: &[u8],
        fd: Option<BorrowedFd<'_>>,
        sent: &mut usize,
    ) -> Result<(), TransportError> {
        if let Some(fd) = fd {
            let fds = [fd];
            let mut space = [MaybeUninit::<u8>::uninit(); SEND_FD_SPACE];
            loop {
                let mut control = SendAncillaryBuffer::new(&mut space);
                if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                    return Err(TransportError::io(
                        "sendmsg",
                        std::io::Error::other("control buffer too small for one descriptor"),
                    ));
                }
                match rustix::net::sendmsg(
                    &self.stream,
                    &[IoSlice::new(frame)],
                    &mut control,
                    SendFlags::NOSIGNAL,
                ) {
                    Ok(n) => {
                        *sent = n;
                        break;
                    }
                    // Nothing was sent, the descriptor included: sending it again is safe.
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(send_error(e)),
                }
            }
        }
        // Whatever is left goes without the descriptor: it rode on the first byte, and attaching it
        // again would hand the peer a second copy.
        while *sent < frame.len() {
            match rustix::net::send(&self.stream, &frame[*sent..], SendFlags::NOSIGNAL) {
                Ok(0) => return Err(TransportError::Closed),
                Ok(n) => *sent += n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(send_error(e)),
            }
        }
        Ok(())
    }

    /// Reads one frame: the header completely, validated, and only then the body. Descriptors are
    /// collected from every read of the frame, whichever byte they came on.
    fn recv_frame(&mut self, fd_allowed: bool) -> Result<RawFrame, TransportError> {
        self.usable()?;
        let mut consumed = 0;
        let result = self.recv_frame_inner(fd_allowed, &mut consumed);
        if result.is_err() && consumed > 0 {
            self.broken = true;
        }
        result
    }

    fn recv_frame_inner(
        &mut self,
        fd_allowed: bool,
        consumed: &mut usize,
    ) -> Result<RawFrame, TransportError> {
        let mut fds = Vec::new();
        let mut header = [0u8; HEADER_LEN];
        self.recv_exact(&mut header, &mut fds, consumed, HEADER_LEN)?;
        let header = FrameHeader::decode(&header).inspect_err(|e| {
            if let ProtocolError::VersionMismatch { theirs, .. } = e {
                self.refused_version = Some(*theirs);
            }
        })?;
        if !fd_allowed && !fds.is_empty() {
            return Err(TransportError::UnexpectedFd);
        }
        // The length is bounded by `MAX_BODY_LEN` now, so this allocation is too.
        let body_len = header.length as usize;
        let mut body = vec![0u8; body_len];
        self.recv_exact(&mut body, &mut fds, consumed, HEADER_LEN + body_len)?;
        Ok(RawFrame { header, body, fds })
    }

    /// Fills `buf`. `consumed` counts the frame's bytes read so far (for the truncation report and
    /// for deciding whether the stream is still in step); `frame_so_far` is how long the frame is
    /// known to be once `buf` is full.
    fn recv_exact(
        &self,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
        consumed: &mut usize,
        frame_so_far: usize,
    ) -> Result<(), TransportError> {
        let mut filled = 0;
        let mut space = [MaybeUninit::<u8>::uninit(); RECV_FD_SPACE];
        while filled < buf.len() {
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let received = rustix::net::recvmsg(
                &self.stream,
                &mut [IoSliceMut::new(&mut buf[filled..])],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            );
            // Take ownership of every descriptor before looking at anything else, so that each
            // error path below closes them.
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received_fds) = message {
                    fds.extend(received_fds);
                }
            }
            let received = match received {
                Ok(received) => received,
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => return Err(TransportError::Timeout),
                Err(e) => return Err(TransportError::io("recvmsg", e)),
            };
            filled += received.bytes;
            *consumed += received.bytes;
            if received.flags.contains(ReturnFlags::CTRUNC) || fds.len() > 1 {
                return Err(TransportError::TooManyFds);
            }
            if received.bytes == 0 {
                return Err(if *consumed == 0 {
                    TransportError::Closed
                } else {
                    ProtocolError::Truncated {
                        expected: frame_so_far,
                        got: *consumed,
                    }
                    .into()
                });
            }
        }
        Ok(())
    }
}

impl AsFd for Connection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

fn send_error(e: Errno) -> TransportError {
    match e {
        Errno::AGAIN => TransportError::Timeout,
        Errno::PIPE | Errno::CONNRESET => TransportError::Closed,
        e => TransportError::io("send", e),
    }
}

/// The socket address of `path`, refusing a path that does not fit instead of letting the kernel
/// or libc truncate it.
pub(crate) fn socket_addr(path: &Path) -> Result<SocketAddrUnix, TransportError> {
    let len = path.as_os_str().as_bytes().len();
    if len > MAX_SOCKET_PATH_LEN {
        return Err(TransportError::PathTooLong {
            path: path.to_path_buf(),
            len,
            max: MAX_SOCKET_PATH_LEN,
        });
    }
    SocketAddrUnix::new(path)
        .map_err(|e| TransportError::io(format!("socket address {}", path.display()), e))
}
