//! The node agent: a `kube-runtime` controller over `Checkpoint` objects that acts only for pods on
//! its own node. It finds the pod's processes from their cgroups, calls the tool's library
//! ([`tool`]) to checkpoint, restore into a placeholder pod, or discard, and records the outcome as
//! status conditions and Events.
//!
//! Pods are read through [`PodLookup`], the one seam between the agent and the Pod API: in a cluster
//! it is the API server ([`ApiPods`]); where no kubelet and no Pod API exist (the tests against the
//! CRD API server), a fixed set of pods whose processes run in kubelet-style cgroups.

pub mod cgroup;
pub mod tool;

use crate::crd::{
    Checkpoint, CheckpointStatus, CheckpointedContainer, FINALIZER, PhaseTiming, condition,
};
use crate::shaping::{self, DEVICE_MAP_ANNOTATION, OPT_IN_LABEL, OPT_IN_VALUE, RESTORE_LABEL};
use cgroup::Procfs;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tool::{Failure, ToolOptions};

/// How often a completed checkpoint is looked at again for new restore placeholders.
const PLACEHOLDER_POLL: Duration = Duration::from_secs(3);
/// The agent's name in Events and as the field manager of its status writes.
pub const MANAGER: &str = "cuinterpose-agent";

/// What stopped one reconciliation (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the checkpoint has no namespace")]
    NoNamespace,
    #[error("discarding {dir}: {message}")]
    Discard { dir: String, message: String },
    #[error("the tool's worker thread: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// What the agent needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub name: String,
    pub uid: String,
    pub node_name: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Containers in spec order: name, whether the webhook shaped it, its runtime ID once running
    /// (`containerd://<id>` without the scheme).
    pub containers: Vec<PodContainer>,
}

/// One container of a [`PodInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainer {
    pub name: String,
    pub shaped: bool,
    pub id: Option<String>,
}

impl PodInfo {
    /// From a Pod object.
    pub fn from_pod(pod: &Pod) -> PodInfo {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|c| PodContainer {
                name: c.name.clone(),
                shaped: shaping::is_shaped(c),
                id: statuses
                    .iter()
                    .find(|s| s.name == c.name)
                    .and_then(|s| s.container_id.as_deref())
                    .map(|id| id.split_once("://").map_or(id, |(_, id)| id).to_string()),
            })
            .collect();
        PodInfo {
            name: pod.name_any(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            labels: pod.labels().clone(),
            annotations: pod.annotations().clone(),
            containers,
        }
    }

    fn opted_in(&self) -> bool {
        self.labels
            .get(OPT_IN_LABEL)
            .is_some_and(|v| v == OPT_IN_VALUE)
    }

    /// The container a checkpoint or restore acts on: the one named, or the only one.
    fn container(&self, name: Option<&str>) -> Result<&PodContainer, String> {
        match name {
            Some(name) => self
                .containers
                .iter()
                .find(|c| c.name == name)
                .ok_or_else(|| format!("pod {} has no container {name:?}", self.name)),
            None => match self.containers.as_slice() {
                [only] => Ok(only),
                _ => Err(format!(
                    "pod {} has {} containers; set spec.containerName",
                    self.name,
                    self.containers.len()
                )),
            },
        }
    }
}

/// The agent's view of Pods.
pub trait PodLookup: Send + Sync {
    /// The pod `name` in `namespace`, if it exists.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PodInfo>, kube::Error>>;
    /// The restore placeholders on `node` that name `checkpoint` (label [`RESTORE_LABEL`]).
    fn placeholders<'a>(
        &'a self,
        namespace: &'a str,
        checkpoint: &'a str,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodInfo>, kube::Error>>;
}

/// Pods from the API server.
#[derive(Clone)]
pub struct ApiPods {
    pub client: Client,
}

impl std::fmt::Debug for ApiPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiPods")
    }
}

impl PodLookup for ApiPods {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PodInfo>, kube::Error>> {
        Box::pin(async move {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            Ok(pods.get_opt(name).await?.as_ref().map(PodInfo::from_pod))
        })
    }

