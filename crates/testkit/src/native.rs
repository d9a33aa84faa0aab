//! The driver's native checkpoint API (`cuCheckpointProcess*`) on another process's PID, as
//! `cuda-checkpoint` and the CUDA CRIU plugin call it: the tool's own wrapper
//! ([`control::native::Driver`]), loaded into the test process, plus what scenarios need around
//! it.
//!
//! The real driver can block for minutes in these calls (an exporter whose allocation is mapped
//! elsewhere); [`bounded`] runs a call on its own thread and stops waiting after a limit.

use std::time::Duration;

pub use control::ControlError;
pub use control::native::{Driver, ProcessState};

/// The outcome text of a failed native call: the `CUresult` name (`CUDA_ERROR_NOT_SUPPORTED`)
/// when the driver refused, else the error's text.
pub fn outcome(error: &ControlError) -> String {
    match error {
        ControlError::Driver { result, .. } => result
            .name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("CUresult({})", result.0)),
        other => other.to_string(),
    }
}

/// Whether the loader finds a system `libcuda.so.1` (opened and closed again; nothing is
/// initialised).
#[allow(unsafe_code)] // dlopen runs the library's initialisers
pub fn system_library_present() -> bool {
    // SAFETY: loading libcuda runs its initialisers, as in every CUDA program.
    unsafe { libloading::Library::new("libcuda.so.1") }.is_ok()
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
    use cuda_abi::CUresult;

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
    fn outcomes_name_the_driver_result() {
        let refused = ControlError::Driver {
            call: "cuCheckpointProcessRestore",
            result: CUresult::ERROR_NOT_SUPPORTED,
        };
        assert_eq!(outcome(&refused), "CUDA_ERROR_NOT_SUPPORTED");
        let odd = ControlError::Driver {
            call: "cuCheckpointProcessLock",
            result: CUresult(77777),
        };
        assert_eq!(outcome(&odd), "CUresult(77777)");
    }

    #[test]
    fn a_missing_library_is_an_error() {
        let e = Driver::load(Some(std::path::Path::new("/nonexistent/libcuda.so.1"))).unwrap_err();
        assert!(matches!(e, ControlError::DriverLoad { .. }));
    }
}
