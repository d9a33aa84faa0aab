//! Pod shaping as a pure function: the exact JSON patch for each kind of pod, idempotence, and
//! every refusal with its message.

use cuinterpose_kube::shaping::{self, ShapeConfig};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

const IMAGE: &str = "registry.example/cuinterpose@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn config() -> ShapeConfig {
    ShapeConfig::new(IMAGE.into(), "100m".into(), "64Mi".into()).unwrap()
}

fn pod(value: Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

fn init_container() -> Value {
    json!({
        "name": "cuinterpose-install",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/opt/cuinterpose/cuinterpose-webhook", "install", "/cuinterpose-install"],
        "resources": {
            "limits": {"cpu": "100m", "memory": "64Mi"},
            "requests": {"cpu": "100m", "memory": "64Mi"}
        },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "runAsGroup": 65532,
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "volumeMounts": [{"mountPath": "/cuinterpose-install", "name": "cuinterpose-bin"}]
    })
}

fn minimal() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "labels": {"cuinterpose.dev/inject": "true"}},
        "spec": {"containers": [{"name": "main", "image": "trainer:1", "command": ["python3", "train.py"], "args": ["--epochs", "3"]}]}
    })
}

/// Applies a JSON patch the way the API server does (RFC 6902).
fn apply(pod: &Value, ops: &[Value]) -> Value {
    let mut doc = pod.clone();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec())).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    doc
}

fn refusal(value: Value) -> String {
    shaping::shape(&pod(value), &config())
        .unwrap_err()
        .to_string()
}

#[test]
fn a_minimal_pod_gets_the_exact_patch() {
    let ops = shaping::shape(&pod(minimal()), &config()).unwrap();
    let expected = vec![
        json!({"op": "add", "path": "/spec/volumes", "value": [
            {"name": "cuinterpose-bin", "emptyDir": {}},
            {"name": "cuinterpose-ctl-main", "emptyDir": {}}
        ]}),
        json!({"op": "add", "path": "/spec/initContainers", "value": [init_container()]}),
        json!({"op": "replace", "path": "/spec/containers/0/command", "value": [
            "/opt/cuinterpose/cuinterpose", "run", "--shim", "/opt/cuinterpose/libcuinterpose.so", "--",
            "python3", "train.py"
        ]}),
        json!({"op": "add", "path": "/spec/containers/0/env", "value": [
            {"name": "CUINTERPOSE_CONTROL_DIR", "value": "/run/cuinterpose"}
        ]}),
        json!({"op": "add", "path": "/spec/containers/0/volumeMounts", "value": [
            {"name": "cuinterpose-bin", "mountPath": "/opt/cuinterpose", "readOnly": true},
            {"name": "cuinterpose-ctl-main", "mountPath": "/run/cuinterpose"}
        ]}),
    ];
    assert_eq!(ops, expected);
    // args stay: the container runs launcher + command + args.
    let shaped = apply(&minimal(), &ops);
    assert_eq!(
        shaped["spec"]["containers"][0]["args"],
        json!(["--epochs", "3"])
    );
}

#[test]
fn shaping_is_idempotent() {
    let once = apply(
        &minimal(),
        &shaping::shape(&pod(minimal()), &config()).unwrap(),
    );
    assert_eq!(
        shaping::shape(&pod(once.clone()), &config()).unwrap(),
        Vec::<Value>::new()
    );
}

