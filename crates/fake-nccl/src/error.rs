//! This library's failures, the `ncclResult_t` each maps to, and the text `ncclGetLastError`
//! returns.

use std::cell::RefCell;
use std::ffi::c_char;

use cuda_abi::CUresult;

use crate::abi::{
    NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_SYSTEM_ERROR, NCCL_UNHANDLED_CUDA_ERROR,
    NcclResult,
};

#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    #[error("{call} failed: {result}")]
    Cuda {
        call: &'static str,
        result: CUresult,
    },
    #[error("cannot load the CUDA driver: {0}")]
    DriverLoad(String),
    #[error("{what}: {source}")]
    System {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Timeout(String),
}

impl NcclError {
    /// The `ncclResult_t` real NCCL returns for this kind of failure.
    pub fn result(&self) -> NcclResult {
        match self {
            NcclError::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
            NcclError::InvalidUsage(_) => NCCL_INVALID_USAGE,
            NcclError::Cuda { .. } => NCCL_UNHANDLED_CUDA_ERROR,
            NcclError::DriverLoad(_) | NcclError::System { .. } | NcclError::Timeout(_) => {
                NCCL_SYSTEM_ERROR
            }
        }
    }

    /// An OS failure with what was being done.
    pub fn system(what: impl Into<String>, source: std::io::Error) -> NcclError {
        NcclError::System {
            what: what.into(),
            source,
        }
    }
}

/// Longest message kept, NUL included (real NCCL keeps 1024 bytes too).
const LAST_ERROR_BYTES: usize = 1024;

thread_local! {
    /// Per thread, so the pointer `ncclGetLastError` returns is only ever rewritten by a later
    /// call of this library on the same thread, never under a reader on another thread.
    static LAST_ERROR: RefCell<[u8; LAST_ERROR_BYTES]> = const { RefCell::new([0; LAST_ERROR_BYTES]) };
}

/// Records `error` as this thread's last error (truncated to fit) and returns its result code.
pub fn record(error: &NcclError) -> NcclResult {
    let text = error.to_string();
    let bytes = text.as_bytes();
    let len = bytes.len().min(LAST_ERROR_BYTES - 1);
    LAST_ERROR.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf[..len].copy_from_slice(&bytes[..len]);
        buf[len] = 0;
    });
    error.result()
}

/// This thread's last error text (empty before the first error); valid until this thread's
/// next failing call into the library, and for the thread's life.
pub fn last_error() -> *const c_char {
    LAST_ERROR.with(|buf| buf.as_ptr().cast::<c_char>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_text() -> String {
        LAST_ERROR.with(|buf| {
            let buf = buf.borrow();
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).into_owned()
        })
    }

    #[test]
    fn the_last_error_is_kept_per_thread_and_truncated() {
        assert_eq!(last_text(), "");
        let e = NcclError::InvalidArgument("count too large".into());
        assert_eq!(record(&e), NCCL_INVALID_ARGUMENT);
        assert_eq!(last_text(), "invalid argument: count too large");
        std::thread::spawn(|| assert_eq!(last_text(), ""))
            .join()
            .unwrap();
        let long = NcclError::InvalidUsage("x".repeat(5000));
        assert_eq!(record(&long), NCCL_INVALID_USAGE);
        assert_eq!(last_text().len(), LAST_ERROR_BYTES - 1);
    }

    #[test]
    fn driver_failures_are_unhandled_cuda_errors() {
        let e = NcclError::Cuda {
            call: "cuLaunchKernel",
            result: CUresult::ERROR_INVALID_VALUE,
        };
        assert_eq!(e.result(), NCCL_UNHANDLED_CUDA_ERROR);
        assert_eq!(
            e.to_string(),
            "cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE(1)"
        );
        assert_eq!(NcclError::Timeout("t".into()).result(), NCCL_SYSTEM_ERROR);
    }
}
