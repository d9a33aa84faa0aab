//! Checkpoint to disk and restore into new processes: the capture of a suspend, then a CRIU dump of
//! the process tree; on restore, CRIU brings the tree back, then native restore (optionally onto other
//! GPUs) and the same rebuild a resume does.
//!
//! A checkpoint directory holds `manifest.json`, `cuinterpose.state` and `images/` (CRIU's). Restore
//! checks all of it before it changes anything, and never writes into the directory except CRIU's own
//! restore log.

use crate::capture::{self, Clock, Progress, Report, SuspendOptions};
use crate::criu::{self, Criu};
use crate::discovery;
use crate::group::{ANSWER_TIMEOUT, Group, Snapshot};
use crate::native::{self, Driver};
use crate::{ControlError, Refusal};
use protocol::manifest::{
    self, ByteCounts, CriuInfo, GpuInfo, Manifest, ManifestParticipant, Role, ShimIdentity,
    StateFileRef,
};
use protocol::state::GroupState;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Sub-directory of CRIU's images in a checkpoint directory.
pub const IMAGES_DIR: &str = "images";

/// Options of `cuinterpose checkpoint`.
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    pub capture: SuspendOptions,
    pub dir: PathBuf,
    pub leave_running: bool,
    pub criu: Option<PathBuf>,
}

/// What a checkpoint or restore did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiskReport {
    #[serde(flatten)]
    pub report: Report,
    pub dir: PathBuf,
    pub image_bytes: u64,
    /// Host PID of the tree's root: the dumped one, or the restored one.
    pub root: u32,
}

/// The init of the workload's PID namespace: `root` itself, or its only child that is one.
pub fn namespace_root(root: u32) -> Result<u32, ControlError> {
    let info = discovery::describe(root)?;
    if info.ns_pid == 1 {
        return Ok(root);
    }
    let inits: Vec<u32> = discovery::process_tree(root)?
        .into_iter()
        .skip(1)
        .filter_map(|pid| discovery::describe(pid).ok())
        .filter(|p| p.ns_pid == 1 && p.pid_namespace != info.pid_namespace)
        .map(|p| p.host_pid)
        .collect();
    match inits.as_slice() {
        [init] => Ok(*init),
        _ => Err(ControlError::Refused(vec![Refusal {
            process: info.label(),
            reason: "checkpoint to disk needs the workload as the root of its own PID namespace \
                     (start it with `cuinterpose run --pid-namespace`)"
                .into(),
        }])),
    }
}

