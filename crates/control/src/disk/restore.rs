//! `cuinterpose restore`: everything checked before anything changes, then CRIU brings the tree
//! back, then native restore (optionally onto other GPUs) and the rebuild a resume does.

use super::datafiles::{DataFiles, Streaming};
use super::devices::gpu_pairs;
use super::digests::verify_images;
use super::manifest::{check_complete, decode_manifest};
use super::{DiskReport, IMAGES_DIR, KILL_TIMEOUT, damaged, locate_criu};
use crate::container::Container;
use crate::criu::{self, Criu};
use crate::discovery;
use crate::group::Group;
use crate::namespaces::Target;
use crate::native::Driver;
use crate::phases::{Bytes, finish_rebuild, match_participants};
use crate::progress::{Clock, ParticipantSummary, Progress, Report};
use crate::refuse;
use crate::statefile::{self, captured_label};
use crate::{Classified, ControlError, ErrorClass, Refusal};
use protocol::manifest::{self, CriuPlacement, LinkRemap, Manifest, SharedNamespace};
use protocol::state::GroupState;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of `cuinterpose restore`.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub dir: PathBuf,
    /// `OLD=NEW` device ordinals: the GPU recorded as OLD is restored onto the current GPU NEW.
    pub device_map: Vec<(u32, u32)>,
    pub criu: Option<PathBuf>,
    pub driver: Option<PathBuf>,
    /// The tool's settings (CRIU when `criu` is not given, the answer timeout).
    pub config: crate::config::ToolConfig,
    /// A process whose namespaces the tree joins, for each namespace the checkpoint's tree shared
    /// with processes outside it (crate::namespaces; the agent gives a process of the
    /// placeholder pod). Required when the tree had a network namespace of its own, and when it
    /// ran in a container: CRIU then restores it from inside this process's mount and PID
    /// namespaces (crate::container), over its root filesystem.
    pub namespaces_of: Option<u32>,
    /// Read every data file and check its digests before CRIU runs (a pass of its own), instead
    /// of the default: lengths checked first, digests checked by the shims as they load, a
    /// mismatch killing the restored tree before its rebuild finishes (DataFiles::check_lengths).
    pub verify_data_first: bool,
    /// Restore a checkpoint whose signature is missing or does not verify with the key of
    /// `config` (crate::disk::signing), with a warning, instead of refusing it.
    pub allow_unsigned: bool,
}

impl RestoreOptions {
    /// A restore of `dir` as `cuinterpose restore --dir DIR` does it with no other option.
    pub fn new(dir: PathBuf, config: &crate::config::ToolConfig) -> RestoreOptions {
        RestoreOptions {
            dir,
            device_map: Vec::new(),
            criu: None,
            driver: None,
            config: config.clone(),
            namespaces_of: None,
            verify_data_first: false,
            allow_unsigned: false,
        }
    }
}

/// Why `restore` failed, in the order it can: before CRIU brought anything back, in CRIU, before
/// the tool knew which processes CRIU brought back, in their rebuild (undone, or not).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// Refused, or failed, before CRIU brought anything back (the run lock, what an interrupted
    /// restore left, the checks of the checkpoint, its link remaps, a CRIU that could not be
    /// started): the error says what, and its class is the error's own.
    #[error(transparent)]
    NotRestored(#[from] ControlError),
    /// CRIU failed to restore the tree: CRIU itself ends what it had restored, so nothing runs
    /// and the checkpoint is unchanged. `log`: CRIU's log, kept beside the run locks (the work
    /// directory it was written in is removed).
    #[error(
        "criu restore failed ({status}); its log is kept at {}:\n{tail}\nundone: CRIU ended \
         what it had restored; the checkpoint is unchanged",
        log.display()
    )]
    CriuFailed {
        status: String,
        log: PathBuf,
        tail: String,
    },
    /// CRIU restored the tree, but which processes it is could not be told (CRIU's pid file was
    /// unusable, the root restored in a container was not found among this machine's processes,
    /// or could not be recorded for the leftovers check): with no root to kill, the tree is left
    /// as CRIU left it. The class is the error's own.
    #[error(transparent)]
    Untracked(ControlError),
    /// The rebuild failed after CRIU brought the tree back, before it finished (the shims' gates
    /// were still closed), and the tree was killed: nothing runs, the checkpoint is unchanged.
    #[error(
        "{failure}\nundone: the restored processes (root pid {root}) were killed before their \
         rebuild finished; the checkpoint is unchanged"
    )]
    Undone {
        root: u32,
        failure: Box<ControlError>,
    },
    /// The rebuild failed and the restored tree could not be killed either (the kill's own error
    /// is logged): half-restored processes may still run. `#[source]` so that the causes of
    /// `failure` are reported, as they were when this was a `ControlError::Step`.
    #[error(
        "restore (killing the restored processes failed too: they need attention) failed for the \
         restored tree (root pid {root}): {failure}"
    )]
    NotUndone {
        root: u32,
        #[source]
        failure: Box<ControlError>,
    },
}

