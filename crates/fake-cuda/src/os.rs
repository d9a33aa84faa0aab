//! Thin wrappers over the Linux calls the fake driver is built on: memfds, fixed mappings,
//! protections, sparse copies and `/proc` lookups. Everything returns `io::Result`; callers map
//! failures to driver codes.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Page size of every target this project builds for (x86_64, aarch64 with 4 KiB pages).
pub(crate) const PAGE: u64 = 4096;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A close-on-exec memfd of `len` bytes.
pub(crate) fn memfd(name: &CStr, len: u64) -> io::Result<File> {
    // SAFETY: `name` is NUL-terminated; the flags are valid for memfd_create.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(len)?;
    Ok(file)
}

fn mmap_result(ret: *mut libc::c_void) -> io::Result<u64> {
    if ret == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as u64)
    }
}

/// Reserves `len` bytes of address space aligned to `align` (a power of two), inaccessible and
/// without commit charge. Tries `hint` first when it is nonzero and aligned; falls back to any
/// address, as the driver treats the requested address as a hint.
pub(crate) fn reserve(len: u64, align: u64, hint: u64) -> io::Result<u64> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    if hint != 0 && hint.is_multiple_of(align) {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; no memory is touched.
        let ret = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                flags | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if let Ok(addr) = mmap_result(ret) {
            if addr == hint {
                return Ok(addr);
            }
            // An old kernel ignoring MAP_FIXED_NOREPLACE placed it elsewhere: give it back.
            unmap(addr, len)?;
        }
    }
    let total = len
        .checked_add(align)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // SAFETY: a fresh anonymous PROT_NONE mapping at an address of the kernel's choosing.
    let ret = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total as usize,
            libc::PROT_NONE,
            flags,
            -1,
            0,
        )
    };
    let raw = mmap_result(ret)?;
    let start = raw.div_ceil(align) * align;
    if start > raw {
        unmap(raw, start - raw)?;
    }
    let end = start + len;
    if raw + total > end {
        unmap(end, raw + total - end)?;
    }
    Ok(start)
}

/// Replaces `[addr, addr+len)`, which this driver owns, with an inaccessible anonymous mapping:
/// the range stays reserved and holds no file.
pub(crate) fn map_none(addr: u64, len: u64) -> io::Result<()> {
    // SAFETY: the caller owns the range (a reservation of this driver), so replacing it with
    // MAP_FIXED destroys nothing that another part of the program uses.
    let ret = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    mmap_result(ret).map(|_| ())
}

/// Maps `len` bytes of `file` from `offset` at `addr` (a range this driver owns), shared.
pub(crate) fn map_shared(
    addr: u64,
    len: u64,
    file: &File,
    offset: u64,
    prot: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the caller owns the range; the descriptor is open; offset is page aligned.
    let ret = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    mmap_result(ret).map(|_| ())
}

/// Changes the protection of a range this driver mapped.
pub(crate) fn protect(addr: u64, len: u64, prot: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller owns the range; mprotect changes permissions only.
    check(unsafe { libc::mprotect(addr as *mut libc::c_void, len as usize, prot) }).map(|_| ())
}

/// Gives a range back to the kernel.
pub(crate) fn unmap(addr: u64, len: u64) -> io::Result<()> {
    // SAFETY: the caller owns the range and no reference into it survives.
    check(unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) }).map(|_| ())
}

/// Private anonymous host memory, unmapped on drop. Holds bytes of a checkpointed process and
/// pinned host allocations.
#[derive(Debug)]
pub(crate) struct HostBuf {
    addr: u64,
    len: u64,
}

impl HostBuf {
    pub(crate) fn new(len: u64) -> io::Result<HostBuf> {
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing.
        let ret = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        Ok(HostBuf {
            addr: mmap_result(ret)?,
            len,
        })
    }

    /// Leaks the mapping to the caller, who now owns it (pinned host memory given to the app).
    pub(crate) fn into_raw(self) -> (u64, u64) {
        let me = std::mem::ManuallyDrop::new(self);
        (me.addr, me.len)
    }

    /// Takes back a mapping given out by [`HostBuf::into_raw`].
    pub(crate) fn from_raw(addr: u64, len: u64) -> HostBuf {
        HostBuf { addr, len }
    }

    fn slice_mut(&mut self, offset: u64, len: u64) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: the range lies inside this live read-write mapping, which we own exclusively
        // (`&mut self`).
        Some(unsafe {
            std::slice::from_raw_parts_mut((self.addr + offset) as *mut u8, len as usize)
        })
    }

    fn slice(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: the range lies inside this live mapping; no `&mut` exists while `&self` lives.
        Some(unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u8, len as usize) })
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // Nothing can be done about a failing munmap of our own mapping; it only leaks.
        let _ = unmap(self.addr, self.len);
    }
}

/// The bytes of a file's first `len` bytes, kept in host memory with the list of regions that
/// hold data (holes stay holes, so a mostly empty 8 GiB allocation costs nothing).
#[derive(Debug)]
pub(crate) struct Saved {
    buf: HostBuf,
    extents: Vec<(u64, u64)>,
}

