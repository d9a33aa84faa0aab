//! The webhook end to end through the kube-apiserver's own mutating admission plugin: the Go
//! harness (crates/kube/go/admission-harness, built from Debian's Kubernetes 1.36 source by
//! scripts/k8s-test-server.sh) loads deploy/kubernetes/webhook-configuration.yaml as it is, calls
//! this crate's webhook over TLS with a CA bundle, and applies its patch.
//!
//! Ignored by default; scripts/test.sh runs it with `--ignored` and CUINTERPOSE_ADMISSION_HARNESS
//! set (the harness binary).

use cuinterpose_kube::shaping::{self, ShapeConfig};
use cuinterpose_kube::webhook;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

const IMAGE: &str = "registry.example/cuinterpose@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
/// The name the API server verifies: the Service of webhook-configuration.yaml.
const SERVICE_DNS: &str = "cuinterpose-webhook.cuinterpose-system.svc";

fn harness() -> PathBuf {
    let path = std::env::var_os("CUINTERPOSE_ADMISSION_HARNESS")
        .map(PathBuf::from)
        .expect("CUINTERPOSE_ADMISSION_HARNESS (run scripts/k8s-test-server.sh prepare)");
    assert!(path.is_file(), "{} is missing", path.display());
    path
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate it signed for the Service's name, and an unrelated CA.
fn certificates(dir: &Path) {
    let p = |name: &str| dir.join(name).display().to_string();
    for ca in ["ca", "other-ca"] {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={ca}"),
            "-keyout",
            &p(&format!("{ca}.key")),
            "-out",
            &p(&format!("{ca}.crt")),
        ]);
    }
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        &format!("/CN={SERVICE_DNS}"),
        "-keyout",
        &p("tls.key"),
        "-out",
        &p("tls.csr"),
    ]);
    std::fs::write(
        dir.join("san.ext"),
        format!("subjectAltName=DNS:{SERVICE_DNS}\n"),
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("tls.csr"),
        "-CA",
        &p("ca.crt"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &p("san.ext"),
        "-out",
        &p("tls.crt"),
    ]);
}

struct Admitted {
    input: Value,
    allowed: bool,
    error: String,
    pod: Value,
    mutated: bool,
    changed_again: bool,
}

