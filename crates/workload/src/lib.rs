//! The scriptable CUDA workload that `cuinterpose demo` and `cuinterpose bench` start, and the
//! client that starts and drives it. It knows only `libcuda.so.1`: which driver it gets (a GPU's, or
//! any other library of that name) is the loader's business, so the same binary runs everywhere.
//!
//! - [`server`]: the `cuinterpose-workload` process. It loads `libcuda.so.1` at run time, resolves
//!   entry points through `dlsym` or `cuGetProcAddress_v2` ([`driver::Resolve`]), and executes text
//!   commands that arrive on a Unix socket; the grammar is in the crate README and
//!   [`server::COMMANDS`].
//! - [`launch`]: start workloads and process trees ([`launch::Launcher`], [`launch::Workload`],
//!   [`launch::Group`]), with or without the shim; processes are killed on drop.
//! - [`wire`]: the command channel; [`reply`]: what each command answers.
//! - [`bench`]: the overhead loops of `cuinterpose-workload bench`.
//! - [`kernels`]: the PTX module and its launchers; [`busy`]: the busy modes (a loop of kernels,
//!   a ring of spin-flag exchanges, NCCL all-reduces) on threads of their own; [`nccl`]:
//!   `libnccl.so.2` opened at run time.

pub mod bench;
pub mod busy;
pub mod driver;
pub mod grammar;
pub mod kernels;
pub mod launch;
#[allow(unsafe_code)] // the FFI layer of libnccl.so.2: each block says why
pub mod nccl;
pub mod pattern;
pub mod reply;
pub mod server;
pub mod wire;

/// The workload's executable name: next to `cuinterpose` in a cargo build and in the release's
/// `bin/`.
pub const PROGRAM: &str = "cuinterpose-workload";
