//! `cuinterpose checkpoint`: the capture of a suspend, then a CRIU dump of the process tree.

use super::datafiles::{DataFiles, Streaming};
use super::devices::gpu_list;
use super::digests::{IMAGE_DIGESTS, digest_images};
use super::manifest::build_manifest;
use super::preflight::{
    check_new_dir, container_of, has_terminal, replaced_mappings, tree_sockets,
};
use super::{CheckpointOptions, DiskReport, IMAGES_DIR, KILL_TIMEOUT, locate_criu};
use crate::carrier_policy::CarrierChoice;
use crate::container::namespace_root;
use crate::criu;
use crate::discovery;
use crate::group::{Group, Snapshot};
use crate::group_capture::{self, SuspendOptions};
use crate::native::Driver;
use crate::phases::{Bytes, finish_rebuild};
use crate::progress::{Clock, Progress, Report, summarize};
use crate::statefile::{self, check_state_dir, default_state_dir, remove_state};
use crate::suspend_error::SuspendError;
use crate::{Classified, ControlError, ErrorClass, refuse, state_error};
use protocol::manifest::{self, CriuInfo, CriuPlacement, LinkRemap, Manifest};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Why `checkpoint` failed, in the order it can: before the capture changed anything, in the
/// capture, between the capture and the dump, in the dump or before the checkpoint was complete
/// (rolled back, or not), and once it was complete.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Refused, or failed, before the capture changed anything (CRIU not found, the run locks,
    /// the state directory, the checkpoint's directory, what CRIU cannot dump, the block store):
    /// the error says what, and its class is the error's own.
    #[error(transparent)]
    NotStarted(#[from] ControlError),
    /// The capture failed: refused before it changed anything, rolled back, or its rollback
    /// failed, as the capture's own error (a suspend's, [`SuspendError`]) says, with its class.
    /// What this run wrote is removed: the directory is left as it was found.
    #[error(transparent)]
    NotCaptured(SuspendError),
    /// The group was captured, but the driver could not be loaded again or its GPUs listed for
    /// the manifest, so nothing was dumped: the group stays suspended, its state file where
    /// `cuinterpose resume` looks and its data files kept. Needs attention whatever the cause (a
    /// driver that fails to load is otherwise a refusal): the workload does not run until resumed.
    #[error(transparent)]
    Suspended(ControlError),
    /// CRIU's dump, or writing the checkpoint before it was complete, failed; the tree CRIU left
    /// stopped was continued and rebuilt in place: the workload runs, the data files are removed
    /// and the images stay in the incomplete checkpoint for diagnosis (discard removes it). The
    /// message is that of a suspend's rollback (`SuspendError::RolledBack`).
    #[error(
        "{failure}\nrolled back: the shims rebuilt what they had released and the workload is running"
    )]
    RolledBack { failure: Box<ControlError> },
    /// The dump or the checkpoint's writing failed and the tree could not be continued or
    /// rebuilt in place either (`rollback` says which): the data files are kept, since they hold
    /// the only copy of the group's shared bytes. The message is that of a suspend's failed
    /// rollback (`SuspendError::RollbackFailed`).
    #[error("{failure}\nrollback also failed, the workload needs attention:\n  {rollback}")]
    RollbackFailed {
        failure: Box<ControlError>,
        rollback: Box<ControlError>,
    },
    /// The checkpoint is complete on disk, but the tree could not be ended (with
    /// `--leave-running`: continued and rebuilt in place): needs attention whatever the cause (a
    /// tree not found again is otherwise a refusal), since what runs is not what was asked for.
    #[error(transparent)]
    Complete(ControlError),
}

impl Classified for CheckpointError {
    fn class(&self) -> ErrorClass {
        match self {
            CheckpointError::NotStarted(cause) => cause.class(),
            CheckpointError::NotCaptured(cause) => cause.class(),
            CheckpointError::RolledBack { .. } => ErrorClass::RolledBack,
            CheckpointError::Suspended(_)
            | CheckpointError::RollbackFailed { .. }
            | CheckpointError::Complete(_) => ErrorClass::NeedsAttention,
        }
    }
}

