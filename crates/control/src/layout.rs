//! Where the tool finds its own parts, relative to its executable, so that no variable is needed:
//!
//! - the release layout (`scripts/build-dist.sh`, the `.deb`, the GPU lane's `dist/`):
//!   `bin/cuinterpose`, `lib/libcuinterpose.so`, `lib/cuinterpose/test-driver/libcuda.so.1` (the
//!   fake driver, for the demo and tests) and CRIU under `libexec/cuinterpose/criu/bin/criu`;
//! - a cargo target directory in a checkout (`target/<profile>/`, `target/<triple>/<profile>/`, or
//!   `deps/` below either for test binaries): every artifact next to the executable, and CRIU in
//!   the checkout's `.criu/` (`scripts/install-criu.sh`).
//!
//! Each lookup returns candidates in order; callers take the first that exists, after an explicit
//! path or variable and before `PATH`.

use crate::discovery::SHIM_LIBRARY;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The fake driver's directory in the release layout, below `lib/`: a directory of its own, so that
/// putting it on `LD_LIBRARY_PATH` brings in nothing else.
pub const TEST_DRIVER_DIR: &str = "cuinterpose/test-driver";

/// CRIU's wrapper in the release layout, below the prefix (`libexec/`).
pub const CRIU_IN_LIBEXEC: &str = "cuinterpose/criu/bin/criu";

/// The directories around one executable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The directory of the executable (`deps/` stripped).
    dir: PathBuf,
}

impl Layout {
    /// The layout around the running executable (symlinks resolved, so `/usr/bin/cuinterpose`
    /// linking into `/opt/cuinterpose/bin` finds `/opt/cuinterpose/lib`).
    pub fn current() -> Option<Layout> {
        let exe = std::env::current_exe().ok()?;
        let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
        exe.parent().map(Layout::at)
    }

    /// The layout around an executable in `dir`.
    pub fn at(dir: &Path) -> Layout {
        let mut dir = dir.to_path_buf();
        if dir.file_name() == Some(OsStr::new("deps")) {
            dir.pop();
        }
        Layout { dir }
    }

    /// The executable's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The release layout's root (the parent of `bin/`), when the executable is in a `bin/`.
    fn prefix(&self) -> Option<&Path> {
        (self.dir.file_name() == Some(OsStr::new("bin")))
            .then(|| self.dir.parent())
            .flatten()
    }

    /// The checkout holding a cargo target directory this executable is in: `<repo>/target/<profile>`
    /// or `<repo>/target/<triple>/<profile>`.
    fn checkout(&self) -> Option<&Path> {
        self.dir
            .ancestors()
            .skip(1)
            .take(2)
            .find(|a| a.file_name() == Some(OsStr::new("target")))
            .and_then(Path::parent)
    }

    /// Where a library of the release may be: next to the executable (cargo), then `../lib`.
    pub fn library_candidates(&self, name: &str) -> Vec<PathBuf> {
        let mut list = vec![self.dir.join(name)];
        if let Some(prefix) = self.prefix() {
            list.push(prefix.join("lib").join(name));
        }
        list
    }

    /// Where the shim may be.
    pub fn shim_candidates(&self) -> Vec<PathBuf> {
        self.library_candidates(SHIM_LIBRARY)
    }

    /// Where the fake driver may be: `libcuda.so` of the cargo build (its `libcuda.so.1` link is
    /// made next to it on demand), or the release's test-driver directory.
    pub fn fake_driver_candidates(&self) -> Vec<PathBuf> {
        let mut list = vec![self.dir.join("libcuda.so")];
        if let Some(prefix) = self.prefix() {
            list.push(
                prefix
                    .join("lib")
                    .join(TEST_DRIVER_DIR)
                    .join("libcuda.so.1"),
            );
        }
        list
    }

    /// The directory to put first on `LD_LIBRARY_PATH` to load the fake driver as `libcuda.so.1`:
    /// the release's test-driver directory, or in a cargo build `fake-driver/` next to the
    /// executable, holding a `libcuda.so.1 -> ../libcuda.so` link made here on demand (cargo names
    /// the library `libcuda.so`; the loader looks for `libcuda.so.1`). `None` when no fake driver
    /// is there.
    pub fn fake_driver_dir(&self) -> std::io::Result<Option<PathBuf>> {
        let Some(found) = self
            .fake_driver_candidates()
            .into_iter()
            .find(|c| c.exists())
        else {
            return Ok(None);
        };
        if found.file_name() == Some(OsStr::new("libcuda.so.1"))
            && let Some(dir) = found.parent()
        {
            return Ok(Some(dir.to_path_buf()));
        }
        let dir = self.dir.join("fake-driver");
        std::fs::create_dir_all(&dir)?;
        let link = dir.join("libcuda.so.1");
        if std::fs::symlink_metadata(&link).is_err() {
            // Several processes may race here; whoever loses finds the link in place.
            match std::os::unix::fs::symlink("../libcuda.so", &link) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Some(dir))
    }

    /// Where the bundled CRIU may be: the release's `libexec/`, or the checkout's `.criu/`.
    pub fn criu_candidates(&self) -> Vec<PathBuf> {
        let mut list = Vec::new();
        if let Some(prefix) = self.prefix() {
            list.push(prefix.join("libexec").join(CRIU_IN_LIBEXEC));
        }
        if let Some(checkout) = self.checkout() {
            list.push(checkout.join(".criu/bin/criu"));
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_layout() {
        let layout = Layout::at(Path::new("/opt/cuinterpose/bin"));
        assert_eq!(
            layout.shim_candidates(),
            [
                PathBuf::from("/opt/cuinterpose/bin/libcuinterpose.so"),
                PathBuf::from("/opt/cuinterpose/lib/libcuinterpose.so")
            ]
        );
        assert_eq!(
            layout.criu_candidates(),
            [PathBuf::from(
                "/opt/cuinterpose/libexec/cuinterpose/criu/bin/criu"
            )]
        );
        assert_eq!(
            layout.fake_driver_candidates()[1],
            PathBuf::from("/opt/cuinterpose/lib/cuinterpose/test-driver/libcuda.so.1")
        );
    }

    #[test]
    fn cargo_target_layouts() {
        for dir in [
            "/src/repo/target/release",
            "/src/repo/target/debug/deps",
            "/src/repo/target/x86_64-unknown-linux-gnu/release",
        ] {
            let layout = Layout::at(Path::new(dir));
            assert_eq!(
                layout.criu_candidates(),
                [PathBuf::from("/src/repo/.criu/bin/criu")],
                "{dir}"
            );
            assert_eq!(
                layout.shim_candidates(),
                [layout.dir().join("libcuinterpose.so")],
                "{dir}"
            );
        }
        assert_eq!(
            Layout::at(Path::new("/src/repo/target/debug/deps")).dir(),
            Path::new("/src/repo/target/debug")
        );
    }

    #[test]
    fn elsewhere_only_next_to_the_executable() {
        let layout = Layout::at(Path::new("/home/me/tools"));
        assert!(layout.criu_candidates().is_empty());
        assert_eq!(layout.fake_driver_candidates().len(), 1);
    }
}
