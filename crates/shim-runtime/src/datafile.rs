//! Data files: the bytes of a checkpoint to disk, streamed by the shim itself between device
//! memory and a file the tool opened in the checkpoint directory (SaveTo, LoadFrom), so that the
//! bytes never pass through the host carrier and CRIU dumps only the process's own memory.
//!
//! One file per process (the tool passes one descriptor per request, the only kind a frame
//! carries), its allocations one after the other at multiples of [`DATA_ALIGN`] (2 MiB), as
//! [`layout`] places them. Each of the request's worker threads
//! ([`protocol::message::data_workers`]: the CPUs shared out over the group, twice them on a
//! disk) takes the next unit of at most [`IO_SIZE`] bytes (a block in a block store) in file
//! order, copies it between the device and one of its two pinned buffers (asynchronous copies,
//! so that they overlap its I/O and digests: [`PinnedRing`]), and writes or reads it at its offset
//! with `pwrite` / `pread`, so several large aligned I/Os are in flight. `O_DIRECT` is used when the tool could
//! open the file with it; a filesystem that refuses an aligned direct I/O (`EINVAL`) gets
//! buffered I/O from then on, logged once.
//!
//! BLAKE3 is computed while the bytes stream, one digest per allocation ([`Extent::blake3`]: a
//! rollback may load only some allocations back): each worker hashes the unit it holds as a
//! subtree of its allocation's BLAKE3 tree, in parallel with the others, and the digests are merged
//! from the subtrees at the end (crate::digest). LoadFrom refuses an allocation whose bytes do not
//! hash to the digest the checkpoint recorded; by default that is the restore's only check of the
//! content (the tool checked the files' lengths before anything changed).
//!
//! Blocks of [`DATA_ALIGN`] bytes that are all zeros (free blocks of caching allocators,
//! preallocated caches) are not written: they stay holes and are listed in the file's record
//! ([`DataFile::zero_blocks`]), which is robust where holes are not (a copy of the directory may
//! fill them); LoadFrom sets them to zero on the device instead of reading and copying them.

use crate::Real;
use crate::blockstore::{self, BlockError, Put};
use crate::digest::{DigestError, TreeDigests};
use crate::log::log_warn;
use copy::ring::PinnedRing;
use copy::{self, CopyError};
use protocol::message::{DATA_ALIGN, DataFile, Extent, StoredBlock, StreamStats};
use protocol::record::AllocationId;
use rustix::fs::OFlags;
use rustix::io::Errno;
use std::os::fd::BorrowedFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Largest write or read of one unit ([`protocol::message::DATA_IO`]).
pub const IO_SIZE: usize = protocol::message::DATA_IO as usize;
// A unit is a whole BLAKE3 subtree (crate::digest), which TreeDigests::new asserts.
const _: () = assert!(IO_SIZE.is_power_of_two() && IO_SIZE >= blake3::CHUNK_LEN);
/// `O_DIRECT` alignment of lengths (the buffers are page-aligned pinned memory).
const PAGE: usize = 4096;
const BLOCK: usize = DATA_ALIGN as usize;

/// Why streaming a data file failed.
#[derive(Debug, thiserror::Error)]
pub enum DataFileError {
    #[error(transparent)]
    Copy(#[from] CopyError),
    #[error("cannot write the data file at offset {offset}: {source}")]
    Write {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the data file at offset {offset}: {source}")]
    Read {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("the data file ends before offset {offset}: truncated")]
    Truncated { offset: u64 },
    #[error(
        "allocation {id} in the data file hashes to {found}, the checkpoint recorded {expected}"
    )]
    Digest {
        id: AllocationId,
        expected: String,
        found: String,
    },
    #[error("the data file does not describe this process's allocations: {0}")]
    Mismatch(String),
    #[error(transparent)]
    Block(#[from] BlockError),
    #[error("block {path} of the store hashes to {found}: the block is damaged")]
    BlockDigest { path: String, found: String },
    #[error("cannot start a data file thread: {0}")]
    Spawn(std::io::Error),
    #[error(transparent)]
    Tree(#[from] DigestError),
}

/// An allocation to stream: mapped at `va` for copies through `device`'s context, its bytes at
/// `extent` in the file (for a write, the extent's digest is what the write computes).
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub device: i32,
    pub va: u64,
    pub extent: Extent,
}

/// Places allocations (ID and size, in the order given) in a data file: each at the next multiple
/// of [`DATA_ALIGN`]. Returns the extents (digests still zero) and the file's length.
pub fn layout(allocations: &[(AllocationId, u64)]) -> (Vec<Extent>, u64) {
    let mut offset = 0u64;
    let extents = allocations
        .iter()
        .map(|&(id, size)| {
            let extent = Extent {
                id,
                offset,
                size,
                blake3: [0; 32],
            };
            offset = (offset + size).next_multiple_of(DATA_ALIGN);
            extent
        })
        .collect();
    (extents, offset)
}

/// One unit of work: `len` bytes of region `region` from byte `at` of it, at `offset` in the
/// file and `va` on the device.
#[derive(Clone, Copy, Debug)]
struct Unit {
    region: usize,
    device: i32,
    va: u64,
    offset: u64,
    at: u64,
    len: usize,
}

/// The regions cut into units of at most `unit_len` bytes, in file order.
fn units(regions: &[Region], unit_len: usize) -> Vec<Unit> {
    let mut out = Vec::new();
    for (region, r) in regions.iter().enumerate() {
        let size = usize::try_from(r.extent.size).unwrap_or(usize::MAX);
        let mut done = 0;
        while done < size {
            let len = unit_len.min(size - done);
            out.push(Unit {
                region,
                device: r.device,
                va: r.va + done as u64,
                offset: r.extent.offset + done as u64,
                at: done as u64,
                len,
            });
            done += len;
        }
    }
    out
}

/// Whether the file is open with `O_DIRECT`; cleared for good when the filesystem refuses it.
struct Direct {
    on: AtomicBool,
}

impl Direct {
    fn of(file: BorrowedFd<'_>) -> Direct {
        let on = rustix::fs::fcntl_getfl(file).is_ok_and(|f| f.contains(OFlags::DIRECT));
        Direct {
            on: AtomicBool::new(on),
        }
    }

