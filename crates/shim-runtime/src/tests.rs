//! In-process tests of the runtime over the Rust test driver: several runtimes in one test process
//! play several processes (each with its own control socket under a temporary directory and its
//! own namespace PID), sharing the test driver as processes share a GPU. The control sockets,
//! the fd service and the phase requests are the real ones.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::config::Config;
use crate::registry::{HANDLE_TAG, Kind};
use crate::runtime::Runtime;
use crate::track::ExportTo;
use cuda::{ForeignPtr, VirtualHandle};
use cuda_abi::*;
use protocol::record::{Backing, Blocker, Phase};
use protocol::ticket::Ticket;
use protocol::{ErrorCode, Request, Response};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use testdriver::{self, FAIL_SIZE, fake};
use transport::Connection;

const MB2: usize = 2 << 20;
static NEXT_PID: AtomicU32 = AtomicU32::new(3_000_000);

struct Proc {
    rt: Arc<Runtime>,
    /// The test's tool connection, kept as the tool keeps it: a capture's lease is held by it,
    /// and its end would undo a capture that released nothing.
    tool: std::sync::Mutex<Option<Connection>>,
}

fn pid() -> u32 {
    NEXT_PID.fetch_add(1, Ordering::Relaxed)
}

impl Proc {
    fn new(dir: &Path) -> Proc {
        Proc::with_driver(dir, testdriver::real())
    }

    /// A process over `real`: the test driver with scripted entries.
    fn with_driver(dir: &Path, real: crate::Real) -> Proc {
        let rt = Runtime::new(
            real,
            Config {
                control_dir: dir.to_path_buf(),
                ns_pid: pid(),
                copy: copy::CopyConfig::default(),
                pid_namespace: crate::config::own_pid_namespace(),
                alloc: crate::config::AllocMode::Vmm,
            },
        );
        rt.serve().unwrap();
        Proc {
            rt,
            tool: std::sync::Mutex::new(None),
        }
    }

    fn pid(&self) -> u32 {
        self.rt.config().ns_pid
    }

    fn try_create(&self, size: usize, device: i32, types: u32) -> Result<u64, CUresult> {
        let mut prop = CUmemAllocationProp {
            type_: allocation_type::PINNED,
            requestedHandleTypes: types,
            ..CUmemAllocationProp::default()
        };
        prop.location.type_ = location_type::DEVICE;
        prop.location.id = device;
        self.rt.mem_create(size, &prop, 0).map(|h| h.0)
    }

    fn create(&self, size: usize, device: i32) -> u64 {
        self.try_create(size, device, handle_type::POSIX_FILE_DESCRIPTOR)
            .unwrap()
    }

    fn reserve(&self, size: usize) -> u64 {
        self.rt.mem_address_reserve(size, 0, 0, 0).unwrap()
    }

    fn map(&self, va: u64, size: usize, offset: usize, h: u64) {
        let r = self.rt.mem_map(va, size, offset, VirtualHandle(h), 0);
        assert_eq!(r, Ok(()));
    }

    fn access(&self, va: u64, size: usize, grants: &[(i32, u32)]) {
        let descs: Vec<CUmemAccessDesc> = grants
            .iter()
            .map(|&(id, flags)| CUmemAccessDesc {
                location: CUmemLocation {
                    type_: location_type::DEVICE,
                    id,
                },
                flags,
            })
            .collect();
        assert_eq!(self.rt.mem_set_access(va, size, &descs), Ok(()));
    }

    /// Reserve, map whole, grant read-write to `device`.
    fn map_new(&self, h: u64, size: usize, device: i32) -> u64 {
        let va = self.reserve(size);
        self.map(va, size, 0, h);
        self.access(va, size, &[(device, access_flags::PROT_READWRITE)]);
        va
    }

    fn export(&self, h: u64) -> OwnedFd {
        let r = self.rt.mem_export(
            VirtualHandle(h),
            handle_type::POSIX_FILE_DESCRIPTOR,
            0,
            ExportTo::Descriptor,
        );
        r.unwrap().unwrap()
    }

    fn import(&self, fd: &OwnedFd) -> Result<u64, CUresult> {
        self.rt.mem_import_fd(fd.as_fd()).map(|h| h.0)
    }

    fn release(&self, h: u64) -> CUresult {
        match self.rt.mem_release(VirtualHandle(h)) {
            Ok(()) => CUresult::SUCCESS,
            Err(r) => r,
        }
    }

    /// A request through the control socket, as the tool sends it.
    fn call(&self, request: Request) -> Response {
        let mut tool = self.tool.lock().unwrap();
        let conn = tool.get_or_insert_with(|| {
            let path = self.rt.config().socket_of(self.pid());
            Connection::connect(&path, Duration::from_secs(60)).unwrap()
        });
        conn.call(&request).unwrap().0
    }

    /// Ends the test's tool connection, as a tool that exits or is killed does.
    fn drop_tool(&self) {
        self.tool.lock().unwrap().take();
    }

    fn phase(&self, request: Request) -> Phase {
        match self.call(request.clone()) {
            Response::PhaseDone { phase, .. } => phase,
            other => panic!("{request:?} on {}: {other:?}", self.pid()),
        }
    }
}

fn write(va: u64, bytes: &[u8]) {
    fake().write(va, bytes).unwrap();
}

fn read(va: u64, n: usize) -> Vec<u8> {
    fake().read(va, n).unwrap()
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
}

#[test]
fn two_processes_share_through_tickets_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Proc::new(dir.path()), Proc::new(dir.path()));
    let ha = a.create(MB2, 0);
    let va_a = a.map_new(ha, MB2, 0);
    let ticket = a.export(ha);
    // The application never sees a driver handle: the virtual one is tagged and unknown to the
    // driver.
    assert_eq!(ha & HANDLE_TAG, HANDLE_TAG);
    assert!(fake().alloc_of(ha).is_none());
    let hb = b.import(&ticket).unwrap();
    assert!(fake().alloc_of(hb).is_none());
    let va_b = b.map_new(hb, MB2, 1);
    write(va_a, b"written by a");
    assert_eq!(read(va_b, 12), b"written by a");
    write(va_b + 4096, b"written by b");
    assert_eq!(read(va_a + 4096, 12), b"written by b");
    // The cached driver descriptor is close-on-exec (the test driver's memfd is not).
    assert!(
        a.rt.tracking.exports.cloexec_all(),
        "a cached descriptor is inheritable"
    );
    // The ticket is what the application got, not the driver's descriptor.
    let mut bytes = [0u8; 48];
    rustix::io::pread(&ticket, &mut bytes, 0).unwrap();
    let t = Ticket::decode(&bytes).unwrap();
    assert_eq!(t.creator_ns_pid, a.pid());
    assert_eq!(t.size, MB2 as u64);
    // Records on both sides.
    let ra = a.rt.inspect();
    assert_eq!(ra.allocations.len(), 1);
    assert!(ra.allocations[0].shared);
    assert_eq!(ra.allocations[0].id, t.id);
    let rb = b.rt.inspect();
    assert_eq!(rb.imports.len(), 1);
    assert_eq!(rb.imports[0].creator_ns_pid, a.pid());
    assert_eq!(rb.mappings[0].backing, Backing::Imported(t.id));
    assert_eq!(rb.mappings[0].access.len(), 1);
}

#[test]
fn repeated_imports_and_retains_alias_one_driver_handle() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Proc::new(dir.path()), Proc::new(dir.path()));
    let ha = a.create(MB2, 0);
    let ticket = a.export(ha);
    let second_ticket = a.export(ha);
    let h1 = b.import(&ticket).unwrap();
    let h2 = b.import(&second_ticket).unwrap();
    assert_eq!(h1, h2);
    let rec = b.rt.inspect();
    assert_eq!(rec.imports[0].live_handles, 2);
    let real = b.rt.lock().real_of(VirtualHandle(h1)).unwrap();
    let aid = fake().alloc_of(real.raw()).unwrap();
    // One driver handle in the creator, one in the importer.
    assert_eq!(fake().allocs[&aid].handles, 2);
    let va = b.map_new(h1, MB2, 0);
    let retained = b.rt.mem_retain(va + 100).map(|h| h.0);
    assert_eq!(retained, Ok(h1));
    assert_eq!(fake().allocs[&aid].handles, 2);
    assert_eq!(b.rt.inspect().imports[0].live_handles, 3);
    for _ in 0..3 {
        assert_eq!(b.release(h1), CUresult::SUCCESS);
    }
    // The mapping keeps it alive; a fourth release is refused like the driver would.
    assert_eq!(b.release(h1), CUresult::ERROR_INVALID_VALUE);
    assert_eq!(fake().allocs[&aid].handles, 2);
    assert_eq!(b.rt.mem_unmap(va, MB2), Ok(()));
    assert_eq!(fake().allocs[&aid].handles, 1);
    assert!(b.rt.inspect().imports.is_empty());
}

