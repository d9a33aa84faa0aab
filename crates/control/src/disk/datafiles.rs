//! The data files of a checkpoint to disk: by default kept as blocks in the block store beside the
//! checkpoint (super::store: the tool hands each shim the store's directory with SaveTo, and the
//! shim stores the blocks the store does not hold yet); with `--self-contained`, the tool creates
//! one per creating process in the checkpoint's `data/` directory, hands it to the process's shim with SaveTo (the shim streams
//! its shared allocations into it, crates/shim-runtime/src/datafile.rs) and records what the shim
//! answered in the manifest; at restore it checks every file's presence and length against the
//! manifest before anything changes, and hands each back with LoadFrom, whose shim checks the
//! digests as it reads (or, asked to, the tool reads and checks them all first).
//!
//! One file per process rather than per allocation: a frame carries one descriptor, a process's
//! allocations then stream through one sequence of large writes, and a group of thousands of
//! allocations does not make thousands of files. The files are opened with `O_DIRECT` where the
//! filesystem takes it (tmpfs refuses it at open), which keeps the page cache from holding a
//! second copy of GPU memory and lets the disk run at its streaming rate.

use super::damaged;
use super::store::{BlockStore, PENDING_BLOCKS};
use crate::ControlError;
use crate::group::{Participant, Streamed};
use crate::phases::FileBytes;
use crate::progress::Progress;
use crate::state_error;
use protocol::Request;
use protocol::manifest::{DataFileEntry, data_file_name};
use protocol::message::DATA_ALIGN;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Sub-directory of the data files in a checkpoint directory.
pub const DATA_DIR: &str = "data";

/// Name of the record kept beside a group's state file while its shared bytes are only in data
/// files (from the end of SaveTo until the checkpoint is complete or rolled back, and during a
/// restore's rebuild): where the files are and what they hold, so that `cuinterpose resume` after
/// such a run was killed loads them back.
pub const DATA_FILES_RECORD: &str = "cuinterpose.datafiles";

/// The data files of one checkpoint, and what each shim wrote into its own.
#[derive(Debug)]
pub struct DataFiles {
    dir: PathBuf,
    /// The block store the files are kept in (the default); `None`: files in `dir`.
    store: Option<BlockStore>,
    /// By namespace PID: what SaveTo answered, or what the manifest lists.
    written: Mutex<BTreeMap<u32, DataFileEntry>>,
    /// Where SaveTo's results are recorded for `resume` ([`DATA_FILES_RECORD`]), if anywhere.
    record: Option<PathBuf>,
    /// The shims' streaming work, summed over them: by SaveTo, and by LoadFrom.
    saved: Mutex<Work>,
    loaded: Mutex<Work>,
}

/// Worker time of data-file streaming, summed over the shims.
#[derive(Debug, Default, Clone, Copy)]
struct Work {
    setup_micros: u64,
    io_micros: u64,
    hash_micros: u64,
    wait_micros: u64,
    /// In all: each shim's threads times its streaming's wall time.
    worker_micros: u64,
}

impl Work {
    fn add(&mut self, stats: &protocol::message::StreamStats) {
        self.setup_micros = self.setup_micros.saturating_add(stats.setup_micros);
        self.io_micros = self.io_micros.saturating_add(stats.io_micros);
        self.hash_micros = self.hash_micros.saturating_add(stats.hash_micros);
        self.wait_micros = self.wait_micros.saturating_add(stats.wait_micros);
        self.worker_micros = self
            .worker_micros
            .saturating_add(u64::from(stats.threads).saturating_mul(stats.micros));
    }

    fn shares(self) -> Option<WorkerTime> {
        let share = |micros: u64| micros as f64 / self.worker_micros as f64;
        (self.worker_micros > 0).then(|| WorkerTime {
            setup: share(self.setup_micros),
            io: share(self.io_micros),
            digests: share(self.hash_micros),
            copy_waits: share(self.wait_micros),
        })
    }
}

