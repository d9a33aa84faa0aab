//! The GPUs of a checkpoint: the list recorded at checkpoint, and the native restore's pairs from
//! `--device-map` checked against the recorded and the present GPUs.

use crate::ControlError;
use crate::native::{self, Driver};
use crate::refuse;
use protocol::manifest::{GpuInfo, Manifest};

pub(super) fn gpu_list(driver: &Driver) -> Result<Vec<GpuInfo>, ControlError> {
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

/// The native restore's GPU pairs from `--device-map`, checked against the recorded and present GPUs.
pub(super) fn gpu_pairs(
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
