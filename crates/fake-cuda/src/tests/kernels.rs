//! Wrappers for the stream, event and kernel tests: the built-in kernels loaded from a PTX
//! module, launches with argument lists, streams, worker-thread counting.

use std::ffi::{CStr, c_void};
use std::time::{Duration, Instant};

use cuda_abi::{CUevent, CUfunction, CUmodule, CUresult, CUstream};

use super::*;
use crate::exports as x;

/// A PTX module naming every built-in kernel (the fake reads only the `.entry` names).
pub(crate) const PTX: &CStr = c".version 8.0
.target sm_90
.address_size 64
.visible .entry cuinterpose_noop()
{ ret; }
.visible .entry cuinterpose_fill_u32(.param .u64 dst, .param .u64 count, .param .u32 value)
{ ret; }
.visible .entry cuinterpose_iota_u32(.param .u64 dst, .param .u64 count, .param .u32 start)
{ ret; }
.visible .entry cuinterpose_add_u32(.param .u64 d, .param .u64 s, .param .u64 n, .param .u32 a)
{ ret; }
.visible .entry cuinterpose_checksum_u32(.param .u64 src, .param .u64 count, .param .u64 out)
{ ret; }
.visible .entry cuinterpose_copy(.param .u64 dst, .param .u64 src, .param .u64 bytes)
{ ret; }
.visible .entry cuinterpose_sleep(.param .u64 ns)
{ ret; }
.visible .entry cuinterpose_spin_until_u32(.param .u64 flag, .param .u32 value)
{ ret; }
.visible .entry cuinterpose_set_u32(.param .u64 flag, .param .u32 value)
{ ret; }
.visible .entry cuinterpose_sum_u32(.param .u64 dst, .param .u64 src, .param .u64 count)
{ ret; }
.visible .entry cuinterpose_sum_f32(.param .u64 dst, .param .u64 src, .param .u64 count)
{ ret; }
";

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    U64(u64),
    U32(u32),
}

pub(crate) fn load_module(image: &CStr) -> Result<CUmodule, CUresult> {
    let mut m: CUmodule = std::ptr::null_mut();
    ck(cu!(x::cuModuleLoadData(&mut m, image.as_ptr().cast())))?;
    Ok(m)
}

pub(crate) fn function(m: CUmodule, name: &CStr) -> Result<CUfunction, CUresult> {
    let mut f: CUfunction = std::ptr::null_mut();
    ck(cu!(x::cuModuleGetFunction(&mut f, m, name.as_ptr())))?;
    Ok(f)
}

/// The built-in kernels, from one module.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub fill: CUfunction,
    pub iota: CUfunction,
    pub add: CUfunction,
    pub checksum: CUfunction,
    pub copy: CUfunction,
    pub sleep: CUfunction,
    pub spin: CUfunction,
    pub set: CUfunction,
    pub sum_u32: CUfunction,
    pub sum_f32: CUfunction,
    pub noop: CUfunction,
}

pub(crate) fn kernels() -> Kernels {
    let m = load_module(PTX).unwrap();
    let f = |name: &CStr| function(m, name).unwrap();
    Kernels {
        fill: f(c"cuinterpose_fill_u32"),
        iota: f(c"cuinterpose_iota_u32"),
        add: f(c"cuinterpose_add_u32"),
        checksum: f(c"cuinterpose_checksum_u32"),
        copy: f(c"cuinterpose_copy"),
        sleep: f(c"cuinterpose_sleep"),
        spin: f(c"cuinterpose_spin_until_u32"),
        set: f(c"cuinterpose_set_u32"),
        sum_u32: f(c"cuinterpose_sum_u32"),
        sum_f32: f(c"cuinterpose_sum_f32"),
        noop: f(c"cuinterpose_noop"),
    }
}

/// Launches `f` on `stream` with `args` (one block of one thread).
pub(crate) fn launch(f: CUfunction, stream: CUstream, args: &[Arg]) -> CUresult {
    // Every value stored as 8 little-endian bytes: a u32 argument is read from the first 4.
    let mut values: Vec<u64> = args
        .iter()
        .map(|a| match *a {
            Arg::U64(v) => v,
            Arg::U32(v) => u64::from(v),
        })
        .collect();
    let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
    let params = if ptrs.is_empty() {
        std::ptr::null_mut()
    } else {
        ptrs.as_mut_ptr()
    };
    cu!(x::cuLaunchKernel(
        f,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        stream,
        params,
        std::ptr::null_mut()
    ))
}

pub(crate) fn sleep_ms(k: &Kernels, stream: CUstream, ms: u64) {
    assert_eq!(
        launch(k.sleep, stream, &[Arg::U64(ms * 1_000_000)]),
        SUCCESS
    );
}

pub(crate) fn fill(k: &Kernels, stream: CUstream, dst: u64, count: u64, value: u32) -> CUresult {
    launch(
        k.fill,
        stream,
        &[Arg::U64(dst), Arg::U64(count), Arg::U32(value)],
    )
}

pub(crate) fn new_stream() -> CUstream {
    let mut s: CUstream = std::ptr::null_mut();
    assert_eq!(cu!(x::cuStreamCreate(&mut s, 1)), SUCCESS);
    s
}

pub(crate) fn sync(s: CUstream) -> CUresult {
    cu!(x::cuStreamSynchronize(s))
}

pub(crate) fn query(s: CUstream) -> CUresult {
    cu!(x::cuStreamQuery(s))
}

pub(crate) fn new_event() -> CUevent {
    let mut e: CUevent = std::ptr::null_mut();
    assert_eq!(cu!(x::cuEventCreate(&mut e, 0)), SUCCESS);
    e
}

/// The u32 words at `dptr` (a synchronous copy: it waits for the context's queued work).
pub(crate) fn words(dptr: u64, count: usize) -> Vec<u32> {
    read(dptr, count * 4)
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Stream worker threads of this process.
pub(crate) fn workers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == crate::exec::WORKER_NAME)
        })
        .count()
}

/// Waits (up to 10 s) for the number of stream workers to become `n` (a new thread names
/// itself once it runs, an ending one goes once it returned).
pub(crate) fn workers_become(n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers() != n {
        assert!(
            Instant::now() < deadline,
            "{} stream workers, expected {n}",
            workers()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Holds `stream` until [`release`]: a kernel spinning until the word at `flag` reaches
/// `value` (deterministic, where a sleep would race a slow test machine).
pub(crate) fn hold(k: &Kernels, stream: CUstream, flag: u64, value: u32) {
    assert_eq!(
        launch(k.spin, stream, &[Arg::U64(flag), Arg::U32(value)]),
        SUCCESS
    );
}

/// Releases what [`hold`] holds, from `stream` (another stream than the held one).
pub(crate) fn release_hold(k: &Kernels, stream: CUstream, flag: u64, value: u32) {
    assert_eq!(
        launch(k.set, stream, &[Arg::U64(flag), Arg::U32(value)]),
        SUCCESS
    );
}
