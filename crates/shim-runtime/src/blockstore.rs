//! The shim's side of a block store (checkpoint to disk, the default): SaveTo with `store` writes
//! each 2 MiB block of the data file's layout that is not all zeros as its own file, named by its
//! BLAKE3, through the store's directory descriptor the tool passed; LoadFrom reads them back.
//!
//! A block is written once: a name already present (another process's replica, another
//! checkpoint's weights) is referenced, not written again; a new one is written under a temporary
//! name, and once the whole save's blocks are written, one `syncfs` makes them durable and each is
//! renamed into place without replacing anything (`RENAME_NOREPLACE`, [`Batch`]), so a reader
//! never sees a partial block under a block's name and two writers of the same block at once
//! (replicas) store it once. Every open is relative to the store's descriptor and follows no
//! symbolic link, and the names come from digests (64 hex digits), so nothing outside the store
//! is ever opened.

use crate::log::log_warn;
use protocol::message::block_name;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Prefix of a block being written (`.tmp-<digest>-<pid>-<n>`): the tool's collection removes
/// such leftovers of a killed checkpoint, and nothing else that is not a block.
pub const TEMP_PREFIX: &str = ".tmp-";

/// What [`put`] did with a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// The store did not hold it: written.
    Written,
    /// The store held it already (or another writer stored it first): referenced.
    Present,
}

/// Whether block files are opened with `O_DIRECT`; cleared for good when the filesystem refuses
/// it (tmpfs before Linux 6.6 refuses it at open).
#[derive(Debug)]
pub struct Direct(AtomicBool);

impl Direct {
    /// Direct I/O for a store on a disk; buffered for one in memory, where it buys nothing and
    /// runs slower ([`copy::direct_io`]).
    pub fn for_store(store: BorrowedFd<'_>) -> Direct {
        Direct(AtomicBool::new(!copy::direct_io::in_memory(store)))
    }

    pub fn on(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn give_up(&self) {
        if self.0.swap(false, Ordering::AcqRel) {
            log_warn!("the block store's filesystem refused O_DIRECT; streaming buffered");
        }
    }
}

/// Why a block could not be put into the store or got from it (a data file's error, by
/// `DataFileError::Block`, in the same words).
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("block store: {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the data file does not describe this process's allocations: {0}")]
    Mismatch(String),
}

fn io(path: &str, e: Errno) -> BlockError {
    BlockError::Io {
        path: path.to_string(),
        source: e.into(),
    }
}

/// The block's sub-directory (`xx` of its name), made when `create`.
fn subdir(store: BorrowedFd<'_>, name: &str, create: bool) -> Result<OwnedFd, BlockError> {
    let sub = name.get(..2).unwrap_or_default();
    if create {
        match rustix::fs::mkdirat(store, sub, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io(sub, e)),
        }
    }
    rustix::fs::openat(
        store,
        sub,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(sub, e))
}

/// Opens `name` in `dir` with `flags`, `O_DIRECT` too while `direct` is on.
fn open(dir: BorrowedFd<'_>, name: &str, flags: OFlags, direct: &Direct) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(0o600);
    if direct.on() {
        match rustix::fs::openat(dir, name, flags | OFlags::DIRECT, mode) {
            Err(Errno::INVAL) => {
                direct.give_up();
                // O_CREAT|O_EXCL may have made it before the flag was refused.
                if flags.contains(OFlags::CREATE) {
                    let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
                }
            }
            other => return other,
        }
    }
    rustix::fs::openat(dir, name, flags, mode)
}

/// The blocks one save wrote under temporary names, named by [`Batch::commit`] once all their
/// bytes are durable. Syncing each block on its own (an `fdatasync` per 2 MiB) held the store to
/// a seventh of its directory's write rate on the fake driver: one `syncfs` for the whole batch
/// lets the filesystem write back everything at once. A batch dropped uncommitted (a failed
/// save) removes its temporaries.
#[derive(Debug)]
pub struct Batch<'a> {
    store: BorrowedFd<'a>,
    /// Per block being written or written: its temporary name, length, and whether its name is
    /// taken by a damaged file it must replace. `None` while the bytes are being written.
    pending: Mutex<HashMap<[u8; 32], Option<Pending>>>,
}

#[derive(Debug, Clone)]
struct Pending {
    temp: String,
    len: u64,
    replace: bool,
}

