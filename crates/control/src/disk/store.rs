//! The block store beside the checkpoints of one storage directory: `<parent of DIR>/`
//! [`BLOCK_STORE_DIR`]. A checkpoint's data files are kept there as blocks of 2 MiB named by their
//! BLAKE3 (`xx/<64 hex digits>`, written once by the shims: crates/shim-runtime/src/blockstore.rs),
//! so that a block identical in several processes (replicas, tied weights) or in several
//! checkpoints (an inference server's weights) is written and kept once. The manifest lists every
//! block of every data file (and is signed), so a restore reads exactly the blocks it names.
//!
//! Collection ([`BlockStore::collect`], after `discard`) deletes the blocks no checkpoint in the
//! parent directory references. It is safe against a concurrent checkpoint by an `flock` on
//! [`LOCK_FILE`]: a checkpoint holds it shared from before its first block until its manifest
//! (which references them) is complete, a restore while it reads them, and collection holds it
//! exclusive; a checkpoint killed in between leaves its references in [`PENDING_BLOCKS`] in its
//! directory, which collection keeps too. Collection trusts nothing it reads: a manifest or list
//! it cannot read stops it (nothing is deleted), the references it reads only ever keep blocks,
//! and it deletes only regular files inside the store named like a block (or a block's
//! temporary name), never following a symbolic link.

use super::damaged;
use crate::ControlError;
use crate::state_error;
use protocol::manifest::BLOCK_STORE_DIR;
use protocol::message::{StoredBlock, block_name, block_path};
use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags};
use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The lock file in the store (see the module's documentation).
pub const LOCK_FILE: &str = ".lock";
/// The blocks an incomplete checkpoint references, in its directory (a JSON list of data-file
/// entries, as in the manifest): written once its shims stored them, removed once the manifest
/// lists them.
pub const PENDING_BLOCKS: &str = "cuinterpose.blocks";
/// The temporary name of a block being written, `.tmp-<digest>-<pid>-<n>` (the shim's
/// `blockstore::TEMP_PREFIX`).
const TEMP_PREFIX: &str = ".tmp-";

/// An open block store.
#[derive(Debug)]
pub struct BlockStore {
    path: PathBuf,
    dir: OwnedFd,
}

/// A held lock on a store; released when dropped.
#[derive(Debug)]
pub struct StoreLock {
    _file: OwnedFd,
}

/// What a collection removed.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Collected {
    /// Blocks deleted (no checkpoint referenced them), and their bytes.
    pub blocks: u64,
    pub bytes: u64,
    /// Blocks left: referenced by a checkpoint in the store's directory.
    pub kept: u64,
}

/// The store of the checkpoint directory `checkpoint`: [`BLOCK_STORE_DIR`] in its parent, the
/// parent as the filesystem resolves it (a checkpoint named through a symbolic link shares the
/// store of the directory it is in).
pub fn store_path(checkpoint: &Path) -> Result<PathBuf, ControlError> {
    let parent = match checkpoint.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent = std::fs::canonicalize(&parent).map_err(|e| state_error(&parent, e))?;
    Ok(parent.join(BLOCK_STORE_DIR))
}