fn admit(dir: &Path, address: &str, ca: &str, pod: &Value) -> Admitted {
    let pod_path = dir.join("pod.json");
    std::fs::write(&pod_path, serde_json::to_vec(pod).unwrap()).unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes/webhook-configuration.yaml");
    let out = Command::new(harness())
        .arg("--config")
        .arg(&config)
        .arg("--ca-file")
        .arg(dir.join(ca))
        .arg("--address")
        .arg(address)
        .arg("--pod")
        .arg(&pod_path)
        .output()
        .expect("running the admission harness");
    assert!(
        out.status.success(),
        "harness: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("harness JSON");
    Admitted {
        input: result["input"].clone(),
        allowed: result["allowed"].as_bool().unwrap(),
        error: result["error"].as_str().unwrap().to_string(),
        pod: result["pod"].clone(),
        mutated: result["mutated"].as_bool().unwrap(),
        changed_again: result["changedAgain"].as_bool().unwrap(),
    }
}

fn labelled(spec: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "team-a", "labels": {"cuinterpose.dev/inject": "true"}},
        "spec": spec
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Kubernetes admission harness: scripts/k8s-test-server.sh (scripts/test.sh runs it)"]
async fn the_real_admission_plugin_applies_the_webhook() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let tls =
        webhook::tls_config(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).unwrap();
    let config = ShapeConfig::new(IMAGE.into(), "100m".into(), "64Mi".into()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(webhook::serve(listener, tls, config.clone()));

    let run = |pod: Value, ca: &'static str| {
        let dir = dir.path().to_path_buf();
        let address = address.clone();
        tokio::task::spawn_blocking(move || admit(&dir, &address, ca, &pod))
    };

    // An opted-in pod: the API server's plugin applied exactly the patch shaping computes.
    let pod = labelled(
        json!({"containers": [{"name": "main", "image": "trainer:1", "command": ["python3", "train.py"], "args": ["--epochs", "3"]}]}),
    );
    let out = run(pod.clone(), "ca.crt").await.unwrap();
    assert!(out.allowed, "{}", out.error);
    assert!(out.mutated);
    let ops = shaping::shape(&serde_json::from_value(pod).unwrap(), &config).unwrap();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
    let mut expected = out.input.clone();
    json_patch::patch(&mut expected, &patch).unwrap();
    // The plugin hands the object on without its type fields (the API server sets them again).
    let object = expected.as_object_mut().unwrap();
    object.remove("apiVersion");
    object.remove("kind");
    assert_eq!(
        out.pod, expected,
        "the admitted pod is the input with exactly the webhook's patch"
    );
    assert_eq!(
        out.pod["spec"]["containers"][0]["command"],
        json!([
            "/opt/cuinterpose/cuinterpose",
            "run",
            "--shim",
            "/opt/cuinterpose/libcuinterpose.so",
            "--",
            "python3",
            "train.py"
        ])
    );
    assert_eq!(out.pod["spec"]["initContainers"][0]["image"], IMAGE);
    assert!(
        !out.changed_again,
        "a second admission of the shaped pod changes nothing"
    );

    // Not labelled: the objectSelector keeps it away from the webhook.
    let mut plain = labelled(json!({"containers": [{"name": "main", "image": "x"}]}));
    plain["metadata"]["labels"] = json!({"app": "web"});
    let out = run(plain, "ca.crt").await.unwrap();
    assert!(out.allowed, "{}", out.error);
    assert!(!out.mutated, "an unlabelled pod is untouched");
    assert_eq!(out.pod["spec"], out.input["spec"]);
    assert_eq!(out.pod["metadata"], out.input["metadata"]);

    // Refusals reach the user with the webhook's message.
    let out = run(
        labelled(json!({"containers": [{"name": "main", "image": "x", "args": ["serve"]}]})),
        "ca.crt",
    )
    .await
    .unwrap();
    assert!(!out.allowed);
    assert_eq!(
        out.error,
        "admission webhook \"pods.cuinterpose.dev\" denied the request: cuinterpose cannot shape this pod: \
         container \"main\" has no command: the launcher must run before the image's entrypoint, which the \
         webhook cannot see; set command (and args) explicitly"
    );
    let out = run(
        labelled(json!({"containers": [{"name": "main", "image": "x", "command": ["/m"],
            "env": [{"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}]})),
        "ca.crt",
    )
    .await
    .unwrap();
    assert!(!out.allowed);
    assert!(out.error.ends_with("container \"main\" takes LD_PRELOAD from valueFrom; give it as a literal value (the launcher prepends the shim to it)"), "{}", out.error);
    let out = run(
        labelled(
            json!({"volumes": [{"name": "cuinterpose-bin", "emptyDir": {"medium": "Memory"}}],
            "containers": [{"name": "main", "image": "x", "command": ["/m"]}]}),
        ),
        "ca.crt",
    )
    .await
    .unwrap();
    assert!(!out.allowed);
    assert!(
        out.error
            .contains("the pod already has a volume named \"cuinterpose-bin\""),
        "{}",
        out.error
    );

    // A CA bundle that did not sign the webhook's certificate: failurePolicy Fail, so the pod is
    // refused rather than admitted unshaped.
    let pod = labelled(json!({"containers": [{"name": "main", "image": "x", "command": ["/m"]}]}));
    let out = run(pod, "other-ca.crt").await.unwrap();
    assert!(!out.allowed, "a wrong CA must fail closed");
    assert!(
        out.error
            .contains("failed calling webhook \"pods.cuinterpose.dev\""),
        "{}",
        out.error
    );
    assert!(
        out.error.contains("x509") || out.error.contains("certificate"),
        "{}",
        out.error
    );

    server.abort();
}