#[test]
#[allow(unsafe_code)] // hands the driver an out-pointer, as an application does
fn driver_errors_come_back_unchanged_and_record_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    assert_eq!(
        a.try_create(FAIL_SIZE, 0, handle_type::POSIX_FILE_DESCRIPTOR),
        Err(CUresult::ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(
        a.try_create(MB2, 0, handle_type::FABRIC),
        Err(CUresult::ERROR_NOT_PERMITTED)
    );
    assert!(a.rt.inspect().allocations.is_empty());
    // An allocation without POSIX export: export fails with the driver's code, nothing shared.
    let h = a.try_create(MB2, 0, handle_type::NONE).unwrap();
    let r = a.rt.mem_export(
        VirtualHandle(h),
        handle_type::POSIX_FILE_DESCRIPTOR,
        0,
        ExportTo::Descriptor,
    );
    assert_eq!(r.err(), Some(CUresult::ERROR_INVALID_VALUE));
    assert!(!a.rt.inspect().allocations[0].shared);
    // Unknown and zero handles.
    assert_eq!(a.release(0), CUresult::ERROR_INVALID_VALUE);
    assert_eq!(
        a.release(HANDLE_TAG | 0xffff),
        CUresult::ERROR_INVALID_VALUE
    );
    assert_eq!(
        a.rt.mem_map(0x1000, MB2, 0, VirtualHandle(0), 0),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    // An unsupported export type is passed to the driver; its error comes back.
    let mut out = CUmemFabricHandle { data: [0; 64] };
    // SAFETY: a writable fabric handle, what the driver writes for FABRIC.
    let to = ExportTo::Foreign(unsafe { ForeignPtr::new((&raw mut out).cast()) });
    let r =
        a.rt.mem_export(VirtualHandle(h), handle_type::FABRIC, 0, to);
    assert_eq!(r.err(), Some(CUresult::ERROR_NOT_SUPPORTED));
    assert!(a.rt.inspect().blockers.is_empty());
}

#[test]
fn bad_tickets_get_clear_errors_and_the_process_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Proc::new(dir.path()), Proc::new(dir.path()));
    let ha = a.create(MB2, 0);
    let good = a.export(ha);
    let mut bytes = [0u8; 48];
    rustix::io::pread(&good, &mut bytes, 0).unwrap();
    let t = Ticket::decode(&bytes).unwrap();
    let sealed = |t: &Ticket| crate::fdutil::make_ticket(t).unwrap();
    // Forged (unsealed copy), truncated, wrong version: INVALID_VALUE.
    let memfd = |b: &[u8]| {
        let fd = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::pwrite(&fd, b, 0).unwrap();
        fd
    };
    assert_eq!(b.import(&memfd(&bytes)), Err(CUresult::ERROR_INVALID_VALUE));
    assert_eq!(
        b.import(&memfd(&bytes[..30])),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    let mut v2 = bytes;
    v2[8] = 2;
    assert_eq!(b.import(&memfd(&v2)), Err(CUresult::ERROR_INVALID_VALUE));
    // A dead creator: INVALID_HANDLE.
    let dead = Ticket {
        creator_ns_pid: 3_999_999,
        ..t
    };
    assert_eq!(
        b.import(&sealed(&dead)),
        Err(CUresult::ERROR_INVALID_HANDLE)
    );
    // A live creator that does not know the allocation: NOT_FOUND.
    let unknown = Ticket {
        id: protocol::record::AllocationId([9; 16]),
        ..t
    };
    assert_eq!(b.import(&sealed(&unknown)), Err(CUresult::ERROR_NOT_FOUND));
    // Nothing recorded, nothing leaked; the good ticket still works.
    assert!(b.rt.inspect().imports.is_empty());
    let h = b.import(&good).unwrap();
    assert_eq!(b.rt.inspect().imports.len(), 1);
    assert_eq!(b.release(h), CUresult::SUCCESS);
    assert!(b.rt.inspect().imports.is_empty());
}

#[test]
fn malformed_and_oversized_frames_close_only_their_connection() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Proc::new(dir.path()), Proc::new(dir.path()));
    let path = a.rt.config().socket_of(a.pid());
    for junk in [
        b"this is not a frame at all".to_vec(),
        // A valid header announcing a body larger than the limit.
        protocol::FrameHeader {
            version: protocol::message::PROTOCOL_VERSION,
            kind: 3,
            length: u32::MAX,
        }
        .encode()
        .to_vec(),
        // A valid header and a body that is garbage.
        {
            let mut f = protocol::FrameHeader {
                version: protocol::message::PROTOCOL_VERSION,
                kind: 3,
                length: 4,
            }
            .encode()
            .to_vec();
            f.extend_from_slice(&[0xff; 4]);
            f
        },
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(&junk).unwrap();
        let mut rest = Vec::new();
        // The shim closes the connection (EOF) instead of hanging or crashing.
        let _ = std::io::Read::read_to_end(&mut s, &mut rest);
    }
    let ha = a.create(MB2, 0);
    let t = a.export(ha);
    assert!(b.import(&t).is_ok());
    match a.call(Request::Hello {
        tool_version: "test".into(),
    }) {
        Response::Hello(h) => {
            assert_eq!(h.ns_pid, a.pid());
            assert_eq!(h.driver_version, 13000);
            assert_eq!(h.shim_sha256.len(), 64);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_tool_of_another_protocol_version_gets_an_answer_in_ours() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    let mut frame = protocol::message::encode_request(&Request::Hello {
        tool_version: "9.0.0".into(),
    });
    let theirs = protocol::message::PROTOCOL_VERSION + 1;
    frame[4..6].copy_from_slice(&theirs.to_le_bytes());
    let mut s = std::os::unix::net::UnixStream::connect(a.rt.config().socket_of(a.pid())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&frame).unwrap();
    // A tool of that version reads this header, sees our version and reports the mismatch.
    let mut header = [0u8; protocol::message::HEADER_LEN];
    s.read_exact(&mut header).unwrap();
    let header = protocol::FrameHeader::decode(&header).unwrap();
    assert_eq!(header.version, protocol::message::PROTOCOL_VERSION);
    let mut body = vec![0u8; header.length as usize];
    s.read_exact(&mut body).unwrap();
    match protocol::message::decode_response(&header, &body).unwrap() {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Denied);
            assert!(
                message.contains(&format!("protocol version {theirs}")),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Only that connection was refused.
    assert!(matches!(
        a.call(Request::Hello {
            tool_version: "test".into()
        }),
        Response::Hello(_)
    ));
}

#[test]
fn foreign_imports_unsupported_exports_ipc_and_multicast_are_blockers() {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    let raw_owner = Proc::new(dir.path());
    // A driver descriptor from "a process without the shim": the test driver's export itself.
    let h = raw_owner.create(MB2, 0);
    let real = raw_owner.rt.lock().real_of(VirtualHandle(h)).unwrap();
    let fd = testdriver::real().mem_export_fd(real, 0).unwrap();
    let foreign = a.import(&fd).unwrap();
    let va = a.map_new(foreign, MB2, 0);
    assert_eq!(
        a.rt.inspect().blockers,
        vec![Blocker::ForeignImport {
            serial: 1,
            size: MB2 as u64
        }]
    );
    // The application's descriptor was not closed by the import.
    assert!(rustix::fs::fstat(&fd).is_ok());
    assert_eq!(a.rt.mem_unmap(va, MB2), Ok(()));
    assert_eq!(a.release(foreign), CUresult::SUCCESS);
    assert!(a.rt.inspect().blockers.is_empty());
    // Legacy IPC and multicast.
    let ipc = a.rt.ipc_get_mem_handle(0xabc000).unwrap();
    let opened = a.rt.ipc_open_mem_handle(ipc, 1).unwrap();
    // A multicast object that can be shared as FABRIC too: refused (POSIX descriptors only).
    let prop = CUmulticastObjectProp {
        numDevices: 2,
        size: MB2,
        handleTypes: u64::from(handle_type::POSIX_FILE_DESCRIPTOR | handle_type::FABRIC),
        flags: 0,
    };
    let mc = a.rt.multicast_create(&prop).unwrap().0;
    assert!(a.rt.multicast_add_device(VirtualHandle(mc), 0).is_ok());
    let mem = a.create(MB2, 0);
    assert!(
        a.rt.multicast_bind_mem(VirtualHandle(mc), 0, VirtualHandle(mem), 0, MB2, 0)
            .is_ok()
    );
    assert_eq!(
        a.rt.inspect().blockers,
        vec![
            Blocker::MulticastHandleType {
                id: a.rt.inspect().multicasts[0].id,
                handle_types: prop.handleTypes
            },
            Blocker::LegacyIpcExport { address: 0xabc000 },
            Blocker::LegacyIpcImport { address: opened },
        ]
    );
    // Freeze refuses while they live, and changes nothing.
    match a.call(Request::Freeze { timeout_ms: 1000 }) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::WrongPhase);
            assert!(message.contains("multicast"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.rt.inspect().phase, Phase::Running);
    assert!(!a.rt.tracking.gate.is_frozen());
    assert!(a.rt.mem_free(0xabc000).is_ok());
    assert!(a.rt.ipc_close_mem_handle(opened).is_ok());
    assert_eq!(a.release(mc), CUresult::SUCCESS);
    assert!(a.rt.inspect().blockers.is_empty());
}

#[test]
fn a_phase_in_the_wrong_phase_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    let h = a.create(MB2, 0);
    a.map_new(h, MB2, 0);
    let _t = a.export(h);
    let before = a.rt.inspect();
    for request in [
        Request::Save,
        Request::Release,
        Request::Load,
        Request::Import,
    ] {
        match a.call(request) {
            Response::Error { code, .. } => assert_eq!(code, ErrorCode::WrongPhase),
            other => panic!("{other:?}"),
        }
    }
    // Thaw in Running has nothing to do (a rollback sends it to every survivor).
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert_eq!(a.rt.inspect(), before);
    assert_eq!(a.phase(Request::Freeze { timeout_ms: 1000 }), Phase::Frozen);
    match a.call(Request::Freeze { timeout_ms: 1000 }) {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::WrongPhase),
        other => panic!("{other:?}"),
    }
    // Thaw straight after Release would leave memory missing: refused.
    assert_eq!(a.phase(Request::Save), Phase::Saved);
    assert_eq!(a.phase(Request::Release), Phase::Released);
    match a.call(Request::Thaw) {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::WrongPhase),
        other => panic!("{other:?}"),
    }
    match a.call(Request::Import) {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::WrongPhase),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.phase(Request::Load), Phase::Loaded);
    assert_eq!(a.phase(Request::Load), Phase::Loaded);
    assert_eq!(a.phase(Request::Import), Phase::Imported);
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert_eq!(a.rt.inspect(), before);
}