/// Captures the group under `options.capture.root` and dumps it with CRIU into `options.dir`.
///
/// Everything CRIU cannot handle is refused before the capture starts (no CRIU, no PID namespace
/// of its own, a controlling terminal, a tree over more than one root or mount namespace or
/// outside its container's, a large deleted mapping, a TCP connection to a peer outside the tree,
/// a used directory). A tree in a container is dumped from inside the container's mount and PID
/// namespaces (crate::container). A dump that fails is rolled back: CRIU
/// leaves the tree running, and the shims rebuild what they released.
pub fn checkpoint(
    options: &CheckpointOptions,
    progress: &dyn Progress,
) -> Result<DiskReport, CheckpointError> {
    let start = Instant::now();
    let dir = &options.dir;
    let mut begun = begin(options)?;
    let (root, work_state) = (begun.root, &begun.work_state);
    let mut clock = Clock::new(progress);
    // CRIU can only dump a process whose driver state was checkpointed natively.
    let capture_options = SuspendOptions {
        root,
        mode: protocol::state::SuspendMode::Native,
        ..options.capture.clone()
    };
    let store = begun.store.take();
    let mut store_lock = store.as_ref().map(|s| s.lock_shared()).transpose()?;
    let files = DataFiles::new(dir, work_state, store);
    let (group, captured, carrier) = capture_into(
        &capture_options,
        (dir, begun.dir_existed),
        work_state,
        &files,
        &mut store_lock,
        &mut clock,
    )
    .map_err(CheckpointError::NotCaptured)?;
    let driver =
        Driver::load(capture_options.driver.as_deref()).map_err(CheckpointError::Suspended)?;
    let gpus = gpu_list(&driver).map_err(CheckpointError::Suspended)?;
    // CRIU refuses a tree with a connected socket whose peer is outside it: the tool's connections
    // to the shims go first (the shims keep none of their own between requests).
    drop(group);

    let tree = Tree {
        root,
        criu: &begun.criu,
        surveyed: &begun.surveyed,
        images: &begun.images,
        options: &capture_options,
        captured: &captured,
        driver: &driver,
        files: &files,
    };
    let written = Written {
        tree: &tree,
        dir,
        work_state,
        state_path: &begun.state_path,
        gpus: &gpus,
        signing_key: &options.capture.config.signing_key,
    };
    let done = dump_and_publish(
        &tree,
        &mut clock,
        options.leave_running,
        |clock, link_remaps| written.publish(clock, link_remaps),
        |link_remaps| remove_unpublished(dir, &begun.state_path, link_remaps),
    );
    let (manifest, image_bytes) = match done {
        Ok(done) => done,
        Err(e) => {
            if matches!(e, CheckpointError::RolledBack { .. }) {
                // Loaded back: the data files have no use any more. Kept when the rollback
                // failed, since they hold the only copy of the group's shared bytes.
                files.remove();
                super::datafiles::remove_record(work_state);
                remove_state(work_state);
                drop(store_lock.take());
                collect_after_failure(&files);
            }
            return Err(e);
        }
    };
    // The checkpoint holds its own copy; the group's is of no use any more.
    super::datafiles::remove_record(work_state);
    remove_state(work_state);
    let report = Report {
        drained: clock.drained,
        participants: summarize(&captured),
        phases: clock.phases,
        saved_bytes: manifest.bytes.saved,
        state_file: begun.state_path.clone(),
        total_millis: start.elapsed().as_secs_f64() * 1e3,
        lost: Vec::new(),
        not_rebuilt: Vec::new(),
        carrier: Some(carrier),
    };
    let files_and_bytes = (&files, &manifest, image_bytes);
    Ok(disk_report(
        report,
        dir,
        root,
        begun.surveyed,
        files_and_bytes,
    ))
}

/// The capture, its bytes streamed into `files`. A failure was rolled back (or says why not)
/// before anything was dumped: what this run wrote goes, so a full disk leaves the directory
/// (`dir`, and whether it existed before) as it found it.
fn capture_into(
    options: &SuspendOptions,
    (dir, dir_existed): (&Path, bool),
    work_state: &Path,
    files: &DataFiles,
    store_lock: &mut Option<super::store::StoreLock>,
    clock: &mut Clock<'_>,
) -> Result<(Group, Vec<Snapshot>, CarrierChoice), SuspendError> {
    let captured = group_capture::capture(options, work_state, clock, Bytes::Files(files));
    if captured.is_err() {
        super::datafiles::remove_record(work_state);
        files.remove();
        remove_started(dir, dir_existed);
        drop(store_lock.take());
        collect_after_failure(files);
    }
    captured
}