#[test]
fn existing_lists_get_items_appended_and_the_init_container_goes_first() {
    let value = json!({
        "metadata": {"name": "p", "labels": {"cuinterpose.dev/inject": "true"}},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [
                {"name": "a", "image": "x", "command": ["/a"],
                 "env": [{"name": "LD_PRELOAD", "value": "/usr/lib/libfoo.so"}],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "b", "image": "x", "command": ["/b"]}
            ]
        }
    });
    let ops = shaping::shape(&pod(value.clone()), &config()).unwrap();
    let expected = vec![
        json!({"op": "add", "path": "/spec/volumes/-", "value": {"name": "cuinterpose-bin", "emptyDir": {}}}),
        json!({"op": "add", "path": "/spec/volumes/-", "value": {"name": "cuinterpose-ctl-a", "emptyDir": {}}}),
        json!({"op": "add", "path": "/spec/volumes/-", "value": {"name": "cuinterpose-ctl-b", "emptyDir": {}}}),
        json!({"op": "add", "path": "/spec/initContainers/0", "value": init_container()}),
        json!({"op": "replace", "path": "/spec/containers/0/command", "value": [
            "/opt/cuinterpose/cuinterpose", "run", "--shim", "/opt/cuinterpose/libcuinterpose.so", "--", "/a"
        ]}),
        json!({"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "CUINTERPOSE_CONTROL_DIR", "value": "/run/cuinterpose"}}),
        json!({"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": {"name": "cuinterpose-bin", "mountPath": "/opt/cuinterpose", "readOnly": true}}),
        json!({"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": {"name": "cuinterpose-ctl-a", "mountPath": "/run/cuinterpose"}}),
        json!({"op": "replace", "path": "/spec/containers/1/command", "value": [
            "/opt/cuinterpose/cuinterpose", "run", "--shim", "/opt/cuinterpose/libcuinterpose.so", "--", "/b"
        ]}),
        json!({"op": "add", "path": "/spec/containers/1/env", "value": [{"name": "CUINTERPOSE_CONTROL_DIR", "value": "/run/cuinterpose"}]}),
        json!({"op": "add", "path": "/spec/containers/1/volumeMounts", "value": [
            {"name": "cuinterpose-bin", "mountPath": "/opt/cuinterpose", "readOnly": true},
            {"name": "cuinterpose-ctl-b", "mountPath": "/run/cuinterpose"}
        ]}),
    ];
    assert_eq!(ops, expected);
    let shaped = apply(&value, &ops);
    assert_eq!(
        shaped["spec"]["initContainers"][0]["name"],
        "cuinterpose-install"
    );
    assert_eq!(shaped["spec"]["initContainers"][1]["name"], "fetch");
    // The literal LD_PRELOAD stays; the launcher prepends the shim to it at run time.
    assert_eq!(
        shaped["spec"]["containers"][0]["env"][0],
        json!({"name": "LD_PRELOAD", "value": "/usr/lib/libfoo.so"})
    );
    assert_eq!(
        shaping::shape(&pod(shaped), &config()).unwrap(),
        Vec::<Value>::new()
    );
}

#[test]
fn the_containers_annotation_selects_targets() {
    let mut value = json!({
        "metadata": {"name": "p", "annotations": {"cuinterpose.dev/containers": "worker"}},
        "spec": {"containers": [
            {"name": "sidecar", "image": "envoy"},
            {"name": "worker", "image": "x", "command": ["/w"]}
        ]}
    });
    let ops = shaping::shape(&pod(value.clone()), &config()).unwrap();
    let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/spec/volumes",
            "/spec/initContainers",
            "/spec/containers/1/command",
            "/spec/containers/1/env",
            "/spec/containers/1/volumeMounts"
        ]
    );
    value["metadata"]["annotations"]["cuinterpose.dev/containers"] = json!("worker,ghost");
    assert_eq!(
        refusal(value),
        "cuinterpose cannot shape this pod: annotation cuinterpose.dev/containers names container \
         \"ghost\", which the pod does not have"
    );
}

#[test]
fn a_container_without_command_is_refused() {
    let value = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "x", "args": ["serve"]}]}});
    assert_eq!(
        refusal(value),
        "cuinterpose cannot shape this pod: container \"main\" has no command: the launcher must run \
         before the image's entrypoint, which the webhook cannot see; set command (and args) explicitly"
    );
}

