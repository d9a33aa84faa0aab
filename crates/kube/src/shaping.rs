//! Pod shaping: what the admission webhook does to an opted-in pod, as a pure function from the pod
//! to an RFC 6902 JSON patch (or a refusal that names every problem at once).
//!
//! A shaped pod gets
//! - an init container (the product's image, pinned by digest) that copies the launcher and the shim
//!   into the `emptyDir` volume [`INSTALL_VOLUME`];
//! - in every target container: that volume read-only at [`INSTALL_DIR`], a per-container `emptyDir`
//!   at [`CONTROL_DIR`] for the shim's control socket, `CUINTERPOSE_CONTROL_DIR` pointing at it, and
//!   its `command` prefixed with the launcher (`cuinterpose run --shim ... --`), which sees the
//!   container's resolved environment, prepends the shim to `LD_PRELOAD` and execs the command in its
//!   own place (no shell). A container that may make namespaces (privileged, or `CAP_SYS_ADMIN`
//!   added) gets `run --pid-namespace`, the launcher staying the container's init and the
//!   workload the init of a PID namespace below it; in any other the container's own process
//!   stays its PID 1. Both are checkpointed to disk (control::container: CRIU runs inside the
//!   container around the first, in a copy of the container's mount namespace for the second)
//!   ([`launcher_prefix`]).
//!
//! Shaping is idempotent (the API server may call the webhook again, `reinvocationPolicy: IfNeeded`):
//! what is already there exactly as shaping would make it is left alone, and anything of the same
//! name that differs is a refusal rather than something silently overwritten.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};

/// The label that opts a pod in (the webhook's `objectSelector` matches it, so other pods never
/// reach the webhook).
pub const OPT_IN_LABEL: &str = "cuinterpose.dev/inject";
/// The opt-in label's value.
pub const OPT_IN_VALUE: &str = "true";
/// The label of a restore placeholder: names the `Checkpoint` (same namespace) to restore into it.
pub const RESTORE_LABEL: &str = "cuinterpose.dev/restore-from";
/// Annotation: comma-separated names of the containers to shape (default: all of them).
pub const CONTAINERS_ANNOTATION: &str = "cuinterpose.dev/containers";
/// Annotation of a restore placeholder: the device map for the restore (`OLD=NEW,...`).
pub const DEVICE_MAP_ANNOTATION: &str = "cuinterpose.dev/device-map";

/// The init container's name.
pub const INIT_CONTAINER: &str = "cuinterpose-install";
/// The volume holding the launcher and the shim.
pub const INSTALL_VOLUME: &str = "cuinterpose-bin";
/// Where targets see the launcher and the shim (read-only).
pub const INSTALL_DIR: &str = "/opt/cuinterpose";
/// Where the init container sees the volume it fills. The product's image keeps its own copy under
/// [`IMAGE_DIR`], so the two never overlap.
pub const INIT_TARGET_DIR: &str = "/cuinterpose-install";
/// Where the product's image keeps the launcher, the shim and the binaries of this crate.
pub const IMAGE_DIR: &str = "/opt/cuinterpose";
/// The launcher (`cuinterpose`) as targets see it.
pub const LAUNCHER: &str = "/opt/cuinterpose/cuinterpose";
/// The shim as targets see it; a restore needs it at this same path.
pub const SHIM: &str = "/opt/cuinterpose/libcuinterpose.so";
/// The control-socket directory in each target container.
pub const CONTROL_DIR: &str = "/run/cuinterpose";
/// Prefix of the per-container control-socket volume's name (followed by the container's name).
pub const CONTROL_VOLUME_PREFIX: &str = "cuinterpose-ctl-";
/// The shim's environment variable for its control-socket directory.
pub const CONTROL_DIR_ENV: &str = "CUINTERPOSE_CONTROL_DIR";

/// How the webhook shapes pods: the product image and what its init container may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeConfig {
    /// `registry/name@sha256:<64 hex>`: a digest, so that every pod gets the same bytes.
    pub image: String,
    /// CPU for the init container (requests equal limits, so a Guaranteed pod stays Guaranteed).
    pub cpu: String,
    /// Memory for the init container (requests equal limits).
    pub memory: String,
}

/// A configuration the webhook cannot start with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("image {0:?} is not pinned by digest (name@sha256:<64 hex digits>)")]
    ImageNotPinned(String),
}