/// The report of a complete checkpoint.
fn disk_report(
    report: Report,
    dir: &Path,
    root: u32,
    surveyed: Surveyed,
    (files, manifest, image_bytes): (&DataFiles, &Manifest, u64),
) -> DiskReport {
    let (data_bytes, shared_bytes, zero_bytes) = data_totals(&manifest.data_files);
    DiskReport {
        report,
        dir: dir.to_path_buf(),
        image_bytes,
        data_bytes,
        shared_bytes,
        zero_bytes,
        root,
        shared_namespaces: surveyed.namespaces.namespaces,
        placement: surveyed.placement,
        worker_time: files.worker_time(Streaming::Save),
    }
}

/// What a checkpoint holds once everything CRIU cannot handle was refused and its directory is
/// begun.
struct Begun {
    criu: criu::Criu,
    /// The init of the workload's PID namespace: the root CRIU dumps.
    root: u32,
    surveyed: Surveyed,
    /// The group's state file while the checkpoint is not complete.
    work_state: PathBuf,
    images: PathBuf,
    /// The state file's place in the checkpoint.
    state_path: PathBuf,
    dir_existed: bool,
    store: Option<super::store::BlockStore>,
    /// The run locks of the tree and of the directory, held to the end of the checkpoint.
    _locks: (crate::runlock::RunLock, crate::runlock::RunLock),
}

/// Everything before the capture: CRIU found, the tree locked and surveyed, the state directory
/// and the checkpoint directory checked, the block store opened, and the directory begun with
/// its marker.
fn begin(options: &CheckpointOptions) -> Result<Begun, ControlError> {
    let criu = locate_criu(options.criu.as_deref(), &options.capture.config)?;
    let root = namespace_root(options.capture.root)?;
    let dir = &options.dir;
    let tree = discovery::process_tree(root)?;
    let tree_lock = crate::runlock::RunLock::processes(&tree)?;
    let dir_lock = crate::runlock::RunLock::directory(dir)?;
    // The state lives in the group's own state directory until the checkpoint is complete: a
    // checkpoint that fails or is killed half way leaves it where `cuinterpose resume` looks.
    let work_state = check_state_dir(&default_state_dir(root))?;
    check_new_dir(dir)?;
    let surveyed = survey(root, &tree, &criu)?;
    let images = dir.join(IMAGES_DIR);
    let dir_existed = dir.exists();
    let store = open_store(options, root)?;
    // The marker goes first and leaves last: until it is gone the directory is an incomplete
    // checkpoint, which restore refuses and discard (or the next checkpoint here) removes.
    std::fs::create_dir_all(dir).map_err(|e| state_error(dir, e))?;
    write_marker(dir, &[])?;
    std::fs::create_dir_all(&images).map_err(|e| state_error(&images, e))?;
    Ok(Begun {
        criu,
        root,
        surveyed,
        work_state,
        images,
        state_path: dir.join(protocol::state::STATE_FILE_NAME),
        dir_existed,
        store,
        _locks: (tree_lock, dir_lock),
    })
}

/// Removes the start of a checkpoint that failed before its dump: the images' directory, the
/// marker, and the directory if this run made it.
fn remove_started(dir: &Path, dir_existed: bool) {
    let _ = std::fs::remove_dir(dir.join(IMAGES_DIR));
    let _ = std::fs::remove_file(dir.join(INCOMPLETE_MARKER));
    if !dir_existed {
        let _ = std::fs::remove_dir(dir);
    }
}

/// No manifest, no restorable checkpoint: the state file, the digests, a manifest and signature
/// written before the failure and CRIU's link remaps go; the images stay with CRIU's dump log
/// for diagnosis.
fn remove_unpublished(
    dir: &Path,
    state_path: &Path,
    link_remaps: &[protocol::manifest::LinkRemap],
) {
    let _ = std::fs::remove_file(state_path);
    let _ = std::fs::remove_file(dir.join(IMAGE_DIGESTS));
    let _ = std::fs::remove_file(dir.join(manifest::MANIFEST_FILE_NAME));
    let _ = std::fs::remove_file(dir.join(super::SIGNATURE_FILE));
    if let Err(e) = crate::remaps::discard(link_remaps) {
        tracing::warn!(error = %e, "removing the link remaps of a failed checkpoint");
    }
}

/// What a checkpoint writes once CRIU has dumped the tree, and from what.
struct Written<'a> {
    tree: &'a Tree<'a>,
    dir: &'a PathBuf,
    /// The group's state file while the checkpoint is not complete.
    work_state: &'a Path,
    /// The state file's place in the checkpoint.
    state_path: &'a Path,
    gpus: &'a [protocol::manifest::GpuInfo],
    signing_key: &'a Path,
}

