//! The file operations of the project's on-disk formats (`cuinterpose.state`, `manifest.json`):
//! publishing a file so that a crash leaves either the old or the new content, and reading a file
//! with a size bound before the decoder sees it.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::TransportError;

/// Writes `bytes` to `path` so that `path` holds either its previous content or all of `bytes`,
/// whatever happens: the bytes go to a new temporary file in the same directory (mode 0600,
/// created exclusively), which is fsynced, renamed over `path`, and then the directory is fsynced
/// so that the rename itself is durable.
///
/// On an error before the rename the temporary file is removed and `path` is unchanged. An error
/// from the final directory fsync is returned although `path` already shows the new content: its
/// existence alone does not prove that it will survive a power loss. A process killed mid-write
/// leaves a `.<name>.tmp-*` file beside `path`, never a partial `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TransportError> {
    let name = path.file_name().ok_or_else(|| {
        TransportError::io(
            format!("write {}", path.display()),
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"),
        )
    })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut random = [0u8; 8];
    fill_random(&mut random);
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(
        ".tmp-{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(random)
    ));
    let temp = dir.join(temp_name);

    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| TransportError::io(format!("create {}", temp.display()), e))?;
        file.write_all(bytes)
            .map_err(|e| TransportError::io(format!("write {}", temp.display()), e))?;
        file.sync_all()
            .map_err(|e| TransportError::io(format!("fsync {}", temp.display()), e))?;
        fs::rename(&temp, path).map_err(|e| {
            TransportError::io(
                format!("rename {} to {}", temp.display(), path.display()),
                e,
            )
        })
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| TransportError::io(format!("fsync directory {}", dir.display()), e))
}

/// Reads the regular file at `path`, refusing one larger than `limit` bytes before reading it (and
/// again if it grows while being read). A FIFO, device or directory is refused without blocking.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, TransportError> {
    let context = |what: &str| format!("{what} {}", path.display());
    // O_NONBLOCK so that opening a FIFO does not wait for a writer; it changes nothing for a
    // regular file.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| TransportError::io(context("open"), e))?;
    let meta = file
        .metadata()
        .map_err(|e| TransportError::io(context("stat"), e))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a fifo"
        } else {
            "not a regular file"
        };
        return Err(TransportError::io(
            context("read"),
            std::io::Error::new(std::io::ErrorKind::InvalidInput, what),
        ));
    }
    let too_large = |size| TransportError::FileTooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    };
    if meta.len() > limit {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| TransportError::io(context("read"), e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Random bits for a temporary name. `O_EXCL` makes a collision an error, not a corruption, so a
/// failing entropy source only makes names predictable.
fn fill_random(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                for (b, n) in buf.iter_mut().zip(nanos.to_le_bytes()) {
                    *b ^= n;
                }
                return;
            }
        }
    }
}

/// The directory for the project's sockets and locks unless a setting names another: private to
/// the user, never world-writable, so no other user can take a name in it first.
/// `$XDG_RUNTIME_DIR/cuinterpose` when the session has one (systemd makes it 0700 for the user),
/// otherwise `/run/cuinterpose-<uid>`, or `$TMPDIR/cuinterpose-<uid>` where `/run` cannot be
/// written. It is not created here: [`ensure_private_dir`] does that.
pub fn default_private_dir() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let runtime = PathBuf::from(runtime);
        // Only a runtime directory of our own: under sudo the variable may name the caller's.
        if fs::symlink_metadata(&runtime)
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == uid && m.is_dir())
        {
            return runtime.join("cuinterpose");
        }
    }
    let run = Path::new("/run");
    if rustix::fs::access(run, rustix::fs::Access::WRITE_OK).is_ok() {
        return run.join(format!("cuinterpose-{uid}"));
    }
    std::env::temp_dir().join(format!("cuinterpose-{uid}"))
}

/// Creates `dir` (mode 0700) if it does not exist, and checks that it is a real directory (not a
/// symlink) owned by us that no other user can write. A directory someone else made first, or one
/// that others can write, is refused: names in it could be taken by them.
pub fn ensure_private_dir(dir: &Path) -> Result<(), TransportError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(TransportError::io(format!("create {}", dir.display()), e)),
    }
    let meta = fs::symlink_metadata(dir)
        .map_err(|e| TransportError::io(format!("stat {}", dir.display()), e))?;
    let uid = rustix::process::geteuid().as_raw();
    let problem = if !meta.file_type().is_dir() {
        Some("is not a directory".to_string())
    } else if meta.uid() != uid {
        Some(format!("belongs to uid {}, not to uid {uid}", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "can be written by other users (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(TransportError::io(
            format!("use {} as a private directory", dir.display()),
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, problem),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains(".tmp-"))
            .collect()
    }

    #[test]
    fn writes_then_replaces_leaving_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cuinterpose.state");
        write_atomically(&path, b"old").unwrap();
        assert_eq!(read_bounded(&path, 1 << 20).unwrap(), b"old");
        write_atomically(&path, b"new content").unwrap();
        assert_eq!(read_bounded(&path, 1 << 20).unwrap(), b"new content");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("target");
        write_atomically(&path, b"old").unwrap();
        // Renaming a file over a non-empty directory fails after the temporary file was written.
        let blocked = dir.path().join("blocked");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("inside"), b"x").unwrap();
        let e = write_atomically(&blocked, b"new").unwrap_err();
        assert!(matches!(e, TransportError::Io { .. }), "{e}");
        assert!(leftovers(dir.path()).is_empty());
        assert_eq!(fs::read(&path).unwrap(), b"old");
        let missing = dir.path().join("no-such-dir").join("file");
        assert!(matches!(
            write_atomically(&missing, b"x"),
            Err(TransportError::Io { .. })
        ));
        assert!(matches!(
            write_atomically(Path::new("/"), b"x"),
            Err(TransportError::Io { .. })
        ));
    }

    #[test]
    fn a_relative_path_without_a_directory_is_written_in_the_current_one() {
        // The test process's current directory is the crate root; use a unique name there and
        // remove it again.
        let name = format!("files-test-{}.tmpout", std::process::id());
        write_atomically(Path::new(&name), b"here").unwrap();
        assert_eq!(fs::read(&name).unwrap(), b"here");
        fs::remove_file(&name).unwrap();
    }

    #[test]
    fn read_bounded_refuses_large_and_non_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, vec![7u8; 100]).unwrap();
        assert_eq!(read_bounded(&path, 100).unwrap().len(), 100);
        assert!(matches!(
            read_bounded(&path, 99),
            Err(TransportError::FileTooLarge {
                size: 100,
                limit: 99,
                ..
            })
        ));
        assert!(matches!(
            read_bounded(dir.path(), 1 << 20),
            Err(TransportError::Io { .. })
        ));
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        // Returns at once (nobody writes to the fifo) with a refusal.
        assert!(matches!(
            read_bounded(&fifo, 1 << 20),
            Err(TransportError::Io { .. })
        ));
        assert!(matches!(
            read_bounded(&dir.path().join("missing"), 1),
            Err(TransportError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound
        ));
    }

    #[test]
    fn a_private_dir_is_made_0700_and_one_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let private = base.path().join("p");
        super::ensure_private_dir(&private).unwrap();
        let mode = fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Again: an existing private directory is fine.
        super::ensure_private_dir(&private).unwrap();
        let open = base.path().join("o");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = super::ensure_private_dir(&open).unwrap_err().to_string();
        assert!(err.contains("can be written by other users"), "{err}");
        let file = base.path().join("f");
        fs::write(&file, b"x").unwrap();
        let err = super::ensure_private_dir(&file).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
    }
}