    /// After `EINVAL` on a direct I/O: buffered from now on. True when a retry can help.
    fn give_up(&self, file: BorrowedFd<'_>) -> bool {
        let Ok(flags) = rustix::fs::fcntl_getfl(file) else {
            return false;
        };
        if !flags.contains(OFlags::DIRECT) {
            return false;
        }
        if rustix::fs::fcntl_setfl(file, flags - OFlags::DIRECT).is_err() {
            return false;
        }
        if self.on.swap(false, Ordering::AcqRel) {
            log_warn!("the data file's filesystem refused O_DIRECT; streaming buffered");
        }
        true
    }
}

fn write_all(
    file: BorrowedFd<'_>,
    direct: &Direct,
    bytes: &[u8],
    offset: u64,
) -> Result<(), DataFileError> {
    let mut done = 0;
    while let Some(rest) = bytes.get(done..).filter(|r| !r.is_empty()) {
        let at = offset + done as u64;
        match rustix::io::pwrite(file, rest, at) {
            Ok(0) => {
                return Err(DataFileError::Write {
                    offset: at,
                    source: std::io::Error::from(std::io::ErrorKind::WriteZero),
                });
            }
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::INVAL) if direct.give_up(file) => {}
            Err(e) => {
                return Err(DataFileError::Write {
                    offset: at,
                    source: e.into(),
                });
            }
        }
    }
    Ok(())
}

fn read_exact(
    file: BorrowedFd<'_>,
    direct: &Direct,
    bytes: &mut [u8],
    offset: u64,
) -> Result<(), DataFileError> {
    let mut done = 0;
    while done < bytes.len() {
        let at = offset + done as u64;
        let Some(rest) = bytes.get_mut(done..) else {
            break;
        };
        match rustix::io::pread(file, rest, at) {
            Ok(0) => return Err(DataFileError::Truncated { offset: at }),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::INVAL) if direct.give_up(file) => {}
            Err(e) => {
                return Err(DataFileError::Read {
                    offset: at,
                    source: e.into(),
                });
            }
        }
    }
    Ok(())
}

fn is_zero(bytes: &[u8]) -> bool {
    static ZERO: [u8; PAGE] = [0; PAGE];
    bytes
        .chunks(PAGE)
        .all(|c| ZERO.get(..c.len()).is_some_and(|z| z == c))
}

/// The blocks of a unit as (start within the unit, length, all zeros?), merged into runs of
/// equal kind.
fn runs(unit: &Unit, zero: impl Fn(usize, usize) -> bool) -> Vec<(usize, usize, bool)> {
    let mut out: Vec<(usize, usize, bool)> = Vec::new();
    let mut at = 0;
    while at < unit.len {
        let len = BLOCK.min(unit.len - at);
        let z = zero(at, len);
        match out.last_mut() {
            Some(last) if last.2 == z => last.1 += len,
            _ => out.push((at, len, z)),
        }
        at += len;
    }
    out
}

/// What the workers share.
struct Shared<'a> {
    real: &'a Real,
    file: BorrowedFd<'a>,
    /// I/O threads ([`protocol::message::data_workers`], sent by the tool).
    workers: usize,
    /// The largest unit, and the size of each of a worker's two pinned buffers: [`IO_SIZE`] for a
    /// data file (large I/Os), a block for a block store (whose I/Os are blocks anyway: a
    /// quarter of the pinned memory each worker makes and frees, which on the H100 machine took
    /// a seventh of the workers' time in tmpfs with 8 MiB buffers).
    unit_len: usize,
    direct: Direct,
    units: Vec<Unit>,
    next: AtomicUsize,
    digests: TreeDigests,
    /// A worker failed: the others stop taking units (the digests will not be used).
    failed: AtomicBool,
    file_bytes: AtomicU64,
    zero_bytes: AtomicU64,
    /// Bytes of blocks a block store already held (SaveTo into a store).
    shared_bytes: AtomicU64,
    /// Microseconds the workers spent hashing, summed ([`StreamStats::hash_micros`]).
    hash_micros: AtomicU64,
    /// And on their setup, their file I/O and their waits for copies ([`StreamStats`]).
    setup_micros: AtomicU64,
    io_micros: AtomicU64,
    wait_micros: AtomicU64,
    first_error: Mutex<Option<DataFileError>>,
}

impl<'a> Shared<'a> {
    /// A stream of `regions` through `file` by `workers` threads in units of `unit_len` bytes,
    /// nothing done yet.
    fn new(
        real: &'a Real,
        file: BorrowedFd<'a>,
        regions: &[Region],
        workers: usize,
        unit_len: usize,
        digests: TreeDigests,
    ) -> Shared<'a> {
        Shared {
            real,
            file,
            workers,
            unit_len,
            direct: Direct::of(file),
            units: units(regions, unit_len),
            next: AtomicUsize::new(0),
            digests,
            failed: AtomicBool::new(false),
            file_bytes: AtomicU64::new(0),
            zero_bytes: AtomicU64::new(0),
            shared_bytes: AtomicU64::new(0),
            hash_micros: AtomicU64::new(0),
            setup_micros: AtomicU64::new(0),
            io_micros: AtomicU64::new(0),
            wait_micros: AtomicU64::new(0),
            first_error: Mutex::new(None),
        }
    }

    /// Hashes a unit's bytes into its allocation's digest, counting the time.
    fn hash(&self, unit: &Unit, bytes: &[u8]) -> Result<(), DataFileError> {
        timed(&self.hash_micros, || {
            self.digests.add(unit.region, unit.at, bytes)
        })?;
        Ok(())
    }

    /// What the stream did: `threads` workers from `start` to now.
    fn stats(&self, direct: bool, threads: u32, start: Instant) -> StreamStats {
        StreamStats {
            file_bytes: self.file_bytes.load(Ordering::Relaxed),
            zero_bytes: self.zero_bytes.load(Ordering::Relaxed),
            direct,
            threads,
            micros: micros_since(start),
            hash_micros: self.hash_micros.load(Ordering::Relaxed),
            shared_bytes: self.shared_bytes.load(Ordering::Relaxed),
            setup_micros: self.setup_micros.load(Ordering::Relaxed),
            io_micros: self.io_micros.load(Ordering::Relaxed),
            wait_micros: self.wait_micros.load(Ordering::Relaxed),
        }
    }
}

