//! The driver as doctor sees it: loaded through the `cuda` crate without requiring the checkpoint
//! API (crate::native's Driver refuses a driver without it), so that doctor can say which entry
//! points are missing.

use super::Gpu;
use crate::ControlError;
use crate::native::{self, Driver, driver_error, format_uuid};
use std::path::{Path, PathBuf};

/// The driver's checkpoint API, every entry point the tool calls.
pub const CHECKPOINT_API: [&str; 5] = [
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
];

/// A loaded, initialised driver.
#[derive(Debug)]
pub struct DriverProbe {
    loaded: cuda::Loaded,
    /// The full driver of the tool, when the checkpoint API is there (UUIDs and memory info).
    full: Option<Driver>,
}

impl DriverProbe {
    /// Loads `path` (default `libcuda.so.1`) and runs `cuInit`.
    pub fn load(path: Option<&Path>) -> Result<DriverProbe, ControlError> {
        let loaded = native::open(path)?;
        loaded.init(0).map_err(driver_error)?;
        let mut probe = DriverProbe { loaded, full: None };
        if probe.missing_checkpoint_api().is_empty() {
            probe.full = Some(Driver::load(path)?);
        }
        Ok(probe)
    }

    /// The file the driver was loaded from (as the loader resolved it).
    pub fn path(&self) -> PathBuf {
        self.loaded.path().to_path_buf()
    }

    /// `cuDriverGetVersion` (e.g. 13000), 0 when the driver lacks it.
    pub fn version(&self) -> i32 {
        self.loaded.driver_version().unwrap_or(0)
    }

    /// The entry points of [`CHECKPOINT_API`] the driver does not export.
    pub fn missing_checkpoint_api(&self) -> Vec<&'static str> {
        CHECKPOINT_API
            .iter()
            .filter(|name| self.loaded.is_missing(name))
            .copied()
            .collect()
    }

    /// The GPUs by ordinal: names, and with the full driver UUIDs and memory.
    pub fn gpus(&self) -> Result<Vec<Gpu>, ControlError> {
        let count = self.loaded.device_count().map_err(driver_error)?;
        let uuids = self.full.as_ref().map(Driver::device_uuids).transpose()?;
        (0..count.max(0) as u32)
            .map(|ordinal| {
                let device = self
                    .loaded
                    .device_get(ordinal as i32)
                    .map_err(driver_error)?;
                let name = self.loaded.device_name(device).map_err(driver_error)?;
                let memory = match &self.full {
                    Some(full) => Some(full.memory_info(ordinal)?),
                    None => None,
                };
                Ok(Gpu {
                    ordinal,
                    name,
                    uuid: uuids
                        .as_ref()
                        .and_then(|u| u.get(ordinal as usize))
                        .map(format_uuid),
                    memory_free: memory.map(|(free, _)| free),
                    memory_total: memory.map(|(_, total)| total),
                })
            })
            .collect()
    }
}