/// How the shims' data-file workers spent a streaming: each share is that activity's time summed
/// over the workers, over threads x wall time summed over the shims (what is left is taking the
/// next unit, zero checks, queuing copies, and a worker that finished before the others). The
/// largest share is what sets the pace: the storage (`io`), the CPUs (`digests`), the copies to
/// or from the device (`copy_waits`), or making the pinned buffers (`setup`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct WorkerTime {
    /// Entering device contexts, making and freeing pinned buffers and streams.
    pub setup: f64,
    /// Reading or writing the data files or the block store.
    pub io: f64,
    /// Hashing: at most what the digests cost the streaming (target <= 10%).
    pub digests: f64,
    /// Waiting for copies to or from the device.
    pub copy_waits: f64,
}

/// Which streaming [`DataFiles::worker_time`] is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streaming {
    Save,
    Load,
}

/// The content of [`DATA_FILES_RECORD`].
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    dir: PathBuf,
    files: Vec<DataFileEntry>,
    /// The files are kept in the block store of the checkpoint `dir` is the data directory of.
    #[serde(default)]
    store: bool,
}

/// The record beside the state file `state`.
fn record_path(state: &Path) -> PathBuf {
    state.with_file_name(DATA_FILES_RECORD)
}

/// Removes the record beside the state file `state` (the bytes are back, or in a complete
/// checkpoint).
pub fn remove_record(state: &Path) {
    let _ = std::fs::remove_file(record_path(state));
}

impl DataFiles {
    /// The data files of a new checkpoint in `checkpoint` (none written yet), kept in `store`
    /// when given, else as files in `data/`.
    /// SaveTo's results are recorded beside the state file `state` ([`DATA_FILES_RECORD`]).
    pub fn new(checkpoint: &Path, state: &Path, store: Option<BlockStore>) -> DataFiles {
        DataFiles {
            dir: checkpoint.join(DATA_DIR),
            store,
            written: Mutex::new(BTreeMap::new()),
            record: Some(record_path(state)),
            saved: Mutex::default(),
            loaded: Mutex::default(),
        }
    }

    /// The data files a manifest lists, in `checkpoint` or in its block store (which must
    /// exist when an entry lists blocks: a refusal otherwise).
    pub fn listed(checkpoint: &Path, entries: &[DataFileEntry]) -> Result<DataFiles, ControlError> {
        let store = if entries.iter().any(|e| e.blocks.is_some()) {
            Some(BlockStore::open(checkpoint)?)
        } else {
            None
        };
        Ok(DataFiles {
            dir: checkpoint.join(DATA_DIR),
            store,
            written: Mutex::new(entries.iter().map(|e| (e.ns_pid, e.clone())).collect()),
            record: None,
            saved: Mutex::default(),
            loaded: Mutex::default(),
        })
    }

    /// The block store the files are kept in, if they are.
    pub fn store(&self) -> Option<&BlockStore> {
        self.store.as_ref()
    }

    /// Whether the files sit in memory (tmpfs), where streaming them is CPU work
    /// ([`workers_for`]).
    fn in_memory(&self) -> bool {
        match &self.store {
            Some(store) => copy::direct_io::in_memory(store.fd()),
            None => dir_in_memory(&self.dir),
        }
    }

