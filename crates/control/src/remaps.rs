//! CRIU's link remaps around a checkpoint and a restore (what they are: criu::images).
//!
//! A link remap is a hard link CRIU makes at dump time next to a file the tree holds open under a
//! deleted name (`<dir>/link_remap.<id>`); the images restore through it. Two things make CRIU's
//! own handling unfit for a checkpoint that outlives the dump:
//!
//! - the id is a file id of that dump, which the next dump of any tree reuses: a link left under
//!   CRIU's name makes the next dump that needs the same name fail ("File exists", seen on the
//!   H200 with a PyTorch checkpoint followed by an NCCL one);
//! - `criu restore` removes the link after a restore that worked and after one that failed alike,
//!   so the checkpoint could be restored once at most.
//!
//! So right after the dump the tool moves every link remap to a name of the checkpoint's own in
//! the same directory (`link_remap.<id>.cuinterpose-<tag>`, in the manifest), and a restore links
//! it back to CRIU's name only while CRIU runs.
//!
//! A tree in a container holds such files in the container's filesystems (a pod's `/dev/shm`,
//! where every Python multiprocessing semaphore lives), which the tool reaches only through the
//! tree's root (`/proc/<pid>/root`), which go away with the pod, and which a restore into another
//! container does not share: a hard link cannot cross into those. So the tool copies each into
//! the checkpoint directory (`remaps/link_remap.<id>`, owner and mode kept) and removes CRIU's
//! link, and a restore writes the copy under CRIU's name as the container restored into sees it,
//! only while CRIU runs.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use protocol::manifest::{LinkRemap, REMAPS_DIR};

use crate::ControlError;

fn error(path: &Path, what: impl Into<String>) -> ControlError {
    ControlError::LinkRemap {
        path: path.to_path_buf(),
        what: what.into(),
        source: None,
    }
}

/// A link remap that could not be handled because of `cause`, while doing `what`.
fn failed(path: &Path, what: impl Into<String>, cause: impl Into<std::io::Error>) -> ControlError {
    ControlError::LinkRemap {
        path: path.to_path_buf(),
        what: what.into(),
        source: Some(cause.into()),
    }
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// A tag for this checkpoint's kept names: 64 random bits.
fn new_tag() -> Result<String, ControlError> {
    let mut bytes = [0u8; 8];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| failed(Path::new("getrandom"), "", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `path` (absolute, in the mount namespace of `pid`) as this process reaches it: through the
/// root of `pid`, or `path` itself without one.
fn seen_by(pid: Option<u32>, path: &str) -> PathBuf {
    match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/root{path}")),
        None => PathBuf::from(path),
    }
}

/// Where a kept file is: `kept_as` itself, or, for a copy, in the checkpoint directory `dir`.
fn kept_path(remap: &LinkRemap, dir: &Path) -> PathBuf {
    if remap.is_copy() {
        dir.join(&remap.kept_as)
    } else {
        PathBuf::from(&remap.kept_as)
    }
}

/// Takes over the link remaps CRIU just made for the tree under `root` (stopped, not yet gone).
/// `copy_into`: the checkpoint directory, for a tree in a container, whose files are copied
/// there (the module comment says why). Otherwise: checks that the tool's mount namespace sees
/// the same file at each path as the tree does (a restore runs from here), then moves each to
/// its kept name. On an error every link of this dump goes: those taken (moved or copied), and
/// the others under CRIU's names (left there, they would make the next dump that needs the same
/// name fail).
pub fn take_over(
    root: u32,
    links: &[String],
    copy_into: Option<&Path>,
) -> Result<Vec<LinkRemap>, ControlError> {
    let mut taken = Vec::new();
    let result = match copy_into {
        Some(dir) => copy_out(root, links, dir, &mut taken),
        None => move_beside(root, links, &mut taken),
    };
    if let Err(e) = result {
        // The ones not taken are reached through the workload's root, where CRIU made them:
        // the tool's namespace may hold another file at the same path.
        let kept = taken
            .iter()
            .map(|r| kept_path(r, copy_into.unwrap_or(Path::new("/"))));
        let untaken = (links.get(taken.len()..).unwrap_or_default().iter())
            .map(|link| seen_by(Some(root), link));
        for path in kept.chain(untaken) {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), error = %e, "removing a link remap of a failed dump");
            }
        }
        return Err(e);
    }
    Ok(taken)
}

