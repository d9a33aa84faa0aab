//! The transport over real sockets: round trips, descriptor passing, every refusal of a bad frame
//! (and that no descriptor it carried stays open), socket files.

use std::fs;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use cuinterpose_transport::{
    Connection, Listener, MAX_SOCKET_PATH_LEN, TransportError, remove_stale_socket,
};
use protocol::message::{FrameHeader, HEADER_LEN, MAX_BODY_LEN, PROTOCOL_VERSION};
use protocol::{
    AllocationId, Backing, ErrorCode, HelloReply, MappingRecord, Phase, ProcessRecord,
    ProtocolError, Request, Response,
};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// Long enough for a loaded 2-core machine, short enough that a hang fails the test.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A memfd with a name no other test uses, so that counting the descriptors that name it in
/// `/proc/self/fd` is not disturbed by tests running in parallel.
struct Marker {
    name: String,
}

impl Marker {
    fn new(tag: &str) -> Marker {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        Marker {
            name: format!(
                "cui-test-{tag}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    fn create(&self) -> OwnedFd {
        rustix::fs::memfd_create(&self.name, rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    /// Descriptors of this process that refer to a memfd of this marker's name.
    fn open_count(&self) -> usize {
        let needle = format!("/memfd:{} ", self.name);
        fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| {
                let target = target.to_string_lossy();
                target.starts_with(&needle) || target == needle.trim_end()
            })
            .count()
    }
}

/// Sends raw bytes with any number of descriptors on the first byte, as a misbehaving peer would.
fn raw_send(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let sent = rustix::net::sendmsg(
        stream,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
    assert_eq!(sent, bytes.len());
}

fn header(kind: u16, length: u32) -> [u8; HEADER_LEN] {
    FrameHeader {
        version: PROTOCOL_VERSION,
        kind,
        length,
    }
    .encode()
}

fn pair() -> (Connection, UnixStream) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let conn = Connection::from_stream(ours);
    conn.set_timeout(Some(TIMEOUT)).unwrap();
    (conn, theirs)
}

fn hello_reply() -> Response {
    Response::Hello(HelloReply {
        shim_version: "0.1.0".into(),
        ns_pid: 41,
        shim_sha256: "ab".repeat(32),
        driver_version: 12080,
        carrier_pinned_bytes: 256 << 20,
        carrier_helper: None,
    })
}

fn every_request() -> Vec<Request> {
    vec![
        Request::Hello {
            tool_version: "0.1.0".into(),
        },
        Request::Inspect,
        Request::GetFd {
            id: AllocationId([7; 16]),
        },
        Request::Freeze { timeout_ms: 5000 },
        Request::Save,
        Request::Release,
        Request::Load,
        Request::Import,
        Request::Thaw,
    ]
}

/// What the test server answers to each request.
fn answer(request: &Request) -> Response {
    match request {
        Request::Hello { .. } => hello_reply(),
        Request::Inspect => Response::Records(record_with_mappings(3)),
        Request::GetFd { id } => Response::Error {
            code: ErrorCode::NotFound,
            message: format!("no allocation {id}"),
        },
        Request::Freeze { timeout_ms } => Response::PhaseDone {
            phase: Phase::Frozen,
            bytes: 0,
            micros: u64::from(*timeout_ms),
            stats: None,
        },
        _ => Response::PhaseDone {
            phase: Phase::Saved,
            bytes: 1 << 30,
            micros: 7,
            stats: None,
        },
    }
}

fn record_with_mappings(n: u64) -> ProcessRecord {
    ProcessRecord {
        ns_pid: 41,
        phase: Phase::Running,
        allocations: vec![],
        imports: vec![],
        mappings: (0..n)
            .map(|i| MappingRecord {
                address: 0x7000_0000_0000 + i * 0x20_0000,
                size: 0x20_0000,
                offset: 0,
                backing: Backing::Created(AllocationId([(i % 251) as u8; 16])),
                access: vec![],
            })
            .collect(),
        reservations: vec![],
        blockers: vec![],
        calls_in_flight: 0,
        multicasts: vec![],
        unowned: vec![],
        gate: Default::default(),
    }
}

fn socket_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

#[test]
fn request_response_round_trip_over_a_listener() {
    let dir = tempfile::tempdir().unwrap();
    let listener = Listener::bind(&socket_path(&dir, "ctl.sock")).unwrap();
    let path = listener.path().to_path_buf();
    let server = thread::spawn(move || {
        let mut conn = listener.accept().unwrap();
        conn.set_timeout(Some(TIMEOUT)).unwrap();
        let peer = conn.check_peer().unwrap();
        assert_eq!(peer.pid, std::process::id());
        let mut served = 0;
        loop {
            match conn.recv_request() {
                Ok(request) => {
                    conn.send_response(&answer(&request), None).unwrap();
                    served += 1;
                }
                Err(TransportError::Closed) => return served,
                Err(e) => panic!("server: {e}"),
            }
        }
    });
    let mut client = Connection::connect(&path, TIMEOUT).unwrap();
    assert_eq!(client.peer().unwrap().pid, std::process::id());
    for request in every_request() {
        let (response, fd) = client.call(&request).unwrap();
        assert_eq!(response, answer(&request));
        assert!(fd.is_none());
    }
    drop(client);
    assert_eq!(server.join().unwrap(), every_request().len());
}

#[test]
fn a_frame_larger_than_the_socket_buffer_goes_through() {
    let (mut ours, theirs) = pair();
    let mut peer = Connection::from_stream(theirs);
    peer.set_timeout(Some(TIMEOUT)).unwrap();
    // About 6 MB: several partial sends on the way.
    let big = Response::Records(record_with_mappings(200_000));
    let expected = big.clone();
    let sender = thread::spawn(move || peer.send_response(&big, None).unwrap());
    let (response, fd) = ours.recv_response().unwrap();
    sender.join().unwrap();
    assert_eq!(response, expected);
    assert!(fd.is_none());
}

/// The carrier helper's answer to `CarrierShare` carries its carrier's memfd; any other
/// response of the helper's (`Copied`, `Accepted`) may not.
#[test]
fn a_carrier_descriptor_rides_only_on_its_own_response() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut server = Connection::from_stream(theirs);
    let memfd = Marker::new("carrier").create();
    rustix::io::write(&memfd, b"carrier bytes").unwrap();
    let sent = rustix::fs::fstat(&memfd).unwrap();
    let share = Response::CarrierFd {
        length: 13,
        helper_pid: 7,
    };
    server.send_response(&share, Some(memfd.as_fd())).unwrap();
    let mut client = Connection::from_stream(ours);
    let (response, fd) = client.recv_response().unwrap();
    assert_eq!(response, share);
    let got = rustix::fs::fstat(fd.expect("the carrier's descriptor")).unwrap();
    assert_eq!((got.st_dev, got.st_ino), (sent.st_dev, sent.st_ino));
    // Refused on the sending side either way round.
    assert!(matches!(
        server.send_response(&share, None),
        Err(TransportError::MissingFd)
    ));
    assert!(matches!(
        server.send_response(&Response::Accepted, Some(memfd.as_fd())),
        Err(TransportError::UnexpectedFd)
    ));
}

#[test]
fn a_descriptor_arrives_close_on_exec_and_refers_to_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let listener = Listener::bind(&socket_path(&dir, "fd.sock")).unwrap();
    let path = listener.path().to_path_buf();
    let marker = Marker::new("pass");
    let memfd = marker.create();
    rustix::io::write(&memfd, b"shared bytes").unwrap();
    let sent_stat = rustix::fs::fstat(&memfd).unwrap();
    let server = thread::spawn(move || {
        let mut conn = listener.accept().unwrap();
        conn.set_timeout(Some(TIMEOUT)).unwrap();
        let Request::GetFd { id } = conn.recv_request().unwrap() else {
            panic!("expected GetFd");
        };
        conn.send_response(&Response::Fd { id }, Some(memfd.as_fd()))
            .unwrap();
        // The sender's copy is closed here; the receiver's must keep the file alive.
    });
    let mut client = Connection::connect(&path, TIMEOUT).unwrap();
    let id = AllocationId([9; 16]);
    let (response, fd) = client.call(&Request::GetFd { id }).unwrap();
    server.join().unwrap();
    assert_eq!(response, Response::Fd { id });
    let fd = fd.expect("the descriptor");
    let got = rustix::fs::fstat(&fd).unwrap();
    assert_eq!(
        (got.st_dev, got.st_ino),
        (sent_stat.st_dev, sent_stat.st_ino)
    );
    assert!(
        rustix::io::fcntl_getfd(&fd)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC)
    );
    let mut content = [0u8; 12];
    rustix::io::pread(&fd, &mut content, 0).unwrap();
    assert_eq!(&content, b"shared bytes");
    assert_eq!(marker.open_count(), 1);
    drop(fd);
    assert_eq!(marker.open_count(), 0);
}

