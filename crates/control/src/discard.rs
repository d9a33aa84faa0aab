//! `cuinterpose discard`: deletes a checkpoint on disk, with what it keeps outside its directory
//! (the link remaps of files the workload held open after their names were deleted, crate::remaps).
//!
//! Fail closed: only a directory whose manifest reads as a checkpoint to disk, and that holds
//! nothing but what a checkpoint writes, is removed; anything else is a refusal that removes
//! nothing. The manifest goes last, so a discard that failed part way can be run again.

use crate::disk::{IMAGE_DIGESTS, IMAGES_DIR, read_manifest};
use crate::{ControlError, Refusal};
use protocol::manifest::MANIFEST_FILE_NAME;
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

/// Removes the checkpoint in `dir` and its kept link remaps.
pub fn discard(dir: &Path) -> Result<DiscardReport, ControlError> {
    let manifest = read_manifest(dir)?;
    let known = [
        MANIFEST_FILE_NAME,
        manifest.state.file.as_str(),
        IMAGES_DIR,
        IMAGE_DIGESTS,
    ];
    let mut strangers: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| ControlError::State {
            path: dir.to_path_buf(),
            source: e.into(),
        })?
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !known.contains(&name.as_str()))
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
    let images = dir.join(IMAGES_DIR);
    let image_bytes = crate::criu::directory_bytes(&images);
    let remaps = manifest
        .criu
        .map(|criu| criu.link_remaps)
        .unwrap_or_default();

    match std::fs::remove_dir_all(&images) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(removing(&images, e)),
    }
    for name in [manifest.state.file.as_str(), IMAGE_DIGESTS] {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(removing(&path, e)),
        }
    }
    crate::remaps::discard(&remaps)?;
    let manifest_path = dir.join(MANIFEST_FILE_NAME);
    std::fs::remove_file(&manifest_path).map_err(|e| removing(&manifest_path, e))?;
    std::fs::remove_dir(dir).map_err(|e| removing(dir, e))?;
    Ok(DiscardReport {
        dir: dir.to_path_buf(),
        image_bytes,
        link_remaps: remaps.into_iter().map(|r| r.kept_as).collect(),
    })
}
