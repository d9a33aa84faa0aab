//! The export cache: the real descriptor of every shared allocation this process created, by
//! allocation ID, served to peers. It has its own lock, never the state lock, so that a peer's
//! request is answered while application threads hold the state lock in long driver calls (the
//! prior design's "listener starvation").

use protocol::record::AllocationId;
use rustix::io::Errno;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct ExportCache {
    fds: Mutex<HashMap<AllocationId, OwnedFd>>,
}

impl ExportCache {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<AllocationId, OwnedFd>> {
        self.fds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Caches the descriptor of `id` (closing one cached before). The driver's descriptor is made
    /// close-on-exec first: cached for the life of the allocation, it would otherwise leak into
    /// every program the application execs and keep GPU memory alive there.
    pub fn insert(&self, id: AllocationId, fd: OwnedFd) {
        if let Err(e) = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC) {
            crate::log::log_warn!("cannot make the exported descriptor of {id} close-on-exec: {e}");
        }
        self.map().insert(id, fd);
    }

    pub fn contains(&self, id: &AllocationId) -> bool {
        self.map().contains_key(id)
    }

    /// A duplicate to send (a lease: a drain that closes the cached one cannot pull it from under
    /// the send). `None` if not cached.
    pub fn lease(&self, id: &AllocationId) -> Option<Result<OwnedFd, Errno>> {
        self.map().get(id).map(|fd| crate::fdutil::dup(fd.as_fd()))
    }

    /// Whether every cached descriptor is close-on-exec.
    #[cfg(test)]
    pub fn cloexec_all(&self) -> bool {
        self.map().values().all(|fd| {
            rustix::io::fcntl_getfd(fd).is_ok_and(|f| f.contains(rustix::io::FdFlags::CLOEXEC))
        })
    }

    /// Closes the cached descriptor of `id`.
    pub fn remove(&self, id: &AllocationId) {
        let fd = self.map().remove(id);
        drop(fd);
    }
}
