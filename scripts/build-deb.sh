#!/usr/bin/env bash
# Packages the release layout (dist/, scripts/build-dist.sh) as a Debian package, with dpkg-deb:
#
#   /opt/cuinterpose/...                 the release layout as it is (bin, lib, libexec, share)
#   /usr/bin/cuinterpose                 a symlink into it (the tool resolves it and finds its parts)
#   /usr/share/man/man1, bash-completion, zsh, fish    the generated pages and completions
#
# The layout stays whole under /opt because it carries its own CRIU with its own loader and
# libraries (libexec/), which must not mix with the system's. The fake CUDA driver stays in
# /opt/cuinterpose/lib/cuinterpose/test-driver/ (for `cuinterpose demo` on a machine without a GPU),
# off the loader's path, so it never stands in for a real driver. Depends on libc6 >= 2.17 only
# (the release's glibc baseline).
#
# Usage: scripts/build-deb.sh            (prints the package's path last)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x dist/bin/cuinterpose ] || { echo "build-deb: dist/ missing: run scripts/build-dist.sh first" >&2; exit 1; }
version=$(dist/bin/cuinterpose --version | awk '{print $2}')
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/DEBIAN" "$root/opt" "$root/usr/bin" "$root/usr/share/man/man1" "$root/usr/share/doc/cuinterpose"
cp -a dist "$root/opt/cuinterpose"
ln -s ../../opt/cuinterpose/bin/cuinterpose "$root/usr/bin/cuinterpose"
for page in dist/share/man/man1/*.1; do gzip -9n <"$page" >"$root/usr/share/man/man1/$(basename "$page").gz"; done
cp -a dist/share/bash-completion dist/share/zsh dist/share/fish "$root/usr/share/"
cp README.md "$root/usr/share/doc/cuinterpose/"
cp -r docs "$root/usr/share/doc/cuinterpose/"  # the README links into docs/
cat >"$root/DEBIAN/control" <<CONTROL
Package: cuinterpose
Version: $version
Architecture: amd64
Maintainer: cuinterpose developers <cuinterpose@example.invalid>
Depends: libc6 (>= 2.17)
Section: utils
Priority: optional
Installed-Size: $(du -sk "$root" | cut -f1)
Description: checkpoint and restore for GPU processes that share CUDA memory
 libcuinterpose.so (loaded with LD_PRELOAD into every CUDA process) and the cuinterpose tool:
 suspend a group of processes sharing GPU memory in place, or checkpoint it to disk with the
 bundled CRIU and restore it, optionally onto other GPUs; cuinterpose doctor checks a machine.
CONTROL
mkdir -p dist-deb
deb=dist-deb/cuinterpose_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