impl Written<'_> {
    /// CRIU's link remaps taken over (and listed in the marker at once: a checkpoint killed from
    /// here on leaves them to discard), the image digests, the state file, the manifest and its
    /// signature; then the marker goes: the checkpoint is complete. The manifest and the images'
    /// bytes.
    fn publish(
        &self,
        clock: &mut Clock<'_>,
        link_remaps: &mut Vec<protocol::manifest::LinkRemap>,
    ) -> Result<(Manifest, u64), ControlError> {
        let (dir, images) = (self.dir, self.dir.join(IMAGES_DIR));
        let placement = &self.tree.surveyed.placement;
        let links = criu::images::link_remaps(&images).map_err(ControlError::Criu)?;
        // A tree in a container keeps them in its own filesystems: copied into the checkpoint.
        let copy_into = placement.in_container().then_some(dir.as_path());
        *link_remaps = crate::remaps::take_over(self.tree.root, &links, copy_into)?;
        write_marker(dir, link_remaps)?;
        let image_bytes = criu::directory_bytes(&images);
        let progress = clock.progress();
        clock.time(
            "image-digest",
            Some(image_bytes),
            || -> Result<_, ControlError> {
                let list = digest_images(&images, progress)?;
                transport::files::write_atomically(&dir.join(IMAGE_DIGESTS), list.as_bytes())
                    .map_err(|e| state_error(dir, e))?;
                Ok(((), image_bytes, 0.0))
            },
        )?;
        let state_bytes =
            transport::files::read_bounded(self.work_state, statefile::STATE_FILE_LIMIT)
                .map_err(|e| state_error(self.work_state, e))?;
        transport::files::write_atomically(self.state_path, &state_bytes)
            .map_err(|e| state_error(self.state_path, e))?;
        let criu_info = CriuInfo {
            version: self.tree.criu.version().to_string(),
            image_bytes,
            link_remaps: link_remaps.clone(),
            tcp_established: self.tree.surveyed.tcp_established,
            shared_namespaces: self.tree.surveyed.namespaces.namespaces.clone(),
            placement: placement.clone(),
        };
        let manifest = build_manifest(
            self.tree.captured,
            &self.tree.surveyed.sockets,
            self.gpus,
            self.tree.driver,
            criu_info,
            clock,
            self.state_path,
        )?;
        let manifest = Manifest {
            data_files: self.tree.files.entries(),
            ..manifest
        };
        transport::files::write_atomically(
            &dir.join(manifest::MANIFEST_FILE_NAME),
            &manifest::encode(&manifest),
        )
        .map_err(|e| state_error(dir, e))?;
        super::signing::sign(dir, self.signing_key)?;
        // The manifest references the blocks now.
        self.tree.files.remove_pending();
        let marker = dir.join(INCOMPLETE_MARKER);
        std::fs::remove_file(&marker).map_err(|e| state_error(&marker, e))?;
        Ok((manifest, image_bytes))
    }
}

/// What the checks before a checkpoint found out about the tree, for the dump and the manifest.
struct Surveyed {
    container: Option<crate::container::Container>,
    /// The root's PID where CRIU runs (inside its container, or this namespace's).
    criu_pid: u32,
    placement: CriuPlacement,
    sockets: Vec<(u32, Vec<String>)>,
    tcp_established: bool,
    namespaces: crate::namespaces::Shared,
}