    /// The data files recorded beside the state file `state`, if a checkpoint or restore left
    /// a record there.
    pub fn recorded(state: &Path) -> Result<Option<DataFiles>, ControlError> {
        let path = record_path(state);
        // Read without following a link or waiting on a FIFO (crate::safefs), as every file of
        // a checkpoint.
        let bytes = match crate::safefs::read_regular(&path, 64 << 20) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(state_error(&path, e)),
        };
        let record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| state_error(&path, std::io::Error::other(e)))?;
        let store = if record.store {
            // `dir` is the checkpoint's data directory: the store is its checkpoint's.
            let checkpoint = record.dir.parent().unwrap_or(&record.dir);
            Some(BlockStore::open(checkpoint)?)
        } else {
            None
        };
        Ok(Some(DataFiles {
            dir: record.dir,
            store,
            written: Mutex::new(record.files.into_iter().map(|e| (e.ns_pid, e)).collect()),
            record: None,
            saved: Mutex::default(),
            loaded: Mutex::default(),
        }))
    }

    /// Writes what these files hold beside the state file `state` ([`DATA_FILES_RECORD`]).
    pub fn write_record(&self, state: &Path) -> Result<(), ControlError> {
        let path = record_path(state);
        self.write_record_to(&path)
    }

    fn write_record_to(&self, path: &Path) -> Result<(), ControlError> {
        let record = Record {
            dir: self.dir.clone(),
            files: self.entries(),
            store: self.store.is_some(),
        };
        let bytes =
            serde_json::to_vec(&record).map_err(|e| state_error(path, std::io::Error::other(e)))?;
        transport::files::write_atomically(path, &bytes).map_err(|e| state_error(path, e))
    }

    fn path(&self, ns_pid: u32) -> PathBuf {
        self.dir.join(data_file_name(ns_pid))
    }

    /// How the shims' data-file workers spent `streaming` ([`WorkerTime`]); `None` when nothing
    /// was streamed that way.
    pub fn worker_time(&self, streaming: Streaming) -> Option<WorkerTime> {
        let work = match streaming {
            Streaming::Save => &self.saved,
            Streaming::Load => &self.loaded,
        };
        lock_work(work).shares()
    }

    /// The entries for the manifest, by namespace PID.
    pub fn entries(&self) -> Vec<DataFileEntry> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, DataFileEntry>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes the data files and their directory (a checkpoint that failed); in a block store,
    /// the checkpoint's list of pending references (its blocks stay until a `discard` in the
    /// store collects them: another checkpoint may reference them by then).
    pub fn remove(&self) {
        self.remove_pending();
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %self.dir.display(), error = %e, "removing data files"),
        }
    }

    /// Checks that every listed data file is present, of its recorded length, with a record that
    /// reads. Read-only, and cheap: what a restore checks of the data before anything changes
    /// when the digests are left to the load (each shim hashes the bytes it reads and fails the
    /// load on a mismatch, crates/shim-runtime/src/datafile.rs).
    pub fn check_lengths(&self) -> Result<(), ControlError> {
        for entry in self.entries() {
            if entry.blocks.is_some() {
                let (store, blocks) = self.stored(&entry)?;
                store
                    .check_blocks(&blocks)
                    .map_err(|e| damaged(&self.path(entry.ns_pid), e))?;
            } else {
                self.open_checked(&entry)?;
            }
        }
        Ok(())
    }

    /// The store and the blocks of an entry that lists blocks.
    fn stored(
        &self,
        entry: &DataFileEntry,
    ) -> Result<(&BlockStore, Vec<protocol::message::StoredBlock>), ControlError> {
        let path = self.path(entry.ns_pid);
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| damaged(&path, "lists blocks, and there is no block store"))?;
        let blocks = entry
            .record()
            .ok()
            .and_then(|r| r.stored_blocks())
            .ok_or_else(|| damaged(&path, "its block list does not match its layout"))?;
        Ok((store, blocks))
    }

    fn pending_path(&self) -> PathBuf {
        self.dir.with_file_name(PENDING_BLOCKS)
    }

    /// Removes the list of pending references (the manifest lists the blocks now, or the
    /// checkpoint failed).
    pub fn remove_pending(&self) {
        let path = self.pending_path();
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "removing"),
        }
    }

    /// The data file of `entry`, open for reading, after checking its length against the
    /// manifest; and its record.
    fn open_checked(
        &self,
        entry: &DataFileEntry,
    ) -> Result<(File, protocol::message::DataFile), ControlError> {
        let path = self.path(entry.ns_pid);
        let file = crate::safefs::open_regular(&path).map_err(|e| damaged(&path, e))?;
        let length = file.metadata().map_err(|e| damaged(&path, e))?.len();
        if length != entry.bytes {
            return Err(damaged(
                &path,
                format!("is {length} bytes, the manifest records {}", entry.bytes),
            ));
        }
        let record = entry.record().map_err(|e| damaged(&path, e))?;
        Ok((file, record))
    }

    /// Checks every listed data file against the manifest before anything is restored (restore
    /// `--verify-data-first`): [`Self::check_lengths`], then every extent's bytes hashing to its
    /// recorded BLAKE3 (zero blocks are not read: the shim sets them to zero, whatever the file
    /// holds there). Read-only.
    pub fn verify(&self, progress: &dyn Progress) -> Result<u64, ControlError> {
        let entries = self.entries();
        let results = crate::parallel::for_each("data file check", &entries, |entry| {
            self.verify_one(entry, progress)
        });
        let mut total = 0;
        for r in results {
            total += r?;
        }
        Ok(total)
    }

    fn verify_one(
        &self,
        entry: &DataFileEntry,
        progress: &dyn Progress,
    ) -> Result<u64, ControlError> {
        use std::os::unix::fs::FileExt;
        let path = self.path(entry.ns_pid);
        if entry.blocks.is_some() {
            // Each block against its name (the manifest, signed, names them); the extents'
            // digests are of the block lists, which the shim checks before it reads.
            let (store, blocks) = self.stored(entry)?;
            store.check_blocks(&blocks).map_err(|e| damaged(&path, e))?;
            for extent in &entry.extents {
                let first = extent.offset / DATA_ALIGN;
                let range = first..first + extent.size.div_ceil(DATA_ALIGN);
                let digests = blocks
                    .iter()
                    .filter(|b| range.contains(&b.index))
                    .map(|b| b.digest);
                let listed = hex(&protocol::message::block_list_digest(digests));
                if listed != extent.blake3 {
                    return Err(damaged(
                        &path,
                        format!(
                            "allocation {:?} does not have the digest of its block list",
                            extent.id
                        ),
                    ));
                }
            }
            let mut read = 0;
            for block in &blocks {
                let len = store.verify_block(block).map_err(|e| damaged(&path, e))?;
                progress.advance(len);
                read += len;
            }
            return Ok(read);
        }
        let (file, record) = self.open_checked(entry)?;
        let zeros = vec![0u8; DATA_ALIGN as usize];
        let mut buffer = vec![0u8; VERIFY_RUN as usize];
        let mut read = 0u64;
        let is_zero = |offset: u64| {
            record
                .zero_blocks
                .binary_search(&(offset / DATA_ALIGN))
                .is_ok()
        };
        for extent in &record.extents {
            let mut hasher = blake3::Hasher::new();
            let mut at = 0u64;
            while at < extent.size {
                let offset = extent.offset + at;
                if is_zero(offset) {
                    let len = (extent.size - at).min(DATA_ALIGN);
                    hasher.update(zeros.get(..len as usize).unwrap_or_default());
                    at += len;
                    continue;
                }
                // A run of blocks that are in the file, read with one I/O and hashed on every
                // core (BLAKE3's own parallelism): one thread per file hashing 2 MiB at a time
                // held a fast directory to one core's rate.
                let mut len = (extent.size - at).min(DATA_ALIGN);
                while len < VERIFY_RUN
                    && at + len < extent.size
                    && !is_zero(extent.offset + at + len)
                {
                    len += (extent.size - at - len).min(DATA_ALIGN);
                }
                let bytes = buffer.get_mut(..len as usize).unwrap_or_default();
                file.read_exact_at(bytes, offset)
                    .map_err(|e| damaged(&path, e))?;
                hasher.update_rayon(bytes);
                read += len;
                progress.advance(len);
                at += len;
            }
            if *hasher.finalize().as_bytes() != extent.blake3 {
                return Err(damaged(
                    &path,
                    format!(
                        "allocation {:?} does not hash to the BLAKE3 the manifest records: the \
                         data file is damaged",
                        extent.id
                    ),
                ));
            }
        }
        Ok(read)
    }
}

