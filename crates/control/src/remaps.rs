//! CRIU's link remaps around a checkpoint and a restore (what they are: criu::images).
//!
//! A link remap is a hard link CRIU made at dump time next to a file the tree held open under a
//! deleted name. The images need it at restore, and `criu restore` removes it, after a restore
//! that worked and after one that failed alike. So that a checkpoint stays restorable (again, and
//! after a failed attempt), a restore first gives every link remap a second name
//! (`<link>.cuinterpose-keep`) and puts it back afterwards, whatever CRIU did.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::ControlError;

/// Suffix of the second name a restore gives a link remap while CRIU runs.
const KEEP_SUFFIX: &str = ".cuinterpose-keep";

fn error(path: &Path, message: impl Into<String>) -> ControlError {
    ControlError::LinkRemap {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn keep_path(link: &Path) -> PathBuf {
    let mut name = link.as_os_str().to_owned();
    name.push(KEEP_SUFFIX);
    PathBuf::from(name)
}

/// Checks, right after the dump (the tree stopped, not yet gone), that every link remap the tree
/// sees at `path` is the same file the tool sees at `path`: a restore, run from the tool's mount
/// namespace, finds it there.
pub fn check_reachable(root: u32, links: &[String]) -> Result<(), ControlError> {
    for link in links {
        let here = Path::new(link);
        let there = PathBuf::from(format!("/proc/{root}/root{link}"));
        let ours = std::fs::symlink_metadata(here).map_err(|e| {
            error(
                here,
                format!("not reachable from the tool's namespace: {e}"),
            )
        })?;
        let theirs = std::fs::symlink_metadata(&there)
            .map_err(|e| error(here, format!("not found in the workload's namespace: {e}")))?;
        if (ours.dev(), ours.ino()) != (theirs.dev(), theirs.ino()) {
            return Err(error(
                here,
                "the tool's mount namespace sees another file at this path than the workload's; \
                 the checkpoint could not be restored from here",
            ));
        }
    }
    Ok(())
}

/// Removes the link remaps of a checkpoint that failed (best effort: they would only leak).
pub fn remove(links: &[String]) {
    for link in links {
        if let Err(e) = std::fs::remove_file(link)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(link, error = %e, "removing a link remap of a failed checkpoint");
        }
    }
}

/// Checks before a restore that every link remap is there, a regular file. One that a restore
/// interrupted before it put it back (only its second name is left) is put back first.
pub fn check_present(links: &[String]) -> Result<(), ControlError> {
    for link in links {
        let path = Path::new(link);
        let keep = keep_path(path);
        if std::fs::symlink_metadata(path).is_err() && keep.exists() {
            std::fs::rename(&keep, path)
                .map_err(|e| error(path, format!("putting back {}: {e}", keep.display())))?;
            tracing::info!(
                link,
                "put back a link remap an interrupted restore had set aside"
            );
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_file() => {}
            Ok(_) => return Err(error(path, "is not a regular file")),
            Err(e) => {
                return Err(error(
                    path,
                    format!(
                        "{e}; CRIU made this hard link at dump time for a file the workload held \
                         open after its name was deleted, and the images need it"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The link remaps of a restore in progress, each with its second name; dropping it puts every
/// one back under its own name.
#[derive(Debug)]
pub struct Kept {
    links: Vec<PathBuf>,
}

/// Gives every link remap its second name (an earlier one left behind is replaced).
pub fn keep(links: &[String]) -> Result<Kept, ControlError> {
    let mut kept = Kept { links: Vec::new() };
    for link in links {
        let path = PathBuf::from(link);
        let keep = keep_path(&path);
        match std::fs::remove_file(&keep) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(error(&keep, e.to_string())),
        }
        std::fs::hard_link(&path, &keep)
            .map_err(|e| error(&path, format!("linking {}: {e}", keep.display())))?;
        kept.links.push(path);
    }
    Ok(kept)
}

impl Drop for Kept {
    fn drop(&mut self) {
        for link in &self.links {
            // rename(2) replaces a link CRIU left in place with the same file.
            if let Err(e) = std::fs::rename(keep_path(link), link) {
                tracing::error!(link = %link.display(), error = %e, "putting back a link remap");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link_in(dir: &Path) -> String {
        let original = dir.join("sem.x");
        std::fs::write(&original, b"semaphore").expect("write");
        let link = dir.join("link_remap.7");
        std::fs::hard_link(&original, &link).expect("link");
        link.to_string_lossy().into_owned()
    }

    #[test]
    fn a_restore_that_consumes_the_link_leaves_it_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = link_in(dir.path());
        check_present(std::slice::from_ref(&link)).expect("present");
        {
            let _kept = keep(std::slice::from_ref(&link)).expect("keep");
            // What CRIU does with it.
            std::fs::remove_file(&link).expect("consume");
        }
        assert_eq!(std::fs::read(&link).expect("back"), b"semaphore");
        assert!(!keep_path(Path::new(&link)).exists());
        // And when CRIU left it alone.
        drop(keep(std::slice::from_ref(&link)).expect("keep"));
        assert_eq!(std::fs::read(&link).expect("back"), b"semaphore");
    }

    #[test]
    fn a_missing_link_is_refused_and_an_interrupted_restore_is_repaired() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = link_in(dir.path());
        std::fs::rename(&link, keep_path(Path::new(&link))).expect("set aside");
        check_present(std::slice::from_ref(&link)).expect("repaired");
        assert!(Path::new(&link).is_file());
        std::fs::remove_file(&link).expect("remove");
        let err = check_present(std::slice::from_ref(&link)).expect_err("missing");
        assert!(err.to_string().contains("the images need it"), "{err}");
    }

    #[test]
    fn the_workload_and_the_tool_must_see_the_same_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = link_in(dir.path());
        let me = std::process::id();
        check_reachable(me, std::slice::from_ref(&link)).expect("same namespace");
        let missing = dir
            .path()
            .join("link_remap.8")
            .to_string_lossy()
            .into_owned();
        assert!(check_reachable(me, &[missing]).is_err());
    }
}