fn open_dir(at: BorrowedFd<'_>, name: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn is_digest(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl BlockStore {
    /// The store of the checkpoint `checkpoint`, made if there is none (mode 0700). The shims
    /// write into it with their processes' credentials: a tool that runs as root gives a new
    /// store to `owner` (the user of the group's processes).
    pub fn create(checkpoint: &Path, owner: Option<u32>) -> Result<BlockStore, ControlError> {
        let path = store_path(checkpoint)?;
        match std::fs::create_dir(&path) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| state_error(&path, e))?;
                if let Some(uid) = owner.filter(|&u| rustix::process::geteuid().as_raw() != u) {
                    std::os::unix::fs::lchown(&path, Some(uid), None)
                        .map_err(|e| state_error(&path, e))?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(state_error(&path, e)),
        }
        Self::open_at(path).map_err(|(path, e)| state_error(&path, e))
    }

    /// The store of the checkpoint `checkpoint`, which must exist (a restore): missing, or not a
    /// directory (a symbolic link), is a refusal.
    pub fn open(checkpoint: &Path) -> Result<BlockStore, ControlError> {
        let path = store_path(checkpoint)?;
        Self::open_at(path).map_err(|(path, e)| damaged(&path, e))
    }

    /// The store of the checkpoint `checkpoint` if there is one (discard's collection); a store
    /// that is not a directory reached without a symbolic link is an error.
    pub fn existing(checkpoint: &Path) -> Result<Option<BlockStore>, ControlError> {
        let path = store_path(checkpoint)?;
        match Self::open_at(path) {
            Ok(store) => Ok(Some(store)),
            Err((_, e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err((path, e)) => Err(damaged(&path, e)),
        }
    }

    fn open_at(path: PathBuf) -> Result<BlockStore, (PathBuf, std::io::Error)> {
        match rustix::fs::open(
            &path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(dir) => Ok(BlockStore { path, dir }),
            Err(e) => {
                let e = if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
                    std::io::Error::other("is not a directory (a symbolic link, or a file)")
                } else {
                    e.into()
                };
                Err((path, e))
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The store's directory, which SaveTo and LoadFrom carry to the shims.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    fn lock(&self, operation: FlockOperation) -> Result<StoreLock, ControlError> {
        let path = self.path.join(LOCK_FILE);
        let file = rustix::fs::openat(
            &self.dir,
            LOCK_FILE,
            OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| state_error(&path, std::io::Error::from(e)))?;
        loop {
            match rustix::fs::flock(&file, operation) {
                Ok(()) => return Ok(StoreLock { _file: file }),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(state_error(&path, std::io::Error::from(e))),
            }
        }
    }

    /// Held by a checkpoint while it writes and references blocks, and by a restore while it
    /// reads them: no collection runs meanwhile.
    pub fn lock_shared(&self) -> Result<StoreLock, ControlError> {
        self.lock(FlockOperation::LockShared)
    }

    /// Held by a collection: no checkpoint is between its first block and its manifest.
    pub fn lock_exclusive(&self) -> Result<StoreLock, ControlError> {
        self.lock(FlockOperation::LockExclusive)
    }

    /// Makes the blocks' names durable: the shims synced each block before naming it; their
    /// directories are synced here, before the manifest that references them is written.
    pub fn sync(&self) -> Result<(), ControlError> {
        for sub in self.subdirs()? {
            let fd = open_dir(self.fd(), &sub).map_err(|e| self.error(&sub, e))?;
            rustix::fs::fsync(&fd).map_err(|e| self.error(&sub, e))?;
        }
        rustix::fs::fsync(&self.dir).map_err(|e| self.error("", e))
    }

    fn error(&self, name: &str, e: rustix::io::Errno) -> ControlError {
        state_error(&self.path.join(name), std::io::Error::from(e))
    }

    /// The names of the store's block sub-directories (two lower-case hex digits).
    fn subdirs(&self) -> Result<Vec<String>, ControlError> {
        let mut out = Vec::new();
        for name in list(self.fd()).map_err(|e| self.error("", e))? {
            if name.len() == 2
                && name
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// Checks that every stored block of a record is in the store: a regular file (reached
    /// without a symbolic link) of the block's length. Read-only; what a restore checks before
    /// anything changes when the digests are left to the load.
    pub fn check_blocks(&self, blocks: &[StoredBlock]) -> Result<(), String> {
        for block in blocks {
            let Some(digest) = block.digest else { continue };
            let rel = block_path(&digest);
            let st = rustix::fs::statat(&self.dir, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| format!("block {rel} of the store: {}", std::io::Error::from(e)))?;
            // The sub-directory must not be a link either.
            open_dir(self.fd(), &rel[..2])
                .map_err(|e| format!("{}: {}", &rel[..2], std::io::Error::from(e)))?;
            let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || size != block.len {
                return Err(format!(
                    "block {rel} of the store is not a regular file of {} bytes (a {}, {size} \
                     bytes)",
                    block.len,
                    describe(FileType::from_raw_mode(st.st_mode))
                ));
            }
        }
        Ok(())
    }

    /// Reads the block `block` and checks that it hashes to its name; returns its length.
    pub fn verify_block(&self, block: &StoredBlock) -> Result<u64, String> {
        let Some(digest) = block.digest else {
            return Ok(0);
        };
        let rel = block_path(&digest);
        let sub = open_dir(self.fd(), &rel[..2])
            .map_err(|e| format!("{}: {}", &rel[..2], std::io::Error::from(e)))?;
        let file = rustix::fs::openat(
            &sub,
            block_name(&digest).as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("block {rel} of the store: {}", std::io::Error::from(e)))?;
        let mut file = std::fs::File::from(file);
        let mut bytes = Vec::with_capacity(usize::try_from(block.len).unwrap_or(0));
        std::io::Read::read_to_end(
            &mut std::io::Read::take(&mut file, block.len + 1),
            &mut bytes,
        )
        .map_err(|e| format!("block {rel} of the store: {e}"))?;
        if bytes.len() as u64 != block.len || *blake3::hash(&bytes).as_bytes() != digest {
            return Err(format!(
                "block {rel} of the store does not hash to its name: the block is damaged"
            ));
        }
        Ok(block.len)
    }

    /// Deletes the blocks that no checkpoint in the store's directory references, under the
    /// store's exclusive lock (waiting for running checkpoints and restores). A checkpoint is a
    /// directory beside the store: its `manifest.json` and [`PENDING_BLOCKS`] list the blocks it
    /// references. Anything that keeps the references from being read completely (a manifest
    /// that does not parse, a directory that cannot be listed) stops the collection before it
    /// deletes anything: the error says why.
    pub fn collect(&self) -> Result<Collected, ControlError> {
        let _lock = self.lock_exclusive()?;
        let parent = self.path.parent().unwrap_or(Path::new("/"));
        let referenced = referenced_blocks(parent)?;
        let mut collected = Collected::default();
        for sub in self.subdirs()? {
            let Ok(fd) = open_dir(self.fd(), &sub) else {
                // A link or a file named like a sub-directory: not the tool's, left alone.
                continue;
            };
            for name in list(fd.as_fd()).map_err(|e| self.error(&sub, e))? {
                let block = is_digest(&name) && name.starts_with(&sub);
                let temp = name
                    .strip_prefix(TEMP_PREFIX)
                    .and_then(|rest| rest.get(..64))
                    .is_some_and(is_digest);
                if !(block || temp) || (block && referenced.contains(&name)) {
                    collected.kept += u64::from(block);
                    continue;
                }
                let Ok(st) = rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                else {
                    continue;
                };
                if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                    continue;
                }
                // A temporary name is a block a killed checkpoint was writing (no checkpoint
                // writes while this lock is held).
                rustix::fs::unlinkat(&fd, name.as_str(), AtFlags::empty())
                    .map_err(|e| self.error(&format!("{sub}/{name}"), e))?;
                if block {
                    collected.blocks += 1;
                    collected.bytes += u64::try_from(st.st_size).unwrap_or(0);
                }
            }
        }
        Ok(collected)
    }
}

fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice | FileType::BlockDevice => "device",
        FileType::Unknown => "file of unknown type",
    }
}

/// The names in a directory (without `.` and `..`).
fn list(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name != "." && name != ".." {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// Every block the checkpoints in `parent` reference: the `blocks` of every data file of each
/// directory's `manifest.json` and [`PENDING_BLOCKS`] (read loosely, any manifest version: they
/// only keep blocks). Symbolic links are not followed (a checkpoint elsewhere has its own store).
fn referenced_blocks(parent: &Path) -> Result<HashSet<String>, ControlError> {
    let stop = |path: &Path, why: String| {
        damaged(
            path,
            format!("{why}; the block store was not collected, nothing in it was removed"),
        )
    };
    let mut referenced = HashSet::new();
    let entries = std::fs::read_dir(parent).map_err(|e| stop(parent, e.to_string()))?;
    for entry in entries {
        let entry = entry.map_err(|e| stop(parent, e.to_string()))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| stop(&path, e.to_string()))?;
        if !kind.is_dir() || entry.file_name() == BLOCK_STORE_DIR {
            continue;
        }
        for (name, entries_of) in [
            (
                protocol::manifest::MANIFEST_FILE_NAME,
                manifest_files as fn(&serde_json::Value) -> Option<&Vec<serde_json::Value>>,
            ),
            (PENDING_BLOCKS, serde_json::Value::as_array),
        ] {
            let file = path.join(name);
            let bytes = match crate::safefs::read_regular(
                &file,
                protocol::manifest::MAX_MANIFEST_LEN as u64,
            ) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(stop(&file, e.to_string())),
            };
            let value: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| stop(&file, format!("does not parse: {e}")))?;
            for data_file in entries_of(&value).into_iter().flatten() {
                let blocks = data_file
                    .get("blocks")
                    .and_then(serde_json::Value::as_array);
                for block in blocks.into_iter().flatten() {
                    if let Some(name) = block.as_str() {
                        referenced.insert(name.to_string());
                    }
                }
            }
        }
    }
    Ok(referenced)
}