/// Feeds `frame` (with `fd_count` marker descriptors on its first byte) to a connection expecting
/// a response, or a request, and returns the error; checks that the connection is unusable after it
/// and that every descriptor that arrived was closed.
fn refused(
    frame: &[u8],
    fd_count: usize,
    expect_request: bool,
    close_after: bool,
) -> TransportError {
    let (mut conn, theirs) = pair();
    let marker = Marker::new("refuse");
    let fds: Vec<OwnedFd> = (0..fd_count).map(|_| marker.create()).collect();
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
    raw_send(&theirs, frame, &borrowed);
    drop(borrowed);
    drop(fds);
    if close_after {
        drop(theirs);
    } else {
        // Kept open: a receiver that waited for more bytes than the header allows would hang here
        // until the timeout instead of refusing.
        std::mem::forget(theirs);
    }
    let error = if expect_request {
        conn.recv_request().map(|_| ()).unwrap_err()
    } else {
        conn.recv_response().map(|_| ()).unwrap_err()
    };
    assert_eq!(
        marker.open_count(),
        0,
        "descriptors left open after {error}"
    );
    assert!(matches!(
        conn.recv_response().map(|_| ()).unwrap_err(),
        TransportError::Broken
    ));
    error
}

fn response_frame(response: &Response) -> Vec<u8> {
    protocol::message::encode_response(response)
}

