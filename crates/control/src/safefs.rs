//! Opening what a checkpoint directory holds without trusting it: anyone who can write the
//! directory (shared storage, a user's directory an administrator restores or discards) chooses
//! what each name is. A FIFO would block an open or a read forever (while the tool holds the
//! directory's lock), a device would be read or written as if it were the file, a symbolic link
//! would send the tool to any file of the machine. So every file of a checkpoint is opened with
//! `O_NOFOLLOW | O_NONBLOCK` (the open itself can neither follow a link nor wait for a FIFO's
//! writer) and its type checked on the open descriptor (`fstat`), never on the name.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a name of a checkpoint is when it is not what the tool wrote there.
pub fn describe(kind: std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

fn not_regular(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("is {what}, not a regular file"),
    )
}

/// Opens the regular file `path` for reading; a symbolic link, FIFO, device, socket or directory
/// there is an error (and nothing waits). `flags`: more open flags (`O_DIRECT`).
pub fn open_regular_with(path: &Path, flags: i32) -> std::io::Result<File> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | flags)
        .open(path)
    {
        Ok(file) => file,
        // O_NOFOLLOW on a link: ELOOP, which says nothing a user understands.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not_regular("a symbolic link"));
        }
        Err(e) => return Err(e),
    };
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(describe(kind)));
    }
    // Reads of a regular file never block anyway; cleared so the descriptor is an ordinary one
    // for whoever it is passed to (a shim reading a data file).
    let status = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, status - rustix::fs::OFlags::NONBLOCK)?;
    Ok(file)
}

/// [`open_regular_with`] without more flags.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    open_regular_with(path, 0)
}

/// The bytes of the regular file `path` ([`open_regular`]), at most `limit` of them: a larger
/// file is an error.
pub fn read_regular(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let size = file.metadata()?.len();
    let too_large = |size: u64| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("is {size} bytes or more, more than the {limit} allowed"),
        )
    };
    if size > limit {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, limit + 1), &mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Checks that `path` is a directory itself, not a symbolic link to one (or anything else).
/// `Ok(false)` when nothing is there.
pub fn real_dir(path: &Path) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_dir() => Ok(true),
        Ok(meta) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {}, not a directory", describe(meta.file_type())),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open_and_nothing_waits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("file");
        std::fs::write(&file, b"bytes").expect("write");
        let mut opened = open_regular(&file).expect("a regular file opens");
        let mut read = String::new();
        std::io::Read::read_to_string(&mut opened, &mut read).expect("read");
        assert_eq!(read, "bytes");

        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .expect("mkfifo");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        for (path, what) in [
            (&fifo, "a FIFO"),
            (&link, "a symbolic link"),
            (&dir.path().to_path_buf(), "a directory"),
            (&Path::new("/dev/null").to_path_buf(), "a device"),
        ] {
            let err = open_regular(path).expect_err("refused");
            assert!(err.to_string().contains(what), "{}: {err}", path.display());
        }
        assert!(real_dir(dir.path()).expect("dir"));
        assert!(!real_dir(&dir.path().join("none")).expect("nothing"));
        let dir_link = dir.path().join("dirlink");
        std::os::unix::fs::symlink(dir.path(), &dir_link).expect("symlink");
        assert!(real_dir(&dir_link).is_err());
    }
}
