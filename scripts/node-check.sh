#!/usr/bin/env bash
# The chart on a real node (issue 14): the local control plane (scripts/cluster.sh) and node (scripts/node.sh)
# on their own ports, a Kafka the pods reach (KAFKA_HOST=10.88.0.1), the image from scripts/image-local.sh,
# then:
#   1. helm install with scripts/node/values.yaml --wait: every Deployment's pods Running and Ready (real probes,
#      all on the admin port), the chart's default NetworkPolicies accepted (this node's CNI, the bridge plugin,
#      does not enforce them: the check proves they are valid and break nothing, not that they filter)
#   2. helm test: its Job sends through the release's MLLP Service (CoreDNS, kube-proxy) and gets CA for each
#   3. a load run through the MLLP Service (hl7gw-load --record-acked) while one pod of each kind is deleted,
#      the workers are scaled up (kubectl scale) and down again, and a helm upgrade rolls every Deployment:
#      every ACKed control id reaches the receiver on this machine, and no Deployment's available pods drop
#      below what its PodDisruptionBudget allows
#   4. operators as they connect (issue 36): gRPC plaintext (the chart's default) with static tokens (a Secret
#      made here: a viewer and an operator); through `kubectl port-forward` to the egress Service, `hl7gw status`
#      and `hl7gw trace` of an ACKed message with the viewer's token; no token is refused; the viewer is refused
#      message bodies (`deadletters --with-message`: ReadMessages), the operator is not; the CLI refuses to send
#      a token to the Service's plaintext address (not loopback)
#   5. the PodDisruptionBudget refuses an eviction that would take a second pod of a kind
#   6. everything stopped by PID; no mounts, network namespaces or bridge left
#
#   scripts/node-check.sh bench    1 and 2 with one pod of each kind, then the in-cluster load Job of
#                                  k8s/loadtest (8 clients, 30 s) against the release's MLLP Service, and 5; the
#                                  Job's JSON in target/node-check/loadtest.json (the release image unless
#                                  NODE_CHECK_PROFILE says otherwise)
#   scripts/node-check.sh          (NODE_CHECK_API_PORT, default 7643; NODE_CHECK_SECONDS, default 45;
#                                   NODE_CHECK_PROFILE, debug (default: the binaries `cargo test` built, in an
#                                   image of their own) or release (the image to ship; a release build);
#                                   NODE_CHECK_KEEP=1 leaves everything running at the end, to look at it;
#                                   NODE_CHECK_HELM_ARGS adds helm install flags, e.g. --set ...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CLUSTER_API_PORT=${NODE_CHECK_API_PORT:-7643}
export KAFKA_HOST=10.88.0.1 KAFKA_PORT=29892 KAFKA_DATA_DIR=$root/target/kafka-node
secs=${NODE_CHECK_SECONDS:-45}
mode=${1:-check}
case $mode in
  check) profile=${NODE_CHECK_PROFILE:-debug} ;;
  # The Job asks for a whole core: with two pods of each kind the 2-core node could not place it.
  bench)
    profile=${NODE_CHECK_PROFILE:-release}
    NODE_CHECK_HELM_ARGS="--set hl7Ingress.autoscaling.enabled=false,hl7Ingress.replicas=1,transformer.replicas=1,egress.replicas=1 ${NODE_CHECK_HELM_ARGS:-}"
    ;;
  *) echo "usage: $0 [check|bench]" >&2; exit 2 ;;
