//! `cuinterpose discard`: deletes a checkpoint on disk, with what it keeps outside its directory
//! (the link remaps of files the workload held open after their names were deleted, crate::remaps).
//!
//! Fail closed, and nothing read from the directory is trusted: anyone who can write it (shared
//! storage, a user's directory an administrator discards) chooses what it holds. So the whole
//! directory is checked before anything is deleted, and only names the tool itself writes are
//! deleted:
//! - the directory itself, and each of its subdirectories, must be a directory, not a symbolic
//!   link to one;
//! - every entry, at the top and in `images/`, `data/` and `remaps/`, must be a regular file (no
//!   link, FIFO or device) of a name a checkpoint writes there: for a complete checkpoint the files
//!   its manifest and image digest list name, for an incomplete one (the marker
//!   disk::INCOMPLETE_MARKER: a checkpoint that failed or was killed) the names a checkpoint
//!   writes by their form;
//! - the link remaps kept outside the directory, read from the manifest or the marker, must be
//!   well formed (`LinkRemap::is_well_formed`: a `link_remap.<id>.cuinterpose-<tag>` file beside
//!   CRIU's `link_remap.<id>`) and regular files in a directory reached without a symbolic link.
//!
//! Anything else is a refusal that removes nothing. The manifest (or the marker) goes last, so a
//! discard that failed part way can be run again.
//!
//! Then the block store beside the directory (super::store) is collected: the blocks no
//! other checkpoint there references are deleted, under the store's exclusive lock, so never one a
//! running checkpoint has written or referenced. The store is checked (a directory, not a
//! symbolic link) before anything is deleted, and only regular files named like blocks inside it
//! are deleted.

use super::store::{BlockStore, Collected, PENDING_BLOCKS};
use super::{
    DATA_DIR, IMAGE_DIGESTS, IMAGES_DIR, INCOMPLETE_MARKER, SIGNATURE_FILE, read_manifest,
};
use crate::safefs;
use crate::{Classified, ControlError, ErrorClass, Refusal};
use protocol::manifest::{LinkRemap, MANIFEST_FILE_NAME, Manifest, REMAPS_DIR};
use protocol::state::STATE_FILE_NAME;
use std::path::{Path, PathBuf};

/// What a discard removed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiscardReport {
    pub dir: PathBuf,
    /// Size of the CRIU images removed.
    pub image_bytes: u64,
    /// The kept link remaps removed (outside the directory).
    pub link_remaps: Vec<String>,
    /// What the collection of the block store beside the directory removed (blocks no other
    /// checkpoint references); `None` when there is no store there.
    pub store: Option<Collected>,
    /// Why the block store beside the directory was not collected, when it was not.
    pub store_not_collected: Option<String>,
}