/// Copies each link remap of the tree under `root` into `dir`'s [`REMAPS_DIR`] (owner and mode
/// kept) and removes CRIU's link; each one done is pushed to `taken`.
fn copy_out(
    root: u32,
    links: &[String],
    dir: &Path,
    taken: &mut Vec<LinkRemap>,
) -> Result<(), ControlError> {
    let remaps_dir = dir.join(REMAPS_DIR);
    for link in links {
        let there = seen_by(Some(root), link);
        let name = Path::new(link)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let remap = LinkRemap {
            link: link.clone(),
            kept_as: format!("{REMAPS_DIR}/{name}"),
        };
        std::fs::create_dir_all(&remaps_dir)
            .and_then(|()| copy_file(&there, &kept_path(&remap, dir)))
            .and_then(|()| std::fs::remove_file(&there))
            .map_err(|e| {
                failed(
                    Path::new(link),
                    format!("copying it into {}", dir.display()),
                    e,
                )
            })?;
        taken.push(remap);
    }
    Ok(())
}

/// Copies `from` to the new file `to` (refused if it exists) with its owner and mode.
fn copy_file(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut source = crate::safefs::open_regular(from)?;
    let meta = source.metadata()?;
    let mut target = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    std::io::copy(&mut source, &mut target)?;
    std::os::unix::fs::fchown(&target, Some(meta.uid()), Some(meta.gid()))?;
    target.set_permissions(meta.permissions())?;
    target.sync_all()
}

/// Moves each link remap of the tree under `root` to a kept name beside it, after checking that
/// the tool sees the same file at that path; each one done is pushed to `taken`.
fn move_beside(
    root: u32,
    links: &[String],
    taken: &mut Vec<LinkRemap>,
) -> Result<(), ControlError> {
    let tag = new_tag()?;
    for link in links {
        let here = Path::new(link);
        let there = seen_by(Some(root), link);
        let ours = std::fs::symlink_metadata(here)
            .map_err(|e| failed(here, "not reachable from the tool's namespace", e))?;
        let theirs = std::fs::symlink_metadata(&there)
            .map_err(|e| failed(here, "not found in the workload's namespace", e))?;
        if !same_file(&ours, &theirs) {
            return Err(error(
                here,
                "the tool's mount namespace sees another file at this path than the workload's; \
                 the checkpoint could not be restored from here",
            ));
        }
        let remap = LinkRemap {
            link: link.clone(),
            kept_as: format!("{link}.cuinterpose-{tag}"),
        };
        std::fs::rename(here, &remap.kept_as)
            .map_err(|e| failed(here, format!("moving it to {}", remap.kept_as), e))?;
        taken.push(remap);
    }
    Ok(())
}

/// Removes the link remaps of a checkpoint that failed or is discarded: each kept file, and CRIU's
/// name when it still names the same file (left by an interrupted restore); a file another dump
/// made under that name stays. Ones already gone are fine (a discard that failed part way is run
/// again). Copies are the checkpoint directory's own files, which go with it.
///
/// Each is checked first ([`check_discardable`]): a remap read from a checkpoint names nothing
/// the tool did not create.
pub fn discard(remaps: &[LinkRemap]) -> Result<(), ControlError> {
    for remap in remaps.iter().filter(|r| !r.is_copy()) {
        check_discardable(remap)?;
        remove_criu_name_if_same(remap);
        match std::fs::remove_file(&remap.kept_as) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(Path::new(&remap.kept_as), "", e)),
        }
    }
    Ok(())
}