/// A group where every process creates several allocations (mapped partially, twice, with several
/// access descriptors), exports them to every other, and imports and maps every other's.
struct Group {
    procs: Vec<Proc>,
    /// (process index, address, length, expected bytes)
    regions: Vec<(usize, u64, usize, Vec<u8>)>,
    /// (creator's address, an importer's address) of the same bytes.
    links: Vec<(u64, u64)>,
}

fn build_group(dir: &Path, n: usize) -> Group {
    let procs: Vec<Proc> = (0..n).map(|_| Proc::new(dir)).collect();
    let mut regions = Vec::new();
    let mut tickets = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        for k in 0..2usize {
            let size = (k + 2) * MB2;
            let h = p.create(size, (i % 2) as i32);
            // Mapped whole, with two devices' access set in two calls.
            let va = p.map_new(h, size, 0);
            p.access(va, size, &[(1, access_flags::PROT_READ)]);
            // Mapped a second time, partially (skipping the first 2 MiB).
            let va2 = p.reserve(size);
            p.map(va2, size - MB2, MB2, h);
            p.access(
                va2,
                size - MB2,
                &[
                    (0, access_flags::PROT_READWRITE),
                    (1, access_flags::PROT_READWRITE),
                ],
            );
            let bytes = pattern((i * 10 + k) as u8, size);
            write(va, &bytes);
            regions.push((i, va, size, bytes.clone()));
            regions.push((i, va2, size - MB2, bytes[MB2..].to_vec()));
            tickets.push((i, p.export(h), size, bytes, va));
        }
    }
    let mut links = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        for (owner, ticket, size, bytes, creator_va) in &tickets {
            if *owner == i {
                continue;
            }
            let h = p.import(ticket).unwrap();
            let va = p.map_new(h, *size, (i % 2) as i32);
            regions.push((i, va, *size, bytes.clone()));
            links.push((*creator_va, va));
        }
    }
    Group {
        procs,
        regions,
        links,
    }
}

fn check_contents(g: &Group) {
    for (i, va, len, bytes) in &g.regions {
        assert_eq!(&read(*va, *len), bytes, "process {i} at {va:#x}");
    }
}

fn suspend_and_resume(g: &Group) {
    cycle_with(g, Request::Save);
}

/// One suspend and resume whose Save is `save` (Save, or SaveKeepingContexts).
fn cycle_with(g: &Group, save: Request) {
    for request in [
        Request::Freeze { timeout_ms: 10_000 },
        save,
        Request::Release,
    ] {
        for p in &g.procs {
            p.phase(request.clone());
        }
    }
    // Released: no shared memory held anywhere, records unchanged.
    for p in &g.procs {
        let rec = p.rt.inspect();
        assert_eq!(rec.phase, Phase::Released);
        let reg = p.rt.lock();
        assert!(reg.objects().all(|(_, o)| o.real.is_none()));
        assert!(reg.mappings().all(|(_, m)| !m.mapped));
    }
    for request in [Request::Load, Request::Import, Request::Thaw] {
        for p in &g.procs {
            p.phase(request.clone());
        }
    }
}

fn group_round_trip(n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let g = build_group(dir.path(), n);
    check_contents(&g);
    let before: Vec<_> = g.procs.iter().map(|p| p.rt.inspect()).collect();
    let reals_before: Vec<cuda::DriverHandle> = g
        .procs
        .iter()
        .flat_map(|p| {
            p.rt.lock()
                .objects()
                .filter_map(|(_, o)| o.real)
                .collect::<Vec<_>>()
        })
        .collect();
    suspend_and_resume(&g);
    // Same records (ids, addresses, sizes, access), same contents, new driver handles.
    let after: Vec<_> = g.procs.iter().map(|p| p.rt.inspect()).collect();
    assert_eq!(after, before);
    check_contents(&g);
    for p in &g.procs {
        for (_, o) in p.rt.lock().objects() {
            assert!(!reals_before.contains(&o.real.unwrap()));
        }
    }
    // Writes after resume are visible both ways.
    for (k, (creator_va, importer_va)) in g.links.iter().enumerate() {
        let marker = [k as u8 ^ 0x5a; 8];
        write(*creator_va + 64 + 8 * k as u64, &marker);
        assert_eq!(read(*importer_va + 64 + 8 * k as u64, 8), marker);
        write(*importer_va + 4096 + 8 * k as u64, &marker);
        assert_eq!(read(*creator_va + 4096 + 8 * k as u64, 8), marker);
    }
    // A second cycle works too (carrier reused).
    let g2 = Group {
        procs: g.procs,
        regions: Vec::new(),
        links: Vec::new(),
    };
    suspend_and_resume(&g2);
    let again: Vec<_> = g2.procs.iter().map(|p| p.rt.inspect()).collect();
    assert_eq!(again, before);
}

#[test]
fn two_process_group_suspends_and_resumes() {
    group_round_trip(2);
}

#[test]
fn four_process_group_suspends_and_resumes() {
    group_round_trip(4);
}

#[test]
fn writes_after_resume_are_visible_to_the_importer() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Proc::new(dir.path()), Proc::new(dir.path()));
    let h = a.create(3 * MB2, 0);
    let va_a = a.map_new(h, 3 * MB2, 0);
    let hb = b.import(&a.export(h)).unwrap();
    let va_b = b.map_new(hb, 3 * MB2, 1);
    write(va_a, &pattern(1, 3 * MB2));
    let g = Group {
        procs: vec![a, b],
        regions: vec![],
        links: vec![],
    };
    suspend_and_resume(&g);
    assert_eq!(read(va_b, 3 * MB2), pattern(1, 3 * MB2));
    write(va_a + 10, b"after resume, a");
    assert_eq!(read(va_b + 10, 15), b"after resume, a");
    write(va_b + 100, b"after resume, b");
    assert_eq!(read(va_a + 100, 15), b"after resume, b");
}

#[test]
fn imports_of_imports_are_rebuilt_from_the_creator() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        Proc::new(dir.path()),
        Proc::new(dir.path()),
        Proc::new(dir.path()),
    );
    let h = a.create(MB2, 0);
    let va_a = a.map_new(h, MB2, 0);
    let hb = b.import(&a.export(h)).unwrap();
    // B passes the allocation on: its ticket names A.
    let hc = c.import(&b.export(hb)).unwrap();
    let va_c = c.map_new(hc, MB2, 0);
    assert_eq!(c.rt.inspect().imports[0].creator_ns_pid, a.pid());
    write(va_a, b"from a to c");
    let g = Group {
        procs: vec![a, b, c],
        regions: vec![],
        links: vec![],
    };
    suspend_and_resume(&g);
    assert_eq!(read(va_c, 11), b"from a to c");
    write(va_c, b"from c to a");
    assert_eq!(read(va_a, 11), b"from c to a");
}

#[test]
fn rollback_after_a_partial_release_rebuilds_and_thaws() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Proc::new(dir.path()), Proc::new(dir.path()));
    let h = a.create(MB2, 0);
    let va_a = a.map_new(h, MB2, 0);
    let hb = b.import(&a.export(h)).unwrap();
    let va_b = b.map_new(hb, MB2, 0);
    write(va_a, b"keep me");
    let before = (a.rt.inspect(), b.rt.inspect());
    for p in [&a, &b] {
        p.phase(Request::Freeze { timeout_ms: 10_000 });
        p.phase(Request::Save);
    }
    // The importer released, the creator did not (the tool died in between): the tool's rollback
    // sends Load, Import, Thaw to the survivors.
    b.phase(Request::Release);
    for request in [Request::Load, Request::Import, Request::Thaw] {
        for p in [&a, &b] {
            p.phase(request.clone());
        }
    }
    assert_eq!((a.rt.inspect(), b.rt.inspect()), before);
    assert_eq!(read(va_b, 7), b"keep me");
    // Rollback before anything was released: Thaw from Saved.
    a.phase(Request::Freeze { timeout_ms: 10_000 });
    a.phase(Request::Save);
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert_eq!(a.rt.inspect(), before.0);
    // The same rebuild sequence from Frozen (a Save that failed elsewhere) does nothing harmful.
    a.phase(Request::Freeze { timeout_ms: 10_000 });
    assert_eq!(a.phase(Request::Load), Phase::Loaded);
    assert_eq!(a.phase(Request::Import), Phase::Imported);
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert_eq!(a.rt.inspect(), before.0);
    assert_eq!(read(va_a, 7), b"keep me");
}