/// Why `discard` failed: before anything was removed, or part way (a discard run again finishes:
/// the manifest or the marker goes last).
#[derive(Debug, thiserror::Error)]
pub enum DiscardError {
    /// Nothing was removed: the directory, its run lock (another run holds it), its block store,
    /// or something in or beside it that a checkpoint does not write (a refusal).
    #[error(transparent)]
    NothingRemoved(ControlError),
    /// Part way: a file or directory of the checkpoint could not be removed.
    #[error("removing {path}: {source}")]
    Removing {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Part way: a link remap kept outside the directory could not be removed.
    #[error(transparent)]
    LinkRemap(ControlError),
}

impl Classified for DiscardError {
    fn class(&self) -> ErrorClass {
        match self {
            DiscardError::NothingRemoved(cause) | DiscardError::LinkRemap(cause) => cause.class(),
            // Part of the checkpoint is gone: neither a refusal nor a rollback.
            DiscardError::Removing { .. } => ErrorClass::Error,
        }
    }
}

impl DiscardError {
    /// As a `ControlError`, with the same message and class: for a checkpoint, whose own errors
    /// are those (disk::preflight removes an incomplete checkpoint before a new one).
    pub fn into_control(self) -> ControlError {
        match self {
            DiscardError::NothingRemoved(cause) | DiscardError::LinkRemap(cause) => cause,
            DiscardError::Removing { path, source } => ControlError::Removing { path, source },
        }
    }
}

fn removing(path: &Path, e: std::io::Error) -> DiscardError {
    DiscardError::Removing {
        path: path.to_path_buf(),
        source: e,
    }
}

/// A refusal about the directory `dir`; nothing was removed.
fn refused(dir: &Path, reason: impl std::fmt::Display) -> ControlError {
    ControlError::Refused(vec![Refusal {
        process: format!("checkpoint {}", dir.display()),
        reason: format!("{reason}; nothing was removed"),
    }])
}

/// Removes the checkpoint in `dir` and its kept link remaps, under the directory's run lock.
pub fn discard(dir: &Path) -> Result<DiscardReport, DiscardError> {
    // Before the lock, which would be taken on the link's target otherwise.
    check_real_dir(dir).map_err(DiscardError::NothingRemoved)?;
    let _lock = crate::runlock::RunLock::directory(dir).map_err(DiscardError::NothingRemoved)?;
    // Checked before anything is removed: a store that is a symbolic link is a refusal.
    let store =
        BlockStore::existing(dir).map_err(|e| DiscardError::NothingRemoved(refused(dir, e)))?;
    let mut report = discard_unlocked(dir)?;
    if let Some(store) = store {
        // The checkpoint is gone either way; a collection that cannot run (a manifest beside it
        // that does not parse) deletes nothing and says why: the next discard collects.
        match store.collect() {
            Ok(collected) => report.store = Some(collected),
            Err(e) => report.store_not_collected = Some(e.to_string()),
        }
    }
    Ok(report)
}

/// `dir` must be a directory itself (a symbolic link would have the tool delete in its target).
fn check_real_dir(dir: &Path) -> Result<(), ControlError> {
    match safefs::real_dir(dir) {
        Ok(true) => Ok(()),
        Ok(false) => Err(refused(dir, "does not exist")),
        Err(e) => Err(refused(dir, e)),
    }
}

/// What a discard deletes, all checked before the first deletion.
struct Plan {
    /// Files in the directory and its subdirectories, relative to it; the last goes last.
    files: Vec<PathBuf>,
    /// The link remaps kept outside the directory.
    remaps: Vec<LinkRemap>,
}

/// [`discard`] for a caller that holds the directory's lock already.
pub(crate) fn discard_unlocked(dir: &Path) -> Result<DiscardReport, DiscardError> {
    let plan = plan(dir).map_err(DiscardError::NothingRemoved)?;
    let image_bytes = crate::criu::directory_bytes(&dir.join(IMAGES_DIR));
    // The checkpoint's own files; the manifest or the marker (last in the plan) after the link
    // remaps, so that a discard that failed part way still finds them.
    let (last, files) = plan
        .files
        .split_last()
        .map_or((None, &[][..]), |(l, f)| (Some(l), f));
    for name in files {
        remove_file(&dir.join(name))?;
    }
    for sub in [IMAGES_DIR, DATA_DIR, REMAPS_DIR] {
        let path = dir.join(sub);
        match std::fs::remove_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(removing(&path, e)),
        }
    }
    crate::remaps::discard(&plan.remaps).map_err(DiscardError::LinkRemap)?;
    if let Some(last) = last {
        remove_file(&dir.join(last))?;
    }
    std::fs::remove_dir(dir).map_err(|e| removing(dir, e))?;
    Ok(DiscardReport {
        dir: dir.to_path_buf(),
        image_bytes,
        link_remaps: plan.remaps.into_iter().map(|r| r.kept_as).collect(),
        store: None,
        store_not_collected: None,
    })
}

