#!/usr/bin/env bash
# A worker node for the local control plane (scripts/cluster.sh): containerd + runc + CNI bridge from Debian's
# packages, kubelet, kube-scheduler and kube-proxy (nftables mode, with Debian's nft) built from the Go module
# proxy (the same wrapper module as the API server), CoreDNS (built from the proxy, run on this machine at the
# bridge address as the cluster's DNS), metrics-server (built from the proxy, run on this machine, registered as
# the metrics.k8s.io APIService: the HPAs' CPU figures), a pause image built here, and the hl7gw image from
# scripts/image-local.sh imported. Pods run in
# network namespaces on a bridge (10.88.0.0/16; 10.88.0.1 is this machine: the node's address, where the
# kubelet listens and where a Kafka for the pods listens); nothing is pulled from a
# registry (images are imported, the chart's pods use imagePullPolicy: Never).
#
#   scripts/node.sh fetch | up | down | status
#
#   fetch   build/download the binaries once (.cache/node-$K8S_VERSION, .cache/tools/metrics-server-*; instant when
#           cached)
#   up      start containerd, import the images, start kubelet and kube-scheduler against the cluster on
#           CLUSTER_API_PORT (scripts/cluster.sh up first), wait until the node is Ready
#   down    stop kubelet, the pods' containers, containerd and the scheduler by PID; remove the pods' network
#           namespaces, mounts and the bridge
#
# What this machine needed (issue 14): the host has cgroup v1 (kubelet failCgroupV1: false, cgroupfs driver),
# swap is tolerated (failSwapOn: false), and this sandbox forbids lowering oom_score_adj (containerd's CRI
# restrict_oom_score_adj = true, without which every sandbox fails with "can't get final child's PID from
# pipe: EOF"). The kubelet authenticates with a client certificate from the cluster's CA
# (CN=system:node:<name>, O=system:nodes) and the ClusterRole system:node is bound to system:nodes (the local API
# server authorizes with RBAC only, no Node authorizer).
#
# Settings (environment): CLUSTER_API_PORT (6443), NODE_NAME (hl7gw-node), NODE_DIR (.cache/node-run-$PORT),
# NODE_KUBELET_PORT (10250 + port offset), NODE_SUBNET (10.88.0.0/16).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=v1.36.3
CONTAINERD_DEB=1.6.20~ds1-1+deb12u3 RUNC_DEB=1.1.5+ds1-1+deb12u1 CNI_DEB=1.1.1+ds1-3+b5 COREDNS_VERSION=v1.14.7
METRICS_SERVER_VERSION=v0.8.0
# nft and the libraries it needs beyond the base system's.
NFT_DEBS="nftables=1.0.6-2+deb12u2 libnftables1=1.0.6-2+deb12u2 libnftnl11 libmnl0 libjansson4 libxtables12 libedit2 libbsd0 libmd0"
cache=$root/.cache/node-$K8S_VERSION
bin=$cache/bin
ms_dir=$root/.cache/tools/metrics-server-$METRICS_SERVER_VERSION
CLUSTER_API_PORT=${CLUSTER_API_PORT:-6443}
if [ "$CLUSTER_API_PORT" = 6443 ]; then cluster_dir=$root/.cache/cluster; else cluster_dir=$root/.cache/cluster-$CLUSTER_API_PORT; fi
CLUSTER_DIR=${CLUSTER_DIR:-$cluster_dir}
NODE_DIR=${NODE_DIR:-$root/.cache/node-run-$CLUSTER_API_PORT}
NODE_NAME=${NODE_NAME:-hl7gw-node}
NODE_KUBELET_PORT=${NODE_KUBELET_PORT:-$((CLUSTER_API_PORT + 10))}
NODE_SUBNET=${NODE_SUBNET:-10.88.0.0/16}
NODE_BRIDGE=${NODE_BRIDGE:-hl7gw0}
NODE_GATEWAY=${NODE_SUBNET%.*/*}.1
NODE_METRICS_PORT=${NODE_METRICS_PORT:-$((NODE_KUBELET_PORT + 5))}
sock=$NODE_DIR/containerd/containerd.sock
export PATH="$bin:$PATH"

log() { printf 'node: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# --- fetch ---------------------------------------------------------------------------------------------------------

fetch() {
  local want; want=$(cat "$root/scripts/k8s-wrapper/go.mod" "$root/scripts/k8s-wrapper/go.sum" "$root/scripts/node/pause.go" \
    <(echo "$K8S_VERSION $CONTAINERD_DEB $RUNC_DEB $CNI_DEB $COREDNS_VERSION $NFT_DEBS") | sha256sum | cut -c1-16)
  [ "$(cat "$bin/.stamp" 2>/dev/null)" = "$want" ] && return
  command -v go >/dev/null || die "go is not installed"
  command -v apt-get >/dev/null || die "no apt-get: containerd, runc and the CNI plugins come from Debian's packages"
  mkdir -p "$cache"
  exec 8>"$root/.cache/.go-build.lock"
  flock 8
  local t0=$SECONDS out=$cache/bin.new src=$cache/src
  rm -rf "$out" "$src" "$cache/deb"
  mkdir -p "$out/cni" "$src/pause" "$cache/deb"
  log "building kubelet, kube-scheduler, kube-proxy $K8S_VERSION, CoreDNS $COREDNS_VERSION, pause; downloading containerd, runc, CNI plugins, nft (once; log in ${cache#"$root"/}/build.log)"
  cp "$root/scripts/k8s-wrapper/go.mod" "$root/scripts/k8s-wrapper/go.sum" "$src/"
  cp "$root/scripts/node/pause.go" "$src/pause/main.go"
  (
    cd "$src"
    export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
    local v="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
    v+=" -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
    nice -n 10 go build -trimpath -ldflags "-s -w $v" -o "$out/" k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
    (cd pause && printf 'module hl7gw.local/pause\n\ngo 1.22\n' >go.mod && go build -trimpath -ldflags "-s -w" -o "$out/pause" .)
    mkdir coredns && cd coredns && go mod init hl7gw.local/coredns && go get "github.com/coredns/coredns@$COREDNS_VERSION"
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out/coredns" github.com/coredns/coredns
  ) >"$cache/build.log" 2>&1 || { tail -n 30 "$cache/build.log" >&2; die "build failed ($cache/build.log)"; }
  # shellcheck disable=SC2086
  (cd "$cache/deb" && apt-get download -q "containerd=$CONTAINERD_DEB" "runc=$RUNC_DEB" "containernetworking-plugins=$CNI_DEB" \
    $NFT_DEBS >/dev/null 2>&1) || die "could not download Debian's containerd/runc/containernetworking-plugins/nftables"
  local d
  for d in "$cache"/deb/*.deb; do dpkg-deb -x "$d" "$cache/deb/root"; done
  cp "$cache"/deb/root/usr/bin/{containerd,containerd-shim-runc-v2,ctr} "$cache/deb/root/usr/sbin/runc" "$out/"
  cp "$cache"/deb/root/usr/lib/cni/{bridge,host-local,loopback,portmap} "$out/cni/"
  # kube-proxy runs `nft` from PATH: Debian's, with its libraries beside it.
  mkdir -p "$out/nft"
  cp -a "$cache"/deb/root/usr/lib/x86_64-linux-gnu/. "$out/nft/"
  cp "$cache/deb/root/usr/sbin/nft" "$out/nft/nft.bin"
  printf '#!/bin/sh\nd=$(dirname "$0")\nLD_LIBRARY_PATH="$d" exec "$d/nft.bin" "$@"\n' >"$out/nft/nft"
  chmod +x "$out/nft/nft"
  "$out/nft/nft" --version >/dev/null || die "Debian's nft does not run here"
  rm -rf "$cache/deb" "$src"
  echo "$want" >"$out/.stamp"
  rm -rf "$bin"
  mv "$out" "$bin"
  log "ready in $((SECONDS - t0)) s: $(cd "$bin" && echo *)"
}

# metrics-server (the HPAs' CPU figures: the metrics.k8s.io API), built from the Go module proxy into
# .cache/tools/metrics-server-$METRICS_SERVER_VERSION, at nice 19 under the shared Go build lock.
# shellcheck source=scripts/lib/gobuild.sh
. "$root/scripts/lib/gobuild.sh"
fetch_metrics_server() {
  go_build_once "$ms_dir" "$METRICS_SERVER_VERSION" "metrics-server $METRICS_SERVER_VERSION" build_metrics_server
}
build_metrics_server() {
  mkdir -p "$ms_dir/src" && cd "$ms_dir/src" || return
  export GOFLAGS="-mod=mod -buildvcs=false"
  go mod init hl7gw.local/metrics-server
  go get -tool "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION"
  nice -n 19 go build -trimpath -ldflags "-s -w" -o "$ms_dir/bin/" sigs.k8s.io/metrics-server/cmd/metrics-server &&
    rm -rf "$ms_dir/src"
}

# --- processes -----------------------------------------------------------------------------------------------------

PROCS_DIR=$NODE_DIR
# shellcheck source=scripts/lib/procs.sh
. "$root/scripts/lib/procs.sh"
# shellcheck source=scripts/lib/apiservice.sh
. "$root/scripts/lib/apiservice.sh"

kubectl() { "$root/.cache/k8s-$K8S_VERSION/bin/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig" "$@"; }
ctr_() { "$bin/ctr" --address "$sock" -n k8s.io "$@"; }

# --- configuration -------------------------------------------------------------------------------------------------

configure() {
  local d=$NODE_DIR
  mkdir -p "$d"/{containerd,kubelet,cni/net.d,pki,manifests,log}
  cat >"$d/containerd.toml" <<EOF
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "hl7gw.local/pause:1"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$bin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$bin/cni"
    conf_dir = "$d/cni/net.d"
EOF
  cat >"$d/cni/net.d/10-hl7gw.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "hl7gw", "plugins": [
  {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
   "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$NODE_SUBNET", "gateway": "$NODE_GATEWAY"}]],
            "dataDir": "$d/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  # The cluster's DNS: Services and pods of the local API server, answered at the bridge address.
  cat >"$d/Corefile" <<EOF
.:53 {
    bind $NODE_GATEWAY
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $CLUSTER_DIR/kubeconfig
        pods insecure
    }
    cache 30
}
EOF
  # The kubelet's client certificate, from the cluster's CA.
  openssl genrsa -out "$d/pki/kubelet.key" 2048 2>/dev/null
  openssl req -new -key "$d/pki/kubelet.key" -subj "/O=system:nodes/CN=system:node:$NODE_NAME" -out "$d/pki/kubelet.csr" 2>/dev/null
  openssl x509 -req -in "$d/pki/kubelet.csr" -CA "$CLUSTER_DIR/ca.crt" -CAkey "$CLUSTER_DIR/ca.key" -CAcreateserial \
    -days 7 -out "$d/pki/kubelet.crt" 2>/dev/null
  cat >"$d/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$CLUSTER_API_PORT", certificate-authority: "$CLUSTER_DIR/ca.crt"}}]
users: [{name: kubelet, user: {client-certificate: "$d/pki/kubelet.crt", client-key: "$d/pki/kubelet.key"}}]
contexts: [{name: local, context: {cluster: local, user: kubelet}}]
current-context: local
EOF
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$sock
address: $NODE_GATEWAY
port: $NODE_KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((NODE_KUBELET_PORT + 1))
# Listens on the bridge address only; the API server calls it (logs, exec) without a client certificate.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
staticPodPath: "$d/manifests"
resolvConf: /etc/resolv.conf
clusterDNS: ["$NODE_GATEWAY"]
clusterDomain: cluster.local
enforceNodeAllocatable: []
cgroupsPerQOS: false
localStorageCapacityIsolation: false
evictionHard: {}
serializeImagePulls: false
# The load Job prints every ACKed control id (scripts/node-check.sh reads them with kubectl logs): no rotation.
containerLogMaxSize: 200Mi
EOF
}

# --- up / down -----------------------------------------------------------------------------------------------------

up() {
  fetch
  [ -f "$CLUSTER_DIR/kubeconfig" ] || die "no cluster on port $CLUSTER_API_PORT: scripts/cluster.sh up first"
  down >/dev/null 2>&1 || true
  rm -rf "$NODE_DIR"
  configure
  sysctl -qw net.ipv4.ip_forward=1 2>/dev/null || true
  # The bridge exists before the first pod: its address is the node's (a kubelet refuses a loopback node IP)
  # and the address pods reach this machine at (a Kafka for them listens there).
  ip link add "$NODE_BRIDGE" type bridge 2>/dev/null || true
  ip addr replace "$NODE_GATEWAY/${NODE_SUBNET#*/}" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  start containerd "$bin/containerd" --config "$NODE_DIR/containerd.toml"
  for _ in $(seq 1 100); do [ -S "$sock" ] && ctr_ version >/dev/null 2>&1 && break; sleep 0.1; done
  ctr_ version >/dev/null 2>&1 || { tail -n 20 "$NODE_DIR/containerd.log" >&2; die "containerd did not start"; }
  import_images
  kubectl create clusterrolebinding hl7gw-local-nodes --clusterrole=system:node --group=system:nodes \
    >/dev/null 2>&1 || true
  start kubelet "$bin/kubelet" --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$NODE_DIR/kubelet.kubeconfig" \
    --root-dir "$NODE_DIR/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_GATEWAY" --v=1
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$CLUSTER_DIR/kubeconfig" --leader-elect=false \
    --secure-port $((NODE_KUBELET_PORT + 2)) --bind-address 127.0.0.1 --v=1
  # Service ClusterIPs in nftables (masquerading all, so a pod reaching a Service on its own bridge gets the
  # answers back through this machine).
  PATH="$bin/nft:$PATH" start kube-proxy "$bin/kube-proxy" --kubeconfig "$CLUSTER_DIR/kubeconfig" --proxy-mode nftables \
    --hostname-override "$NODE_NAME" --cluster-cidr "$NODE_SUBNET" --masquerade-all \
    --metrics-bind-address "127.0.0.1:$((NODE_KUBELET_PORT + 3))" --healthz-bind-address "127.0.0.1:$((NODE_KUBELET_PORT + 4))" --v=1
  start coredns "$bin/coredns" -conf "$NODE_DIR/Corefile"
  metrics_server
  local t0=$SECONDS
  until kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True; do
    [ $((SECONDS - t0)) -lt 90 ] || { tail -n 30 "$NODE_DIR/kubelet.log" >&2; die "node $NODE_NAME not Ready in 90 s"; }
    pid_of kubelet >/dev/null || { tail -n 30 "$NODE_DIR/kubelet.log" >&2; die "kubelet exited"; }
    sleep 1
  done
  log "node $NODE_NAME Ready in $((SECONDS - t0)) s (pods on $NODE_SUBNET, this machine is $NODE_GATEWAY to them)"
  t0=$SECONDS
  until kubectl get --raw /apis/metrics.k8s.io/v1beta1/nodes >/dev/null 2>&1; do
    [ $((SECONDS - t0)) -lt 90 ] || { tail -n 30 "$NODE_DIR/metrics-server.log" >&2; die "metrics.k8s.io not served in 90 s"; }
    pid_of metrics-server >/dev/null || { tail -n 30 "$NODE_DIR/metrics-server.log" >&2; die "metrics-server exited"; }
    sleep 1
  done
  log "metrics.k8s.io served by metrics-server $METRICS_SERVER_VERSION in $((SECONDS - t0)) s (the HPAs' CPU)"
}