impl<'a> Batch<'a> {
    pub fn new(store: BorrowedFd<'a>) -> Batch<'a> {
        Batch {
            store,
            pending: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Option<Pending>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes every block of the batch durable, then gives each its name. Returns the bytes of
    /// blocks another writer named first (a replica's checkpoint at the same moment): stored
    /// once, so referenced rather than written by this save.
    pub fn commit(self) -> Result<u64, BlockError> {
        let pending: Vec<([u8; 32], Pending)> = self
            .lock()
            .drain()
            .filter_map(|(digest, p)| Some((digest, p?)))
            .collect();
        let result = self.name(&pending);
        if result.is_err() {
            for (digest, p) in &pending {
                if let Ok(dir) = subdir(self.store, &block_name(digest), false) {
                    let _ = rustix::fs::unlinkat(&dir, p.temp.as_str(), AtFlags::empty());
                }
            }
        }
        result
    }

    fn name(&self, pending: &[([u8; 32], Pending)]) -> Result<u64, BlockError> {
        if pending.is_empty() {
            return Ok(0);
        }
        // Crash safety: a block's name must appear only once its bytes are on the disk, or a
        // crash could leave a named block that is short or holds garbage, which a later
        // checkpoint would reference as present. syncfs writes back every temporary of the batch
        // (data and the inodes' sizes) before the first rename; the renames themselves are made
        // durable by the tool's one fsync per directory of the store after the save
        // (control's `BlockStore::sync`), before the manifest that references them is written.
        rustix::fs::syncfs(self.store).map_err(|e| io("the block store's filesystem", e))?;
        let mut raced = 0;
        for (digest, p) in pending {
            let name = block_name(digest);
            let dir = subdir(self.store, &name, false)?;
            let flags = if p.replace {
                RenameFlags::empty()
            } else {
                RenameFlags::NOREPLACE
            };
            match rustix::fs::renameat_with(&dir, p.temp.as_str(), &dir, name.as_str(), flags) {
                Ok(()) => {}
                // Another writer stored the same block first.
                Err(Errno::EXIST) => {
                    let _ = rustix::fs::unlinkat(&dir, p.temp.as_str(), AtFlags::empty());
                    raced += p.len;
                }
                Err(e) => return Err(io(&name, e)),
            }
        }
        Ok(raced)
    }
}

impl Drop for Batch<'_> {
    /// A batch not committed (its save failed): its temporaries go.
    fn drop(&mut self) {
        let store = self.store;
        for (digest, p) in self.lock().drain() {
            if let (Some(p), Ok(dir)) = (p, subdir(store, &block_name(&digest), false)) {
                let _ = rustix::fs::unlinkat(&dir, p.temp.as_str(), AtFlags::empty());
            }
        }
    }
}

/// Stores a block of `len` bytes whose BLAKE3 is `digest` in `batch`: `data` holds them, padded
/// with zeros to the page for `O_DIRECT`. A block already present with its length, or already in
/// the batch, is left as it is; one of another length or type (damaged, or a file someone put
/// there) is replaced. The block is written under a temporary name; it gets its own at
/// [`Batch::commit`].
pub fn put(
    batch: &Batch<'_>,
    digest: &[u8; 32],
    data: &[u8],
    len: usize,
    direct: &Direct,
) -> Result<Put, BlockError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = block_name(digest);
    let dir = subdir(batch.store, &name, true)?;
    let replace = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st)
            if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                && u64::try_from(st.st_size).ok() == Some(len as u64) =>
        {
            return Ok(Put::Present);
        }
        Ok(_) => true,
        Err(Errno::NOENT) => false,
        Err(e) => return Err(io(&name, e)),
    };
    // Reserved before it is written, so that a block found twice in one save (identical
    // replicas, repeated weights) is written once.
    {
        let mut pending = batch.lock();
        if pending.contains_key(digest) {
            return Ok(Put::Present);
        }
        pending.insert(*digest, None);
    }
    let temp = format!(
        "{TEMP_PREFIX}{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let written = (|| {
        let file = open(
            dir.as_fd(),
            &temp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            direct,
        )
        .map_err(|e| io(&temp, e))?;
        write_all(file.as_fd(), data, direct).map_err(|e| io(&temp, e))?;
        if data.len() != len {
            rustix::fs::ftruncate(&file, len as u64).map_err(|e| io(&temp, e))?;
        }
        Ok(())
    })();
    let mut pending = batch.lock();
    match written {
        Ok(()) => {
            pending.insert(
                *digest,
                Some(Pending {
                    temp,
                    len: len as u64,
                    replace,
                }),
            );
            Ok(Put::Written)
        }
        Err(e) => {
            pending.remove(digest);
            let _ = rustix::fs::unlinkat(&dir, temp.as_str(), AtFlags::empty());
            Err(e)
        }
    }
}