    fn placeholders<'a>(
        &'a self,
        namespace: &'a str,
        checkpoint: &'a str,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodInfo>, kube::Error>> {
        Box::pin(async move {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let params = ListParams::default()
                .labels(&format!("{RESTORE_LABEL}={checkpoint}"))
                .fields(&format!("spec.nodeName={node},status.phase=Running"));
            Ok(pods
                .list(&params)
                .await?
                .items
                .iter()
                .map(PodInfo::from_pod)
                .collect())
        })
    }
}

/// Everything a reconciliation uses.
pub struct Context {
    pub client: Client,
    /// This node's name (the DaemonSet passes `spec.nodeName` as `NODE_NAME`).
    pub node: String,
    pub pods: Arc<dyn PodLookup>,
    pub procfs: Procfs,
    pub tool: ToolOptions,
    pub recorder: Recorder,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(
        client: Client,
        node: String,
        pods: Arc<dyn PodLookup>,
        tool: ToolOptions,
    ) -> Context {
        let reporter = Reporter {
            controller: MANAGER.to_string(),
            instance: Some(node.clone()),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node,
            pods,
            procfs: Procfs::default(),
            tool,
        }
    }
}

/// Runs the controller until the watch stream ends.
pub async fn run(context: Arc<Context>) {
    let checkpoints: Api<Checkpoint> = Api::all(context.client.clone());
    Controller::new(checkpoints, watcher::Config::default())
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::warn!("reconcile: {e}");
            }
        })
        .await;
}

fn error_policy(_: Arc<Checkpoint>, error: &AgentError, _: Arc<Context>) -> Action {
    tracing::warn!("{error}");
    Action::requeue(Duration::from_secs(5))
}

