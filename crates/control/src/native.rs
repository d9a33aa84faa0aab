//! The driver's own checkpoint API (`cuCheckpointProcess*`), called from the tool on other processes,
//! and the few device queries the tool needs (UUIDs for device maps, memory info for reports).
//!
//! The tool loads `libcuda.so.1` once and keeps it: each `cuInit` costs seconds on large machines
//! (measurements.md), so one long-lived process makes every native call of a suspend or resume.

#![allow(unsafe_code)] // calls into the dynamically loaded driver; each block says why it is sound

use crate::ControlError;
use cuda_abi::pfn::*;
use cuda_abi::{
    CUcheckpointCheckpointArgs, CUcheckpointGpuPair, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUcontext, CUresult, CUuuid,
};
use std::ffi::c_int;
use std::path::{Path, PathBuf};

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

/// The loaded driver with the entry points the tool uses.
#[derive(Debug)]
pub struct Driver {
    path: PathBuf,
    _library: libloading::Library,
    version: i32,
    lock: PFN_cuCheckpointProcessLock,
    checkpoint: PFN_cuCheckpointProcessCheckpoint,
    restore: PFN_cuCheckpointProcessRestore,
    unlock: PFN_cuCheckpointProcessUnlock,
    get_state: PFN_cuCheckpointProcessGetState,
    device_get_count: PFN_cuDeviceGetCount,
    device_get: PFN_cuDeviceGet,
    device_get_uuid: PFN_cuDeviceGetUuid,
    primary_ctx_retain: PFN_cuDevicePrimaryCtxRetain,
    primary_ctx_release: PFN_cuDevicePrimaryCtxRelease_v2,
    ctx_set_current: PFN_cuCtxSetCurrent,
    mem_get_info: PFN_cuMemGetInfo_v2,
}

fn check(call: &'static str, result: CUresult) -> Result<(), ControlError> {
    if result.is_success() {
        Ok(())
    } else {
        Err(ControlError::Driver { call, result })
    }
}

impl Driver {
    /// Loads the driver (`libcuda.so.1` from the loader's search path, or `path`) and runs `cuInit`.
    pub fn load(path: Option<&Path>) -> Result<Driver, ControlError> {
        let name = path.map(Path::as_os_str).unwrap_or("libcuda.so.1".as_ref());
        // SAFETY: loading the CUDA driver runs its initialisers, which have no preconditions on us.
        let library = unsafe { libloading::Library::new(name) }.map_err(|source| {
            ControlError::DriverLoad {
                name: name.to_string_lossy().into_owned(),
                source,
            }
        })?;
        macro_rules! symbol {
            ($name:ident: $ty:ty) => {{
                let symbol: Result<libloading::Symbol<'_, $ty>, _> =
                    // SAFETY: the symbol is the driver's entry point of that name, whose C
                    // signature `$ty` mirrors (cuda-abi; layout checked against cuda.h on the GPU).
                    unsafe { library.get(concat!(stringify!($name), "\0").as_bytes()) };
                *symbol.map_err(|source| ControlError::DriverSymbol { name: stringify!($name), source })?
            }};
        }
        let init = symbol!(cuInit: PFN_cuInit);
        let driver_get_version = symbol!(cuDriverGetVersion: PFN_cuDriverGetVersion);
        // SAFETY: cuInit takes flags 0 and has no other preconditions.
        check("cuInit", unsafe { init(0) })?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out-pointer.
        check("cuDriverGetVersion", unsafe {
            driver_get_version(&mut version)
        })?;
        let driver = Driver {
            path: resolved_path(&library, name.as_ref()),
            version,
            lock: symbol!(cuCheckpointProcessLock: PFN_cuCheckpointProcessLock),
            checkpoint: symbol!(cuCheckpointProcessCheckpoint: PFN_cuCheckpointProcessCheckpoint),
            restore: symbol!(cuCheckpointProcessRestore: PFN_cuCheckpointProcessRestore),
            unlock: symbol!(cuCheckpointProcessUnlock: PFN_cuCheckpointProcessUnlock),
            get_state: symbol!(cuCheckpointProcessGetState: PFN_cuCheckpointProcessGetState),
            device_get_count: symbol!(cuDeviceGetCount: PFN_cuDeviceGetCount),
            device_get: symbol!(cuDeviceGet: PFN_cuDeviceGet),
            device_get_uuid: symbol!(cuDeviceGetUuid: PFN_cuDeviceGetUuid),
            primary_ctx_retain: symbol!(cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain),
            primary_ctx_release: symbol!(cuDevicePrimaryCtxRelease_v2: PFN_cuDevicePrimaryCtxRelease_v2),
            ctx_set_current: symbol!(cuCtxSetCurrent: PFN_cuCtxSetCurrent),
            mem_get_info: symbol!(cuMemGetInfo_v2: PFN_cuMemGetInfo_v2),
            _library: library,
        };
        Ok(driver)
    }

    /// The file the driver was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cuDriverGetVersion`, e.g. 13000.
    pub fn version(&self) -> i32 {
        self.version
    }