impl Classified for RestoreError {
    fn class(&self) -> ErrorClass {
        match self {
            RestoreError::NotRestored(cause) | RestoreError::Untracked(cause) => cause.class(),
            // Nothing runs and the checkpoint is unchanged: as a rollback of a suspend.
            RestoreError::CriuFailed { .. } | RestoreError::Undone { .. } => ErrorClass::RolledBack,
            RestoreError::NotUndone { .. } => ErrorClass::NeedsAttention,
        }
    }
}

/// Everything a restore checks before it changes anything.
struct Verified {
    manifest: Manifest,
    /// The image digest list, read once with the manifest and checked with it.
    image_digests: Vec<u8>,
    state: GroupState,
    criu: Criu,
    driver: Driver,
    gpu_pairs: Vec<(cuda_abi::CUuuid, cuda_abi::CUuuid)>,
    /// How long each restored shim may take to answer (the tool's settings).
    answer_timeout: std::time::Duration,
    /// The namespaces the tree is restored into, when it shared any.
    namespaces: Option<Target>,
    /// The container CRIU restores the tree in, when it was checkpointed in one.
    container: Option<Container>,
}

fn verify_checkpoint(options: &RestoreOptions) -> Result<Verified, ControlError> {
    let dir = &options.dir;
    check_complete(dir)?;
    // Before anything else of the directory is trusted: the manifest and the digest list it is
    // checked with are read once, here, and everything else is checked against them.
    let signed = super::signing::verify(dir, &options.config.signing_key, options.allow_unsigned)?;
    let manifest = decode_manifest(dir, &signed.manifest)?;
    // What a checkpoint writes is read from these directories themselves: a symbolic link would
    // have the restore read (and CRIU restore) another directory's files.
    for sub in [IMAGES_DIR, super::DATA_DIR, protocol::manifest::REMAPS_DIR] {
        let path = dir.join(sub);
        crate::safefs::real_dir(&path).map_err(|e| damaged(&path, e))?;
    }
    let state_path = dir.join(&manifest.state.file);
    let state_bytes = crate::safefs::read_regular(&state_path, statefile::STATE_FILE_LIMIT)
        .map_err(|e| damaged(&state_path, e))?;
    let state = manifest
        .verify_state(&state_bytes)
        .map_err(|e| damaged(&state_path, e))?;
    let criu = locate_criu(options.criu.as_deref(), &options.config)?;
    let container = container_target(&manifest, options.namespaces_of)?;
    if container.is_some() {
        criu.check_runs_inside()
            .map_err(|e| refuse("criu", e.to_string()))?;
    }

    // The shim must be the same bytes at the same path: CRIU maps it back from there (in the
    // container's filesystem when it restores inside one).
    let shim_path = Path::new(&manifest.shim.path);
    let shim_here = match &container {
        Some(c) => discovery::reach_inside(c.pid(), shim_path),
        None => shim_path.to_path_buf(),
    };
    let shim_bytes = std::fs::read(&shim_here).map_err(|e| {
        refuse(
            "checkpoint",
            format!("the shim {} cannot be read: {e}", shim_path.display()),
        )
    })?;
    if manifest::sha256_hex(&shim_bytes) != manifest.shim.sha256 {
        return Err(refuse(
            "checkpoint",
            format!(
                "{} is not the shim the checkpoint was taken with (SHA-256 differs)",
                shim_path.display()
            ),
        ));
    }
    let driver = Driver::load(options.driver.as_deref())?;
    if driver.version() != manifest.driver_version {
        return Err(refuse(
            "checkpoint",
            format!(
                "was taken on CUDA driver API {}, this machine has {}",
                manifest.driver_version,
                driver.version()
            ),
        ));
    }
    let gpu_pairs = gpu_pairs(&manifest, &driver, &options.device_map)?;
    for p in &manifest.participants {
        if let Ok(info) = discovery::describe(p.host_pid) {
            let command: Vec<String> = info.command.split(' ').map(str::to_string).collect();
            if command == p.command_line {
                return Err(refuse(
                    &info.label(),
                    "the checkpointed process is still running; stop the original group first"
                        .into(),
                ));
            }
        }
    }
    check_sockets_stale(&manifest)?;
    let namespaces = join_target(&manifest, options.namespaces_of)?;
    if let (Some(container), Some(target)) = (&container, &namespaces)
        && target.namespaces().contains(&SharedNamespace::Net)
    {
        container.check_run_dir(&format!("--namespaces-of {}", container.pid()))?;
    }
    Ok(Verified {
        manifest,
        image_digests: signed.digests,
        state,
        criu,
        driver,
        gpu_pairs,
        answer_timeout: options.config.answer_timeout,
        namespaces,
        container,
    })
}

