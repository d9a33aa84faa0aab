#!/usr/bin/env bash
# Tests of the release layout (dist/, scripts/build-dist.sh) on other distributions, as root (CI runs
# them from scripts/test.sh):
#
#   glibc         every shipped binary needs at most the baseline's GLIBC_ versions; the same check
#                 refuses the host-built shim (so it can fail)
#   old-userland  in a chroot of the oldest Debian release the configured mirror carries, a C program
#                 of that userland loads the shim and the fake driver, the shim's runtime starts (its
#                 control socket is bound) and `cuinterpose inspect` talks to it; the host-built shim
#                 is refused there by the loader (so the chroot is really older)
#   deb           the .deb (scripts/build-deb.sh) installs with dpkg into a clean chroot of the same
#                 release; `cuinterpose --version`, `doctor`, `demo` and `demo --to-disk` run there
#                 on the fake driver, with no variable set
#   image         the product image (deploy/container/Containerfile) built with Podman over that
#                 machine's own release (debootstrap, cached like the chroot) imported as its base
#                 (nothing pulled) from the binaries built here
#                 (dist/, and the webhook and agent of the cargo build, stripped); `demo` and
#                 `demo --to-disk` run in a container of it on its fake driver; a pod shaped by the
#                 webhook's code runs under Podman (crates/kube/tests/image.rs): its init container
#                 copies the launcher and the shim into a volume, and its shaped container, from
#                 the plain base image, runs its command under them, the shim mapped. Needs Podman
#                 (scripts/container-runtimes.sh install) and the cargo build.
#
# The chroot is made once with debootstrap (minbase) and cached as a tarball under .cache/ (ignored by
# git); every test unpacks a fresh copy. Mounts (/proc, /dev/shm, /tmp) live in a private mount
# namespace and vanish with it.
#
# Usage: scripts/test-release.sh [STEP...]     (default: glibc old-userland deb; image on request)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
baseline=$(cat scripts/release/glibc-baseline)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(glibc old-userland deb)
[ -x dist/bin/cuinterpose ] || { echo "test-release: dist/ missing: run scripts/build-dist.sh first" >&2; exit 1; }
log() { printf '[test-release %s] %s\n' "$(date +%T)" "$*"; }

# The oldest suite first: the first one the mirror still has is the userland tested.
suites=(stretch buster bullseye bookworm)
cache=$repo/.cache/debootstrap

mirror() {
    local uri=""
    [ -f /etc/apt/sources.list.d/debian.sources ] \
        && uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    [ -n "$uri" ] || [ ! -f /etc/apt/sources.list ] \
        || uri=$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
    [ -n "$uri" ] || { echo "test-release: no Debian source configured in /etc/apt" >&2; exit 1; }
    echo "$uri"
}

