//! The webhook's shaping run in real containers of the product image: a pod shaped by
//! `shaping::shape` (the patch the webhook returns, applied), its init container run under Podman
//! as its spec says (image, command, user, read-only root, capabilities, privilege escalation,
//! volume mounts), then its shaped workload container run from a plain image with the volumes the
//! shaping added and its environment: the init container copied the launcher and the shim, and the
//! shaped command runs the workload with the shim preloaded and mapped.
//!
//! Ignored by default: `scripts/test-release.sh image` builds the product image with Podman and runs
//! it with `--ignored`, naming the images in `CUINTERPOSE_TEST_PRODUCT_IMAGE` (the product) and
//! `CUINTERPOSE_TEST_BASE_IMAGE` (a Debian root, the workload's image), and Podman's options in
//! `CUINTERPOSE_TEST_PODMAN_ARGS`.

use cuinterpose_kube::shaping::{self, ShapeConfig};
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} (scripts/test-release.sh image sets it)"))
}

/// `podman run --rm` with the options these machines need, the container's mounts of the pod's
/// `emptyDir` volumes (`volumes`: name → host directory) and the securityContext's user,
/// read-only root, dropped capabilities and privilege escalation.
fn podman_run(container: &Container, volumes: &BTreeMap<String, PathBuf>, image: &str) -> Command {
    let mut command = Command::new("podman");
    command.arg("run").arg("--rm");
    command.args(setting("CUINTERPOSE_TEST_PODMAN_ARGS").split_whitespace());
    if let Some(security) = &container.security_context {
        if let Some(user) = security.run_as_user {
            let group = security.run_as_group.unwrap_or(user);
            command.arg("--user").arg(format!("{user}:{group}"));
        }
        if security.read_only_root_filesystem == Some(true) {
            command.arg("--read-only");
        }
        if security.allow_privilege_escalation == Some(false) {
            command.args(["--security-opt", "no-new-privileges"]);
        }
        for cap in (security.capabilities.as_ref())
            .and_then(|c| c.drop.as_deref())
            .unwrap_or_default()
        {
            command.arg("--cap-drop").arg(cap.to_lowercase());
        }
    }
    for mount in container.volume_mounts.as_deref().unwrap_or_default() {
        let host = volumes
            .get(&mount.name)
            .unwrap_or_else(|| panic!("volume {} of the shaped pod", mount.name));
        let mode = if mount.read_only == Some(true) {
            "ro"
        } else {
            "rw"
        };
        command
            .arg("-v")
            .arg(format!("{}:{}:{mode}", host.display(), mount.mount_path));
    }
    for var in container.env.as_deref().unwrap_or_default() {
        let value = var.value.as_deref().expect("a literal value");
        command.arg("-e").arg(format!("{}={value}", var.name));
    }
    command.arg(image);
    command.args(container.command.as_deref().unwrap_or_default());
    command.args(container.args.as_deref().unwrap_or_default());
    command
}

fn run(mut command: Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what}: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
#[ignore = "needs the product image built with Podman: scripts/test-release.sh image"]
fn the_shaped_init_container_installs_the_launcher_and_the_shim_and_the_workload_runs_under_them() {
    let product = setting("CUINTERPOSE_TEST_PRODUCT_IMAGE");
    let base = setting("CUINTERPOSE_TEST_BASE_IMAGE");
    let config = ShapeConfig::new(product.clone(), "100m".into(), "64Mi".into())
        .expect("a shaping configuration");
    // The workload prints its preload list and its own mappings.
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app", "labels": {shaping::OPT_IN_LABEL: shaping::OPT_IN_VALUE}},
        "spec": {"containers": [{
            "name": "app", "image": base,
            "command": ["/bin/sh", "-c", "echo \"LD_PRELOAD=$LD_PRELOAD\"; cat /proc/$$/maps"]
        }]}
    });
    let typed: Pod = serde_json::from_value(pod.clone()).expect("a pod");
    let ops = shaping::shape(&typed, &config).expect("the pod is shaped");
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("a patch");
    json_patch::patch(&mut pod, &patch).expect("the patch applies");
    let shaped: Pod = serde_json::from_value(pod).expect("the shaped pod");
    let spec = shaped.spec.expect("a spec");

    // Every volume the shaping added is an emptyDir: a host directory each, writable by the init
    // container's user.
    let dirs = tempfile::tempdir().expect("a directory for the volumes");
    let volumes: BTreeMap<String, PathBuf> = (spec.volumes.iter().flatten())
        .map(|v| {
            assert!(v.empty_dir.is_some(), "volume {} is an emptyDir", v.name);
            let dir = dirs.path().join(&v.name);
            std::fs::create_dir(&dir).expect("a volume directory");
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .expect("the volume's mode");
            (v.name.clone(), dir)
        })
        .collect();

    let [init] = spec.init_containers.as_deref().unwrap_or_default() else {
        panic!("one init container: {:?}", spec.init_containers);
    };
    assert_eq!(init.image.as_deref(), Some(product.as_str()));
    run(podman_run(init, &volumes, &product), "the init container");
    let installed = &volumes[shaping::INSTALL_VOLUME];
    for (name, _) in cuinterpose_kube::install::FILES {
        let file = installed.join(name);
        assert!(
            file.is_file(),
            "{} was installed by the init container",
            file.display()
        );
    }

    let [app] = spec.containers.as_slice() else {
        panic!("one container");
    };
    assert!(shaping::is_shaped(app), "{:?}", app.command);
    let out = run(podman_run(app, &volumes, &base), "the shaped container");
    let preload = out.lines().next().unwrap_or_default();
    assert!(
        preload.starts_with(&format!("LD_PRELOAD={}", shaping::SHIM)),
        "the launcher preloads the shim: {preload}"
    );
    assert!(
        out.lines()
            .any(|l| l.ends_with(&format!(" {}", shaping::SHIM))),
        "the shim is mapped in the workload: {out}"
    );
}