# metrics-server on this machine, like CoreDNS: it scrapes the kubelet's /metrics/resource (the kubelet's serving
# certificate is self-signed: --kubelet-insecure-tls; the kubelet allows anonymous calls on the bridge address) and
# serves metrics.k8s.io at $NODE_GATEWAY:$NODE_METRICS_PORT, registered as an APIService behind a Service without
# selector whose Endpoints name this machine (the API server calls endpoints directly:
# --enable-aggregator-routing in scripts/cluster.sh). The API server's calls are authenticated by its front-proxy
# client certificate (--requestheader-* there); the APIService skips verifying metrics-server's self-signed one.
metrics_server() {
  fetch_metrics_server
  mkdir -p "$NODE_DIR/metrics-server"
  start metrics-server "$ms_dir/bin/metrics-server" --bind-address "$NODE_GATEWAY" --secure-port "$NODE_METRICS_PORT" \
    --cert-dir "$NODE_DIR/metrics-server" --kubeconfig "$CLUSTER_DIR/kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/kubeconfig" --authorization-kubeconfig "$CLUSTER_DIR/kubeconfig" \
    --kubelet-insecure-tls --kubelet-use-node-status-port --kubelet-preferred-address-types InternalIP \
    --metric-resolution 15s --v=1
  register_apiservice metrics.k8s.io metrics-server kube-system "$NODE_METRICS_PORT" "$NODE_DIR/metrics-server-apply.log"
}