esac
receiver_port=29895
work=$root/target/node-check
log() { printf 'node-check: [%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# Built every run (cargo builds nothing when the binaries are current): never an image of older code.
IMAGE_PROFILE=$profile scripts/image-local.sh >&2
scripts/cluster.sh up >/dev/null
export KUBECONFIG=$root/.cache/cluster-$CLUSTER_API_PORT/kubeconfig
PATH="$(scripts/tools.sh path):$root/.cache/k8s-v1.36.3/bin:$PATH"
receiver=
cleanup() {
  [ "${NODE_CHECK_KEEP:-0}" = 1 ] && { log "NODE_CHECK_KEEP=1: left running (scripts/node.sh down, scripts/cluster.sh down)"; return; }
  [ -n "$receiver" ] && kill "$receiver" 2>/dev/null
  [ -n "${forward:-}" ] && kill "$forward" 2>/dev/null
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
target/$profile/hl7gw receive --listen "$KAFKA_HOST:$receiver_port" --out "$work/received" --no-sync >"$work/receiver.log" 2>&1 &
receiver=$!
sleep 0.5
kill -0 "$receiver" 2>/dev/null || { cat "$work/receiver.log" >&2; die "the receiver did not start"; }

# The in-cluster load Job (k8s/loadtest) against this release's MLLP Service; its JSON in $work/loadtest.json.
bench_job() {
  log "3. the in-cluster load Job (k8s/loadtest: 8 clients, 30 s) against the release's MLLP Service"
  local k=$work/loadtest
  mkdir -p "$k"
  cp k8s/loadtest/job.yaml "$k/"
  cat >"$k/kustomization.yaml" <<'YAML'
resources: [job.yaml]
patches:
  - target: {kind: Job, name: hl7gw-loadtest}
    patch: |-
      - {op: replace, path: /spec/template/spec/containers/0/args/1, value: "hl7gw-hl7-gateway-ingress-mllp:2575"}
YAML
  kubectl apply -k "$k" -n hl7gw >/dev/null
  kubectl wait -n hl7gw job/hl7gw-loadtest --for=condition=complete --timeout=300s >/dev/null ||
    { kubectl logs -n hl7gw job/hl7gw-loadtest --tail 20 >&2 || true; die "the load Job did not complete"; }
  kubectl logs -n hl7gw job/hl7gw-loadtest >"$work/loadtest.json"
  python3 - "$work/loadtest.json" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text[text.index("{"):])  # hl7gw-load --json: one pretty-printed object, after any log lines
l = j["latency_us"]
print("node-check:    load Job: %.0f msg/s, latency p50 %s us, p99 %s us, acks %s, errors %s" % (
    j["msgs_per_sec"], l["p50"], l["p99"], j["acks"], j["errors"]), file=sys.stderr)
EOF
}

# Step 6, and the end.
teardown() {
  log "6. down: no process, mount, network namespace or bridge left"
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
}

log "1. helm install (scripts/node/values.yaml) --wait"
kubectl create namespace hl7gw >/dev/null
kubectl label namespace hl7gw pod-security.kubernetes.io/enforce=restricted >/dev/null
# The gRPC static tokens scripts/node/values.yaml names (grpc.tokens.existingSecret): a viewer and an operator.
for who in viewer operator; do
  python3 -c 'import secrets; print(secrets.token_hex(24))' >"$work/$who.token"
done
kubectl create secret generic hl7gw-grpc-tokens -n hl7gw \
  --from-literal=tokens="viewer $(cat "$work/viewer.token")
operator $(cat "$work/operator.token")" >/dev/null
# shellcheck disable=SC2086
helm install hl7gw helm/hl7-gateway -n hl7gw -f scripts/node/values.yaml ${NODE_CHECK_HELM_ARGS:-} --wait --timeout 180s >/dev/null ||
  { kubectl get pods -n hl7gw -o wide >&2; die "helm install --wait"; }
kubectl get pods -n hl7gw -o wide >&2
# On by default (networkPolicy.enabled): one per service and one for the helm test Job's pod.
policies=$(kubectl get networkpolicy -n hl7gw -o name | wc -l)
[ "$policies" = 4 ] || die "$policies NetworkPolicies, 4 expected (networkPolicy.enabled is on by default)"
probe_ports=$(kubectl get pods -n hl7gw -l app.kubernetes.io/instance=hl7gw -o jsonpath='{range .items[*].spec.containers[*]}{.readinessProbe.httpGet.port}/{.livenessProbe.httpGet.port} {end}')
[ -z "$(tr ' ' '\n' <<<"$probe_ports" | grep -v '^admin/admin$' | grep .)" ] ||
  die "a readiness or liveness probe not on the admin port: $probe_ports"
log "   4 NetworkPolicies accepted; every readiness and liveness probe on the admin port"

log "2. helm test"
helm test hl7gw -n hl7gw --timeout 120s >/dev/null ||
  { kubectl logs -n hl7gw -l app.kubernetes.io/component=test --tail 20 >&2 || true; die "helm test"; }

if [ "$mode" = bench ]; then
  bench_job
  # shellcheck source=scripts/lib/benchinfo.sh
  . scripts/lib/benchinfo.sh
  bench_info bench-node hl7. >&2
  teardown
  exit 0
fi

log "3. $secs s of load through the MLLP Service: pods deleted, workers scaled, a helm upgrade (rolling update)"
svc=$(kubectl get svc -n hl7gw hl7gw-hl7-gateway-ingress-mllp -o jsonpath='{.spec.clusterIP}')
"target/$profile/hl7gw-load" --to "$svc:2575" --clients 4 --duration "$secs" --warmup 0 --timeout 10 \
  --record-acked "$work/acked.txt" --json >"$work/load.json" 2>"$work/load.log" &
load=$!
# Each Deployment's available pods, once a second, while the load runs: never below replicas - maxUnavailable.
(while kill -0 "$load" 2>/dev/null; do
  kubectl get deploy -n hl7gw -o jsonpath='{range .items[*]}{.metadata.name} {.spec.replicas} {.status.availableReplicas}{"\n"}{end}' 2>/dev/null
  sleep 1
done) >"$work/available.txt" &
watcher=$!
t0=$SECONDS
at() { # sleeps until $1 seconds into the load
  local left=$(($1 - (SECONDS - t0)))
  [ "$left" -le 0 ] || sleep "$left"
}
n=0
for kind in ingress transformer egress; do
  at $((secs / 10 + n * 4)); n=$((n + 1))
  pod=$(kubectl get pods -n hl7gw -l "app.kubernetes.io/component=$kind" -o jsonpath='{.items[0].metadata.name}')
  log "   deleting $pod"
  kubectl delete pod -n hl7gw "$pod" --wait=false >/dev/null
done
workers=(deploy/hl7gw-hl7-gateway-transformer deploy/hl7gw-hl7-gateway-egress)
at $((secs * 4 / 10))
log "   kubectl scale transformer, egress --replicas=3"
kubectl scale -n hl7gw "${workers[@]}" --replicas=3 >/dev/null
at $((secs * 55 / 100))
log "   kubectl scale transformer, egress --replicas=1"
kubectl scale -n hl7gw "${workers[@]}" --replicas=1 >/dev/null
at $((secs * 65 / 100))
log "   helm upgrade: a pod annotation changed, so every Deployment rolls; the workers back to 2"
ann=node-check/upgraded=yes
# shellcheck disable=SC2086
helm upgrade hl7gw helm/hl7-gateway -n hl7gw -f scripts/node/values.yaml ${NODE_CHECK_HELM_ARGS:-} \
  --set-string "hl7Ingress.podAnnotations.$ann,transformer.podAnnotations.$ann,egress.podAnnotations.$ann" \
  --wait --timeout 180s >/dev/null || { kubectl get pods -n hl7gw -o wide >&2; die "helm upgrade --wait"; }
log "   upgraded: $(kubectl get pods -n hl7gw -l app.kubernetes.io/component!=test --no-headers | wc -l) pods"
wait "$load" || true # connection errors while an ingress pod goes are expected; what was ACKed must arrive
wait "$watcher" || true
python3 - "$work/available.txt" <<'EOF' || die "a Deployment had fewer pods available than its PodDisruptionBudget allows"
import sys
low = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3:
        name, want, have = f[0], int(f[1]), int(f[2])
        if name not in low or have < low[name][1]:
            low[name] = (want, have)
for name, (want, have) in sorted(low.items()):
    print(f"node-check:    {name}: fewest pods available {have} (of {want} wanted then)", file=sys.stderr)
# maxUnavailable 1 (the chart's default); a deleted pod counts against it until its replacement is ready.
sys.exit(1 if len(low) < 3 or any(have < want - 1 for want, have in low.values()) else 0)
EOF
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

log "4. operators: hl7gw status and trace through kubectl port-forward with tokens (gRPC plaintext, the default)"
kubectl port-forward -n hl7gw svc/hl7gw-hl7-gateway-egress :50051 --address 127.0.0.1 >"$work/port-forward.log" 2>&1 &
forward=$!
pf=
for _ in $(seq 100); do
  pf=$(awk '/^Forwarding from 127\.0\.0\.1:/ {split($3, a, ":"); print a[2]; exit}' "$work/port-forward.log")
  [ -n "$pf" ] && break
  kill -0 "$forward" 2>/dev/null || break
  sleep 0.1
done
[ -n "$pf" ] || { cat "$work/port-forward.log" >&2; die "kubectl port-forward did not start"; }
cli() { "target/$profile/hl7gw" "$@" --to "http://127.0.0.1:$pf" --timeout 60; }
ops_failed() { kill "$forward" 2>/dev/null; cat "$work/ops.err" >&2; die "$1"; }
cli status --token-file "$work/viewer.token" --json >"$work/status.json" 2>"$work/ops.err" ||
  ops_failed "hl7gw status through the port-forward with the viewer's token"
grep -q '"destination":"lab"' "$work/status.json" || ops_failed "hl7gw status: no destination lab in $(cat "$work/status.json")"
control_id=$(awk '!/^#/ && NF {print; exit}' "$work/acked.txt") # no pipe into head: pipefail and SIGPIPE
cli trace --token-file "$work/viewer.token" --control-id "$control_id" --since 30m --json >"$work/trace.json" 2>"$work/ops.err" ||
  ops_failed "hl7gw trace --control-id $control_id through the port-forward with the viewer's token"
grep -q '"kind":"delivered"' "$work/trace.json" || ops_failed "hl7gw trace: $control_id not delivered in $(cat "$work/trace.json")"
if cli status --json >"$work/status-anonymous.json" 2>"$work/ops.err"; then
  ops_failed "hl7gw status without a token was answered (admin methods must refuse anonymous callers)"
fi
grep -qi 'PermissionDenied\|Unauthenticated' "$work/ops.err" || ops_failed "hl7gw status without a token failed, but not for want of a token"
# Message bodies are their own permission (ReadMessages): the viewer lists dead letters, never their messages.
cli deadletters --token-file "$work/viewer.token" --limit 1 >/dev/null 2>"$work/ops.err" ||
  ops_failed "hl7gw deadletters (no bodies) with the viewer's token"
if cli deadletters --token-file "$work/viewer.token" --limit 1 --with-message >"$work/viewer-bodies.json" 2>"$work/ops.err"; then
  ops_failed "hl7gw deadletters --with-message was answered to the viewer ($(wc -l <"$work/viewer-bodies.json") lines)"
fi
grep -q 'PermissionDenied' "$work/ops.err" && grep -q 'ReadMessages' "$work/ops.err" ||
  ops_failed "hl7gw deadletters --with-message with the viewer's token failed, but not as PermissionDenied for ReadMessages"
cli deadletters --token-file "$work/operator.token" --limit 1 --with-message >/dev/null 2>"$work/ops.err" ||
  ops_failed "hl7gw deadletters --with-message with the operator's token (ReadMessages)"
egress_ip=$(kubectl get svc -n hl7gw hl7gw-hl7-gateway-egress -o jsonpath='{.spec.clusterIP}')
if "target/$profile/hl7gw" status --to "http://$egress_ip:50051" --token-file "$work/viewer.token" --timeout 10 \
  >/dev/null 2>"$work/ops.err"; then
  ops_failed "the CLI sent a token over plaintext to $egress_ip (not loopback)"
fi
grep -qi 'plaintext' "$work/ops.err" || ops_failed "the CLI's refusal to send a token to $egress_ip does not say why"
kill "$forward" 2>/dev/null; wait "$forward" 2>/dev/null || true; forward=
log "   status (lab) and trace ($control_id delivered) with the viewer's token through 127.0.0.1:$pf; no token: refused;"
log "   the viewer's deadletters --with-message: refused (ReadMessages), the operator's: answered; a token to $egress_ip over plaintext: refused by the CLI"

log "5. the PodDisruptionBudget holds: a second transformer pod may not be evicted while the first is gone"
evict() {
  kubectl create --raw "/api/v1/namespaces/hl7gw/pods/$1/eviction" -f - <<JSON
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$1", "namespace": "hl7gw"}}
JSON
}
# `helm upgrade --wait` returns once the new pods are ready, while an old transformer may still be draining (phase
# Running, deletionTimestamp set): wait until none is terminating, so the two pods are the upgrade's.
for _ in $(seq 90); do
  terminating=$(kubectl get pods -n hl7gw -l app.kubernetes.io/component=transformer \
    -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"\n"}{end}' | grep -c . || true)
  [ "$terminating" = 0 ] && break
  sleep 2
done
mapfile -t pods < <(kubectl get pods -n hl7gw -l app.kubernetes.io/component=transformer \
  --field-selector=status.phase=Running -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
[ "${#pods[@]}" = 2 ] || die "two transformer pods expected, found: ${pods[*]}"
evict "${pods[0]}" >/dev/null 2>"$work/evict1.log" || { cat "$work/evict1.log" >&2; die "the first eviction was refused"; }
if evict "${pods[1]}" >/dev/null 2>"$work/evict2.log"; then die "the second eviction was allowed"; fi
grep -q "disruption budget" "$work/evict2.log" || { cat "$work/evict2.log" >&2; die "the second eviction failed, but not for the budget"; }
log "   ${pods[0]} evicted; ${pods[1]} refused: $(grep -o 'Cannot evict[^.]*' "$work/evict2.log" | head -1)"

teardown
