//! The manifest of a checkpoint to disk: built after the dump, read back by restore and discard.

use super::damaged;
use crate::ControlError;
use crate::group::Snapshot;
use crate::native::Driver;
use crate::progress::Clock;
use crate::state_error;
use crate::statefile;
use protocol::manifest::{
    self, ByteCounts, CriuInfo, GpuInfo, Manifest, ManifestParticipant, Role, ShimIdentity,
    StateFileRef,
};
use std::path::Path;

pub(super) fn build_manifest(
    captured: &[Snapshot],
    sockets: &[(u32, Vec<String>)],
    gpus: &[GpuInfo],
    driver: &Driver,
    criu: CriuInfo,
    clock: &Clock<'_>,
    state_path: &Path,
) -> Result<Manifest, ControlError> {
    let state_bytes = transport::files::read_bounded(state_path, statefile::STATE_FILE_LIMIT)
        .map_err(|e| state_error(state_path, e))?;
    let first = captured.first().ok_or(ControlError::NoCudaProcesses(0))?;
    // Every allocation the shims created, shared or private, went through a carrier.
    let saved: u64 = captured
        .iter()
        .flat_map(|s| &s.record.allocations)
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
            saved,
            carriers: saved,
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
        // The caller adds what its data files hold.
        data_files: Vec::new(),
    })
}

/// The manifest of the checkpoint in `dir`, decoded and validated, of a checkpoint to disk; a
/// refusal when there is none.
pub(crate) fn read_manifest(dir: &Path) -> Result<Manifest, ControlError> {
    check_complete(dir)?;
    let manifest_path = dir.join(manifest::MANIFEST_FILE_NAME);
    let manifest_bytes =
        crate::safefs::read_regular(&manifest_path, manifest::MAX_MANIFEST_LEN as u64)
            .map_err(|e| damaged(&manifest_path, e))?;
    decode_manifest(dir, &manifest_bytes)
}

/// Refuses `dir` unless it is a directory without the marker of an incomplete checkpoint.
pub(crate) fn check_complete(dir: &Path) -> Result<(), ControlError> {
    if !dir.is_dir() {
        return Err(damaged(dir, "is not a directory"));
    }
    if dir.join(super::INCOMPLETE_MARKER).exists() {
        return Err(damaged(
            dir,
            "holds an incomplete checkpoint (one that failed or was killed); `cuinterpose \
             discard --dir` removes it",
        ));
    }
    Ok(())
}

/// The manifest of the checkpoint in `dir` from its bytes (read once, by the caller), decoded
/// and validated, of a checkpoint to disk.
pub(crate) fn decode_manifest(dir: &Path, manifest_bytes: &[u8]) -> Result<Manifest, ControlError> {
    let manifest_path = dir.join(manifest::MANIFEST_FILE_NAME);
    let manifest = manifest::decode(manifest_bytes).map_err(|e| damaged(&manifest_path, e))?;
    if manifest.criu.is_none() {
        return Err(damaged(
            &manifest_path,
            "describes a checkpoint without CRIU images (not taken by `cuinterpose checkpoint`)",
        ));
    }
    Ok(manifest)
}