/// The container to restore the tree in: that of `namespaces_of`, when the checkpoint was taken
/// in one. Refused, before anything changes, without `--namespaces-of` or with a process that is
/// not in a container (its root directory the tool's); and a checkpoint taken outside any
/// container is refused into one, whose files would not be the tree's.
fn container_target(
    manifest: &Manifest,
    namespaces_of: Option<u32>,
) -> Result<Option<Container>, ControlError> {
    let placement = manifest.criu.as_ref().map(|c| &c.placement);
    let in_container = placement.is_some_and(CriuPlacement::in_container);
    let Some(pid) = namespaces_of else {
        return if in_container {
            Err(refuse(
                "checkpoint",
                "was taken in a container (its processes' root filesystem was not the tool's): \
                 pass --namespaces-of PID, a process of the container to restore it into (its \
                 mount and PID namespaces, and root filesystem)"
                    .into(),
            ))
        } else {
            Ok(None)
        };
    };
    let label = format!("--namespaces-of {pid}");
    let unreadable = |e: ControlError| refuse(&label, format!("cannot be read: {e}"));
    let theirs = crate::container::root_dir(Some(pid)).map_err(unreadable)?;
    let ours = crate::container::root_dir(None).map_err(unreadable)?;
    match (in_container, theirs != ours) {
        (true, true) => match placement {
            Some(CriuPlacement::ContainerInit { node_mounts }) => {
                let container = Container::open_init(pid, &label)?;
                container.check_mount_points(node_mounts, &label)?;
                Ok(Some(container))
            }
            _ => {
                let container = Container::open(pid, &label)?;
                container.check_writable_proc_sys(&label)?;
                Ok(Some(container))
            }
        },
        (false, false) => Ok(None),
        (true, false) => Err(refuse(
            &label,
            "runs in this tool's root filesystem, and the checkpoint was taken in a container: \
             give a process of the container to restore it into"
                .into(),
        )),
        (false, true) => Err(refuse(
            &label,
            format!(
                "runs in a root filesystem of its own ({theirs}), as in a container, and the \
                 checkpoint was taken outside any: its processes would not find their files there"
            ),
        )),
    }
}

/// The namespaces to restore into: those of `namespaces_of` for each one the checkpoint lists.
/// A tree that had a network namespace of its own (a pod's) cannot be restored without one: CRIU
/// dumped it as external.
fn join_target(
    manifest: &Manifest,
    namespaces_of: Option<u32>,
) -> Result<Option<Target>, ControlError> {
    let shared = manifest
        .criu
        .as_ref()
        .map(|c| c.shared_namespaces.clone())
        .unwrap_or_default();
    match namespaces_of {
        Some(pid) => Target::open(pid, &shared).map(Some),
        None if shared.contains(&SharedNamespace::Net) => Err(refuse(
            "checkpoint",
            "its processes ran in a network namespace of something outside them (a pod's \
             sandbox), which CRIU does not dump: pass --namespaces-of PID, a process in the \
             network, IPC and UTS namespaces to restore them into"
                .into(),
        )),
        None => Ok(None),
    }
}

/// Refuses while any socket the checkpoint recorded still answers (the original group, or a
/// restored copy of it, is running), or names something that is not a socket. Read-only.
fn check_sockets_stale(manifest: &Manifest) -> Result<(), ControlError> {
    use std::os::unix::fs::FileTypeExt;
    let mut refusals = Vec::new();
    for p in &manifest.participants {
        for path in &p.sockets {
            let path = Path::new(path);
            let label = format!("pid {} [ns pid {}]", p.host_pid, p.ns_pid);
            match std::fs::symlink_metadata(path) {
                Err(_) => {}
                Ok(m) if !m.file_type().is_socket() => refusals.push(Refusal {
                    process: label,
                    reason: format!(
                        "{} is not a socket; CRIU cannot bind the process's socket there",
                        path.display()
                    ),
                }),
                Ok(_) => {
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        refusals.push(Refusal {
                            process: label,
                            reason: format!(
                                "{} is answered by a running process: the checkpointed group \
                                 (or a restored copy) still runs; stop it first",
                                path.display()
                            ),
                        });
                    }
                }
            }
        }
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(ControlError::Refused(refusals))
    }
}

/// Removes the recorded sockets that nothing listens on any more, so that CRIU can bind them.
fn remove_stale_sockets(manifest: &Manifest) -> Result<(), ControlError> {
    for p in &manifest.participants {
        for path in &p.sockets {
            let path = Path::new(path);
            // Only a socket nothing answers on is removed; a live one, or anything that is not a
            // socket, is refused, so a tampered manifest cannot make the tool delete other files.
            transport::remove_stale_socket(path).map_err(|e| {
                refuse(
                    &format!("pid {} [ns pid {}]", p.host_pid, p.ns_pid),
                    format!("socket {}: {e}", path.display()),
                )
            })?;
        }
    }
    Ok(())
}

