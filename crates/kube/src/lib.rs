//! cuinterpose on Kubernetes: the admission webhook that shapes opted-in pods ([`shaping`],
//! [`webhook`], [`install`]), the `Checkpoint` custom resource ([`crd`]) and the node agent that
//! checkpoints, restores and discards on request ([`agent`]).

pub mod agent;
pub mod crd;
pub mod install;
pub mod shaping;
pub mod webhook;
