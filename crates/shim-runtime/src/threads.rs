//! Threads the runtime starts inside the application (the control listener and worker, the
//! drain's synchronisations): with every signal blocked, so that the application's signal
//! handlers only ever run on its own threads.

use crate::log::log_warn;
use std::io;

/// Spawns a thread with every signal blocked (the mask is inherited, so no signal can reach the
/// thread before it runs).
pub(crate) fn spawn_quiet<F>(name: &str, f: F) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    let mut old = SigSet::empty();
    // Affects only this thread; the caller's mask is restored below.
    if let Err(e) = pthread_sigmask(
        SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut old),
    ) {
        return Err(io::Error::from_raw_os_error(e as i32));
    }
    let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None) {
        log_warn!("cannot restore the signal mask after starting {name}: {e}");
    }
    spawned
}
