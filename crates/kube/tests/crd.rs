//! The CRD in deploy/kubernetes is the one generated from the Rust types, and its schema holds
//! what users rely on.

use cuinterpose_kube::crd::{Checkpoint, crd_yaml};
use kube::CustomResourceExt;
use std::path::Path;

#[test]
fn the_deployed_crd_is_generated_from_the_types() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/crd/checkpoints.yaml");
    let deployed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        deployed == crd_yaml(),
        "{} differs from the types; regenerate it:\n  cargo run -p cuinterpose-kube --bin cuinterpose-agent -- crd > deploy/kubernetes/crd/checkpoints.yaml",
        path.display()
    );
}

#[test]
fn the_schema_is_namespaced_with_a_status_subresource() {
    let crd = Checkpoint::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("checkpoints.cuinterpose.dev")
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let schema = serde_json::to_value(&version.schema).unwrap();
    let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
    let mut required: Vec<&str> = spec["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["podName", "storage"]);
    assert_eq!(spec["properties"]["keep"]["minimum"].as_f64(), Some(1.0));
    let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
    for field in [
        "conditions",
        "nodeName",
        "location",
        "phases",
        "checkpointedContainers",
        "restoredInto",
    ] {
        assert!(status.get(field).is_some(), "status.{field}");
    }
}
