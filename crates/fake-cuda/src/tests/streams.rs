//! Asynchronous streams: work on one stream runs in order and completes after the call
//! returns; events, stream waits and a flag written by another stream or another process
//! order work across streams; host functions run in order; destroying a stream or a context
//! with work queued neither hangs nor leaks its worker thread.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_abi::{CUlaunchConfig, CUresult, CUstream, stream_wait_value};

use super::kernels::*;
use super::*;
use crate::exports as x;

const NOT_READY: CUresult = CUresult::ERROR_NOT_READY;

isolated_test!(one_stream_runs_its_work_in_order, &[], {
    init_ctx(0);
    let k = kernels();
    let buf = alloc(MIB).unwrap();
    let s = new_stream();
    let n = 1024u64;
    let (a, b, sums, held) = (buf, buf + 4096, buf + 8192, buf + 12288);
    let null: CUstream = std::ptr::null_mut();
    hold(&k, s, held, 1);
    let iota = [Arg::U64(a), Arg::U64(n), Arg::U32(5)];
    assert_eq!(launch(k.iota, s, &iota), SUCCESS);
    let add = [Arg::U64(b), Arg::U64(a), Arg::U64(n), Arg::U32(10)];
    assert_eq!(launch(k.add, s, &add), SUCCESS);
    let sum = [Arg::U64(b), Arg::U64(n), Arg::U64(sums)];
    assert_eq!(launch(k.checksum, s, &sum), SUCCESS);
    assert_eq!(query(s), NOT_READY, "a spinning kernel heads the queue");
    let mut host = vec![0u8; 8];
    assert_eq!(
        cu!(x::cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr().cast(),
            sums,
            8,
            s
        )),
        SUCCESS
    );
    assert_eq!(host, [0; 8], "the copy has not run yet");
    release_hold(&k, null, held, 1);
    assert_eq!(sync(s), SUCCESS);
    assert_eq!(query(s), SUCCESS);
    let expected: u64 = (0..n).map(|i| 15 + i).sum();
    assert_eq!(u64::from_le_bytes(host.try_into().unwrap()), expected);
    assert_eq!(words(b, 3), [15, 16, 17]);

    // A synchronous copy waits for the context's queued work.
    sleep_ms(&k, s, 200);
    assert_eq!(fill(&k, s, a, 4, 0xabcd), SUCCESS);
    assert_eq!(words(a, 5), [0xabcd, 0xabcd, 0xabcd, 0xabcd, 9]);

    // The other kernels, and async memsets and copies in between, on the null stream.
    assert_eq!(cu!(x::cuMemsetD32Async(a, 3, 4, null)), SUCCESS);
    assert_eq!(cu!(x::cuMemsetD32Async_ptsz(b, 4, 4, null)), SUCCESS);
    let sum_u32 = [Arg::U64(a), Arg::U64(b), Arg::U64(4)];
    assert_eq!(launch(k.sum_u32, null, &sum_u32), SUCCESS);
    let copy = [Arg::U64(b + 2), Arg::U64(a), Arg::U64(6)];
    assert_eq!(launch(k.copy, null, &copy), SUCCESS);
    assert_eq!(launch(k.noop, null, &[]), SUCCESS);
    let floats: Vec<u8> = [1.5f32, 2.25]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    assert_eq!(
        cu!(x::cuMemcpyHtoDAsync_v2(
            sums,
            floats.as_ptr().cast(),
            8,
            null
        )),
        SUCCESS
    );
    assert_eq!(
        cu!(x::cuMemcpyAsync(sums + 8, floats.as_ptr() as u64, 8, null)),
        SUCCESS
    );
    let sum_f32 = [Arg::U64(sums), Arg::U64(sums + 8), Arg::U64(2)];
    assert_eq!(launch(k.sum_f32, null, &sum_f32), SUCCESS);
    assert_eq!(cu!(x::cuCtxSynchronize()), SUCCESS);
    assert_eq!(words(a, 2), [7, 7]);
    // b: [4, 4, 4, 4] with bytes 2..8 replaced by a's first 6 bytes (7, 0, 0, 0, 7, 0).
    assert_eq!(read(b, 8).unwrap(), [4, 0, 7, 0, 0, 0, 7, 0]);
    let f = read(sums, 8).unwrap();
    assert_eq!(f32::from_le_bytes(f[0..4].try_into().unwrap()), 3.0);
    assert_eq!(f32::from_le_bytes(f[4..8].try_into().unwrap()), 4.5);
});

