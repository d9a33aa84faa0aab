#![doc = include_str!("../README.md")]
//!
//! Modules: `abi` (the types and values of `nccl.h`), `error`, `driver` (the CUDA driver through
//! `dlopen`/`dlsym`), `layout` and `region` (the shared rendezvous file), `plan` (the kernels of
//! an all-reduce: the protocol between ranks), `comm` (communicators); the exports are here.

#![allow(unsafe_code)]

mod abi;
mod comm;
mod driver;
mod error;
mod layout;
mod plan;
mod region;

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cuda_abi::CUstream;

use abi::{NCCL_SUCCESS, NcclResult, NcclUniqueId};
use comm::Comm;
use error::{NcclError, record};

/// `ncclComm_t`: the address of a live [`Comm`], looked up in [`LIVE`] before use, so a stale or
/// foreign handle is refused rather than dereferenced.
type NcclComm = *mut c_void;

static LIVE: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);

fn live() -> MutexGuard<'static, Option<HashMap<usize, Arc<Comm>>>> {
    // The map is never left half-updated by a panic (single insert/remove calls).
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

fn lookup(comm: NcclComm) -> Result<Arc<Comm>, NcclError> {
    live()
        .as_ref()
        .and_then(|m| m.get(&(comm as usize)))
        .cloned()
        .ok_or_else(|| NcclError::InvalidArgument(format!("{comm:?} is not a live communicator")))
}

/// Removes a communicator from [`LIVE`] and waits until no other thread is inside a call on it.
fn take(comm: NcclComm) -> Result<Comm, NcclError> {
    let removed = live().as_mut().and_then(|m| m.remove(&(comm as usize)));
    let mut arc = removed.ok_or_else(|| {
        NcclError::InvalidArgument(format!("{comm:?} is not a live communicator"))
    })?;
    loop {
        match Arc::try_unwrap(arc) {
            Ok(comm) => return Ok(comm),
            Err(again) => {
                arc = again;
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

fn result(outcome: Result<(), NcclError>) -> NcclResult {
    match outcome {
        Ok(()) => NCCL_SUCCESS,
        Err(e) => record(&e),
    }
}

/// Writes an out-parameter of the application.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn write_out<T>(p: *mut T, value: T) -> Result<(), NcclError> {
    if p.is_null() {
        return Err(NcclError::InvalidArgument("null output pointer".into()));
    }
    // SAFETY: non-null; the caller vouches it is writable.
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// `ncclGetVersion`.
///
/// # Safety
/// `version` must be null or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    // SAFETY: forwarded from the caller.
    result(unsafe { write_out(version, abi::VERSION_CODE) })
}

/// `ncclGetUniqueId`.
///
/// # Safety
/// `unique_id` must be null or point to a writable `ncclUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
    // SAFETY: forwarded from the caller.
    result(comm::new_unique_id().and_then(|id| unsafe { write_out(unique_id, id) }))
}

/// `ncclCommInitRank`: blocks until all `nranks` ranks have joined.
///
/// # Safety
/// `comm` must be null or point to a writable `ncclComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    if comm.is_null() {
        return record(&NcclError::InvalidArgument("null comm".into()));
    }
    let made = Comm::init(&comm_id, nranks, rank).map(|c| {
        let arc = Arc::new(c);
        let handle = Arc::as_ptr(&arc) as usize;
        live().get_or_insert_with(HashMap::new).insert(handle, arc);
        handle
    });
    // SAFETY: checked non-null; the caller vouches it is writable.
    result(made.and_then(|handle| unsafe { write_out(comm, handle as NcclComm) }))
}

/// `ncclCommDestroy`: waits for this rank's collectives to finish, then frees the communicator.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: NcclComm) -> NcclResult {
    if comm.is_null() {
        return NCCL_SUCCESS;
    }
    result(take(comm).map(Comm::destroy))
}

/// `ncclCommAbort`: frees the communicator without waiting (see [`Comm::abort`]).
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: NcclComm) -> NcclResult {
    if comm.is_null() {
        return NCCL_SUCCESS;
    }
    result(take(comm).map(Comm::abort))
}

/// Answers one `int` about a communicator.
///
/// # Safety
/// `out` must be null or point to a writable `int`.
unsafe fn query(comm: NcclComm, out: *mut c_int, what: impl Fn(&Comm) -> c_int) -> NcclResult {
    // SAFETY: forwarded from the caller.
    result(lookup(comm).and_then(|c| unsafe { write_out(out, what(&c)) }))
}

