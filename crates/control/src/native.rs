//! The driver's own checkpoint API (`cuCheckpointProcess*`), called from the tool on other processes,
//! and the few device queries the tool needs (UUIDs for device maps, memory info for reports).
//!
//! The tool loads `libcuda.so.1` once (through the `cuda` crate's loader) and keeps it: each
//! `cuInit` costs seconds on large machines (docs/measurements.md), so one long-lived process makes
//! every native call of a suspend or resume.

use crate::ControlError;
use cuda::owned::PrimaryContext;
use cuda::{CudaError, DriverTable, LoadError, Resolve};
use cuda_abi::{CUresult, CUuuid};
use std::path::Path;

/// `cuCheckpointProcessGetState` values, named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ProcessState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    /// A value this tool does not know (a newer driver).
    Other(u32),
}

impl From<u32> for ProcessState {
    fn from(value: u32) -> Self {
        use cuda_abi::process_state::*;
        match value {
            RUNNING => ProcessState::Running,
            LOCKED => ProcessState::Locked,
            CHECKPOINTED => ProcessState::Checkpointed,
            FAILED => ProcessState::Failed,
            other => ProcessState::Other(other),
        }
    }
}

/// The driver's checkpoint calls on other processes: the seam in front of [`Driver`], so that the
/// orchestration around them (a group's lock and checkpoint and their undo, the restores of a
/// resume) is unit-tested with a scripted driver.
pub trait NativeCheckpoint: Sync {
    fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), ControlError>;
    fn checkpoint(&self, pid: u32) -> Result<(), ControlError>;
    /// Restores a checkpointed process, remapping GPUs by UUID where `pairs` says so.
    fn restore(&self, pid: u32, pairs: &[(CUuuid, CUuuid)]) -> Result<(), ControlError>;
    /// The thread of `pid` that carries out its restore, as the driver names it (the process's
    /// own PID namespace or this one: restore_thread.rs takes either).
    fn restore_thread(&self, pid: u32) -> Result<u32, ControlError>;
    fn unlock(&self, pid: u32) -> Result<(), ControlError>;
    fn state(&self, pid: u32) -> Result<ProcessState, ControlError>;
}

/// The loaded driver.
#[derive(Debug)]
pub struct Driver {
    loaded: cuda::Loaded,
    version: i32,
}

/// The entry points the tool calls: a driver without one is refused at load, as before any
/// process is touched.
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetUuid",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemGetInfo_v2",
];

pub(crate) fn driver_error(e: CudaError) -> ControlError {
    ControlError::Driver {
        call: e.call,
        result: e.result,
    }
}

/// A cleanup of the tool's own context that failed (the query it served has its answer).
fn cleanup_failed(e: &CudaError) {
    tracing::warn!("releasing the tool's device context: {e}");
}

/// Opens the driver library (`libcuda.so.1` from the loader's search path, or `path`) and
/// resolves the table by `dlsym`, without calling it; entries it lacks are noted in the result.
pub(crate) fn open(path: Option<&Path>) -> Result<cuda::Loaded, ControlError> {
    let name = path.map(Path::as_os_str).unwrap_or("libcuda.so.1".as_ref());
    cuda::load(name, Resolve::Dlsym).map_err(|e| match e {
        LoadError::Open { library, source } => ControlError::DriverLoad {
            name: library,
            source,
        },
        // The dlsym route needs no resolver of its own.
        LoadError::Missing { symbol, .. } => ControlError::Driver {
            call: symbol,
            result: CUresult::ERROR_NOT_FOUND,
        },
    })
}

impl Driver {
    /// Loads the driver (`libcuda.so.1` from the loader's search path, or `path`) and runs `cuInit`.
    pub fn load(path: Option<&Path>) -> Result<Driver, ControlError> {
        let loaded = open(path)?;
        if let Some(call) = REQUIRED.iter().find(|name| loaded.is_missing(name)) {
            return Err(ControlError::Driver {
                call,
                result: CUresult::ERROR_NOT_FOUND,
            });
        }
        loaded.init(0).map_err(driver_error)?;
        let version = loaded.driver_version().map_err(driver_error)?;
        Ok(Driver { loaded, version })
    }

    fn table(&self) -> &DriverTable {
        self.loaded.table()
    }

    /// The file the driver was loaded from.
    pub fn path(&self) -> &Path {
        self.loaded.path()
    }

    /// `cuDriverGetVersion`, e.g. 13000.
    pub fn version(&self) -> i32 {
        self.version
    }

