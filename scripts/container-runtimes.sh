#!/usr/bin/env bash
# Real container runtimes for the container tests (crates/cli/tests/disk.rs): runc, Podman and
# containerd from Debian's packages, their images made here from busybox-static (nothing is pulled),
# and a containerd of the tests' own (private config, root and state; its pid recorded, and only
# that pid stopped).
#
# Why these settings (tried on the project's machines: root, Debian bookworm, hybrid cgroups with
# every controller on v1, no CAP_SYS_RESOURCE):
# - CRIU is the project's own (scripts/install-criu.sh): Debian's criu 3.17 fails on current
#   kernels' vDSO. CRIU needs `iptables` for its network lock.
# - Podman runs its containers with `--runtime runc` (Debian's crun is built without CRIU),
#   `--network none` and explicit ulimits (the defaults ask for limits above the hard ones a
#   process without CAP_SYS_RESOURCE can set); they are printed as CUINTERPOSE_TEST_PODMAN_ARGS.
# - containerd: `restrict_oom_score_adj` (no CAP_SYS_RESOURCE), the pause image imported from
#   the local base, one bridge + host-local CNI network without masquerading.
#
# The image is busybox-static in a root directory that has `/lib` and `/lib64` as links into
# `/usr`: the tests bind the host's `/usr` read-only over the image's, so the build's (glibc)
# binaries run in it, as the emulated containers bind the host's system directories.
#
# Usage:
#   scripts/container-runtimes.sh install        install the packages and make the images (cached);
#                                                 prints the environment the tests need
#   scripts/container-runtimes.sh start DIR      `install`, then start containerd in DIR (config,
#                                                 root, state, log, containerd.pid); DIR/env gets
#                                                 the environment, sourceable, also printed
#   scripts/container-runtimes.sh stop DIR       stop the containerd `start DIR` started
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
base=$repo/.containers
image=localhost/cuinterpose-test-base:1
pause_image=localhost/cuinterpose-test-pause:1
packages=(runc iptables busybox-static podman containerd containernetworking-plugins
    jq)
podman_args="--runtime runc --network none --ulimit nofile=20000:20000 --ulimit nproc=32768:32768"

log() { printf 'container-runtimes: %s\n' "$*" >&2; }

install_packages() {
    local missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The base root directory: busybox-static and its applets, /etc/passwd and group, the directories a
# runtime mounts over, and /lib, /lib64 as links into /usr (bound from the host by the tests).
make_rootfs() {
    local rootfs=$base/rootfs
    [ -x "$rootfs/bin/busybox" ] && return
    log "making the base root directory in $rootfs"
    rm -rf "$rootfs.new"
    mkdir -p "$rootfs.new"/{bin,etc,dev,proc,sys,tmp,run,usr,root}
    cp /bin/busybox "$rootfs.new/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [ -e "$rootfs.new/bin/$applet" ] || ln -s busybox "$rootfs.new/bin/$applet"
    done
    ln -s usr/lib "$rootfs.new/lib"
    ln -s usr/lib64 "$rootfs.new/lib64"
    chmod 1777 "$rootfs.new/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' \
        >"$rootfs.new/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs.new/etc/group"
    mv "$rootfs.new" "$rootfs"
}

# The Podman images, imported from the root directory (no registry): the base, and the pause image
# (busybox's `sleep` forever as the pod's init); both saved as archives for containerd.
make_images() {
    if ! podman image exists "$image"; then
        log "importing $image"
        tar -C "$base/rootfs" -cf "$base/rootfs.tar" .
        podman import --change 'CMD ["/bin/sh"]' "$base/rootfs.tar" "$image" >/dev/null
    fi
    if ! podman image exists "$pause_image"; then
        log "importing $pause_image"
        [ -f "$base/rootfs.tar" ] || tar -C "$base/rootfs" -cf "$base/rootfs.tar" .
        podman import --change 'ENTRYPOINT ["/bin/sleep", "2147483647"]' \
            "$base/rootfs.tar" "$pause_image" >/dev/null
    fi
    local name tar
    for name in base pause; do
        tar=$base/$name.tar
        [ -f "$tar" ] && continue
        local img=$pause_image
        [ $name = base ] && img=$image
        podman save --format docker-archive -o "$tar.new" "$img" >/dev/null
        mv "$tar.new" "$tar"
    done
}

print_env() {
    local criu
    criu=$("$repo/scripts/install-criu.sh")
    printf 'export CUINTERPOSE_CRIU=%q\n' "$criu"
    printf 'export CUINTERPOSE_TEST_ROOTFS=%q\n' "$base/rootfs"
    printf 'export CUINTERPOSE_TEST_RUNC=%q\n' "$(command -v runc)"
    printf 'export CUINTERPOSE_TEST_PODMAN=%q\n' "$(command -v podman)"
    printf 'export CUINTERPOSE_TEST_PODMAN_IMAGE=%q\n' "$image"
    printf 'export CUINTERPOSE_TEST_PODMAN_ARGS=%q\n' "$podman_args"
    printf 'export CUINTERPOSE_TEST_PAUSE_IMAGE=%q\n' "$pause_image"
}

install() {
    mkdir -p "$base"
    install_packages
    make_rootfs
    make_images
}

write_config() {
    local dir=$1
    mkdir -p "$dir/cni/conf" "$dir/root" "$dir/state"
    cat >"$dir/cni/conf/10-cuinterpose.conflist" <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "cuinterpose-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cuitest0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.77.0/24"}]]}
    }
  ]
}
EOF
    cat >"$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
[grpc]
  address = "$dir/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
EOF
}

start() {
    local dir=$1
    install
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ -f "$dir/containerd.pid" ] && kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null; then
        log "containerd already runs (pid $(cat "$dir/containerd.pid"))"
    else
        write_config "$dir"
        containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 &
        echo $! >"$dir/containerd.pid"
        for _ in $(seq 100); do
            ctr --address "$dir/containerd.sock" version >/dev/null 2>&1 && break
            kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null \
                || { cat "$dir/containerd.log" >&2; log "containerd exited"; exit 1; }
            sleep 0.2
        done
        ctr --address "$dir/containerd.sock" version >/dev/null \
            || { log "containerd did not answer"; exit 1; }
        # The pause image and the base for CRI's pods (namespace k8s.io), the base for `ctr run`
        # (default).
        ctr --address "$dir/containerd.sock" -n k8s.io images import "$base/pause.tar" >/dev/null
        ctr --address "$dir/containerd.sock" -n k8s.io images import "$base/base.tar" >/dev/null
        ctr --address "$dir/containerd.sock" -n default images import "$base/base.tar" >/dev/null
    fi
    {
        print_env
        printf 'export CUINTERPOSE_TEST_CONTAINERD=%q\n' "$dir/containerd.sock"
    } >"$dir/env"
    cat "$dir/env"
}

stop() {
    local dir=$1 pid
    [ -f "$dir/containerd.pid" ] || return 0
    pid=$(cat "$dir/containerd.pid")
    # Only the containerd this script started: the pid file's, and only while it still runs
    # containerd with this directory's config.
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--config $dir/config.toml"; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    fi
    rm -f "$dir/containerd.pid"
}

case "${1:-}" in
    install) install; print_env ;;
    start) start "${2:?usage: $0 start DIR}" ;;
    stop) stop "${2:?usage: $0 stop DIR}" ;;
    *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
