//! The interposer's runtime: what happens inside the wrapped driver calls.
//!
//! `crates/shim` (the cdylib) owns interception and the FFI boundary: the exports, `dlsym`, the
//! resolvers, the real driver table (a [`cuda::DriverTable`]), and every read and write of the
//! application's pointers. It calls the runtime with Rust values and gets Rust values back: the
//! tracked calls of [`runtime::Runtime`] (`track.rs`) take sizes, addresses, [`cuda::VirtualHandle`]s,
//! property structs and slices, and return `Result<_, CUresult>` (the driver's code unchanged on
//! failure: PyTorch relies on the exact codes).
//!
//! Before the runtime starts (the first successful `cuInit`), and if it cannot start, the shim
//! passes calls straight through. In a child forked after it started, tracked calls return
//! `CUDA_ERROR_NOT_INITIALIZED` (see [`runtime`]).
//!
//! Unsafe code is denied in this crate except in [`copy`], the carrier memory module (raw host
//! memory that DMA reads and writes while a copy runs; its docs say why each part must be unsafe),
//! and in the test-only driver and tests.
//!
//! Layout: `registry` (pure bookkeeping), `track` (the tracked calls), `gate` (the two gates a
//! capture closes: tracked calls and GPU submissions), `drain` (Hold, Drain, Admit), `lease` (one
//! capture at a time, held by the tool's connection),
//! `owned_alloc` (cuMemAlloc on owned VMM), `ipc` (legacy IPC of owned memory), `contexts` (their
//! teardown with their context), `unowned` (device memory the shim does not own, counted), `exports`
//! (the export cache), `fdutil` (tickets), `server` (control socket), `phases` (capture
//! and rebuild), `copy` (carriers and the copy engine), `config` (the environment, read once), `log`.

#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod blockstore;
pub mod carrier_helper;
pub mod config;
pub mod contexts;
pub mod copy;
pub mod datafile;
pub mod digest;
pub mod drain;
pub mod exports;
pub mod fdutil;
pub mod gate;
pub mod ipc;
pub mod lease;
pub mod log;
pub mod multicast;
pub mod owned_alloc;
pub mod phases;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod track;
pub mod unowned;

#[cfg(test)]
mod testdriver;
#[cfg(test)]
mod tests;

pub use cuda::DriverTable as Real;
