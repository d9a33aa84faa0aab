//! A directory's own rates, measured with the I/O path of a checkpoint into its block store
//! (crates/shim-runtime/src/blockstore.rs), for `bench --to-disk`: every 2 MiB block its own file,
//! created under a temporary name with `O_DIRECT` where the filesystem takes it (the same
//! fallback), one `syncfs` for the batch, then each renamed into place; read back the same way,
//! block by block. As many threads as the shims of a group of that size run at once
//! ([`workers_for`] for each of them), so the ratio of a checkpoint's phase to this rate compares
//! the same I/Os, sizes and depth. Buffered I/O (tmpfs) reads from the page cache, as a warm
//! restore does.

use super::datafiles::{dir_in_memory, workers_for};
use crate::ControlError;
use crate::state_error;
use protocol::message::DATA_ALIGN;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A directory's own rates, measured the way the shims stream a checkpoint's blocks.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DirRate {
    pub bytes: u64,
    /// Whether the blocks were written and read with `O_DIRECT` (the choice a checkpoint makes).
    pub direct: bool,
    /// Threads writing and reading at once (the group's shims' in all).
    pub threads: usize,
    pub write_millis: f64,
    pub read_millis: f64,
}

/// A buffer piece aligned for `O_DIRECT`; a block's I/O is a vector of them.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Piece([u8; 64 << 10]);

const PIECES: usize = DATA_ALIGN as usize / std::mem::size_of::<Piece>();

/// Writes `bytes` (whole blocks) into new block files in a scratch directory of `dir` and reads
/// them back as `processes` shims stream a checkpoint through a block store; the files are
/// removed.
pub fn measure_dir(dir: &Path, bytes: u64, processes: usize) -> Result<DirRate, ControlError> {
    let scratch = dir.join(format!(".cuinterpose-rate-{}", std::process::id()));
    std::fs::create_dir(&scratch).map_err(|e| state_error(&scratch, e))?;
    // As the shims' block store decides (blockstore::Direct::for_store): buffered in memory, with
    // the threads the tool gives the shims there.
    let in_memory = dir_in_memory(&scratch);
    let threads = usize::from(workers_for(processes, in_memory)) * processes.max(1);
    let measured = Scratch {
        dir: &scratch,
        blocks: bytes.div_ceil(DATA_ALIGN).max(1),
        threads,
        direct: AtomicBool::new(!in_memory),
    }
    .measure();
    let _ = std::fs::remove_dir_all(&scratch);
    measured
}

struct Scratch<'a> {
    dir: &'a Path,
    blocks: u64,
    threads: usize,
    /// Cleared for good when the filesystem refuses `O_DIRECT`, as the shims' is.
    direct: AtomicBool,
}