fn condition(type_: &str, message: String, generation: Option<i64>) -> Condition {
    // The API's limit on a condition's message.
    const MAX: usize = 32768;
    let mut message = message;
    if message.len() > MAX {
        let mut end = MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    Condition {
        type_: type_.to_string(),
        status: "True".to_string(),
        reason: type_.to_string(),
        message,
        last_transition_time: Time(Timestamp::now()),
        observed_generation: generation,
    }
}

/// Sets `new` in `status`, replacing a condition of the same type.
fn set_condition(status: &mut CheckpointStatus, new: Condition) {
    status.conditions.retain(|c| c.type_ != new.type_);
    status.conditions.push(new);
}

async fn write_status(
    api: &Api<Checkpoint>,
    name: &str,
    status: &CheckpointStatus,
) -> Result<(), AgentError> {
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn event(
    context: &Context,
    object: &Checkpoint,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: reason.to_string(),
        secondary: None,
    };
    // An Event is a courtesy: the status holds the record, so a failed publish is only logged.
    if let Err(e) = context
        .recorder
        .publish(&event, &object.object_ref(&()))
        .await
    {
        tracing::warn!("publishing event {reason}: {e}");
    }
}

/// The checkpoint directory: `<hostPath>/<namespace>/<name>`.
fn location(object: &Checkpoint, namespace: &str) -> PathBuf {
    PathBuf::from(&object.spec.storage.host_path)
        .join(namespace)
        .join(object.name_any())
}

/// One reconciliation of one `Checkpoint`.
pub async fn reconcile(
    object: Arc<Checkpoint>,
    context: Arc<Context>,
) -> Result<Action, AgentError> {
    let namespace = object.namespace().ok_or(AgentError::NoNamespace)?;
    let api: Api<Checkpoint> = Api::namespaced(context.client.clone(), &namespace);
    let name = object.name_any();
    let status = object.status.clone().unwrap_or_default();
    let ours = status.node_name.as_deref() == Some(context.node.as_str());

    if object.meta().deletion_timestamp.is_some() {
        if ours && object.finalizers().iter().any(|f| f == FINALIZER) {
            discard_files(&object, &status, &context).await?;
            remove_finalizer(&api, &object).await?;
        }
        return Ok(Action::await_change());
    }
    if status.finished() {
        if ours && status.condition(condition::COMPLETED).is_some() {
            restore_placeholders(&object, &namespace, &api, &context).await?;
            return Ok(Action::requeue(PLACEHOLDER_POLL));
        }
        return Ok(Action::await_change());
    }
    if status.condition(condition::IN_PROGRESS).is_some() {
        if ours {
            // The controller's cache can lag behind this agent's own writes: the InProgress write
            // queues a reconcile that may run, after the checkpoint finished, on the object as it
            // was then. Only the server's current object tells that from an agent that stopped
            // during the run (and overwriting the outcome with NeedsAttention lost it: seen with
            // real pods, where the checkpoint is quick).
            let current = api.get(&name).await?;
            let Some(mut status) = current
                .status
                .filter(|s| s.condition(condition::IN_PROGRESS).is_some())
            else {
                return Ok(Action::await_change());
            };
            // Only an agent that stopped during the run leaves this behind: the outcome is unknown.
            set_condition(
                &mut status,
                condition(
                    condition::NEEDS_ATTENTION,
                    "the agent restarted while the checkpoint ran; its outcome is unknown: check the \
                     workload and the files"
                        .into(),
                    object.metadata.generation,
                ),
            );
            write_status(&api, &name, &status).await?;
        }
        return Ok(Action::await_change());
    }

    let pod = context.pods.get(&namespace, &object.spec.pod_name).await?;
    let Some(pod) = pod else {
        refuse(
            &api,
            &object,
            &context,
            format!("pod {} not found", object.spec.pod_name),
        )
        .await?;
        return Ok(Action::await_change());
    };
    if pod.node_name.as_deref() != Some(context.node.as_str()) {
        return Ok(Action::await_change());
    }
    checkpoint(&object, &namespace, &api, &context, &pod).await?;
    Ok(Action::await_change())
}

async fn refuse(
    api: &Api<Checkpoint>,
    object: &Checkpoint,
    context: &Context,
    message: String,
) -> Result<(), AgentError> {
    let mut status = object.status.clone().unwrap_or_default();
    set_condition(
        &mut status,
        condition(
            condition::REFUSED,
            message.clone(),
            object.metadata.generation,
        ),
    );
    write_status(api, &object.name_any(), &status).await?;
    event(
        context,
        object,
        EventType::Warning,
        condition::REFUSED,
        message,
    )
    .await;
    Ok(())
}

async fn checkpoint(
    object: &Checkpoint,
    namespace: &str,
    api: &Api<Checkpoint>,
    context: &Context,
    pod: &PodInfo,
) -> Result<(), AgentError> {
    let (container, root) = match checkpoint_target(context, pod, object) {
        Ok(target) => target,
        Err(message) => return refuse(api, object, context, message).await,
    };
    let dir = location(object, namespace);
    let mut status = start_checkpoint(api, object, context, pod, &container, root, &dir).await?;

    let tool = context.tool.clone();
    let leave_running = object.spec.leave_running.unwrap_or(true);
    let run_dir = dir.clone();
    let result = tokio::task::spawn_blocking(move || {
        if let Some(parent) = run_dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| tool::ToolFailure {
                failure: Failure::Refused,
                message: format!("creating {}: {e}", parent.display()),
            })?;
        }
        tool::checkpoint(&tool, root, &run_dir, leave_running)
    })
    .await?;

    status
        .conditions
        .retain(|c| c.type_ != condition::IN_PROGRESS);
    match result {
        Ok(report) => {
            let message = format!(
                "checkpointed container {:?} of pod {} to {} in {:.0} ms ({} bytes of images){}",
                container.name,
                pod.name,
                dir.display(),
                report.total_millis,
                report.image_bytes,
                if leave_running {
                    "; the workload keeps running"
                } else {
                    "; the workload was ended"
                }
            );
            status.checkpointed_containers = vec![CheckpointedContainer {
                name: container.name.clone(),
                root_pid: root,
            }];
            checkpoint_done(api, object, context, status, &report, message).await
        }
        Err(failure) => checkpoint_failed(api, object, context, status, failure).await,
    }
}