fn state_error(path: &Path, e: impl std::fmt::Display) -> ControlError {
    ControlError::State {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Captures the group under `options.capture.root` and dumps it with CRIU into `options.dir`.
pub fn checkpoint(
    options: &CheckpointOptions,
    progress: &dyn Progress,
) -> Result<DiskReport, ControlError> {
    let start = Instant::now();
    let criu = Criu::locate(options.criu.as_deref()).map_err(ControlError::Criu)?;
    let root = namespace_root(options.capture.root)?;
    let dir = &options.dir;
    if dir.join(manifest::MANIFEST_FILE_NAME).exists() {
        return Err(state_error(
            dir,
            "already holds a checkpoint; choose another --dir",
        ));
    }
    let images = dir.join(IMAGES_DIR);
    std::fs::create_dir_all(&images).map_err(|e| state_error(&images, e))?;
    let state_path = dir.join(protocol::state::STATE_FILE_NAME);
    let tree = discovery::process_tree(root)?;
    let sockets = tree_sockets(&tree);
    let shell_job = tree.iter().any(|&pid| has_terminal(pid));

    let mut clock = Clock::new(progress);
    let capture_options = SuspendOptions {
        root,
        ..options.capture.clone()
    };
    let (group, captured) = capture::capture(&capture_options, &state_path, &mut clock)?;
    let driver = Driver::load(capture_options.driver.as_deref())?;
    let gpus = gpu_list(&driver)?;
    // CRIU must see no connection from outside the tree.
    drop(group);

    let dumped = clock.time("criu-dump", None, || {
        criu.dump(root, &images, options.leave_running, shell_job)
            .map(|()| ((), 0, 0.0))
            .map_err(ControlError::Criu)
    });
    if let Err(e) = dumped {
        // CRIU leaves the tree running when a dump fails: bring it back as a resume would.
        let _ = std::fs::remove_file(&state_path);
        let rollback = resume_in_place(root, &captured, &driver, &mut clock);
        return Err(match rollback {
            Ok(()) => ControlError::RolledBack {
                failure: Box::new(e),
            },
            Err(r) => ControlError::RollbackFailed {
                failure: Box::new(e),
                rollback: vec![r],
            },
        });
    }
    let image_bytes = criu::directory_bytes(&images);
    let manifest = build_manifest(
        &captured,
        &sockets,
        &gpus,
        &driver,
        &criu,
        image_bytes,
        &clock,
        &state_path,
    )?;
    transport::files::write_atomically(
        &dir.join(manifest::MANIFEST_FILE_NAME),
        &manifest::encode(&manifest),
    )
    .map_err(|e| state_error(dir, e))?;

    if options.leave_running {
        resume_in_place(root, &captured, &driver, &mut clock)?;
    }
    let shared_bytes = manifest.bytes.shared_saved;
    Ok(DiskReport {
        report: Report {
            participants: capture::summarize(&captured),
            phases: clock.phases,
            shared_bytes,
            state_file: state_path,
            total_millis: start.elapsed().as_secs_f64() * 1e3,
        },
        dir: dir.clone(),
        image_bytes,
        root,
    })
}

/// After a dump with `--leave-running` (or a failed one): native restore and rebuild in place.
fn resume_in_place(
    root: u32,
    captured: &[Snapshot],
    driver: &Driver,
    clock: &mut Clock<'_>,
) -> Result<(), ControlError> {
    let mut group = Group::discover(root, ANSWER_TIMEOUT)?;
    clock.time("native-restore", None, || {
        capture::native_restore(driver, &group, &[]).map(|()| ((), 0, 0.0))
    })?;
    let state = capture::state_of(captured);
    capture::finish_rebuild(&mut group, &state, clock).map(|_| ())
}

/// Listening socket paths of the tree (as the processes name them): CRIU binds them again at
/// restore, so stale files must be gone by then.
fn tree_sockets(tree: &[u32]) -> Vec<(u32, Vec<String>)> {
    tree.iter()
        .map(|&pid| {
            let paths = discovery::listening_sockets(pid).unwrap_or_default();
            (
                pid,
                paths
                    .into_iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect(),
            )
        })
        .collect()
}

/// Whether the process has a controlling terminal (CRIU then needs `--shell-job`).
fn has_terminal(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.get(stat.rfind(')')? + 1..)?.to_string();
            after.split_whitespace().nth(4)?.parse::<i64>().ok()
        })
        .is_some_and(|tty| tty != 0)
}

fn gpu_list(driver: &Driver) -> Result<Vec<GpuInfo>, ControlError> {
    Ok(driver
        .device_uuids()?
        .iter()
        .enumerate()
        .map(|(ordinal, uuid)| GpuInfo {
            ordinal: ordinal as u32,
            uuid: native::format_uuid(uuid),
        })
        .collect())
}

#[allow(clippy::too_many_arguments)]
fn build_manifest(
    captured: &[Snapshot],
    sockets: &[(u32, Vec<String>)],
    gpus: &[GpuInfo],
    driver: &Driver,
    criu: &Criu,
    image_bytes: u64,
    clock: &Clock<'_>,
    state_path: &Path,
) -> Result<Manifest, ControlError> {
    let state_bytes = transport::files::read_bounded(state_path, capture::STATE_FILE_LIMIT)
        .map_err(|e| state_error(state_path, e))?;
    let first = captured.first().ok_or(ControlError::NoCudaProcesses(0))?;
    let shared_saved: u64 = captured
        .iter()
        .flat_map(|s| &s.record.allocations)
        .filter(|a| a.shared)
        .map(|a| a.size)
        .sum();
    Ok(Manifest {
        format: manifest::MANIFEST_FORMAT.to_string(),
        version: manifest::MANIFEST_VERSION,
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        tool_version: crate::VERSION.to_string(),
        participants: captured
            .iter()
            .map(|s| ManifestParticipant {
                host_pid: s.info.host_pid,
                ns_pid: s.info.ns_pid,
                command_line: s.info.command.split(' ').map(str::to_string).collect(),
                role: Role::of(&s.record),
                gpus: gpus.to_vec(),
                sockets: sockets
                    .iter()
                    .find(|(pid, _)| *pid == s.info.host_pid)
                    .map(|(_, paths)| paths.clone())
                    .unwrap_or_default(),
            })
            .collect(),
        shim: ShimIdentity {
            path: first
                .info
                .shim
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            sha256: first.hello.shim_sha256.clone(),
        },
        driver_version: driver.version(),
        bytes: ByteCounts {
            shared_saved,
            carriers: shared_saved,
        },
        criu: Some(CriuInfo {
            version: criu.version().to_string(),
            image_bytes,
        }),
        timings: clock
            .phases
            .iter()
            .map(|p| manifest::PhaseTiming {
                phase: p.name.to_string(),
                ms: p.millis.round() as u64,
            })
            .collect(),
        state: StateFileRef {
            file: protocol::state::STATE_FILE_NAME.to_string(),
            bytes: state_bytes.len() as u64,
            sha256: manifest::sha256_hex(&state_bytes),
        },
    })
}

