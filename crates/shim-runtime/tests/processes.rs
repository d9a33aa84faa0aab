//! Real processes: `cuinterpose-workload` with `libcuinterpose.so` preloaded on the fake driver,
//! sharing through tickets, and the capture phases driven through each process's control socket
//! as the tool drives them. Build first: `cargo build --workspace --all-targets`.

use protocol::record::{Backing, Phase, ProcessRecord};
use protocol::{Request, Response};
use std::path::PathBuf;
use std::time::Duration;
use testkit::{Group, TestEnv, Workload};
use transport::Connection;

const SIZE: u64 = 4 << 20;

fn env() -> TestEnv {
    TestEnv::fake()
        .expect("artifacts (build first: cargo build --workspace --all-targets)")
        .with_shim(true)
}

fn control(env: &TestEnv, w: &Workload) -> PathBuf {
    let ns = std::fs::read_link(format!("/proc/{}/ns/pid", w.pid())).expect("ns/pid link");
    let ns = ns.to_string_lossy();
    let inode = ns
        .strip_prefix("pid:[")
        .and_then(|l| l.strip_suffix(']'))
        .expect("pid:[inode]");
    env.control_dir()
        .join(format!("cuinterpose-{inode}-{}.sock", w.pid()))
}

/// The tests' tool connections, one per control socket, kept open as the tool keeps its own: a
/// capture's lease is held by the connection, and its end would undo a capture that released
/// nothing.
static TOOL: std::sync::Mutex<Vec<(std::path::PathBuf, Connection)>> =
    std::sync::Mutex::new(Vec::new());

fn call(env: &TestEnv, w: &Workload, request: Request) -> Response {
    let path = control(env, w);
    let mut tool = TOOL.lock().unwrap_or_else(|e| e.into_inner());
    let at = match tool.iter().position(|(p, _)| *p == path) {
        Some(at) => at,
        None => {
            let conn = Connection::connect(&path, Duration::from_secs(120)).unwrap_or_else(|e| {
                panic!("control socket of {}: {e}\n{}", w.name(), w.log_tail())
            });
            tool.push((path, conn));
            tool.len() - 1
        }
    };
    tool[at]
        .1
        .call(&request)
        .unwrap_or_else(|e| panic!("{request:?} to {}: {e}\n{}", w.name(), w.log_tail()))
        .0
}

fn inspect(env: &TestEnv, w: &Workload) -> ProcessRecord {
    match call(env, w, Request::Inspect) {
        Response::Records(r) => r,
        other => panic!("inspect {}: {other:?}", w.name()),
    }
}

fn phase_all(env: &TestEnv, g: &Group, request: Request) {
    for w in g.members() {
        match call(env, w, request.clone()) {
            Response::PhaseDone { .. } => {}
            other => panic!("{request:?} on {}: {other:?}\n{}", w.name(), w.log_tail()),
        }
    }
}

fn suspend(env: &TestEnv, g: &Group) {
    for request in [
        Request::Freeze { timeout_ms: 30_000 },
        Request::Save,
        Request::Release,
    ] {
        phase_all(env, g, request);
    }
}

fn resume(env: &TestEnv, g: &Group) {
    for request in [Request::Load, Request::Import, Request::Thaw] {
        phase_all(env, g, request);
    }
}