/// The container of the pod a checkpoint is for, and its root process; why not, a refusal's
/// message (a pod cuinterpose did not shape, a container it did not, no root process).
fn checkpoint_target(
    context: &Context,
    pod: &PodInfo,
    object: &Checkpoint,
) -> Result<(PodContainer, u32), String> {
    if !pod.opted_in() {
        return Err(format!(
            "pod {} does not carry the label {OPT_IN_LABEL}={OPT_IN_VALUE}: cuinterpose did not shape it",
            pod.name
        ));
    }
    let container = match pod.container(object.spec.container_name.as_deref())? {
        c if c.shaped => c.clone(),
        c => {
            return Err(format!(
                "container {:?} of pod {} was not shaped by cuinterpose",
                c.name, pod.name
            ));
        }
    };
    let root = context
        .procfs
        .container_root(&container.name, &pod.uid, container.id.as_deref())
        .map_err(|e| e.to_string())?;
    Ok((container, root))
}

/// What goes before a checkpoint writes anything: the finalizer (so that no deletion can leave
/// files behind), the node, the location and the in-progress condition in the status, and the
/// Started event. Returns the status, to be completed with the outcome.
async fn start_checkpoint(
    api: &Api<Checkpoint>,
    object: &Checkpoint,
    context: &Context,
    pod: &PodInfo,
    container: &PodContainer,
    root: u32,
    dir: &std::path::Path,
) -> Result<CheckpointStatus, AgentError> {
    let name = object.name_any();
    if !object.finalizers().iter().any(|f| f == FINALIZER) {
        let patch = serde_json::json!({"metadata": {"finalizers": [FINALIZER]}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let mut status = object.status.clone().unwrap_or_default();
    status.node_name = Some(context.node.clone());
    status.location = Some(dir.display().to_string());
    set_condition(
        &mut status,
        condition(
            condition::IN_PROGRESS,
            format!(
                "checkpointing container {:?} (pid {root}) to {}",
                container.name,
                dir.display()
            ),
            object.metadata.generation,
        ),
    );
    write_status(api, &name, &status).await?;
    event(
        context,
        object,
        EventType::Normal,
        "Started",
        format!(
            "checkpointing pod {} container {:?}",
            pod.name, container.name
        ),
    )
    .await;
    Ok(status)
}

/// A checkpoint that completed: its phases, image bytes and the Completed condition in the status,
/// the Completed event, then the oldest checkpoints beyond `keep` deleted.
async fn checkpoint_done(
    api: &Api<Checkpoint>,
    object: &Checkpoint,
    context: &Context,
    mut status: CheckpointStatus,
    report: &tool::ToolReport,
    message: String,
) -> Result<(), AgentError> {
    status.phases = report
        .phases
        .iter()
        .map(|p| PhaseTiming {
            name: p.name.clone(),
            millis: p.millis,
            bytes: p.bytes,
        })
        .collect();
    status.image_bytes = Some(report.image_bytes);
    set_condition(
        &mut status,
        condition(
            condition::COMPLETED,
            message.clone(),
            object.metadata.generation,
        ),
    );
    write_status(api, &object.name_any(), &status).await?;
    event(
        context,
        object,
        EventType::Normal,
        condition::COMPLETED,
        message,
    )
    .await;
    if let Some(keep) = object.spec.keep {
        retain(api, object, keep).await?;
    }
    Ok(())
}

/// A checkpoint that failed: the condition its failure names (refused, rolled back, needs
/// attention) in the status, and a Warning event.
async fn checkpoint_failed(
    api: &Api<Checkpoint>,
    object: &Checkpoint,
    context: &Context,
    mut status: CheckpointStatus,
    failure: tool::ToolFailure,
) -> Result<(), AgentError> {
    let type_ = match failure.failure {
        Failure::Refused => condition::REFUSED,
        Failure::RolledBack => condition::ROLLED_BACK,
        Failure::NeedsAttention => condition::NEEDS_ATTENTION,
    };
    set_condition(
        &mut status,
        condition(type_, failure.message.clone(), object.metadata.generation),
    );
    write_status(api, &object.name_any(), &status).await?;
    event(context, object, EventType::Warning, type_, failure.message).await;
    Ok(())
}

/// Deletes the oldest completed checkpoints of the same pod beyond `keep` (their finalizers then
/// discard the files).
async fn retain(api: &Api<Checkpoint>, object: &Checkpoint, keep: u32) -> Result<(), AgentError> {
    let all = api.list(&ListParams::default()).await?;
    let mut completed: Vec<(Timestamp, String)> = all
        .items
        .iter()
        .filter(|c| {
            c.spec.pod_name == object.spec.pod_name && c.meta().deletion_timestamp.is_none()
        })
        .filter_map(|c| {
            let done = c.status.as_ref()?.condition(condition::COMPLETED)?;
            Some((done.last_transition_time.0, c.name_any()))
        })
        .collect();
    completed.sort();
    let excess = completed.len().saturating_sub(keep as usize);
    for (_, name) in completed.into_iter().take(excess) {
        tracing::info!(
            checkpoint = name,
            "deleting: beyond keep={keep} for pod {}",
            object.spec.pod_name
        );
        api.delete(&name, &DeleteParams::default()).await?;
    }
    Ok(())
}

async fn discard_files(
    object: &Checkpoint,
    status: &CheckpointStatus,
    context: &Context,
) -> Result<(), AgentError> {
    let Some(dir) = status.location.clone() else {
        return Ok(());
    };
    let path = PathBuf::from(&dir);
    if !path.exists() {
        // Refused before anything was written.
        return Ok(());
    }
    let result = tokio::task::spawn_blocking(move || tool::discard(&path)).await?;
    match result {
        Ok(message) => {
            event(context, object, EventType::Normal, "Discarded", message).await;
            Ok(())
        }
        Err(failure) => {
            event(
                context,
                object,
                EventType::Warning,
                "DiscardFailed",
                failure.message.clone(),
            )
            .await;
            Err(AgentError::Discard {
                dir,
                message: failure.message,
            })
        }
    }
}

async fn remove_finalizer(api: &Api<Checkpoint>, object: &Checkpoint) -> Result<(), AgentError> {
    let Some(index) = object.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    // The test makes the removal conditional on the list being unchanged since it was read.
    let patch = serde_json::json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]);
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("a valid JSON patch");
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::<()>::Json(patch),
    )
    .await?;
    Ok(())
}

