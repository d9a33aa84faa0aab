//! r580's fault model: queued work whose memory went (unmapped, released, freed) or that its
//! stream's device may not access poisons the process with a sticky
//! `CUDA_ERROR_ILLEGAL_ADDRESS`, found when the work executes, never a segfault; and the
//! checkpoint lock waits for queued work, times out on work that never ends, and refuses a
//! poisoned process.

use std::ffi::{c_char, c_int, c_void};
use std::time::{Duration, Instant};

use cuda_abi::{CUresult, process_state};

use super::checkpoint::{Tool, tool_loop};
use super::kernels::*;
use super::*;
use crate::exports as x;

const ILLEGAL: CUresult = CUresult::ERROR_ILLEGAL_ADDRESS;

/// After a fault: every call but the free ones returns the sticky error, and no worker is left.
fn assert_poisoned() {
    let mut n = 0;
    assert_eq!(cu!(x::cuDeviceGetCount(&mut n)), ILLEGAL);
    assert_eq!(alloc(MIB), Err(ILLEGAL));
    assert_eq!(cu!(x::cuCtxSynchronize()), ILLEGAL);
    assert_eq!(cu!(x::cuStreamQuery(std::ptr::null_mut())), ILLEGAL);
    assert_eq!(init(), ILLEGAL);
    assert_eq!(lock(std::process::id() as i32, 100), ILLEGAL);
    // The calls that work in any state still do.
    let mut name: *const c_char = std::ptr::null();
    assert_eq!(cu!(x::cuGetErrorName(ILLEGAL, &mut name)), SUCCESS);
    // SAFETY: cuGetErrorName gave a static NUL-terminated string.
    let name = unsafe { std::ffi::CStr::from_ptr(name) };
    assert_eq!(name.to_bytes(), b"CUDA_ERROR_ILLEGAL_ADDRESS");
    let mut version: c_int = 0;
    assert_eq!(cu!(x::cuDriverGetVersion(&mut version)), SUCCESS);
    let mut p: *mut c_void = std::ptr::null_mut();
    let r = cu!(x::cuGetProcAddress(c"cuInit".as_ptr(), &mut p, 13000, 0));
    assert_eq!((r, p.is_null()), (SUCCESS, false));
    workers_become(0);
}

isolated_test!(
    a_fill_on_unmapped_memory_is_a_sticky_illegal_address,
    &[],
    {
        init_ctx(0);
        let k = kernels();
        let (h, va) = vmm_buffer(GRAN, 0, 0);
        let s = new_stream();
        // Long enough that the unmap surely comes first, even on a loaded machine.
        sleep_ms(&k, s, 2000);
        assert_eq!(fill(&k, s, va, 16, 1), SUCCESS);
        assert_eq!(unmap(va, GRAN), SUCCESS, "the unmap itself succeeds");
        assert_eq!(sync(s), ILLEGAL);
        assert_eq!(release(h), ILLEGAL, "sticky");
        assert_poisoned();
    }
);

isolated_test!(
    a_kernel_on_released_memory_is_a_sticky_illegal_address,
    &[],
    {
        init_ctx(0);
        let k = kernels();
        let (h, va) = vmm_buffer(GRAN, 0, 0);
        let s = new_stream();
        let flag = alloc(MIB).unwrap();
        hold(&k, s, flag, 1);
        let args = [Arg::U64(va), Arg::U64(va + 64), Arg::U64(16)];
        assert_eq!(launch(k.copy, s, &args), SUCCESS);
        // Released, the mapping keeps the memory; unmapped, it is gone.
        assert_eq!(release(h), SUCCESS);
        assert_eq!(unmap(va, GRAN), SUCCESS);
        assert_eq!(address_free(va, GRAN), SUCCESS);
        release_hold(&k, new_stream(), flag, 1);
        assert_eq!(cu!(x::cuCtxSynchronize()), ILLEGAL);
        assert_poisoned();
    }
);

isolated_test!(a_kernel_on_freed_memory_is_a_sticky_illegal_address, &[], {
    init_ctx(0);
    let k = kernels();
    let buf = alloc(MIB).unwrap();
    let null = std::ptr::null_mut();
    let flag = alloc(MIB).unwrap();
    hold(&k, null, flag, 1);
    assert_eq!(fill(&k, null, buf, 16, 1), SUCCESS);
    assert_eq!(free(buf), SUCCESS);
    release_hold(&k, new_stream(), flag, 1);
    // A synchronous call waits for the queued work, and finds the fault.
    let other = [0u8; 4];
    assert_eq!(write(0x1000, &other), ILLEGAL);
    assert_poisoned();
});