fn micros_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Runs `work`, adding its time to `counter`: where the workers' time goes (the report's split
/// of it shows which of the storage, the digests and the copies sets the pace).
fn timed<T>(counter: &AtomicU64, work: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let result = work();
    counter.fetch_add(micros_since(start), Ordering::Relaxed);
    result
}

/// Which way a stream goes: what a worker's ring does ahead of each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// Device to file: each unit is copied into a buffer of the ring while the worker still
    /// hashes and writes the one before, and the step finds it there.
    Save,
    /// File to device: the step fills a buffer and queues its copies, and the next step fills
    /// the other buffer while they run.
    Load,
}

/// One unit of a stream in buffer `slot` of the worker's ring, its digest included.
type Step<'s> =
    dyn Fn(&Shared<'_>, &Unit, &mut PinnedRing<'_>, usize) -> Result<(), DataFileError> + Sync + 's;

/// Runs the stream's worker threads over the units ([`work`]), each with its own ring of two
/// pinned buffers of a unit each ([`PinnedRing`], `Shared::unit_len`), so that its copies overlap
/// its file I/O and digests.
fn run(shared: &Shared<'_>, way: Way, step: &Step<'_>) -> u32 {
    let workers = shared.workers.clamp(1, shared.units.len().max(1));
    let fail = |e: DataFileError| {
        shared.failed.store(true, Ordering::Release);
        shared
            .first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(e);
    };
    std::thread::scope(|s| {
        for _ in 0..workers {
            let work = || {
                if let Err(e) = work(shared, way, step) {
                    fail(e);
                }
            };
            if let Err(e) = std::thread::Builder::new()
                .name("cuinterpose-file".into())
                .spawn_scoped(s, work)
            {
                fail(DataFileError::Spawn(e));
            }
        }
    });
    u32::try_from(workers).unwrap_or(u32::MAX)
}

