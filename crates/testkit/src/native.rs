//! The driver's native checkpoint API (`cuCheckpointProcess*`), called in this process on another
//! process's PID, as `cuda-checkpoint` and the CUDA CRIU plugin do.
//!
//! The library is opened in the calling process (the fake driver in tests, the system's
//! `libcuda.so.1` on a GPU machine). `cuInit` is called only if the driver answers
//! `CUDA_ERROR_NOT_INITIALIZED`, so a tool process that never needs it stays light.
//!
//! The real driver can block for minutes in these calls (an exporter whose allocation is mapped
//! elsewhere); [`bounded`] runs a call on its own thread and stops waiting after a limit.

#![allow(unsafe_code)] // calls through driver function pointers; each block says why it is sound

use core::ffi::{CStr, c_char, c_int};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cuda_abi::pfn::*;
use cuda_abi::*;

/// Why a native call failed.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// The driver library could not be opened.
    #[error("cannot load {library}: {source}")]
    Load {
        /// What was opened.
        library: String,
        /// The loader's message.
        source: libloading::Error,
    },
    /// The driver lacks the entry point (a driver older than 12.8).
    #[error("the driver has no {0}")]
    Missing(&'static str),
    /// The driver refused.
    #[error("{call} returned {name}")]
    Driver {
        /// The entry point.
        call: &'static str,
        /// What it returned.
        result: CUresult,
        /// The driver's name for it.
        name: String,
    },
}

impl NativeError {
    /// The driver's name of the result (`CUDA_ERROR_NOT_SUPPORTED`), or the error text.
    pub fn outcome(&self) -> String {
        match self {
            NativeError::Driver { name, .. } => name.clone(),
            other => other.to_string(),
        }
    }
}

/// A process's state as `cuCheckpointProcessGetState` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessState(pub u32);

impl ProcessState {
    /// `running`, `locked`, `checkpointed`, `failed`, or `state(N)`.
    pub fn name(self) -> String {
        match self.0 {
            process_state::RUNNING => "running".into(),
            process_state::LOCKED => "locked".into(),
            process_state::CHECKPOINTED => "checkpointed".into(),
            process_state::FAILED => "failed".into(),
            n => format!("state({n})"),
        }
    }
}

/// A GPU pair for restore: the UUID a process used, and the one it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPair {
    /// The UUID at checkpoint time.
    pub old: [u8; 16],
    /// The UUID to restore onto.
    pub new: [u8; 16],
}

/// The checkpoint entry points of one loaded driver.
#[derive(Debug)]
pub struct Native {
    init: PFN_cuInit,
    error_name: PFN_cuGetErrorName,
    lock: PFN_cuCheckpointProcessLock,
    checkpoint: PFN_cuCheckpointProcessCheckpoint,
    restore: PFN_cuCheckpointProcessRestore,
    unlock: PFN_cuCheckpointProcessUnlock,
    get_state: PFN_cuCheckpointProcessGetState,
    restore_tid: Option<PFN_cuCheckpointProcessGetRestoreThreadId>,
    initialized: AtomicBool,
    // Kept so the function pointers stay valid; never unloaded before them.
    _library: libloading::Library,
}

macro_rules! sym {
    ($lib:expr, $ty:ty, $name:literal) => {{
        // SAFETY: the driver exports this symbol with the C signature `$ty` (cuda.h, 12.8+).
        let s = unsafe { $lib.get::<$ty>(concat!($name, "\0").as_bytes()) };
        s.map(|s| *s).map_err(|_| NativeError::Missing($name))
    }};
}

impl Native {
    /// Opens the system's `libcuda.so.1`.
    pub fn load() -> Result<Native, NativeError> {
        Native::load_from(Path::new("libcuda.so.1"))
    }

    /// Opens `library` (a path, or a name the loader searches).
    pub fn load_from(library: &Path) -> Result<Native, NativeError> {
        // SAFETY: loading libcuda runs its initialisers, as in every CUDA program.
        let lib = unsafe { libloading::Library::new(library.as_os_str()) }.map_err(|source| {
            NativeError::Load {
                library: library.display().to_string(),
                source,
            }
        })?;
        Ok(Native {
            init: sym!(lib, PFN_cuInit, "cuInit")?,
            error_name: sym!(lib, PFN_cuGetErrorName, "cuGetErrorName")?,
            lock: sym!(lib, PFN_cuCheckpointProcessLock, "cuCheckpointProcessLock")?,
            checkpoint: sym!(
                lib,
                PFN_cuCheckpointProcessCheckpoint,
                "cuCheckpointProcessCheckpoint"
            )?,
            restore: sym!(
                lib,
                PFN_cuCheckpointProcessRestore,
                "cuCheckpointProcessRestore"
            )?,
            unlock: sym!(
                lib,
                PFN_cuCheckpointProcessUnlock,
                "cuCheckpointProcessUnlock"
            )?,
            get_state: sym!(
                lib,
                PFN_cuCheckpointProcessGetState,
                "cuCheckpointProcessGetState"
            )?,
            restore_tid: sym!(
                lib,
                PFN_cuCheckpointProcessGetRestoreThreadId,
                "cuCheckpointProcessGetRestoreThreadId"
            )
            .ok(),
            initialized: AtomicBool::new(false),
            _library: lib,
        })
    }

