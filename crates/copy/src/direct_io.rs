//! Whether a file's filesystem is memory (tmpfs, ramfs), where `O_DIRECT` buys nothing: the
//! bytes never reach a disk, and Linux (6.6 and later) takes `O_DIRECT` on tmpfs but serves it
//! slower than buffered I/O. On the H100 machine 32 threads read 2 MiB block files from tmpfs at
//! 26.7 GB/s with `O_DIRECT` (the bench's directory measure, 64 KiB pieces per read) and a probe's
//! 32 threads at 60.4 GB/s without (one 2 MiB read into a pinned buffer each; docs/measurements.md,
//! 2026-12-07). The
//! shims' data-file streams and the bench's measure of a directory ask this before they ask for
//! direct I/O, so both take the same path.

use std::os::fd::BorrowedFd;

/// `TMPFS_MAGIC` (linux/magic.h): tmpfs and `/dev/shm`.
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `RAMFS_MAGIC`.
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Whether `fd` (a file or a directory) lives on a filesystem in memory. An `fstatfs` that
/// fails answers false: direct I/O is then tried as before, and refused where it must be.
pub fn in_memory(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(fd).is_ok_and(|st| st.f_type == TMPFS_MAGIC || st.f_type == RAMFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn dev_shm_is_memory_and_the_proc_filesystem_is_not() {
        // /dev/shm is tmpfs wherever glibc's POSIX shared memory works (this suite's machines
        // and CI's).
        let shm = std::fs::File::open("/dev/shm").expect("/dev/shm");
        assert!(in_memory(shm.as_fd()), "/dev/shm");
        let proc = std::fs::File::open("/proc/self").expect("/proc");
        assert!(!in_memory(proc.as_fd()), "/proc is procfs");
    }
}