#[test]
fn bad_magic_is_refused() {
    let mut frame = response_frame(&hello_reply());
    frame[0] = b'X';
    for fds in [0, 1] {
        let e = refused(&frame, fds, false, false);
        assert!(
            matches!(e, TransportError::Protocol(ProtocolError::BadMagic)),
            "{e}"
        );
    }
}

#[test]
fn another_version_is_refused() {
    let mut frame = response_frame(&hello_reply());
    frame[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    let e = refused(&frame, 1, false, false);
    assert!(
        matches!(
            e,
            TransportError::Protocol(ProtocolError::VersionMismatch { .. })
        ),
        "{e}"
    );
}

#[test]
fn a_request_of_another_version_is_answered_in_ours_then_closed() {
    use std::io::{Read, Write};
    let (mut server, mut client) = pair();
    // Before any refusal there is nothing to answer.
    let (idle, _other_end) = pair();
    assert!(matches!(idle.refuse_version(), Err(TransportError::Broken)));

    let mut frame = protocol::message::encode_request(&Request::Hello {
        tool_version: "9.0.0".into(),
    });
    frame[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    client.write_all(&frame).unwrap();
    let e = server.recv_request().unwrap_err();
    assert!(
        matches!(
            e,
            TransportError::Protocol(ProtocolError::VersionMismatch { ours, theirs })
                if ours == PROTOCOL_VERSION && theirs == PROTOCOL_VERSION + 1
        ),
        "{e}"
    );
    server.refuse_version().unwrap();

    // The peer gets one whole frame of our version (its header check reports the mismatch),
    // then the end of the stream: EOF, or a reset because its own body was left unread.
    client.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut head = [0u8; HEADER_LEN];
    client.read_exact(&mut head).unwrap();
    let head = FrameHeader::decode(&head).unwrap();
    assert_eq!(head.version, PROTOCOL_VERSION);
    let mut body = vec![0u8; head.length as usize];
    client.read_exact(&mut body).unwrap();
    match client.read(&mut [0u8; 1]) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the end of the stream, got {other:?}"),
    }
    match protocol::message::decode_response(&head, &body).unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Denied);
            assert!(
                message.contains(&format!("protocol version {}", PROTOCOL_VERSION + 1)),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_kind_that_disagrees_with_the_body_is_refused() {
    let frame = response_frame(&hello_reply());
    for kind in [0x104u16, 0x77, 0] {
        let mut bad = frame.clone();
        bad[6..8].copy_from_slice(&kind.to_le_bytes());
        let e = refused(&bad, 1, false, false);
        assert!(
            matches!(
                e,
                TransportError::Protocol(ProtocolError::KindMismatch { .. })
            ),
            "kind {kind:#x}: {e}"
        );
    }
    let mut request = protocol::message::encode_request(&Request::Inspect);
    request[6..8].copy_from_slice(&9u16.to_le_bytes());
    let e = refused(&request, 0, true, false);
    assert!(
        matches!(
            e,
            TransportError::Protocol(ProtocolError::KindMismatch { .. })
        ),
        "{e}"
    );
}

#[test]
fn an_oversized_length_is_refused_before_reading_the_body() {
    // No body follows and the peer stays open: only a receiver that refuses from the header alone
    // returns TooLarge (one that tried to read the body would time out).
    for length in [MAX_BODY_LEN + 1, u32::MAX] {
        let e = refused(&header(0x101, length), 1, false, false);
        assert!(
            matches!(
                e,
                TransportError::Protocol(ProtocolError::TooLarge { length: l, .. }) if l == u64::from(length)
            ),
            "{e}"
        );
    }
}

#[test]
fn a_body_that_does_not_decode_is_refused() {
    let body = [0xffu8; 9];
    let mut frame = header(0x101, body.len() as u32).to_vec();
    frame.extend_from_slice(&body);
    let e = refused(&frame, 1, false, false);
    assert!(
        matches!(e, TransportError::Protocol(ProtocolError::Malformed(_))),
        "{e}"
    );
}

#[test]
fn a_body_with_trailing_bytes_is_refused() {
    let mut frame = response_frame(&hello_reply());
    let body_len = (frame.len() - HEADER_LEN + 3) as u32;
    frame[8..12].copy_from_slice(&body_len.to_le_bytes());
    frame.extend_from_slice(&[0, 0, 0]);
    let e = refused(&frame, 1, false, false);
    assert!(
        matches!(e, TransportError::Protocol(ProtocolError::TrailingBytes(3))),
        "{e}"
    );
}

#[test]
fn a_peer_that_closes_mid_frame_gives_truncated() {
    let frame = response_frame(&hello_reply());
    let e = refused(&frame[..HEADER_LEN + 3], 1, false, true);
    assert!(
        matches!(
            e,
            TransportError::Protocol(ProtocolError::Truncated { expected, got })
                if expected == frame.len() && got == HEADER_LEN + 3
        ),
        "{e}"
    );
    let e = refused(&frame[..5], 1, false, true);
    assert!(
        matches!(
            e,
            TransportError::Protocol(ProtocolError::Truncated {
                expected: HEADER_LEN,
                got: 5
            })
        ),
        "{e}"
    );
}

#[test]
fn a_clean_close_between_frames_is_closed_and_stays_closed() {
    let (mut conn, theirs) = pair();
    drop(theirs);
    assert!(matches!(conn.recv_request(), Err(TransportError::Closed)));
    assert!(matches!(conn.recv_response(), Err(TransportError::Closed)));
}

#[test]
fn two_or_more_descriptors_are_refused_and_closed() {
    let frame = response_frame(&Response::Fd {
        id: AllocationId([1; 16]),
    });
    // Two fit the control buffer and are seen; more set MSG_CTRUNC (the kernel installs those that
    // fit, which must be closed too).
    for fds in [2, 3, 8] {
        let e = refused(&frame, fds, false, false);
        assert!(matches!(e, TransportError::TooManyFds), "{fds} fds: {e}");
    }
}

#[test]
fn a_descriptor_on_a_request_is_refused_and_closed() {
    let frame = protocol::message::encode_request(&Request::GetFd {
        id: AllocationId([1; 16]),
    });
    let e = refused(&frame, 1, true, false);
    assert!(matches!(e, TransportError::UnexpectedFd), "{e}");
}

#[test]
fn a_descriptor_on_a_response_other_than_fd_is_refused_and_closed() {
    let e = refused(&response_frame(&hello_reply()), 1, false, false);
    assert!(matches!(e, TransportError::UnexpectedFd), "{e}");
}

#[test]
fn a_descriptor_on_the_body_rather_than_the_first_byte_is_seen() {
    let (mut conn, theirs) = pair();
    let marker = Marker::new("late");
    let fd = marker.create();
    let frame = response_frame(&hello_reply());
    raw_send(&theirs, &frame[..HEADER_LEN], &[]);
    raw_send(&theirs, &frame[HEADER_LEN..], &[fd.as_fd()]);
    drop(fd);
    let e = conn.recv_response().map(|_| ()).unwrap_err();
    assert!(matches!(e, TransportError::UnexpectedFd), "{e}");
    assert_eq!(marker.open_count(), 0);
    drop(theirs);
}

#[test]
fn an_fd_response_without_its_descriptor_is_refused() {
    let frame = response_frame(&Response::Fd {
        id: AllocationId([1; 16]),
    });
    let e = refused(&frame, 0, false, false);
    assert!(matches!(e, TransportError::MissingFd), "{e}");
}

#[test]
fn the_sender_refuses_mismatched_descriptors_and_oversized_bodies_and_stays_usable() {
    let (mut conn, theirs) = pair();
    let marker = Marker::new("send");
    let fd = marker.create();
    assert!(matches!(
        conn.send_response(&hello_reply(), Some(fd.as_fd())),
        Err(TransportError::UnexpectedFd)
    ));
    assert!(matches!(
        conn.send_response(
            &Response::Fd {
                id: AllocationId([1; 16])
            },
            None
        ),
        Err(TransportError::MissingFd)
    ));
    let huge = Response::Error {
        code: ErrorCode::Internal,
        message: "x".repeat(MAX_BODY_LEN as usize + 1),
    };
    assert!(matches!(
        conn.send_response(&huge, None),
        Err(TransportError::Protocol(ProtocolError::TooLarge { .. }))
    ));
    // None of that put a byte on the wire, so the connection still works.
    conn.send_response(&hello_reply(), None).unwrap();
    let mut peer = Connection::from_stream(theirs);
    peer.set_timeout(Some(TIMEOUT)).unwrap();
    assert_eq!(peer.recv_response().unwrap().0, hello_reply());
}

#[test]
fn sending_to_a_closed_peer_is_an_error_not_a_signal() {
    let (mut conn, theirs) = pair();
    drop(theirs);
    // Without MSG_NOSIGNAL this would kill the test process with SIGPIPE.
    let e = conn.send_request(&Request::Inspect).unwrap_err();
    assert!(matches!(e, TransportError::Closed), "{e}");
    let marker = Marker::new("epipe");
    let fd = marker.create();
    let e = conn
        .send_response(
            &Response::Fd {
                id: AllocationId([1; 16]),
            },
            Some(fd.as_fd()),
        )
        .unwrap_err();
    assert!(matches!(e, TransportError::Closed), "{e}");
}

#[test]
fn a_timeout_before_any_byte_leaves_the_connection_usable() {
    let (mut conn, theirs) = pair();
    conn.set_timeout(Some(Duration::from_millis(50))).unwrap();
    assert!(matches!(conn.recv_response(), Err(TransportError::Timeout)));
    conn.set_timeout(Some(TIMEOUT)).unwrap();
    let mut peer = Connection::from_stream(theirs);
    peer.send_response(&hello_reply(), None).unwrap();
    assert_eq!(conn.recv_response().unwrap().0, hello_reply());
}

#[test]
fn a_timeout_mid_frame_breaks_the_connection() {
    let (mut conn, theirs) = pair();
    conn.set_timeout(Some(Duration::from_millis(50))).unwrap();
    let frame = response_frame(&hello_reply());
    raw_send(&theirs, &frame[..HEADER_LEN + 1], &[]);
    assert!(matches!(conn.recv_response(), Err(TransportError::Timeout)));
    raw_send(&theirs, &frame[HEADER_LEN + 1..], &[]);
    assert!(matches!(conn.recv_response(), Err(TransportError::Broken)));
}

#[test]
fn zero_timeouts_are_refused() {
    let (conn, _theirs) = pair();
    assert!(matches!(
        conn.set_timeout(Some(Duration::ZERO)),
        Err(TransportError::Io { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    let listener = Listener::bind(&socket_path(&dir, "z.sock")).unwrap();
    assert!(matches!(
        Connection::connect(listener.path(), Duration::ZERO),
        Err(TransportError::Io { .. })
    ));
}

#[test]
fn the_socket_file_is_mode_0600_and_removed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir, "mode.sock");
    let listener = Listener::bind(&path).unwrap();
    let meta = fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
    drop(listener);
    assert!(!path.exists());
    let e = Connection::connect(&path, TIMEOUT).unwrap_err();
    assert!(
        matches!(&e, TransportError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{e}"
    );
}

#[test]
fn a_stale_socket_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir, "stale.sock");
    // std's listener leaves its file behind when dropped, as a killed process does.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let e = Connection::connect(&path, TIMEOUT).unwrap_err();
    assert!(
        matches!(&e, TransportError::Io { source, .. } if source.kind() == std::io::ErrorKind::ConnectionRefused),
        "{e}"
    );
    let listener = Listener::bind(&path).unwrap();
    let client = thread::spawn({
        let path = path.clone();
        move || {
            Connection::connect(&path, TIMEOUT)
                .unwrap()
                .send_request(&Request::Inspect)
                .unwrap()
        }
    });
    let mut conn = listener.accept().unwrap();
    conn.set_timeout(Some(TIMEOUT)).unwrap();
    assert_eq!(conn.recv_request().unwrap(), Request::Inspect);
    client.join().unwrap();
}

#[test]
fn a_live_socket_is_never_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir, "live.sock");
    let live = Listener::bind(&path).unwrap();
    let e = Listener::bind(&path).unwrap_err();
    assert!(matches!(e, TransportError::AddrInUse { .. }), "{e}");
    // The probe's connection is queued on the live listener; accept it and see that the live
    // listener still serves a real client on the same path.
    let probe = live.accept().unwrap();
    probe.set_timeout(Some(TIMEOUT)).unwrap();
    let client = thread::spawn({
        let path = path.clone();
        move || {
            let mut c = Connection::connect(&path, TIMEOUT).unwrap();
            c.send_request(&Request::Thaw).unwrap();
        }
    });
    let mut conn = live.accept().unwrap();
    conn.set_timeout(Some(TIMEOUT)).unwrap();
    assert_eq!(conn.recv_request().unwrap(), Request::Thaw);
    client.join().unwrap();
    drop(probe);
}

#[test]
fn a_live_socket_with_a_full_queue_is_never_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir, "full.sock");
    let live = Listener::bind(&path).unwrap();
    // Fill the accept queue with non-blocking connects until the kernel says it is full.
    let mut queued = Vec::new();
    let addr = rustix::net::SocketAddrUnix::new(&path).unwrap();
    loop {
        let s = rustix::net::socket_with(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            None,
        )
        .unwrap();
        match rustix::net::connect(&s, &addr) {
            Ok(()) => queued.push(s),
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => panic!("filling the queue: {e}"),
        }
        assert!(queued.len() < 100_000, "the queue never filled");
    }
    let e = Listener::bind(&path).unwrap_err();
    assert!(matches!(e, TransportError::AddrInUse { .. }), "{e}");
    assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    drop(live);
}