async fn restore_placeholders(
    object: &Checkpoint,
    namespace: &str,
    api: &Api<Checkpoint>,
    context: &Context,
) -> Result<(), AgentError> {
    let name = object.name_any();
    let mut status = object.status.clone().unwrap_or_default();
    let Some(dir) = status.location.clone() else {
        return Ok(());
    };
    let placeholders = context
        .pods
        .placeholders(namespace, &name, &context.node)
        .await?;
    for pod in placeholders {
        let tried = status.restored_into.contains(&pod.name)
            || status
                .condition(condition::RESTORE_FAILED)
                .is_some_and(|c| c.message.starts_with(&format!("pod {}:", pod.name)));
        if tried || pod.labels.get(RESTORE_LABEL) != Some(&name) {
            continue;
        }
        let outcome = restore_into(&pod, object, &dir, context).await?;
        match outcome {
            Ok(message) => {
                status.restored_into.push(pod.name.clone());
                set_condition(
                    &mut status,
                    condition(
                        condition::RESTORED,
                        message.clone(),
                        object.metadata.generation,
                    ),
                );
                write_status(api, &name, &status).await?;
                event(
                    context,
                    object,
                    EventType::Normal,
                    condition::RESTORED,
                    message,
                )
                .await;
            }
            Err(message) => {
                let message = format!("pod {}: {message}", pod.name);
                set_condition(
                    &mut status,
                    condition(
                        condition::RESTORE_FAILED,
                        message.clone(),
                        object.metadata.generation,
                    ),
                );
                write_status(api, &name, &status).await?;
                event(
                    context,
                    object,
                    EventType::Warning,
                    condition::RESTORE_FAILED,
                    message,
                )
                .await;
            }
        }
    }
    Ok(())
}