isolated_test!(modules_and_launches_check_their_arguments, &[], {
    init_ctx(0);
    let buf = alloc(MIB).unwrap();
    let only_noop = c".version 8.0\n.visible .entry cuinterpose_noop(\n)\n{ ret; }\n";
    let m = load_module(only_noop).unwrap();
    let noop = function(m, c"cuinterpose_noop").unwrap();
    assert_eq!(
        function(m, c"cuinterpose_noop"),
        Ok(noop),
        "the same handle again"
    );
    assert_eq!(
        function(m, c"cuinterpose_fill_u32"),
        Err(CUresult::ERROR_NOT_FOUND),
        "a kernel the module does not have"
    );
    let other = load_module(c".entry my_own_kernel(\n)\n{}\n").unwrap();
    assert_eq!(
        function(other, c"my_own_kernel"),
        Err(CUresult::ERROR_NOT_FOUND),
        "a kernel the fake does not implement"
    );
    assert_eq!(
        load_module(c"\x7fELF\x02\x01\x01"),
        Err(CUresult::ERROR_INVALID_IMAGE)
    );
    let k = kernels();
    let null: CUstream = std::ptr::null_mut();
    let args = [Arg::U64(buf), Arg::U64(1), Arg::U32(1)];
    let launch_with = |dims: [c_uint; 6], shared: c_uint, extra: *mut *mut c_void| {
        let mut values = [buf, 1, 1];
        let mut ptrs: Vec<*mut c_void> =
            values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let [gx, gy, gz, bx, by, bz] = dims;
        cu!(x::cuLaunchKernel(
            k.fill,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            null,
            ptrs.as_mut_ptr(),
            extra
        ))
    };
    let ok = [2, 2, 1, 256, 1, 1];
    assert_eq!(launch_with(ok, 0, std::ptr::null_mut()), SUCCESS);
    assert_eq!(
        launch_with([0, 1, 1, 1, 1, 1], 0, std::ptr::null_mut()),
        CUresult::ERROR_INVALID_VALUE
    );
    assert_eq!(
        launch_with(ok, 1 << 20, std::ptr::null_mut()),
        CUresult::ERROR_INVALID_VALUE
    );
    let mut extra = [std::ptr::null_mut::<c_void>()];
    assert_eq!(
        launch_with(ok, 0, extra.as_mut_ptr()),
        CUresult::ERROR_NOT_SUPPORTED
    );
    assert_eq!(
        cu!(x::cuLaunchKernel(
            k.fill,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        )),
        CUresult::ERROR_INVALID_VALUE,
        "a kernel with parameters needs kernelParams"
    );
    assert_eq!(
        launch(k.fill, 0x4242 as CUstream, &args),
        CUresult::ERROR_INVALID_HANDLE
    );
    assert_eq!(
        launch(0x1234 as cuda_abi::CUfunction, null, &args),
        CUresult::ERROR_INVALID_HANDLE
    );
    assert_eq!(cu!(x::cuModuleUnload(m)), SUCCESS);
    assert_eq!(launch(noop, null, &[]), CUresult::ERROR_INVALID_HANDLE);
    assert_eq!(cu!(x::cuModuleUnload(m)), CUresult::ERROR_INVALID_HANDLE);
    assert_eq!(cu!(x::cuCtxSynchronize()), SUCCESS);
    assert_eq!(words(buf, 1), [1]);
});

