#!/usr/bin/env bash
# Real Kubernetes server code for the Kubernetes tests (crates/kube): the Kubernetes CRD API server
# (k8s.io/apiextensions-apiserver, the kube-apiserver's own library for CustomResourceDefinitions,
# with its real REST storage, validation, server-side apply, watch and status subresource) on etcd
# 3.5, plus a Go harness around the kube-apiserver's real mutating admission webhook plugin.
#
# Why this way: a kube-apiserver, a kubelet and a container runtime cannot run on these machines, but
# Debian ships the Kubernetes server libraries as Go source. Bookworm's are too old (no
# apiextensions-apiserver), so, like install-criu.sh, the packages come from Debian's own archive
# with the suite changed (sid: Kubernetes 0.36 = 1.36, Go 1.27, etcd 3.5), fetched with apt into a
# private root and unpacked with `dpkg -x`; nothing is installed on the system. The build runs in
# GOPATH mode over Debian's source tree with the module proxy off, so nothing but Debian's packages
# is used. Everything lives in .k8s-test (git-ignored), keyed by the package versions.
#
# Usage:
#   scripts/k8s-test-server.sh prepare          fetch + build once (cached); prints the cache dir
#   scripts/k8s-test-server.sh start DIR        start etcd + the API server on 127.0.0.1 (random ports);
#                                               DIR gets kubeconfig, env (sourceable), logs, pids
#   scripts/k8s-test-server.sh stop DIR         stop what `start DIR` started
#   scripts/k8s-test-server.sh kubectl          fetch Debian's kubectl once (cached); prints its path
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
base=$repo/.k8s-test
suite=sid
packages=(golang-k8s-apiextensions-apiserver-dev golang-k8s-apiserver-dev etcd-server golang-go)

log() { printf 'k8s-test-server: %s\n' "$*" >&2; }

apt_opts() {
    printf '%s\n' -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$base/apt/sources.d" \
        -o "Dir::State::Lists=$base/apt/lists" -o "Dir::Cache=$base/apt/cache" \
        -o Dir::State::Status=/dev/null -o APT::Sandbox::User=root -q
}