impl FileBytes for DataFiles {
    /// SaveTo to every participant at once, each into a new file of its own. A participant
    /// that creates nothing shared gets a file too (its shim answers with no extents), which is
    /// then removed: the manifest lists only files that hold bytes.
    fn save_all(
        &self,
        participants: &mut [Participant],
        progress: &dyn Progress,
    ) -> Result<(u64, f64), ControlError> {
        if self.store.is_none() {
            std::fs::create_dir_all(&self.dir).map_err(|e| state_error(&self.dir, e))?;
        }
        let workers = workers_for(participants.len(), self.in_memory());
        let results = each_parallel(participants, |p| {
            let ns_pid = p.hello.ns_pid;
            let streamed = if let Some(store) = &self.store {
                p.stream(
                    &Request::SaveTo {
                        store: true,
                        workers,
                    },
                    store.fd(),
                )?
            } else {
                let path = self.path(ns_pid);
                let file = create(&path)?;
                let save = Request::SaveTo {
                    store: false,
                    workers,
                };
                let streamed = p.stream(&save, file.as_fd())?;
                if streamed.file.extents.is_empty() {
                    drop(file);
                    std::fs::remove_file(&path).map_err(|e| state_error(&path, e))?;
                }
                streamed
            };
            lock_work(&self.saved).add(&streamed.stats);
            report(progress, "save", p, &streamed);
            if !streamed.file.extents.is_empty() {
                let entry = DataFileEntry::new(
                    ns_pid,
                    streamed.stats.file_bytes,
                    streamed.stats.shared_bytes,
                    &streamed.file,
                );
                self.lock().insert(ns_pid, entry);
            }
            Ok(streamed)
        });
        let done = totals(results)?;
        if let Some(store) = &self.store {
            store.sync()?;
            // Before Release: a checkpoint killed from here on needs these blocks (`resume`
            // loads them back), and a collection finds no manifest that references them yet.
            let pending = self.pending_path();
            let bytes = serde_json::to_vec(&self.entries())
                .map_err(|e| state_error(&pending, std::io::Error::other(e)))?;
            transport::files::write_atomically(&pending, &bytes)
                .map_err(|e| state_error(&pending, e))?;
        }
        // Before Release: from here on the bytes may be only in these files.
        if let Some(path) = &self.record {
            self.write_record_to(path)?;
        }
        Ok(done)
    }

