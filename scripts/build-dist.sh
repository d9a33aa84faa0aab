#!/usr/bin/env bash
# Builds the release layout into dist/ (ignored by git): the same tree for users, the Debian package
# (scripts/build-deb.sh), the container image and the GPU lane (which carries dist/, 64 MiB at most):
#
#   bin/cuinterpose                          the tool, and the binaries of RELEASE_BINARIES below
#   lib/libcuinterpose.so                    the shim
#   lib/cuinterpose/test-driver/libcuda.so.1 the fake CUDA driver (no GPU), for `demo` and the tests
#   libexec/cuinterpose/criu/bin/criu        CRIU 4.2 with its own loader and libraries
#   share/man/man1/cuinterpose*.1            manual pages, generated from the argument definitions
#   share/{bash-completion,zsh,fish}/...     shell completions, the same
#
# The tool finds the shim, the test driver and CRIU relative to its own path (control::layout), so
# the tree works wherever it is unpacked, with no variable set. Every binary is linked against
# glibc 2.17 (cargo-zigbuild, scripts/install-zigbuild.sh), stripped, with its debug info split off
# into dist-debug/<same path>.debug (not in dist/; linked back with .gnu_debuglink).
#
# Usage: scripts/build-dist.sh            (prints the layout's size last)
set -euo pipefail
cd "$(dirname "$0")/.."

# Every binary the release ships in bin/, in one place: the tool, the workload `demo` and `bench`
# start (crates/workload), and the scenario list the GPU lane runs on both drivers with the process
# its vmm-errors scenario starts (crates/testkit, test tooling the lane carries in dist/).
RELEASE_BINARIES=(cuinterpose cuinterpose-workload cuinterpose-scenarios cuinterpose-probe-errors)
# The crates that build them and the libraries.
RELEASE_PACKAGES=(cuinterpose-cli cuinterpose-workload cuinterpose-testkit cuinterpose-shim fake-cuda)
# The oldest glibc the release loads with (the oldest Rust supports); scripts/check-glibc.sh holds
# the shipped files to it.
GLIBC_BASELINE=$(cat scripts/release/glibc-baseline)
target=x86_64-unknown-linux-gnu
built=target/$target/release
max_bytes=$((64 << 20))

PATH=$(scripts/install-zigbuild.sh):$PATH
packages=()
for p in "${RELEASE_PACKAGES[@]}"; do packages+=(-p "$p"); done
# The shim on its own: built together with the tool, cargo would unify features and link the tool's
# (the manifest's JSON) into it.
cargo zigbuild --release --locked --target "$target.$GLIBC_BASELINE" -p cuinterpose-shim --lib
cargo zigbuild --release --locked --target "$target.$GLIBC_BASELINE" "${packages[@]}" --bins --lib
scripts/install-criu.sh >/dev/null

rm -rf dist dist-debug
mkdir -p dist/bin dist/lib/cuinterpose/test-driver dist/libexec/cuinterpose \
    dist/share/man/man1 dist/share/bash-completion/completions dist/share/zsh/vendor-completions \
    dist/share/fish/vendor_completions.d
for f in "${RELEASE_BINARIES[@]}"; do cp "$built/$f" dist/bin/; done
cp "$built/libcuinterpose.so" dist/lib/
cp "$built/libcuda.so" dist/lib/cuinterpose/test-driver/libcuda.so.1
cp -r .criu dist/libexec/cuinterpose/criu

# Debug info split off: kept beside the layout for those who want it, linked by .gnu_debuglink.
for f in dist/bin/* dist/lib/libcuinterpose.so dist/lib/cuinterpose/test-driver/libcuda.so.1; do
    debug=dist-debug/${f#dist/}.debug
    mkdir -p "$(dirname "$debug")"
    objcopy --only-keep-debug "$f" "$debug"
    objcopy --strip-all --add-gnu-debuglink="$debug" "$f"
done

tool=dist/bin/cuinterpose
"$tool" man --dir dist/share/man/man1
"$tool" completions bash >dist/share/bash-completion/completions/cuinterpose
"$tool" completions zsh >dist/share/zsh/vendor-completions/_cuinterpose
"$tool" completions fish >dist/share/fish/vendor_completions.d/cuinterpose.fish

scripts/check-glibc.sh "$GLIBC_BASELINE" dist/bin/* dist/lib/libcuinterpose.so \
    dist/lib/cuinterpose/test-driver/libcuda.so.1 >/dev/null
size=$(du -sb dist | cut -f1)
[ "$size" -le "$max_bytes" ] || { echo "build-dist: dist/ is $size bytes, over $max_bytes" >&2; exit 1; }
du -sh dist dist-debug
