//! The command channel: line-oriented text over a Unix stream socket, one connection per command or
//! per batch, and descriptor passing by `SCM_RIGHTS`.
//!
//! A client connects to the workload's `--listen` socket, writes command lines, and reads one JSON
//! [`Reply`] line per command; the workload closes the connection when the client has half-closed
//! and every reply is written. No connection stays open while idle (CRIU must be able to dump the
//! process tree between commands).
//!
//! A descriptor travels as ancillary data on the bytes of a `recv-fd NAME` line, which the
//! receiving workload's connection thread stores under `NAME` without involving its command thread.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::reply::Reply;

/// The longest command or reply line accepted.
pub const MAX_LINE: usize = 1 << 20;

/// Why a conversation with a workload failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Connecting failed (no listener yet, or it went away).
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// Reading or writing failed, or timed out.
    #[error("i/o with {path}: {source}")]
    Io {
        /// The socket path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// The peer closed before answering every command.
    #[error("{path} answered {got} of {sent} commands")]
    ShortReply {
        /// The socket path.
        path: String,
        /// Commands sent.
        sent: usize,
        /// Replies received.
        got: usize,
    },
    /// A reply line is not JSON of the reply shape.
    #[error("{path} sent a malformed reply {line:?}: {source}")]
    BadReply {
        /// The socket path.
        path: String,
        /// The line.
        line: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The peer sent something the channel does not allow (a second descriptor, a truncated
    /// control message, an overlong line).
    #[error("protocol violation: {0}")]
    Protocol(String),
}

/// Reads lines from a stream socket with `recvmsg`, so that a descriptor riding on the bytes is
/// received (plain `read` would make the kernel discard it). At most one descriptor per connection.
#[derive(Debug)]
pub struct LineReader<'a> {
    stream: &'a UnixStream,
    buf: Vec<u8>,
    fd: Option<OwnedFd>,
    eof: bool,
}

impl<'a> LineReader<'a> {
    /// Reads from `stream`.
    pub fn new(stream: &'a UnixStream) -> LineReader<'a> {
        LineReader {
            stream,
            buf: Vec::new(),
            fd: None,
            eof: false,
        }
    }

    /// The descriptor received so far on this connection, taken.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fd.take()
    }

    /// The next line without its newline; `None` at end of stream.
    pub fn next_line(&mut self) -> Result<Option<String>, WireError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let rest = self.buf.split_off(i + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
            if self.eof {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let line = std::mem::take(&mut self.buf);
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
            if self.buf.len() > MAX_LINE {
                return Err(WireError::Protocol("line too long".into()));
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> Result<(), WireError> {
        let mut chunk = [0u8; 4096];
        // Room for two descriptors, so that a second one is seen (and refused) rather than
        // truncated silently.
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = loop {
            match rustix::net::recvmsg(
                self.stream.as_fd(),
                &mut [IoSliceMut::new(&mut chunk)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(msg) => break msg,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(WireError::Io {
                        path: "peer".into(),
                        source: e.into(),
                    });
                }
            }
        };
        let mut received = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                received.extend(fds);
            }
        }
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            return Err(WireError::Protocol("truncated control message".into()));
        }
        for fd in received {
            if self.fd.is_some() {
                return Err(WireError::Protocol(
                    "more than one descriptor on a connection".into(),
                ));
            }
            self.fd = Some(fd);
        }
        if msg.bytes == 0 {
            self.eof = true;
        } else {
            self.buf
                .extend_from_slice(chunk.get(..msg.bytes).unwrap_or(&[]));
        }
        Ok(())
    }
}

/// Writes `bytes` with `fd` attached to the first segment; the rest of a partial write goes out
/// without it (a descriptor is never sent twice).
pub fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("control buffer too small"));
    }
    let sent = loop {
        match rustix::net::sendmsg(
            stream.as_fd(),
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut rest = bytes.get(sent..).unwrap_or(&[]);
    let mut w = stream;
    while !rest.is_empty() {
        let n = w.write(rest)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        rest = rest.get(n..).unwrap_or(&[]);
    }
    Ok(())
}

/// Connects to a workload socket with bounded reads and writes.
pub fn connect(path: &Path, timeout: Duration) -> Result<UnixStream, WireError> {
    let stream = UnixStream::connect(path).map_err(|source| WireError::Connect {
        path: path.display().to_string(),
        source,
    })?;
    let io = |source| WireError::Io {
        path: path.display().to_string(),
        source,
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    Ok(stream)
}

/// Sends `lines` on one connection (with `fd` on the first, if given) and returns one reply per
/// line. Every reply is read even if one fails; each says for itself.
pub fn call(
    path: &Path,
    lines: &[&str],
    fd: Option<BorrowedFd<'_>>,
    timeout: Duration,
) -> Result<Vec<Reply>, WireError> {
    let stream = connect(path, timeout)?;
    let io = |source| WireError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    match fd {
        Some(fd) => send_with_fd(&stream, text.as_bytes(), fd).map_err(io)?,
        None => (&stream).write_all(text.as_bytes()).map_err(io)?,
    }
    stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
    let mut raw = Vec::new();
    (&stream)
        .take(MAX_LINE as u64 * (lines.len() as u64 + 1))
        .read_to_end(&mut raw)
        .map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let mut replies = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let reply = Reply::parse(line).map_err(|source| WireError::BadReply {
            path: path.display().to_string(),
            line: line.to_owned(),
            source,
        })?;
        replies.push(reply);
    }
    if replies.len() != lines.len() {
        return Err(WireError::ShortReply {
            path: path.display().to_string(),
            sent: lines.len(),
            got: replies.len(),
        });
    }
    Ok(replies)
}

/// Sends one command and returns its reply.
pub fn call_one(path: &Path, line: &str, timeout: Duration) -> Result<Reply, WireError> {
    let mut replies = call(path, &[line], None, timeout)?;
    replies.pop().ok_or_else(|| WireError::ShortReply {
        path: path.display().to_string(),
        sent: 1,
        got: 0,
    })
}

/// Waits until the workload at `path` answers `ping`, polling while `alive()` says the process
/// still runs. A refused or missing socket means "not listening yet"; the workload binds its socket
/// only once the driver is initialised, so an answer means it is ready.
pub fn wait_listening(
    path: &Path,
    timeout: Duration,
    mut alive: impl FnMut() -> bool,
) -> Result<Reply, WireError> {
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match call_one(path, "ping", timeout) {
            Ok(reply) => return Ok(reply),
            Err(WireError::Connect { source, .. })
                if matches!(
                    source.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                if !alive() {
                    return Err(WireError::Connect {
                        path: path.display().to_string(),
                        source: io::Error::other("the process exited before listening"),
                    });
                }
                if start.elapsed() > timeout {
                    return Err(WireError::Connect {
                        path: path.display().to_string(),
                        source: io::Error::new(io::ErrorKind::TimedOut, "not listening in time"),
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_descriptor_rides_on_the_first_line() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        let text = "recv-fd x\nping\n";
        send_with_fd(&a, text.as_bytes(), file.as_fd()).unwrap();
        drop(a);
        let mut r = LineReader::new(&b);
        assert_eq!(r.next_line().unwrap().as_deref(), Some("recv-fd x"));
        let fd = r.take_fd().expect("descriptor received");
        assert_ne!(fd.as_raw_fd(), file.as_raw_fd());
        let flags = rustix::io::fcntl_getfd(&fd).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        assert_eq!(r.next_line().unwrap().as_deref(), Some("ping"));
        assert_eq!(r.next_line().unwrap(), None);
    }

    #[test]
    fn a_second_descriptor_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        send_with_fd(&a, b"x", file.as_fd()).unwrap();
        send_with_fd(&a, b"y\n", file.as_fd()).unwrap();
        drop(a);
        let mut r = LineReader::new(&b);
        let mut result = Ok(None);
        for _ in 0..3 {
            result = r.next_line();
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(WireError::Protocol(_))), "{result:?}");
    }

    #[test]
    fn last_line_without_newline_is_read() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"one\ntwo").unwrap();
        drop(a);
        let mut r = LineReader::new(&b);
        assert_eq!(r.next_line().unwrap().as_deref(), Some("one"));
        assert_eq!(r.next_line().unwrap().as_deref(), Some("two"));
        assert_eq!(r.next_line().unwrap(), None);
    }
}
