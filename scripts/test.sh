#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): formatting, lints, build, every test on the fake driver
# (real processes, real sockets, a real CRIU). Needs a Rust toolchain; installs CRIU into .criu itself.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

scripts/bootstrap.sh

step "CRIU (private prefix, for the checkpoint-to-disk tests)"
CUINTERPOSE_CRIU=$(scripts/install-criu.sh)
export CUINTERPOSE_CRIU

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo build (libraries, binaries, the fake driver and the shim)"
cargo build --workspace --all-targets --locked

step "cargo test"
cargo test --workspace --locked -- --test-threads="${CUINTERPOSE_TEST_THREADS:-2}"

step "Kubernetes: kustomize renders deploy/kubernetes offline"
# kubectl's built-in kustomize (the machine image's kubectl); every kind the deployment needs.
if command -v kubectl >/dev/null 2>&1; then
    rendered=$(kubectl kustomize deploy/kubernetes)
    for kind in CustomResourceDefinition MutatingWebhookConfiguration DaemonSet Deployment Service \
        ClusterRole ClusterRoleBinding ServiceAccount Namespace; do
        grep -qx "kind: $kind" <<<"$rendered" || { echo "kustomize output lacks a $kind" >&2; exit 1; }
    done
    kubectl kustomize deploy/kubernetes/example >/dev/null
    echo "rendered $(grep -c '^kind:' <<<"$rendered") objects"
else
    echo "kubectl not found: cannot render deploy/kubernetes" >&2
    exit 1
fi

step "Kubernetes: webhook and agent against real Kubernetes server code"
# Debian's Kubernetes 1.36 source: the CRD API server on etcd, and the kube-apiserver's mutating
# admission plugin in a harness (scripts/k8s-test-server.sh; built once, cached in .k8s-test).
k8s_state=$(mktemp -d)
trap 'scripts/k8s-test-server.sh stop "$k8s_state"; rm -rf "$k8s_state"' EXIT
scripts/k8s-test-server.sh start "$k8s_state"
# shellcheck disable=SC1091
. "$k8s_state/env"
cargo test -p cuinterpose-kube --locked --test admission --test apiserver -- --ignored --test-threads=1
