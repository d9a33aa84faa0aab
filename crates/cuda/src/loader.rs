//! The loader of the tool and the workloads: `libcuda` opened with `libloading` and every table
//! entry resolved through the route asked for. (The shim resolves the same table with its own
//! resolvers, crates/shim.)
//!
//! Two routes, because the shim must be reachable both ways:
//! - [`Resolve::Dlsym`]: `dlsym(handle, NAME)` with the exact ABI names (`cuMemAlloc_v2`), as
//!   old `dlopen` users write them;
//! - [`Resolve::GetProcAddress`]: `dlsym(handle, "cuGetProcAddress_v2")` once, then
//!   `cuGetProcAddress_v2(BASE, ...)` for every entry (what the CUDA runtime does), at the entry's
//!   version or [`PINNED_CUDA_VERSION`].
//!
//! The library is never unloaded: the CUDA driver does not support being unloaded, and a table
//! that outlives its library would call into unmapped code. That is what makes the `'static`
//! table sound.

use crate::{DriverTable, Entry};
use core::ffi::{CStr, c_int, c_void};
use core::ptr::NonNull;
use cuda_abi::proc_address_status;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The `cudaVersion` the GetProcAddress route asks for, for entries without their own (the
/// version PyTorch pins).
pub const PINNED_CUDA_VERSION: c_int = 12000;

/// How entry points are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resolve {
    /// `dlsym` on the library handle.
    #[default]
    Dlsym,
    /// `cuGetProcAddress_v2`.
    GetProcAddress,
}

impl Resolve {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolve::Dlsym => "dlsym",
            Resolve::GetProcAddress => "getprocaddress",
        }
    }

    /// Parses the command-line spelling.
    pub fn parse(text: &str) -> Option<Resolve> {
        match text {
            "dlsym" => Some(Resolve::Dlsym),
            "getprocaddress" => Some(Resolve::GetProcAddress),
            _ => None,
        }
    }
}

/// Why the driver could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `dlopen` failed.
    #[error("cannot load {library}: {source}")]
    Open {
        library: String,
        #[source]
        source: libloading::Error,
    },
    /// The resolver the route needs is missing.
    #[error("the driver has no {symbol} (route {route})")]
    Missing {
        symbol: &'static str,
        route: &'static str,
    },
}

/// A loaded driver: its table and the file it came from.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    table: &'static DriverTable,
    path: &'static Path,
    route: Resolve,
    /// The entries the route did not find (their calls return `CUDA_ERROR_NOT_FOUND`).
    missing: &'static [&'static str],
}

impl Loaded {
    pub fn table(&self) -> &'static DriverTable {
        self.table
    }

    /// The file the dynamic loader loaded (canonical), or the name asked for.
    pub fn path(&self) -> &'static Path {
        self.path
    }

    pub fn route(&self) -> Resolve {
        self.route
    }

    /// Whether the driver lacked the table entry `name` (so its calls return
    /// `CUDA_ERROR_NOT_FOUND`).
    pub fn is_missing(&self, name: &str) -> bool {
        self.missing.contains(&name)
    }
}

impl core::ops::Deref for Loaded {
    type Target = DriverTable;
    fn deref(&self) -> &DriverTable {
        self.table
    }
}

/// Opens `library` (a name the loader searches, or a path) and resolves every table entry by
/// `route`; an entry the driver lacks is a stub returning `CUDA_ERROR_NOT_FOUND`.
pub fn load(library: &OsStr, route: Resolve) -> Result<Loaded, LoadError> {
    // SAFETY: loading libcuda runs its initialisers; that is what every CUDA program does.
    let lib = unsafe { libloading::Library::new(library) }.map_err(|source| LoadError::Open {
        library: library.to_string_lossy().into_owned(),
        source,
    })?;
    let mut missing: Vec<&'static str> = Vec::new();
    let mut noted = |entry: &Entry, found: Option<NonNull<c_void>>| {
        if found.is_none() {
            missing.push(entry.name.to_str().unwrap_or("?"));
        }
        found
    };
    let dlsym = |name: &CStr| -> Option<NonNull<c_void>> {
        // SAFETY: the symbol is only read as an address here.
        let sym = unsafe { lib.get::<*mut c_void>(name.to_bytes_with_nul()) }.ok()?;
        NonNull::new(*sym)
    };
    let table = match route {
        // SAFETY: the driver exports each entry under its exact ABI name with the C signature
        // the table gives (cuda.h; the `_v2` names are the ABI variants).
        Resolve::Dlsym => unsafe { DriverTable::resolve(|entry| noted(entry, dlsym(entry.name))) },
        Resolve::GetProcAddress => {
            let gpa = dlsym(c"cuGetProcAddress_v2").ok_or(LoadError::Missing {
                symbol: "cuGetProcAddress_v2",
                route: route.as_str(),
            })?;
            // SAFETY: cuGetProcAddress_v2 has this signature since CUDA 12.0 (cuda.h).
            let gpa = unsafe {
                core::mem::transmute::<*mut c_void, cuda_abi::pfn::PFN_cuGetProcAddress_v2>(
                    gpa.as_ptr(),
                )
            };
            let resolved = |entry: &Entry| -> Option<NonNull<c_void>> {
                let version = entry.versioned.map_or(PINNED_CUDA_VERSION, |(_, v)| v);
                let mut p: *mut c_void = core::ptr::null_mut();
                let mut status: c_int = -1;
                // SAFETY: a NUL-terminated name and two valid out-pointers.
                let r = unsafe { gpa(entry.base().as_ptr(), &mut p, version, 0, &mut status) };
                if r.is_success() && status == proc_address_status::SUCCESS {
                    NonNull::new(p)
                } else {
                    None
                }
            };
            // SAFETY: the driver's resolver returns, for a base name and version, the entry
            // point of the ABI variant the table names for that version.
            unsafe { DriverTable::resolve(|entry| noted(entry, resolved(entry))) }
        }
    };
    let path = resolved_path(&lib, library.as_ref());
    // Never unloaded (module docs).
    std::mem::forget(lib);
    Ok(Loaded {
        table: Box::leak(Box::new(table)),
        path: Box::leak(path.into_boxed_path()),
        route,
        missing: Vec::leak(missing),
    })
}

/// The library's file, as the dynamic loader resolved it (for manifests and messages).
fn resolved_path(library: &libloading::Library, requested: &Path) -> PathBuf {
    // SAFETY: looking up a symbol only for its address.
    let address = unsafe { library.get::<*const c_void>(b"cuInit\0") }.map(|s| *s);
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
    if info.dli_fname.is_null() {
        return requested.to_path_buf();
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader for the library's life.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(name.to_string_lossy().as_ref())
        .unwrap_or_else(|_| requested.to_path_buf())
}
