//! Scriptable CUDA test workloads and the helpers that drive them.
//!
//! - [`server`]: the `cuinterpose-workload` process. It loads `libcuda.so.1` at run time (so the same
//!   binary runs on the fake driver and on a GPU), resolves entry points through `dlsym` or
//!   `cuGetProcAddress_v2` ([`driver::Resolve`]), and executes text commands that arrive on a Unix
//!   socket; the grammar is in the crate README and [`server::COMMANDS`].
//! - [`harness`]: start workloads and groups from tests ([`harness::Workload`],
//!   [`harness::Group`]), with or without the shim, on the fake driver or the system's; processes
//!   are killed on drop.
//! - [`native`]: the driver's `cuCheckpointProcess*` API on another process's pid.
//! - [`scenarios`]: the scenario list that CI runs on the fake driver and the GPU lane on the real
//!   one (binary `cuinterpose-scenarios`).
//! - [`bench`]: the overhead loops of `cuinterpose-workload bench`.

pub mod bench;
pub mod driver;
pub mod grammar;
pub mod harness;
pub mod native;
pub mod pattern;
pub mod reply;
pub mod scenarios;
pub mod server;
pub mod wire;

pub use harness::{Artifacts, DriverKind, Group, TestEnv, Workload, WorkloadOptions};
pub use reply::Reply;