/// Checks that [`discard`] may delete what `remap` names: both names are what the tool writes
/// (`LinkRemap::is_well_formed`), the kept file, if there, is a regular file, and its directory is
/// reached without a symbolic link (one would send the deletion into another directory). Copies
/// are the checkpoint directory's own files, checked with it (disk/discard.rs).
pub fn check_discardable(remap: &LinkRemap) -> Result<(), ControlError> {
    if remap.is_copy() {
        return Ok(());
    }
    let kept = Path::new(&remap.kept_as);
    if !remap.is_well_formed() {
        return Err(error(
            kept,
            format!(
                "is not the name the tool keeps CRIU's {} under; it is not deleted",
                remap.link
            ),
        ));
    }
    let parent = kept.parent().unwrap_or(Path::new("/"));
    match std::fs::canonicalize(parent) {
        Ok(real) if real == parent => {}
        Ok(real) => {
            return Err(error(
                kept,
                format!(
                    "its directory is reached through a symbolic link (to {}); it is not deleted",
                    real.display()
                ),
            ));
        }
        // Its directory is gone: so is the file.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed(kept, "", e)),
    }
    match std::fs::symlink_metadata(kept) {
        Ok(meta) if meta.file_type().is_file() => Ok(()),
        Ok(meta) => Err(error(
            kept,
            format!(
                "is {}, not the regular file the tool kept; it is not deleted",
                crate::safefs::describe(meta.file_type())
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(failed(kept, "", e)),
    }
}

/// Removes `remap.link` if it is the file kept as `remap.kept_as`.
fn remove_criu_name_if_same(remap: &LinkRemap) {
    let (Ok(link), Ok(kept)) = (
        std::fs::symlink_metadata(&remap.link),
        std::fs::symlink_metadata(&remap.kept_as),
    ) else {
        return; // CRIU removed it, as it does at a restore, or it was never linked.
    };
    if same_file(&link, &kept)
        && let Err(e) = std::fs::remove_file(&remap.link)
    {
        tracing::warn!(link = remap.link, error = %e, "removing CRIU's name of a link remap");
    }
}

/// Checks before a restore of the checkpoint in `dir` that every kept link remap is there, a
/// regular file, and that CRIU's name is free (or already names the same file: left by an
/// interrupted restore); for a copy, CRIU's name as the container of `into` sees it, which must
/// be free.
pub fn check_present(
    remaps: &[LinkRemap],
    dir: &Path,
    into: Option<u32>,
) -> Result<(), ControlError> {
    for remap in remaps {
        let kept = &kept_path(remap, dir);
        let kept_meta = match std::fs::symlink_metadata(kept) {
            Ok(m) if m.file_type().is_file() => m,
            Ok(_) => return Err(error(kept, "is not a regular file")),
            Err(e) => {
                return Err(error(
                    kept,
                    format!(
                        "{e}; the checkpoint keeps here a file the workload held open after its \
                         name was deleted, and the images need it"
                    ),
                ));
            }
        };
        if remap.is_copy() {
            if std::fs::symlink_metadata(seen_by(into, &remap.link)).is_ok() {
                return Err(error(
                    Path::new(&remap.link),
                    "a file has CRIU's name for this link remap in the container restored into \
                     (left by a restore that was killed?); the restore needs it free",
                ));
            }
        } else if let Ok(at_link) = std::fs::symlink_metadata(&remap.link)
            && !same_file(&at_link, &kept_meta)
        {
            return Err(error(
                Path::new(&remap.link),
                "another file has CRIU's name for this link remap (is a dump or a restore of \
                 another tree running?); the restore needs it free",
            ));
        }
    }
    Ok(())
}

/// The link remaps of a restore in progress, linked (or, for copies, written) under CRIU's names;
/// dropping it removes what CRIU left of them under those names. The kept files are never
/// touched.
#[derive(Debug)]
pub struct Linked {
    remaps: Vec<LinkRemap>,
    /// The copies written for the restore: the path and the file (device, inode) written there.
    written: Vec<(PathBuf, (u64, u64))>,
}

/// Links every kept link remap of the checkpoint in `dir` to CRIU's name for the restore; a copy
/// is written under CRIU's name as the container of `into` sees it.
pub fn link_for_restore(
    remaps: &[LinkRemap],
    dir: &Path,
    into: Option<u32>,
) -> Result<Linked, ControlError> {
    let mut linked = Linked {
        remaps: Vec::new(),
        written: Vec::new(),
    };
    for remap in remaps {
        if remap.is_copy() {
            let target = seen_by(into, &remap.link);
            copy_file(&kept_path(remap, dir), &target)
                .and_then(|()| std::fs::symlink_metadata(&target))
                .map(|m| linked.written.push((target, (m.dev(), m.ino()))))
                .map_err(|e| failed(Path::new(&remap.link), "writing it for the restore", e))?;
            continue;
        }
        match std::fs::hard_link(&remap.kept_as, &remap.link) {
            Ok(()) => {}
            // check_present found the same file there.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(failed(
                    Path::new(&remap.link),
                    format!("linking {}", remap.kept_as),
                    e,
                ));
            }
        }
        linked.remaps.push(remap.clone());
    }
    Ok(linked)
}