fn manifest_files(manifest: &serde_json::Value) -> Option<&Vec<serde_json::Value>> {
    manifest.get("data_files")?.as_array()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(store: &Path, bytes: &[u8]) -> String {
        let digest = *blake3::hash(bytes).as_bytes();
        let path = store.join(block_path(&digest));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        block_name(&digest)
    }

    fn manifest_with(dir: &Path, file: &str, blocks: &[&str]) {
        std::fs::create_dir_all(dir).unwrap();
        let value = serde_json::json!({ "data_files": [{ "blocks": blocks }] });
        let value = if file == PENDING_BLOCKS {
            value["data_files"].clone()
        } else {
            value
        };
        std::fs::write(dir.join(file), serde_json::to_vec(&value).unwrap()).unwrap();
    }

    fn exists(store: &Path, name: &str) -> bool {
        store.join(&name[..2]).join(name).exists()
    }

    #[test]
    fn collection_keeps_referenced_and_pending_blocks_and_removes_the_rest() {
        let parent = tempfile::tempdir().unwrap();
        let checkpoint = parent.path().join("a");
        let store = BlockStore::create(&checkpoint, None).unwrap();
        let root = store.path().to_path_buf();
        assert_eq!(
            root,
            parent.path().canonicalize().unwrap().join(BLOCK_STORE_DIR)
        );
        let kept = put(&root, b"kept by a");
        let pending = put(&root, b"kept by an incomplete checkpoint");
        let unreferenced = put(&root, b"nobody's");
        manifest_with(
            &parent.path().join("a"),
            protocol::manifest::MANIFEST_FILE_NAME,
            &[&kept],
        );
        manifest_with(&parent.path().join("b"), PENDING_BLOCKS, &[&pending]);
        // Not the tool's: left alone whatever they are named.
        std::fs::write(root.join(&kept[..2]).join("notes.txt"), b"mine").unwrap();
        let stale = format!("{TEMP_PREFIX}{unreferenced}-1-0");
        std::fs::write(root.join(&unreferenced[..2]).join(&stale), b"half").unwrap();

        let collected = store.collect().unwrap();
        assert_eq!((collected.blocks, collected.kept), (1, 2), "{collected:?}");
        assert!(exists(&root, &kept) && exists(&root, &pending));
        assert!(!exists(&root, &unreferenced), "unreferenced block removed");
        assert!(
            !root.join(&unreferenced[..2]).join(stale).exists(),
            "stale temporary removed"
        );
        assert!(root.join(&kept[..2]).join("notes.txt").exists());
    }

    #[test]
    fn a_manifest_that_does_not_parse_stops_the_collection() {
        let parent = tempfile::tempdir().unwrap();
        let store = BlockStore::create(&parent.path().join("a"), None).unwrap();
        let block = put(store.path(), b"whose?");
        std::fs::create_dir(parent.path().join("a")).unwrap();
        std::fs::write(parent.path().join("a").join("manifest.json"), b"{ not json").unwrap();
        let error = store.collect().expect_err("unreadable references");
        assert!(matches!(error, ControlError::Refused(_)), "{error}");
        assert!(exists(store.path(), &block), "nothing removed");
    }

    #[test]
    fn a_store_reached_through_a_symbolic_link_is_refused() {
        let parent = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), parent.path().join(BLOCK_STORE_DIR)).unwrap();
        let checkpoint = parent.path().join("a");
        assert!(BlockStore::existing(&checkpoint).is_err());
        assert!(BlockStore::open(&checkpoint).is_err());
        assert!(BlockStore::create(&checkpoint, None).is_err());
    }

    #[test]
    fn blocks_are_checked_for_presence_length_and_content() {
        let parent = tempfile::tempdir().unwrap();
        let store = BlockStore::create(&parent.path().join("a"), None).unwrap();
        let bytes = vec![5u8; 4096];
        let name = put(store.path(), &bytes);
        let digest = *blake3::hash(&bytes).as_bytes();
        let block = StoredBlock {
            index: 0,
            len: 4096,
            digest: Some(digest),
        };
        store.check_blocks(&[block]).unwrap();
        assert_eq!(store.verify_block(&block).unwrap(), 4096);
        let path = store.path().join(&name[..2]).join(&name);
        std::fs::write(&path, vec![6u8; 4096]).unwrap();
        store.check_blocks(&[block]).unwrap();
        assert!(store.verify_block(&block).is_err(), "another content");
        std::fs::write(&path, vec![5u8; 100]).unwrap();
        assert!(store.check_blocks(&[block]).is_err(), "another length");
        std::fs::remove_file(&path).unwrap();
        assert!(store.check_blocks(&[block]).is_err(), "missing");
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(store.check_blocks(&[block]).is_err(), "a link");
        assert!(store.verify_block(&block).is_err(), "a link");
    }

    #[test]
    fn the_shared_lock_keeps_collection_waiting() {
        let parent = tempfile::tempdir().unwrap();
        let store = BlockStore::create(&parent.path().join("a"), None).unwrap();
        let shared = store.lock_shared().unwrap();
        let also = store.lock_shared().unwrap();
        let file = rustix::fs::openat(
            store.fd(),
            LOCK_FILE,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let busy = rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive);
        assert_eq!(
            busy,
            Err(rustix::io::Errno::WOULDBLOCK),
            "shared excludes exclusive"
        );
        drop((shared, also));
        rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive).unwrap();
    }
}