#[test]
fn files_that_are_not_stale_sockets_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let regular = socket_path(&dir, "regular.sock");
    fs::write(&regular, b"keep me").unwrap();
    let e = Listener::bind(&regular).unwrap_err();
    assert!(matches!(e, TransportError::AddrInUse { .. }), "{e}");
    assert_eq!(fs::read(&regular).unwrap(), b"keep me");

    let stale = socket_path(&dir, "stale-target.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let link = socket_path(&dir, "link.sock");
    std::os::unix::fs::symlink(&stale, &link).unwrap();
    let e = Listener::bind(&link).unwrap_err();
    assert!(matches!(e, TransportError::AddrInUse { .. }), "{e}");
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(stale.exists());

    let subdir = socket_path(&dir, "dir.sock");
    fs::create_dir(&subdir).unwrap();
    let e = Listener::bind(&subdir).unwrap_err();
    assert!(matches!(e, TransportError::AddrInUse { .. }), "{e}");
    assert!(subdir.is_dir());
}

/// A path of exactly `len` bytes inside `dir`.
fn path_of_len(dir: &Path, len: usize) -> PathBuf {
    let base = dir.as_os_str().len() + 1;
    assert!(
        len > base + 5,
        "temporary directory path too long for this test"
    );
    dir.join("s".repeat(len - base))
}

