#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): formatting, lints, build, every test on the fake driver
# (real processes, real sockets, a real CRIU), then the release: its layout built against glibc 2.17,
# the baseline checked, the shim loaded in an old Debian userland, the .deb installed into a clean
# chroot and the product image built with Podman and run (scripts/test-release.sh); then the
# Kubernetes tests, the agent's against pods made through containerd's CRI. Needs a Rust toolchain;
# installs CRIU, zig and debootstrap itself, and runc, Podman and containerd for the real-container
# tests (scripts/container-runtimes.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
timed() { local start=$SECONDS; "$@"; printf '(%s: %d s)\n' "$*" $((SECONDS - start)); }

scripts/bootstrap.sh

step "CRIU (private prefix, for the checkpoint-to-disk tests)"
CUINTERPOSE_CRIU=$(scripts/install-criu.sh)
export CUINTERPOSE_CRIU

step "container runtimes: runc, Podman, containerd (Debian's), their images made here"
# The real-runtime tests (crates/cli/tests/disk.rs) run in `cargo test` below: required here, so a
# broken setup fails them instead of skipping them (testkit::runtime).
runtimes_env=$(timed scripts/container-runtimes.sh install)
eval "$(grep '^export ' <<<"$runtimes_env")"
export CUINTERPOSE_TEST_RUNTIMES=required
grep -v '^export ' <<<"$runtimes_env" || true
# containerd as the script runs it (private config, state and pid) for the tests' `ctr run`
# containers and the Kubernetes test's pods (its CRI), with its pause image; stopped (that pid
# only) at the end.
containerd_state=$(mktemp -d)
k8s_state=""
cleanup() {
    if [ -n "$k8s_state" ]; then scripts/k8s-test-server.sh stop "$k8s_state"; rm -rf "$k8s_state"; fi
    scripts/container-runtimes.sh stop "$containerd_state"
    rm -rf "$containerd_state"
}
trap cleanup EXIT
timed scripts/container-runtimes.sh start "$containerd_state" >/dev/null
# shellcheck disable=SC1091
. "$containerd_state/env"
ctr --address "$CUINTERPOSE_TEST_CONTAINERD" -n k8s.io images ls -q \
    | grep -qx "$CUINTERPOSE_TEST_PAUSE_IMAGE" || { echo "containerd lacks the pause image" >&2; exit 1; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "the shim links no JSON (the manifest is the tool's, behind protocol's feature \`manifest\`)"
if cargo tree -p cuinterpose-shim -e normal --locked | grep serde_json; then
    echo "test.sh: cuinterpose-shim depends on serde_json" >&2
    exit 1
fi

step "the shipped crates link no test tooling (the tool, demo and bench, the workload: neither cuinterpose-testkit, with its error probes, nor the fake driver)"
# Package names only (a checkout's path may hold any word).
for package in cuinterpose-cli cuinterpose-demo cuinterpose-workload; do
    # Listed first, so that a failing `cargo tree` stops the script instead of passing the check.
    deps=$(cargo tree -p "$package" -e normal --locked --prefix none --format '{p}' | awk '{print $1}')
    if grep -i -E 'testkit|testdriver|fake|probe' <<<"$deps"; then
        echo "test.sh: $package depends on test tooling" >&2
        exit 1
    fi
done

step "the tool starts workloads only through demo and bench (cuinterpose-cli reaches cuinterpose-workload through cuinterpose-demo)"
direct=$(cargo tree -p cuinterpose-cli -e normal --locked --depth 1 --prefix none --format '{p}' \
    | awk 'NR > 1 {print $1}')
if ! grep -q -x cuinterpose-demo <<<"$direct" || grep -x cuinterpose-workload <<<"$direct"; then
    echo "test.sh: cuinterpose-cli must depend on cuinterpose-demo and not on cuinterpose-workload itself" >&2
    exit 1
fi

step "the tool links the copy engine, not the interposer's runtime (cuinterpose-shim-runtime)"
# Listed first, as above, so that a failing `cargo tree` stops the script.
deps=$(cargo tree -p cuinterpose-cli -e normal --locked --prefix none --format '{p}' | awk '{print $1}')
if grep -x cuinterpose-shim-runtime <<<"$deps"; then
    echo "test.sh: cuinterpose-cli depends on cuinterpose-shim-runtime" >&2
    exit 1
fi

step "cargo build (libraries, binaries, the fake driver and the shim)"
cargo build --workspace --all-targets --locked

step "cargo test"
# The busy-workload cycles (crates/cli/tests/busy.rs: 50 in place and 10 to disk per case by
# default) are cut to fit CI's 90 minutes on 2 cores; set them higher for a soak.
export CUINTERPOSE_BUSY_CYCLES=${CUINTERPOSE_BUSY_CYCLES:-8}
export CUINTERPOSE_BUSY_DISK_CYCLES=${CUINTERPOSE_BUSY_DISK_CYCLES:-2}
# The soak at the test's size (16 processes x 250 allocations) with fewer cycles than its default
# (50 in place, 10 to disk: about 14 minutes here): 8 and 2, about 3 minutes on CI's 2 cores.
export CUINTERPOSE_SOAK=${CUINTERPOSE_SOAK:-16,250,8,2}
# The real-runtime container tests run alone, one at a time: a container's mounts appear in the
# host's mount table while it runs, and a CRIU dump of another test's tree in namespaces of its
# own fails on a runtime mount that vanished under it.
cargo test --workspace --locked -- --test-threads="${CUINTERPOSE_TEST_THREADS:-2}" \
    --skip _runc_ --skip _podman_ --skip _containerd_
cargo test -p cuinterpose-cli --locked --test disk -- --test-threads=1 _runc_ _podman_ _containerd_

step "release layout (scripts/build-dist.sh: glibc 2.17 build, stripped, man pages, completions)"
timed scripts/build-dist.sh

step "release: the glibc baseline of every shipped binary"
timed scripts/test-release.sh glibc

step "release: the shim in an old userland (debootstrap chroot)"
timed scripts/test-release.sh old-userland

step "release: the Debian package in a clean chroot (--version, doctor, demo)"
timed scripts/test-release.sh deb

step "release: the product image built with Podman from a local base (demo, demo --to-disk, init container)"
timed scripts/test-release.sh image

step "Kubernetes: kustomize renders deploy/kubernetes offline"
# kubectl's built-in kustomize, Debian's kubectl fetched by the script (cached in .k8s-test); every
# kind the deployment needs.
kubectl=$(scripts/k8s-test-server.sh kubectl)
rendered=$("$kubectl" kustomize deploy/kubernetes)
for kind in CustomResourceDefinition MutatingWebhookConfiguration DaemonSet Deployment Service \
    ClusterRole ClusterRoleBinding ServiceAccount Namespace; do
    grep -qx "kind: $kind" <<<"$rendered" || { echo "kustomize output lacks a $kind" >&2; exit 1; }
done
"$kubectl" kustomize deploy/kubernetes/example >/dev/null
echo "rendered $(grep -c '^kind:' <<<"$rendered") objects"

step "Kubernetes: webhook and agent against real Kubernetes server code"
# Debian's Kubernetes 1.36 source: the CRD API server on etcd, and the kube-apiserver's mutating
# admission plugin in a harness (scripts/k8s-test-server.sh; built once, cached in .k8s-test). The
# agent's pod test makes its pods through the CRI of the containerd started above
# (CUINTERPOSE_TEST_CONTAINERD; required: CUINTERPOSE_TEST_RUNTIMES).
k8s_state=$(mktemp -d)
timed scripts/k8s-test-server.sh start "$k8s_state"
# shellcheck disable=SC1091
. "$k8s_state/env"
cargo test -p cuinterpose-kube --locked --test admission --test apiserver -- --ignored --test-threads=1