#[test]
fn frozen_tracked_calls_wait_for_thaw_and_untracked_state_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(Proc::new(dir.path()));
    let h = a.create(MB2, 0);
    a.phase(Request::Freeze { timeout_ms: 10_000 });
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let a = a.clone();
        std::thread::spawn(move || {
            let h2 = a.create(MB2, 0);
            tx.send(h2).unwrap();
        })
    };
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    assert_eq!(a.rt.inspect().calls_in_flight, 0);
    a.phase(Request::Thaw);
    let h2 = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    worker.join().unwrap();
    assert_ne!(h, h2);
    assert_eq!(a.rt.inspect().allocations.len(), 2);
}

#[test]
fn freeze_times_out_on_a_call_in_flight_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(Proc::new(dir.path()));
    let slow = {
        let a = a.clone();
        std::thread::spawn(move || a.create(testdriver::BLOCK_SIZE, 0))
    };
    testdriver::wait_blocked();
    assert_eq!(a.rt.inspect().calls_in_flight, 1);
    match a.call(Request::Freeze { timeout_ms: 100 }) {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::Timeout),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.rt.inspect().phase, Phase::Running);
    // Not frozen: other tracked calls go on.
    a.create(MB2, 0);
    testdriver::unblock();
    slow.join().unwrap();
    assert_eq!(a.rt.inspect().calls_in_flight, 0);
    assert_eq!(
        a.phase(Request::Freeze { timeout_ms: 10_000 }),
        Phase::Frozen
    );
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
}

