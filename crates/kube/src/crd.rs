//! The `Checkpoint` custom resource: a request to checkpoint one pod's workload to disk, and the
//! record of what happened. Field names follow KEP-5823's `PodCheckpoint` (`podName`, `conditions`,
//! `checkpointedContainers`) so that users can move to it later.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of the resource.
pub const GROUP: &str = "cuinterpose.dev";
/// The finalizer the agent puts on a checkpoint whose files it wrote: deleting the object then
/// discards the files first.
pub const FINALIZER: &str = "cuinterpose.dev/discard-files";

/// Condition types, one per outcome of the tool, plus the progress of a running checkpoint.
pub mod condition {
    /// The agent took the request and is running the checkpoint.
    pub const IN_PROGRESS: &str = "InProgress";
    /// Checkpointed: the files are complete.
    pub const COMPLETED: &str = "Completed";
    /// Refused before anything changed: the workload runs as before.
    pub const REFUSED: &str = "Refused";
    /// Failed, then rolled back: the workload runs as before.
    pub const ROLLED_BACK: &str = "RolledBack";
    /// Failed after the native lock or while rebuilding, or unexpectedly (the tool's exit 1:
    /// what it left is not known): the workload needs attention.
    pub const NEEDS_ATTENTION: &str = "NeedsAttention";
    /// Restored into a placeholder pod (the message names it).
    pub const RESTORED: &str = "Restored";
    /// A restore into a placeholder was refused or failed (the message says which and why).
    pub const RESTORE_FAILED: &str = "RestoreFailed";
}

/// Where a checkpoint's files go.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointStorage {
    /// A directory on the node (shared storage mounted at the same path on every node lets a
    /// restore run on another node). The checkpoint goes to `<hostPath>/<namespace>/<name>`.
    pub host_path: String,
}

/// A request to checkpoint the workload of one pod to disk.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cuinterpose.dev",
    version = "v1alpha1",
    kind = "Checkpoint",
    namespaced,
    status = "CheckpointStatus",
    shortname = "cuckpt",
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".spec.podName"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Outcome","type":"string","jsonPath":".status.conditions[-1:].type"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// The pod to checkpoint, in the checkpoint's namespace. Its target container was shaped by
    /// the webhook (the pod carries the opt-in label).
    pub pod_name: String,
    /// The container to checkpoint; may be left out when the pod has one container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// Where the files go.
    pub storage: CheckpointStorage,
    /// Keep the workload running after the dump (default). False ends it once the dump is
    /// complete, as for a migration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave_running: Option<bool>,
    /// Retention: once this checkpoint completes, keep at most this many completed checkpoints of
    /// the pod (this one included), deleting the oldest; their files are discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub keep: Option<u32>,
}

/// One phase of the tool's run and how long it took.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTiming {
    pub name: String,
    pub millis: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// A container whose processes are in the checkpoint.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointedContainer {
    pub name: String,
    /// Host PID of the container's process tree root when it was checkpointed.
    pub root_pid: u32,
}

/// What happened.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointStatus {
    /// Outcome conditions (types in [`condition`]); each carries the tool's message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The node whose agent took the checkpoint and holds its files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The checkpoint directory on that node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpointed_containers: Vec<CheckpointedContainer>,
    /// The tool's phases, in order, with their durations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseTiming>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_bytes: Option<u64>,
    /// Placeholder pods this checkpoint was restored into.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restored_into: Vec<String>,
}

impl CheckpointStatus {
    /// The condition of `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether the checkpoint reached an outcome (it is never run again).
    pub fn finished(&self) -> bool {
        use condition::*;
        [COMPLETED, REFUSED, ROLLED_BACK, NEEDS_ATTENTION]
            .iter()
            .any(|t| self.condition(t).is_some())
    }
}

/// The CRD as YAML, as `deploy/kubernetes/crd/checkpoints.yaml` holds it.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = Checkpoint::crd();
    let yaml = serde_saphyr::to_string(&crd).expect("a CRD serializes to YAML");
    format!(
        "# Generated from crates/kube/src/crd.rs by `cuinterpose-agent crd`; do not edit.\n{yaml}"
    )
}
