//! CRIU, run as a program (`criu dump` / `criu restore`), found on `--criu PATH`, `$CUINTERPOSE_CRIU`,
//! the CRIU bundled with the tool (crate::layout: the release's `libexec/`, a checkout's `.criu/`),
//! or `PATH`. The command line is used rather than CRIU's RPC: the RPC needs protobuf bindings and
//! gives nothing this tool uses, while the log files CRIU writes are what a user reads on failure.
//!
//! For a tree in a container CRIU runs inside the container's namespaces (crate::container), where
//! no path of the tool's filesystem exists: every path CRIU is given (the images, the work
//! directory, the pid file, and the bundled CRIU itself: its loader, libraries and binary) is then
//! a descriptor opened here and inherited, named `/proc/self/fd/N`.

pub mod images;

use crate::container::Container;
use protocol::manifest::CriuPlacement;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why CRIU could not be used or did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error(
        "criu not found (looked at {looked}); pass --criu PATH or set CUINTERPOSE_CRIU (in a checkout, scripts/install-criu.sh installs CRIU 4.2 into .criu/)"
    )]
    NotFound { looked: String },
    #[error(
        "{program} is not the bundled CRIU (its own loader and libraries beside it, as \
         scripts/install-criu.sh installs it): inside a container only that one can be run, by \
         descriptor"
    )]
    NotBundled { program: PathBuf },
    #[error("opening {path} for CRIU: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("running {program}: {source}")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("criu {action} failed ({status}); its log {log}:\n{tail}")]
    Failed {
        action: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("criu {0} wrote no usable pid file")]
    NoPid(&'static str),
    #[error("CRIU image {path}: {message}")]
    Image { path: PathBuf, message: String },
    #[error("CRIU image {path}: {source}")]
    ImageRead {
        path: PathBuf,
        source: transport::TransportError,
    },
    #[error("CRIU image {path}: entry {entry}: {source}")]
    ImageEntry {
        path: PathBuf,
        entry: usize,
        source: prost::DecodeError,
    },
}

/// The workload's mounts are slaves of the host's (control::launch): CRIU treats them as external,
/// found again by their masters at restore, instead of dumping their contents.
const EXTERNAL_MOUNTS: [&str; 4] = [
    "--ext-mount-map",
    "auto",
    "--enable-external-sharing",
    "--enable-external-masters",
];

/// How CRIU finds the tree's external mounts, at a dump or a restore. A tree below its launcher
/// (`run --pid-namespace`) has mounts that are slaves of CRIU's own: found by propagation, and
/// restored with CRIU's compatible mount engine as ever. A container's own init has the
/// container's mounts, related to nothing CRIU has: each node mount is named by its mount point
/// at the dump (`mnt[POINT]:KEY`) and bound from the same path at the restore (`mnt[KEY]:POINT`,
/// the placeholder's, CRIU running in a copy of its mount namespace), with CRIU's newer mount
/// engine, which rebuilds exactly the dumped table (crate::container).
fn mount_args(placement: &CriuPlacement, restore: bool) -> Vec<OsString> {
    let CriuPlacement::ContainerInit { node_mounts } = placement else {
        let compat = restore.then_some("--mntns-compat-mode");
        return EXTERNAL_MOUNTS
            .iter()
            .chain(&compat)
            .map(OsString::from)
            .collect();
    };
    node_mounts
        .iter()
        .enumerate()
        .flat_map(|(i, point)| {
            let key = format!("cuinterpose-node-{i}");
            let spec = if restore {
                format!("mnt[{key}]:{point}")
            } else {
                format!("mnt[{point}]:{key}")
            };
            [OsString::from("--external"), OsString::from(spec)]
        })
        .collect()
}

/// The file CRIU writes the restored root's pid to (`--pidfile`), in the work directory.
pub(crate) const CRIU_PID_FILE: &str = "restore.pid";
/// The file CRIU run inside a container writes the restored root's pid to, as the container sees
/// it; the restore writes the host pid to [`CRIU_PID_FILE`] once it has found it.
pub(crate) const CRIU_INSIDE_PID_FILE: &str = "restore.pid.inside";

