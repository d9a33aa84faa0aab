#!/usr/bin/env bash
# Installs cargo-zigbuild and zig (both from PyPI: `cargo-zigbuild`, `ziglang`) into a private virtual
# environment, .tools/zigbuild in the repository (ignored by git), without touching the system.
#
# Why: the release is linked against glibc 2.17 (target x86_64-unknown-linux-gnu.2.17), so that the
# shim loads into workloads of any image a user picked (Ubuntu 20.04 has 2.31, RHEL/UBI 8 has 2.28)
# and the tool runs there; the host's linker can only link against the host's glibc, zig ships the
# old glibc's symbol stubs and cargo-zigbuild drives it as cargo's linker.
#
# Usage: scripts/install-zigbuild.sh      (idempotent; prints the directory to put on PATH last)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$repo/.tools/zigbuild
zigbuild_version=0.24.1
zig_version=0.17.1
if ! "$venv/bin/cargo-zigbuild" --version 2>/dev/null | grep -qx "cargo-zigbuild $zigbuild_version" \
        || [ "$("$venv/bin/python" -m ziglang version 2>/dev/null)" != "$zig_version" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check \
        "cargo-zigbuild==$zigbuild_version" "ziglang==$zig_version" >&2
fi
echo "$venv/bin"