/// The link remaps the (verified) images restore through: the manifest must list the same, and
/// each must be kept and CRIU's name for it free (crate::remaps), as the container `into` sees it
/// for a copy.
fn verify_link_remaps(
    manifest: &Manifest,
    dir: &Path,
    into: Option<u32>,
) -> Result<Vec<LinkRemap>, ControlError> {
    let images = &dir.join(IMAGES_DIR);
    let in_images = criu::images::link_remaps(images).map_err(|e| damaged(images, e))?;
    let listed = manifest
        .criu
        .as_ref()
        .map(|c| c.link_remaps.clone())
        .unwrap_or_default();
    let listed_links: Vec<&str> = listed.iter().map(|r| r.link.as_str()).collect();
    if in_images != listed_links {
        return Err(damaged(
            images,
            format!(
                "the images restore through the link remaps {in_images:?}, the manifest lists \
                 {listed_links:?}"
            ),
        ));
    }
    crate::remaps::check_present(&listed, dir, into)
        .map_err(|e| refuse("checkpoint", e.to_string()))?;
    Ok(listed)
}

/// Restores the checkpoint in `options.dir` into new processes.
///
/// Everything is checked before anything changes (manifest, state file, image digests, the data
/// files' sizes and BLAKE3 digests, shim bytes,
/// driver version, GPUs and the device map, that the original group is not running): a failure
/// there is a refusal. After CRIU restored the tree, a failure kills the restored tree, so nothing
/// half-restored is left running. The checkpoint directory is never written.
pub fn restore(
    options: &RestoreOptions,
    progress: &dyn Progress,
) -> Result<DiskReport, RestoreError> {
    let start = Instant::now();
    let _lock = crate::runlock::RunLock::directory(&options.dir)?;
    // What an interrupted restore of this checkpoint left: cleared, or a refusal while a tree it
    // brought back still runs.
    super::leftovers::check(&options.dir)?;
    let mut clock = Clock::new(progress);
    let verified = clock.time("verify-checkpoint", None, || {
        verify_checkpoint(options).map(|v| (v, 0, 0.0))
    })?;
    let images = options.dir.join(IMAGES_DIR);
    let image_bytes = criu::directory_bytes(&images);
    let progress = clock.progress();
    clock.time("verify-images", Some(image_bytes), || {
        verify_images(&options.dir, &verified.image_digests, progress)
            .map(|()| ((), image_bytes, 0.0))
    })?;
    let files = DataFiles::listed(&options.dir, &verified.manifest.data_files)?;
    // No collection of the block store while its blocks are read (a `discard` of another
    // checkpoint beside this one waits).
    let _store_lock = files.store().map(|s| s.lock_shared()).transpose()?;
    let (written, shared, zero_bytes) =
        super::checkpoint::data_totals(&verified.manifest.data_files);
    // Every byte that is not a zero block is read back, from a data file or the store.
    let data_bytes = written + shared;
    // A missing or truncated data file or block is refused here, before anything changes; its
    // content is checked in one pass with the load (each shim hashes what it reads), unless
    // asked first.
    files.check_lengths()?;
    if options.verify_data_first {
        clock.time("verify-data", Some(data_bytes), || {
            files.verify(progress).map(|read| ((), read, 0.0))
        })?;
    }
    let into = verified.container.as_ref().map(Container::pid);
    let link_remaps = verify_link_remaps(&verified.manifest, &options.dir, into)?;
    remove_stale_sockets(&verified.manifest)?;
    let work_dir = super::leftovers::create_work_dir(&options.dir)?;
    // CRIU's files of this restore (log, statistics, pid file) go with it, whatever its end: a
    // failure names CRIU's log tail in its error already. A restore killed before this line
    // leaves them to the next restore or `restore --cleanup` (super::leftovers).
    let result = restore_into(
        options,
        &verified,
        &link_remaps,
        &files,
        &work_dir,
        &mut clock,
    );
    let _ = std::fs::remove_dir_all(&work_dir);
    let (root, participants, saved_bytes) = result?;
    Ok(DiskReport {
        report: Report {
            participants,
            phases: clock.phases,
            saved_bytes,
            state_file: options.dir.join(protocol::state::STATE_FILE_NAME),
            total_millis: start.elapsed().as_secs_f64() * 1e3,
            lost: Vec::new(),
            not_rebuilt: Vec::new(),
            drained: Vec::new(),
            carrier: None,
        },
        dir: options.dir.clone(),
        image_bytes,
        data_bytes,
        shared_bytes: 0,
        zero_bytes,
        root,
        shared_namespaces: verified
            .namespaces
            .as_ref()
            .map_or_else(Vec::new, Target::namespaces),
        placement: verified
            .manifest
            .criu
            .as_ref()
            .map_or(CriuPlacement::Host, |c| c.placement.clone()),
        worker_time: files.worker_time(Streaming::Load),
    })
}