    /// The rebuild's first step for a group saved into these files: LoadFrom to every
    /// participant whose SaveTo wrote a file, Load to the others (the carrier path, which finds
    /// nothing to load where nothing was released).
    fn load_all(
        &self,
        participants: &mut [Participant],
        progress: &dyn Progress,
    ) -> Result<(u64, f64), ControlError> {
        let workers = workers_for(participants.len(), self.in_memory());
        let results = each_parallel(participants, |p| {
            let ns_pid = p.hello.ns_pid;
            let entry = self.lock().get(&ns_pid).cloned();
            let Some(entry) = entry else {
                let r = p.phase(&Request::Load)?;
                progress.advance(r.bytes);
                progress.participant_done("load", &p.info.label(), &r);
                return Ok(Streamed {
                    result: r,
                    stats: Default::default(),
                    file: Default::default(),
                });
            };
            let path = self.path(ns_pid);
            let record = entry.record().map_err(|e| damaged(&path, e))?;
            let load = |file| Request::LoadFrom { file, workers };
            let streamed = match (&self.store, record.blocks.is_some()) {
                (Some(store), true) => p.stream(&load(record), store.fd())?,
                (None, true) => {
                    return Err(damaged(&path, "lists blocks, and there is no block store"));
                }
                (_, false) => {
                    let file = open(&path)?;
                    p.stream(&load(record), file.as_fd())?
                }
            };
            lock_work(&self.loaded).add(&streamed.stats);
            report(progress, "load", p, &streamed);
            Ok(streamed)
        });
        totals(results)
    }
}

fn hex(digest: &[u8; 32]) -> String {
    protocol::message::block_name(digest)
}

/// Largest read of `verify`: a run of data blocks hashed at once across the cores.
const VERIFY_RUN: u64 = 64 << 20;