/// Everything CRIU cannot dump, refused before anything changes: a controlling terminal, a tree
/// in a container CRIU cannot run in, replaced mappings, TCP peers outside the tree (`tcp`);
/// and where CRIU runs.
fn survey(root: u32, tree: &[u32], criu: &criu::Criu) -> Result<Surveyed, ControlError> {
    if let Some(&pid) = tree.iter().find(|&&pid| has_terminal(pid)) {
        // With a terminal CRIU needs --shell-job and the restore the same terminal; a workload
        // started by `cuinterpose run --pid-namespace` runs in a new session without one.
        let label = discovery::describe(pid)
            .map(|i| i.label())
            .unwrap_or_else(|_| format!("pid {pid}"));
        return Err(refuse(
            &label,
            "has a controlling terminal, which a restore cannot bring back; start the workload \
             with `cuinterpose run --pid-namespace` (a new session) with stdio on files"
                .into(),
        ));
    }
    // A tree in a container is dumped by CRIU run inside it (crate::container), which only the
    // bundled CRIU can be; the PID CRIU is given is the root's there.
    let container = container_of(root, tree)?;
    let (criu_pid, placement) = match &container {
        Some(c) => {
            criu.check_runs_inside()
                .map_err(|e| refuse("criu", e.to_string()))?;
            let placement = if c.is_init() {
                let label = discovery::describe(root)
                    .map(|i| i.label())
                    .unwrap_or_else(|_| format!("pid {root}"));
                CriuPlacement::ContainerInit {
                    node_mounts: c.node_mounts(&label)?,
                }
            } else {
                CriuPlacement::BelowContainerInit
            };
            (c.pid_inside(root)?, placement)
        }
        None => (root, CriuPlacement::Host),
    };
    let replaced = replaced_mappings(tree);
    if !replaced.is_empty() {
        return Err(ControlError::Refused(replaced));
    }
    let sockets = tree_sockets(tree);
    let tcp = crate::tcp::survey(tree)?;
    Ok(Surveyed {
        container,
        criu_pid,
        placement,
        sockets,
        tcp_established: tcp.connected_within > 0,
        namespaces: crate::namespaces::Shared::of(root)?,
    })
}

/// The block store beside the checkpoint (`None` with `--self-contained`), made in the
/// directory's parent (created if need be) and owned by the tree's user.
fn open_store(
    options: &CheckpointOptions,
    root: u32,
) -> Result<Option<super::store::BlockStore>, ControlError> {
    if options.self_contained {
        return Ok(None);
    }
    let dir = &options.dir;
    let owner = std::fs::metadata(format!("/proc/{root}"))
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| state_error(parent, e))?;
    }
    super::store::BlockStore::create(dir, owner).map(Some)
}

/// Bytes the checkpoint wrote (into data files, or blocks new to the store), bytes of blocks the
/// store held already, and bytes of zero blocks left out.
pub(super) fn data_totals(entries: &[protocol::manifest::DataFileEntry]) -> (u64, u64, u64) {
    let written: u64 = entries.iter().map(|e| e.written_bytes).sum();
    let shared: u64 = entries.iter().map(|e| e.shared_bytes).sum();
    let held: u64 = entries
        .iter()
        .flat_map(|e| &e.extents)
        .map(|x| x.size)
        .sum();
    (written, shared, held.saturating_sub(written + shared))
}

/// After a checkpoint into a block store failed and was rolled back: the blocks it wrote that no
/// checkpoint references go (a full disk is left as it was found). Blocks another checkpoint
/// references stay, as after any `discard`; a collection that cannot run is only logged (the
/// next `discard` in the store collects them).
fn collect_after_failure(files: &DataFiles) {
    if let Some(Err(e)) = files.store().map(|store| store.collect()) {
        tracing::warn!(error = %e, "collecting the blocks of a failed checkpoint");
    }
}

