#!/usr/bin/env bash
# Installs CRIU (4.2 or newer) into a private prefix (default: .criu in the repository), without
# touching the system.
#
# Why: Debian bookworm's criu 3.17 fails on current kernels (vDSO detection), and trixie's 4.1 cannot
# dump any TCP or UDP socket on kernels from 6.16 on (they refuse SO_PASSCRED on such sockets; CRIU
# fixed it in 4.2). forky's 4.2 works. It is fetched with apt from this machine's configured Debian
# sources, with the suite changed to forky, unpacked with `dpkg -x` together with its libraries
# (forky's glibc included), and run through the prefix's own dynamic loader by the wrapper
# `PREFIX/bin/criu`. The same prefix is carried to the GPU machine, which has no package access.
#
# Usage: scripts/install-criu.sh [PREFIX]        (idempotent; prints the wrapper's path last)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-$repo/.criu}
suite=forky
minimum=4.2
installed=$("$prefix/bin/criu" --version 2>/dev/null | awk '/^Version:/{print $2}') || true
if [ -n "$installed" ] && [ "$(printf '%s\n' "$minimum" "$installed" | sort -V | head -1)" = "$minimum" ]; then
    echo "$prefix/bin/criu"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/sources.d" "$work/debs"

# The first configured Debian source (deb822 or one-line format), with its signing key.
uri="" key=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    key=$(awk '/^Signed-By:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
fi
[ -n "$uri" ] || { echo "install-criu: no Debian source configured in /etc/apt" >&2; exit 1; }
[ -n "$key" ] || key=/usr/share/keyrings/debian-archive-keyring.gpg
printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' "$uri" "$suite" "$key" \
    >"$work/sources.d/$suite.sources"

apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/sources.d"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Dir::State::Status=/dev/null
          -o APT::Sandbox::User=root -q)
apt-get "${apt_opts[@]}" update >/dev/null
packages=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances criu | grep -v '^ ' | grep -v '<' | sort -u)
(cd "$work/debs" && apt-get "${apt_opts[@]}" download $packages >/dev/null)

rm -rf "$prefix.tmp"
mkdir -p "$prefix.tmp"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$prefix.tmp"; done
# Keep what criu runs with: the binary, its libraries and the loader. Documentation, locales and
# gconv modules are dead weight for the carry to the GPU machine.
rm -rf "$prefix.tmp/usr/share" "$prefix.tmp/usr/lib/x86_64-linux-gnu/gconv" "$prefix.tmp/etc" \
       "$prefix.tmp/usr/lib/x86_64-linux-gnu/audit" "$prefix.tmp/usr/libexec" "$prefix.tmp/usr/bin"
mkdir -p "$prefix.tmp/bin"
cat >"$prefix.tmp/bin/criu" <<'WRAPPER'
#!/bin/sh
# CRIU from a private prefix, run through the prefix's own dynamic loader and libraries.
prefix=$(dirname "$(readlink -f "$0")")/..
lib="$prefix/usr/lib/x86_64-linux-gnu"
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$prefix/usr/sbin/criu" "$@"
WRAPPER
chmod +x "$prefix.tmp/bin/criu"
rm -rf "$prefix"
mv "$prefix.tmp" "$prefix"
"$prefix/bin/criu" --version >&2
echo "$prefix/bin/criu"