isolated_test!(launch_kernel_ex_reads_its_configuration, &[], {
    init_ctx(0);
    let k = kernels();
    let a = alloc(MIB).unwrap();
    let s = new_stream();
    assert_eq!(cu!(x::cuMemsetD32_v2(a, 7, 4)), SUCCESS);
    // The stream and dimensions come from the configuration.
    let mut values = [a, 2u64, 77u64];
    let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
    let mut config = CUlaunchConfig {
        gridDimX: 4,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 128,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: s,
        attrs: std::ptr::null_mut(),
        numAttrs: 0,
    };
    let ex = |c: &CUlaunchConfig, p: *mut *mut c_void| {
        cu!(x::cuLaunchKernelEx(c, k.fill, p, std::ptr::null_mut()))
    };
    assert_eq!(ex(&config, ptrs.as_mut_ptr()), SUCCESS);
    assert_eq!(sync(s), SUCCESS);
    assert_eq!(words(a, 3), [77, 77, 7]);
    config.blockDimY = 0;
    assert_eq!(
        ex(&config, ptrs.as_mut_ptr()),
        CUresult::ERROR_INVALID_VALUE
    );
    assert_eq!(
        cu!(x::cuLaunchKernelEx(
            std::ptr::null(),
            k.fill,
            ptrs.as_mut_ptr(),
            std::ptr::null_mut()
        )),
        CUresult::ERROR_INVALID_VALUE
    );
});

isolated_test!(primary_context_state_says_whether_it_is_retained, &[], {
    init_ctx(0);
    let (mut flags, mut active): (c_uint, c_int) = (9, 9);
    assert_eq!(
        cu!(x::cuDevicePrimaryCtxGetState(0, &mut flags, &mut active)),
        SUCCESS
    );
    assert_eq!((flags, active), (0, 1));
    assert_eq!(
        cu!(x::cuDevicePrimaryCtxGetState(1, &mut flags, &mut active)),
        SUCCESS
    );
    assert_eq!(active, 0);
    assert_eq!(
        cu!(x::cuDevicePrimaryCtxGetState(7, &mut flags, &mut active)),
        CUresult::ERROR_INVALID_DEVICE
    );
});

isolated_test!(events_order_work_across_streams, &[], {
    init_ctx(0);
    let k = kernels();
    let buf = alloc(MIB).unwrap();
    let (a, b) = (new_stream(), new_stream());
    let ev = new_event();
    assert_eq!(cu!(x::cuEventQuery(ev)), SUCCESS, "never recorded");
    let held = buf + 8192;
    hold(&k, a, held, 1);
    assert_eq!(fill(&k, a, buf, 256, 42), SUCCESS);
    assert_eq!(cu!(x::cuEventRecord(ev, a)), SUCCESS);
    assert_eq!(cu!(x::cuEventQuery(ev)), NOT_READY);
    assert_eq!(cu!(x::cuStreamWaitEvent(b, ev, 0)), SUCCESS);
    let add = [
        Arg::U64(buf + 4096),
        Arg::U64(buf),
        Arg::U64(256),
        Arg::U32(1),
    ];
    assert_eq!(launch(k.add, b, &add), SUCCESS);
    // Work recorded later on `a` is not waited for by `b`.
    let later = new_event();
    sleep_ms(&k, a, 60_000);
    assert_eq!(cu!(x::cuEventRecordWithFlags(later, a, 0)), SUCCESS);
    assert_eq!(query(b), NOT_READY, "b waits for the event");
    release_hold(&k, std::ptr::null_mut(), held, 1);
    assert_eq!(sync(b), SUCCESS);
    // Read directly: a synchronous copy would wait for the minute-long sleep on `a`.
    assert_eq!(words_async(buf + 4096), 43);
    assert_eq!(words_async(buf + 4096 + 1020), 43);
    assert_eq!(cu!(x::cuEventQuery(ev)), SUCCESS);
    assert_eq!(cu!(x::cuEventSynchronize(ev)), SUCCESS);
    assert_eq!(cu!(x::cuEventQuery(later)), NOT_READY);
    assert_eq!(query(a), NOT_READY);
    assert_eq!(cu!(x::cuEventDestroy_v2(ev)), SUCCESS);
    assert_eq!(cu!(x::cuEventQuery(ev)), CUresult::ERROR_INVALID_HANDLE);
    assert_eq!(
        cu!(x::cuEventRecordWithFlags(later, a, 8)),
        CUresult::ERROR_INVALID_VALUE
    );
    // The minute-long sleep goes with the stream's context, below.
    assert_eq!(cu!(x::cuStreamDestroy_v2(a)), SUCCESS);
    assert_eq!(cu!(x::cuStreamDestroy_v2(b)), SUCCESS);
    assert_eq!(cu!(x::cuDevicePrimaryCtxReset_v2(0)), SUCCESS);
    workers_become(0);
});