impl ShapeConfig {
    /// Checks that the image is pinned by digest.
    pub fn new(image: String, cpu: String, memory: String) -> Result<ShapeConfig, ConfigError> {
        let pinned = image.split_once("@sha256:").is_some_and(|(name, digest)| {
            !name.is_empty()
                && digest.len() == 64
                && digest
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if !pinned {
            return Err(ConfigError::ImageNotPinned(image));
        }
        Ok(ShapeConfig { image, cpu, memory })
    }
}

/// Why a pod cannot be shaped: every problem found, each naming what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub problems: Vec<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cuinterpose cannot shape this pod: {}",
            self.problems.join("; ")
        )
    }
}

/// The launcher prefix put before the `command` of `container`: `run --pid-namespace` where
/// the container may make namespaces (privileged, or `CAP_SYS_ADMIN` added), so that its workload
/// runs as the init of a PID namespace below the container's (control::container: CRIU runs
/// inside the container around it); a plain `run` elsewhere, whose workload stays the
/// container's PID 1 (CRIU runs in a copy of the container's mount namespace). Both can be
/// suspended in place and checkpointed to disk.
pub fn launcher_prefix(container: &Container) -> Vec<String> {
    let words: &[&str] = if may_make_namespaces(container) {
        &[LAUNCHER, "run", "--pid-namespace", "--shim", SHIM, "--"]
    } else {
        &[LAUNCHER, "run", "--shim", SHIM, "--"]
    };
    words.iter().map(|w| w.to_string()).collect()
}

/// Whether `container` runs privileged or with `CAP_SYS_ADMIN` added (what a PID namespace with
/// its own `/proc` needs).
fn may_make_namespaces(container: &Container) -> bool {
    let Some(security) = &container.security_context else {
        return false;
    };
    security.privileged == Some(true)
        || security
            .capabilities
            .as_ref()
            .and_then(|c| c.add.as_deref())
            .is_some_and(|add| {
                add.iter().any(|c| {
                    c.trim_start_matches("CAP_")
                        .eq_ignore_ascii_case("SYS_ADMIN")
                })
            })
}

/// Whether shaping put its launcher before `container`'s command.
pub fn is_shaped(container: &Container) -> bool {
    container
        .command
        .as_deref()
        .is_some_and(|command| command.starts_with(&launcher_prefix(container)))
}

/// The name of a container's control-socket volume.
pub fn control_volume(container: &str) -> String {
    format!("{CONTROL_VOLUME_PREFIX}{container}")
}