#[test]
fn socket_paths_over_107_bytes_are_refused_and_107_works() {
    let dir = tempfile::Builder::new()
        .prefix("c")
        .tempdir_in("/tmp")
        .unwrap();
    let longest = path_of_len(dir.path(), MAX_SOCKET_PATH_LEN);
    assert_eq!(longest.as_os_str().len(), 107);
    let listener = Listener::bind(&longest).unwrap();
    let client = thread::spawn({
        let longest = longest.clone();
        move || Connection::connect(&longest, TIMEOUT).map(|_| ())
    });
    let _conn = listener.accept().unwrap();
    client.join().unwrap().unwrap();

    let too_long = path_of_len(dir.path(), MAX_SOCKET_PATH_LEN + 1);
    for e in [
        Listener::bind(&too_long).unwrap_err(),
        Connection::connect(&too_long, TIMEOUT).unwrap_err(),
    ] {
        assert!(
            matches!(
                &e,
                TransportError::PathTooLong {
                    len: 108,
                    max: 107,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("108 bytes"), "{e}");
    }
    assert!(!too_long.exists());
}

#[test]
fn connections_and_listeners_are_close_on_exec() {
    let dir = tempfile::tempdir().unwrap();
    let listener = Listener::bind(&socket_path(&dir, "cloexec.sock")).unwrap();
    let client = Connection::connect(listener.path(), TIMEOUT).unwrap();
    let server = listener.accept().unwrap();
    for fd in [listener.as_fd(), client.as_fd(), server.as_fd()] {
        assert!(
            rustix::io::fcntl_getfd(fd)
                .unwrap()
                .contains(rustix::io::FdFlags::CLOEXEC)
        );
    }
}

#[test]
fn received_descriptor_content_survives_the_sender_closing() {
    let (mut conn, theirs) = pair();
    let mut peer = Connection::from_stream(theirs);
    let marker = Marker::new("own");
    let memfd = marker.create();
    rustix::io::write(&memfd, b"x").unwrap();
    peer.send_response(
        &Response::Fd {
            id: AllocationId([2; 16]),
        },
        Some(memfd.as_fd()),
    )
    .unwrap();
    drop(memfd);
    drop(peer);
    let (_, fd) = conn.recv_response().unwrap();
    let fd = fd.unwrap();
    // The same open file description: the sender's write moved the shared offset.
    assert_eq!(
        rustix::fs::seek(&fd, rustix::fs::SeekFrom::Current(0)).unwrap(),
        1
    );
    let mut content = [0u8; 1];
    rustix::io::pread(&fd, &mut content, 0).unwrap();
    assert_eq!(&content, b"x");
    assert_eq!(marker.open_count(), 1);
}

#[test]
fn remove_stale_socket_follows_the_reclaim_rules() {
    let dir = tempfile::tempdir().unwrap();
    let stale = socket_path(&dir, "stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(remove_stale_socket(&stale).unwrap());
    assert!(!stale.exists());
    assert!(!remove_stale_socket(&stale).unwrap());

    let live = Listener::bind(&socket_path(&dir, "live.sock")).unwrap();
    assert!(matches!(
        remove_stale_socket(live.path()),
        Err(TransportError::AddrInUse { .. })
    ));
    assert!(live.path().exists());

    let regular = socket_path(&dir, "regular");
    fs::write(&regular, b"keep").unwrap();
    assert!(matches!(
        remove_stale_socket(&regular),
        Err(TransportError::AddrInUse { .. })
    ));
    assert_eq!(fs::read(&regular).unwrap(), b"keep");
    let too_long = path_of_len(dir.path(), MAX_SOCKET_PATH_LEN + 1);
    assert!(matches!(
        remove_stale_socket(&too_long),
        Err(TransportError::PathTooLong { .. })
    ));
}

/// SaveTo and LoadFrom carry the data file: it arrives with them, and only with them; one sent
/// without it, or a descriptor on another request, is refused on both sides.
#[test]
fn the_data_file_rides_on_save_to_and_nowhere_else() {
    let (a, b) = UnixStream::pair().unwrap();
    let mut tool = Connection::from_stream(a);
    let mut shim = Connection::from_stream(b);
    for c in [&tool, &shim] {
        c.set_timeout(Some(TIMEOUT)).unwrap();
    }
    let file = tempfile::tempfile().unwrap();
    tool.send_request_with(
        &Request::SaveTo {
            store: false,
            workers: 4,
        },
        Some(file.as_fd()),
    )
    .unwrap();
    let (request, got) = shim.recv_request_with_fd().unwrap();
    assert_eq!(
        request,
        Request::SaveTo {
            store: false,
            workers: 4
        }
    );
    let got = got.expect("the data file");
    let (ours, theirs) = (
        file.metadata().unwrap(),
        fs::File::from(got).metadata().unwrap(),
    );
    assert_eq!((ours.dev(), ours.ino()), (theirs.dev(), theirs.ino()));

    assert!(matches!(
        tool.send_request(&Request::SaveTo {
            store: false,
            workers: 4
        }),
        Err(TransportError::MissingFd)
    ));
    assert!(matches!(
        tool.send_request_with(&Request::Load, Some(file.as_fd())),
        Err(TransportError::UnexpectedFd)
    ));
    // Inspect arrives without one and is served as before.
    tool.send_request(&Request::Inspect).unwrap();
    let (request, got) = shim.recv_request_with_fd().unwrap();
    assert_eq!(request, Request::Inspect);
    assert!(got.is_none());
}