/// Options of `cuinterpose restore`.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub dir: PathBuf,
    /// `OLD=NEW` device ordinals: the GPU recorded as OLD is restored onto the current GPU NEW.
    pub device_map: Vec<(u32, u32)>,
    pub criu: Option<PathBuf>,
    pub driver: Option<PathBuf>,
}

/// Everything a restore checks before it changes anything.
struct Verified {
    manifest: Manifest,
    state: GroupState,
    criu: Criu,
    driver: Driver,
    gpu_pairs: Vec<(cuda_abi::CUuuid, cuda_abi::CUuuid)>,
}

fn refuse(process: &str, reason: String) -> ControlError {
    ControlError::Refused(vec![Refusal {
        process: process.to_string(),
        reason,
    }])
}

fn verify_checkpoint(options: &RestoreOptions) -> Result<Verified, ControlError> {
    let dir = &options.dir;
    let manifest_path = dir.join(manifest::MANIFEST_FILE_NAME);
    let manifest_bytes =
        transport::files::read_bounded(&manifest_path, manifest::MAX_MANIFEST_LEN as u64)
            .map_err(|e| state_error(&manifest_path, e))?;
    let manifest = manifest::decode(&manifest_bytes).map_err(|e| state_error(&manifest_path, e))?;
    let state_path = dir.join(&manifest.state.file);
    let state_bytes = transport::files::read_bounded(&state_path, capture::STATE_FILE_LIMIT)
        .map_err(|e| state_error(&state_path, e))?;
    let state = manifest
        .verify_state(&state_bytes)
        .map_err(|e| state_error(&state_path, e))?;
    let images = dir.join(IMAGES_DIR);
    if criu::directory_bytes(&images) == 0 {
        return Err(state_error(&images, "holds no CRIU images"));
    }
    let criu = Criu::locate(options.criu.as_deref()).map_err(ControlError::Criu)?;

    // The shim must be the same bytes at the same path: CRIU maps it back from there.
    let shim_path = Path::new(&manifest.shim.path);
    let shim_bytes = std::fs::read(shim_path).map_err(|e| {
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
            if info
                .command
                .split(' ')
                .map(str::to_string)
                .collect::<Vec<_>>()
                == p.command_line
            {
                return Err(refuse(
                    &info.label(),
                    "the checkpointed process is still running; stop the original group first"
                        .into(),
                ));
            }
        }
    }
    Ok(Verified {
        manifest,
        state,
        criu,
        driver,
        gpu_pairs,
    })
}