/// A failure of CRIU's restore (or of CRIU before it ran, or after: its pid file) as what it left:
/// CRIU's failed restore with its log copied out of `work_dir` (removed with it) to
/// [`super::leftovers::kept_log_of`], which the error names.
fn criu_failure(error: ControlError, work_dir: &Path) -> RestoreError {
    let (status, log, tail) = match error {
        ControlError::Criu(criu::CriuError::Failed {
            action: "restore",
            status,
            log,
            tail,
        }) => (status, log, tail),
        // CRIU ran and restored the tree, but its root is not known.
        ControlError::Criu(criu::CriuError::NoPid(_)) => return RestoreError::Untracked(error),
        error => return RestoreError::NotRestored(error),
    };
    let kept = super::leftovers::kept_log_of(work_dir);
    match std::fs::copy(&log, &kept) {
        Ok(_) => RestoreError::CriuFailed {
            status,
            log: kept,
            tail,
        },
        Err(e) => {
            tracing::warn!(log = %log.display(), error = %e, "keeping CRIU's restore log");
            RestoreError::CriuFailed {
                status,
                log: PathBuf::from(format!("(not kept: {e}; its last lines follow)")),
                tail,
            }
        }
    }
}

/// CRIU's restore into `work_dir`, then the rebuild; a failure after CRIU kills the tree.
fn restore_into(
    options: &RestoreOptions,
    verified: &Verified,
    link_remaps: &[LinkRemap],
    files: &DataFiles,
    work_dir: &Path,
    clock: &mut Clock<'_>,
) -> Result<(u32, Vec<ParticipantSummary>, u64), RestoreError> {
    let tree = NewTree {
        options,
        verified,
        link_remaps,
        files,
        work_dir,
    };
    restore_then_rebuild(&tree, clock)
}

/// What a restore does to the tree it brings back: the seam between the restore's order of steps
/// and CRIU, the restored processes and the shims, so that its undo is unit-tested
/// ([`restore_then_rebuild`]).
trait Restoring {
    /// CRIU's restore of the tree (left stopped); the restored root's host PID.
    fn criu_restore(&self, clock: &mut Clock<'_>) -> Result<u32, RestoreError>;
    /// Everything after CRIU: native restore, the rebuild, verify and thaw.
    fn rebuild(
        &self,
        root: u32,
        clock: &mut Clock<'_>,
    ) -> Result<(Vec<ParticipantSummary>, u64), ControlError>;
    /// Kills the restored tree.
    fn kill(&self, root: u32) -> Result<(), ControlError>;
}

/// The tree a restore brings back, as it really is.
struct NewTree<'a> {
    options: &'a RestoreOptions,
    verified: &'a Verified,
    link_remaps: &'a [LinkRemap],
    files: &'a DataFiles,
    work_dir: &'a Path,
}

impl Restoring for NewTree<'_> {
    fn criu_restore(&self, clock: &mut Clock<'_>) -> Result<u32, RestoreError> {
        let (options, verified, link_remaps, work_dir) =
            (self.options, self.verified, self.link_remaps, self.work_dir);
        let images = options.dir.join(IMAGES_DIR);
        let image_bytes = criu::directory_bytes(&images);
        let inside = verified.container.as_ref();
        let pid = clock.time("criu-restore", Some(image_bytes), || {
            // Under CRIU's names only while CRIU runs (crate::remaps).
            let into = verified.container.as_ref().map(Container::pid);
            let _linked = crate::remaps::link_for_restore(link_remaps, &options.dir, into)?;
            let tcp = (verified.manifest.criu.as_ref()).is_some_and(|c| c.tcp_established);
            let (namespaces, inherit) = match verified.namespaces.as_ref() {
                Some(target) => target.restore_args().map_err(|e| {
                    refuse(
                        &format!("--namespaces-of {}", options.namespaces_of.unwrap_or(0)),
                        format!("its namespaces cannot be passed to CRIU: {e}"),
                    )
                })?,
                None => (Vec::new(), Vec::new()),
            };
            let placement =
                (verified.manifest.criu.as_ref()).map_or(&CriuPlacement::Host, |c| &c.placement);
            let restored = verified.criu.restore(
                &images,
                work_dir,
                tcp,
                (&namespaces, inherit),
                (inside, placement),
            );
            if inside.is_none() {
                remove_cr_tmpfs_left(work_dir);
            }
            let pid = restored.map_err(ControlError::Criu)?;
            Ok((pid, image_bytes, 0.0))
        });
        let pid = pid.map_err(|e| criu_failure(e, work_dir))?;
        match inside {
            // CRIU brought the tree back: a failure from here leaves it as CRIU did.
            Some(container) if container.enters_pid_namespace() => {
                host_root(container, pid, work_dir).map_err(RestoreError::Untracked)
            }
            _ => Ok(pid),
        }
    }

    fn rebuild(
        &self,
        root: u32,
        clock: &mut Clock<'_>,
    ) -> Result<(Vec<ParticipantSummary>, u64), ControlError> {
        match self
            .verified
            .namespaces
            .as_ref()
            .map(|t| t.check_joined(root))
        {
            Some(Err(reason)) => Err(refuse("the restored tree", reason)),
            _ => rebuild_restored(root, self.verified, self.files, clock),
        }
    }

    fn kill(&self, root: u32) -> Result<(), ControlError> {
        crate::launch::kill_tree(root, KILL_TIMEOUT).map_err(ControlError::from)
    }
}

