//! A communicator's shared region: the file `nccl-<id>` in the fake driver's state directory,
//! created by whichever rank comes first and mapped `MAP_SHARED` by every rank ([`crate::layout`]
//! says what lies where).

use std::fs::{DirBuilder, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::NcclError;
use crate::layout::Layout;

/// The fake driver's state directory (`FAKE_CUDA_STATE_DIR`, default `/tmp/fake-cuda-<uid>`),
/// where the fake keeps its other cross-process files.
pub fn state_dir() -> PathBuf {
    match std::env::var_os("FAKE_CUDA_STATE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        // SAFETY: getuid has no preconditions and cannot fail.
        _ => PathBuf::from(format!("/tmp/fake-cuda-{}", unsafe { libc::getuid() })),
    }
}

/// One rank's mapping of the region.
#[derive(Debug)]
pub struct Region {
    base: *mut libc::c_void,
    layout: Layout,
    path: PathBuf,
}

// SAFETY: the mapping is process-wide memory; every shared word is accessed atomically or under
// the protocol's flags.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Opens (creating if first) and maps the region named `name`, checks it is a communicator
    /// of `nranks`, and claims `rank` in it.
    pub fn join(name: &str, nranks: u32, rank: u32) -> Result<Region, NcclError> {
        let dir = state_dir();
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| NcclError::system(format!("creating {}", dir.display()), e))?;
        let path = dir.join(name);
        let region = Region::map(&path, Layout { nranks })?;
        let n = region.word(Layout::NRANKS);
        if let Err(other) = n.compare_exchange(0, nranks, Ordering::AcqRel, Ordering::Acquire)
            && other != nranks
        {
            return Err(NcclError::InvalidUsage(format!(
                "rank {rank} says {nranks} ranks; the communicator of this unique id has {other}"
            )));
        }
        let present = region.word(region.layout.present(rank));
        if present
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(NcclError::InvalidUsage(format!(
                "rank {rank} already joined this unique id's communicator"
            )));
        }
        Ok(region)
    }

    /// Maps `path`, sized for `layout` (whoever comes first sizes it; a file is all zeroes when
    /// created, which is every flag's initial value).
    fn map(path: &Path, layout: Layout) -> Result<Region, NcclError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            // Never truncate: the first rank may already be using the region.
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| NcclError::system(format!("opening {}", path.display()), e))?;
        let size = layout.size();
        let sizing = file.metadata().and_then(|m| {
            if m.len() < size {
                file.set_len(size)
            } else {
                Ok(())
            }
        });
        sizing.map_err(|e| NcclError::system(format!("sizing {}", path.display()), e))?;
        // SAFETY: a fresh shared mapping of `size` bytes of a file at least that long; the
        // kernel picks the address. The descriptor may close after mmap.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(NcclError::system(format!("mapping {}", path.display()), e));
        }
        Ok(Region {
            base,
            layout,
            path: path.to_path_buf(),
        })
    }

    fn word(&self, offset: u64) -> &AtomicU32 {
        assert!(offset + 4 <= self.layout.size() && offset.is_multiple_of(4));
        // SAFETY: in bounds of the mapping (checked).
        let p = unsafe { self.base.cast::<u8>().add(offset as usize) };
        // SAFETY: aligned (checked, the mapping is page-aligned); the mapping lives as long as
        // `self`, and every access to these words, in every process, is atomic.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The mapping's address in this process (kernels reach it there once it is registered).
    pub fn base(&self) -> *mut libc::c_void {
        self.base
    }

    pub fn size(&self) -> usize {
        self.layout.size() as usize
    }

    /// Rank `rank`'s `done` flag of collective `seq`'s slot.
    pub fn done(&self, rank: u32, seq: u32) -> u32 {
        self.word(self.layout.done(rank, u64::from(seq)))
            .load(Ordering::Acquire)
    }

    /// Waits until every rank has joined, polling, for at most `timeout`.
    pub fn wait_for_all(&self, timeout: Duration) -> Result<(), NcclError> {
        let deadline = Instant::now() + timeout;
        loop {
            let missing: Vec<u32> = (0..self.layout.nranks)
                .filter(|&r| self.word(self.layout.present(r)).load(Ordering::Acquire) == 0)
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NcclError::Timeout(format!(
                    "ranks {missing:?} of {} did not join within {timeout:?}",
                    self.layout.nranks
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Gives rank `rank`'s place back after a failed initialisation (so it may try again), and
    /// removes the file if no rank is left in it.
    pub fn withdraw(&self, rank: u32) {
        self.word(self.layout.present(rank))
            .store(0, Ordering::Release);
        let anyone = (0..self.layout.nranks)
            .any(|r| self.word(self.layout.present(r)).load(Ordering::Acquire) != 0);
        if !anyone {
            // The file is only a name for the rendezvous; a later joiner makes a new one.
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Counts this rank out of a communicator it joined; the last one out removes the file
    /// (peers' mappings stay valid without its name).
    pub fn leave(&self) {
        let left = self.word(Layout::LEFT).fetch_add(1, Ordering::AcqRel) + 1;
        if left == self.layout.nranks {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map` with this size and is unmapped once; the owner
        // drops the region only when no queued kernel can touch it any more.
        unsafe { libc::munmap(self.base, self.layout.size() as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FAKE_CUDA_STATE_DIR` is process-wide: every test of this crate shares one directory
    /// (and uses its own file names in it).
    fn in_state_dir() {
        static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        DIR.get_or_init(|| {
            let d = tempfile::tempdir().unwrap().keep();
            // SAFETY: set once, before any test of this crate reads the variable (they all read
            // it after this initialiser returns).
            unsafe { std::env::set_var("FAKE_CUDA_STATE_DIR", &d) };
            d
        });
    }

    #[test]
    fn ranks_meet_in_one_file_and_the_last_out_removes_it() {
        in_state_dir();
        let name = "nccl-test-meet";
        let r0 = Region::join(name, 2, 0).unwrap();
        assert!(r0.wait_for_all(Duration::from_millis(20)).is_err());
        let r1 = Region::join(name, 2, 1).unwrap();
        r0.wait_for_all(Duration::from_secs(1)).unwrap();
        // The two mappings are one memory.
        r0.word(r0.layout.arrived(1, 7)).store(7, Ordering::Release);
        assert_eq!(r1.done(1, 7), 0);
        assert_eq!(r1.word(r1.layout.arrived(1, 7)).load(Ordering::Acquire), 7);
        let path = state_dir().join(name);
        r0.leave();
        assert!(path.exists());
        r1.leave();
        assert!(!path.exists());
    }

    #[test]
    fn a_rank_joins_once_and_with_the_communicators_size() {
        in_state_dir();
        let name = "nccl-test-once";
        let r0 = Region::join(name, 3, 0).unwrap();
        assert!(matches!(
            Region::join(name, 3, 0),
            Err(NcclError::InvalidUsage(_))
        ));
        assert!(matches!(
            Region::join(name, 2, 1),
            Err(NcclError::InvalidUsage(_))
        ));
        let e = r0.wait_for_all(Duration::from_millis(10)).unwrap_err();
        assert_eq!(e.to_string(), "ranks [1, 2] of 3 did not join within 10ms");
        r0.withdraw(0);
        assert!(!state_dir().join(name).exists());
        // Its place was given back: the rank may join again.
        Region::join(name, 3, 0).unwrap().withdraw(0);
    }
}
