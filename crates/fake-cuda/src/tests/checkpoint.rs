//! The checkpoint API across processes: a "tool" peer drives a "target" peer through its agent
//! socket. The round trip restores bytes at the same addresses (onto swapped devices); the state
//! machine refuses every other order; a lock blocks application calls until unlock.

use std::time::Duration;

use cuda_abi::{CUcheckpointLockArgs, CUcheckpointRestoreArgs, CUresult, process_state};

use super::*;
use crate::exports as x;

/// The tool role: runs checkpoint commands from the test until stdin closes.
pub(crate) fn tool_loop() {
    assert_eq!(init(), SUCCESS);
    loop {
        let line = hear();
        if line.is_empty() {
            return;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let pid = words.get(1).map_or(0, |w| num(w) as i32);
        let rc = |r: CUresult| say(&format!("rc {}", r.0));
        match words[0] {
            "lock" => rc(lock(pid, num(words[2]) as u32)),
            "checkpoint" => rc(checkpoint(pid)),
            "restore" => {
                let pairs: Vec<([u8; 16], [u8; 16])> = words[2..]
                    .iter()
                    .map(|p| {
                        let (a, b) = p.split_once(':').unwrap();
                        (uuid(num(a) as i32), uuid(num(b) as i32))
                    })
                    .collect();
                rc(restore(pid, &pairs));
            }
            "restore-unknown" => rc(restore(pid, &[([0xee; 16], uuid(0))])),
            "unlock" => rc(unlock(pid)),
            "state" => match state(pid) {
                Ok(s) => say(&format!("rc 0 {s}")),
                Err(e) => rc(e),
            },
            "tid" => {
                let mut tid = 0;
                let r = cu!(x::cuCheckpointProcessGetRestoreThreadId(pid, &mut tid));
                say(&format!("rc {} {tid}", r.0));
            }
            "usage" => say(&format!("rc 0 {}", usage(pid, -1))),
            "fds" => say(&format!("rc 0 {}", fake_fds(pid).len())),
            "badargs" => {
                let mut lock_args = CUcheckpointLockArgs {
                    reserved0: 1,
                    ..Default::default()
                };
                let a = cu!(x::cuCheckpointProcessLock(pid, &mut lock_args));
                let mut restore_args = CUcheckpointRestoreArgs {
                    gpuPairsCount: 1,
                    ..Default::default()
                };
                let b = cu!(x::cuCheckpointProcessRestore(pid, &mut restore_args));
                let c = cu!(x::cuCheckpointProcessGetState(pid, std::ptr::null_mut()));
                let bad = CUresult::ERROR_INVALID_VALUE;
                assert_eq!((a, b, c), (bad, bad, bad));
                rc(SUCCESS);
            }
            other => panic!("unknown tool command {other}"),
        }
    }
}

/// The test's handle on a tool peer.
#[derive(Debug)]
pub(crate) struct Tool(pub Peer);

impl Tool {
    pub(crate) fn spawn(test: &str, dir: &StateDir, env: &[(&str, &str)]) -> Tool {
        Tool(Peer::spawn(test, "tool", dir, env))
    }

    fn run(&mut self, cmd: &str) -> (CUresult, u64) {
        self.0.send(cmd);
        let reply = self.0.expect("rc");
        let mut it = reply.split_whitespace();
        let code = CUresult(num(it.next().unwrap()) as u32);
        (code, it.next().map_or(0, num))
    }

    pub(crate) fn lock(&mut self, pid: i32, timeout_ms: u32) -> CUresult {
        self.run(&format!("lock {pid} {timeout_ms}")).0
    }
    pub(crate) fn checkpoint(&mut self, pid: i32) -> CUresult {
        self.run(&format!("checkpoint {pid}")).0
    }
    /// Restores with GPU pairs given as (old ordinal, new ordinal).
    pub(crate) fn restore(&mut self, pid: i32, pairs: &[(u32, u32)]) -> CUresult {
        let pairs: Vec<String> = pairs.iter().map(|(a, b)| format!("{a}:{b}")).collect();
        self.run(&format!("restore {pid} {}", pairs.join(" "))).0
    }
    pub(crate) fn unlock(&mut self, pid: i32) -> CUresult {
        self.run(&format!("unlock {pid}")).0
    }
    pub(crate) fn state(&mut self, pid: i32) -> Result<u32, CUresult> {
        match self.run(&format!("state {pid}")) {
            (SUCCESS, s) => Ok(s as u32),
            (e, _) => Err(e),
        }
    }
    /// Device memory `pid` uses, all devices.
    pub(crate) fn usage(&mut self, pid: i32) -> u64 {
        self.run(&format!("usage {pid}")).1
    }
    /// How many descriptors of the fake `pid` holds (memfds, usage file).
    pub(crate) fn fds(&mut self, pid: i32) -> u64 {
        self.run(&format!("fds {pid}")).1
    }
    /// Lock and checkpoint, both expected to succeed.
    pub(crate) fn suspend(&mut self, pid: i32) {
        assert_eq!(self.lock(pid, 0), SUCCESS);
        assert_eq!(self.checkpoint(pid), SUCCESS);
        assert_eq!(self.state(pid), Ok(process_state::CHECKPOINTED));
        assert_eq!(
            self.usage(pid),
            0,
            "a checkpointed process holds no device memory"
        );
        assert_eq!(self.fds(pid), 0, "and no descriptor of the fake");
    }
    /// Restore in place and unlock, both expected to succeed.
    pub(crate) fn resume(&mut self, pid: i32) {
        assert_eq!(self.restore(pid, &[]), SUCCESS);
        assert_eq!(self.state(pid), Ok(process_state::LOCKED));
        assert_eq!(self.unlock(pid), SUCCESS);
        assert_eq!(self.state(pid), Ok(process_state::RUNNING));
    }
    pub(crate) fn finish(self) {
        self.0.finish();
    }
}

/// The protection of the mapping that contains `addr` in `pid` ("rw-s", "---p", ...).
fn perms_at(pid: i32, addr: u64) -> String {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for line in maps.lines() {
        let mut cols = line.split_whitespace();
        let range = cols.next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        if a <= addr && addr < b {
            return cols.next().unwrap().to_owned();
        }
    }
    panic!("{addr:#x} is not mapped in {pid}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const ROUND_TRIP: &str = "tests::checkpoint::round_trip_restores_bytes_at_the_same_addresses";

#[test]
fn round_trip_restores_bytes_at_the_same_addresses() {
    match role(ROUND_TRIP).as_deref() {
        Some("tool") => return tool_loop(),
        Some("target") => {
            init_ctx(0);
            let me = std::process::id() as i32;
            let (h0, va0) = vmm_buffer(2 * GRAN, 0, POSIX);
            let (h1, va1) = vmm_buffer(GRAN, 1, 0);
            let legacy = alloc(3 * MIB).unwrap();
            let mut pinned = std::ptr::null_mut();
            assert_eq!(cu!(x::cuMemHostAlloc(&mut pinned, 4096, 0)), SUCCESS);
            // SAFETY: 4096 bytes of pinned memory are ours.
            unsafe { pinned.cast::<u8>().write_bytes(0x5a, 4096) };
            // A sparse allocation: bytes at both ends only.
            assert_eq!(write(va0, &pattern(1000, 1)), SUCCESS);
            assert_eq!(
                write(va0 + 2 * GRAN as u64 - 1000, &pattern(1000, 2)),
                SUCCESS
            );
            assert_eq!(write(va1 + 12345, &pattern(5000, 3)), SUCCESS);
            assert_eq!(write(legacy, &pattern(3 * MIB, 4)), SUCCESS);
            let before = (usage(me, 0), usage(me, 1));
            say(&format!("addrs {va0:#x} {va1:#x} {legacy:#x}"));
            wait_for("verify");
            // Same addresses, same bytes; the machine's devices swapped by the GPU pairs, the
            // process's ordinals unchanged (ordinal 0 is now the machine's device 1).
            assert_eq!(read(va0, 1000).unwrap(), pattern(1000, 1));
            assert_eq!(read(va0 + 1000, 1000).unwrap(), vec![0; 1000]);
            assert_eq!(
                read(va0 + 2 * GRAN as u64 - 1000, 1000).unwrap(),
                pattern(1000, 2)
            );
            assert_eq!(read(va1 + 12345, 5000).unwrap(), pattern(5000, 3));
            assert_eq!(read(legacy, 3 * MIB).unwrap(), pattern(3 * MIB, 4));
            // SAFETY: byte 4095 of the 4096 pinned bytes, which stayed ordinary memory.
            let last = unsafe { pinned.cast::<u8>().add(4095) };
            // SAFETY: as above, in bounds and ours.
            assert_eq!(unsafe { *last }, 0x5a);
            let mut p = cuda_abi::CUmemAllocationProp::default();
            assert_eq!(
                cu!(x::cuMemGetAllocationPropertiesFromHandle(&mut p, h0)),
                SUCCESS
            );
            assert_eq!(p.location.id, 0, "still the process's device 0");
            assert_eq!(
                uuid(0),
                crate::device::uuid_of(1),
                "which is the machine's device 1"
            );
            assert_eq!(uuid(1), crate::device::uuid_of(0));
            assert_eq!(get_access(va0, 0), Ok(u64::from(RW)), "access as before");
            assert_eq!(get_access(va0, 1), Ok(0));
            assert_eq!(
                (usage(me, 1), usage(me, 0)),
                before,
                "the machine's accounting follows the memory"
            );
            let mut dev = -1;
            assert_eq!(cu!(x::cuCtxGetDevice(&mut dev)), SUCCESS);
            assert_eq!(dev, 0, "the context is on the process's device 0");
            // Everything keeps working: writes, exports, unmaps, frees.
            assert_eq!(write(va1, b"after"), SUCCESS);
            assert!(export_fd(h0).is_ok());
            assert_eq!(unmap(va0, 2 * GRAN), SUCCESS);
            assert_eq!(release(h0), SUCCESS);
            assert_eq!(release(h1), SUCCESS);
            assert_eq!(free(legacy), SUCCESS);
            say("verified");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(ROUND_TRIP);
    let mut target = Peer::spawn(ROUND_TRIP, "target", &dir, &[]);
    let addrs = target.expect("addrs");
    let addrs: Vec<u64> = addrs.split_whitespace().map(num).collect();
    let pid = target.pid();
    let mut tool = Tool::spawn(ROUND_TRIP, &dir, &[]);
    let held = tool.usage(pid);
    assert_eq!(held, (3 * GRAN + 4 * MIB) as u64);
    assert!(tool.fds(pid) > 0);
    assert_eq!(perms_at(pid, addrs[0]), "rw-s");
    tool.suspend(pid);
    for &a in &addrs {
        assert_eq!(
            perms_at(pid, a),
            "---p",
            "the range stays reserved, inaccessible"
        );
    }
    assert_eq!(tool.restore(pid, &[(0, 1), (1, 0)]), SUCCESS);
    assert_eq!(tool.state(pid), Ok(process_state::LOCKED));
    assert_eq!(tool.usage(pid), held);
    assert_eq!(perms_at(pid, addrs[0]), "rw-s");
    assert_eq!(tool.unlock(pid), SUCCESS);
    target.send("verify");
    target.expect("verified");
    target.finish();
    tool.finish();
}

const STATES: &str = "tests::checkpoint::state_machine_refuses_other_orders";

#[test]
fn state_machine_refuses_other_orders() {
    match role(STATES).as_deref() {
        Some("tool") => return tool_loop(),
        Some("target") => {
            init_ctx(0);
            let (_, va) = vmm_buffer(GRAN, 0, 0);
            assert_eq!(write(va, b"kept"), SUCCESS);
            say("ready");
            wait_for("verify");
            assert_eq!(read(va, 4).unwrap(), b"kept");
            say("verified");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let illegal = CUresult::ERROR_ILLEGAL_STATE;
    let dir = StateDir::new(STATES);
    let mut target = Peer::spawn(STATES, "target", &dir, &[]);
    target.expect("ready");
    let pid = target.pid();
    let mut tool = Tool::spawn(STATES, &dir, &[]);
    // Pids without a fake driver: none at all, this (uninitialised) test process, a bogus one.
    assert_eq!(tool.state(0), Err(CUresult::ERROR_INVALID_VALUE));
    assert_eq!(
        tool.state(std::process::id() as i32),
        Err(CUresult::ERROR_INVALID_VALUE)
    );
    assert_eq!(tool.state(0x3fff_fff0), Err(CUresult::ERROR_INVALID_VALUE));
    assert_eq!(tool.lock(0x3fff_fff0, 0), CUresult::ERROR_INVALID_VALUE);
    assert_eq!(tool.run(&format!("badargs {pid}")).0, SUCCESS);
    // RUNNING.
    assert_eq!(tool.state(pid), Ok(process_state::RUNNING));
    assert_eq!(tool.checkpoint(pid), illegal);
    assert_eq!(tool.restore(pid, &[]), illegal);
    assert_eq!(tool.unlock(pid), illegal);
    // LOCKED.
    assert_eq!(tool.lock(pid, 5000), SUCCESS);
    assert_eq!(tool.lock(pid, 5000), illegal);
    assert_eq!(tool.restore(pid, &[]), illegal);
    // CHECKPOINTED.
    assert_eq!(tool.checkpoint(pid), SUCCESS);
    assert_eq!(tool.checkpoint(pid), illegal);
    assert_eq!(tool.unlock(pid), illegal);
    assert_eq!(tool.lock(pid, 0), illegal);
    assert_eq!(
        tool.run(&format!("restore-unknown {pid}")).0,
        CUresult::ERROR_INVALID_VALUE
    );
    assert_eq!(
        tool.state(pid),
        Ok(process_state::CHECKPOINTED),
        "a bad restore changes nothing"
    );
    let (code, tid) = tool.run(&format!("tid {pid}"));
    assert_eq!(code, SUCCESS);
    assert!(
        std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists(),
        "the restore thread is a thread of the target"
    );
    tool.resume(pid);
    target.send("verify");
    target.expect("verified");
    target.finish();
    tool.finish();
}

const BLOCKS: &str = "tests::checkpoint::lock_blocks_application_calls_until_unlock";

#[test]
fn lock_blocks_application_calls_until_unlock() {
    match role(BLOCKS).as_deref() {
        Some("tool") => return tool_loop(),
        Some("target") => {
            assert_eq!(init(), SUCCESS);
            say("ready");
            wait_for("call");
            let caller = std::thread::spawn(|| {
                let mut n = 0;
                let r = cu!(x::cuDeviceGetCount(&mut n));
                say(&format!("returned {} {n}", r.0));
            });
            caller.join().unwrap();
            // Stay until the test is done: the unlock lets the call return, and exiting at
            // once could end the process before its agent has replied to the unlock.
            let _ = hear();
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(BLOCKS);
    let mut target = Peer::spawn(BLOCKS, "target", &dir, &[]);
    target.expect("ready");
    let pid = target.pid();
    let mut tool = Tool::spawn(BLOCKS, &dir, &[]);
    assert_eq!(tool.lock(pid, 0), SUCCESS);
    target.send("call");
    assert_eq!(
        target.recv_within(Duration::from_millis(500)),
        None,
        "the call waits while locked"
    );
    assert_eq!(tool.unlock(pid), SUCCESS);
    assert_eq!(target.expect("returned"), "0 2");
    target.finish();
    tool.finish();
}
