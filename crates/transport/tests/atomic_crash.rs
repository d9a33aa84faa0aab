//! Crash safety of `files::write_atomically`: a writer process is killed with SIGKILL at arbitrary
//! points while it replaces a state file over and over; after each kill the file must decode to
//! exactly one of the two states it alternates between. Also: a state file cut short on disk is
//! refused by the decoder.
//!
//! Runs without the libtest harness because the test binary re-executes itself as the writer.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cuinterpose_transport::files::{read_bounded, write_atomically};
use protocol::state::{self, CarrierInfo, GroupState, MAX_STATE_FILE_LEN, ParticipantState};
use protocol::{AllocationId, AllocationProps, AllocationRecord, Backing, MappingRecord};
use protocol::{Phase, ProcessRecord};

const CHILD_ENV: &str = "CUINTERPOSE_TEST_ATOMIC_WRITER";
const LIMIT: u64 = MAX_STATE_FILE_LEN;

/// A valid single-process state of a few megabytes, so that a write takes long enough for kills to
/// land in the middle of one; `tag` makes the two states differ everywhere.
fn state_of(tag: u8) -> GroupState {
    let id = AllocationId([tag; 16]);
    let record = ProcessRecord {
        ns_pid: 41,
        phase: Phase::Saved,
        allocations: vec![AllocationRecord {
            id,
            size: 1 << 30,
            props: AllocationProps {
                allocation_type: 1,
                requested_handle_types: 1,
                location_type: 1,
                location_id: 0,
                compression_type: 0,
                gpu_direct_rdma_capable: 0,
                usage: 0,
            },
            shared: true,
            live_handles: 1,
        }],
        imports: vec![],
        mappings: (0..100_000u64)
            .map(|i| MappingRecord {
                address: 0x7000_0000_0000 + (u64::from(tag) << 36) + i * 0x1000,
                size: 0x1000,
                offset: i * 0x1000,
                backing: Backing::Created(id),
                access: vec![],
            })
            .collect(),
        reservations: vec![],
        blockers: vec![],
        calls_in_flight: 0,
        multicasts: vec![],
        unowned: vec![],
        gate: Default::default(),
    };
    GroupState {
        created_unix_ms: u64::from(tag),
        tool_version: format!("writer-{tag}"),
        mode: Default::default(),
        participants: vec![ParticipantState {
            host_pid: 1041,
            ns_pid: 41,
            shim_sha256: "0f".repeat(32),
            record,
            carriers: vec![CarrierInfo { id, bytes: 1 << 30 }],
        }],
    }
}

/// The writer: alternates the two states forever, one line on stdout after each complete write.
fn writer(path: &Path) -> ! {
    let states = [state::encode(&state_of(1)), state::encode(&state_of(2))];
    let mut stdout = std::io::stdout();
    let mut n = 0usize;
    loop {
        write_atomically(path, &states[n % 2]).expect("write");
        writeln!(stdout, "{n}").expect("report");
        stdout.flush().expect("report");
        n += 1;
    }
}

fn check(ok: bool, what: String) {
    if !ok {
        eprintln!("atomic_crash: FAILED: {what}");
        println!("0 passed, 1 failed");
        std::process::exit(1);
    }
}

fn main() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        writer(&PathBuf::from(path));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(state::STATE_FILE_NAME);
    let a = state_of(1);
    let b = state_of(2);
    write_atomically(&path, &state::encode(&a)).expect("initial write");

    let rounds = 12;
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().expect("current exe"))
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn writer");
        // Kill after a varying number of complete writes, so the kill lands somewhere in the
        // next one (or between two).
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        for _ in 0..=(round % 4) {
            let line = lines.next();
            check(
                matches!(line, Some(Ok(_))),
                format!("round {round}: writer stopped early: {line:?}"),
            );
        }
        child.kill().expect("kill");
        child.wait().expect("wait");
        let bytes = read_bounded(&path, LIMIT).expect("read after kill");
        let decoded = state::decode(&bytes);
        check(
            decoded.as_ref() == Ok(&a) || decoded.as_ref() == Ok(&b),
            format!(
                "round {round}: after SIGKILL the file is neither state: {:?}",
                decoded.map(|s| s.tool_version)
            ),
        );
    }

    // Whatever the kills left behind are temporary files, never the target.
    let temps = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .count();
    eprintln!("atomic_crash: {rounds} kills, {temps} temporary files left by them");

    let full = read_bounded(&path, LIMIT).expect("read");
    for len in [0, 1, 23, 24, full.len() / 2, full.len() - 1] {
        std::fs::write(&path, &full[..len]).expect("truncate");
        let bytes = read_bounded(&path, LIMIT).expect("read truncated");
        check(
            state::decode(&bytes).is_err(),
            format!("a state file cut to {len} bytes was accepted"),
        );
    }
    println!("test atomic_publish_survives_sigkill ... ok");
    println!("1 passed, 0 failed");
}