#[test]
fn a_peer_with_another_uid_is_refused() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("not root: the uid refusal needs setuid and is tested by root runs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    let path = a.rt.config().socket_of(a.pid());
    // Let the other uid reach the socket at all, so that SO_PEERCRED is what refuses it.
    rustix::fs::chmod(dir.path(), rustix::fs::Mode::from_raw_mode(0o777)).unwrap();
    rustix::fs::chmod(&path, rustix::fs::Mode::from_raw_mode(0o777)).unwrap();
    use std::os::unix::process::CommandExt as _;
    // The other uid runs a copy of this test binary from the world-readable directory: the
    // checkout may sit under a directory it cannot traverse (a fresh clone in a 0700 mktemp -d).
    let exe = dir.path().join("uid-probe");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    rustix::fs::chmod(&exe, rustix::fs::Mode::from_raw_mode(0o755)).unwrap();
    let status = std::process::Command::new(exe)
        .args([
            "--exact",
            "tests::uid_probe_client",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CUINTERPOSE_TEST_PROBE", &path)
        .env("CUINTERPOSE_TEST_PROBE_PID", a.pid().to_string())
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Run by `a_peer_with_another_uid_is_refused` as another uid (does nothing otherwise).
#[test]
fn uid_probe_client() {
    let Some(path) = std::env::var_os("CUINTERPOSE_TEST_PROBE") else {
        return;
    };
    let mut conn = Connection::connect(Path::new(&path), Duration::from_secs(30)).unwrap();
    let reply = conn.call(&Request::GetFd {
        id: protocol::record::AllocationId([1; 16]),
    });
    match reply {
        Ok((Response::Error { code, .. }, None)) => assert_eq!(code, ErrorCode::Denied),
        // The shim may close before reading the request.
        Err(_) => {}
        Ok(other) => panic!("another uid got an answer: {other:?}"),
    }
}

/// The shim's fork child handler (crates/shim/src/process.rs registers the same).
extern "C" fn fork_child() {
    crate::instance::fork_child();
}

#[test]
#[allow(unsafe_code)] // the test forks, as an application does
fn a_child_forked_after_start_refuses_tracked_calls_and_leaves_the_parent_socket() {
    let real = testdriver::real();
    // SAFETY: registers a handler that only touches atomics.
    let registered = unsafe { libc::pthread_atfork(None, None, Some(fork_child)) };
    assert_eq!(registered, 0);
    real.init(0).unwrap();
    crate::instance::start_after_init(&real);
    let crate::instance::Active::Running(rt) = crate::instance::active() else {
        panic!("the global runtime did not start");
    };
    let path = rt.config().socket_of(rt.config().ns_pid);
    assert!(path.exists());
    // SAFETY: the child only reads atomics (what a hook does before it refuses a tracked call
    // with CUDA_ERROR_NOT_INITIALIZED) and leaves with _exit.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        let forked = matches!(crate::instance::active(), crate::instance::Active::Forked);
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(if forked { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child, writing a local.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
    // The parent's socket is still there and answers.
    assert!(path.exists());
    let mut conn = Connection::connect(&path, Duration::from_secs(30)).unwrap();
    match conn.call(&Request::Inspect).unwrap().0 {
        Response::Records(r) => assert_eq!(r.ns_pid, rt.config().ns_pid),
        other => panic!("{other:?}"),
    }
}

/// The code of a phase request that failed.
fn refused(p: &Proc, request: Request) -> ErrorCode {
    match p.call(request.clone()) {
        Response::Error { code, .. } => code,
        other => panic!("{request:?} on {} should fail: {other:?}", p.pid()),
    }
}

/// One creator with two shared allocations, mapped and filled: (handles, addresses, bytes).
fn two_shared(p: &Proc) -> Vec<(u64, u64, Vec<u8>)> {
    (0..2u8)
        .map(|k| {
            let h = p.create(MB2, 0);
            let va = p.map_new(h, MB2, 0);
            let bytes = pattern(40 + k, MB2);
            write(va, &bytes);
            drop(p.export(h));
            (h, va, bytes)
        })
        .collect()
}

#[test]
fn a_save_whose_copy_fails_leaves_the_process_frozen_with_everything_live_and_thaws() {
    let dir = tempfile::tempdir().unwrap();
    let real = crate::Real {
        cuMemcpyDtoHAsync_v2: testdriver::dtoh_async_fails,
        ..testdriver::real()
    };
    let a = Proc::with_driver(dir.path(), real);
    let allocs = two_shared(&a);
    let before = a.rt.inspect();
    a.phase(Request::Freeze { timeout_ms: 10_000 });
    assert_eq!(refused(&a, Request::Save), ErrorCode::Driver);
    // Nothing was saved, so nothing may be released; the rollback's Thaw brings it back as it was.
    assert_eq!(a.rt.inspect().phase, Phase::Frozen);
    assert!(a.rt.lock().objects().all(|(_, o)| o.carrier.is_none()));
    assert_eq!(refused(&a, Request::Release), ErrorCode::WrongPhase);
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert_eq!(a.rt.inspect(), before);
    for (_, va, bytes) in &allocs {
        assert_eq!(&read(*va, MB2), bytes);
    }
}

#[test]
fn a_release_that_fails_half_way_is_rebuilt_by_load_and_thaws() {
    let dir = tempfile::tempdir().unwrap();
    let real = crate::Real {
        cuMemRelease: testdriver::release_scripted,
        ..testdriver::real()
    };
    let a = Proc::with_driver(dir.path(), real);
    let allocs = two_shared(&a);
    let before = a.rt.inspect();
    a.phase(Request::Freeze { timeout_ms: 10_000 });
    a.phase(Request::Save);
    // The first allocation's driver handle goes, the second's release fails.
    testdriver::RELEASE.fail_after(1);
    assert_eq!(refused(&a, Request::Release), ErrorCode::Driver);
    {
        let reg = a.rt.lock();
        let live: Vec<bool> = allocs
            .iter()
            .map(|(h, ..)| reg.get(VirtualHandle(*h)).unwrap().real.is_some())
            .collect();
        assert_eq!(live, [false, true], "released exactly up to the failure");
    }
    // Thaw refuses while something released is not rebuilt; Load and Import repair it.
    assert_eq!(refused(&a, Request::Thaw), ErrorCode::WrongPhase);
    assert_eq!(a.phase(Request::Load), Phase::Loaded);
    assert_eq!(a.phase(Request::Import), Phase::Imported);
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert_eq!(a.rt.inspect(), before);
    for (_, va, bytes) in &allocs {
        assert_eq!(&read(*va, MB2), bytes);
    }
}

#[test]
fn a_load_that_fails_changes_nothing_published_and_a_second_load_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    let real = crate::Real {
        cuMemCreate: testdriver::create_scripted,
        ..testdriver::real()
    };
    let a = Proc::with_driver(dir.path(), real);
    let allocs = two_shared(&a);
    let before = a.rt.inspect();
    for request in [
        Request::Freeze { timeout_ms: 10_000 },
        Request::Save,
        Request::Release,
    ] {
        a.phase(request);
    }
    let held_by_driver = |a: &Proc| {
        let reg = a.rt.lock();
        allocs
            .iter()
            .filter(|(h, ..)| reg.get(VirtualHandle(*h)).unwrap().real.is_some())
            .count()
    };
    // The second allocation cannot be created again: the first, made already, is undone too.
    let made_before = testdriver::CREATED.lock().unwrap().len();
    testdriver::CREATE.fail_after(1);
    assert_eq!(refused(&a, Request::Load), ErrorCode::Driver);
    assert_eq!(held_by_driver(&a), 0, "nothing half-loaded is published");
    assert_eq!(a.rt.inspect().phase, Phase::Released);
    let made: Vec<u64> = testdriver::CREATED.lock().unwrap()[made_before..].to_vec();
    assert_eq!(made.len(), 1, "the first allocation was made again");
    assert!(
        fake().alloc_of(made[0]).is_none(),
        "and released when the second failed"
    );
    assert_eq!(refused(&a, Request::Thaw), ErrorCode::WrongPhase);
    // The tool's retry rebuilds from the carrier, which the failure left intact.
    assert_eq!(a.phase(Request::Load), Phase::Loaded);
    assert_eq!(held_by_driver(&a), 2);
    assert_eq!(a.phase(Request::Import), Phase::Imported);
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert_eq!(a.rt.inspect(), before);
    for (_, va, bytes) in &allocs {
        assert_eq!(&read(*va, MB2), bytes);
    }
}

#[test]
fn owned_mem_alloc_answers_as_cu_mem_alloc_and_survives_suspend_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::new(dir.path());
    // 3 MiB + 5 bytes: backed by 4 MiB (the test driver's granularity is 2 MiB).
    let requested = 3 * (1 << 20) + 5;
    let base = p.rt.mem_alloc(requested).unwrap();
    assert_eq!(p.rt.owned.len(), 1);
    // The range is the requested one, from the base and from inside.
    assert_eq!(p.rt.mem_address_range(base).unwrap(), (base, requested));
    assert_eq!(
        p.rt.mem_address_range(base + requested as u64 - 1).unwrap(),
        (base, requested)
    );
    // A created allocation, private until something shares it (no descriptor held for it), mapped
    // whole, with no application handle.
    {
        let reg = p.rt.lock();
        let objects: Vec<_> = reg.objects().collect();
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].1.size, 2 * MB2 as u64);
        assert_eq!(objects[0].1.refs, 0);
        assert!(objects[0].1.is_creation());
        assert!(!objects[0].1.is_shared_creation());
        let real = objects[0].1.real.unwrap();
        let f = fake();
        let aid = f.alloc_of(real.raw()).unwrap();
        assert_eq!(
            f.allocs[&aid].rdma, 1,
            "RDMA-capable where the device says so"
        );
        drop(f);
        let maps: Vec<_> = reg.mappings().collect();
        assert_eq!(maps.len(), 1);
        assert_eq!(maps[0].0, base);
    }
    let bytes = pattern(7, requested);
    write(base, &bytes);
    // Saved through carriers, released and rebuilt at the same address.
    let before = p.rt.inspect();
    let g = Group {
        procs: vec![p],
        regions: vec![(0, base, requested, bytes)],
        links: Vec::new(),
    };
    suspend_and_resume(&g);
    assert_eq!(g.procs[0].rt.inspect(), before);
    check_contents(&g);
    let p = &g.procs[0];
    assert_eq!(p.rt.mem_address_range(base).unwrap(), (base, requested));
    // No allocation handle, as for the driver's cuMemAlloc memory.
    assert_eq!(
        p.rt.mem_retain_any(base + 4096),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    // cuMemFree undoes everything: no record, no driver allocation at the address.
    p.rt.mem_free_any(base).unwrap();
    assert!(p.rt.owned.is_empty());
    assert_eq!(p.rt.lock().objects().count(), 0);
    assert!(fake().read(base, 1).is_none());
    // Zero bytes is refused as the driver refuses it; nothing is made.
    assert_eq!(p.rt.mem_alloc(0), Err(CUresult::ERROR_INVALID_VALUE));
    // A step the driver refuses (access here, the last one) is undone whole; its code comes back.
    let q = Proc::with_driver(
        dir.path(),
        crate::Real {
            cuMemSetAccess: testdriver::set_access_fails,
            ..testdriver::real()
        },
    );
    assert_eq!(q.rt.mem_alloc(MB2), Err(CUresult::ERROR_INVALID_DEVICE));
    assert!(q.rt.owned.is_empty());
    assert_eq!(q.rt.lock().objects().count(), 0);
    assert!(q.rt.inspect().reservations.is_empty());
    // The range whose access was refused is unmapped again.
    let (refused, size) = testdriver::REFUSED_ACCESS
        .lock()
        .unwrap()
        .take()
        .expect("the allocation reached cuMemSetAccess");
    assert!(!fake().mapped_in(refused, size));
}

/// A private creation (never exported, made without any shareable handle type) goes through the
/// carrier like a shared one: released before the native checkpoint would run, rebuilt at its
/// addresses with its access and contents, and not exported by the rebuild (no descriptor held).
#[test]
fn private_creations_are_saved_released_and_rebuilt_without_an_export() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::new(dir.path());
    let private = p.try_create(2 * MB2, 0, handle_type::NONE).unwrap();
    let va = p.map_new(private, 2 * MB2, 0);
    // A second, partial mapping at an offset, read-only for another device too.
    let va2 = p.reserve(MB2);
    p.map(va2, MB2, MB2, private);
    p.access(
        va2,
        MB2,
        &[
            (0, access_flags::PROT_READWRITE),
            (1, access_flags::PROT_READ),
        ],
    );
    let bytes = pattern(42, 2 * MB2);
    write(va, &bytes);
    let shared = p.create(MB2, 0);
    let shared_va = p.map_new(shared, MB2, 0);
    let shared_bytes = pattern(43, MB2);
    write(shared_va, &shared_bytes);
    drop(p.export(shared));
    let before = p.rt.inspect();
    assert_eq!(before.allocations.iter().filter(|a| !a.shared).count(), 1);
    let g = Group {
        procs: vec![p],
        regions: vec![
            (0, va, 2 * MB2, bytes.clone()),
            (0, va2, MB2, bytes[MB2..].to_vec()),
            (0, shared_va, MB2, shared_bytes),
        ],
        links: Vec::new(),
    };
    // suspend_and_resume checks that nothing is held in Released, private memory included.
    suspend_and_resume(&g);
    let p = &g.procs[0];
    assert_eq!(p.rt.inspect(), before);
    check_contents(&g);
    let private_id = before.allocations.iter().find(|a| !a.shared).unwrap().id;
    let shared_id = before.allocations.iter().find(|a| a.shared).unwrap().id;
    assert!(
        !p.rt.tracking.exports.contains(&private_id),
        "a private rebuild is not exported"
    );
    assert!(p.rt.tracking.exports.contains(&shared_id));
    // The rebuilt allocation has the recorded properties: still no shareable handle type.
    let real = p.rt.lock().real_of(VirtualHandle(private)).unwrap();
    let f = fake();
    let aid = f.alloc_of(real.raw()).unwrap();
    assert_eq!(f.allocs[&aid].prop.1, handle_type::NONE);
}

/// Pinned carriers through whole suspend/resume cycles of a group of two: contents intact every
/// cycle; with `never` the carrier stays pinned after thaw and the next cycle reuses it, with
/// `after-resume` it is unpinned at thaw and pinned again by the next Save.
#[test]
fn pinned_carriers_are_kept_or_given_back_by_the_release_policy() {
    use copy::{CarrierMode, CarrierPolicy, CarrierRelease, CopyConfig};
    let dir = tempfile::tempdir().unwrap();
    let g = build_group(dir.path(), 2);
    let policies = [CarrierRelease::Never, CarrierRelease::AfterResume];
    for (p, release) in g.procs.iter().zip(policies) {
        p.rt.capture.control().copy = CopyConfig {
            carrier: CarrierPolicy::Always(CarrierMode::Pinned),
            release,
            ..CopyConfig::default()
        };
    }
    // Each process created 2 + 3 allocations of 2 MiB: 10 MiB of carrier.
    let shared = 10 << 20;
    let mut bases = Vec::new();
    for cycle in 0..3 {
        suspend_and_resume(&g);
        check_contents(&g);
        for (i, (p, release)) in g.procs.iter().zip(policies).enumerate() {
            let control = p.rt.capture.control();
            assert_eq!(control.last.mode, CarrierMode::Pinned, "cycle {cycle}");
            assert_eq!(control.last.staged_fallbacks, 0);
            // Load's statistics are the last; the carrier of cycle 0 is the one used again.
            if cycle == 0 {
                bases.push(control.carrier.base());
            }
            assert_eq!(bases[i], control.carrier.base(), "cycle {cycle}");
            let expected = match release {
                CarrierRelease::Never => shared,
                CarrierRelease::AfterResume => 0,
            };
            assert_eq!(
                control.carrier.pinned(),
                expected,
                "cycle {cycle} {release:?}"
            );
        }
    }
}

/// The `auto` carrier: staged while every Save is followed by a native checkpoint, pinned by the
/// first keep-contexts Save and kept pinned for the cycles after it, of either kind.
#[test]
fn an_auto_carrier_is_pinned_by_the_first_cycle_that_keeps_its_contexts() {
    use copy::{CarrierMode, CarrierPolicy};
    let dir = tempfile::tempdir().unwrap();
    let g = build_group(dir.path(), 2);
    for p in &g.procs {
        assert_eq!(p.rt.capture.control().copy.carrier, CarrierPolicy::Auto);
    }
    let shared = 10 << 20;
    let cycles = [
        (Request::Save, CarrierMode::Staged, 0),
        (Request::Save, CarrierMode::Staged, 0),
        (Request::SaveKeepingContexts, CarrierMode::Pinned, shared),
        (Request::Save, CarrierMode::Pinned, shared),
    ];
    for (cycle, (save, mode, pinned)) in cycles.into_iter().enumerate() {
        cycle_with(&g, save);
        check_contents(&g);
        for p in &g.procs {
            let control = p.rt.capture.control();
            // Load's statistics are the last: it copied in the mode Save chose.
            assert_eq!(control.last.mode, mode, "cycle {cycle}");
            assert_eq!(control.last.staged_fallbacks, 0, "cycle {cycle}");
            assert_eq!(control.carrier.pinned(), pinned, "cycle {cycle}");
        }
    }
}

/// `PinCarrier` (`cuinterpose prepare --keep-contexts`): the carrier made as long as the Save
/// needs and pinned while the process runs, so that the first keep-contexts Save reuses it and
/// pins nothing; refused inside a capture and under a policy that never pins, nothing changed.
#[test]
fn a_carrier_pinned_ahead_is_reused_by_the_first_keep_contexts_save() {
    use copy::{CarrierMode, CarrierPolicy, CopyConfig};
    let dir = tempfile::tempdir().unwrap();
    let g = build_group(dir.path(), 2);
    let shared = 10 << 20;
    for p in &g.procs {
        match p.call(Request::PinCarrier) {
            Response::Prepared { pinned, .. } => assert_eq!(pinned, shared as u64),
            other => panic!("PinCarrier: {other:?}"),
        }
        assert_eq!(p.rt.capture.control().carrier.pinned(), shared);
        assert_eq!(p.rt.inspect().phase, Phase::Running);
    }
    check_contents(&g);
    cycle_with(&g, Request::SaveKeepingContexts);
    check_contents(&g);
    for p in &g.procs {
        let control = p.rt.capture.control();
        assert_eq!(control.last.mode, CarrierMode::Pinned);
        assert_eq!(control.carrier.pinned(), shared);
    }
    // Inside a capture: refused, the phase unchanged.
    let p = &g.procs[0];
    p.phase(Request::Freeze { timeout_ms: 10_000 });
    match p.call(Request::PinCarrier) {
        Response::Error { code, message } => {
            assert_eq!(code, protocol::ErrorCode::WrongPhase, "{message}");
        }
        other => panic!("PinCarrier while frozen: {other:?}"),
    }
    assert_eq!(p.rt.inspect().phase, Phase::Frozen);
    p.phase(Request::Thaw);
    // A policy that never pins: refused, and it says why.
    let q = &g.procs[1];
    q.rt.capture.control().copy = CopyConfig {
        carrier: CarrierPolicy::Always(CarrierMode::Staged),
        ..CopyConfig::default()
    };
    match q.call(Request::PinCarrier) {
        Response::Error { message, .. } => assert!(message.contains("staged"), "{message}"),
        other => panic!("PinCarrier under a staged policy: {other:?}"),
    }
    check_contents(&g);
}

/// A refused registration in pinned mode: the cycle copies staged (contents intact) and the
/// carrier holds nothing pinned.
#[test]
fn a_pinned_carrier_whose_registration_is_refused_copies_staged() {
    use copy::{CarrierMode, CarrierPolicy, CopyConfig};
    let dir = tempfile::tempdir().unwrap();
    let mut real = testdriver::real();
    real.cuMemHostRegister_v2 = testdriver::refuse_register;
    let p = Proc::with_driver(dir.path(), real);
    let q = Proc::new(dir.path());
    let h = p.create(4 * MB2, 0);
    let va = p.map_new(h, 4 * MB2, 0);
    let bytes = pattern(77, 4 * MB2);
    write(va, &bytes);
    let imported = q.import(&p.export(h)).unwrap();
    let qva = q.map_new(imported, 4 * MB2, 0);
    p.rt.capture.control().copy = CopyConfig {
        carrier: CarrierPolicy::Always(CarrierMode::Pinned),
        ..CopyConfig::default()
    };
    let g = Group {
        procs: vec![p, q],
        regions: vec![(0, va, 4 * MB2, bytes.clone()), (1, qva, 4 * MB2, bytes)],
        links: Vec::new(),
    };
    for _ in 0..2 {
        suspend_and_resume(&g);
        check_contents(&g);
        let control = g.procs[0].rt.capture.control();
        assert_eq!(control.last.mode, CarrierMode::Staged);
        assert_eq!(control.carrier.pinned(), 0);
    }
}

/// Legacy IPC of owned memory between two runtimes: the virtual handle, the opener's counted
/// mapping at the allocation's base (with the LAZY flag, access for its own device and the
/// allocation's), every refusal with the driver's code, and the mapping carried through a
/// suspend/resume like a ticket import.
#[test]
fn owned_memory_is_opened_through_virtual_ipc_handles() {
    use protocol::ipc::IpcHandle;
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    let b = Proc::with_driver(
        dir.path(),
        crate::Real {
            cuCtxGetDevice: testdriver::ctx_device_1,
            ..testdriver::real()
        },
    );
    let requested = 3 * (1 << 20) + 5;
    let base = a.rt.mem_alloc(requested).unwrap();
    let bytes = pattern(9, requested);
    write(base, &bytes);
    let decode = |h: CUipcMemHandle| IpcHandle::decode(&h.reserved.map(|c| c as u8)).unwrap();
    let inner = a.rt.ipc_get_mem_handle(base + 4096).unwrap();
    let whole = a.rt.ipc_get_mem_handle(base).unwrap();
    assert_eq!(decode(inner).offset, 4096);
    assert_eq!(decode(whole).offset, 0);
    assert_eq!(decode(inner).creator_ns_pid, a.pid());
    assert_eq!(decode(inner).backing, 2 * MB2 as u64);
    // Nothing recorded at export, no blocker.
    assert!(a.rt.inspect().blockers.is_empty());
    // Refusals: flags other than LAZY, a malformed handle, the creator's own open.
    assert_eq!(
        b.rt.ipc_open_mem_handle(inner, 2),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    let mut garbled = inner;
    garbled.reserved[20] ^= 1;
    assert_eq!(
        b.rt.ipc_open_mem_handle(garbled, 1),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    assert_eq!(
        a.rt.ipc_open_mem_handle(inner, 1),
        Err(CUresult::ERROR_INVALID_CONTEXT)
    );
    // A creator that cannot be reached: the ticket import's code.
    let gone = IpcHandle {
        creator_ns_pid: 3_999_998,
        ..decode(inner)
    }
    .encode();
    let gone = CUipcMemHandle {
        reserved: gone.map(|b| b as core::ffi::c_char),
    };
    assert_eq!(
        b.rt.ipc_open_mem_handle(gone, 1),
        Err(CUresult::ERROR_INVALID_HANDLE)
    );
    assert!(b.rt.ipc.is_empty());
    assert_eq!(b.rt.lock().objects().count(), 0, "nothing left by failures");
    // Both handles name one allocation: one mapping at its base, counted twice.
    let opened = b.rt.ipc_open_mem_handle(inner, 1).unwrap();
    assert_eq!(b.rt.ipc_open_mem_handle(whole, 0).unwrap(), opened);
    assert_eq!(b.rt.ipc.len(), 1);
    assert_eq!(read(opened, requested), bytes);
    assert_eq!(
        b.rt.mem_address_range(opened + 100).unwrap(),
        (opened, requested)
    );
    assert_eq!(
        b.rt.mem_retain_any(opened),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    let rec = b.rt.inspect();
    assert_eq!(rec.imports.len(), 1);
    assert_eq!(rec.imports[0].creator_ns_pid, a.pid());
    let access: Vec<(i32, u32)> = rec.mappings[0]
        .access
        .iter()
        .map(|g| (g.location_id, g.flags))
        .collect();
    assert_eq!(
        access,
        [(0, 3), (1, 3)],
        "the caller's device 1 and, with LAZY, the allocation's device 0"
    );
    assert!(rec.blockers.is_empty());
    // Carried through suspend/resume: same address, the creator's bytes, writes both ways.
    let g = Group {
        procs: vec![a, b],
        regions: vec![
            (0, base, requested, bytes.clone()),
            (1, opened, requested, bytes),
        ],
        links: vec![(base, opened)],
    };
    let before: Vec<_> = g.procs.iter().map(|p| p.rt.inspect()).collect();
    suspend_and_resume(&g);
    let after: Vec<_> = g.procs.iter().map(|p| p.rt.inspect()).collect();
    assert_eq!(after, before);
    check_contents(&g);
    let fresh = pattern(10, requested);
    write(opened, &fresh);
    assert_eq!(read(base, requested), fresh);
    let b = &g.procs[1];
    // The first close keeps the mapping, the last unmaps it and frees the range.
    assert_eq!(b.rt.ipc_close_mem_handle(opened), Ok(()));
    assert_eq!(read(opened, 16), fresh[..16]);
    assert_eq!(b.rt.ipc_close_mem_handle(opened), Ok(()));
    assert!(b.rt.ipc.is_empty());
    let rec = b.rt.inspect();
    assert!(rec.imports.is_empty() && rec.mappings.is_empty() && rec.reservations.is_empty());
    assert_eq!(b.rt.lock().objects().count(), 0);
}

/// Context teardown: owned cuMemAlloc memory and IPC mappings made in a context go with it (a
/// destroyed context, the last counted release of a primary context, a primary context reset),
/// and only then.
#[test]
fn owned_memory_and_ipc_mappings_go_with_their_context() {
    let dir = tempfile::tempdir().unwrap();
    let in_primary = || crate::Real {
        cuCtxGetCurrent: testdriver::ctx_get_primary,
        cuCtxDestroy_v2: testdriver::ctx_destroy_ok,
        ..testdriver::real()
    };
    let a = Proc::with_driver(dir.path(), in_primary());
    let b = Proc::with_driver(dir.path(), in_primary());
    let primary = a.rt.primary_ctx_retain(0).unwrap();
    assert_eq!(primary as usize, 8);
    b.rt.primary_ctx_retain(0).unwrap();
    b.rt.primary_ctx_retain(0).unwrap();
    let base = a.rt.mem_alloc(MB2).unwrap();
    let kept = a.rt.mem_alloc(MB2).unwrap();
    let handle = a.rt.ipc_get_mem_handle(base).unwrap();
    let opened = b.rt.ipc_open_mem_handle(handle, 1).unwrap();
    // Destroying another context frees nothing of this one.
    a.rt.ctx_destroy(0x1234 as CUcontext).unwrap();
    assert_eq!(a.rt.owned.len(), 2);
    // One of two releases in the opener: still mapped; the last one closes the mapping.
    b.rt.primary_ctx_release(0).unwrap();
    assert_eq!(b.rt.ipc.len(), 1);
    assert_eq!(read(opened, 4), read(base, 4));
    b.rt.primary_ctx_release(0).unwrap();
    assert!(b.rt.ipc.is_empty());
    assert!(fake().read(opened, 1).is_none(), "unmapped in the opener");
    let rec = b.rt.inspect();
    assert!(rec.imports.is_empty() && rec.mappings.is_empty() && rec.reservations.is_empty());
    // A release the shim did not see retained frees nothing.
    b.rt.primary_ctx_release(0).unwrap();
    // The creator's last release frees both allocations, records and driver memory.
    assert_eq!(a.rt.owned.containing(kept).map(|(b, _)| b), Some(kept));
    a.rt.primary_ctx_release(0).unwrap();
    assert!(a.rt.owned.is_empty());
    assert_eq!(a.rt.lock().objects().count(), 0);
    assert!(a.rt.inspect().reservations.is_empty());
    assert!(fake().read(base, 1).is_none());
    // cuCtxDestroy of the context current at the allocation frees it too.
    let again = a.rt.mem_alloc(MB2).unwrap();
    a.rt.ctx_destroy(primary).unwrap();
    assert!(a.rt.owned.is_empty());
    assert!(fake().read(again, 1).is_none());
    // cuDevicePrimaryCtxReset frees the primary context's memory and keeps it retained: memory
    // made after it lives until the next teardown.
    a.rt.primary_ctx_retain(0).unwrap();
    let before_reset = a.rt.mem_alloc(MB2).unwrap();
    a.rt.primary_ctx_reset(0).unwrap();
    assert!(a.rt.owned.is_empty());
    assert!(fake().read(before_reset, 1).is_none());
    let after_reset = a.rt.mem_alloc(MB2).unwrap();
    a.rt.primary_ctx_reset(1).unwrap();
    assert_eq!(
        a.rt.owned.len(),
        1,
        "a reset of a device the shim saw no retain of"
    );
    a.rt.primary_ctx_release(0).unwrap();
    assert!(a.rt.owned.is_empty());
    assert!(fake().read(after_reset, 1).is_none());
}

/// Peer access: an enabled peer device is granted access to the context's owned allocations made
/// before and after the enable, the grants are rebuilt by a suspend/resume, and the disable takes
/// them back; a peer context the shim cannot place changes nothing.
#[test]
fn peer_access_is_granted_on_owned_memory_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::with_driver(
        dir.path(),
        crate::Real {
            cuCtxGetCurrent: testdriver::ctx_get_primary,
            cuDevicePrimaryCtxRetain: testdriver::primary_retain_per_device,
            cuCtxEnablePeerAccess: testdriver::peer_enable_ok,
            cuCtxDisablePeerAccess: testdriver::peer_disable_ok,
            ..testdriver::real()
        },
    );
    let own = p.rt.primary_ctx_retain(0).unwrap();
    let peer = p.rt.primary_ctx_retain(1).unwrap();
    assert_eq!((own as usize, peer as usize), (8, 9));
    let devices_at = |va: u64| -> Vec<i32> {
        let rec = p.rt.inspect();
        let m = rec.mappings.iter().find(|m| m.address == va).unwrap();
        m.access.iter().map(|a| a.location_id).collect()
    };
    let before = p.rt.mem_alloc(MB2).unwrap();
    assert_eq!(devices_at(before), [0]);
    // Unknown peer context: the driver's success stands, nothing granted.
    p.rt.ctx_enable_peer_access(0x4444 as CUcontext, 0).unwrap();
    assert_eq!(devices_at(before), [0]);
    p.rt.ctx_enable_peer_access(peer, 0).unwrap();
    assert_eq!(devices_at(before), [0, 1], "granted at the enable");
    let after = p.rt.mem_alloc(MB2).unwrap();
    assert_eq!(devices_at(after), [0, 1], "granted at the allocation");
    let bytes = pattern(3, MB2);
    write(after, &bytes);
    let g = Group {
        procs: vec![p],
        regions: vec![(0, after, MB2, bytes)],
        links: Vec::new(),
    };
    let recorded = g.procs[0].rt.inspect();
    suspend_and_resume(&g);
    assert_eq!(g.procs[0].rt.inspect(), recorded, "the grants are rebuilt");
    check_contents(&g);
    let p = &g.procs[0];
    p.rt.ctx_disable_peer_access(peer).unwrap();
    let devices_now = |va: u64| -> Vec<i32> {
        let rec = p.rt.inspect();
        let m = rec.mappings.iter().find(|m| m.address == va).unwrap();
        m.access.iter().map(|a| a.location_id).collect()
    };
    assert_eq!(devices_now(before), [0]);
    assert_eq!(devices_now(after), [0]);
    let later = p.rt.mem_alloc(MB2).unwrap();
    assert_eq!(devices_now(later), [0], "no grant after the disable");
}

/// A request the shim must refuse, with the message it gives.
fn refused_with(p: &Proc, request: Request) -> (ErrorCode, String) {
    match p.call(request.clone()) {
        Response::Error { code, message } => (code, message),
        other => panic!("{request:?} on {}: {other:?}", p.pid()),
    }
}

#[test]
fn multicast_objects_are_tracked_released_and_rebuilt_in_four_steps() {
    use protocol::MulticastStep;
    use protocol::record::BindTarget;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Proc::new(dir.path()), Proc::new(dir.path()));
    let prop = CUmulticastObjectProp {
        numDevices: 2,
        size: 2 * MB2,
        handleTypes: handle_type::POSIX_FILE_DESCRIPTOR.into(),
        flags: 0,
    };
    let mc = VirtualHandle(a.rt.multicast_create(&prop).unwrap().0);
    let ticket = a.export(mc.0);
    let mut bytes = [0u8; 48];
    rustix::io::pread(&ticket, &mut bytes, 0).unwrap();
    assert!(Ticket::decode(&bytes).unwrap().multicast);
    let mc_b = VirtualHandle(b.import(&ticket).unwrap());
    assert_eq!(a.rt.multicast_add_device(mc, 0), Ok(()));
    assert_eq!(b.rt.multicast_add_device(mc_b, 1), Ok(()));
    // a binds its member by handle, b by address (the v2 entry point, device explicit).
    let mem_a = a.create(MB2, 0);
    assert_eq!(
        a.rt.multicast_bind_mem(mc, 0, VirtualHandle(mem_a), 0, MB2, 0),
        Ok(())
    );
    let mem_b = b.create(2 * MB2, 1);
    let va_b = b.map_new(mem_b, 2 * MB2, 1);
    assert_eq!(
        b.rt.multicast_bind_addr_v2(mc_b, 1, MB2, va_b + MB2 as u64, MB2, 0),
        Ok(())
    );
    // Both map the multicast object.
    let mva_a = a.map_new(mc.0, 2 * MB2, 0);
    let mva_b = b.map_new(mc_b.0, 2 * MB2, 1);
    let (ra, rb) = (a.rt.inspect(), b.rt.inspect());
    assert!(ra.blockers.is_empty() && rb.blockers.is_empty());
    let (ma, mb) = (&ra.multicasts[0], &rb.multicasts[0]);
    assert_eq!(ma.id, mb.id);
    assert_eq!((ma.creator_ns_pid, mb.creator_ns_pid), (a.pid(), a.pid()));
    assert_eq!(
        (ma.num_devices, ma.size, ma.granularity),
        (2, 2 * MB2 as u64, 1 << 21)
    );
    assert!(ma.shared);
    assert_eq!((ma.devices.clone(), mb.devices.clone()), (vec![0], vec![1]));
    assert_eq!(
        ma.bindings[0].target,
        BindTarget::Memory {
            backing: Some(Backing::Created(ra.allocations[0].id)),
            offset: 0
        }
    );
    assert_eq!(
        (
            mb.bindings[0].device,
            mb.bindings[0].mc_offset,
            mb.bindings[0].target
        ),
        (
            1,
            MB2 as u64,
            BindTarget::Address {
                address: va_b + MB2 as u64
            }
        )
    );
    let mapped_at = |r: &protocol::record::ProcessRecord| {
        r.mappings
            .iter()
            .filter(|m| m.backing == Backing::Multicast(ma.id))
            .map(|m| (m.address, m.access.len()))
            .collect::<Vec<_>>()
    };
    assert_eq!(mapped_at(&ra), vec![(mva_a, 1)]);
    assert_eq!(mapped_at(&rb), vec![(mva_b, 1)]);

    let real_before = a.rt.lock().real_of(mc).unwrap();
    for request in [
        Request::Freeze { timeout_ms: 10_000 },
        Request::Save,
        Request::Release,
    ] {
        for p in [&a, &b] {
            p.phase(request.clone());
        }
    }
    // Released: no multicast object, binding or mapping held; the export cache is empty.
    for (p, h) in [(&a, mc), (&b, mc_b)] {
        let reg = p.rt.lock();
        assert!(reg.real_of(h).is_none());
        assert!(reg.mappings_of(h).iter().all(|(_, m)| !m.mapped));
        let Some(Kind::Multicast(info)) = reg.get(h).map(|o| &o.kind) else {
            panic!("not a multicast object")
        };
        assert!(info.bindings.iter().all(|bd| !bd.live));
        assert_eq!(info.added, 0);
    }
    assert!(!a.rt.tracking.exports.contains(&ma.id));
    // A multicast step before Import is refused; so is Thaw before the multicast steps.
    let early = refused_with(&a, Request::Multicast(MulticastStep::Create));
    assert_eq!(early.0, ErrorCode::WrongPhase);
    for request in [Request::Load, Request::Import] {
        for p in [&a, &b] {
            p.phase(request.clone());
        }
    }
    let (code, message) = refused_with(&b, Request::Thaw);
    assert_eq!(code, ErrorCode::WrongPhase);
    assert!(message.contains("multicast object"), "{message}");
    // Out of order: adding devices to an object not yet imported is refused, naming it.
    let (_, message) = refused_with(&b, Request::Multicast(MulticastStep::AddDevices));
    assert!(message.contains("not rebuilt"), "{message}");
    for step in MulticastStep::ALL {
        for p in [&a, &b] {
            p.phase(Request::Multicast(step));
        }
    }
    for p in [&a, &b] {
        p.phase(Request::Thaw);
    }
    assert_eq!(a.rt.inspect(), ra);
    assert_eq!(b.rt.inspect(), rb);
    let real_after = a.rt.lock().real_of(mc).unwrap();
    assert_ne!(real_after, real_before);
    assert!(a.rt.tracking.exports.contains(&ma.id));
    // The application's calls go on: unbind is recorded, release ends the object.
    assert_eq!(b.rt.multicast_unbind(mc_b, 1, MB2, MB2), Ok(()));
    assert!(b.rt.inspect().multicasts[0].bindings.is_empty());
}

/// Release gives the context's stack back (zero) as its last step, in cycles with and without
/// a native checkpoint; Thaw puts back the application's value, once, and the next cycle does
/// the same again. (Release, Load, Import, Thaw with no native pair between them is also the
/// rollback of a capture that failed before the native lock.)
#[test]
fn the_context_stack_is_given_back_from_release_to_thaw() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::with_driver(
        dir.path(),
        crate::Real {
            cuCtxGetLimit: testdriver::stack_get,
            cuCtxSetLimit: testdriver::stack_set,
            ..testdriver::real()
        },
    );
    let h = p.create(2 * MB2, 0);
    let va = p.map_new(h, 2 * MB2, 0);
    let bytes = pattern(61, 2 * MB2);
    write(va, &bytes);
    let g = Group {
        procs: vec![p],
        regions: vec![(0, va, 2 * MB2, bytes)],
        links: Vec::new(),
    };
    let p = &g.procs[0];
    for save in [Request::Save, Request::SaveKeepingContexts, Request::Save] {
        testdriver::STACK.lock().unwrap().1.clear();
        for request in [Request::Freeze { timeout_ms: 10_000 }, save.clone()] {
            p.phase(request);
        }
        assert!(
            testdriver::STACK.lock().unwrap().1.is_empty(),
            "{save:?}: kept until Release"
        );
        p.phase(Request::Release);
        assert_eq!(
            testdriver::STACK.lock().unwrap().0,
            0,
            "{save:?}: given back by Release"
        );
        p.phase(Request::Load);
        assert_eq!(
            testdriver::STACK.lock().unwrap().0,
            0,
            "{save:?}: not before Import"
        );
        p.phase(Request::Import);
        assert_eq!(
            testdriver::STACK.lock().unwrap().1,
            vec![0, 4096],
            "{save:?}: set to zero once, then back to the application's value by Import"
        );
        p.phase(Request::Thaw);
        assert_eq!(
            testdriver::STACK.lock().unwrap().1,
            vec![0, 4096],
            "{save:?}: not set again by Thaw"
        );
        check_contents(&g);
    }
    assert!(p.rt.capture.control().shrunk_stacks.is_empty());
}

fn drain_report(response: Response) -> protocol::message::DrainReport {
    match response {
        Response::Drain(report) => report,
        other => panic!("{other:?}"),
    }
}

#[test]
fn hold_closes_both_gates_drain_waits_and_thaw_opens_them() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(Proc::new(dir.path()));
    let held = drain_report(a.call(Request::Hold));
    assert!(!held.drained);
    assert!(a.rt.inspect().gate.closed);
    // A tracked call now waits at its gate.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let waiter = {
        let a = a.clone();
        std::thread::spawn(move || {
            let h = a.create(MB2, 0);
            done_tx.send(h).unwrap();
        })
    };
    assert!(done_rx.recv_timeout(Duration::from_millis(200)).is_err());
    let drained = drain_report(a.call(Request::Drain { wait_ms: 5_000 }));
    assert!(drained.drained, "{drained:?}");
    assert!(drained.busy.is_empty());
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    assert!(!a.rt.inspect().gate.closed);
    done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    waiter.join().unwrap();
}