fn empty_dir_volume(name: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// The init container as shaping makes it.
pub fn init_container(config: &ShapeConfig) -> Container {
    let amounts = BTreeMap::from([
        ("cpu".to_string(), Quantity(config.cpu.clone())),
        ("memory".to_string(), Quantity(config.memory.clone())),
    ]);
    Container {
        name: INIT_CONTAINER.to_string(),
        image: Some(config.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec![
            format!("{IMAGE_DIR}/cuinterpose-webhook"),
            "install".to_string(),
            INIT_TARGET_DIR.to_string(),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(amounts.clone()),
            limits: Some(amounts),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_string(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: INSTALL_VOLUME.to_string(),
            mount_path: INIT_TARGET_DIR.to_string(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    }
}

fn target_mounts(container: &str) -> [VolumeMount; 2] {
    [
        VolumeMount {
            name: INSTALL_VOLUME.to_string(),
            mount_path: INSTALL_DIR.to_string(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: control_volume(container),
            mount_path: CONTROL_DIR.to_string(),
            ..VolumeMount::default()
        },
    ]
}

fn control_env() -> EnvVar {
    EnvVar {
        name: CONTROL_DIR_ENV.to_string(),
        value: Some(CONTROL_DIR.to_string()),
        value_from: None,
    }
}

fn to_value<T: serde::Serialize>(value: &T) -> Value {
    // Serializing the k8s-openapi types cannot fail: they are plain data with string keys.
    serde_json::to_value(value).expect("k8s-openapi types serialize")
}

/// Whether `path` is `base` or below it (`/opt/cuinterpose/x` is below `/opt/cuinterpose`, and
/// `/opt/cuinterpose-x` is not).
fn at_or_below(path: &str, base: &str) -> bool {
    let path = path.trim_end_matches('/');
    path == base || path.strip_prefix(base).is_some_and(|r| r.starts_with('/'))
}

/// Adds `items` to the array at `path`: the whole array when the field is absent, else one `add`
/// per item at its end.
fn add_items(ops: &mut Vec<Value>, path: &str, present: bool, items: Vec<Value>) {
    if items.is_empty() {
        return;
    }
    if present {
        ops.extend(
            items
                .into_iter()
                .map(|item| json!({"op": "add", "path": format!("{path}/-"), "value": item})),
        );
    } else {
        ops.push(json!({"op": "add", "path": path, "value": items}));
    }
}

/// The containers to shape: those named by [`CONTAINERS_ANNOTATION`], or all.
fn targets<'a>(
    pod: &Pod,
    spec: &'a PodSpec,
    problems: &mut Vec<String>,
) -> Vec<(usize, &'a Container)> {
    let named = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTAINERS_ANNOTATION));
    let Some(named) = named else {
        return spec.containers.iter().enumerate().collect();
    };
    let names: Vec<&str> = named
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        problems.push(format!(
            "annotation {CONTAINERS_ANNOTATION} names no container"
        ));
    }
    for name in &names {
        if !spec.containers.iter().any(|c| c.name == *name) {
            problems.push(format!(
                "annotation {CONTAINERS_ANNOTATION} names container {name:?}, which the pod does not have"
            ));
        }
    }
    spec.containers
        .iter()
        .enumerate()
        .filter(|(_, c)| names.contains(&c.name.as_str()))
        .collect()
}

/// The JSON patch that shapes `pod` (empty when it is already shaped), or why it cannot be shaped.
pub fn shape(pod: &Pod, config: &ShapeConfig) -> Result<Vec<Value>, Refusal> {
    let mut problems = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return Err(Refusal {
            problems: vec!["the pod has no spec".to_string()],
        });
    };
    if spec.share_process_namespace == Some(true) {
        problems.push(
            "shareProcessNamespace is true: the containers then share one PID namespace whose init \
             is the pod's sandbox, and checkpoint to disk needs each target as the root of its own"
                .to_string(),
        );
    }
    let targets = targets(pod, spec, &mut problems);
    let mut ops = Vec::new();

    // Volumes: the install volume and one control volume per target.
    let mut wanted = vec![empty_dir_volume(INSTALL_VOLUME)];
    wanted.extend(
        targets
            .iter()
            .map(|(_, c)| empty_dir_volume(&control_volume(&c.name))),
    );
    let existing = spec.volumes.as_deref().unwrap_or_default();
    let mut missing = Vec::new();
    for volume in wanted {
        if volume.name.len() > 63 {
            problems.push(format!(
                "the control-socket volume name {:?} would be longer than 63 characters; shorten \
                 the container's name",
                volume.name
            ));
            continue;
        }
        match existing.iter().find(|v| v.name == volume.name) {
            Some(v) if *v == volume => {}
            Some(_) => problems.push(format!(
                "the pod already has a volume named {:?}, which cuinterpose needs for its own; \
                 rename the pod's volume",
                volume.name
            )),
            None => missing.push(to_value(&volume)),
        }
    }
    add_items(&mut ops, "/spec/volumes", spec.volumes.is_some(), missing);

    // The init container, first, so that the files are in place before any other container starts.
    let init = init_container(config);
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    match inits.iter().find(|c| c.name == INIT_CONTAINER) {
        Some(c) if *c == init => {}
        Some(_) => problems.push(format!(
            "the pod already has an init container named {INIT_CONTAINER:?} that cuinterpose did not \
             make (or made with another image); rename or remove it"
        )),
        None if spec.init_containers.is_some() => {
            ops.push(json!({"op": "add", "path": "/spec/initContainers/0", "value": to_value(&init)}))
        }
        None => ops.push(json!({"op": "add", "path": "/spec/initContainers", "value": [to_value(&init)]})),
    }

    for (index, container) in &targets {
        shape_container(*index, container, &mut ops, &mut problems);
    }
    if problems.is_empty() {
        Ok(ops)
    } else {
        Err(Refusal { problems })
    }
}

fn shape_container(
    index: usize,
    container: &Container,
    ops: &mut Vec<Value>,
    problems: &mut Vec<String>,
) {
    let base = format!("/spec/containers/{index}");
    shape_command(container, &base, ops, problems);
    shape_env(container, &base, ops, problems);
    shape_mounts(container, &base, ops, problems);
}

/// The launcher in front of the container's command.
fn shape_command(
    container: &Container,
    base: &str,
    ops: &mut Vec<Value>,
    problems: &mut Vec<String>,
) {
    let name = &container.name;
    let prefix = launcher_prefix(container);
    match container.command.as_deref() {
        None | Some([]) => problems.push(format!(
            "container {name:?} has no command: the launcher must run before the image's entrypoint, \
             which the webhook cannot see; set command (and args) explicitly"
        )),
        Some(command) if command.starts_with(&prefix) => {}
        Some(command) if command.first().map(String::as_str) == Some(LAUNCHER) => {
            problems.push(format!(
                "container {name:?} already starts {LAUNCHER} with other arguments; remove it, the \
                 webhook puts it there"
            ))
        }
        Some(command) => {
            let shaped: Vec<String> = prefix.iter().chain(command).cloned().collect();
            ops.push(json!({"op": "replace", "path": format!("{base}/command"), "value": shaped}));
        }
    }
}

/// The control directory's variable, and the environment the launcher relies on checked.
fn shape_env(container: &Container, base: &str, ops: &mut Vec<Value>, problems: &mut Vec<String>) {
    let name = &container.name;
    // Environment: duplicates make the resolved value ambiguous; LD_PRELOAD from a reference would
    // be resolved by the kubelet where the webhook cannot check it.
    let env = container.env.as_deref().unwrap_or_default();
    let mut seen = HashSet::new();
    for var in env {
        if !seen.insert(var.name.as_str()) {
            problems.push(format!(
                "container {name:?} sets environment variable {:?} more than once; keep one entry",
                var.name
            ));
        }
    }
    if env
        .iter()
        .any(|v| v.name == "LD_PRELOAD" && v.value_from.is_some())
    {
        problems.push(format!(
            "container {name:?} takes LD_PRELOAD from valueFrom; give it as a literal value (the \
             launcher prepends the shim to it)"
        ));
    }
    let wanted_env = control_env();
    match env.iter().find(|v| v.name == CONTROL_DIR_ENV) {
        Some(v) if *v == wanted_env => {}
        Some(_) => problems.push(format!(
            "container {name:?} sets {CONTROL_DIR_ENV} itself; remove it, the webhook sets it to \
             {CONTROL_DIR}"
        )),
        None => add_items(
            ops,
            &format!("{base}/env"),
            container.env.is_some(),
            vec![to_value(&wanted_env)],
        ),
    }
}

/// The shim's and the control directory's mounts, and nothing of the container's over them.
fn shape_mounts(
    container: &Container,
    base: &str,
    ops: &mut Vec<Value>,
    problems: &mut Vec<String>,
) {
    let name = &container.name;
    // Mounts: ours exactly as shaping makes them, nothing of the container's at or below our paths.
    let mounts = container.volume_mounts.as_deref().unwrap_or_default();
    let wanted = target_mounts(name);
    for mount in mounts {
        if wanted.iter().any(|w| w == mount) {
            continue;
        }
        let ours = wanted.iter().any(|w| w.name == mount.name);
        let over = [INSTALL_DIR, CONTROL_DIR]
            .into_iter()
            .find(|path| at_or_below(&mount.mount_path, path));
        if ours {
            problems.push(format!(
                "container {name:?} mounts volume {:?} differently from how cuinterpose mounts it",
                mount.name
            ));
        } else if let Some(path) = over {
            let kind = if mount.read_only == Some(true) {
                "a mount"
            } else {
                "a writable mount"
            };
            problems.push(format!(
                "container {name:?} has {kind} of volume {:?} at {}, over cuinterpose's {path}; move it",
                mount.name, mount.mount_path
            ));
        }
    }
    let missing: Vec<Value> = wanted
        .iter()
        .filter(|w| !mounts.contains(w))
        .map(to_value)
        .collect();
    add_items(
        ops,
        &format!("{base}/volumeMounts"),
        container.volume_mounts.is_some(),
        missing,
    );
}