# Prints the cached root filesystem tarball, making it on first use: of the oldest of `suites`, or
# of the suites given.
rootfs() {
    local suite made
    local wanted=("$@")
    [ ${#wanted[@]} -gt 0 ] || wanted=("${suites[@]}")
    for suite in "${wanted[@]}"; do
        [ -f "$cache/$suite.tar" ] && { echo "$cache/$suite.tar"; return; }
    done
    command -v debootstrap >/dev/null || { apt-get update -q >&2; apt-get install -y -q debootstrap >&2; }
    mkdir -p "$cache"
    local uri; uri=$(mirror)
    for suite in "${wanted[@]}"; do
        made=$(mktemp -d /tmp/cuinterpose-debootstrap.XXXXXX)
        if debootstrap --variant=minbase "$suite" "$made" "$uri" >"$cache/$suite.log" 2>&1; then
            # The package cache and lists are not needed to run programs or dpkg -i.
            rm -rf "$made"/var/cache/apt/archives/*.deb "$made"/var/lib/apt/lists/*
            tar -C "$made" -cf "$cache/$suite.tar.tmp" .
            mv "$cache/$suite.tar.tmp" "$cache/$suite.tar"
            rm -rf "$made"
            echo "$cache/$suite.tar"
            return
        fi
        rm -rf "$made"
        log "debootstrap $suite: not on $uri ($(tail -1 "$cache/$suite.log"))" >&2
    done
    echo "test-release: debootstrap found none of ${wanted[*]} on $uri" >&2
    exit 1
}

fresh_root() {
    local dir; dir=$(mktemp -d /tmp/cuinterpose-chroot.XXXXXX)
    tar -C "$dir" -xf "$(rootfs)"
    echo "$dir"
}

# in_root ROOT COMMAND...: runs COMMAND with ROOT as its root, as a container runtime does: in a
# private mount namespace (its mounts vanish with it), ROOT bound onto itself and made the root with
# pivot_root (a plain chroot leaves the host's root above it, and paths the kernel reports through
# /proc, which `run --pid-namespace` reopens stdio by, would name the host's), the host's /dev
# (CRIU's checks open /dev/net/tun), fresh /proc, /sys, /dev/shm and /tmp.
in_root() {
    local root=$1; shift
    unshare --mount --propagation private -- sh -c '
        root=$1; shift
        mount --bind "$root" "$root" && mount -t proc proc "$root/proc" &&
            mount -t sysfs sysfs "$root/sys" && mount --rbind /dev "$root/dev" &&
            mount -t tmpfs tmpfs "$root/dev/shm" && mount -t tmpfs tmpfs "$root/tmp" &&
            cd "$root" && mkdir -p .old-root && pivot_root . .old-root &&
            exec /usr/sbin/chroot . /bin/sh -c "umount -l /.old-root && rmdir /.old-root &&
                exec /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \"\$@\"" sh "$@"
    ' sh "$root" "$@"
}

wants() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

if wants glibc; then
    log "glibc: the shipped binaries against GLIBC_$baseline"
    scripts/check-glibc.sh "$baseline" dist/bin/* dist/lib/libcuinterpose.so dist/lib/cuinterpose/test-driver/libcuda.so.1
    host_shim=$(ls target/*/libcuinterpose.so 2>/dev/null | head -1)
    if [ -n "$host_shim" ]; then
        if scripts/check-glibc.sh "$baseline" "$host_shim" >/dev/null 2>&1; then
            echo "test-release: the host-built $host_shim passed the $baseline check: the host's glibc is that old, or the check is broken" >&2
            exit 1
        fi
        echo "(the host-built $host_shim is refused, as it must be)"
    fi
fi

if wants old-userland; then
    log "old userland: the shim in a program of $(basename "$(rootfs)" .tar)"
    root=$(fresh_root)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root/opt"
    cp -a dist "$root/opt/cuinterpose"
    zig=$(scripts/install-zigbuild.sh)/python
    "$zig" -m ziglang cc -target "x86_64-linux-gnu.$baseline" -O2 -o "$root/opt/shim-probe" \
        scripts/release/shim-probe.c
    host_shim=$(ls target/*/libcuinterpose.so 2>/dev/null | head -1)
    [ -z "$host_shim" ] || cp "$host_shim" "$root/opt/host-libcuinterpose.so"
    cat >"$root/opt/probe.sh" <<'PROBE'
set -eu
ldd --version | head -1
export LD_LIBRARY_PATH=/opt/cuinterpose/lib/cuinterpose/test-driver FAKE_CUDA_STATE_DIR=/tmp/fake
# A control directory of its own, so the socket is found by name below (the default is the user's
# private directory; the name carries the PID namespace's inode).
export CUINTERPOSE_CONTROL_DIR=/tmp/control
mkdir -p /tmp/fake /tmp/control
mkfifo /tmp/hold
LD_PRELOAD=/opt/cuinterpose/lib/libcuinterpose.so /opt/shim-probe </tmp/hold >/tmp/probe.out 2>&1 &
probe=$!
exec 3>/tmp/hold
for _ in $(seq 100); do grep -q '^pid=' /tmp/probe.out && break; sleep 0.1; done
cat /tmp/probe.out
grep -q "^pid=$probe cuInit=0 cuInit_from=/opt/cuinterpose/lib/libcuinterpose.so" /tmp/probe.out
socket=$(ls /tmp/control/cuinterpose-*-"$probe".sock 2>/dev/null | head -1)
[ -S "$socket" ] || { echo "no control socket: the shim's runtime did not start"; exit 1; }
/opt/cuinterpose/bin/cuinterpose inspect --pid "$probe" --json >/tmp/inspect.json
grep -q '"status": "cuda+shim"' /tmp/inspect.json || { cat /tmp/inspect.json; exit 1; }
echo "the shim started in pid $probe and answered cuinterpose inspect"
exec 3>&-
wait "$probe"
if [ -f /opt/host-libcuinterpose.so ]; then
    LD_PRELOAD=/opt/host-libcuinterpose.so /bin/true 2>/tmp/host.err || true
    grep -q "GLIBC_" /tmp/host.err || { echo "the host-built shim loaded here: this userland is not older"; exit 1; }
    echo "the host-built shim is refused here: $(head -1 /tmp/host.err)"
fi
PROBE
    in_root "$root" sh /opt/probe.sh
    rm -rf "$root"
    trap - EXIT
fi

if wants deb; then
    deb=$(scripts/build-deb.sh)
    log "deb: $deb into a clean $(basename "$(rootfs)" .tar)"
    root=$(fresh_root)
    trap 'rm -rf "$root"' EXIT
    cp "$deb" "$root/root/cuinterpose.deb"
    cat >"$root/root/deb.sh" <<'DEB'
set -eu
dpkg -i /root/cuinterpose.deb
command -v cuinterpose
cuinterpose --version
[ -f /usr/share/man/man1/cuinterpose.1.gz ] && [ -f /usr/share/bash-completion/completions/cuinterpose ]
status=0; cuinterpose doctor || status=$?
echo "doctor exited $status (no CUDA driver in this chroot: 6 expected)"
[ "$status" -eq 6 ]
cuinterpose demo
cuinterpose demo --to-disk
DEB
    in_root "$root" sh /root/deb.sh
    rm -rf "$root"
    trap - EXIT
fi
if wants image; then
    # The suite the build machine runs (CI's: bookworm): the webhook and the agent are built
    # against its glibc here (the Containerfile's own build stage builds them in its base).
    tar=$(rootfs "$(awk -F= '$1 == "VERSION_CODENAME" {print $2}' /etc/os-release)")
    base=localhost/cuinterpose-image-base:$(basename "$tar" .tar)
    image=localhost/cuinterpose:test
    # The same settings as the real-container tests (scripts/container-runtimes.sh says why).
    read -r -a podman_run <<<"--runtime runc --network none --ulimit nofile=20000:20000 --ulimit nproc=32768:32768"
    podman image exists "$base" || { log "image: importing $tar as $base"; podman import "$tar" "$base" >/dev/null; }
    ctx=$(mktemp -d /tmp/cuinterpose-image.XXXXXX)
    trap 'rm -rf "$ctx"' EXIT
    # The build stage's layout (deploy/container/Containerfile): every binary in bin/, CRIU's
    # prefix in criu/.
    built=${CARGO_TARGET_DIR:-target}/debug
    mkdir -p "$ctx/prebuilt/bin/fake-driver"
    cp dist/bin/cuinterpose dist/bin/cuinterpose-workload dist/lib/libcuinterpose.so "$ctx/prebuilt/bin/"
    cp dist/lib/cuinterpose/test-driver/libcuda.so.1 "$ctx/prebuilt/bin/libcuda.so"
    ln -s ../libcuda.so "$ctx/prebuilt/bin/fake-driver/libcuda.so.1"
    for f in cuinterpose-webhook cuinterpose-agent; do
        [ -x "$built/$f" ] || { echo "test-release: $built/$f missing: cargo build --workspace first" >&2; exit 1; }
        strip --strip-debug -o "$ctx/prebuilt/bin/$f" "$built/$f"
    done
    cp -a dist/libexec/cuinterpose/criu "$ctx/prebuilt/criu"
    log "image: podman build over $base"
    podman build -q -f deploy/container/Containerfile --build-arg "DEBIAN=$base" \
        --build-arg BINARIES=prebuilt -t "$image" "$ctx" >/dev/null
    log "image: demo and demo --to-disk in a container of it"
    podman run --rm "${podman_run[@]}" "$image" /opt/cuinterpose/cuinterpose demo
    # CRIU (the image's, as the agent's DaemonSet names it) needs root and a privileged container.
    podman run --rm "${podman_run[@]}" --privileged --user 0 \
        -e CUINTERPOSE_CRIU=/opt/cuinterpose/criu/bin/criu "$image" /opt/cuinterpose/cuinterpose demo --to-disk
    # The webhook's init container and a shaped container as shaping::shape makes them
    # (crates/kube/tests/image.rs).
    log "image: the shaped init container, then the shaped command under the launcher and the shim"
    # By digest: the webhook refuses an image that is not pinned.
    pinned=localhost/cuinterpose@$(podman image inspect --format '{{.Digest}}' "$image")
    CUINTERPOSE_TEST_PRODUCT_IMAGE=$pinned CUINTERPOSE_TEST_BASE_IMAGE=$base \
        CUINTERPOSE_TEST_PODMAN_ARGS="${podman_run[*]}" \
        cargo test -p cuinterpose-kube --locked --test image -- --ignored
    rm -rf "$ctx"
    trap - EXIT
fi
log "passed: ${steps[*]}"
