#!/usr/bin/env bash
# Builds release binaries and gathers what the GPU lane needs into dist/ (ignored by git, carried to
# the GPU machine): the tool, the shim, the test workloads and scenarios, the fake driver (the lane
# runs every scenario on both drivers), and the private CRIU prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
# The shim on its own: built together with the tool, cargo would unify features and link the tool's
# (the manifest's JSON) into it.
cargo build --release --locked -p cuinterpose-shim --lib
cargo build --release --locked -p cuinterpose-cli -p fake-cuda -p cuinterpose-testkit --bins --lib
scripts/install-criu.sh >/dev/null
rm -rf dist
mkdir -p dist/bin
for f in cuinterpose cuinterpose-workload cuinterpose-scenarios libcuinterpose.so libcuda.so; do
    cp target/release/$f dist/bin/
done
strip --strip-debug dist/bin/*
cp -r .criu dist/criu
du -sh dist