const CHUNK: u64 = 8 << 20;

/// The data regions of `file` within `[0, len)`, from SEEK_DATA/SEEK_HOLE.
fn extents(file: &File, len: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < len {
        // SAFETY: lseek on an open descriptor has no memory effects.
        let data = unsafe { libc::lseek(file.as_raw_fd(), pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(err);
        }
        let data = data as u64;
        if data >= len {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(file.as_raw_fd(), data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let hole = (hole as u64).min(len);
        out.push((data, hole - data));
        pos = hole;
    }
    Ok(out)
}

impl Saved {
    /// Copies the data regions of `file[0..len)` into fresh private memory.
    pub(crate) fn capture(file: &File, len: u64) -> io::Result<Saved> {
        let mut buf = HostBuf::new(len)?;
        let extents = extents(file, len)?;
        for &(start, size) in &extents {
            let mut off = start;
            while off < start + size {
                let n = CHUNK.min(start + size - off);
                let dst = buf
                    .slice_mut(off, n)
                    .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
                file.read_exact_at(dst, off)?;
                off += n;
            }
        }
        Ok(Saved { buf, extents })
    }

    /// Writes the saved regions into `file` (a fresh, zero-filled memfd).
    pub(crate) fn write_to(&self, file: &File) -> io::Result<()> {
        for &(start, size) in &self.extents {
            let mut off = start;
            while off < start + size {
                let n = CHUNK.min(start + size - off);
                let src = self
                    .buf
                    .slice(off, n)
                    .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
                file.write_all_at(src, off)?;
                off += n;
            }
        }
        Ok(())
    }
}

/// Copies `len` bytes from `src` to `dst` in this process, letting the kernel check both ranges
/// (`process_vm_writev` on ourselves returns EFAULT where a plain copy would fault). Falls back
/// to a plain copy where the call is not allowed (seccomp); the caller has then already checked
/// every driver-owned range.
pub(crate) fn copy_checked(dst: u64, src: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: src as *mut libc::c_void,
        iov_len: len as usize,
    };
    let remote = libc::iovec {
        iov_base: dst as *mut libc::c_void,
        iov_len: len as usize,
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // SAFETY: the iovecs describe caller-supplied ranges; the kernel validates them and reports
    // EFAULT instead of faulting.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n >= 0 && n as u64 == len {
        return Ok(());
    }
    if n < 0 {
        let err = io::Error::last_os_error();
        if matches!(err.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) {
            // SAFETY: process_vm_writev is unavailable; the caller validated the device side and
            // vouches for the host side as the driver API requires.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
            return Ok(());
        }
        return Err(err);
    }
    Err(io::Error::from_raw_os_error(libc::EFAULT))
}

/// Whether `[addr, addr+len)` is entirely mapped in this process (msync reports ENOMEM for holes).
pub(crate) fn is_mapped(addr: u64, len: u64) -> bool {
    let start = addr / PAGE * PAGE;
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    // SAFETY: MS_ASYNC on an address range only queries/schedules writeback; it touches no memory.
    let ret = unsafe {
        libc::msync(
            start as *mut libc::c_void,
            (end - start) as usize,
            libc::MS_ASYNC,
        )
    };
    ret == 0
}

/// `getpid()`.
pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// `gettid()`.
pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// `getuid()`.
pub(crate) fn getuid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// The start time of process `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`):
/// with the pid it names one process for the lifetime of the boot.
pub(crate) fn start_token(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Every thread of this process with its state letter (`/proc/self/task/<tid>/stat`, field 3).
pub(crate) fn threads_of_self() -> Vec<(i32, char)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|entry| {
            let tid = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .chars()
                .next()?;
            Some((tid, state))
        })
        .collect()
}

/// Opens another process's descriptor through `/proc/<pid>/fd/<fd>` (a new open file
/// description of the same file), close-on-exec.
pub(crate) fn open_peer_fd(pid: u32, fd: u32) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new(&format!("/proc/{pid}/fd/{fd}")))
}

/// Whether process `pid` with start token `start` is alive and not a zombie (a zombie keeps its
/// `/proc/<pid>/stat`, start time included, but none of its descriptors).
pub(crate) fn alive(pid: i32, start: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some((_, after)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = after.split_whitespace();
    let state = fields.next();
    let token = fields.nth(18).and_then(|s| s.parse::<u64>().ok());
    token == Some(start) && !matches!(state, Some("Z" | "X" | "x"))
}

/// An exclusive `flock` on a file, released on drop. Locks of different open file descriptions
/// exclude each other, so processes that each opened the same memfd can serialise on it.
#[derive(Debug)]
pub(crate) struct FileLock<'a> {
    file: &'a File,
}

impl<'a> FileLock<'a> {
    /// Waits for the lock (holders keep it only for a few file reads and writes).
    pub(crate) fn exclusive(file: &'a File) -> io::Result<FileLock<'a>> {
        loop {
            // SAFETY: flock on an open descriptor has no memory effects.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(FileLock { file });
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking a descriptor we locked has no memory effects; a failure leaves the
        // lock to be dropped with the open file description.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}