impl Scratch<'_> {
    fn measure(&self) -> Result<DirRate, ControlError> {
        let dir = File::open(self.dir).map_err(|e| state_error(self.dir, e))?;
        let start = Instant::now();
        self.each_block(|n, buffer| self.write_block(&dir, n, buffer))?;
        rustix::fs::syncfs(&dir).map_err(|e| state_error(self.dir, std::io::Error::from(e)))?;
        for n in 0..self.blocks {
            rustix::fs::renameat(&dir, temp_name(n), &dir, block_name(n))
                .map_err(|e| state_error(self.dir, std::io::Error::from(e)))?;
        }
        let write_millis = start.elapsed().as_secs_f64() * 1e3;
        let start = Instant::now();
        self.each_block(|n, buffer| self.read_block(&dir, n, buffer))?;
        let read_millis = start.elapsed().as_secs_f64() * 1e3;
        Ok(DirRate {
            bytes: self.blocks * DATA_ALIGN,
            direct: self.direct.load(Ordering::Acquire),
            threads: self.threads,
            write_millis,
            read_millis,
        })
    }

    /// Runs `io` on every block, the threads taking the next one in order, each with a buffer of
    /// its own; the first error.
    fn each_block(
        &self,
        io: impl Fn(u64, &mut [Piece]) -> Result<(), ControlError> + Sync,
    ) -> Result<(), ControlError> {
        let next = AtomicU64::new(0);
        let threads: Vec<usize> = (0..self.threads).collect();
        crate::parallel::for_each("directory rate", &threads, |_| {
            let mut buffer = vec![Piece([0xa5; 64 << 10]); PIECES];
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= self.blocks {
                    return Ok(());
                }
                io(n, &mut buffer)?;
            }
        })
        .into_iter()
        .collect()
    }

    fn write_block(&self, dir: &File, n: u64, buffer: &mut [Piece]) -> Result<(), ControlError> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC;
        let file = self.open(dir, &temp_name(n), flags)?;
        let slices: Vec<std::io::IoSlice<'_>> =
            buffer.iter().map(|p| std::io::IoSlice::new(&p.0)).collect();
        let written = retry(|| rustix::io::pwritev(&file, &slices, 0));
        self.whole(written)
    }

    fn read_block(&self, dir: &File, n: u64, buffer: &mut [Piece]) -> Result<(), ControlError> {
        let file = self.open(dir, &block_name(n), OFlags::RDONLY | OFlags::CLOEXEC)?;
        let mut slices: Vec<std::io::IoSliceMut<'_>> = buffer
            .iter_mut()
            .map(|p| std::io::IoSliceMut::new(&mut p.0))
            .collect();
        let read = retry(|| rustix::io::preadv(&file, &mut slices, 0));
        self.whole(read)
    }

    /// Opens `name` in the scratch directory, with `O_DIRECT` while the filesystem takes it
    /// (tmpfs refuses it at open with `EINVAL`).
    fn open(&self, dir: &File, name: &str, flags: OFlags) -> Result<File, ControlError> {
        let mode = Mode::from_raw_mode(0o600);
        if self.direct.load(Ordering::Acquire) {
            match rustix::fs::openat(dir, name, flags | OFlags::DIRECT, mode) {
                Ok(fd) => return Ok(File::from(fd)),
                Err(Errno::INVAL) => self.direct.store(false, Ordering::Release),
                Err(e) => return Err(state_error(&self.dir.join(name), std::io::Error::from(e))),
            }
        }
        rustix::fs::openat(dir, name, flags, mode)
            .map(File::from)
            .map_err(|e| state_error(&self.dir.join(name), std::io::Error::from(e)))
    }

    fn whole(&self, done: Result<usize, Errno>) -> Result<(), ControlError> {
        match done {
            Ok(n) if n as u64 == DATA_ALIGN => Ok(()),
            Ok(n) => Err(state_error(
                self.dir,
                std::io::Error::other(format!("short I/O: {n} of {DATA_ALIGN} bytes")),
            )),
            Err(e) => Err(state_error(self.dir, std::io::Error::from(e))),
        }
    }
}

fn retry(mut io: impl FnMut() -> Result<usize, Errno>) -> Result<usize, Errno> {
    loop {
        match io() {
            Err(Errno::INTR) => {}
            done => return done,
        }
    }
}

fn temp_name(n: u64) -> String {
    format!(".tmp-{n}")
}

fn block_name(n: u64) -> String {
    format!("{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_every_block_written_and_read_and_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rate = measure_dir(dir.path(), 5 * DATA_ALIGN + 1, 2).expect("measure");
        assert_eq!(rate.bytes, 6 * DATA_ALIGN, "whole blocks, rounded up");
        let in_memory = dir_in_memory(dir.path());
        assert_eq!(rate.threads, 2 * usize::from(workers_for(2, in_memory)));
        assert!(
            rate.write_millis > 0.0 && rate.read_millis > 0.0,
            "{rate:?}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read dir").collect();
        assert!(left.is_empty(), "scratch files left: {left:?}");
    }

    #[test]
    fn a_directory_that_cannot_be_written_is_an_error_naming_it() {
        let error = measure_dir(Path::new("/proc/cuinterpose-no-such-dir"), DATA_ALIGN, 1)
            .expect_err("no directory");
        assert!(
            error.to_string().contains("cuinterpose-no-such-dir"),
            "{error}"
        );
    }
}