fn write_all(file: BorrowedFd<'_>, data: &[u8], direct: &Direct) -> Result<(), Errno> {
    let mut done = 0;
    while let Some(rest) = data.get(done..).filter(|r| !r.is_empty()) {
        match rustix::io::pwrite(file, rest, done as u64) {
            Ok(0) => return Err(Errno::NOSPC),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::INVAL) if drop_direct(file, direct) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// After `EINVAL` on a direct I/O: this file, and the blocks after it, buffered. True when a
/// retry can help.
fn drop_direct(file: BorrowedFd<'_>, direct: &Direct) -> bool {
    let Ok(flags) = rustix::fs::fcntl_getfl(file) else {
        return false;
    };
    if !flags.contains(OFlags::DIRECT)
        || rustix::fs::fcntl_setfl(file, flags - OFlags::DIRECT).is_err()
    {
        return false;
    }
    direct.give_up();
    true
}

/// Reads the block named by `digest` into `buffer` (at least `len` bytes rounded up to the page):
/// it must be a regular file of exactly `len` bytes. The caller checks the digest.
pub fn get(
    store: BorrowedFd<'_>,
    digest: &[u8; 32],
    buffer: &mut [u8],
    len: usize,
    direct: &Direct,
) -> Result<(), BlockError> {
    let name = block_name(digest);
    let dir = subdir(store, &name, false)?;
    let path = format!("{}/{name}", name.get(..2).unwrap_or_default());
    let file = open(
        dir.as_fd(),
        &name,
        OFlags::RDONLY | OFlags::NONBLOCK,
        direct,
    )
    .map_err(|e| io(&path, e))?;
    let st = rustix::fs::fstat(&file).map_err(|e| io(&path, e))?;
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || size != len as u64 {
        return Err(BlockError::Mismatch(format!(
            "block {path} of the store is not a regular file of {len} bytes"
        )));
    }
    let mut done = 0;
    while done < len {
        let Some(rest) = buffer.get_mut(done..) else {
            break;
        };
        match rustix::io::pread(&file, rest, done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::INVAL) if drop_direct(file.as_fd(), direct) => {}
            Err(e) => return Err(io(&path, e)),
        }
    }
    if done != len {
        return Err(BlockError::Mismatch(format!(
            "block {path} of the store ends after {done} of its {len} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn store() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().expect("tempdir");
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .expect("open store");
        (dir, fd)
    }

    /// A batch of one block, committed.
    fn put_now(
        store: BorrowedFd<'_>,
        digest: &[u8; 32],
        data: &[u8],
        len: usize,
        direct: &Direct,
    ) -> Result<Put, BlockError> {
        let batch = Batch::new(store);
        let put = put(&batch, digest, data, len, direct)?;
        assert_eq!(batch.commit()?, 0, "no other writer");
        Ok(put)
    }

    fn names_in(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = walk(dir);
        names.sort();
        names
    }

    fn walk(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flat_map(|e| {
                        let e = e.unwrap();
                        if e.file_type().unwrap().is_dir() {
                            walk(&e.path())
                        } else {
                            vec![e.file_name().to_string_lossy().into_owned()]
                        }
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_batch_names_its_blocks_only_at_commit_and_writes_a_repeated_block_once() {
        let (dir, fd) = store();
        let direct = Direct(AtomicBool::new(true));
        let a = vec![3u8; 8192];
        let b = vec![4u8; 4096];
        let (da, db) = (*blake3::hash(&a).as_bytes(), *blake3::hash(&b).as_bytes());
        let batch = Batch::new(fd.as_fd());
        assert_eq!(put(&batch, &da, &a, 8192, &direct).unwrap(), Put::Written);
        assert_eq!(put(&batch, &db, &b, 4096, &direct).unwrap(), Put::Written);
        assert_eq!(
            put(&batch, &da, &a, 8192, &direct).unwrap(),
            Put::Present,
            "the same block again in the same save"
        );
        let before = names_in(dir.path());
        assert_eq!(before.len(), 2, "{before:?}");
        assert!(
            before.iter().all(|n| n.starts_with(TEMP_PREFIX)),
            "no block has its name before the commit: {before:?}"
        );
        assert_eq!(batch.commit().unwrap(), 0);
        let mut named = vec![block_name(&da), block_name(&db)];
        named.sort();
        assert_eq!(names_in(dir.path()), named);
        for (digest, bytes) in [(da, &a), (db, &b)] {
            let path = dir.path().join(protocol::message::block_path(&digest));
            assert_eq!(&std::fs::read(path).unwrap(), bytes);
        }
    }

    #[test]
    fn a_batch_dropped_uncommitted_leaves_nothing_and_a_racing_writer_is_counted_shared() {
        let (dir, fd) = store();
        let direct = Direct(AtomicBool::new(true));
        let a = vec![5u8; 4096];
        let da = *blake3::hash(&a).as_bytes();
        {
            let batch = Batch::new(fd.as_fd());
            put(&batch, &da, &a, 4096, &direct).unwrap();
        }
        assert_eq!(names_in(dir.path()), Vec::<String>::new());
        // Two saves of the same block at once: both write it, the second to commit finds it named.
        let (first, second) = (Batch::new(fd.as_fd()), Batch::new(fd.as_fd()));
        put(&first, &da, &a, 4096, &direct).unwrap();
        put(&second, &da, &a, 4096, &direct).unwrap();
        assert_eq!(first.commit().unwrap(), 0);
        assert_eq!(second.commit().unwrap(), 4096);
        assert_eq!(names_in(dir.path()), vec![block_name(&da)]);
    }

    #[test]
    fn a_block_is_written_once_under_its_digest_and_read_back() {
        let (dir, fd) = store();
        let direct = Direct(AtomicBool::new(true));
        let bytes: Vec<u8> = (0..(1 << 20) + 100).map(|i| (i % 251) as u8).collect();
        let len = bytes.len();
        let mut padded = bytes.clone();
        padded.resize(len.next_multiple_of(4096), 0);
        let digest = *blake3::hash(&bytes).as_bytes();
        assert_eq!(
            put_now(fd.as_fd(), &digest, &padded, len, &direct).expect("put"),
            Put::Written
        );
        let path = dir.path().join(protocol::message::block_path(&digest));
        assert_eq!(
            std::fs::read(&path).expect("block file"),
            bytes,
            "exactly its bytes"
        );
        let before = std::fs::metadata(&path).expect("stat");
        assert_eq!(
            put_now(fd.as_fd(), &digest, &padded, len, &direct).expect("again"),
            Put::Present
        );
        let after = std::fs::metadata(&path).expect("stat");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(before.ino(), after.ino(), "not rewritten");
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");

        let mut back = vec![0u8; padded.len()];
        get(fd.as_fd(), &digest, &mut back, len, &direct).expect("get");
        assert_eq!(&back[..len], &bytes[..]);
    }

    #[test]
    fn a_short_or_missing_block_is_refused_and_a_short_one_replaced_by_put() {
        let (dir, fd) = store();
        let direct = Direct(AtomicBool::new(true));
        let bytes = vec![7u8; 8192];
        let digest = *blake3::hash(&bytes).as_bytes();
        let mut buffer = vec![0u8; 8192];
        let error = get(fd.as_fd(), &digest, &mut buffer, 8192, &direct).expect_err("missing");
        assert!(matches!(error, BlockError::Io { .. }), "{error}");
        put_now(fd.as_fd(), &digest, &bytes, 8192, &direct).expect("put");
        let path = dir.path().join(protocol::message::block_path(&digest));
        std::fs::write(&path, &bytes[..4096]).expect("cut short");
        let error = get(fd.as_fd(), &digest, &mut buffer, 8192, &direct).expect_err("short");
        assert!(matches!(error, BlockError::Mismatch(_)), "{error}");
        assert_eq!(
            put_now(fd.as_fd(), &digest, &bytes, 8192, &direct).expect("put"),
            Put::Written
        );
        assert_eq!(
            std::fs::read(&path).expect("read"),
            bytes,
            "a short block is replaced"
        );
    }

    #[test]
    fn a_symbolic_link_in_place_of_a_block_is_not_followed() {
        let (dir, fd) = store();
        let direct = Direct(AtomicBool::new(true));
        let outside = tempfile::NamedTempFile::new().expect("outside");
        std::fs::write(outside.path(), vec![1u8; 4096]).expect("write");
        let bytes = vec![1u8; 4096];
        let digest = *blake3::hash(&bytes).as_bytes();
        let path = dir.path().join(protocol::message::block_path(&digest));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.path(), &path).unwrap();
        let mut buffer = vec![0u8; 4096];
        let error = get(fd.as_fd(), &digest, &mut buffer, 4096, &direct).expect_err("a link");
        assert!(matches!(error, BlockError::Io { .. }), "{error}");
    }
    #[test]
    fn a_store_in_memory_streams_buffered_from_the_start() {
        let dir = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .expect("open store");
        let direct = Direct::for_store(fd.as_fd());
        assert!(!direct.on(), "tmpfs: no O_DIRECT asked for");
        // Blocks still go in and come back, buffered.
        let data = vec![9u8; 8192];
        let digest = *blake3::hash(&data).as_bytes();
        assert_eq!(
            put_now(fd.as_fd(), &digest, &data, data.len(), &direct).expect("put"),
            Put::Written
        );
        let mut back = vec![0u8; 8192];
        get(fd.as_fd(), &digest, &mut back, data.len(), &direct).expect("get");
        assert_eq!(back, data);
        assert!(!direct.on());
    }
}