/// A CRIU binary that answered `--version`.
#[derive(Debug, Clone)]
pub struct Criu {
    program: PathBuf,
    version: String,
    /// The parts of the bundled CRIU, when `program` is its wrapper.
    bundle: Option<Bundle>,
}

/// The bundled CRIU (scripts/install-criu.sh): its wrapper `PREFIX/bin/criu` runs
/// `PREFIX/usr/sbin/criu` through the prefix's own loader and libraries. Inside a container the
/// wrapper cannot run (it names the prefix by path), so the three are opened and run by
/// descriptor instead, the loader given the others as `/proc/self/fd/N`.
#[derive(Debug, Clone)]
struct Bundle {
    loader: PathBuf,
    libraries: PathBuf,
    binary: PathBuf,
}

impl Bundle {
    fn of(program: &Path) -> Option<Bundle> {
        let prefix = std::fs::canonicalize(program)
            .ok()?
            .parent()?
            .parent()?
            .to_path_buf();
        let libraries = prefix.join("usr/lib/x86_64-linux-gnu");
        let bundle = Bundle {
            loader: libraries.join("ld-linux-x86-64.so.2"),
            binary: prefix.join("usr/sbin/criu"),
            libraries,
        };
        (bundle.loader.is_file() && bundle.binary.is_file() && bundle.libraries.is_dir())
            .then_some(bundle)
    }
}

/// A CRIU command line being built, and the descriptors it inherits.
struct Invocation<'a> {
    command: Command,
    inherit: Vec<OwnedFd>,
    inside: Option<&'a Container>,
}

impl Invocation<'_> {
    /// How CRIU is to name `path`: the path itself in the tool's namespaces; inside a container,
    /// an inherited descriptor of it (a directory, or a file opened for reading).
    fn path(&mut self, path: &Path) -> Result<OsString, CriuError> {
        if self.inside.is_none() {
            return Ok(path.into());
        }
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| CriuError::Open {
            path: path.to_path_buf(),
            source: e.into(),
        })?;
        let name = format!("/proc/self/fd/{}", fd.as_raw_fd());
        self.inherit.push(fd);
        Ok(name.into())
    }
}