/// CRIU's restore, then the rebuild. A CRIU that fails ends what it restored itself; a failure
/// after it kills the restored tree, so that nothing half-restored is left running, and the
/// error says whether that worked.
fn restore_then_rebuild(
    tree: &dyn Restoring,
    clock: &mut Clock<'_>,
) -> Result<(u32, Vec<ParticipantSummary>, u64), RestoreError> {
    let root = tree.criu_restore(clock)?;
    match tree.rebuild(root, clock) {
        Ok((participants, saved_bytes)) => Ok((root, participants, saved_bytes)),
        Err(e) => Err(match tree.kill(root) {
            Ok(()) => RestoreError::Undone {
                root,
                failure: Box::new(e),
            },
            Err(kill) => {
                tracing::error!(root, error = %kill, "killing the restored tree");
                RestoreError::NotUndone {
                    root,
                    failure: Box::new(e),
                }
            }
        }),
    }
}

/// Removes the directories CRIU's restore left in `/tmp`: it makes one (`mkdtemp`,
/// `/tmp/cr-tmpfs.XXXXXX`) to reach a mount with others on top of it, cannot remove it while that
/// mount is in use, says so in its log ("Unable to remove /tmp/cr-tmpfs..."), and leaves it
/// empty. Only the ones this CRIU's log names are removed, and `rmdir` removes nothing else (a
/// directory in use or holding anything stays): another CRIU's, running now, is never touched.
fn remove_cr_tmpfs_left(work_dir: &Path) {
    const PREFIX: &str = "/tmp/cr-tmpfs.";
    let Ok(log) = std::fs::read_to_string(work_dir.join("restore.log")) else {
        return;
    };
    let named = log.lines().filter_map(|line| {
        let at = line.find(PREFIX)?;
        let rest = line.get(at + PREFIX.len()..)?;
        let suffix: String = rest
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        (suffix.len() == 6).then(|| PathBuf::from(format!("{PREFIX}{suffix}")))
    });
    let named: std::collections::BTreeSet<PathBuf> = named.collect();
    for path in named {
        match std::fs::remove_dir(&path) {
            Ok(()) => tracing::debug!(path = %path.display(), "removed CRIU's leftover directory"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "leaving CRIU's directory")
            }
        }
    }
}

/// The host PID of the root CRIU restored inside `container` as `inside`, written to the work
/// directory's pid file for crate::disk::leftovers (which reads host PIDs only).
fn host_root(container: &Container, inside: u32, work_dir: &Path) -> Result<u32, ControlError> {
    let root = container.host_pid(inside).map_err(|e| ControlError::Step {
        step: "finding the restored root among this machine's processes",
        process: format!(
            "pid {inside} in the PID namespace of pid {}",
            container.pid()
        ),
        source: Box::new(e),
    })?;
    let pid_file = work_dir.join(criu::CRIU_PID_FILE);
    transport::files::write_atomically(&pid_file, format!("{root}\n").as_bytes())
        .map_err(|e| crate::state_error(&pid_file, e))?;
    Ok(root)
}

/// Native restore of every participant of the stopped tree, each with only its restore thread
/// running (crate::restore_thread), then the tree continued: its threads run again only once
/// the driver has mapped back what they may touch.
fn restore_stopped_tree(
    root: u32,
    verified: &Verified,
    state: &GroupState,
) -> Result<(), ControlError> {
    let pids: Vec<u32> = state.participants.iter().map(|p| p.host_pid).collect();
    let restored = crate::parallel::for_each("native restore", &pids, |&pid| {
        crate::restore_thread::restore_stopped(
            &verified.driver,
            &crate::procfs::Proc,
            pid,
            &verified.gpu_pairs,
        )
    });
    for (captured, result) in state.participants.iter().zip(restored) {
        result.map_err(|e| ControlError::Step {
            step: "native restore",
            process: captured_label(captured),
            source: Box::new(e),
        })?;
    }
    crate::launch::continue_tree(root).map_err(|e| ControlError::Step {
        step: "continuing the restored tree",
        process: format!("pid {root}"),
        source: Box::new(e.into()),
    })
}

