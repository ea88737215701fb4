#!/usr/bin/env bash
# The chart on a real node (issue 14): the local control plane (scripts/cluster.sh) and node (scripts/node.sh)
# on their own ports, a Kafka the pods reach (KAFKA_HOST=10.88.0.1), the image from scripts/image-local.sh,
# then:
#   1. helm install with scripts/node/values.yaml --wait: every Deployment's pods Running and Ready (real probes)
#   2. helm test: its Job sends through the release's MLLP Service (CoreDNS, kube-proxy) and gets CA for each
#   3. a load run through the MLLP Service (hl7gw-load --record-acked) while one pod of each kind is deleted:
#      every ACKed control id reaches the receiver on this machine
#   4. everything stopped by PID; no mounts, network namespaces or bridge left
#
#   scripts/node-check.sh          (NODE_CHECK_API_PORT, default 7643; NODE_CHECK_SECONDS, default 40;
#                                   NODE_CHECK_KEEP=1 leaves everything running at the end, to look at it;
#                                   NODE_CHECK_HELM_ARGS adds helm install flags, e.g. --set ...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CLUSTER_API_PORT=${NODE_CHECK_API_PORT:-7643}
export KAFKA_HOST=10.88.0.1 KAFKA_PORT=29892 KAFKA_DATA_DIR=$root/target/kafka-node
secs=${NODE_CHECK_SECONDS:-40}
receiver_port=29895
work=$root/target/node-check
log() { printf 'node-check: [%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

[ -f .cache/image/hl7gw-0.1.0.oci.tar ] || scripts/image-local.sh >&2
cargo build -q --release -p hl7gw-load -p hl7gw-cli --bins >&2
scripts/cluster.sh up >/dev/null
export KUBECONFIG=$root/.cache/cluster-$CLUSTER_API_PORT/kubeconfig
PATH="$(scripts/tools.sh path):$root/.cache/k8s-v1.36.3/bin:$PATH"
receiver=
cleanup() {
  [ "${NODE_CHECK_KEEP:-0}" = 1 ] && { log "NODE_CHECK_KEEP=1: left running (scripts/node.sh down, scripts/cluster.sh down)"; return; }
  [ -n "$receiver" ] && kill "$receiver" 2>/dev/null
  scripts/node.sh down >/dev/null 2>&1 || true
  scripts/kafka.sh down >/dev/null 2>&1 || true
  scripts/cluster.sh down >/dev/null 2>&1 || true
}
trap cleanup EXIT
scripts/node.sh up
scripts/kafka.sh down >/dev/null 2>&1 || true
rm -rf "$KAFKA_DATA_DIR"
scripts/kafka.sh up >/dev/null
rm -rf "$work" && mkdir -p "$work"
target/release/hl7gw receive --listen "$KAFKA_HOST:$receiver_port" --out "$work/received" --no-sync >"$work/receiver.log" 2>&1 &
receiver=$!
sleep 0.5
kill -0 "$receiver" 2>/dev/null || { cat "$work/receiver.log" >&2; die "the receiver did not start"; }

log "1. helm install (scripts/node/values.yaml) --wait"
kubectl create namespace hl7gw >/dev/null
kubectl label namespace hl7gw pod-security.kubernetes.io/enforce=restricted >/dev/null
# shellcheck disable=SC2086
helm install hl7gw helm/hl7-gateway -n hl7gw -f scripts/node/values.yaml ${NODE_CHECK_HELM_ARGS:-} --wait --timeout 180s >/dev/null ||
  { kubectl get pods -n hl7gw -o wide >&2; die "helm install --wait"; }
kubectl get pods -n hl7gw -o wide >&2

log "2. helm test"
helm test hl7gw -n hl7gw --timeout 120s >/dev/null ||
  { kubectl logs -n hl7gw -l app.kubernetes.io/component=test --tail 20 >&2 || true; die "helm test"; }

log "3. $secs s of load through the MLLP Service; one pod of each kind deleted during it"
svc=$(kubectl get svc -n hl7gw hl7gw-hl7-gateway-ingress-mllp -o jsonpath='{.spec.clusterIP}')
target/release/hl7gw-load --to "$svc:2575" --clients 4 --duration "$secs" --warmup 10 --timeout 10 \
  --record-acked "$work/acked.txt" --json >"$work/load.json" 2>"$work/load.log" &
load=$!
for kind in ingress transformer egress; do
  sleep $((secs / 4))
  pod=$(kubectl get pods -n hl7gw -l "app.kubernetes.io/component=$kind" -o jsonpath='{.items[0].metadata.name}')
  log "   deleting $pod"
  kubectl delete pod -n hl7gw "$pod" --wait=false >/dev/null
done
wait "$load" || true # connection errors while the ingress pod goes are expected; what was ACKed must arrive
python3 - "$work" <<'EOF' || die "delivery"
import json, os, re, sys, time
work = sys.argv[1]
acked = [l.strip() for l in open(f"{work}/acked.txt") if l.strip() and not l.startswith("#")]
j = json.load(open(f"{work}/load.json"))
deadline = time.time() + 300
while True:
    got = {re.sub(r"^\d+-", "", f)[:-4] for f in os.listdir(f"{work}/received") if f.endswith(".hl7")}
    missing = [a for a in acked if a not in got]
    if not missing or time.time() > deadline:
        break
    time.sleep(2)
print(f"node-check:    {len(acked)} ACKed ({j['msgs_per_sec']:.0f} msg/s, errors {j['errors']}), "
      f"{len(got)} delivered, missing {len(missing)} {missing[:5]}", file=sys.stderr)
sys.exit(1 if missing or not acked else 0)
EOF

log "4. down: no process, mount, network namespace or bridge left"
kill "$receiver" 2>/dev/null; receiver=
scripts/node.sh down >/dev/null
left_mounts=$(grep -c " $root/.cache/node-run-" /proc/mounts || true)
left_ns=$(ip netns list | grep -c '^cni-' || true)
ip link show hl7gw0 >/dev/null 2>&1 && die "bridge hl7gw0 left"
[ "$left_mounts" = 0 ] && [ "$left_ns" = 0 ] || die "$left_mounts mounts and $left_ns network namespaces left"
for c in containerd kubelet kube-scheduler kube-proxy coredns; do
  pgrep -f "$root/.cache/node-.*/bin/$c" >/dev/null && die "$c still running"
done
log "ok"