/// What a checkpoint does to the tree once its capture is done: the seam between the checkpoint's
/// order of steps and CRIU, the tree's processes and the shims, so that the rollback of a failed
/// dump is unit-tested ([`dump_and_publish`]).
trait Dumped {
    /// CRIU's dump of the tree, which leaves it stopped.
    fn dump(&self, clock: &mut Clock<'_>) -> Result<(), ControlError>;
    /// Continues the stopped tree, so that its shims answer again.
    fn continue_tree(&self) -> Result<(), ControlError>;
    /// Native restore and the rebuild in place, from the data files.
    fn resume_in_place(&self, clock: &mut Clock<'_>) -> Result<(), ControlError>;
    /// Ends the dumped tree (what CRIU does after a dump without `--leave-running`).
    fn end(&self, clock: &mut Clock<'_>) -> Result<(), ControlError>;
}

/// The tree under a checkpoint, as it really is.
struct Tree<'a> {
    root: u32,
    criu: &'a criu::Criu,
    surveyed: &'a Surveyed,
    images: &'a Path,
    options: &'a SuspendOptions,
    captured: &'a [Snapshot],
    driver: &'a Driver,
    files: &'a DataFiles,
}

impl Dumped for Tree<'_> {
    fn dump(&self, clock: &mut Clock<'_>) -> Result<(), ControlError> {
        let surveyed = self.surveyed;
        clock.time("criu-dump", None, || {
            self.criu
                .dump(
                    surveyed.criu_pid,
                    self.images,
                    surveyed.tcp_established,
                    &surveyed.namespaces.dump_args(),
                    (surveyed.container.as_ref(), &surveyed.placement),
                )
                .map_err(ControlError::Criu)?;
            Ok(((), criu::directory_bytes(self.images), 0.0))
        })
    }

    fn continue_tree(&self) -> Result<(), ControlError> {
        crate::launch::continue_tree(self.root).map_err(|e| ControlError::Step {
            step: "continuing the dumped tree",
            process: format!("pid {}", self.root),
            source: Box::new(e.into()),
        })
    }

    fn resume_in_place(&self, clock: &mut Clock<'_>) -> Result<(), ControlError> {
        resume_in_place(self.options, self.captured, self.driver, self.files, clock)
    }

    fn end(&self, clock: &mut Clock<'_>) -> Result<(), ControlError> {
        clock.time("stop", None, || {
            crate::launch::kill_tree(self.root, KILL_TIMEOUT)
                .map(|()| ((), 0, 0.0))
                .map_err(|e| ControlError::Step {
                    step: "stopping the dumped tree (the checkpoint is complete)",
                    process: format!("pid {}", self.root),
                    source: Box::new(e.into()),
                })
        })
    }
}

/// The dump and what follows it: CRIU dumps the tree (which it leaves stopped) and `publish`
/// writes the checkpoint, listing the link remaps it took over; then the tree is ended, or with
/// `leave_running` continued and rebuilt in place. Until the checkpoint is complete any failure
/// (CRIU's, or reading its images, or writing the digests or the manifest) is rolled back:
/// `unpublish` removes what was written, the tree is continued and rebuilt in place, and the
/// workload runs on.
fn dump_and_publish<T>(
    tree: &dyn Dumped,
    clock: &mut Clock<'_>,
    leave_running: bool,
    publish: impl FnOnce(&mut Clock<'_>, &mut Vec<LinkRemap>) -> Result<T, ControlError>,
    unpublish: impl FnOnce(&[LinkRemap]),
) -> Result<T, CheckpointError> {
    let mut link_remaps = Vec::new();
    let published = tree
        .dump(clock)
        .and_then(|()| publish(clock, &mut link_remaps));
    let done = match published {
        Ok(done) => done,
        Err(e) => {
            unpublish(&link_remaps);
            let rollback = tree
                .continue_tree()
                .and_then(|()| tree.resume_in_place(clock));
            return Err(match rollback {
                Ok(()) => CheckpointError::RolledBack {
                    failure: Box::new(e),
                },
                Err(r) => CheckpointError::RollbackFailed {
                    failure: Box::new(e),
                    rollback: Box::new(r),
                },
            });
        }
    };
    let after = if leave_running {
        // The link remaps stay: the checkpoint is restored through them once this tree is gone.
        tree.continue_tree()
            .and_then(|()| tree.resume_in_place(clock))
    } else {
        tree.end(clock)
    };
    after.map(|()| done).map_err(CheckpointError::Complete)
}

/// After a dump with `--leave-running` (or a failed one): native restore and rebuild in place.
fn resume_in_place(
    options: &SuspendOptions,
    captured: &[Snapshot],
    driver: &Driver,
    files: &DataFiles,
    clock: &mut Clock<'_>,
) -> Result<(), ControlError> {
    let mut group = Group::discover(options.root, options.config.answer_timeout)?;
    clock.time("native-restore", None, || {
        crate::native_steps::native_restore(driver, &group, &[]).map(|()| ((), 0, 0.0))
    })?;
    let state = group_capture::state_of(captured, options.mode);
    finish_rebuild(&mut group, &state, clock, Bytes::Files(files)).map(|_| ())
}

/// Name of the marker of an incomplete checkpoint: written before anything else, removed once the
/// manifest is complete. It lists the link remaps the checkpoint already keeps outside its
/// directory (JSON), so that discarding it removes those too.
pub const INCOMPLETE_MARKER: &str = "cuinterpose.incomplete";

fn write_marker(
    dir: &std::path::Path,
    remaps: &[protocol::manifest::LinkRemap],
) -> Result<(), ControlError> {
    let path = dir.join(INCOMPLETE_MARKER);
    let text =
        serde_json::to_vec(remaps).map_err(|e| state_error(&path, std::io::Error::other(e)))?;
    transport::files::write_atomically(&path, &text).map_err(|e| state_error(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Quiet;
    use std::cell::RefCell;

    /// A tree whose steps succeed except the ones named, and that logs each step it was asked.
    #[derive(Default)]
    struct Scripted {
        fails: Vec<&'static str>,
        log: RefCell<Vec<&'static str>>,
    }

    impl Scripted {
        fn failing(steps: &[&'static str]) -> Scripted {
            Scripted {
                fails: steps.to_vec(),
                ..Scripted::default()
            }
        }

        fn step(&self, name: &'static str) -> Result<(), ControlError> {
            self.log.borrow_mut().push(name);
            if self.fails.contains(&name) {
                Err(ControlError::Protocol {
                    process: "pid 7".into(),
                    message: format!("{name} failed"),
                })
            } else {
                Ok(())
            }
        }
    }

    impl Dumped for Scripted {
        fn dump(&self, _clock: &mut Clock<'_>) -> Result<(), ControlError> {
            self.step("dump")
        }
        fn continue_tree(&self) -> Result<(), ControlError> {
            self.step("continue")
        }
        fn resume_in_place(&self, _clock: &mut Clock<'_>) -> Result<(), ControlError> {
            self.step("resume in place")
        }
        fn end(&self, _clock: &mut Clock<'_>) -> Result<(), ControlError> {
            self.step("end")
        }
    }

    /// What a run of [`dump_and_publish`] did: its result, the steps it asked of the tree (with
    /// `publish` and `unpublish` among them), and the link remaps `unpublish` was given.
    fn run(
        tree: &Scripted,
        leave_running: bool,
        publish_fails: bool,
    ) -> (
        Result<u32, CheckpointError>,
        Vec<&'static str>,
        Vec<LinkRemap>,
    ) {
        let unpublished = RefCell::new(Vec::new());
        let result = dump_and_publish(
            tree,
            &mut Clock::new(&Quiet),
            leave_running,
            |_, remaps| {
                tree.log.borrow_mut().push("publish");
                // Taken over before the failure: unpublish must get them.
                remaps.push(LinkRemap {
                    link: "/dev/shm/link_remap.1".into(),
                    kept_as: "/dev/shm/link_remap.1.cuinterpose-0123456789abcdef".into(),
                });
                if publish_fails {
                    Err(ControlError::Protocol {
                        process: "tool".into(),
                        message: "manifest not written".into(),
                    })
                } else {
                    Ok(7)
                }
            },
            |remaps| {
                tree.log.borrow_mut().push("unpublish");
                unpublished.borrow_mut().extend_from_slice(remaps);
            },
        );
        (result, tree.log.take(), unpublished.take())
    }

    #[test]
    fn a_failed_dump_continues_the_tree_and_rebuilds_it_in_place() {
        let tree = Scripted::failing(&["dump"]);
        let (result, steps, _) = run(&tree, false, false);
        assert_eq!(
            steps,
            ["dump", "unpublish", "continue", "resume in place"],
            "nothing published, nothing ended"
        );
        let Err(CheckpointError::RolledBack { failure }) = result else {
            panic!("{result:?}");
        };
        assert_eq!(failure.to_string(), "pid 7: protocol error: dump failed");
    }

    #[test]
    fn a_checkpoint_not_published_is_unpublished_with_its_link_remaps_then_rolled_back() {
        let tree = Scripted::default();
        let (result, steps, unpublished) = run(&tree, false, true);
        assert_eq!(
            steps,
            [
                "dump",
                "publish",
                "unpublish",
                "continue",
                "resume in place"
            ]
        );
        assert_eq!(unpublished.len(), 1);
        assert!(matches!(result, Err(CheckpointError::RolledBack { .. })));
    }

    #[test]
    fn a_rollback_that_fails_is_reported_with_the_failure_it_undid() {
        for failing in ["continue", "resume in place"] {
            let tree = Scripted::failing(&["dump", failing]);
            let (result, steps, _) = run(&tree, false, false);
            let Err(CheckpointError::RollbackFailed { failure, rollback }) = result else {
                panic!("{result:?}");
            };
            assert!(failure.to_string().ends_with("dump failed"));
            assert!(rollback.to_string().ends_with(&format!("{failing} failed")));
            // A tree that could not be continued is not rebuilt.
            assert_eq!(steps.last(), Some(&failing));
        }
    }

    #[test]
    fn a_complete_checkpoint_ends_the_tree_or_with_leave_running_rebuilds_it() {
        let (result, steps, _) = run(&Scripted::default(), false, false);
        assert!(matches!(result, Ok(7)));
        assert_eq!(steps, ["dump", "publish", "end"]);
        let (result, steps, _) = run(&Scripted::default(), true, false);
        assert!(matches!(result, Ok(7)));
        assert_eq!(steps, ["dump", "publish", "continue", "resume in place"]);
        // Complete on disk: a failure after it is no rollback, and nothing is unpublished.
        let (result, steps, unpublished) = run(&Scripted::failing(&["end"]), false, false);
        assert!(
            matches!(result, Err(CheckpointError::Complete(_))),
            "{result:?}"
        );
        assert_eq!(steps, ["dump", "publish", "end"]);
        assert!(unpublished.is_empty());
    }

    /// The exit codes users script against (docs/recovery.md), pinned per variant of
    /// `CheckpointError`: a wrapped error keeps its own class and message (a refusal before the
    /// capture, the capture's rollback, a failure once the checkpoint is complete), a dump rolled
    /// back is rolled back (4) and one whose rollback failed needs attention (5), with the
    /// messages a suspend's rollbacks give.
    #[test]
    fn each_checkpoint_failure_is_classified_by_what_it_left() {
        let refused = CheckpointError::from(refuse(
            "pid 7",
            "has a controlling terminal, which a restore cannot bring back".into(),
        ));
        assert_eq!(refused.class(), ErrorClass::Refused);
        let another_run = CheckpointError::from(ControlError::AnotherRun {
            process: "checkpoint /c".into(),
            message: "held".into(),
        });
        assert_eq!(another_run.class(), ErrorClass::Refused);
        assert_eq!(another_run.to_string(), "checkpoint /c: held");
        let unwritable = CheckpointError::from(state_error(
            Path::new("/c"),
            std::io::Error::other("denied"),
        ));
        assert_eq!(unwritable.class(), ErrorClass::Error);
        let inner = || Box::new(ControlError::NoSuchProcess(7));
        let capture_rolled_back =
            CheckpointError::NotCaptured(SuspendError::RolledBack { failure: inner() });
        assert_eq!(capture_rolled_back.class(), ErrorClass::RolledBack);
        let capture_not_rolled_back = CheckpointError::NotCaptured(SuspendError::RollbackFailed {
            failure: inner(),
            rollback: vec![ControlError::NoSuchProcess(8)],
        });
        assert_eq!(capture_not_rolled_back.class(), ErrorClass::NeedsAttention);
        let suspended = CheckpointError::Suspended(ControlError::Driver {
            call: "cuDeviceGetCount",
            result: cuda_abi::CUresult::ERROR_UNKNOWN,
        });
        assert_eq!(suspended.class(), ErrorClass::NeedsAttention);
        let driver_gone = CheckpointError::Suspended(ControlError::DriverLoad {
            name: "libcuda.so.1".into(),
            source: libloading::Error::DlOpenUnknown,
        });
        assert_eq!(driver_gone.class(), ErrorClass::NeedsAttention);
        let failure = || {
            Box::new(ControlError::Protocol {
                process: "pid 7".into(),
                message: "dump failed".into(),
            })
        };
        let rolled_back = CheckpointError::RolledBack { failure: failure() };
        assert_eq!(rolled_back.class(), ErrorClass::RolledBack);
        assert_eq!(
            rolled_back.to_string(),
            SuspendError::RolledBack { failure: failure() }.to_string()
        );
        let continuing = || ControlError::Step {
            step: "continuing the dumped tree",
            process: "pid 7".into(),
            source: Box::new(ControlError::NoSuchProcess(7)),
        };
        let rollback_failed = CheckpointError::RollbackFailed {
            failure: failure(),
            rollback: Box::new(continuing()),
        };
        assert_eq!(rollback_failed.class(), ErrorClass::NeedsAttention);
        assert_eq!(
            rollback_failed.to_string(),
            SuspendError::RollbackFailed {
                failure: failure(),
                rollback: vec![continuing()],
            }
            .to_string()
        );
        let not_ended = CheckpointError::Complete(ControlError::Step {
            step: "stopping the dumped tree (the checkpoint is complete)",
            process: "pid 7".into(),
            source: Box::new(ControlError::NoSuchProcess(7)),
        });
        assert_eq!(not_ended.class(), ErrorClass::NeedsAttention);
        let not_found_again = CheckpointError::Complete(ControlError::NoSuchProcess(7));
        assert_eq!(not_found_again.class(), ErrorClass::NeedsAttention);
    }
}