isolated_test!(stream_memory_operations_wait_and_write_values, &[], {
    init_ctx(0);
    let k = kernels();
    let buf = alloc(MIB).unwrap();
    let (flag, out) = (buf, buf + 64);
    let (a, b) = (new_stream(), new_stream());
    let wait = |value: u32, flags: u32| cu!(x::cuStreamWaitValue32_v2(a, flag, value, flags));
    let write_b = |value: u32| cu!(x::cuStreamWriteValue32_v2(b, flag, value, 0));
    assert_eq!(wait(5, stream_wait_value::GEQ), SUCCESS);
    assert_eq!(fill(&k, a, out, 1, 1), SUCCESS);
    assert_eq!(wait(6, stream_wait_value::EQ), SUCCESS);
    assert_eq!(fill(&k, a, out, 1, 2), SUCCESS);
    assert_eq!(
        wait(0x10, stream_wait_value::AND | stream_wait_value::FLUSH),
        SUCCESS
    );
    assert_eq!(fill(&k, a, out, 1, 3), SUCCESS);
    sleep_ms(&k, b, 100);
    assert_eq!(write_b(4), SUCCESS);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(query(a), NOT_READY, "4 is not >= 5");
    assert_eq!(write_b(5), SUCCESS);
    assert_eq!(sync(b), SUCCESS);
    let deadline = Instant::now() + Duration::from_secs(10);
    while words_async(out) != 1 {
        assert!(Instant::now() < deadline, "GEQ 5 was not released by 5");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(query(a), NOT_READY, "5 is not 6");
    assert_eq!(write_b(6), SUCCESS);
    // EQ must see 6 before it changes again (a GPU would race the same way).
    while words_async(out) != 2 {
        assert!(Instant::now() < deadline, "EQ 6 was not released by 6");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(write_b(0x11), SUCCESS);
    assert_eq!(sync(a), SUCCESS);
    assert_eq!(words(out, 1), [3]);
    // The driver's definitions, including GEQ's wrap-around and NOR.
    use crate::exec::wait_value_met as met;
    assert!(met(1, u32::MAX, stream_wait_value::GEQ));
    assert!(!met(u32::MAX, 1, stream_wait_value::GEQ));
    assert!(met(0b0100, 0b0011, stream_wait_value::NOR));
    assert!(!met(u32::MAX, 0, stream_wait_value::NOR));
    assert_eq!(
        cu!(x::cuStreamWaitValue32_v2(a, flag + 1, 0, 0)),
        CUresult::ERROR_INVALID_VALUE
    );
    assert_eq!(
        cu!(x::cuStreamWriteValue32_v2(a, flag, 0, 2)),
        CUresult::ERROR_INVALID_VALUE
    );
});

/// The u32 at `dptr` read without waiting for queued work (the host sees device memory in the
/// fake), to watch a stream make progress.
fn words_async(dptr: u64) -> u32 {
    // SAFETY: `dptr` is live cuMemAlloc memory of this test, mapped read-write.
    unsafe { (dptr as *const u32).read_volatile() }
}

isolated_test!(
    a_spin_kernel_is_released_by_a_set_kernel_on_another_stream,
    &[],
    {
        init_ctx(0);
        let k = kernels();
        let buf = alloc(MIB).unwrap();
        let (a, b) = (new_stream(), new_stream());
        let spin = [Arg::U64(buf), Arg::U32(3)];
        assert_eq!(launch(k.spin, a, &spin), SUCCESS);
        assert_eq!(fill(&k, a, buf + 64, 4, 9), SUCCESS);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(query(a), NOT_READY);
        let set = [Arg::U64(buf), Arg::U32(2)];
        assert_eq!(launch(k.set, b, &set), SUCCESS);
        assert_eq!(sync(b), SUCCESS);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(query(a), NOT_READY, "2 is below 3");
        let set = [Arg::U64(buf), Arg::U32(3)];
        assert_eq!(launch(k.set, b, &set), SUCCESS);
        assert_eq!(sync(a), SUCCESS);
        assert_eq!(words(buf + 64, 4), [9; 4]);
    }
);

static ORDER: Mutex<Vec<(usize, u32)>> = Mutex::new(Vec::new());
static WATCHED: AtomicU64 = AtomicU64::new(0);

/// A host function: notes its number and the word it sees at `WATCHED` (device memory is host
/// memory in the fake), to show that it ran after the kernels queued before it.
unsafe extern "C" fn note(data: *mut c_void) {
    let seen = words_async(WATCHED.load(Ordering::SeqCst));
    ORDER.lock().unwrap().push((data as usize, seen));
}

isolated_test!(host_functions_run_in_stream_order, &[], {
    init_ctx(0);
    let k = kernels();
    let buf = alloc(MIB).unwrap();
    WATCHED.store(buf, Ordering::SeqCst);
    let s = new_stream();
    let host = |n: usize| cu!(x::cuLaunchHostFunc(s, Some(note), n as *mut c_void));
    let held = buf + 4096;
    hold(&k, s, held, 1);
    assert_eq!(host(1), SUCCESS);
    assert_eq!(fill(&k, s, buf, 1, 10), SUCCESS);
    assert_eq!(host(2), SUCCESS);
    assert_eq!(fill(&k, s, buf, 1, 20), SUCCESS);
    assert_eq!(host(3), SUCCESS);
    assert!(ORDER.lock().unwrap().is_empty(), "nothing ran yet");
    release_hold(&k, std::ptr::null_mut(), held, 1);
    assert_eq!(sync(s), SUCCESS);
    assert_eq!(*ORDER.lock().unwrap(), [(1, 0), (2, 10), (3, 20)]);
    assert_eq!(
        cu!(x::cuLaunchHostFunc(s, None, std::ptr::null_mut())),
        CUresult::ERROR_INVALID_VALUE
    );
});

isolated_test!(destroying_streams_and_contexts_with_work_queued, &[], {
    init_ctx(0);
    let k = kernels();
    let buf = alloc(MIB).unwrap();
    assert_eq!(workers(), 0, "workers start lazily");
    // A destroyed stream finishes its queued work, then its worker ends.
    let s = new_stream();
    let held = buf + 4096;
    hold(&k, s, held, 1);
    assert_eq!(fill(&k, s, buf, 2, 5), SUCCESS);
    workers_become(1);
    // Returns while the stream is held: destroy does not wait for the work.
    assert_eq!(cu!(x::cuStreamDestroy_v2(s)), SUCCESS);
    assert_eq!(query(s), CUresult::ERROR_INVALID_HANDLE);
    assert_eq!(words_async(buf), 0, "the fill has not run");
    // Released from a stream destroyed at once too: both workers end once drained.
    let r = new_stream();
    release_hold(&k, r, held, 1);
    assert_eq!(cu!(x::cuStreamDestroy_v2(r)), SUCCESS);
    assert_eq!(cu!(x::cuCtxSynchronize()), SUCCESS);
    assert_eq!(words(buf, 2), [5, 5]);
    workers_become(0);

    // A destroyed context's work is discarded, kernels that would never end included.
    let mut ctx = std::ptr::null_mut();
    assert_eq!(cu!(x::cuCtxCreate_v2(&mut ctx, 0, 1)), SUCCESS);
    let k1 = kernels();
    let flag = alloc(MIB).unwrap();
    let s1 = new_stream();
    let spin = [Arg::U64(flag), Arg::U32(1)];
    assert_eq!(launch(k1.spin, s1, &spin), SUCCESS);
    assert_eq!(launch(k1.spin, std::ptr::null_mut(), &spin), SUCCESS);
    workers_become(2);
    let t = Instant::now();
    assert_eq!(cu!(x::cuCtxDestroy_v2(ctx)), SUCCESS);
    assert!(t.elapsed() < Duration::from_secs(1));
    workers_become(0);

    // The same for a primary context released for the last time.
    let mut primary = std::ptr::null_mut();
    assert_eq!(cu!(x::cuDevicePrimaryCtxRetain(&mut primary, 1)), SUCCESS);
    assert_eq!(cu!(x::cuCtxSetCurrent(primary)), SUCCESS);
    let k2 = kernels();
    let flag = alloc(MIB).unwrap();
    let spin = [Arg::U64(flag), Arg::U32(1)];
    assert_eq!(launch(k2.spin, std::ptr::null_mut(), &spin), SUCCESS);
    workers_become(1);
    assert_eq!(cu!(x::cuDevicePrimaryCtxRelease_v2(1)), SUCCESS);
    workers_become(0);
});

const CROSS: &str = "tests::streams::a_spin_kernel_is_released_by_another_process";

/// The spinner maps an allocation, spins a kernel on a flag in it and fills after; the writer
/// imports the allocation through a FABRIC handle and sets the flag from its own stream.
#[test]
fn a_spin_kernel_is_released_by_another_process() {
    match role(CROSS).as_deref() {
        Some("spinner") => {
            init_ctx(0);
            let k = kernels();
            let (h, va) = vmm_buffer(GRAN, 0, FABRIC);
            let fh = export_fabric(h).unwrap();
            let s = new_stream();
            assert_eq!(launch(k.spin, s, &[Arg::U64(va), Arg::U32(7)]), SUCCESS);
            assert_eq!(fill(&k, s, va + 64, 2, 0x5eed), SUCCESS);
            let hex: String = fh.data.iter().map(|b| format!("{b:02x}")).collect();
            say(&format!("handle {hex}"));
            wait_for("sync");
            let t = Instant::now();
            assert_eq!(sync(s), SUCCESS);
            assert_eq!(words(va + 64, 2), [0x5eed, 0x5eed]);
            say(&format!("released {}", t.elapsed().as_millis()));
            return;
        }
        Some("writer") => {
            init_ctx(1);
            let k = kernels();
            let line = hear();
            let mut fh = cuda_abi::CUmemFabricHandle { data: [0; 64] };
            for (i, b) in fh.data.iter_mut().enumerate() {
                *b = u8::from_str_radix(&line[2 * i..2 * i + 2], 16).unwrap();
            }
            let h = import_fabric(&fh).unwrap();
            let va = reserve(GRAN, 0, 0).unwrap();
            assert_eq!(map(va, GRAN, 0, h), SUCCESS);
            assert_eq!(set_access(va, GRAN, &[(1, RW)]), SUCCESS);
            wait_for("write");
            let s = new_stream();
            assert_eq!(launch(k.set, s, &[Arg::U64(va), Arg::U32(7)]), SUCCESS);
            assert_eq!(sync(s), SUCCESS);
            say("written");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(CROSS);
    let mut spinner = Peer::spawn(CROSS, "spinner", &dir, &[]);
    let handle = spinner.expect("handle");
    let mut writer = Peer::spawn(CROSS, "writer", &dir, &[]);
    writer.send(&handle);
    spinner.send("sync");
    assert_eq!(
        spinner.recv_within(Duration::from_millis(500)),
        None,
        "the spinner's stream waits for the flag"
    );
    writer.send("write");
    writer.expect("written");
    let waited = spinner.expect("released");
    assert!(num(&waited) >= 400, "released after the write, {waited} ms");
    writer.finish();
    spinner.finish();
}
