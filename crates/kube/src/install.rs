//! What the init container does: copy the launcher and the shim from the product's image into the
//! shared `emptyDir`, so that target containers run them without any change to their own image.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The files copied, with the mode they get (the targets run as any user: world-readable, the
/// launcher world-executable; nobody may write them).
pub const FILES: [(&str, u32); 2] = [("cuinterpose", 0o555), ("libcuinterpose.so", 0o444)];

/// A copy that failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub struct InstallError {
    action: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.to_path_buf();
    move |source| InstallError {
        action,
        path,
        source,
    }
}

/// Copies [`FILES`] from `from` into `to`, each through a temporary name and a rename, so that a
/// container never sees a partial file.
pub fn install(from: &Path, to: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let mut installed = Vec::new();
    for (name, mode) in FILES {
        let source = from.join(name);
        let bytes = std::fs::read(&source).map_err(io("reading", &source))?;
        let target = to.join(name);
        let partial = to.join(format!(".{name}.partial"));
        let mut file = std::fs::File::create(&partial).map_err(io("creating", &partial))?;
        file.write_all(&bytes).map_err(io("writing", &partial))?;
        file.sync_all().map_err(io("syncing", &partial))?;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(mode))
            .map_err(io("setting the mode of", &partial))?;
        std::fs::rename(&partial, &target).map_err(io("renaming into", &target))?;
        installed.push(target);
    }
    Ok(installed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_both_files_read_only() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        std::fs::write(from.path().join("cuinterpose"), b"launcher").unwrap();
        std::fs::write(from.path().join("libcuinterpose.so"), b"shim").unwrap();
        let installed = install(from.path(), to.path()).unwrap();
        assert_eq!(installed.len(), 2);
        assert_eq!(
            std::fs::read(to.path().join("cuinterpose")).unwrap(),
            b"launcher"
        );
        assert_eq!(
            std::fs::read(to.path().join("libcuinterpose.so")).unwrap(),
            b"shim"
        );
        let mode = |n: &str| {
            std::fs::metadata(to.path().join(n))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("cuinterpose"), 0o555);
        assert_eq!(mode("libcuinterpose.so"), 0o444);
        assert_eq!(
            std::fs::read_dir(to.path()).unwrap().count(),
            2,
            "no partial file left"
        );
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        std::fs::write(from.path().join("cuinterpose"), b"launcher").unwrap();
        let error = install(from.path(), to.path()).unwrap_err().to_string();
        assert!(error.contains("libcuinterpose.so"), "{error}");
    }
}
