//! `cuinterpose discard`: deletes a checkpoint on disk, with what it keeps outside its directory
//! (the link remaps of files the workload held open after their names were deleted, crate::remaps).
//!
//! Fail closed: only a directory whose manifest reads as a checkpoint to disk, or that holds the
//! marker of an incomplete one (a checkpoint that failed or was killed: disk::INCOMPLETE_MARKER),
//! and that holds nothing but what a checkpoint writes, is removed; anything else is a refusal
//! that removes nothing. The manifest (or the marker) goes last, so a discard that failed part
//! way can be run again.

use crate::disk::{DATA_DIR, IMAGE_DIGESTS, IMAGES_DIR, INCOMPLETE_MARKER, read_manifest};
use crate::{ControlError, Refusal};
use protocol::manifest::MANIFEST_FILE_NAME;
use protocol::manifest::REMAPS_DIR;
use std::path::{Path, PathBuf};

/// What a discard removed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiscardReport {
    pub dir: PathBuf,
    /// Size of the CRIU images removed.
    pub image_bytes: u64,
    /// The kept link remaps removed (outside the directory).
    pub link_remaps: Vec<String>,
}

fn removing(path: &Path, e: std::io::Error) -> ControlError {
    ControlError::Removing {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Removes the checkpoint in `dir` and its kept link remaps, under the directory's run lock.
pub fn discard(dir: &Path) -> Result<DiscardReport, ControlError> {
    let _lock = crate::runlock::RunLock::directory(dir)?;
    discard_unlocked(dir)
}

/// [`discard`] for a caller that holds the directory's lock already.
pub(crate) fn discard_unlocked(dir: &Path) -> Result<DiscardReport, ControlError> {
    if dir.join(INCOMPLETE_MARKER).exists() {
        return discard_incomplete(dir);
    }
    let manifest = read_manifest(dir)?;
    let known = [
        MANIFEST_FILE_NAME,
        manifest.state.file.as_str(),
        IMAGES_DIR,
        IMAGE_DIGESTS,
        DATA_DIR,
        REMAPS_DIR,
    ];
    refuse_strangers(dir, &known)?;
    let images = dir.join(IMAGES_DIR);
    let image_bytes = crate::criu::directory_bytes(&images);
    let remaps = manifest
        .criu
        .map(|criu| criu.link_remaps)
        .unwrap_or_default();
    remove_parts(dir, &[manifest.state.file.as_str(), IMAGE_DIGESTS], &remaps)?;
    let manifest_path = dir.join(MANIFEST_FILE_NAME);
    std::fs::remove_file(&manifest_path).map_err(|e| removing(&manifest_path, e))?;
    std::fs::remove_dir(dir).map_err(|e| removing(dir, e))?;
    Ok(DiscardReport {
        dir: dir.to_path_buf(),
        image_bytes,
        link_remaps: remaps.into_iter().map(|r| r.kept_as).collect(),
    })
}

/// Removes what a checkpoint that failed or was killed wrote (its marker lists the link remaps
/// it already kept), the marker last.
fn discard_incomplete(dir: &Path) -> Result<DiscardReport, ControlError> {
    let marker = dir.join(INCOMPLETE_MARKER);
    let remaps: Vec<protocol::manifest::LinkRemap> =
        transport::files::read_bounded(&marker, 1 << 20)
            .map_err(crate::FileError::from)
            .and_then(|bytes| {
                serde_json::from_slice(&bytes)
                    .map_err(|e| crate::FileError::Io(std::io::Error::other(e)))
            })
            .map_err(|source| ControlError::State {
                path: marker.clone(),
                source,
            })?;
    let state = protocol::state::STATE_FILE_NAME;
    let known = [
        INCOMPLETE_MARKER,
        MANIFEST_FILE_NAME,
        state,
        IMAGES_DIR,
        IMAGE_DIGESTS,
        DATA_DIR,
        REMAPS_DIR,
    ];
    refuse_strangers(dir, &known)?;
    let image_bytes = crate::criu::directory_bytes(&dir.join(IMAGES_DIR));
    remove_parts(dir, &[MANIFEST_FILE_NAME, state, IMAGE_DIGESTS], &remaps)?;
    // Files a publish killed half way left (transport::files::write_atomically).
    for entry in std::fs::read_dir(dir)
        .map_err(|e| removing(dir, e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_temporary_of(&name, &known) {
            std::fs::remove_file(entry.path()).map_err(|e| removing(&entry.path(), e))?;
        }
    }
    std::fs::remove_file(&marker).map_err(|e| removing(&marker, e))?;
    std::fs::remove_dir(dir).map_err(|e| removing(dir, e))?;
    Ok(DiscardReport {
        dir: dir.to_path_buf(),
        image_bytes,
        link_remaps: remaps.into_iter().map(|r| r.kept_as).collect(),
    })
}

/// `.<name>.tmp-<pid>-<random>` of a known name: what `write_atomically` leaves when killed.
fn is_temporary_of(name: &str, known: &[&str]) -> bool {
    known.iter().any(|k| {
        name.strip_prefix('.')
            .and_then(|n| n.strip_prefix(k))
            .is_some_and(|rest| rest.starts_with(".tmp-"))
    })
}

/// Refuses a directory holding anything but `known` (and their temporary files).
fn refuse_strangers(dir: &Path, known: &[&str]) -> Result<(), ControlError> {
    let mut strangers: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| ControlError::State {
            path: dir.to_path_buf(),
            source: e.into(),
        })?
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !known.contains(&name.as_str()) && !is_temporary_of(name, known))
        .collect();
    if !strangers.is_empty() {
        strangers.sort();
        return Err(ControlError::Refused(vec![Refusal {
            process: format!("checkpoint {}", dir.display()),
            reason: format!(
                "also holds {strangers:?}, which a checkpoint does not write; nothing was removed"
            ),
        }]));
    }
    Ok(())
}

/// Removes the images, the data files, `files` in `dir` and the kept link remaps (whatever of
/// them is left).
fn remove_parts(
    dir: &Path,
    files: &[&str],
    remaps: &[protocol::manifest::LinkRemap],
) -> Result<(), ControlError> {
    for sub in [IMAGES_DIR, DATA_DIR, REMAPS_DIR] {
        let path = dir.join(sub);
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(removing(&path, e)),
        }
    }
    for name in files {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(removing(&path, e)),
        }
    }
    crate::remaps::discard(remaps)
}
