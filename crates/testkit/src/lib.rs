//! Test helpers around the product workload (`cuinterpose-workload`, crate `crates/workload`), and
//! the scenario list (`crates/testkit/GUIDE.md` describes both).
//!
//! - [`harness`]: a hermetic test environment ([`harness::TestEnv`]) on the fake driver or the
//!   system's, the build artifacts, the fake driver's accounting; workloads and groups
//!   ([`harness::Workload`], [`harness::Group`]) are the workload crate's client.
//! - [`container`]: emulated containers (`unshare` and `pivot_root`, as runc makes them).
//! - [`runtime`]: real container runtimes (runc, Podman, containerd) over a locally made image.
//! - [`cri`]: a client of the Kubernetes CRI (containerd's), to make pods as a kubelet does.
//! - [`native`]: the driver's `cuCheckpointProcess*` API on another process's pid.
//! - [`probes`]: the error probes, bad driver calls whose result codes the `vmm-errors` scenario
//!   compares between drivers, run in a process of their own (binary `cuinterpose-probe-errors`).
//! - [`scenarios`]: the scenario list that CI runs on the fake driver and the GPU lane on the real
//!   one (binary `cuinterpose-scenarios`).
//!
//! The workload's own modules are re-exported ([`driver`], [`grammar`], [`reply`], [`server`],
//! [`wire`]) so that tests reach them through one crate.

pub mod container;
pub mod cri;
pub mod harness;
pub mod native;
pub mod probes;
pub mod runtime;
pub mod scenarios;

pub use harness::{Artifacts, DriverKind, Group, TestEnv, Workload, WorkloadOptions};
pub use workload::reply::Reply;
pub use workload::{driver, grammar, reply, server, wire};