impl Criu {
    /// Finds CRIU and asks its version; fails closed before anything is changed. `explicit`
    /// (`--criu`) is the only candidate when given; otherwise `configured` (`CUINTERPOSE_CRIU`,
    /// [`crate::config::ToolConfig::criu`]) when it is a file, then `criu` on `PATH`.
    pub fn locate(explicit: Option<&Path>, configured: Option<&Path>) -> Result<Criu, CriuError> {
        let candidates: Vec<PathBuf> = match explicit {
            Some(path) => vec![path.to_path_buf()],
            None => configured
                .map(Path::to_path_buf)
                .into_iter()
                .chain(
                    crate::layout::Layout::current()
                        .map(|l| l.criu_candidates())
                        .unwrap_or_default(),
                )
                .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
                    std::env::split_paths(&p)
                        .map(|d| d.join("criu"))
                        .collect::<Vec<_>>()
                }))
                .collect(),
        };
        for program in candidates.iter().filter(|c| c.is_file()).cloned() {
            let output = Command::new(&program)
                .arg("--version")
                .output()
                .map_err(|source| CriuError::Spawn {
                    program: program.clone(),
                    source,
                })?;
            let text = String::from_utf8_lossy(&output.stdout);
            if let Some(version) = text.lines().find_map(|l| l.strip_prefix("Version:")) {
                return Ok(Criu {
                    bundle: Bundle::of(&program),
                    program,
                    version: version.trim().to_string(),
                });
            }
        }
        Err(CriuError::NotFound {
            looked: candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Whether CRIU can run inside a container (crate::container): only the bundled one, by
    /// descriptor. Checked before anything changes.
    pub fn check_runs_inside(&self) -> Result<(), CriuError> {
        match self.bundle {
            Some(_) => Ok(()),
            None => Err(CriuError::NotBundled {
                program: self.program.clone(),
            }),
        }
    }

    /// Dumps the tree rooted at `pid` (the init of its PID namespace, as CRIU sees it: inside
    /// `inside` when given) into `images` and leaves it stopped (SIGSTOP): the caller continues
    /// it (SIGCONT) or kills it once the checkpoint is complete or has failed.
    ///
    /// `--leave-stopped`, not `--leave-running`: with the latter CRIU removes the link remaps it
    /// made as soon as the dump ends (it assumes the files stay reachable through the running
    /// tree), so the images could not be restored once the tree is gone (images::link_remaps).
    ///
    /// No `--shell-job`: the tool refuses a tree with a controlling terminal before it gets here (a
    /// restore could not give the terminal back).
    ///
    /// `tcp`: the tree has established TCP connections, each with its other end in the tree
    /// (control::tcp), to be saved in repair mode. `namespaces`: the options that keep the
    /// namespaces the tree shares with processes outside it out of the images
    /// (crate::namespaces::Shared::dump_args). `inside`: the container whose namespaces CRIU runs
    /// in (crate::container), and `placement` how, as the manifest records it.
    pub fn dump(
        &self,
        pid: u32,
        images: &Path,
        tcp: bool,
        namespaces: &[OsString],
        (inside, placement): (Option<&Container>, &CriuPlacement),
    ) -> Result<(), CriuError> {
        let mut run = self.invocation("dump", images, inside)?;
        // --link-remap: files deleted while open that still have another name (every POSIX
        // semaphore of Python's multiprocessing, seen with PyTorch) are kept through a hard link.
        run.command
            .arg("-t")
            .arg(pid.to_string())
            .args(mount_args(placement, false))
            .arg("--link-remap")
            .arg("--leave-stopped")
            .args(namespaces);
        if tcp {
            // The network lock keeps a peer outside the tree from changing a connection's state
            // while it is dumped. Every peer is inside the tree here, stopped like the rest of
            // it, so there is nothing to lock out; and the lock would need iptables or nftables
            // on the host, which GPU servers and containers often lack.
            run.command
                .args(["--tcp-established", "--network-lock", "skip"]);
        }
        self.execute("dump", run, images)
    }

    /// Restores the tree in `images` detached from this process (`--restore-detached`: the restored
    /// root is not our child, so it outlives the tool); returns the restored root's PID as CRIU
    /// saw it (inside `inside` when given: crate::container::Container::host_pid finds it here).
    ///
    /// Everything CRIU writes on a restore (its log, statistics and the pid file) goes to
    /// `work_dir`, never into the checkpoint: a checkpoint directory is read-only to a restore, so
    /// the same images can be restored again and a failed restore leaves them as they were.
    ///
    /// `tcp`: the images hold established TCP connections (the dump's `tcp`). `namespaces`: the
    /// options that put the tree into another process's namespaces
    /// (crate::namespaces::Target::restore_args), and `inherit` the descriptors they name.
    /// `inside`: the container whose namespaces CRIU runs in, over whose root the tree is
    /// restored, and `placement` how, as the dump ran (the manifest's).
    pub fn restore(
        &self,
        images: &Path,
        work_dir: &Path,
        tcp: bool,
        (namespaces, inherit): (&[OsString], Vec<OwnedFd>),
        (inside, placement): (Option<&Container>, &CriuPlacement),
    ) -> Result<u32, CriuError> {
        // In a container's PID namespace the PID CRIU writes is the container's, which no reader
        // of the work directory may take for a host PID (disk/leftovers.rs kills the tree
        // it names): it gets a name of its own, and the caller writes the host PID under the
        // usual one.
        let name = match inside {
            Some(c) if c.enters_pid_namespace() => CRIU_INSIDE_PID_FILE,
            _ => CRIU_PID_FILE,
        };
        let pid_file = work_dir.join(name);
        let mut run = self.invocation("restore", images, inside)?;
        run.inherit.extend(inherit);
        let work = run.path(work_dir)?;
        let mut named_pid_file = work.clone();
        named_pid_file.push("/");
        named_pid_file.push(name);
        run.command
            .arg("--work-dir")
            .arg(work)
            .arg("--restore-detached")
            // Stopped until every process is restored natively (crate::restore_thread).
            .arg("--leave-stopped")
            .arg("--pidfile")
            .arg(named_pid_file)
            // Restored over the root of CRIU's mount namespace.
            .args(["--root", "/"])
            .args(mount_args(placement, true))
            .args(namespaces);
        if placement.in_container() {
            // The tree goes into the cgroups of the container restored into (CRIU is started in
            // them, crate::container::Container::run_joining_cgroups; the agent then moves it
            // into the pod's v2 cgroup), not back into the checkpointed pod's cgroup paths. And
            // CRIU could not
            // mount its cgroup yard anyway: its working directory is a descriptor of the tool's
            // mount namespace, where a mount from the container's is refused.
            run.command.arg("--manage-cgroups=ignore");
        }
        if tcp {
            run.command.arg("--tcp-established");
        }
        if let Some(container) = inside {
            // The root's stdio pipes to the checkpointed container's runtime: the placeholder's
            // own pipes to its runtime instead (images::external_stdio_pipes).
            for (fd, inode) in images::external_stdio_pipes(images)? {
                if let Some(end) = container.stdio_pipe(fd) {
                    let spec = format!("fd[{}]:pipe:[{inode}]", end.as_raw_fd());
                    run.command.arg("--inherit-fd").arg(spec);
                    run.inherit.push(end);
                }
            }
        }
        self.execute("restore", run, work_dir)?;
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or(CriuError::NoPid("restore"))
    }

    fn invocation<'a>(
        &self,
        action: &str,
        images: &Path,
        inside: Option<&'a Container>,
    ) -> Result<Invocation<'a>, CriuError> {
        let mut run = Invocation {
            command: Command::new(&self.program),
            inherit: Vec::new(),
            inside,
        };
        if inside.is_some() {
            let bundle = self.bundle.as_ref().ok_or_else(|| CriuError::NotBundled {
                program: self.program.clone(),
            })?;
            // What the wrapper does, by descriptor: the loader runs the binary with the bundle's
            // libraries.
            let loader = run.path(&bundle.loader)?;
            let libraries = run.path(&bundle.libraries)?;
            let binary = run.path(&bundle.binary)?;
            run.command = Command::new(loader);
            run.command.arg("--library-path").arg(libraries).arg(binary);
        }
        let images = run.path(images)?;
        run.command
            .arg(action)
            .arg("--images-dir")
            .arg(images)
            .arg("--log-file")
            .arg(format!("{action}.log"))
            .arg("-v4")
            // Not the tool's terminal: nothing CRIU runs may read from it.
            .stdin(std::process::Stdio::null());
        crate::launch::die_with_parent(&mut run.command);
        Ok(run)
    }

    /// Runs CRIU; on failure returns the error lines of its log (`log_dir/<action>.log`).
    fn execute(
        &self,
        action: &'static str,
        run: Invocation<'_>,
        log_dir: &Path,
    ) -> Result<(), CriuError> {
        let output = match run.inside {
            // A restore goes into the container's cgroups (crate::container).
            Some(container) if action == "restore" => container
                .run_joining_cgroups(run.command, run.inherit)
                .map_err(|e| CriuError::Spawn {
                    program: self.program.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?,
            Some(container) => container.run(run.command, run.inherit),
            None => crate::container::run_here(run.command, run.inherit),
        }
        .map_err(|source| CriuError::Spawn {
            program: self.program.clone(),
            source,
        })?;
        if output.status.success() {
            return Ok(());
        }
        let log = log_dir.join(format!("{action}.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let mut tail: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Error") || l.contains("rror ("))
            .collect();
        if tail.is_empty() {
            tail = text.lines().collect();
        }
        let start = tail.len().saturating_sub(12);
        Err(CriuError::Failed {
            action,
            status: output.status.to_string(),
            log,
            tail: format!(
                "{}{}",
                tail[start..].join("\n"),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// Whether a file in an images directory is one of CRIU's images (not a log or statistics file).
pub fn is_image(name: &str) -> bool {
    name.ends_with(".img")
}

/// Total size of CRIU's image files in a directory (logs and statistics not counted; links not
/// followed).
pub fn directory_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_str().is_some_and(is_image))
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