/// Everything a discard of `dir` deletes, checked before the first deletion: a refusal (or the
/// directory unreadable) otherwise.
fn plan(dir: &Path) -> Result<Plan, ControlError> {
    check_real_dir(dir)?;
    let incomplete = std::fs::symlink_metadata(dir.join(INCOMPLETE_MARKER)).is_ok();
    let plan = if incomplete {
        plan_incomplete(dir)?
    } else {
        plan_complete(dir)?
    };
    for remap in &plan.remaps {
        crate::remaps::check_discardable(remap).map_err(|e| refused(dir, e))?;
    }
    Ok(plan)
}

fn remove_file(path: &Path) -> Result<(), DiscardError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(removing(path, e)),
    }
}

/// A complete checkpoint: exactly the files its manifest and image digest list name.
fn plan_complete(dir: &Path) -> Result<Plan, ControlError> {
    let manifest: Manifest = read_manifest(dir).map_err(|e| match e {
        ControlError::Refused(mut refusals) => {
            for r in &mut refusals {
                r.reason.push_str("; nothing was removed");
            }
            ControlError::Refused(refusals)
        }
        other => other,
    })?;
    if manifest.state.file != STATE_FILE_NAME {
        return Err(refused(
            dir,
            format!(
                "its manifest names the state file {:?}, which a checkpoint never writes",
                manifest.state.file
            ),
        ));
    }
    let digests = dir.join(IMAGE_DIGESTS);
    let listed_images: Vec<String> = match safefs::open_regular(&digests) {
        Ok(file) => image_names(file).map_err(|e| refused(dir, format!("{IMAGE_DIGESTS}: {e}")))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(refused(dir, format!("{IMAGE_DIGESTS} {e}"))),
    };
    let remaps = manifest
        .criu
        .map(|criu| criu.link_remaps)
        .unwrap_or_default();
    let copies: Vec<String> = (remaps.iter().filter(|r| r.is_copy()))
        .filter_map(|r| {
            r.kept_as
                .strip_prefix(&format!("{REMAPS_DIR}/"))
                .map(str::to_string)
        })
        .collect();
    // Entries kept in the block store have no file in `data/`.
    let data: Vec<String> = (manifest.data_files.iter())
        .filter(|d| d.blocks.is_none())
        .map(|d| d.file.clone())
        .collect();
    let expected = Expected {
        top: &|name| {
            [
                STATE_FILE_NAME,
                IMAGE_DIGESTS,
                SIGNATURE_FILE,
                PENDING_BLOCKS,
            ]
            .contains(&name)
        },
        images: &|name| listed_images.iter().any(|n| n == name) || is_criu_log(name),
        data: &|name| data.iter().any(|n| n == name),
        remaps: &|name| copies.iter().any(|n| n == name),
    };
    let mut files = check_entries(dir, &expected, MANIFEST_FILE_NAME)?;
    files.push(PathBuf::from(MANIFEST_FILE_NAME));
    Ok(Plan { files, remaps })
}

/// An incomplete checkpoint: the names a checkpoint writes, by their form (it may have been
/// killed anywhere), and the link remaps its marker lists, each well formed.
fn plan_incomplete(dir: &Path) -> Result<Plan, ControlError> {
    let marker = dir.join(INCOMPLETE_MARKER);
    let remaps: Vec<LinkRemap> = safefs::open_regular(&marker)
        .and_then(|file| {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(file, 1 << 20), &mut bytes)?;
            serde_json::from_slice(&bytes).map_err(std::io::Error::other)
        })
        .map_err(|e| refused(dir, format!("{INCOMPLETE_MARKER}: {e}")))?;
    if let Some(bad) = remaps.iter().find(|r| !r.is_well_formed()) {
        return Err(refused(
            dir,
            format!(
                "{INCOMPLETE_MARKER} lists the link remap {:?} kept as {:?}, which is not a name \
                 the tool keeps a link remap under",
                bad.link, bad.kept_as
            ),
        ));
    }
    let top = [
        MANIFEST_FILE_NAME,
        STATE_FILE_NAME,
        IMAGE_DIGESTS,
        SIGNATURE_FILE,
        PENDING_BLOCKS,
        INCOMPLETE_MARKER,
    ];
    let expected = Expected {
        top: &|name| top[..5].contains(&name) || is_temporary_of(name, &top),
        images: &|name| crate::criu::is_image(name) || is_criu_log(name),
        data: &|name| is_data_file_name(name),
        remaps: &|name| is_remap_copy_name(name),
    };
    let mut files = check_entries(dir, &expected, INCOMPLETE_MARKER)?;
    files.push(PathBuf::from(INCOMPLETE_MARKER));
    Ok(Plan { files, remaps })
}

