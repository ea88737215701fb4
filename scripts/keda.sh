#!/usr/bin/env bash
# KEDA on the local node (scripts/node.sh), for the chart's `autoscaling.engine: keda` (issue 37): the operator
# (ScaledObjects -> HPAs; its kafka scaler reads the consumer groups' lag from the brokers) and the metrics API
# server (external.metrics.k8s.io, what those HPAs read), built from the Go module proxy
# (github.com/kedacore/keda/v2 $KEDA_VERSION, its own go.mod as the main module: its replace directive holds) and run
# on this machine like the node's metrics-server: the API server reaches the metrics server at the bridge address
# through an APIService (a Service without selector, Endpoints naming this machine), the metrics server reaches
# the operator's gRPC service on 127.0.0.1 with mutual TLS (a CA and one certificate made here). No admission
# webhooks (the chart's ScaledObjects are checked by `make chart-check`), no certificate rotation.
#
#   scripts/keda.sh fetch | up | down
#
#   fetch   build keda-operator and keda-adapter once (.cache/tools/keda-$KEDA_VERSION; nice 19, the shared Go
#           build lock); the CRDs come from the module's config/crd/bases
#   up      the CRDs, namespace keda, both processes, the APIService; waits until external.metrics.k8s.io answers
#   down    stop both by PID
#
# Settings: CLUSTER_API_PORT (6443; scripts/cluster.sh's), NODE_DIR (.cache/node-run-$PORT: the state goes in
# keda/ there), KEDA_PORT (the metrics server's port on the bridge address; CLUSTER_API_PORT + 16).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=v1.36.3
KEDA_VERSION=v2.21.0
dir=$root/.cache/tools/keda-$KEDA_VERSION
CLUSTER_API_PORT=${CLUSTER_API_PORT:-6443}
if [ "$CLUSTER_API_PORT" = 6443 ]; then cluster_dir=$root/.cache/cluster; else cluster_dir=$root/.cache/cluster-$CLUSTER_API_PORT; fi
CLUSTER_DIR=${CLUSTER_DIR:-$cluster_dir}
NODE_DIR=${NODE_DIR:-$root/.cache/node-run-$CLUSTER_API_PORT}
KEDA_PORT=${KEDA_PORT:-$((CLUSTER_API_PORT + 16))}
NODE_GATEWAY=${NODE_GATEWAY:-10.88.0.1}
state=$NODE_DIR/keda

