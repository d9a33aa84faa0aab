#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): formatting, lints, build, every test on the fake driver
# (real processes, real sockets, a real CRIU), then the release: its layout built against glibc 2.17,
# the baseline checked, the shim loaded in an old Debian userland and the .deb installed into a clean
# chroot (scripts/test-release.sh). Needs a Rust toolchain; installs CRIU, zig and debootstrap itself.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
timed() { local start=$SECONDS; "$@"; printf '(%s: %d s)\n' "$*" $((SECONDS - start)); }

scripts/bootstrap.sh

step "CRIU (private prefix, for the checkpoint-to-disk tests)"
CUINTERPOSE_CRIU=$(scripts/install-criu.sh)
export CUINTERPOSE_CRIU

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "the shim links no JSON (the manifest is the tool's, behind protocol's feature \`manifest\`)"
if cargo tree -p cuinterpose-shim -e normal --locked | grep serde_json; then
    echo "test.sh: cuinterpose-shim depends on serde_json" >&2
    exit 1
fi

step "cargo build (libraries, binaries, the fake driver and the shim)"
cargo build --workspace --all-targets --locked

step "cargo test"
cargo test --workspace --locked -- --test-threads="${CUINTERPOSE_TEST_THREADS:-2}"

step "release layout (scripts/build-dist.sh: glibc 2.17 build, stripped, man pages, completions)"
timed scripts/build-dist.sh

step "release: the glibc baseline of every shipped binary"
timed scripts/test-release.sh glibc

step "release: the shim in an old userland (debootstrap chroot)"
timed scripts/test-release.sh old-userland

step "release: the Debian package in a clean chroot (--version, doctor, demo)"
timed scripts/test-release.sh deb