sources() {
    mkdir -p "$base/apt/lists/partial" "$base/apt/cache/archives/partial" "$base/apt/sources.d"
    local uri="" key=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
        key=$(awk '/^Signed-By:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
    fi
    [ -n "$uri" ] || { log "no Debian source configured in /etc/apt"; exit 1; }
    [ -n "$key" ] || key=/usr/share/keyrings/debian-archive-keyring.gpg
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' "$uri" "$suite" "$key" \
        >"$base/apt/sources.d/$suite.sources"
    mapfile -t opts < <(apt_opts)
    apt-get "${opts[@]}" update >/dev/null
}

prepare() {
    local t0=$SECONDS
    sources
    mapfile -t opts < <(apt_opts)
    # The Go source packages the server needs (all golang-*), the Go toolchain and etcd. Everything
    # else in the closure (libc, systemd, protobuf's C++ side) is what a system install would pull
    # in and is not needed to build or run these static Go programs.
    local closure
    closure=$(apt-get "${opts[@]}" -s install --no-install-recommends "${packages[@]}" |
        awk '/^Inst /{v=$3; gsub(/[()\[\]]/, "", v); print $2 "=" v}' | grep -E '^(golang-|etcd-server=)' | sort)
    [ -n "$closure" ] || { log "apt resolved nothing for ${packages[*]}"; exit 1; }
    local key_hash
    key_hash=$(printf '%s\n' "$closure" | sha256sum | cut -c1-16)
    local dir=$base/$key_hash
    if [ -x "$dir/bin/apiextensions-apiserver" ] && [ -x "$dir/bin/etcd" ] && [ -x "$dir/bin/admission-harness" ] &&
        [ "$(cat "$dir/bin/admission-harness.sha256" 2>/dev/null)" = "$(harness_hash)" ]; then
        echo "$dir"
        return
    fi
    if [ ! -d "$dir/root" ]; then
        rm -rf "$dir.tmp"
        mkdir -p "$dir.tmp/debs" "$dir.tmp/root" "$dir.tmp/bin"
        # shellcheck disable=SC2086
        (cd "$dir.tmp/debs" && apt-get "${opts[@]}" download $closure >/dev/null)
        for deb in "$dir.tmp"/debs/*.deb; do dpkg -x "$deb" "$dir.tmp/root"; done
        rm -rf "$dir.tmp/debs"
        log "fetched and unpacked $(printf '%s\n' "$closure" | wc -l) packages in $((SECONDS - t0)) s"
        # Debian's Go source tree links packages to each other with absolute symlinks
        # (/usr/share/gocode/...); point them into the private root.
        find "$dir.tmp/root" -type l | while read -r link; do
            target=$(readlink "$link")
            case $target in /*) ln -sfn "$dir/root$target" "$link" ;; esac
        done
        mv "$dir.tmp" "$dir"
    fi
    build "$dir"
    echo "$dir"
}

# The harness is rebuilt when its source changes.
harness_hash() {
    cat "$repo"/crates/kube/go/admission-harness/*.go | sha256sum | cut -c1-64
}

go_env() {
    local dir=$1
    local goroot
    goroot=$(find "$dir/root/usr/lib" -maxdepth 1 -name 'go-1.*' -type d | sort -V | tail -1)
    export GOROOT=$goroot PATH=$goroot/bin:$PATH GO111MODULE=off GOPROXY=off GOFLAGS= GOTOOLCHAIN=local
    export GOCACHE=$base/gocache CGO_ENABLED=0
}

build() {
    local dir=$1 t0=$SECONDS
    (
        go_env "$dir"
        export GOPATH=$dir/root/usr/share/gocode
        if [ ! -x "$dir/bin/apiextensions-apiserver" ]; then
            go build -o "$dir/bin/apiextensions-apiserver" k8s.io/apiextensions-apiserver
            log "built apiextensions-apiserver in $((SECONDS - t0)) s"
        fi
        t1=$SECONDS
        # The harness is a package of its own GOPATH entry, next to Debian's tree.
        mkdir -p "$dir/harness/src/cuinterpose"
        rm -rf "$dir/harness/src/cuinterpose/admission-harness"
        cp -r "$repo/crates/kube/go/admission-harness" "$dir/harness/src/cuinterpose/admission-harness"
        GOPATH=$dir/harness:$dir/root/usr/share/gocode go build -o "$dir/bin/admission-harness" \
            cuinterpose/admission-harness
        harness_hash >"$dir/bin/admission-harness.sha256"
        log "built admission-harness in $((SECONDS - t1)) s"
    )
    ln -sfn "$dir/root/usr/bin/etcd" "$dir/bin/etcd"
}

# kubectl for `kubectl kustomize` (render deploy/kubernetes): the same suite's package, unpacked on
# its own so that its version does not change the server's cache key.
fetch_kubectl() {
    sources
    mapfile -t opts < <(apt_opts)
    local version dir
    version=$(apt-cache "${opts[@]}" policy kubectl | awk '/Candidate:/{print $2}')
    [ -n "$version" ] && [ "$version" != "(none)" ] || { log "no kubectl in $suite"; exit 1; }
    dir=$base/kubectl-${version//[^A-Za-z0-9.+-]/_}
    if [ ! -x "$dir/root/usr/bin/kubectl" ]; then
        rm -rf "$dir.tmp"
        mkdir -p "$dir.tmp/root"
        (cd "$dir.tmp" && apt-get "${opts[@]}" download "kubectl=$version" >/dev/null)
        dpkg -x "$dir.tmp"/kubectl_*.deb "$dir.tmp/root"
        rm -f "$dir.tmp"/*.deb
        mv "$dir.tmp" "$dir"
    fi
    echo "$dir/root/usr/bin/kubectl"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    local dir state
    dir=$(prepare)
    state=$1
    mkdir -p "$state/pki" "$state/etcd"
    local pki=$state/pki
    # A CA, the server's certificate for 127.0.0.1, and a client certificate in system:masters (the
    # API server's authenticator maps a client certificate's O to groups).
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=cuinterpose-test-ca \
        -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$pki/server.key" -out "$pki/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$pki/server.ext"
    openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
        -extfile "$pki/server.ext" -out "$pki/server.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=cuinterpose-test-admin" \
        -keyout "$pki/admin.key" -out "$pki/admin.csr" 2>/dev/null
    # With an extension, so that the certificate is X.509 v3 (rustls accepts no other).
    printf 'extendedKeyUsage=clientAuth\n' >"$pki/admin.ext"
    openssl x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
        -extfile "$pki/admin.ext" -out "$pki/admin.crt" 2>/dev/null
    local etcd_port peer_port api_port
    etcd_port=$(free_port) peer_port=$(free_port) api_port=$(free_port)
    "$dir/bin/etcd" --data-dir "$state/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "default=http://127.0.0.1:$peer_port" >"$state/etcd.log" 2>&1 &
    echo $! >"$state/etcd.pid"
    # The admin's kubeconfig. The server also uses it for its delegated authentication and
    # authorization clients, which it cannot start without; they are never called for the admin,
    # whose group system:masters is always allowed.
    cat >"$state/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: admin
  user:
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: test
  context: {cluster: test, user: admin, namespace: default}
current-context: test
EOF
    # The admission plugins and priority-and-fairness that watch core or admissionregistration
    # objects would wait forever for informers of APIs this server does not serve.
    local no_core_admission=NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook
    no_core_admission+=,ValidatingAdmissionPolicy,MutatingAdmissionPolicy
    "$dir/bin/apiextensions-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --secure-port "$api_port" --cert-dir "$state/pki" \
        --tls-cert-file "$pki/server.crt" --tls-private-key-file "$pki/server.key" \
        --client-ca-file "$pki/ca.crt" --authorization-always-allow-paths '/healthz,/readyz,/livez' \
        --authentication-skip-lookup --authentication-kubeconfig "$state/kubeconfig" \
        --authorization-kubeconfig "$state/kubeconfig" --kubeconfig "$state/kubeconfig" \
        --disable-admission-plugins "$no_core_admission" --enable-priority-and-fairness=false \
        >"$state/apiserver.log" 2>&1 &
    echo $! >"$state/apiserver.pid"
    # Ready when the CRD API answers the admin. (/readyz stays false: its informer-sync check waits
    # for a Service informer, for conversion webhooks, that a server without the core API never
    # syncs; the CRD API itself serves regardless.)
    local i
    for i in $(seq 1 120); do
        if curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
            "https://127.0.0.1:$api_port/apis/apiextensions.k8s.io/v1/customresourcedefinitions" >/dev/null 2>&1; then
            break
        fi
        kill -0 "$(cat "$state/apiserver.pid")" 2>/dev/null || { tail -20 "$state/apiserver.log" >&2; exit 1; }
        sleep 0.5
    done
    [ "$i" -lt 120 ] || { log "API server not ready after 60 s"; tail -20 "$state/apiserver.log" >&2; exit 1; }
    cat >"$state/env" <<EOF
export CUINTERPOSE_KUBE_TEST_KUBECONFIG=$state/kubeconfig
export CUINTERPOSE_ADMISSION_HARNESS=$dir/bin/admission-harness
EOF
    log "API server ready at https://127.0.0.1:$api_port (state in $state)"
}

stop() {
    local state=$1 pid
    for name in apiserver etcd; do
        if [ -f "$state/$name.pid" ]; then
            pid=$(cat "$state/$name.pid")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
            rm -f "$state/$name.pid"
        fi
    done
}

case ${1:-} in
    prepare) prepare ;;
    start) [ -n "${2:-}" ] || { log "usage: start DIR"; exit 2; }; start "$2" ;;
    stop) [ -n "${2:-}" ] || { log "usage: stop DIR"; exit 2; }; stop "$2" ;;
    kubectl) fetch_kubectl ;;
    *) log "usage: $0 prepare | start DIR | stop DIR | kubectl"; exit 2 ;;
esac