impl Drop for Linked {
    fn drop(&mut self) {
        self.remaps.iter().for_each(remove_criu_name_if_same);
        for (path, file) in &self.written {
            // CRIU removes it after a restore that worked; one another process made stays.
            if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == *file)
                && let Err(e) = std::fs::remove_file(path)
            {
                tracing::warn!(path = %path.display(), error = %e, "removing a link remap written for a restore");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file held open under a deleted name, and CRIU's link to it, in `dir`.
    fn criu_link_in(dir: &Path) -> String {
        let original = dir.join("sem.x");
        std::fs::write(&original, b"semaphore").expect("write");
        let link = dir.join("link_remap.7");
        std::fs::hard_link(&original, &link).expect("link");
        link.to_string_lossy().into_owned()
    }

    #[test]
    fn taken_over_links_free_criu_names_and_serve_every_restore() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = criu_link_in(dir.path());
        let remaps =
            take_over(std::process::id(), std::slice::from_ref(&link), None).expect("take over");
        assert!(remaps[0].is_well_formed(), "{remaps:?}");
        assert!(
            !Path::new(&link).exists(),
            "CRIU's name is free for the next dump"
        );
        for consumed in [true, false] {
            check_present(&remaps, Path::new("/"), None).expect("present");
            {
                let _linked = link_for_restore(&remaps, Path::new("/"), None).expect("link");
                assert_eq!(std::fs::read(&link).expect("linked"), b"semaphore");
                if consumed {
                    std::fs::remove_file(&link).expect("what CRIU does");
                }
            }
            assert!(!Path::new(&link).exists());
            assert_eq!(
                std::fs::read(&remaps[0].kept_as).expect("kept"),
                b"semaphore"
            );
        }
        discard(&remaps).expect("discard");
        assert!(!Path::new(&remaps[0].kept_as).exists());
    }

    #[test]
    fn missing_kept_files_and_taken_criu_names_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = criu_link_in(dir.path());
        let remaps =
            take_over(std::process::id(), std::slice::from_ref(&link), None).expect("take over");
        // Another tree's dump has CRIU's name now.
        std::fs::write(&link, b"other").expect("other file");
        let err = check_present(&remaps, Path::new("/"), None).expect_err("taken");
        assert!(
            err.to_string().contains("the restore needs it free"),
            "{err}"
        );
        // Left by an interrupted restore: the same file, fine.
        std::fs::remove_file(&link).expect("rm");
        std::fs::hard_link(&remaps[0].kept_as, &link).expect("link");
        check_present(&remaps, Path::new("/"), None).expect("same file");
        drop(link_for_restore(&remaps, Path::new("/"), None).expect("link"));
        std::fs::remove_file(&remaps[0].kept_as).expect("rm");
        let err = check_present(&remaps, Path::new("/"), None).expect_err("missing");
        assert!(err.to_string().contains("the images need it"), "{err}");
    }

    #[test]
    fn the_workload_and_the_tool_must_see_the_same_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir
            .path()
            .join("link_remap.8")
            .to_string_lossy()
            .into_owned();
        assert!(take_over(std::process::id(), &[missing], None).is_err());
        // A failure part way leaves nothing moved.
        let link = criu_link_in(dir.path());
        let missing = dir
            .path()
            .join("link_remap.9")
            .to_string_lossy()
            .into_owned();
        assert!(take_over(std::process::id(), &[link.clone(), missing.clone()], None).is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["sem.x"], "the moved link was removed again");
        // A failure before a link was moved removes it under CRIU's name: the next dump needs it.
        let link = criu_link_in(dir.path());
        assert!(take_over(std::process::id(), &[missing, link.clone()], None).is_err());
        assert!(
            !Path::new(&link).exists(),
            "the link left unmoved was removed"
        );
        assert!(dir.path().join("sem.x").is_file());
    }

    /// A tree in a container: its link remap is copied into the checkpoint directory (owner and
    /// mode kept) and CRIU's name freed, through the tree's root; a restore writes the copy under
    /// CRIU's name as the container restored into sees it, refuses while a file has that name
    /// there, and removes it afterwards unless CRIU did; discard leaves copies to the directory.
    #[test]
    fn a_containers_link_remaps_are_copied_and_written_into_the_target() {
        let workload = tempfile::tempdir().expect("tempdir");
        let checkpoint = tempfile::tempdir().expect("tempdir");
        let link = criu_link_in(workload.path());
        std::fs::set_permissions(&link, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .expect("chmod");
        let me = std::process::id();
        let remaps =
            take_over(me, std::slice::from_ref(&link), Some(checkpoint.path())).expect("take over");
        assert!(
            remaps[0].is_copy() && remaps[0].is_well_formed(),
            "{remaps:?}"
        );
        assert!(!Path::new(&link).exists(), "CRIU's name is free");
        let kept = checkpoint.path().join(&remaps[0].kept_as);
        assert_eq!(std::fs::read(&kept).expect("copied"), b"semaphore");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").mode() & 0o777;
        assert_eq!(mode(&kept), 0o640);
        for consumed in [true, false] {
            check_present(&remaps, checkpoint.path(), Some(me)).expect("present");
            {
                let _written =
                    link_for_restore(&remaps, checkpoint.path(), Some(me)).expect("written");
                assert_eq!(std::fs::read(&link).expect("written"), b"semaphore");
                assert_eq!(mode(Path::new(&link)), 0o640);
                let err = check_present(&remaps, checkpoint.path(), Some(me)).expect_err("taken");
                assert!(err.to_string().contains("needs it free"), "{err}");
                if consumed {
                    std::fs::remove_file(&link).expect("what CRIU does");
                }
            }
            assert!(!Path::new(&link).exists(), "removed after the restore");
        }
        discard(&remaps).expect("discard");
        assert!(kept.exists(), "the directory's own file, removed with it");
        std::fs::remove_file(&kept).expect("rm");
        let err = check_present(&remaps, checkpoint.path(), Some(me)).expect_err("missing");
        assert!(err.to_string().contains("the images need it"), "{err}");
    }
}