fn rebuild_restored(
    root: u32,
    verified: &Verified,
    files: &DataFiles,
    clock: &mut Clock<'_>,
) -> Result<(Vec<ParticipantSummary>, u64), ControlError> {
    // The restored tree is a group like any other from here: no other run may act on it.
    let _lock = crate::group_capture::lock_tree(root)?;
    // CRIU left the tree stopped (crate::restore_thread says why), so its shims cannot answer
    // yet: host PIDs are found in /proc (namespace PIDs are what CRIU kept).
    let mut state = verified.state.clone();
    let tree: Vec<(u32, Option<u32>)> = discovery::process_tree(root)?
        .into_iter()
        .map(|pid| (pid, crate::procfs::ns_pid(pid)))
        .collect();
    for captured in &mut state.participants {
        let (host_pid, _) = tree
            .iter()
            .find(|(_, ns_pid)| *ns_pid == Some(captured.ns_pid))
            .ok_or_else(|| {
                refuse(
                    &format!("ns pid {}", captured.ns_pid),
                    "was checkpointed but is missing after restore".into(),
                )
            })?;
        captured.host_pid = *host_pid;
    }
    // Where this restore got is recorded as for a suspended group: a restore killed from here on
    // is finished by `cuinterpose resume --pid <restored root>`.
    let state_path = statefile::default_state_dir(root).join(statefile::STATE_FILE);
    statefile::write_state_of(&state_path, &state)?;
    files.write_record(&state_path)?;
    let rebuilt = clock
        .time("native-restore", None, || {
            restore_stopped_tree(root, verified, &state).map(|()| ((), 0, 0.0))
        })
        .and_then(|()| {
            let mut group = Group::discover(root, verified.answer_timeout)?;
            let lost = match_participants(&mut group, &state, &crate::procfs::Proc)?;
            if let Some(gone) = lost.first() {
                return Err(refuse(
                    &format!("pid {} [ns pid {}]", gone.host_pid, gone.ns_pid),
                    "exited right after CRIU restored it".into(),
                ));
            }
            let participants: Vec<_> = group.participants.iter().collect();
            crate::native_steps::unlock_all(&verified.driver, &participants)?;
            finish_rebuild(&mut group, &state, clock, Bytes::Files(files))
        });
    // Done, or the tree is killed by the caller: the record has no use either way.
    super::datafiles::remove_record(&state_path);
    statefile::remove_state(&state_path);
    rebuilt
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Quiet;
    use std::cell::RefCell;

    /// A restore whose steps succeed except the ones named, logging each step it was asked.
    #[derive(Default)]
    struct Scripted {
        fails: Vec<&'static str>,
        log: RefCell<Vec<String>>,
    }

    impl Scripted {
        fn failing(steps: &[&'static str]) -> Scripted {
            Scripted {
                fails: steps.to_vec(),
                ..Scripted::default()
            }
        }

        fn step(&self, name: &'static str, root: Option<u32>) -> Result<(), ControlError> {
            let entry = root.map_or(name.to_string(), |r| format!("{name} {r}"));
            self.log.borrow_mut().push(entry);
            if self.fails.contains(&name) {
                Err(ControlError::Protocol {
                    process: "pid 42".into(),
                    message: format!("{name} failed"),
                })
            } else {
                Ok(())
            }
        }
    }

    impl Restoring for Scripted {
        fn criu_restore(&self, _clock: &mut Clock<'_>) -> Result<u32, RestoreError> {
            self.step("criu restore", None)
                .map(|()| 42)
                .map_err(|e| RestoreError::CriuFailed {
                    status: "exit status 1".into(),
                    log: "/run/cuinterpose/restore.log".into(),
                    tail: e.to_string(),
                })
        }
        fn rebuild(
            &self,
            root: u32,
            _clock: &mut Clock<'_>,
        ) -> Result<(Vec<ParticipantSummary>, u64), ControlError> {
            self.step("rebuild", Some(root)).map(|()| (Vec::new(), 7))
        }
        fn kill(&self, root: u32) -> Result<(), ControlError> {
            self.step("kill", Some(root))
        }
    }

    fn run(tree: &Scripted) -> Result<(u32, Vec<ParticipantSummary>, u64), RestoreError> {
        restore_then_rebuild(tree, &mut Clock::new(&Quiet))
    }

    #[test]
    fn a_restore_rebuilds_the_tree_criu_brought_back() {
        let tree = Scripted::default();
        let (root, _, bytes) = run(&tree).unwrap();
        assert_eq!((root, bytes), (42, 7));
        assert_eq!(tree.log.take(), ["criu restore", "rebuild 42"]);
    }

    #[test]
    fn a_failed_criu_restore_kills_nothing_criu_ends_what_it_restored() {
        let tree = Scripted::failing(&["criu restore"]);
        let error = run(&tree).unwrap_err();
        assert_eq!(tree.log.take(), ["criu restore"]);
        assert!(matches!(error, RestoreError::CriuFailed { .. }), "{error}");
        assert_eq!(error.class(), ErrorClass::RolledBack);
    }

    #[test]
    fn a_rebuild_that_fails_kills_the_restored_tree_and_says_so() {
        let tree = Scripted::failing(&["rebuild"]);
        let error = run(&tree).unwrap_err();
        assert_eq!(tree.log.take(), ["criu restore", "rebuild 42", "kill 42"]);
        let RestoreError::Undone { root: 42, failure } = &error else {
            panic!("{error}");
        };
        assert!(failure.to_string().ends_with("rebuild failed"));
        assert_eq!(error.class(), ErrorClass::RolledBack);
    }

    #[test]
    fn a_tree_that_cannot_be_killed_is_named_as_needing_attention() {
        let tree = Scripted::failing(&["rebuild", "kill"]);
        let error = run(&tree).unwrap_err();
        assert_eq!(tree.log.take(), ["criu restore", "rebuild 42", "kill 42"]);
        assert!(matches!(error, RestoreError::NotUndone { root: 42, .. }));
        assert_eq!(error.class(), ErrorClass::NeedsAttention);
        assert_eq!(
            error.to_string(),
            "restore (killing the restored processes failed too: they need attention) failed for \
             the restored tree (root pid 42): pid 42: protocol error: rebuild failed"
        );
    }

    /// CRIU's errors by what CRIU did: a failed restore (its log kept beside the work directory,
    /// which is removed) is undone by CRIU itself; a CRIU that did not start restored nothing; a
    /// CRIU that restored the tree without saying its root leaves it untracked.
    #[test]
    fn criu_failures_are_told_apart_by_what_criu_did() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let work_dir = scratch.path().join("restore.work");
        std::fs::create_dir(&work_dir).expect("work dir");
        let log = work_dir.join("restore.log");
        std::fs::write(&log, "Error (criu/cr-restore.c): Restoring FAILED.\n").expect("log");
        let failed = criu_failure(
            ControlError::Criu(criu::CriuError::Failed {
                action: "restore",
                status: "exit status 1".into(),
                log,
                tail: "Restoring FAILED.".into(),
            }),
            &work_dir,
        );
        let kept = super::super::leftovers::kept_log_of(&work_dir);
        let RestoreError::CriuFailed { log, .. } = &failed else {
            panic!("{failed}");
        };
        assert_eq!(log, &kept);
        assert!(std::fs::read_to_string(&kept).is_ok_and(|t| t.contains("Restoring FAILED")));
        assert_eq!(
            failed.to_string(),
            format!(
                "criu restore failed (exit status 1); its log is kept at {}:\nRestoring FAILED.\n\
                 undone: CRIU ended what it had restored; the checkpoint is unchanged",
                kept.display()
            )
        );
        let not_started = criu_failure(
            ControlError::Criu(criu::CriuError::Spawn {
                program: "/criu".into(),
                source: std::io::Error::other("denied"),
            }),
            &work_dir,
        );
        assert!(
            matches!(not_started, RestoreError::NotRestored(_)),
            "{not_started}"
        );
        let no_root = criu_failure(
            ControlError::Criu(criu::CriuError::NoPid("restore")),
            &work_dir,
        );
        assert!(matches!(no_root, RestoreError::Untracked(_)), "{no_root}");
        assert_eq!(no_root.to_string(), "criu restore wrote no usable pid file");
    }

    /// The exit codes users script against (docs/recovery.md), pinned per variant of
    /// `RestoreError`: a wrapped error keeps its own class (and message), CRIU's failure and an
    /// undone rebuild are rolled back (4), a tree that could not be killed needs attention (5).
    #[test]
    fn each_restore_failure_is_classified_by_what_it_left() {
        let refused = RestoreError::from(refuse(
            "checkpoint",
            "was taken on CUDA driver API 1".into(),
        ));
        assert_eq!(refused.class(), ErrorClass::Refused);
        let another_run = RestoreError::from(ControlError::AnotherRun {
            process: "checkpoint /c".into(),
            message: "held".into(),
        });
        assert_eq!(another_run.class(), ErrorClass::Refused);
        assert_eq!(another_run.to_string(), "checkpoint /c: held");
        let unreadable = RestoreError::from(ControlError::State {
            path: "/c/images".into(),
            source: std::io::Error::other("denied").into(),
        });
        assert_eq!(unreadable.class(), ErrorClass::Error);
        let criu = RestoreError::CriuFailed {
            status: "exit status 1".into(),
            log: "/l".into(),
            tail: String::new(),
        };
        assert_eq!(criu.class(), ErrorClass::RolledBack);
        let no_pid = RestoreError::Untracked(ControlError::Criu(criu::CriuError::NoPid("restore")));
        assert_eq!(no_pid.class(), ErrorClass::Error);
        let root_not_found = RestoreError::Untracked(ControlError::Step {
            step: "finding the restored root among this machine's processes",
            process: "pid 1 in the PID namespace of pid 9".into(),
            source: Box::new(ControlError::NoSuchProcess(1)),
        });
        assert_eq!(root_not_found.class(), ErrorClass::NeedsAttention);
        let failure = || {
            Box::new(ControlError::Protocol {
                process: "pid 42".into(),
                message: "closed".into(),
            })
        };
        let undone = RestoreError::Undone {
            root: 42,
            failure: failure(),
        };
        assert_eq!(undone.class(), ErrorClass::RolledBack);
        assert_eq!(
            undone.to_string(),
            "pid 42: protocol error: closed\nundone: the restored processes (root pid 42) were \
             killed before their rebuild finished; the checkpoint is unchanged"
        );
        let not_undone = RestoreError::NotUndone {
            root: 42,
            failure: failure(),
        };
        assert_eq!(not_undone.class(), ErrorClass::NeedsAttention);
    }
}