#[test]
fn a_pair_shares_both_ways_through_tickets_with_virtual_handles() {
    let env = env();
    let g = Group::sharing_pair(&env, SIZE).unwrap();
    g[0].ok("fill a0 5").unwrap();
    g[1].ok("verify a0 5").unwrap();
    g[1].ok("fill a1 6").unwrap();
    g[0].ok("verify a1 6").unwrap();
    g[1].ok("fill a0 7 --offset 4096 --len 4096 --pattern-offset 4096")
        .unwrap();
    g[0].ok("verify a0 7 --offset 4096 --len 4096 --pattern-offset 4096")
        .unwrap();
    // The application's handles are the shim's virtual ones (tag in the top 16 bits).
    let created = g[0]
        .ok(&format!("create extra {SIZE} --handle-types posix"))
        .unwrap();
    let handle = created.u64("handle").unwrap();
    assert_eq!(handle >> 48, 0xc1a5, "handle {handle:#x}");
    let r0 = inspect(&env, &g[0]);
    assert_eq!(r0.ns_pid, g[0].pid());
    assert_eq!(r0.allocations.len(), 2);
    assert_eq!(r0.allocations.iter().filter(|a| a.shared).count(), 1);
    assert_eq!(r0.imports.len(), 1);
    assert_eq!(r0.imports[0].creator_ns_pid, g[1].pid());
    let r1 = inspect(&env, &g[1]);
    assert_eq!(
        r1.imports[0].id,
        r0.allocations.iter().find(|a| a.shared).unwrap().id
    );
    assert!(
        r1.mappings
            .iter()
            .any(|m| matches!(m.backing, Backing::Imported(_)))
    );
    match call(
        &env,
        &g[0],
        Request::Hello {
            tool_version: "test".into(),
        },
    ) {
        Response::Hello(h) => {
            assert_eq!(h.ns_pid, g[0].pid());
            assert_eq!(h.shim_sha256.len(), 64);
        }
        other => panic!("{other:?}"),
    }
}

fn round_trip(n: usize) {
    let env = env();
    let g = Group::spawn(&env, n, |r| testkit::WorkloadOptions::new(format!("w{r}"))).unwrap();
    // A ring of shares plus, in each process, a second allocation sent the other way round the
    // ring and mapped twice there (the second time only in part).
    g.ring(SIZE).unwrap();
    for i in 0..n {
        g.create_shared(i, &format!("b{i}"), 2 * SIZE).unwrap();
        let to = (i + n - 1) % n;
        g.share(i, to, &format!("b{i}"), 2 * SIZE).unwrap();
        g[to]
            .all_ok(&[
                &format!("reserve r2-b{i} {SIZE}"),
                &format!("map b{i} r2-b{i} --alloc-offset {SIZE} --size {SIZE} --as b{i}-upper"),
                &format!("set-access b{i}-upper --device {}", g[to].device()),
            ])
            .unwrap();
    }
    for i in 0..n {
        g[i].ok(&format!("fill a{i} {}", 100 + i)).unwrap();
        g[i].ok(&format!("fill b{i} {}", 200 + i)).unwrap();
    }
    let before: Vec<ProcessRecord> = g.members().iter().map(|w| inspect(&env, w)).collect();
    suspend(&env, &g);
    // The group holds no device memory now (the fake driver's accounting), and its records still
    // describe everything.
    for (w, rec) in g.members().iter().zip(&before) {
        assert_eq!(
            env.fake_usage(w.pid(), w.device()).unwrap(),
            0,
            "{}",
            w.name()
        );
        let now = inspect(&env, w);
        assert_eq!(now.phase, Phase::Released);
        assert_eq!(now.mappings, rec.mappings);
    }
    resume(&env, &g);
    let after: Vec<ProcessRecord> = g.members().iter().map(|w| inspect(&env, w)).collect();
    assert_eq!(after, before);
    for i in 0..n {
        let next = (i + 1) % n;
        let previous = (i + n - 1) % n;
        g[next].ok(&format!("verify a{i} {}", 100 + i)).unwrap();
        g[previous].ok(&format!("verify b{i} {}", 200 + i)).unwrap();
        g[previous]
            .ok(&format!(
                "verify b{i}-upper {} --pattern-offset {SIZE}",
                200 + i
            ))
            .unwrap();
        // New writes, both ways.
        g[next].ok(&format!("fill a{i} {}", 50 + i)).unwrap();
        g[i].ok(&format!("verify a{i} {}", 50 + i)).unwrap();
        g[i].ok(&format!("fill b{i} {}", 60 + i)).unwrap();
        g[previous]
            .ok(&format!(
                "verify b{i}-upper {} --pattern-offset {SIZE}",
                60 + i
            ))
            .unwrap();
    }
}

