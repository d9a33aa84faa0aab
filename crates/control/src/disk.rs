//! Checkpoint to disk and restore into new processes: the capture of a suspend, then a CRIU dump of
//! the process tree; on restore, CRIU brings the tree back, then native restore (optionally onto other
//! GPUs) and the same rebuild a resume does.
//!
//! A checkpoint directory holds `manifest.json`, `cuinterpose.state` and `images/` (CRIU's). Restore
//! checks all of it before it changes anything, and never writes into the directory except CRIU's own
//! restore log.

use crate::capture::{self, Clock, Progress, Report, SuspendOptions};
use crate::config::ToolConfig;
use crate::criu::{self, Criu};
use crate::discovery;
use crate::group::{Group, Snapshot};
use crate::native::{self, Driver};
use crate::{ControlError, Refusal};
use protocol::manifest::{
    self, ByteCounts, CriuInfo, GpuInfo, LinkRemap, Manifest, ManifestParticipant, Role,
    ShimIdentity, StateFileRef,
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

fn refuse(process: &str, reason: String) -> ControlError {
    ControlError::Refused(vec![Refusal {
        process: process.to_string(),
        reason,
    }])
}

/// A checkpoint directory that cannot be restored: a refusal, since nothing was changed yet.
fn damaged(path: &Path, e: impl std::fmt::Display) -> ControlError {
    refuse(&format!("checkpoint {}", path.display()), e.to_string())
}

/// CRIU, or a refusal (nothing has changed when it is looked for).
fn locate_criu(explicit: Option<&Path>, config: &ToolConfig) -> Result<Criu, ControlError> {
    Criu::locate(explicit, config.criu.as_deref()).map_err(|e| refuse("criu", e.to_string()))
}

/// Checks that `dir` can take a new checkpoint: absent or empty, so that images of an earlier dump
/// can never mix with the new ones.
fn check_new_dir(dir: &Path) -> Result<(), ControlError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(refuse(
                    &format!("--dir {}", dir.display()),
                    "is not empty (it may hold a checkpoint); choose a new directory".into(),
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(state_error(dir, e)),
    }
}

/// Captures the group under `options.capture.root` and dumps it with CRIU into `options.dir`.
///
/// Everything CRIU cannot handle is refused before the capture starts (no CRIU, no PID namespace
/// of its own, a controlling terminal, a large deleted mapping, a TCP connection to a peer outside
/// the tree, a used directory). A dump that fails is rolled back: CRIU
/// leaves the tree running, and the shims rebuild what they released.
pub fn checkpoint(
    options: &CheckpointOptions,
    progress: &dyn Progress,
) -> Result<DiskReport, ControlError> {
    let start = Instant::now();
    let criu = locate_criu(options.criu.as_deref(), &options.capture.config)?;
    let root = namespace_root(options.capture.root)?;
    let dir = &options.dir;
    check_new_dir(dir)?;
    let tree = discovery::process_tree(root)?;
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
    let replaced = replaced_mappings(&tree);
    if !replaced.is_empty() {
        return Err(ControlError::Refused(replaced));
    }
    let sockets = tree_sockets(&tree);
    let tcp = crate::tcp::survey(&tree)?;
    let tcp_established = tcp.connected_within > 0;
    let images = dir.join(IMAGES_DIR);
    std::fs::create_dir_all(&images).map_err(|e| state_error(&images, e))?;
    let state_path = dir.join(protocol::state::STATE_FILE_NAME);

    let mut clock = Clock::new(progress);
    let capture_options = SuspendOptions {
        root,
        ..options.capture.clone()
    };
    let (group, captured) = capture::capture(&capture_options, &state_path, &mut clock)?;
    let driver = Driver::load(capture_options.driver.as_deref())?;
    let gpus = gpu_list(&driver)?;
    // CRIU refuses a tree with a connected socket whose peer is outside it: the tool's connections
    // to the shims go first (the shims keep none of their own between requests).
    drop(group);

    // CRIU leaves the dumped tree stopped (criu::Criu::dump); the tool ends it only once the
    // checkpoint is complete on disk: until then any failure (CRIU's, or reading its images, or
    // writing the digests or the manifest) can still be rolled back and the workload runs on.
    let dumped = clock.time("criu-dump", None, || {
        criu.dump(root, &images, tcp_established)
            .map_err(ControlError::Criu)?;
        Ok(((), criu::directory_bytes(&images), 0.0))
    });
    let mut link_remaps = Vec::new();
    let published = dumped.and_then(|()| {
        let links = criu::images::link_remaps(&images).map_err(ControlError::Criu)?;
        link_remaps = crate::remaps::take_over(root, &links)?;
        let image_bytes = criu::directory_bytes(&images);
        clock.time("image-digest", Some(image_bytes), || {
            let list = digest_images(&images)?;
            transport::files::write_atomically(&dir.join(IMAGE_DIGESTS), list.as_bytes())
                .map_err(|e| state_error(dir, e))?;
            Ok(((), image_bytes, 0.0))
        })?;
        let criu_info = CriuInfo {
            version: criu.version().to_string(),
            image_bytes,
            link_remaps: link_remaps.clone(),
            tcp_established,
        };
        let manifest = build_manifest(
            &captured,
            &sockets,
            &gpus,
            &driver,
            criu_info,
            &clock,
            &state_path,
        )?;
        transport::files::write_atomically(
            &dir.join(manifest::MANIFEST_FILE_NAME),
            &manifest::encode(&manifest),
        )
        .map_err(|e| state_error(dir, e))?;
        Ok((manifest, image_bytes))
    });
    let (manifest, image_bytes) = match published {
        Ok(done) => done,
        Err(e) => {
            // No manifest, no restorable checkpoint: the state file and CRIU's link remaps go;
            // the images stay with CRIU's dump log for diagnosis. The workload runs on after the
            // rollback.
            let _ = std::fs::remove_file(&state_path);
            let _ = std::fs::remove_file(dir.join(IMAGE_DIGESTS));
            let _ = std::fs::remove_file(dir.join(manifest::MANIFEST_FILE_NAME));
            if let Err(e) = crate::remaps::discard(&link_remaps) {
                tracing::warn!(error = %e, "removing the link remaps of a failed checkpoint");
            }
            let rollback = continue_dumped(root)
                .and_then(|()| resume_in_place(&capture_options, &captured, &driver, &mut clock));
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
    };

    if options.leave_running {
        // The link remaps stay: the checkpoint is restored through them once this tree is gone.
        continue_dumped(root)?;
        resume_in_place(&capture_options, &captured, &driver, &mut clock)?;
    } else {
        // What CRIU does after a dump without --leave-running; the checkpoint is complete.
        clock.time("stop", None, || {
            crate::launch::kill_tree(root, KILL_TIMEOUT)
                .map(|()| ((), 0, 0.0))
                .map_err(|e| ControlError::Step {
                    step: "stopping the dumped tree (the checkpoint is complete)",
                    process: format!("pid {root}"),
                    source: Box::new(e.into()),
                })
        })?;
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

/// Continues the tree CRIU left stopped after its dump, so the shims can answer again.
fn continue_dumped(root: u32) -> Result<(), ControlError> {
    crate::launch::continue_tree(root).map_err(|e| ControlError::Step {
        step: "continuing the dumped tree",
        process: format!("pid {root}"),
        source: Box::new(e.into()),
    })
}

/// Name of the image digest list in a checkpoint directory: `sha256sum` format
/// (`<64 hex>  images/<file>` per image file, sorted), so `sha256sum -c` checks it too.
pub const IMAGE_DIGESTS: &str = "images.sha256";

/// The digest list of every CRIU image file in `images`.
fn digest_images(images: &Path) -> Result<String, ControlError> {
    let mut names: Vec<String> = std::fs::read_dir(images)
        .map_err(|e| state_error(images, e))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| criu::is_image(n))
        .collect();
    names.sort();
    // The page images (one or more per process) hold gigabytes on a GPU: hash them on as many
    // threads as there are cores.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(names.len().max(1));
    let mut digests: Vec<Option<Result<String, ControlError>>> =
        (0..names.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        // Round robin, so that the page images (adjacent once sorted) land on different threads.
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let names = &names;
                scope.spawn(move || {
                    (t..names.len())
                        .step_by(threads)
                        .map(|i| (i, file_sha256(&images.join(&names[i]))))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            for (i, digest) in handle.join().unwrap_or_default() {
                if let Some(slot) = digests.get_mut(i) {
                    *slot = Some(digest);
                }
            }
        }
    });
    let mut list = String::new();
    for (name, digest) in names.iter().zip(digests) {
        // A slot left empty is a thread that panicked.
        let digest =
            digest.unwrap_or_else(|| Err(state_error(images, "a digest thread panicked")))?;
        list.push_str(&format!("{digest}  {IMAGES_DIR}/{name}\n"));
    }
    Ok(list)
}

/// SHA-256 of a file, read in pieces (images hold the processes' memory: gigabytes on a GPU).
fn file_sha256(path: &Path) -> Result<String, ControlError> {
    use sha2::Digest;
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| state_error(path, e))?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(|e| state_error(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(buffer.get(..n).unwrap_or_default());
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Checks the images against the digest list written at checkpoint: the same set of image files,
/// each with its recorded SHA-256. CRIU itself does not notice a truncated or edited page image.
fn verify_images(dir: &Path) -> Result<(), ControlError> {
    let list_path = dir.join(IMAGE_DIGESTS);
    let recorded =
        transport::files::read_bounded(&list_path, 16 << 20).map_err(|e| damaged(&list_path, e))?;
    let recorded = String::from_utf8(recorded).map_err(|e| damaged(&list_path, e))?;
    let images = dir.join(IMAGES_DIR);
    let found = digest_images(&images).map_err(|e| damaged(&images, e))?;
    if found == recorded {
        return Ok(());
    }
    let parse = |text: &str| -> std::collections::BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(digest, name)| (name.to_string(), digest.to_string()))
            .collect()
    };
    let (recorded, found) = (parse(&recorded), parse(&found));
    let mut problems = Vec::new();
    for (name, digest) in &recorded {
        match found.get(name) {
            None => problems.push(format!("{name} is missing")),
            Some(d) if d != digest => problems.push(format!("{name} differs from its digest")),
            Some(_) => {}
        }
    }
    for name in found.keys().filter(|n| !recorded.contains_key(*n)) {
        problems.push(format!("{name} was not part of the checkpoint"));
    }
    if problems.is_empty() {
        problems.push(format!("{IMAGE_DIGESTS} is malformed"));
    }
    Err(damaged(
        dir,
        format!(
            "CRIU images do not match {IMAGE_DIGESTS}: {}",
            problems.join(", ")
        ),
    ))
}

/// After a dump with `--leave-running` (or a failed one): native restore and rebuild in place.
fn resume_in_place(
    options: &SuspendOptions,
    captured: &[Snapshot],
    driver: &Driver,
    clock: &mut Clock<'_>,
) -> Result<(), ControlError> {
    let mut group = Group::discover(options.root, options.config.answer_timeout)?;
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

/// CRIU's default `--ghost-limit`: a deleted file up to this size is saved into the images.
const CRIU_GHOST_LIMIT: u64 = 1 << 20;

/// Processes that map a large file deleted or replaced since they mapped it (a rebuilt binary or
/// library): CRIU saves a deleted file only up to its ghost limit and otherwise fails the dump
/// ("Can't create link remap"), so the capture is refused before it changes anything. Memfds (the
/// fake driver's memory, the shim's tickets), shared mappings of `/dev/zero` (how anonymous shared
/// memory shows, the NVIDIA driver makes them) and System V segments are "(deleted)" by nature, and
/// CRIU saves them as shared memory.
fn replaced_mappings(tree: &[u32]) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    for &pid in tree {
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        let mut files: Vec<&str> = maps
            .lines()
            .filter_map(|line| {
                let range = line.split_whitespace().next()?;
                let path = line.splitn(6, char::is_whitespace).nth(5)?.trim_start();
                let path = path.strip_suffix(" (deleted)")?;
                if !path.starts_with('/')
                    || path.starts_with("/memfd:")
                    || path == "/dev/zero"
                    || path.starts_with("/SYSV")
                {
                    return None;
                }
                // The mapped file itself, through /proc (root may follow these links).
                let size = std::fs::metadata(format!("/proc/{pid}/map_files/{range}"))
                    .map(|m| m.len())
                    .unwrap_or(u64::MAX);
                (size > CRIU_GHOST_LIMIT).then_some(path)
            })
            .collect();
        files.sort_unstable();
        files.dedup();
        if let Some(first) = files.first() {
            let label = discovery::describe(pid)
                .map(|i| i.label())
                .unwrap_or_else(|_| format!("pid {pid}"));
            refusals.push(Refusal {
                process: label,
                reason: format!(
                    "maps {first}{}, deleted or replaced since it was loaded and larger than \
                     CRIU saves; the dump would fail (restart the workload)",
                    if files.len() > 1 {
                        format!(" and {} other files", files.len() - 1)
                    } else {
                        String::new()
                    }
                ),
            });
        }
    }
    refusals
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

fn build_manifest(
    captured: &[Snapshot],
    sockets: &[(u32, Vec<String>)],
    gpus: &[GpuInfo],
    driver: &Driver,
    criu: CriuInfo,
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
        criu: Some(criu),
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
    /// The tool's settings (CRIU when `criu` is not given, the answer timeout).
    pub config: ToolConfig,
}

/// Everything a restore checks before it changes anything.
struct Verified {
    manifest: Manifest,
    state: GroupState,
    criu: Criu,
    driver: Driver,
    gpu_pairs: Vec<(cuda_abi::CUuuid, cuda_abi::CUuuid)>,
}

/// The manifest of the checkpoint in `dir`, decoded and validated, of a checkpoint to disk; a
/// refusal when there is none.
pub(crate) fn read_manifest(dir: &Path) -> Result<Manifest, ControlError> {
    if !dir.is_dir() {
        return Err(damaged(dir, "is not a directory"));
    }
    let manifest_path = dir.join(manifest::MANIFEST_FILE_NAME);
    let manifest_bytes =
        transport::files::read_bounded(&manifest_path, manifest::MAX_MANIFEST_LEN as u64)
            .map_err(|e| damaged(&manifest_path, e))?;
    let manifest = manifest::decode(&manifest_bytes).map_err(|e| damaged(&manifest_path, e))?;
    if manifest.criu.is_none() {
        return Err(damaged(
            &manifest_path,
            "describes a checkpoint without CRIU images (not taken by `cuinterpose checkpoint`)",
        ));
    }
    Ok(manifest)
}

fn verify_checkpoint(options: &RestoreOptions) -> Result<Verified, ControlError> {
    let dir = &options.dir;
    let manifest = read_manifest(dir)?;
    let state_path = dir.join(&manifest.state.file);
    let state_bytes = transport::files::read_bounded(&state_path, capture::STATE_FILE_LIMIT)
        .map_err(|e| damaged(&state_path, e))?;
    let state = manifest
        .verify_state(&state_bytes)
        .map_err(|e| damaged(&state_path, e))?;
    let criu = locate_criu(options.criu.as_deref(), &options.config)?;

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
    let mut sources = std::collections::HashSet::new();
    for &(old, new) in device_map {
        if !sources.insert(old) {
            return Err(refuse(
                "--device-map",
                format!("device {old} is mapped twice"),
            ));
        }
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
    // The map is completed with the identity for the GPUs it does not name, and must then be
    // one-to-one: two recorded GPUs restored onto one would put both devices' memory, contexts and
    // ordinals on it, which the processes (and their device ordinals in the records) cannot follow.
    for gpu in &recorded {
        if device_map.iter().any(|&(old, _)| old == gpu.ordinal) {
            continue;
        }
        if !present_text.contains(&gpu.uuid) {
            return Err(refuse(
                "checkpoint",
                format!(
                    "GPU {} ({}) is not present; map it with --device-map {}=NEW",
                    gpu.ordinal, gpu.uuid, gpu.ordinal
                ),
            ));
        }
        if let Some(here) = present_text.iter().position(|u| *u == gpu.uuid)
            && !targets.insert(here as u32)
        {
            return Err(refuse(
                "--device-map",
                format!(
                    "device {here} would receive two GPUs: one mapped onto it, and recorded \
                     device {} which the map leaves in place; map device {} too",
                    gpu.ordinal, gpu.ordinal
                ),
            ));
        }
    }
    Ok(pairs)
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
/// each must be kept and CRIU's name for it free (crate::remaps).
fn verify_link_remaps(manifest: &Manifest, images: &Path) -> Result<Vec<LinkRemap>, ControlError> {
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
    crate::remaps::check_present(&listed).map_err(|e| refuse("checkpoint", e.to_string()))?;
    Ok(listed)
}

/// A private directory for what CRIU writes during a restore (log, statistics, pid file).
fn restore_work_dir() -> Result<PathBuf, ControlError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "cuinterpose-restore-{}-{nanos:x}",
        std::process::id()
    ));
    std::fs::create_dir(&dir).map_err(|e| state_error(&dir, e))?;
    Ok(dir)
}

/// Restores the checkpoint in `options.dir` into new processes.
///
/// Everything is checked before anything changes (manifest, state file, image digests, shim bytes,
/// driver version, GPUs and the device map, that the original group is not running): a failure
/// there is a refusal. After CRIU restored the tree, a failure kills the restored tree, so nothing
/// half-restored is left running. The checkpoint directory is never written.
pub fn restore(
    options: &RestoreOptions,
    progress: &dyn Progress,
) -> Result<DiskReport, ControlError> {
    let start = Instant::now();
    let mut clock = Clock::new(progress);
    let verified = clock.time("verify-checkpoint", None, || {
        verify_checkpoint(options).map(|v| (v, 0, 0.0))
    })?;
    let images = options.dir.join(IMAGES_DIR);
    let image_bytes = criu::directory_bytes(&images);
    clock.time("verify-images", Some(image_bytes), || {
        verify_images(&options.dir).map(|()| ((), image_bytes, 0.0))
    })?;
    let link_remaps = verify_link_remaps(&verified.manifest, &images)?;
    remove_stale_sockets(&verified.manifest)?;
    let work_dir = restore_work_dir()?;
    let root = clock.time("criu-restore", Some(image_bytes), || {
        // Under CRIU's names only while CRIU runs (crate::remaps).
        let _linked = crate::remaps::link_for_restore(&link_remaps)?;
        let tcp = (verified.manifest.criu.as_ref()).is_some_and(|c| c.tcp_established);
        verified
            .criu
            .restore(&images, &work_dir, tcp)
            .map(|pid| (pid, image_bytes, 0.0))
            .map_err(ControlError::Criu)
    })?;
    // From here on a failure must not leave a half-restored tree running.
    let rebuilt = rebuild_restored(root, &verified, &options.config, &mut clock);
    let (participants, shared_bytes) = match rebuilt {
        Ok(done) => done,
        Err(e) => {
            return Err(match crate::launch::kill_tree(root, KILL_TIMEOUT) {
                Ok(()) => ControlError::Step {
                    step: "restore (the restored processes were killed; the checkpoint is unchanged)",
                    process: format!("the restored tree (root pid {root})"),
                    source: Box::new(e),
                },
                Err(kill) => {
                    tracing::error!(root, error = %kill, "killing the restored tree");
                    ControlError::Step {
                        step: "restore (killing the restored processes failed too: they need attention)",
                        process: format!("the restored tree (root pid {root})"),
                        source: Box::new(e),
                    }
                }
            });
        }
    };
    // CRIU's log of a restore that worked is of no further use.
    let _ = std::fs::remove_dir_all(&work_dir);
    Ok(DiskReport {
        report: Report {
            participants,
            phases: clock.phases,
            shared_bytes,
            state_file: options.dir.join(protocol::state::STATE_FILE_NAME),
            total_millis: start.elapsed().as_secs_f64() * 1e3,
        },
        dir: options.dir.clone(),
        image_bytes,
        root,
    })
}

/// How long the restored tree gets to disappear after SIGKILL.
const KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn rebuild_restored(
    root: u32,
    verified: &Verified,
    config: &ToolConfig,
    clock: &mut Clock<'_>,
) -> Result<(Vec<capture::ParticipantSummary>, u64), ControlError> {
    let mut group = Group::discover(root, config.answer_timeout)?;
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
