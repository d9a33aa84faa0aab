#!/usr/bin/env bash
# Prepares a fresh Debian machine for building and testing: a C compiler and the C library headers
# (the shim's tests compile small C programs), and CRIU 4.2 in the private prefix .criu, where the
# tool built in target/ finds it (control::layout).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cc >/dev/null 2>&1 || ! command -v readelf >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -q
    $sudo apt-get install -y -q gcc libc6-dev binutils
fi
command -v cargo >/dev/null 2>&1 || { echo "bootstrap: cargo not found; install Rust with rustup" >&2; exit 1; }
scripts/install-criu.sh >/dev/null
echo "bootstrap: ready (criu: $(.criu/bin/criu --version | head -1))"