#[test]
fn drain_before_hold_and_hold_outside_running_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    match a.call(Request::Drain { wait_ms: 10 }) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::Internal);
            assert!(message.contains("before Hold"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        a.phase(Request::Freeze { timeout_ms: 10_000 }),
        Phase::Frozen
    );
    match a.call(Request::Hold) {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::WrongPhase),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
}

#[test]
fn a_second_tool_is_refused_while_a_capture_holds_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    a.create(MB2, 0);
    assert_eq!(
        a.phase(Request::Freeze { timeout_ms: 10_000 }),
        Phase::Frozen
    );
    let path = a.rt.config().socket_of(a.pid());
    let mut other = Connection::connect(&path, Duration::from_secs(30)).unwrap();
    for request in [Request::Save, Request::Thaw, Request::Hold] {
        match other.call(&request).unwrap().0 {
            Response::Error { code, message } => {
                assert_eq!(code, ErrorCode::Busy, "{request:?}");
                assert!(message.contains("another cuinterpose run"), "{message}");
            }
            reply => panic!("{request:?}: {reply:?}"),
        }
    }
    // Reading is never refused.
    assert!(matches!(
        other.call(&Request::Inspect).unwrap().0,
        Response::Records(_)
    ));
    assert_eq!(a.rt.inspect().phase, Phase::Frozen);
    // Out of the capture, the lease is free for the next run.
    assert_eq!(a.phase(Request::Thaw), Phase::Running);
    match other
        .call(&Request::Freeze { timeout_ms: 10_000 })
        .unwrap()
        .0
    {
        Response::PhaseDone { phase, .. } => assert_eq!(phase, Phase::Frozen),
        reply => panic!("{reply:?}"),
    }
    match other.call(&Request::Thaw).unwrap().0 {
        Response::PhaseDone { phase, .. } => assert_eq!(phase, Phase::Running),
        reply => panic!("{reply:?}"),
    }
}