    pub fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), ControlError> {
        let mut args = CUcheckpointLockArgs {
            timeoutMs: timeout_ms,
            ..Default::default()
        };
        // SAFETY: `args` is a valid, zero-reserved argument struct of the header's layout.
        check("cuCheckpointProcessLock", unsafe {
            (self.lock)(pid as c_int, &mut args)
        })
    }

    pub fn checkpoint(&self, pid: u32) -> Result<(), ControlError> {
        let mut args = CUcheckpointCheckpointArgs::default();
        // SAFETY: as for lock.
        check("cuCheckpointProcessCheckpoint", unsafe {
            (self.checkpoint)(pid as c_int, &mut args)
        })
    }

    /// Restores a checkpointed process, remapping GPUs by UUID where `pairs` says so.
    pub fn restore(&self, pid: u32, pairs: &[(CUuuid, CUuuid)]) -> Result<(), ControlError> {
        let mut gpu_pairs: Vec<CUcheckpointGpuPair> = pairs
            .iter()
            .map(|&(old, new)| CUcheckpointGpuPair {
                oldUuid: old,
                newUuid: new,
            })
            .collect();
        let mut args = CUcheckpointRestoreArgs::default();
        if !gpu_pairs.is_empty() {
            args.gpuPairs = gpu_pairs.as_mut_ptr();
            args.gpuPairsCount = gpu_pairs.len() as u32;
        }
        // SAFETY: `args` is zero-reserved; `gpuPairs` points at `gpuPairsCount` pairs that outlive the call.
        check("cuCheckpointProcessRestore", unsafe {
            (self.restore)(pid as c_int, &mut args)
        })
    }

    pub fn unlock(&self, pid: u32) -> Result<(), ControlError> {
        let mut args = CUcheckpointUnlockArgs::default();
        // SAFETY: as for lock.
        check("cuCheckpointProcessUnlock", unsafe {
            (self.unlock)(pid as c_int, &mut args)
        })
    }

    pub fn state(&self, pid: u32) -> Result<ProcessState, ControlError> {
        let mut state = 0u32;
        // SAFETY: `state` is a valid out-pointer.
        check("cuCheckpointProcessGetState", unsafe {
            (self.get_state)(pid as c_int, &mut state)
        })?;
        Ok(ProcessState::from(state))
    }

    pub fn device_count(&self) -> Result<u32, ControlError> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer.
        check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut count)
        })?;
        Ok(count.max(0) as u32)
    }

    /// UUIDs of the devices by ordinal, as this process sees them.
    pub fn device_uuids(&self) -> Result<Vec<CUuuid>, ControlError> {
        (0..self.device_count()?)
            .map(|ordinal| {
                let mut device = 0;
                // SAFETY: valid out-pointer; the ordinal is below the device count.
                check("cuDeviceGet", unsafe {
                    (self.device_get)(&mut device, ordinal as c_int)
                })?;
                let mut uuid = CUuuid::default();
                // SAFETY: valid out-pointer for a device handle the driver just returned.
                check("cuDeviceGetUuid", unsafe {
                    (self.device_get_uuid)(&mut uuid, device)
                })?;
                Ok(uuid)
            })
            .collect()
    }

    /// `(free, total)` bytes of a device, through its primary context (retained only for the query).
    pub fn memory_info(&self, ordinal: u32) -> Result<(u64, u64), ControlError> {
        let mut device = 0;
        // SAFETY: valid out-pointer.
        check("cuDeviceGet", unsafe {
            (self.device_get)(&mut device, ordinal as c_int)
        })?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and device handle.
        check("cuDevicePrimaryCtxRetain", unsafe {
            (self.primary_ctx_retain)(&mut context, device)
        })?;
        let mut free = 0usize;
        let mut total = 0usize;
        // SAFETY: `context` was just retained.
        let current = check("cuCtxSetCurrent", unsafe {
            (self.ctx_set_current)(context)
        });
        let result = current.and_then(|()| {
            // SAFETY: the out-pointers are valid; a context is current.
            let r = unsafe { (self.mem_get_info)(&mut free, &mut total) };
            check("cuMemGetInfo", r)
        });
        // SAFETY: unbinding the context set above.
        unsafe { (self.ctx_set_current)(std::ptr::null_mut()) };
        // SAFETY: releasing the retain taken above.
        unsafe { (self.primary_ctx_release)(device) };
        result.map(|()| (free as u64, total as u64))
    }
}

/// The library's file, as the dynamic loader resolved it (for manifests and messages).
fn resolved_path(library: &libloading::Library, requested: &Path) -> PathBuf {
    // SAFETY: looking up a symbol we already resolved; the pointer is only used as an address.
    let address = unsafe { library.get::<*const std::ffi::c_void>(b"cuInit\0") }.map(|s| *s);
    let Ok(address) = address else {
        return requested.to_path_buf();
    };
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address and fills `info`.
    let found = unsafe { libc::dladdr(address, info.as_mut_ptr()) };
    if found == 0 {
        return requested.to_path_buf();
    }
    // SAFETY: dladdr succeeded, so it filled `info`.
    let info = unsafe { info.assume_init() };
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader for the library's lifetime.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(name.to_string_lossy().as_ref())
        .unwrap_or_else(|_| requested.to_path_buf())
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