fn lock_work(work: &Mutex<Work>) -> std::sync::MutexGuard<'_, Work> {
    work.lock().unwrap_or_else(|e| e.into_inner())
}

/// Buffered I/O for a data file in memory (tmpfs), where direct I/O buys nothing and runs slower
/// ([`copy::direct_io`]): the shim streams the file as the tool opened it.
fn buffered_in_memory(file: File) -> File {
    if copy::direct_io::in_memory(file.as_fd())
        && let Ok(flags) = rustix::fs::fcntl_getfl(&file)
    {
        let _ = rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::DIRECT);
    }
    file
}

/// Creates a data file for writing, with `O_DIRECT` where the filesystem is a disk that takes it.
fn create(path: &Path) -> Result<File, ControlError> {
    let open = |direct: bool| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(path)
    };
    match open(true) {
        Ok(f) => Ok(buffered_in_memory(f)),
        // tmpfs before Linux 6.6 and some network filesystems refuse O_DIRECT at open.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let _ = std::fs::remove_file(path);
            open(false).map_err(|e| state_error(path, e))
        }
        Err(e) => Err(state_error(path, e)),
    }
}

/// Opens a data file for reading, with `O_DIRECT` where the filesystem is a disk that takes it.
fn open(path: &Path) -> Result<File, ControlError> {
    // A data file of a checkpoint: a FIFO, a device or a link there is refused (crate::safefs).
    let open = |direct: bool| {
        crate::safefs::open_regular_with(path, if direct { libc::O_DIRECT } else { 0 })
    };
    match open(true) {
        Ok(f) => Ok(buffered_in_memory(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            open(false).map_err(|e| damaged(path, e))
        }
        Err(e) => Err(damaged(path, e)),
    }
}

fn report(progress: &dyn Progress, step: &'static str, p: &Participant, s: &Streamed) {
    progress.advance(s.result.bytes);
    progress.participant_done(step, &p.info.label(), &s.result);
}

/// Runs `f` for every participant at once (one thread each), naming the participant in errors.
fn each_parallel(
    participants: &mut [Participant],
    f: impl Fn(&mut Participant) -> Result<Streamed, ControlError> + Sync,
) -> Vec<Result<Streamed, ControlError>> {
    crate::parallel::for_each_mut("data file", participants.iter_mut().collect(), |p| {
        f(p).map_err(|e| ControlError::Step {
            step: "data file",
            process: p.info.label(),
            source: Box::new(e),
        })
    })
}

/// Whether directory `dir` is on a filesystem in memory ([`copy::direct_io::in_memory`]); one
/// that cannot be opened answers false.
pub(crate) fn dir_in_memory(dir: &Path) -> bool {
    File::open(dir).is_ok_and(|d| copy::direct_io::in_memory(d.as_fd()))
}

/// I/O threads of each of `processes` data files streamed at once on this machine
/// ([`protocol::message::data_workers`] of the CPUs this tool may use).
pub fn workers_for(processes: usize, in_memory: bool) -> u16 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    protocol::message::data_workers(cpus, processes, in_memory)
}

/// Bytes moved and the slowest shim's milliseconds, or the first error.
fn totals(results: Vec<Result<Streamed, ControlError>>) -> Result<(u64, f64), ControlError> {
    let mut bytes = 0;
    let mut slowest = 0;
    for r in results {
        let r = r?;
        bytes += r.result.bytes;
        slowest = slowest.max(r.result.micros);
    }
    Ok((bytes, slowest as f64 / 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(file: &File) -> bool {
        rustix::fs::fcntl_getfl(file)
            .expect("flags")
            .contains(rustix::fs::OFlags::DIRECT)
    }

    #[test]
    fn a_data_file_in_memory_is_streamed_buffered() {
        let dir = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let path = dir.path().join("gpu-1.data");
        let written = create(&path).expect("create");
        assert!(!direct(&written), "created in tmpfs: buffered");
        drop(written);
        let read = open(&path).expect("open");
        assert!(!direct(&read), "opened in tmpfs: buffered");
    }
}