    pub fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), ControlError> {
        self.table()
            .checkpoint_lock(pid as i32, timeout_ms)
            .map_err(driver_error)
    }

    pub fn checkpoint(&self, pid: u32) -> Result<(), ControlError> {
        self.table()
            .checkpoint_checkpoint(pid as i32)
            .map_err(driver_error)
    }

    /// Restores a checkpointed process, remapping GPUs by UUID where `pairs` says so.
    pub fn restore(&self, pid: u32, pairs: &[(CUuuid, CUuuid)]) -> Result<(), ControlError> {
        self.table()
            .checkpoint_restore(pid as i32, pairs)
            .map_err(driver_error)
    }

    /// The thread of `pid` that carries out its restore, as the driver names it (the process's
    /// own PID namespace or this one: restore_thread.rs takes either).
    pub fn restore_thread(&self, pid: u32) -> Result<u32, ControlError> {
        let tid = self
            .table()
            .checkpoint_restore_thread(pid as i32)
            .map_err(driver_error)?;
        u32::try_from(tid).map_err(|_| ControlError::Driver {
            call: "cuCheckpointProcessGetRestoreThreadId",
            result: CUresult::ERROR_INVALID_VALUE,
        })
    }

    pub fn unlock(&self, pid: u32) -> Result<(), ControlError> {
        self.table()
            .checkpoint_unlock(pid as i32)
            .map_err(driver_error)
    }

    pub fn state(&self, pid: u32) -> Result<ProcessState, ControlError> {
        let state = self
            .table()
            .checkpoint_state(pid as i32)
            .map_err(driver_error)?;
        Ok(ProcessState::from(state))
    }

    pub fn device_count(&self) -> Result<u32, ControlError> {
        let count = self.table().device_count().map_err(driver_error)?;
        Ok(count.max(0) as u32)
    }

    /// UUIDs of the devices by ordinal, as this process sees them.
    pub fn device_uuids(&self) -> Result<Vec<CUuuid>, ControlError> {
        (0..self.device_count()?)
            .map(|ordinal| {
                let device = self
                    .table()
                    .device_get(ordinal as i32)
                    .map_err(driver_error)?;
                self.table().device_uuid(device).map_err(driver_error)
            })
            .collect()
    }

    /// `(free, total)` bytes of a device, through its primary context (retained only for the query).
    pub fn memory_info(&self, ordinal: u32) -> Result<(u64, u64), ControlError> {
        let device = self
            .table()
            .device_get(ordinal as i32)
            .map_err(driver_error)?;
        let _context =
            PrimaryContext::enter(self.table(), device, cleanup_failed).map_err(driver_error)?;
        self.table().mem_get_info().map_err(driver_error)
    }
}

impl NativeCheckpoint for Driver {
    fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), ControlError> {
        Driver::lock(self, pid, timeout_ms)
    }

    fn checkpoint(&self, pid: u32) -> Result<(), ControlError> {
        Driver::checkpoint(self, pid)
    }

    fn restore(&self, pid: u32, pairs: &[(CUuuid, CUuuid)]) -> Result<(), ControlError> {
        Driver::restore(self, pid, pairs)
    }

    fn restore_thread(&self, pid: u32) -> Result<u32, ControlError> {
        Driver::restore_thread(self, pid)
    }

    fn unlock(&self, pid: u32) -> Result<(), ControlError> {
        Driver::unlock(self, pid)
    }

    fn state(&self, pid: u32) -> Result<ProcessState, ControlError> {
        Driver::state(self, pid)
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints UUIDs.
pub fn format_uuid(uuid: &CUuuid) -> String {
    let b: Vec<u8> = uuid.bytes.iter().map(|&c| c as u8).collect();
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// Inverse of [`format_uuid`].
pub fn parse_uuid(text: &str) -> Option<CUuuid> {
    let hex: String = text
        .strip_prefix("GPU-")?
        .chars()
        .filter(|&c| c != '-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut uuid = CUuuid::default();
    for (i, byte) in uuid.bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()? as std::ffi::c_char;
    }
    Some(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip_in_nvidia_smi_form() {
        let mut uuid = CUuuid::default();
        for (i, b) in uuid.bytes.iter_mut().enumerate() {
            *b = (i as u8 * 17) as std::ffi::c_char;
        }
        let text = format_uuid(&uuid);
        assert_eq!(text, "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(parse_uuid(&text), Some(uuid));
        assert_eq!(parse_uuid("GPU-0011"), None);
        assert_eq!(parse_uuid("nonsense"), None);
    }
}