#[test]
fn ld_preload_from_value_from_is_refused() {
    let value = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "x", "command": ["/m"],
        "env": [{"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}]}});
    assert_eq!(
        refusal(value),
        "cuinterpose cannot shape this pod: container \"main\" takes LD_PRELOAD from valueFrom; give it \
         as a literal value (the launcher prepends the shim to it)"
    );
}

#[test]
fn duplicate_env_entries_are_refused() {
    let value = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "x", "command": ["/m"],
        "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}]}});
    assert_eq!(
        refusal(value),
        "cuinterpose cannot shape this pod: container \"main\" sets environment variable \"A\" more than \
         once; keep one entry"
    );
}

#[test]
fn volume_name_collisions_are_refused() {
    let value = json!({"metadata": {"name": "p"}, "spec": {
        "volumes": [{"name": "cuinterpose-bin", "hostPath": {"path": "/opt"}}],
        "containers": [{"name": "main", "image": "x", "command": ["/m"]}]}});
    assert_eq!(
        refusal(value),
        "cuinterpose cannot shape this pod: the pod already has a volume named \"cuinterpose-bin\", \
         which cuinterpose needs for its own; rename the pod's volume"
    );
}

#[test]
fn a_writable_mount_over_its_paths_is_refused() {
    let value = json!({"metadata": {"name": "p"}, "spec": {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "containers": [{"name": "main", "image": "x", "command": ["/m"],
            "volumeMounts": [{"name": "data", "mountPath": "/opt/cuinterpose/lib"}]}]}});
    assert_eq!(
        refusal(value),
        "cuinterpose cannot shape this pod: container \"main\" has a writable mount of volume \"data\" at \
         /opt/cuinterpose/lib, over cuinterpose's /opt/cuinterpose; move it"
    );
    // A mount above its paths, or beside them, is fine (the kubelet mounts deeper paths on top).
    let fine = json!({"metadata": {"name": "p"}, "spec": {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "containers": [{"name": "main", "image": "x", "command": ["/m"],
            "volumeMounts": [{"name": "data", "mountPath": "/run"}, {"name": "data", "mountPath": "/opt/cuinterpose-data"}]}]}});
    assert!(shaping::shape(&pod(fine), &config()).is_ok());
}

#[test]
fn every_problem_is_named_at_once() {
    let value = json!({"metadata": {"name": "p"}, "spec": {
    "shareProcessNamespace": true,
    "containers": [
        {"name": "a", "image": "x"},
        {"name": "b", "image": "x", "command": ["/b"], "env": [{"name": "CUINTERPOSE_CONTROL_DIR", "value": "/tmp"}]}
    ]}});
    let refusal = shaping::shape(&pod(value), &config()).unwrap_err();
    assert_eq!(refusal.problems.len(), 3, "{refusal}");
    assert!(refusal.problems[0].starts_with("shareProcessNamespace is true"));
    assert!(refusal.problems[1].starts_with("container \"a\" has no command"));
    assert_eq!(
        refusal.problems[2],
        "container \"b\" sets CUINTERPOSE_CONTROL_DIR itself; remove it, the webhook sets it to /run/cuinterpose"
    );
}

#[test]
fn an_init_container_of_the_same_name_is_refused() {
    let value = json!({"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "cuinterpose-install", "image": "other"}],
        "containers": [{"name": "main", "image": "x", "command": ["/m"]}]}});
    assert!(
        refusal(value)
            .contains("init container named \"cuinterpose-install\" that cuinterpose did not make")
    );
}

#[test]
fn the_image_must_be_pinned_by_digest() {
    for image in [
        "registry.example/cuinterpose:1.0",
        "x@sha256:abc",
        "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        let error = ShapeConfig::new(image.into(), "100m".into(), "64Mi".into()).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("image {image:?} is not pinned by digest (name@sha256:<64 hex digits>)")
        );
    }
}

/// A container that may make namespaces (privileged, or `CAP_SYS_ADMIN` added, with or without
/// the `CAP_` prefix) gets `run --pid-namespace`, so that its workload can be checkpointed to disk
/// (CRIU runs inside the container around it); others the plain launcher. Idempotent both ways,
/// and the agent knows both as shaped.
#[test]
fn a_container_that_may_make_namespaces_gets_its_workload_in_a_pid_namespace() {
    for security in [
        json!({"privileged": true}),
        json!({"capabilities": {"add": ["SYS_ADMIN"]}}),
        json!({"capabilities": {"add": ["NET_ADMIN", "CAP_SYS_ADMIN"]}}),
    ] {
        let mut value = minimal();
        value["spec"]["containers"][0]["securityContext"] = security.clone();
        let ops = shaping::shape(&pod(value.clone()), &config()).unwrap();
        let command = ops
            .iter()
            .find(|op| op["path"] == "/spec/containers/0/command")
            .unwrap_or_else(|| panic!("{security}: no command in {ops:?}"));
        assert_eq!(
            command["value"],
            json!([
                "/opt/cuinterpose/cuinterpose",
                "run",
                "--pid-namespace",
                "--shim",
                "/opt/cuinterpose/libcuinterpose.so",
                "--",
                "python3",
                "train.py"
            ]),
            "{security}"
        );
        let once = apply(&value, &ops);
        assert_eq!(
            shaping::shape(&pod(once.clone()), &config()).unwrap(),
            Vec::<Value>::new(),
            "{security}: idempotent"
        );
        let shaped: Pod = pod(once);
        assert!(
            shaping::is_shaped(&shaped.spec.unwrap().containers[0]),
            "{security}"
        );
    }
    for security in [
        json!({"privileged": false}),
        json!({"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}),
    ] {
        let mut value = minimal();
        value["spec"]["containers"][0]["securityContext"] = security.clone();
        let ops = shaping::shape(&pod(value.clone()), &config()).unwrap();
        let command = ops
            .iter()
            .find(|op| op["path"] == "/spec/containers/0/command")
            .unwrap();
        assert_eq!(
            command["value"][2], "--shim",
            "{security}: the plain launcher"
        );
    }
}
