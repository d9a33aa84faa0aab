//! The driver as doctor sees it: loaded without requiring the checkpoint API (crate::native's
//! Driver refuses a driver without it), so that doctor can say which entry points are missing.

#![allow(unsafe_code)] // calls into the dynamically loaded driver; each block says why it is sound

use super::Gpu;
use crate::ControlError;
use crate::native::{Driver, format_uuid};
use cuda_abi::CUresult;
use cuda_abi::pfn::{PFN_cuDeviceGet, PFN_cuDeviceGetCount, PFN_cuDeviceGetName, PFN_cuInit};
use std::ffi::{CStr, c_char, c_int};
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
    requested: Option<PathBuf>,
    library: libloading::Library,
    /// The full driver of the tool, when the checkpoint API is there (UUIDs and memory info).
    full: Option<Driver>,
}

fn checked(call: &'static str, result: CUresult) -> Result<(), ControlError> {
    if result.is_success() {
        Ok(())
    } else {
        Err(ControlError::Driver { call, result })
    }
}

impl DriverProbe {
    /// Loads `path` (default `libcuda.so.1`) and runs `cuInit`.
    pub fn load(path: Option<&Path>) -> Result<DriverProbe, ControlError> {
        let name = path.map(Path::as_os_str).unwrap_or("libcuda.so.1".as_ref());
        // SAFETY: loading the CUDA driver runs its initialisers, which have no preconditions on us.
        let library = unsafe { libloading::Library::new(name) }.map_err(|source| {
            ControlError::DriverLoad {
                name: name.to_string_lossy().into_owned(),
                source,
            }
        })?;
        // SAFETY: cuInit's C signature is PFN_cuInit (cuda-abi).
        let init = unsafe { library.get::<PFN_cuInit>(b"cuInit\0") }.map_err(|source| {
            ControlError::DriverSymbol {
                name: "cuInit",
                source,
            }
        })?;
        // SAFETY: cuInit takes flags 0 and has no other preconditions.
        checked("cuInit", unsafe { init(0) })?;
        let mut probe = DriverProbe {
            requested: path.map(Path::to_path_buf),
            library,
            full: None,
        };
        if probe.missing_checkpoint_api().is_empty() {
            probe.full = Some(Driver::load(path)?);
        }
        Ok(probe)
    }

    /// The file the driver was loaded from (as the loader resolved it, when the API is complete).
    pub fn path(&self) -> PathBuf {
        match (&self.full, &self.requested) {
            (Some(full), _) => full.path().to_path_buf(),
            (None, Some(requested)) => requested.clone(),
            (None, None) => PathBuf::from("libcuda.so.1"),
        }
    }

    /// `cuDriverGetVersion` (e.g. 13000), 0 when the driver lacks it.
    pub fn version(&self) -> i32 {
        if let Some(full) = &self.full {
            return full.version();
        }
        // SAFETY: cuDriverGetVersion's C signature is PFN_cuDriverGetVersion (cuda-abi).
        let get = unsafe {
            self.library
                .get::<cuda_abi::pfn::PFN_cuDriverGetVersion>(b"cuDriverGetVersion\0")
        };
        let mut version: c_int = 0;
        if let Ok(get) = get {
            // SAFETY: `version` is a valid out-pointer.
            let _ = unsafe { get(&mut version) };
        }
        version
    }

    /// The entry points of [`CHECKPOINT_API`] the driver does not export.
    pub fn missing_checkpoint_api(&self) -> Vec<&'static str> {
        CHECKPOINT_API
            .iter()
            .filter(|name| {
                let symbol = format!("{name}\0");
                // SAFETY: only the symbol's presence is asked; the pointer is never called.
                unsafe {
                    self.library
                        .get::<*const std::ffi::c_void>(symbol.as_bytes())
                }
                .is_err()
            })
            .copied()
            .collect()
    }

    /// The GPUs by ordinal: names, and with the full driver UUIDs and memory.
    pub fn gpus(&self) -> Result<Vec<Gpu>, ControlError> {
        macro_rules! symbol {
            ($name:ident: $ty:ty) => {
                // SAFETY: the symbol is the driver's entry point of that name, whose C signature
                // `$ty` mirrors (cuda-abi).
                unsafe {
                    self.library
                        .get::<$ty>(concat!(stringify!($name), "\0").as_bytes())
                }
                .map_err(|source| ControlError::DriverSymbol {
                    name: stringify!($name),
                    source,
                })?
            };
        }
        let get_count = symbol!(cuDeviceGetCount: PFN_cuDeviceGetCount);
        let get = symbol!(cuDeviceGet: PFN_cuDeviceGet);
        let get_name = symbol!(cuDeviceGetName: PFN_cuDeviceGetName);
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer.
        checked("cuDeviceGetCount", unsafe { get_count(&mut count) })?;
        let uuids = self.full.as_ref().map(Driver::device_uuids).transpose()?;
        (0..count.max(0) as u32)
            .map(|ordinal| {
                let mut device = 0;
                // SAFETY: valid out-pointer; the ordinal is below the device count.
                checked("cuDeviceGet", unsafe { get(&mut device, ordinal as c_int) })?;
                let mut name = [0 as c_char; 256];
                // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within them.
                checked("cuDeviceGetName", unsafe {
                    get_name(name.as_mut_ptr(), name.len() as c_int - 1, device)
                })?;
                // SAFETY: zero-initialised with the last byte never written, so NUL-terminated.
                let name = unsafe { CStr::from_ptr(name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
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