isolated_test!(
    an_async_copy_to_freed_memory_is_a_sticky_illegal_address,
    &[],
    {
        init_ctx(0);
        let k = kernels();
        let buf = alloc(MIB).unwrap();
        let s = new_stream();
        let src = vec![7u8; 4096];
        let flag = alloc(MIB).unwrap();
        hold(&k, s, flag, 1);
        assert_eq!(
            cu!(x::cuMemcpyHtoDAsync_v2(buf, src.as_ptr().cast(), 4096, s)),
            SUCCESS
        );
        assert_eq!(free(buf), SUCCESS);
        release_hold(&k, new_stream(), flag, 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match cu!(x::cuStreamQuery(s)) {
                CUresult::ERROR_NOT_READY => {}
                code => {
                    assert_eq!(code, ILLEGAL, "a query sees the fault too");
                    break;
                }
            }
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_poisoned();
    }
);

isolated_test!(
    memory_the_streams_device_may_not_access_is_an_illegal_address,
    &[],
    {
        init_ctx(0);
        let k = kernels();
        // Read-write for device 1 only: the host (and copies) reach it, device 0's kernels do not.
        let h = mem_create(GRAN, &prop(0, 0)).unwrap();
        let va = reserve(GRAN, 0, 0).unwrap();
        assert_eq!(map(va, GRAN, 0, h), SUCCESS);
        assert_eq!(set_access(va, GRAN, &[(1, RW)]), SUCCESS);
        assert_eq!(write(va, b"ok"), SUCCESS);
        assert_eq!(fill(&k, std::ptr::null_mut(), va, 1, 1), SUCCESS);
        assert_eq!(cu!(x::cuCtxSynchronize()), ILLEGAL);
        assert_poisoned();
    }
);

const LOCK: &str = "tests::faults::the_lock_waits_for_queued_work";

/// The target: commands from the test queue work on its streams.
fn lock_target() {
    init_ctx(0);
    let k = kernels();
    let buf = alloc(MIB).unwrap();
    let (a, b) = (new_stream(), new_stream());
    say(&format!("ready {buf:#x}"));
    loop {
        let line = hear();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().copied() {
            None => return,
            Some("sleep") => {
                sleep_ms(&k, a, num(words[1]));
                assert_eq!(fill(&k, a, buf + 128, 1, 0x51ee9), SUCCESS);
            }
            Some("spin") => {
                assert_eq!(launch(k.spin, a, &[Arg::U64(buf), Arg::U32(1)]), SUCCESS);
            }
            Some("release") => {
                assert_eq!(launch(k.set, b, &[Arg::U64(buf), Arg::U32(1)]), SUCCESS);
                assert_eq!(sync(a), SUCCESS);
            }
            Some("work") => {
                assert_eq!(fill(&k, a, buf + 64, 4, 0x77), SUCCESS);
                assert_eq!(sync(a), SUCCESS);
                assert_eq!(words_at(buf + 64), 0x77);
            }
            Some("fault") => {
                let gone = alloc(MIB).unwrap();
                hold(&k, a, buf + 256, 1);
                assert_eq!(fill(&k, a, gone, 4, 1), SUCCESS);
                assert_eq!(free(gone), SUCCESS);
                release_hold(&k, b, buf + 256, 1);
                assert_eq!(sync(a), ILLEGAL);
            }
            Some(other) => panic!("unknown command {other}"),
        }
        say("done");
    }
}

/// The u32 at `addr` in process `pid` (a child of this test: ptrace access).
fn peek_u32(pid: i32, addr: u64) -> u32 {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = [0u8; 4];
    mem.read_exact_at(&mut b, addr).unwrap();
    u32::from_le_bytes(b)
}

fn words_at(dptr: u64) -> u32 {
    words(dptr, 1)[0]
}

#[test]
fn the_lock_waits_for_queued_work() {
    match role(LOCK).as_deref() {
        Some("tool") => return tool_loop(),
        Some("target") => return lock_target(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(LOCK);
    let mut target = Peer::spawn(LOCK, "target", &dir, &[]);
    let buf = num(&target.expect("ready"));
    let pid = target.pid();
    let mut tool = Tool::spawn(LOCK, &dir, &[]);
    let mut run = |cmd: &str| {
        target.send(cmd);
        target.expect("done");
    };
    // The lock reports LOCKED only once the queued work is complete: the fill behind the
    // sleep has landed (read through /proc/<pid>/mem: the target's calls wait at the gate).
    run("sleep 1500");
    assert_eq!(tool.lock(pid, 20_000), SUCCESS);
    assert_eq!(peek_u32(pid, buf + 128), 0x51ee9);
    assert_eq!(tool.state(pid), Ok(process_state::LOCKED));
    // Idle workers survive a checkpoint and restore, and run work after it.
    assert_eq!(tool.checkpoint(pid), SUCCESS);
    tool.resume(pid);
    run("work");
    // A kernel that never ends: the lock times out and the process keeps running.
    run("spin");
    let t = Instant::now();
    assert_eq!(tool.lock(pid, 300), CUresult::ERROR_TIMEOUT);
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert_eq!(tool.state(pid), Ok(process_state::RUNNING));
    run("release");
    assert_eq!(tool.lock(pid, 5000), SUCCESS);
    assert_eq!(tool.unlock(pid), SUCCESS);
    // A poisoned process cannot be locked.
    run("fault");
    assert_eq!(tool.lock(pid, 1000), ILLEGAL);
    assert_eq!(tool.state(pid), Ok(process_state::RUNNING));
    target.finish();
    tool.finish();
}