/// One worker: takes the next unit until none is left (or another worker failed), entering
/// each unit's device context as needed. A save copies each unit into the ring before it does
/// the unit taken before ([`Way::Save`]); a unit on another device, and the end, wait for
/// every copy of the ring under the context that queued it.
fn work(shared: &Shared<'_>, way: Way, step: &Step<'_>) -> Result<(), DataFileError> {
    // Declared before the ring, so dropped after it: pinned buffers and streams are freed under
    // the context that made them.
    let mut context: Option<(i32, copy::DeviceContext<'_>)> = None;
    let mut ring: Option<PinnedRing<'_>> = None;
    // A save's unit copied ahead, and the buffer it is in.
    let mut ahead: Option<(&Unit, usize)> = None;
    loop {
        let failed = shared.failed.load(Ordering::Acquire);
        let unit = if failed {
            None
        } else {
            shared.units.get(shared.next.fetch_add(1, Ordering::AcqRel))
        };
        let current = context.as_ref().map(|(d, _)| *d);
        if unit.is_none_or(|u| current.is_some_and(|d| d != u.device)) {
            // Leaving the context: the unit held ahead, then every copy.
            if let (Some((held, slot)), Some(ring), false) = (ahead.take(), ring.as_mut(), failed) {
                step(shared, held, ring, slot)?;
            }
            if let Some(mut done) = ring.take() {
                timed(&shared.wait_micros, || done.finish())?;
                timed(&shared.setup_micros, || drop(done));
            }
        }
        let Some(unit) = unit else {
            return Ok(());
        };
        if current != Some(unit.device) {
            // Leaving the previous device's context and entering this one's: setup.
            let entered = timed(&shared.setup_micros, || {
                drop(context.take());
                copy::enter(shared.real, unit.device)
            })?;
            context = Some((unit.device, entered));
        }
        let ring = match &mut ring {
            Some(ring) => ring,
            none => none.insert(timed(&shared.setup_micros, || {
                PinnedRing::new(shared.real, unit.device, shared.unit_len)
            })?),
        };
        let slot = ring.next_slot();
        match way {
            Way::Load => step(shared, unit, ring, slot)?,
            Way::Save => {
                timed(&shared.wait_micros, || {
                    ring.receive(slot, unit.va, unit.len)
                })?;
                if let Some((held, held_slot)) = ahead.replace((unit, slot)) {
                    step(shared, held, ring, held_slot)?;
                }
            }
        }
    }
}

fn driver_error(device: i32) -> impl Fn(cuda::CudaError) -> DataFileError {
    move |e| {
        DataFileError::Copy(CopyError::Driver {
            call: e.call,
            device,
            result: e.result,
        })
    }
}

/// Writes every region into `file` (empty, opened for writing) at its extent (from [`layout`])
/// and returns the file's record: the extents with their digests, and the zero blocks. The file
/// has `length` bytes at the end (trailing zero blocks are holes too) and is synced.
pub fn write(
    real: &Real,
    file: BorrowedFd<'_>,
    regions: &[Region],
    length: u64,
    workers: usize,
) -> Result<(DataFile, StreamStats), DataFileError> {
    let start = Instant::now();
    let digests = TreeDigests::new(regions.iter().map(|r| r.extent.size), IO_SIZE);
    let shared = Shared::new(real, file, regions, workers, IO_SIZE, digests);
    let zero_blocks = Mutex::new(Vec::new());
    let step = |shared: &Shared<'_>, unit: &Unit, ring: &mut PinnedRing<'_>, slot: usize| {
        // The unit's bytes, copied into the buffer ahead (Way::Save).
        let mut filling = timed(&shared.wait_micros, || ring.filling(slot))?;
        let buffer = filling
            .bytes(0, shared.unit_len)
            .ok_or_else(|| DataFileError::Mismatch("a unit larger than its buffer".into()))?;
        let bytes = buffer
            .get_mut(..unit.len)
            .ok_or_else(|| DataFileError::Mismatch("a unit larger than its buffer".into()))?;
        let runs = runs(unit, |at, len| bytes.get(at..at + len).is_some_and(is_zero));
        for (at, len, zero) in runs {
            if zero {
                shared.zero_bytes.fetch_add(len as u64, Ordering::Relaxed);
                let mut blocks = zero_blocks.lock().unwrap_or_else(|e| e.into_inner());
                let first = (unit.offset + at as u64) / DATA_ALIGN;
                blocks.extend(first..first + (len as u64).div_ceil(DATA_ALIGN));
                continue;
            }
            // A run ending inside a block is the end of its allocation: padded with zeros to the
            // page for O_DIRECT (the gap after an extent is never read as data).
            let padded = len.next_multiple_of(PAGE);
            if let Some(pad) = buffer.get_mut(at + len..at + padded) {
                pad.fill(0);
            }
            let run = buffer
                .get(at..at + padded)
                .ok_or_else(|| DataFileError::Mismatch("a run past its buffer".into()))?;
            timed(&shared.io_micros, || {
                write_all(shared.file, &shared.direct, run, unit.offset + at as u64)
            })?;
            shared.file_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        let hashed = buffer.get(..unit.len).unwrap_or_default();
        shared.hash(unit, hashed)
    };
    let threads = run(&shared, Way::Save, &step);
    if let Some(e) = take_error(&shared) {
        return Err(e);
    }
    rustix::fs::ftruncate(file, length).map_err(|e| DataFileError::Write {
        offset: length,
        source: e.into(),
    })?;
    rustix::fs::fsync(file).map_err(|e| DataFileError::Write {
        offset: length,
        source: e.into(),
    })?;
    let mut zero_blocks = zero_blocks.into_inner().unwrap_or_else(|e| e.into_inner());
    zero_blocks.sort_unstable();
    let stats = shared.stats(shared.direct.on.load(Ordering::Acquire), threads, start);
    let extents = regions
        .iter()
        .zip(shared.digests.finish()?)
        .map(|(r, blake3)| Extent { blake3, ..r.extent })
        .collect();
    let record = DataFile {
        length,
        extents,
        zero_blocks,
        blocks: None,
    };
    Ok((record, stats))
}

/// Reads the regions' extents of `record`'s file back into them, setting zero blocks to zero on
/// the device, and checks each extent's digest. On any error the regions' contents are undefined
/// (the caller releases them).
pub fn read(
    real: &Real,
    file: BorrowedFd<'_>,
    regions: &[Region],
    record: &DataFile,
    workers: usize,
) -> Result<StreamStats, DataFileError> {
    let start = Instant::now();
    if regions.is_empty() {
        // Nothing was released (a rollback before Release): the file is not needed.
        return Ok(StreamStats::default());
    }
    let size = rustix::fs::fstat(file)
        .map(|st| u64::try_from(st.st_size).unwrap_or(0))
        .map_err(|e| DataFileError::Read {
            offset: 0,
            source: e.into(),
        })?;
    if size < record.length {
        return Err(DataFileError::Truncated { offset: size });
    }
    let digests = TreeDigests::new(regions.iter().map(|r| r.extent.size), IO_SIZE);
    let shared = Shared::new(real, file, regions, workers, IO_SIZE, digests);
    let zero_block = |offset: u64| {
        record
            .zero_blocks
            .binary_search(&(offset / DATA_ALIGN))
            .is_ok()
    };
    let step = |shared: &Shared<'_>, unit: &Unit, ring: &mut PinnedRing<'_>, slot: usize| {
        let mut filling = timed(&shared.wait_micros, || ring.filling(slot))?;
        let runs = runs(unit, |at, _| zero_block(unit.offset + at as u64));
        for (at, len, zero) in runs {
            let dev = unit.va + at as u64;
            if zero {
                shared
                    .real
                    .memset_d8(dev, 0, len)
                    .map_err(driver_error(unit.device))?;
                if let Some(bytes) = filling.bytes(at, len) {
                    bytes.fill(0);
                }
                shared.zero_bytes.fetch_add(len as u64, Ordering::Relaxed);
                continue;
            }
            let padded = len.next_multiple_of(PAGE);
            let run = filling
                .bytes(at, padded)
                .ok_or_else(|| DataFileError::Mismatch("a run past its buffer".into()))?;
            timed(&shared.io_micros, || {
                read_exact(shared.file, &shared.direct, run, unit.offset + at as u64)
            })?;
            // Asynchronous: the device takes this run while the next one is read.
            filling.send(shared.real, at, len, dev)?;
            shared.file_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        // The digest reads the unit while the device may still read it too; the load is
        // checked as a whole once every worker has finished (below).
        let hashed = filling
            .filled(unit.len)
            .ok_or_else(|| DataFileError::Mismatch("a unit larger than its buffer".into()))?;
        shared.hash(unit, hashed)
    };
    let threads = run(&shared, Way::Load, &step);
    if let Some(e) = take_error(&shared) {
        return Err(e);
    }
    let streamed = shared.stats(shared.direct.on.load(Ordering::Acquire), threads, start);
    for (r, found) in regions.iter().zip(shared.digests.finish()?) {
        if found != r.extent.blake3 {
            return Err(DataFileError::Digest {
                id: r.extent.id,
                expected: hex(&r.extent.blake3),
                found: hex(&found),
            });
        }
    }
    synchronize(real, regions)?;
    Ok(StreamStats {
        micros: micros_since(start),
        ..streamed
    })
}

/// The workers' state of a stream through a block store: the file is the store's directory, and
/// no tree digest is kept (each block has its own).
fn new_shared<'a>(
    real: &'a Real,
    store: BorrowedFd<'a>,
    regions: &[Region],
    workers: usize,
) -> Shared<'a> {
    Shared::new(
        real,
        store,
        regions,
        workers,
        BLOCK,
        TreeDigests::new(std::iter::empty(), IO_SIZE),
    )
}

/// Hashes one block, counting the time.
fn hash_block(shared: &Shared<'_>, bytes: &[u8]) -> [u8; 32] {
    timed(&shared.hash_micros, || *blake3::hash(bytes).as_bytes())
}

/// Each extent with its digest in a block store's record: [`protocol::message::block_list_digest`]
/// of its blocks.
fn with_list_digests(record: &DataFile, blocks: &[StoredBlock]) -> Vec<Extent> {
    record
        .extents
        .iter()
        .map(|e| {
            let first = e.offset / DATA_ALIGN;
            let count = e.size.div_ceil(DATA_ALIGN);
            let digests = blocks
                .iter()
                .filter(|b| (first..first + count).contains(&b.index))
                .map(|b| b.digest);
            Extent {
                blake3: protocol::message::block_list_digest(digests),
                ..*e
            }
        })
        .collect()
}

/// SaveTo into a block store: every region's blocks that are not all zeros go into the store whose
/// directory is `store`, each under its BLAKE3 unless the store holds it already
/// ([`blockstore::put`]). Returns the record (the layout of [`layout`], the zero blocks, the
/// block digests; each extent's digest is the digest of its block list).
pub fn write_blocks(
    real: &Real,
    store: BorrowedFd<'_>,
    regions: &[Region],
    length: u64,
    workers: usize,
) -> Result<(DataFile, StreamStats), DataFileError> {
    let start = Instant::now();
    let shared = new_shared(real, store, regions, workers);
    let direct = blockstore::Direct::for_store(store);
    let batch = blockstore::Batch::new(store);
    let found = Mutex::new(Vec::<(u64, Option<[u8; 32]>)>::new());
    let step = |shared: &Shared<'_>, unit: &Unit, ring: &mut PinnedRing<'_>, slot: usize| {
        // The unit's bytes, copied into the buffer ahead (Way::Save).
        let mut filling = timed(&shared.wait_micros, || ring.filling(slot))?;
        let buffer = filling
            .bytes(0, shared.unit_len)
            .ok_or_else(|| DataFileError::Mismatch("a unit larger than its buffer".into()))?;
        let mut at = 0;
        let mut here = Vec::new();
        while at < unit.len {
            let len = BLOCK.min(unit.len - at);
            let index = (unit.offset + at as u64) / DATA_ALIGN;
            let block = buffer.get(at..at + len).unwrap_or_default();
            if is_zero(block) {
                shared.zero_bytes.fetch_add(len as u64, Ordering::Relaxed);
                here.push((index, None));
                at += len;
                continue;
            }
            let digest = hash_block(shared, block);
            // An allocation's last block ends inside it: padded with zeros to the page for
            // O_DIRECT (the block file is cut to its length).
            let padded = len.next_multiple_of(PAGE);
            if let Some(pad) = buffer.get_mut(at + len..at + padded) {
                pad.fill(0);
            }
            let data = buffer
                .get(at..at + padded)
                .ok_or_else(|| DataFileError::Mismatch("a block past its buffer".into()))?;
            match timed(&shared.io_micros, || {
                blockstore::put(&batch, &digest, data, len, &direct)
            })? {
                Put::Written => shared.file_bytes.fetch_add(len as u64, Ordering::Relaxed),
                Put::Present => shared.shared_bytes.fetch_add(len as u64, Ordering::Relaxed),
            };
            here.push((index, Some(digest)));
            at += len;
        }
        found.lock().unwrap_or_else(|e| e.into_inner()).extend(here);
        Ok(())
    };
    let threads = run(&shared, Way::Save, &step);
    if let Some(e) = take_error(&shared) {
        return Err(e);
    }
    let raced = batch.commit()?;
    shared.file_bytes.fetch_sub(raced, Ordering::Relaxed);
    shared.shared_bytes.fetch_add(raced, Ordering::Relaxed);
    let mut found = found.into_inner().unwrap_or_else(|e| e.into_inner());
    found.sort_unstable_by_key(|(index, _)| *index);
    let mut record = DataFile {
        length,
        extents: regions.iter().map(|r| r.extent).collect(),
        zero_blocks: found
            .iter()
            .filter(|(_, d)| d.is_none())
            .map(|(i, _)| *i)
            .collect(),
        blocks: Some(found.iter().filter_map(|(_, d)| *d).collect()),
    };
    let blocks = record.stored_blocks().ok_or_else(|| {
        DataFileError::Mismatch("the blocks written do not cover the layout".into())
    })?;
    record.extents = with_list_digests(&record, &blocks);
    Ok((record, shared.stats(direct.on(), threads, start)))
}

/// LoadFrom a block store: reads the blocks of `record` (a block store's) for the regions' extents
/// from the store whose directory is `store`, each checked against its digest as it is read, and
/// sets zero blocks to zero on the device. On any error the regions' contents are undefined.
pub fn read_blocks(
    real: &Real,
    store: BorrowedFd<'_>,
    regions: &[Region],
    record: &DataFile,
    workers: usize,
) -> Result<StreamStats, DataFileError> {
    let start = Instant::now();
    if regions.is_empty() {
        return Ok(StreamStats::default());
    }
    let blocks = record.stored_blocks().ok_or_else(|| {
        DataFileError::Mismatch("its block list does not match its layout".into())
    })?;
    // The record is the one this process wrote (load_from compares them), so the extents'
    // digests are of these block lists; checked all the same, before any byte is read.
    for (extent, ours) in record
        .extents
        .iter()
        .zip(with_list_digests(record, &blocks))
    {
        if extent.blake3 != ours.blake3 {
            return Err(DataFileError::Digest {
                id: extent.id,
                expected: hex(&extent.blake3),
                found: hex(&ours.blake3),
            });
        }
    }
    let by_index: std::collections::HashMap<u64, StoredBlock> =
        blocks.iter().map(|b| (b.index, *b)).collect();
    let shared = new_shared(real, store, regions, workers);
    let direct = blockstore::Direct::for_store(store);
    let step = |shared: &Shared<'_>, unit: &Unit, ring: &mut PinnedRing<'_>, slot: usize| {
        let mut filling = timed(&shared.wait_micros, || ring.filling(slot))?;
        let mut at = 0;
        while at < unit.len {
            let len = BLOCK.min(unit.len - at);
            let index = (unit.offset + at as u64) / DATA_ALIGN;
            let dev = unit.va + at as u64;
            let digest = by_index
                .get(&index)
                .filter(|b| b.len == len as u64)
                .map(|b| b.digest)
                .ok_or_else(|| {
                    DataFileError::Mismatch(format!("no block {index} of {len} bytes"))
                })?;
            let Some(digest) = digest else {
                shared
                    .real
                    .memset_d8(dev, 0, len)
                    .map_err(driver_error(unit.device))?;
                shared.zero_bytes.fetch_add(len as u64, Ordering::Relaxed);
                at += len;
                continue;
            };
            let padded = len.next_multiple_of(PAGE);
            let space = filling
                .bytes(at, padded)
                .ok_or_else(|| DataFileError::Mismatch("a block past its buffer".into()))?;
            timed(&shared.io_micros, || {
                blockstore::get(shared.file, &digest, space, len, &direct)
            })?;
            let data = space.get(..len).unwrap_or_default();
            let found = hash_block(shared, data);
            if found != digest {
                return Err(DataFileError::BlockDigest {
                    path: protocol::message::block_path(&digest),
                    found: hex(&found),
                });
            }
            // Asynchronous: the device takes this block while the next one is read and hashed.
            filling.send(shared.real, at, len, dev)?;
            shared.file_bytes.fetch_add(len as u64, Ordering::Relaxed);
            at += len;
        }
        Ok(())
    };
    let threads = run(&shared, Way::Load, &step);
    if let Some(e) = take_error(&shared) {
        return Err(e);
    }
    synchronize(real, regions)?;
    Ok(shared.stats(direct.on(), threads, start))
}

fn take_error(shared: &Shared<'_>) -> Option<DataFileError> {
    shared
        .first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
}

/// Memsets of device memory may still run after they return; the rebuilt memory must hold its
/// bytes before anyone maps it.
fn synchronize(real: &Real, regions: &[Region]) -> Result<(), DataFileError> {
    let mut devices: Vec<i32> = regions.iter().map(|r| r.device).collect();
    devices.sort_unstable();
    devices.dedup();
    for device in devices {
        let _ctx = copy::enter(real, device)?;
        real.ctx_synchronize().map_err(driver_error(device))?;
    }
    Ok(())
}

/// Lower-case hex of a digest.
pub fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_abi::{CUmemAllocationProp, CUmemLocation, allocation_type, location_type};
    use std::os::fd::AsFd;

    const MIB: usize = 1 << 20;
    /// The fewest a tool sends: several threads share the units, as in every stream.
    const TEST_WORKERS: usize = protocol::message::MIN_DATA_WORKERS as usize;

    /// A mapped test-driver allocation of `len` bytes: a pattern, with the 2 MiB blocks listed in
    /// `zero` all zeros.
    fn allocation(real: &Real, len: usize, salt: u8, zero: &[usize]) -> (u64, Vec<u8>) {
        allocation_on(real, 0, len, salt, zero)
    }

    /// [`allocation`] on `device`.
    fn allocation_on(
        real: &Real,
        device: i32,
        len: usize,
        salt: u8,
        zero: &[usize],
    ) -> (u64, Vec<u8>) {
        let prop = CUmemAllocationProp {
            type_: allocation_type::PINNED,
            location: CUmemLocation {
                type_: location_type::DEVICE,
                id: device,
            },
            ..Default::default()
        };
        let handle = real.mem_create(len, &prop, 0).expect("create");
        let va = real.mem_address_reserve(len, 0, 0, 0).expect("reserve");
        real.mem_map(va, len, 0, handle, 0).expect("map");
        let mut bytes: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(29) ^ salt | 1)
            .collect();
        for &b in zero {
            bytes[b * BLOCK..((b + 1) * BLOCK).min(len)].fill(0);
        }
        real.memcpy_htod(va, &bytes).expect("fill");
        (va, bytes)
    }

    fn device(real: &Real, va: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        real.memcpy_dtoh(&mut out, va).expect("read back");
        out
    }

    #[test]
    fn a_data_file_round_trips_with_zero_blocks_elided_and_digests_checked() {
        let real = testdriver::real();
        // 20 MiB: three units (8, 8, 4 MiB), blocks 1 and 4-5 zero (5 ends a unit); then an
        // allocation that ends inside a block, its last block zero.
        let (a_len, b_len) = (20 * MIB, 4 * MIB + 64 * 1024);
        let (a, a_bytes) = allocation(&real, a_len, 3, &[1, 4, 5]);
        let (b, b_bytes) = allocation(&real, b_len, 9, &[2]);
        let ids = [AllocationId([1; 16]), AllocationId([2; 16])];
        let (extents, length) = layout(&[(ids[0], a_len as u64), (ids[1], b_len as u64)]);
        assert_eq!(extents[1].offset, 20 * MIB as u64, "aligned to the block");
        assert_eq!(length, 26 * MIB as u64);
        let regions: Vec<Region> = [a, b]
            .iter()
            .zip(&extents)
            .map(|(&va, &extent)| Region {
                device: 0,
                va,
                extent,
            })
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gpu.data");
        let file = std::fs::File::create_new(&path).expect("create");
        let (record, stats) =
            write(&real, file.as_fd(), &regions, length, TEST_WORKERS).expect("write");
        assert_eq!(record.zero_blocks, vec![1, 4, 5, 12]);
        let zero = 3 * BLOCK as u64 + (64 * 1024);
        assert_eq!(stats.zero_bytes, zero);
        assert_eq!(stats.file_bytes, (a_len + b_len) as u64 - zero);
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), length);
        assert_eq!(
            record.extents[0].blake3,
            *blake3::hash(&a_bytes).as_bytes(),
            "each extent's digest is BLAKE3 of the allocation's bytes"
        );
        assert_eq!(record.extents[1].blake3, *blake3::hash(&b_bytes).as_bytes());
        let on_disk = std::fs::read(&path).expect("read");
        assert!(on_disk[..a_len] == a_bytes[..], "written in place");

        let regions: Vec<Region> = regions
            .iter()
            .zip(&record.extents)
            .map(|(r, &extent)| Region { extent, ..*r })
            .collect();
        // Poison the device copy, then read back: zero blocks come back as zeros unread.
        real.memcpy_htod(a, &vec![0xee; a_len]).expect("wipe");
        real.memcpy_htod(b, &vec![0xee; b_len]).expect("wipe");
        let file = std::fs::File::open(&path).expect("open");
        let read_stats = read(&real, file.as_fd(), &regions, &record, TEST_WORKERS).expect("read");
        assert_eq!(read_stats.zero_bytes, zero);
        assert_eq!(read_stats.file_bytes, stats.file_bytes);
        assert!(device(&real, a, a_len) == a_bytes, "first allocation back");
        assert!(device(&real, b, b_len) == b_bytes, "second allocation back");

        // One byte changed: refused by its allocation's digest.
        let mut bad = on_disk.clone();
        bad[(20 * MIB) + 7] ^= 1;
        std::fs::write(&path, &bad).expect("corrupt");
        let file = std::fs::File::open(&path).expect("open");
        let error =
            read(&real, file.as_fd(), &regions, &record, TEST_WORKERS).expect_err("corrupt");
        assert!(
            matches!(error, DataFileError::Digest { id, .. } if id == ids[1]),
            "{error}"
        );
        // Cut short: refused as truncated before anything is read.
        std::fs::write(&path, &on_disk[..12 * MIB]).expect("truncate");
        let file = std::fs::File::open(&path).expect("open");
        let error = read(&real, file.as_fd(), &regions, &record, TEST_WORKERS).expect_err("short");
        assert!(matches!(error, DataFileError::Truncated { .. }), "{error}");
    }

    /// One worker streams units of two devices in turn (device 0, 1, then 0 again): at each
    /// change it finishes the unit it holds ahead and waits for every copy of its ring under the
    /// context that queued them, then makes a ring under the next device's context. Both ways
    /// bring every byte back.
    #[test]
    fn one_worker_streams_allocations_of_two_devices_in_turn() {
        let real = testdriver::real();
        let lens = [10 * MIB, 6 * MIB + 4096, 8 * MIB];
        let made: Vec<(i32, u64, Vec<u8>)> = [0, 1, 0]
            .into_iter()
            .zip(lens)
            .enumerate()
            .map(|(k, (device, len))| {
                let (va, bytes) = allocation_on(&real, device, len, 11 + k as u8, &[]);
                (device, va, bytes)
            })
            .collect();
        let ids: Vec<(AllocationId, u64)> = lens
            .iter()
            .enumerate()
            .map(|(k, &len)| (AllocationId([k as u8 + 1; 16]), len as u64))
            .collect();
        let (extents, length) = layout(&ids);
        let regions: Vec<Region> = made
            .iter()
            .zip(&extents)
            .map(|((device, va, _), &extent)| Region {
                device: *device,
                va: *va,
                extent,
            })
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gpu.data");
        let file = std::fs::File::create_new(&path).expect("create");
        let (record, stats) = write(&real, file.as_fd(), &regions, length, 1).expect("write");
        assert_eq!(stats.threads, 1);
        for ((_, _, bytes), extent) in made.iter().zip(&record.extents) {
            assert_eq!(extent.blake3, *blake3::hash(bytes).as_bytes());
        }
        let regions: Vec<Region> = regions
            .iter()
            .zip(&record.extents)
            .map(|(r, &extent)| Region { extent, ..*r })
            .collect();
        for (_, va, bytes) in &made {
            real.memcpy_htod(*va, &vec![0xee; bytes.len()])
                .expect("wipe");
        }
        let file = std::fs::File::open(&path).expect("open");
        let read_stats = read(&real, file.as_fd(), &regions, &record, 1).expect("read");
        assert_eq!(read_stats.threads, 1);
        for (k, (_, va, bytes)) in made.iter().enumerate() {
            assert!(
                device(&real, *va, bytes.len()) == *bytes,
                "allocation {k} back"
            );
        }
    }

    #[test]
    fn blocks_go_into_the_store_once_and_come_back_checked() {
        let real = testdriver::real();
        // Two replicas of 6 MiB + 64 KiB (their last block partial), block 1 zero in both; a
        // third allocation shares its first block with them.
        let len = 6 * MIB + 64 * 1024;
        // The pattern repeats every 256 bytes: each block stamped with its index and a tag,
        // so that only the blocks meant to be equal are.
        let stamp = |va: u64, bytes: &mut Vec<u8>, tag: u8| {
            for (k, block) in bytes.chunks_mut(BLOCK).enumerate() {
                if block.iter().any(|&x| x != 0) {
                    block[0] = k as u8;
                    block[1] = tag;
                }
            }
            real.memcpy_htod(va, bytes).expect("stamp");
        };
        let (a, mut a_bytes) = allocation(&real, len, 3, &[1]);
        stamp(a, &mut a_bytes, 1);
        let (b, mut b_bytes) = allocation(&real, len, 3, &[1]);
        stamp(b, &mut b_bytes, 1);
        let (c, mut c_bytes) = allocation(&real, 4 * MIB, 11, &[]);
        c_bytes[..BLOCK].copy_from_slice(&a_bytes[..BLOCK]);
        stamp(c, &mut c_bytes, 2);
        c_bytes[..BLOCK].copy_from_slice(&a_bytes[..BLOCK]);
        real.memcpy_htod(c, &c_bytes).expect("share a block");
        let ids = [
            AllocationId([1; 16]),
            AllocationId([2; 16]),
            AllocationId([3; 16]),
        ];
        let (extents, length) = layout(&[
            (ids[0], len as u64),
            (ids[1], len as u64),
            (ids[2], 4 * MIB as u64),
        ]);
        let regions: Vec<Region> = [a, b, c]
            .iter()
            .zip(&extents)
            .map(|(&va, &extent)| Region {
                device: 0,
                va,
                extent,
            })
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let store = std::fs::File::open(dir.path()).expect("store");
        let (record, stats) =
            write_blocks(&real, store.as_fd(), &regions, length, TEST_WORKERS).expect("write");
        // Blocks: a 0..4 (1 zero, 3 partial), b 4..8 (5 zero), c 8..10 (8 = a's block 0).
        assert_eq!(record.zero_blocks, vec![1, 5]);
        let digests = record.blocks.clone().expect("a block list");
        assert_eq!(digests.len(), 8);
        assert_eq!(digests[0], *blake3::hash(&a_bytes[..BLOCK]).as_bytes());
        assert_eq!(
            digests[0..3],
            digests[3..6],
            "replicas name the same blocks"
        );
        assert_eq!(digests[6], digests[0], "a block shared across allocations");
        let distinct = 4 * MIB + 64 * 1024 + 2 * MIB;
        assert_eq!(
            stats.file_bytes, distinct as u64,
            "each distinct block written once"
        );
        assert_eq!(
            stats.shared_bytes,
            2 * (len - BLOCK) as u64 - distinct as u64 + 4 * MIB as u64
        );
        assert_eq!(stats.zero_bytes, 2 * BLOCK as u64);
        let partial = dir.path().join(protocol::message::block_path(&digests[2]));
        assert_eq!(std::fs::metadata(&partial).expect("stat").len(), 64 * 1024);

        // A second write of the same bytes writes nothing.
        let (again, second) = write_blocks(&real, store.as_fd(), &regions, length, TEST_WORKERS)
            .expect("write again");
        assert_eq!(again, record);
        assert_eq!(second.file_bytes, 0);
        assert_eq!(second.shared_bytes, stats.file_bytes + stats.shared_bytes);

        let regions: Vec<Region> = regions
            .iter()
            .zip(&record.extents)
            .map(|(r, &extent)| Region { extent, ..*r })
            .collect();
        for (va, n) in [(a, len), (b, len), (c, 4 * MIB)] {
            real.memcpy_htod(va, &vec![0xee; n]).expect("wipe");
        }
        let read =
            read_blocks(&real, store.as_fd(), &regions, &record, TEST_WORKERS).expect("read");
        assert_eq!(read.zero_bytes, 2 * BLOCK as u64);
        assert!(device(&real, a, len) == a_bytes, "first replica back");
        assert!(device(&real, b, len) == b_bytes, "second replica back");
        assert!(
            device(&real, c, 4 * MIB) == c_bytes,
            "the sharing allocation back"
        );

        // A block whose bytes changed under its name: refused by its digest.
        let shared = dir.path().join(protocol::message::block_path(&digests[0]));
        let mut bytes = std::fs::read(&shared).expect("read block");
        bytes[7] ^= 1;
        std::fs::write(&shared, &bytes).expect("corrupt");
        let error = read_blocks(&real, store.as_fd(), &regions, &record, TEST_WORKERS)
            .expect_err("corrupt");
        assert!(
            matches!(error, DataFileError::BlockDigest { .. }),
            "{error}"
        );
        // Missing: refused.
        std::fs::remove_file(&shared).expect("remove");
        let error = read_blocks(&real, store.as_fd(), &regions, &record, TEST_WORKERS)
            .expect_err("missing");
        assert!(matches!(error, DataFileError::Block(_)), "{error}");
        // A record whose extent digest is not of its block list: refused before reading.
        let mut edited = record.clone();
        edited.extents[2].blake3[0] ^= 1;
        let error =
            read_blocks(&real, store.as_fd(), &regions, &edited, TEST_WORKERS).expect_err("edited");
        assert!(matches!(error, DataFileError::Digest { .. }), "{error}");
    }
}