    /// The driver's name for `result`.
    pub fn error_name(&self, result: CUresult) -> String {
        let mut out: *const c_char = core::ptr::null();
        // SAFETY: valid out-pointer; the driver returns a static NUL-terminated string.
        let r = unsafe { (self.error_name)(result, &mut out) };
        if r.is_success() && !out.is_null() {
            // SAFETY: the driver returned a NUL-terminated static string.
            return unsafe { CStr::from_ptr(out) }
                .to_string_lossy()
                .into_owned();
        }
        result
            .name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("CUresult({})", result.0))
    }

    /// Runs `f`; if the driver says it is not initialised, calls `cuInit` once and retries.
    fn call(&self, name: &'static str, f: impl Fn() -> CUresult) -> Result<(), NativeError> {
        let mut r = f();
        if r == CUresult::ERROR_NOT_INITIALIZED && !self.initialized.swap(true, Ordering::AcqRel) {
            // SAFETY: no pointers.
            let _ = unsafe { (self.init)(0) };
            r = f();
        }
        if r.is_success() {
            Ok(())
        } else {
            Err(NativeError::Driver {
                call: name,
                result: r,
                name: self.error_name(r),
            })
        }
    }

    /// `cuCheckpointProcessLock` with a timeout (0: the driver's default, wait forever).
    pub fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), NativeError> {
        self.call("cuCheckpointProcessLock", || {
            let mut args = CUcheckpointLockArgs {
                timeoutMs: timeout_ms,
                ..CUcheckpointLockArgs::default()
            };
            // SAFETY: valid argument struct with every reserved field zero.
            unsafe { (self.lock)(pid as c_int, &mut args) }
        })
    }

    /// `cuCheckpointProcessCheckpoint`.
    pub fn checkpoint(&self, pid: u32) -> Result<(), NativeError> {
        self.call("cuCheckpointProcessCheckpoint", || {
            let mut args = CUcheckpointCheckpointArgs::default();
            // SAFETY: valid argument struct, reserved fields zero.
            unsafe { (self.checkpoint)(pid as c_int, &mut args) }
        })
    }

    /// `cuCheckpointProcessRestore`, onto other GPUs if `pairs` is not empty.
    pub fn restore(&self, pid: u32, pairs: &[GpuPair]) -> Result<(), NativeError> {
        let mut raw: Vec<CUcheckpointGpuPair> = pairs
            .iter()
            .map(|p| CUcheckpointGpuPair {
                oldUuid: CUuuid {
                    bytes: p.old.map(|b| b as c_char),
                },
                newUuid: CUuuid {
                    bytes: p.new.map(|b| b as c_char),
                },
            })
            .collect();
        let count = raw.len() as u32;
        let ptr = if raw.is_empty() {
            core::ptr::null_mut()
        } else {
            raw.as_mut_ptr()
        };
        self.call("cuCheckpointProcessRestore", || {
            let mut args = CUcheckpointRestoreArgs {
                gpuPairs: ptr,
                gpuPairsCount: count,
                ..CUcheckpointRestoreArgs::default()
            };
            // SAFETY: `ptr` is null or points at `count` pairs that outlive the call.
            unsafe { (self.restore)(pid as c_int, &mut args) }
        })
    }

    /// `cuCheckpointProcessUnlock`.
    pub fn unlock(&self, pid: u32) -> Result<(), NativeError> {
        self.call("cuCheckpointProcessUnlock", || {
            let mut args = CUcheckpointUnlockArgs::default();
            // SAFETY: valid argument struct, reserved fields zero.
            unsafe { (self.unlock)(pid as c_int, &mut args) }
        })
    }

    /// `cuCheckpointProcessGetState`.
    pub fn state(&self, pid: u32) -> Result<ProcessState, NativeError> {
        let state = std::cell::Cell::new(0u32);
        self.call("cuCheckpointProcessGetState", || {
            let mut s = 0u32;
            // SAFETY: valid out-pointer.
            let r = unsafe { (self.get_state)(pid as c_int, &mut s) };
            state.set(s);
            r
        })?;
        Ok(ProcessState(state.get()))
    }

    /// `cuCheckpointProcessGetRestoreThreadId`.
    pub fn restore_thread_id(&self, pid: u32) -> Result<i32, NativeError> {
        let f = self.restore_tid.ok_or(NativeError::Missing(
            "cuCheckpointProcessGetRestoreThreadId",
        ))?;
        let tid = std::cell::Cell::new(0i32);
        self.call("cuCheckpointProcessGetRestoreThreadId", || {
            let mut t: c_int = 0;
            // SAFETY: valid out-pointer.
            let r = unsafe { f(pid as c_int, &mut t) };
            tid.set(t);
            r
        })?;
        Ok(tid.get())
    }
}

/// The result of a call run under [`bounded`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bounded<T> {
    /// It returned in time.
    Done(T),
    /// It was still running at the limit (its thread is left behind: a driver call cannot be
    /// cancelled), or no thread could be started for it.
    Hung,
}

/// Runs `f` on its own thread and waits at most `limit` for it.
pub fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Bounded<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("native-call".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if spawned.is_err() {
        return Bounded::Hung;
    }
    match rx.recv_timeout(limit) {
        Ok(v) => Bounded::Done(v),
        Err(_) => Bounded::Hung,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_returns_quick_results_and_gives_up_on_slow_ones() {
        assert_eq!(bounded(Duration::from_secs(10), || 7), Bounded::Done(7));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let r = bounded(Duration::from_millis(50), move || {
            let _ = wait.recv();
        });
        assert_eq!(r, Bounded::Hung);
        drop(release);
    }

    #[test]
    fn state_names() {
        assert_eq!(
            ProcessState(process_state::CHECKPOINTED).name(),
            "checkpointed"
        );
        assert_eq!(ProcessState(9).name(), "state(9)");
    }

    #[test]
    fn a_missing_library_is_an_error() {
        let e = Native::load_from(Path::new("/nonexistent/libcuda.so.1")).unwrap_err();
        assert!(matches!(e, NativeError::Load { .. }));
    }
}