log() { printf 'keda: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
kubectl() { "$root/.cache/k8s-$K8S_VERSION/bin/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig" "$@"; }

# shellcheck source=scripts/lib/gobuild.sh
. "$root/scripts/lib/gobuild.sh"

fetch() {
  go_build_once "$dir" "$KEDA_VERSION" "keda-operator and keda-adapter $KEDA_VERSION" build_keda
}

# The build (go_build_once's command): the module's own source as the main module, its CRDs copied out. Its module
# sources and build cache (several GB: every scaler's cloud SDK) go to a scratch folder of its own, deleted after the
# build: nothing uses them once the binaries exist, and `make test` builds this beside its tests (scripts/test.sh),
# whose other Go scratch is gone by then.
build_keda() {
  local scratch=$root/.cache/go-scratch-keda rc=0
  (
    export GOFLAGS="-mod=mod -buildvcs=false" GOCACHE=$scratch/build GOMODCACHE=$scratch/mod
    src=$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    cp -r "$src" "$dir/src"
    chmod -R u+w "$dir/src"
    mkdir -p "$dir/crds"
    cp "$dir"/src/config/crd/bases/*.yaml "$dir/crds/"
    cd "$dir/src" || exit
    v="-X github.com/kedacore/keda/v2/version.Version=$KEDA_VERSION"
    nice -n 19 go build -trimpath -ldflags "-s -w $v" -o "$dir/bin/keda-operator" ./cmd/operator
    nice -n 19 go build -trimpath -ldflags "-s -w $v" -o "$dir/bin/keda-adapter" ./cmd/adapter
  ) || rc=$?
  chmod -R u+w "$scratch" 2>/dev/null
  rm -rf "$scratch" "$dir/src"
  return "$rc"
}

PROCS_DIR=$state
# shellcheck source=scripts/lib/procs.sh
. "$root/scripts/lib/procs.sh"
# shellcheck source=scripts/lib/apiservice.sh
. "$root/scripts/lib/apiservice.sh"

certs() {
  local d=$state/certs
  mkdir -p "$d"
  openssl ecparam -name prime256v1 -genkey -noout -out "$d/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$d/ca.key" -subj "/CN=hl7gw-keda-ca" -days 7 -out "$d/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
  openssl ecparam -name prime256v1 -genkey -noout -out "$d/tls.key" 2>/dev/null
  openssl req -new -key "$d/tls.key" -subj "/CN=keda-operator" -out "$d/tls.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=IP:127.0.0.1,IP:$NODE_GATEWAY,DNS:localhost,DNS:keda-operator" >"$d/tls.ext"
  openssl x509 -req -in "$d/tls.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 7 -extfile "$d/tls.ext" \
    -out "$d/tls.crt" 2>/dev/null
}

up() {
  fetch
  [ -f "$CLUSTER_DIR/kubeconfig" ] || die "no cluster on port $CLUSTER_API_PORT: scripts/cluster.sh up first"
  down >/dev/null 2>&1 || true
  rm -rf "$state"
  mkdir -p "$state"
  certs
  kubectl apply --server-side -f "$dir/crds" >/dev/null
  kubectl create namespace keda --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  local kc=$CLUSTER_DIR/kubeconfig
  # The operator: every namespace, its objects in `keda`, probes and metrics on loopback ports of its own.
  POD_NAMESPACE=keda KEDA_CLUSTER_OBJECT_NAMESPACE=keda WATCH_NAMESPACE="" KUBECONFIG=$kc \
    start keda-operator "$dir/bin/keda-operator" --kubeconfig "$kc" --leader-elect=false \
    --metrics-bind-address "127.0.0.1:$((KEDA_PORT + 1))" --health-probe-bind-address "127.0.0.1:$((KEDA_PORT + 2))" \
    --metrics-service-bind-address "127.0.0.1:$((KEDA_PORT + 3))" --cert-dir "$state/certs" \
    --enable-webhook-patching=false --enable-apiservice-patching=false --enable-cert-rotation=false --ca-dir "$state/certs" \
    --zap-log-level info
  POD_NAMESPACE=keda KEDA_CLUSTER_OBJECT_NAMESPACE=keda WATCH_NAMESPACE="" KUBECONFIG=$kc \
    start keda-adapter "$dir/bin/keda-adapter" --secure-port "$KEDA_PORT" --bind-address "$NODE_GATEWAY" \
    --cert-dir "$state/certs" --lister-kubeconfig "$kc" --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
    --metrics-service-address "127.0.0.1:$((KEDA_PORT + 3))" --port "$((KEDA_PORT + 4))"
  register_apiservice external.metrics.k8s.io keda-metrics-apiserver keda "$KEDA_PORT" "$state/apply.log"
  local t0=$SECONDS
  until kubectl get --raw /apis/external.metrics.k8s.io/v1beta1 >/dev/null 2>&1; do
    for c in keda-operator keda-adapter; do
      pid_of $c >/dev/null || { tail -n 30 "$state/$c.log" >&2; die "$c exited"; }
    done
    [ $((SECONDS - t0)) -lt 90 ] || { tail -n 20 "$state/keda-adapter.log" >&2; die "external.metrics.k8s.io not served in 90 s"; }
    sleep 1
  done
  log "KEDA $KEDA_VERSION: operator and metrics server up, external.metrics.k8s.io served in $((SECONDS - t0)) s"
}

down() {
  stop_pid keda-adapter
  stop_pid keda-operator
  log "stopped"
}

case "${1:-}" in
  fetch) fetch ;;
  up) up ;;
  down) mkdir -p "$state"; down ;;
  *) echo "usage: $0 fetch|up|down" >&2; exit 2 ;;
esac