/// The image names of a digest list (`<digest>  images/<name>` lines).
fn image_names(file: std::fs::File) -> std::io::Result<Vec<String>> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 16 << 20), &mut text)?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once("  "))
        .filter_map(|(_, path)| path.strip_prefix(&format!("{IMAGES_DIR}/")))
        .filter(|name| !name.is_empty() && !name.contains('/') && *name != "..")
        .map(str::to_string)
        .collect())
}

/// CRIU's log and statistics of a dump, written beside its images.
fn is_criu_log(name: &str) -> bool {
    ["dump.log", "stats-dump", "restore.log", "stats-restore"].contains(&name)
}

/// `gpu-<ns pid>.data` (protocol::manifest::data_file_name).
fn is_data_file_name(name: &str) -> bool {
    name.strip_prefix("gpu-")
        .and_then(|n| n.strip_suffix(".data"))
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| protocol::manifest::data_file_name(pid) == name)
}

/// `link_remap.<id>`: a copy of a container's link remap (crate::remaps).
fn is_remap_copy_name(name: &str) -> bool {
    name.strip_prefix("link_remap.")
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// `.<name>.tmp-<pid>-<16 hex digits>` of a known name: what `write_atomically` leaves when
/// killed.
fn is_temporary_of(name: &str, known: &[&str]) -> bool {
    known.iter().any(|k| {
        name.strip_prefix('.')
            .and_then(|n| n.strip_prefix(k))
            .and_then(|rest| rest.strip_prefix(".tmp-"))
            .and_then(|rest| rest.split_once('-'))
            .is_some_and(|(pid, random)| {
                !pid.is_empty()
                    && pid.bytes().all(|b| b.is_ascii_digit())
                    && random.len() == 16
                    && random.bytes().all(|b| b.is_ascii_hexdigit())
            })
    })
}

/// Whether a name is one a checkpoint writes in a place.
type Accepts<'a> = &'a dyn Fn(&str) -> bool;

/// The names a checkpoint writes, per place.
struct Expected<'a> {
    top: Accepts<'a>,
    images: Accepts<'a>,
    data: Accepts<'a>,
    remaps: Accepts<'a>,
}