#[test]
fn two_processes_suspend_and_resume_with_contents_and_addresses_intact() {
    round_trip(2);
}

#[test]
fn four_processes_suspend_and_resume_with_contents_and_addresses_intact() {
    round_trip(4);
}

#[test]
fn a_ticket_from_a_dead_creator_fails_cleanly() {
    let env = env();
    let g = Group::spawn(&env, 2, |r| testkit::WorkloadOptions::new(format!("w{r}"))).unwrap();
    g.create_shared(0, "a0", SIZE).unwrap();
    let peer = g[1].socket().display().to_string();
    g[0].ok(&format!("send-fd a0 --to {peer}")).unwrap();
    let mut members = g.into_members();
    let mut creator = members.remove(0);
    creator.kill();
    let importer = &members[0];
    importer
        .expect(
            &format!("import a0 --size {SIZE}"),
            "CUDA_ERROR_INVALID_HANDLE",
        )
        .unwrap();
    // The importer keeps working.
    importer
        .all_ok(&[
            &format!("create c {SIZE} --handle-types posix"),
            &format!("reserve r-c {SIZE}"),
            "map c r-c",
            "set-access c",
            "fill c 9",
            "verify c 9",
        ])
        .unwrap();
    assert!(inspect(&env, importer).imports.is_empty());
}

#[test]
fn an_import_of_an_import_names_the_creator_and_survives_suspend() {
    let env = env();
    let g = Group::spawn(&env, 3, |r| testkit::WorkloadOptions::new(format!("w{r}"))).unwrap();
    g.create_shared(0, "a0", SIZE).unwrap();
    g.share(0, 1, "a0", SIZE).unwrap();
    // The middle process passes its import on.
    g[1].all_ok(&["close-fd a0", "export a0"]).unwrap();
    g.share(1, 2, "a0", SIZE).unwrap();
    g[0].ok("fill a0 11").unwrap();
    g[2].ok("verify a0 11").unwrap();
    let r2 = inspect(&env, &g[2]);
    assert_eq!(r2.imports[0].creator_ns_pid, g[0].pid());
    // A phase out of order changes nothing.
    for request in [Request::Save, Request::Release] {
        match call(&env, &g[2], request) {
            Response::Error { code, .. } => assert_eq!(code, protocol::ErrorCode::WrongPhase),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(inspect(&env, &g[2]), r2);
    suspend(&env, &g);
    resume(&env, &g);
    g[2].ok("verify a0 11").unwrap();
    g[2].ok("fill a0 12").unwrap();
    g[0].ok("verify a0 12").unwrap();
    g[1].ok("verify a0 12").unwrap();
}

#[test]
fn malformed_frames_on_the_control_socket_leave_the_process_working() {
    use std::io::{Read, Write};
    let env = env();
    let g = Group::sharing_pair(&env, SIZE).unwrap();
    let path = control(&env, &g[0]);
    let oversized = protocol::FrameHeader {
        version: protocol::message::PROTOCOL_VERSION,
        kind: protocol::message::KIND_GET_FD,
        length: u32::MAX,
    }
    .encode();
    for junk in [
        &b"GET / HTTP/1.0\r\n\r\n"[..],
        &oversized[..],
        &[0u8; 3][..],
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(junk).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    g[0].ok("fill a0 3").unwrap();
    g[1].ok("verify a0 3").unwrap();
    assert_eq!(inspect(&env, &g[0]).allocations.len(), 1);
}

#[test]
fn the_control_socket_goes_away_with_its_process() {
    let env = env();
    let w = env.spawn(testkit::WorkloadOptions::new("w")).unwrap();
    let path = control(&env, &w);
    assert!(
        path.exists(),
        "{} missing\n{}",
        path.display(),
        w.log_tail()
    );
    let status = w.exit().unwrap();
    assert!(status.is_some_and(|s| s.success()));
    assert!(!path.exists(), "{} left behind", path.display());
}