/// Restores the checkpoint in `dir` and moves the restored tree into the placeholder's cgroups.
async fn restore_into(
    pod: &PodInfo,
    object: &Checkpoint,
    dir: &str,
    context: &Context,
) -> Result<Result<String, String>, AgentError> {
    if !pod.opted_in() {
        return Ok(Err(format!(
            "the placeholder does not carry {OPT_IN_LABEL}={OPT_IN_VALUE}, so the shim is not at the path the checkpoint needs"
        )));
    }
    let wanted = object
        .status
        .as_ref()
        .and_then(|s| s.checkpointed_containers.first())
        .map(|c| c.name.as_str());
    let container = match pod.container(wanted).or_else(|_| pod.container(None)) {
        Ok(c) => c.clone(),
        Err(e) => return Ok(Err(e)),
    };
    let device_map = match pod
        .annotations
        .get(DEVICE_MAP_ANNOTATION)
        .map(|m| tool::parse_device_map(m))
    {
        None => Vec::new(),
        Some(Ok(map)) => map,
        Some(Err(e)) => return Ok(Err(format!("annotation {DEVICE_MAP_ANNOTATION}: {e}"))),
    };
    // The placeholder's cgroup, found before the restore: nothing is restored for a pod whose
    // processes cannot be found on this node. Its init also gives the namespaces (network, IPC,
    // UTS; mount for a checkpoint taken in a container) and the root filesystem the tree is
    // restored into.
    let procfs = context.procfs.clone();
    let found = procfs
        .container_root(&container.name, &pod.uid, container.id.as_deref())
        .or_else(|e| match e {
            // A container in the node's PID namespace (`hostPID`) has no init of its own: its
            // first process gives the namespaces.
            cgroup::CgroupError::NoInit { pids, .. } if !pids.is_empty() => Ok(pids[0]),
            e => Err(e),
        })
        .map_err(|e| e.to_string())
        .and_then(|pid| {
            // Every hierarchy, not only the unified one: on a cgroup v1 or hybrid node the
            // runtime puts the container in each v1 controller's hierarchy too, and its limits
            // and accounting live there.
            let cgroups = tool::cgroup_dirs(pid).map_err(|f| f.message)?;
            if cgroups.is_empty() {
                return Err(format!(
                    "no cgroup hierarchy of container {:?} (pid {pid}) is mounted here",
                    container.name
                ));
            }
            Ok((pid, cgroups))
        });
    let (placeholder_pid, cgroups) = match found {
        Ok(found) => found,
        Err(e) => return Ok(Err(e)),
    };
    let tool_options = context.tool.clone();
    let dir = PathBuf::from(dir);
    let placeholder = pod.name.clone();
    let result = tokio::task::spawn_blocking(move || {
        let report = tool::restore(&tool_options, &dir, device_map, placeholder_pid)
            .map_err(|f| f.message)?;
        let moved = tool::process_tree(report.root)
            .map_err(|f| f.message)
            .and_then(|pids| cgroup::move_into(&cgroups, &pids).map_err(|e| e.to_string()));
        let note = match moved {
            Ok(()) => format!(
                "in its cgroups {}",
                (cgroups.iter().map(|c| c.display().to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(e) => format!("but not moved into its cgroups: {e}"),
        };
        let joined = match report.namespaces.as_slice() {
            [] => String::new(),
            names => format!(", in its {} namespaces", names.join(", ")),
        };
        Ok::<_, String>(format!(
            "restored into pod {placeholder} (root pid {}) in {:.0} ms{joined}, {note}",
            report.root, report.total_millis
        ))
    })
    .await?;
    Ok(result)
}