/// Checks every entry of `dir` and of its subdirectories against `expected`; returns the files
/// to delete (relative to `dir`), `last` (checked by the caller) left out. A stranger, or a name
/// that is not what the checkpoint wrote there (a symbolic link, a FIFO, a device, a directory
/// where a file belongs), is a refusal naming every one.
fn check_entries(
    dir: &Path,
    expected: &Expected<'_>,
    last: &str,
) -> Result<Vec<PathBuf>, ControlError> {
    let mut files = Vec::new();
    let mut strangers = Vec::new();
    let subs: [(&str, Accepts<'_>); 3] = [
        (IMAGES_DIR, expected.images),
        (DATA_DIR, expected.data),
        (REMAPS_DIR, expected.remaps),
    ];
    for (name, kind) in entries(dir)? {
        if name == last {
            if !kind.is_file() {
                strangers.push(format!("{name} ({})", safefs::describe(kind)));
            }
            continue;
        }
        if let Some((sub, is_expected)) = subs.iter().find(|(s, _)| *s == name) {
            if !kind.is_dir() {
                strangers.push(format!("{name} ({})", safefs::describe(kind)));
                continue;
            }
            for (inner, inner_kind) in entries(&dir.join(sub))? {
                let path = Path::new(sub).join(&inner);
                if !is_expected(&inner) {
                    strangers.push(path.display().to_string());
                } else if !inner_kind.is_file() {
                    strangers.push(format!(
                        "{} ({})",
                        path.display(),
                        safefs::describe(inner_kind)
                    ));
                } else {
                    files.push(path);
                }
            }
        } else if !(expected.top)(&name) {
            strangers.push(name);
        } else if !kind.is_file() {
            strangers.push(format!("{name} ({})", safefs::describe(kind)));
        } else {
            files.push(PathBuf::from(name));
        }
    }
    if !strangers.is_empty() {
        strangers.sort();
        return Err(refused(
            dir,
            format!(
                "also holds {}, which a checkpoint does not write (or not as that)",
                strangers.join(", ")
            ),
        ));
    }
    Ok(files)
}

/// The entries of `dir`, each with its own type (links not followed).
fn entries(dir: &Path) -> Result<Vec<(String, std::fs::FileType)>, ControlError> {
    let unreadable = |e: std::io::Error| refused(dir, format!("cannot be read: {e}"));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let kind = entry.file_type().map_err(unreadable)?;
        out.push((entry.file_name().to_string_lossy().into_owned(), kind));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stranger in the directory is a refusal before the first deletion: classified as one
    /// (exit 3), and everything is still there.
    #[test]
    fn a_refused_discard_removes_nothing_and_is_classified_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(INCOMPLETE_MARKER), "[]").expect("marker");
        std::fs::write(dir.path().join(MANIFEST_FILE_NAME), "{}").expect("manifest");
        std::fs::write(dir.path().join("stranger"), "").expect("stranger");
        let e = discard_unlocked(dir.path()).expect_err("a stranger is refused");
        assert!(matches!(e, DiscardError::NothingRemoved(_)), "{e:?}");
        assert_eq!(e.class(), ErrorClass::Refused);
        assert!(e.to_string().contains("also holds stranger"), "{e}");
        for name in [INCOMPLETE_MARKER, MANIFEST_FILE_NAME, "stranger"] {
            assert!(dir.path().join(name).exists(), "{name} was removed");
        }
    }

    /// A discard that failed part way is an error (exit 1), and keeps its message when a
    /// checkpoint's preflight reports it as its own.
    #[test]
    fn a_discard_failed_part_way_is_an_error_as_a_checkpoint_reports_it() {
        let part_way = || removing(Path::new("/c/images"), std::io::Error::other("busy"));
        assert_eq!(part_way().class(), ErrorClass::Error);
        let control = part_way().into_control();
        assert!(
            matches!(control, ControlError::Removing { .. }),
            "{control:?}"
        );
        assert_eq!(control.to_string(), part_way().to_string());
        assert_eq!(control.class(), ErrorClass::Error);
    }

    #[test]
    fn temporaries_are_those_write_atomically_makes() {
        let known = [MANIFEST_FILE_NAME];
        assert!(is_temporary_of(
            ".manifest.json.tmp-123-0123456789abcdef",
            &known
        ));
        for name in [
            ".manifest.json.tmp-mine",
            ".manifest.json.tmp-",
            ".manifest.json.tmp-12-0123",
            ".manifest.json.tmp-x-0123456789abcdef",
            "manifest.json.tmp-1-0123456789abcdef",
        ] {
            assert!(!is_temporary_of(name, &known), "{name}");
        }
        assert!(is_data_file_name("gpu-12.data"));
        for name in ["gpu-.data", "gpu-012.data", "gpu-1.data.bak", "notes.txt"] {
            assert!(!is_data_file_name(name), "{name}");
        }
        assert!(is_remap_copy_name("link_remap.7"));
        assert!(!is_remap_copy_name("link_remap.7x"));
    }
}