/// The native restore's GPU pairs from `--device-map`, checked against the recorded and present GPUs.
fn gpu_pairs(
    manifest: &Manifest,
    driver: &Driver,
    device_map: &[(u32, u32)],
) -> Result<Vec<(cuda_abi::CUuuid, cuda_abi::CUuuid)>, ControlError> {
    let recorded: Vec<GpuInfo> = manifest
        .participants
        .first()
        .map(|p| p.gpus.clone())
        .unwrap_or_default();
    let present = driver.device_uuids()?;
    let present_text: Vec<String> = present.iter().map(native::format_uuid).collect();
    let mut pairs = Vec::new();
    let mut targets = std::collections::HashSet::new();
    for &(old, new) in device_map {
        let old_gpu = recorded.iter().find(|g| g.ordinal == old).ok_or_else(|| {
            refuse(
                "--device-map",
                format!(
                    "device {old} is not among the {} recorded GPUs",
                    recorded.len()
                ),
            )
        })?;
        let new_uuid = present.get(new as usize).ok_or_else(|| {
            refuse(
                "--device-map",
                format!("device {new} does not exist here ({} GPUs)", present.len()),
            )
        })?;
        if !targets.insert(new) {
            return Err(refuse(
                "--device-map",
                format!("device {new} is the target of two mappings"),
            ));
        }
        let old_uuid = native::parse_uuid(&old_gpu.uuid).ok_or_else(|| {
            refuse(
                "checkpoint",
                format!("recorded GPU UUID {} is malformed", old_gpu.uuid),
            )
        })?;
        pairs.push((old_uuid, *new_uuid));
    }
    for gpu in &recorded {
        let mapped = device_map.iter().any(|&(old, _)| old == gpu.ordinal);
        if !mapped && !present_text.contains(&gpu.uuid) {
            return Err(refuse(
                "checkpoint",
                format!(
                    "GPU {} ({}) is not present; map it with --device-map {}=NEW",
                    gpu.ordinal, gpu.uuid, gpu.ordinal
                ),
            ));
        }
    }
    Ok(pairs)
}

/// Removes the recorded sockets that nothing listens on any more; refuses if one still answers.
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

/// Restores the checkpoint in `options.dir` into new processes.
pub fn restore(
    options: &RestoreOptions,
    progress: &dyn Progress,
) -> Result<DiskReport, ControlError> {
    let start = Instant::now();
    let mut clock = Clock::new(progress);
    let verified = clock.time("verify-checkpoint", None, || {
        verify_checkpoint(options).map(|v| (v, 0, 0.0))
    })?;
    remove_stale_sockets(&verified.manifest)?;
    let images = options.dir.join(IMAGES_DIR);
    let shell_job = false;
    let root = clock.time("criu-restore", None, || {
        verified
            .criu
            .restore(&images, shell_job)
            .map(|pid| (pid, 0, 0.0))
            .map_err(ControlError::Criu)
    })?;
    // From here on a failure must not leave a half-restored tree running.
    let rebuilt = rebuild_restored(root, &verified, &mut clock);
    let (participants, shared_bytes) = match rebuilt {
        Ok(done) => done,
        Err(e) => {
            kill_tree(root);
            return Err(e);
        }
    };
    Ok(DiskReport {
        report: Report {
            participants,
            phases: clock.phases,
            shared_bytes,
            state_file: options.dir.join(protocol::state::STATE_FILE_NAME),
            total_millis: start.elapsed().as_secs_f64() * 1e3,
        },
        dir: options.dir.clone(),
        image_bytes: criu::directory_bytes(&images),
        root,
    })
}

fn rebuild_restored(
    root: u32,
    verified: &Verified,
    clock: &mut Clock<'_>,
) -> Result<(Vec<capture::ParticipantSummary>, u64), ControlError> {
    let mut group = Group::discover(root, ANSWER_TIMEOUT)?;
    // Host PIDs are new; namespace PIDs are what CRIU kept.
    let mut state = verified.state.clone();
    for captured in &mut state.participants {
        let restored = group
            .participants
            .iter()
            .find(|p| p.info.ns_pid == captured.ns_pid)
            .ok_or_else(|| {
                refuse(
                    &format!("ns pid {}", captured.ns_pid),
                    "was checkpointed but is missing after restore".into(),
                )
            })?;
        captured.host_pid = restored.info.host_pid;
    }
    capture::match_participants(&mut group, &state)?;
    clock.time("native-restore", None, || {
        capture::native_restore(&verified.driver, &group, &verified.gpu_pairs)
            .map(|()| ((), 0, 0.0))
    })?;
    capture::finish_rebuild(&mut group, &state, clock)
}

/// SIGKILL to every process of a tree, children first.
fn kill_tree(root: u32) {
    let tree = discovery::process_tree(root).unwrap_or_else(|_| vec![root]);
    for pid in tree.iter().rev() {
        if let Ok(pid) = rustix::process::Pid::from_raw(*pid as i32).ok_or(()) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}