# The pause image and the hl7gw image (scripts/image-local.sh), named as the chart and containerd ask for them.
import_images() {
  local umoci layout=$NODE_DIR/pause-oci bundle=$NODE_DIR/pause-bundle
  umoci=$("$root/scripts/tools.sh" umoci)
  "$umoci" init --layout "$layout"
  "$umoci" new --image "$layout:1"
  "$umoci" unpack --image "$layout:1" "$bundle" >/dev/null
  cp "$bin/pause" "$bundle/rootfs/pause"
  "$umoci" repack --image "$layout:1" "$bundle"
  "$umoci" config --image "$layout:1" --os linux --architecture amd64 --config.entrypoint /pause --config.user 65535:65535
  tar -C "$layout" -cf "$NODE_DIR/pause.tar" .
  rm -rf "$layout" "$bundle"
  ctr_ images import --base-name hl7gw.local/pause "$NODE_DIR/pause.tar" >/dev/null
  local image=$root/.cache/image/hl7gw-0.1.0.oci.tar
  if [ -f "$image" ]; then
    ctr_ images import --base-name docker.io/library/hl7gw "$image" >/dev/null
  else
    log "no $image (scripts/image-local.sh builds it): only the pause image is imported"
  fi
  # `ctr import` of an OCI layout may also register import-<date>:<ref>, which the CRI would resolve first.
  ctr_ images ls -q | grep '^import-' | xargs -r "$bin/ctr" --address "$sock" -n k8s.io images rm >/dev/null || true
  log "images: $(ctr_ images ls -q | tr '\n' ' ')"
}

