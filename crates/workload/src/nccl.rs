//! NCCL as the workload reaches it: `libnccl.so.2` opened by name at run time (the loader finds
//! it through `LD_LIBRARY_PATH`, as it finds the driver: the tests put the fake NCCL there), the
//! few entry points the busy all-reduce loop calls, and its results as errors.

use std::ffi::{CStr, c_char, c_int, c_void};

use cuda_abi::CUstream;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUint32`.
pub const UINT32: c_int = 3;
/// `ncclSum`.
pub const SUM: c_int = 0;

/// An opaque `ncclComm_t`.
pub type Comm = *mut c_void;

type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> u32;
type CommInitRank = unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> u32;
type CommDestroy = unsafe extern "C" fn(Comm) -> u32;
type AllReduce =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CUstream) -> u32;
type GetErrorString = unsafe extern "C" fn(u32) -> *const c_char;

/// Why an NCCL call failed.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// The library or one of its symbols is missing.
    #[error("cannot load {what}: {source}")]
    Load {
        /// The library or symbol.
        what: String,
        /// The loader's error.
        source: libloading::Error,
    },
    /// A call returned a result other than `ncclSuccess`.
    #[error("{call}: {text} (ncclResult {code})")]
    Call {
        /// The entry point.
        call: &'static str,
        /// The result.
        code: u32,
        /// `ncclGetErrorString` of it.
        text: String,
    },
}

/// The loaded library.
#[derive(Debug)]
pub struct Nccl {
    // Keeps the code behind the function pointers mapped.
    _library: libloading::Library,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_destroy: CommDestroy,
    all_reduce: AllReduce,
    get_error_string: GetErrorString,
}

impl Nccl {
    /// Opens `libnccl.so.2` and resolves the entry points.
    pub fn load() -> Result<Nccl, NcclError> {
        // SAFETY: loading a library runs its initialisers; NCCL's (or the fake's) are the ones
        // every NCCL application runs.
        let library = unsafe { libloading::Library::new("libnccl.so.2") }.map_err(|source| {
            NcclError::Load {
                what: "libnccl.so.2".into(),
                source,
            }
        })?;
        fn symbol<T: Copy>(library: &libloading::Library, name: &str) -> Result<T, NcclError> {
            // SAFETY: each `T` below is the C signature nccl.h declares for `name`.
            unsafe { library.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|source| NcclError::Load {
                    what: name.into(),
                    source,
                })
        }
        Ok(Nccl {
            get_unique_id: symbol(&library, "ncclGetUniqueId")?,
            comm_init_rank: symbol(&library, "ncclCommInitRank")?,
            comm_destroy: symbol(&library, "ncclCommDestroy")?,
            all_reduce: symbol(&library, "ncclAllReduce")?,
            get_error_string: symbol(&library, "ncclGetErrorString")?,
            _library: library,
        })
    }

    fn check(&self, call: &'static str, code: u32) -> Result<(), NcclError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: any result value is accepted; the library returns a static string or null.
        let text = unsafe { (self.get_error_string)(code) };
        let text = if text.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated static string of the library.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(NcclError::Call { call, code, text })
    }

    /// `ncclGetUniqueId`: the id's bytes.
    pub fn unique_id(&self) -> Result<[u8; UNIQUE_ID_BYTES], NcclError> {
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: a valid out-pointer of the id's layout.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id.internal.map(|b| b as u8))
    }

    /// `ncclCommInitRank` (blocks until every rank has joined).
    pub fn comm_init_rank(
        &self,
        ranks: i32,
        id: &[u8; UNIQUE_ID_BYTES],
        rank: i32,
    ) -> Result<Comm, NcclError> {
        let id = UniqueId {
            internal: id.map(|b| b as c_char),
        };
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id is passed by value.
        let code = unsafe { (self.comm_init_rank)(&mut comm, ranks, id, rank) };
        self.check("ncclCommInitRank", code)?;
        Ok(comm)
    }

    /// `ncclCommDestroy`.
    // The communicator is an opaque handle, passed by value.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn comm_destroy(&self, comm: Comm) -> Result<(), NcclError> {
        // SAFETY: a communicator of `comm_init_rank`, destroyed once.
        self.check("ncclCommDestroy", unsafe { (self.comm_destroy)(comm) })
    }

    /// `ncclAllReduce(ncclSum, ncclUint32)` of `count` elements from `send` into `recv` (device
    /// addresses), enqueued on `stream`.
    // The communicator is an opaque handle, passed by value.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn all_reduce_sum_u32(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        comm: Comm,
        stream: CUstream,
    ) -> Result<(), NcclError> {
        // SAFETY: device addresses and handles by value; the library and the device validate them
        // (a bad address is a device fault, not a host memory access).
        let code = unsafe {
            (self.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                UINT32,
                SUM,
                comm,
                stream,
            )
        };
        self.check("ncclAllReduce", code)
    }
}