fn wait_for_phase(p: &Proc, phase: Phase) {
    for _ in 0..500 {
        let record = p.rt.inspect();
        if record.phase == phase && record.gate.closed == (phase != Phase::Running) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("never reached {phase:?}: {:?}", p.rt.inspect().phase);
}

#[test]
fn a_tool_lost_before_anything_was_released_leaves_nothing_frozen() {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    let h = a.create(MB2, 0);
    let va = a.map_new(h, MB2, 0);
    write(va, b"kept");
    // After Hold, after Freeze, after Save: the tool is killed (its connection ends).
    for steps in [
        &[Request::Hold][..],
        &[Request::Hold, Request::Freeze { timeout_ms: 10_000 }],
        &[Request::Freeze { timeout_ms: 10_000 }, Request::Save],
    ] {
        for request in steps {
            a.call(request.clone());
        }
        a.drop_tool();
        wait_for_phase(&a, Phase::Running);
        // Tracked calls go on at once, and the memory is the application's as it was.
        let more = a.create(MB2, 0);
        assert_eq!(a.release(more), CUresult::SUCCESS);
        assert_eq!(read(va, 4), b"kept");
    }
}

#[test]
fn a_tool_lost_after_release_leaves_the_process_suspended_for_resume() {
    let dir = tempfile::tempdir().unwrap();
    let a = Proc::new(dir.path());
    let h = a.create(MB2, 0);
    let va = a.map_new(h, MB2, 0);
    write(va, b"carried");
    for request in [
        Request::Freeze { timeout_ms: 10_000 },
        Request::Save,
        Request::Release,
    ] {
        a.call(request);
    }
    a.drop_tool();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.rt.inspect().phase, Phase::Released);
    assert!(a.rt.inspect().gate.closed);
    // A new run (a new connection) takes the lease and resumes.
    for request in [Request::Load, Request::Import, Request::Thaw] {
        a.phase(request);
    }
    assert_eq!(a.rt.inspect().phase, Phase::Running);
    assert_eq!(read(va, 7), b"carried");
}