/// `ncclCommCount`.
///
/// # Safety
/// `count` must be null or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(comm: NcclComm, count: *mut c_int) -> NcclResult {
    // SAFETY: forwarded from the caller. nranks <= MAX_RANKS fits an int.
    unsafe { query(comm, count, |c| c.nranks as c_int) }
}

/// `ncclCommUserRank`.
///
/// # Safety
/// `rank` must be null or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> NcclResult {
    // SAFETY: forwarded from the caller. rank < MAX_RANKS fits an int.
    unsafe { query(comm, rank, |c| c.rank as c_int) }
}

/// `ncclCommCuDevice`: the device of the context current at `ncclCommInitRank`.
///
/// # Safety
/// `device` must be null or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> NcclResult {
    // SAFETY: forwarded from the caller.
    unsafe { query(comm, device, |c| c.device) }
}

/// `ncclAllReduce`: `ncclSum` of `ncclInt32`, `ncclUint32` or `ncclFloat32`, enqueued on `stream`
/// as kernels of the driver; nothing is done on the host.
#[unsafe(no_mangle)]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: CUstream,
) -> NcclResult {
    let outcome = lookup(comm).and_then(|c| {
        c.all_reduce(
            sendbuff as u64,
            recvbuff as u64,
            count,
            datatype,
            op,
            stream,
        )
    });
    result(outcome)
}

thread_local! {
    /// `ncclGroupStart` nesting on this thread.
    static GROUP_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// `ncclGroupStart`: collectives are enqueued at once, never deferred to `ncclGroupEnd`, so a
/// group only nests (this library has no point-to-point calls a group would need to fuse).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    GROUP_DEPTH.with(|d| d.set(d.get().saturating_add(1)));
    NCCL_SUCCESS
}

/// `ncclGroupEnd`: closes a `ncclGroupStart` (an unmatched end is `ncclInvalidUsage`).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    let depth = GROUP_DEPTH.with(Cell::get);
    if depth == 0 {
        return record(&NcclError::InvalidUsage(
            "ncclGroupEnd without ncclGroupStart".into(),
        ));
    }
    GROUP_DEPTH.with(|d| d.set(depth - 1));
    NCCL_SUCCESS
}

/// `ncclGetErrorString`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    abi::error_string(result).as_ptr()
}

/// `ncclGetLastError`: the calling thread's last failure's text, whatever `comm` (real NCCL also
/// ignores it).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: NcclComm) -> *const c_char {
    error::last_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::{NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE};
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: a NUL-terminated buffer of this thread.
        unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn version_and_unique_id() {
        let mut v = 0;
        // SAFETY: a live local.
        assert_eq!(unsafe { ncclGetVersion(&mut v) }, NCCL_SUCCESS);
        assert_eq!(v, 22703);
        // SAFETY: null is refused.
        let refused = unsafe { ncclGetVersion(std::ptr::null_mut()) };
        assert_eq!(refused, NCCL_INVALID_ARGUMENT);
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: a live local.
        assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NCCL_SUCCESS);
        assert!(comm::region_name(&id).is_ok());
    }

    #[test]
    fn foreign_handles_are_refused_and_null_ones_ignored() {
        let bogus = 0x1000 as NcclComm;
        let mut n = 0;
        // SAFETY: a live local.
        let counted = unsafe { ncclCommCount(bogus, &mut n) };
        assert_eq!(counted, NCCL_INVALID_ARGUMENT);
        assert!(last().contains("is not a live communicator"), "{}", last());
        assert_eq!(ncclCommDestroy(bogus), NCCL_INVALID_ARGUMENT);
        assert_eq!(ncclCommDestroy(std::ptr::null_mut()), NCCL_SUCCESS);
        assert_eq!(ncclCommAbort(std::ptr::null_mut()), NCCL_SUCCESS);
        let x = 0u32;
        let sent = ncclAllReduce(
            (&x as *const u32).cast(),
            std::ptr::null_mut(),
            1,
            abi::NCCL_FLOAT32,
            abi::NCCL_SUM,
            bogus,
            std::ptr::null_mut(),
        );
        assert_eq!(sent, NCCL_INVALID_ARGUMENT);
    }

    #[test]
    fn groups_nest() {
        assert_eq!(ncclGroupEnd(), NCCL_INVALID_USAGE);
        assert_eq!(last(), "invalid usage: ncclGroupEnd without ncclGroupStart");
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
        assert_eq!(ncclGroupEnd(), NCCL_INVALID_USAGE);
    }

    #[test]
    fn error_strings_are_static() {
        // SAFETY: static NUL-terminated strings.
        let text = unsafe { CStr::from_ptr(ncclGetErrorString(abi::NCCL_SYSTEM_ERROR)) };
        assert!(text.to_bytes().starts_with(b"unhandled system error"));
    }
}