down() {
  stop_pid metrics-server
  stop_pid coredns
  stop_pid kube-proxy
  "$bin/nft/nft" delete table ip kube-proxy 2>/dev/null || true
  "$bin/nft/nft" delete table ip6 kube-proxy 2>/dev/null || true
  stop_pid kube-scheduler
  stop_pid kubelet
  if pid_of containerd >/dev/null; then
    # Every pod's containers and sandboxes, then the shims.
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
    sleep 0.5
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
  fi
  pkill -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
  stop_pid containerd
  # Mounts under the node's dirs (rootfs overlays, shm, secrets, netns), deepest first.
  grep -F " $NODE_DIR/" /proc/mounts | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cni-' || true); do ip netns delete "$ns" 2>/dev/null || true; done
  ip link delete "$NODE_BRIDGE" 2>/dev/null || true
  log "stopped"
}

status() {
  local c
  for c in containerd kubelet kube-scheduler kube-proxy coredns metrics-server; do
    if pid=$(pid_of "$c"); then echo "$c running (pid $pid)"; else echo "$c stopped"; fi
  done
  kubectl get node "$NODE_NAME" 2>/dev/null || true
}

case "${1:-}" in
  fetch) fetch; fetch_metrics_server ;;
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 fetch|up|down|status" >&2; exit 2 ;;
esac
