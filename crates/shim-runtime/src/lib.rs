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
//! Unsafe code is denied in this crate except in its tests. The carrier memory (raw host memory
//! that DMA reads and writes while a copy runs) is the copy engine's, in the `cuinterpose-copy`
//! crate ([`copy`]), with the unsafe code it needs.
//!
//! Layout ([`runtime`] says which state each job owns): `runtime` (the composition of the jobs
//! and the shim's entry points), `instance` (the process-global instance, its start, fork),
//! `track` (the tracking job: the tracked calls over the `registry`, pure bookkeeping),
//! `multicast` (multicast objects' calls and capture steps), `owned_alloc` (cuMemAlloc on owned
//! VMM), `ipc` (legacy IPC of owned memory), `contexts` (their teardown with their context, peer
//! grants), `unowned` (device memory the shim does not own, counted), `capture` (the capture's
//! state and errors), `phases` (the capture phases), `store` (the byte stores Save and Load take,
//! and Load's rebuild), `datafile`, `blockstore` and `digest` (streaming a data file), `drain`
//! (Hold, Drain, Admit), `gate` (the two gates a capture closes), `lease` (the control server's
//! state: one capture at a time, held by the tool's connection), `server` (control socket),
//! `exports` (the export cache), `fdutil` (tickets), `threads`, `config` (the environment, read
//! once), `log` (re-exported from [`copy`]).

#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod blockstore;
pub mod capture;
pub mod config;
pub mod contexts;
pub mod datafile;
pub mod digest;
pub mod drain;
pub mod exports;
pub mod fdutil;
pub mod gate;
pub mod instance;
pub mod ipc;
pub mod lease;
pub mod multicast;
pub mod owned_alloc;
pub mod phases;
pub mod registry;
pub mod runtime;
pub mod server;
mod store;
pub mod threads;
pub mod track;
pub mod unowned;

#[cfg(test)]
mod tests;

/// The in-application logger lives with the copy engine (the carrier helper writes through it
/// too); the runtime's modules reach it as `crate::log`.
pub use copy::log;
pub use cuda::DriverTable as Real;
