//! libcuinterpose.so: the interposer loaded into every CUDA process (`LD_PRELOAD`).
//!
//! This crate is interception and the FFI boundary: [`hooks`] reads and writes the application's
//! pointers and calls `shim_runtime`'s tracked calls with Rust values. Every way a
//! program reaches a driver entry point ends at the same wrappers:
//!
//! 1. direct ELF binding (`-lcuda`): the wrappers are exported under the driver's names, and a
//!    preloaded object comes first in the global scope ([`table`]);
//! 2. `dlsym(handle, "cuX")` on the driver: the exported `dlsym` answers with the wrapper
//!    ([`dlsym`]); `RTLD_NEXT`/`RTLD_DEFAULT` go straight to glibc through a naked trampoline;
//! 3. `cuGetProcAddress{,_v2,_v2_ptsz}`, however obtained: the real resolver answers, then the
//!    wrapper is chosen by the symbol it returned ([`resolver`]);
//! 4. `cudaGetDriverEntryPoint{,ByVersion}{,_ptsz}` of a dynamic runtime ([`cudart`]).
//!
//! Functions the shim does not track come back from every route as the driver's own pointers. The
//! real functions are found at the first wrapper call ([`real`], [`loader`]). Nothing runs in a
//! library constructor; the `dlsym` path neither allocates nor locks.
//!
//! The exported symbol set is exactly the table's (`crates/cuda/src/driver_table.rs`; build.rs
//! writes the version script).

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
// Unit-test builds do not export (a test executable defining `dlsym` would capture its own std's
// lookups), so the entry points look unused there.
#![cfg_attr(test, allow(dead_code))]

#[cfg(not(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64")))]
compile_error!(
    "libcuinterpose is written for x86_64 Linux with glibc: its dlsym entry is an x86_64 naked \
     trampoline, and another architecture (aarch64) needs its own naked_asm! tail jump in src/dlsym.rs"
);

mod cudart;
mod dlsym;
mod hooks;
mod loader;
mod process;
mod real;
mod resolver;
mod table;
