#!/usr/bin/env bash
# The chart on a real node (issue 14): the local control plane (scripts/cluster.sh) and node (scripts/node.sh)
# on their own ports, a Kafka the pods reach (KAFKA_HOST=10.88.0.1), the image from scripts/image-local.sh,
# metrics-server (scripts/node.sh: the HPAs' CPU), then:
#   1. the README's install (its Kubernetes section, the block after `<!-- node-check: install -->`): its `helm
#      install` as written, placeholders replaced (Kafka, image, receiver), the topics created by the services
#      (kafka.createTopicsPartitions, as the README says for a Kafka without Strimzi), plus scripts/node/values.yaml
#      --wait: every Deployment's pods Running and Ready (real probes, all on the admin port), the chart's default
#      NetworkPolicies accepted (this node's CNI, the bridge plugin, does not enforce them: the check proves they
#      are valid and break nothing, not that they filter), the default autoscaling on (3 HPAs, CPU)
#   2. helm test: its Job sends through the release's MLLP Service (CoreDNS, kube-proxy) and gets CA for each;
#      then the README's first message: samples/adt_a01.hl7 through `kubectl port-forward` to the MLLP Service
#      gets AA and arrives at the receiver on this machine
#   3. a load run through the MLLP Service (hl7gw-load --record-acked) while one pod of each kind is deleted and
#      a helm upgrade rolls every Deployment: every ACKed control id reaches the receiver on this machine, and
#      no Deployment's available pods drop below what its PodDisruptionBudget allows
#   4. operators as they connect (issue 36): gRPC plaintext (the chart's default) with static tokens (a Secret
#      made here: a viewer and an operator); through `kubectl port-forward` to the egress Service, `hl7gw status`
#      and `hl7gw trace` of an ACKed message with the viewer's token; no token is refused; the viewer is refused
#      message bodies (`deadletters --with-message`: ReadMessages), the operator is not; the CLI refuses to send
#      a token to the Service's plaintext address (not loopback)
#   5. autoscaling (issue 37): the in-cluster load Job (k8s/loadtest, 8 clients) drives the pods' CPU past the
#      HPAs' targets: the ingress scales out (and the workers with it); senders connected after the scale-out
#      (hl7gw-load from this machine, paced) spread over the new pods; after the Job the HPAs scale in (the
#      test's 20 s scale-down window), the ingress pod that goes drains (answers what it read, closes its
#      connections) and its senders reconnect. Replica counts every 2 s in target/node-check/autoscale.txt,
#      the HPAs' events, the times to scale
#   6. the PodDisruptionBudgets under that paced load: for each service, one pod evicted through the Eviction
#      API (as `kubectl drain` does), a second refused by the budget and evicted once the first one's
#      replacement is Ready (the wait measured)
#   7. with NODE_CHECK_KEDA=1 (as `make test` runs it): the workers on consumer lag with KEDA (scripts/keda.sh; the chart's
#      autoscaling.engine: keda, by helm upgrade): the transformer paused (ScaledObject annotation
#      paused-replicas 0) while 16,000 messages arrive, resumed: KEDA's kafka scalers read the groups' lag, the
#      egress (which the backlog reaches as a burst) scales out to 3 and back to 2
#   Through 3, 5, 6 and 7: every ACKed control id (the load Job's from its log, the others' from --record-acked)
#   arrives at the receiver; duplicates counted
#   8. everything stopped by PID; no mounts, network namespaces or bridge left
#
#   scripts/node-check.sh bench    1 and 2 with one pod of each kind (autoscaling off), then the in-cluster load
#                                  Job of k8s/loadtest (8 clients, 30 s) against the release's MLLP Service; the
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
    NODE_CHECK_HELM_ARGS="--set hl7Ingress.autoscaling.enabled=false,transformer.autoscaling.enabled=false,egress.autoscaling.enabled=false --set hl7Ingress.replicas=1,transformer.replicas=1,egress.replicas=1 ${NODE_CHECK_HELM_ARGS:-}"
    ;;
  *) echo "usage: $0 [check|bench]" >&2; exit 2 ;;
esac
receiver_port=29895
work=$root/target/node-check
ns=hl7gw
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
  # Each may already be gone: `|| true`, or errexit would end the cleanup at the first one (and leave the node up).
  local p
  for p in "$receiver" "${forward:-}" "${paced:-}" "${sampler:-}"; do
    [ -z "$p" ] || kill "$p" 2>/dev/null || true
  done
  [ -z "${keda_up:-}" ] || scripts/keda.sh down >/dev/null 2>&1 || true
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

# The in-cluster load Job (k8s/loadtest) against this release's MLLP Service, as k8s/loadtest/README says, with
# kustomize patches: the release's Service, and optionally (start_job SECONDS CPU) the duration, the CPU request
# (the Job asks for a core; beside 3 pods of each kind the 2-core node needs less) and every ACKed control id on
# stdout (--record-acked /dev/stdout: the node check reads them with kubectl logs, before the JSON).
start_job() {
  local k=$work/loadtest
  mkdir -p "$k"
  cp k8s/loadtest/job.yaml "$k/"
  {
    printf '%s\n' 'resources: [job.yaml]' 'patches:' '  - target: {kind: Job, name: hl7gw-loadtest}' '    patch: |-'
    printf '      - {op: replace, path: /spec/template/spec/containers/0/args/1, value: "hl7gw-hl7-gateway-ingress-mllp:2575"}\n'
    if [ -n "${1:-}" ]; then
      printf '      - {op: replace, path: /spec/template/spec/containers/0/args/5, value: "%s"}\n' "$1"
      printf '      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--record-acked"}\n'
      printf '      - {op: add, path: /spec/template/spec/containers/0/args/-, value: /dev/stdout}\n'
      printf '      - {op: replace, path: /spec/template/spec/containers/0/resources/requests/cpu, value: "%s"}\n' "$2"
    fi
  } >"$k/kustomization.yaml"
  kubectl delete job -n $ns hl7gw-loadtest --ignore-not-found --wait >/dev/null
  kubectl apply -k "$k" -n $ns >/dev/null
}
wait_job() {
  local state=
  for _ in $(seq 300); do
    state=$(kubectl get job -n $ns hl7gw-loadtest -o jsonpath='{.status.succeeded}/{.status.failed}')
    case $state in
      1/*) break ;;
      */[1-9]*) kubectl logs -n $ns job/hl7gw-loadtest 2>&1 | grep -v '^[A-Za-z0-9]*-[0-9]*-[0-9]*$' | tail -n 20 >&2 || true
        die "the load Job failed" ;;
    esac
    sleep 1
  done
  [ "${state%%/*}" = 1 ] || die "the load Job did not complete in 300 s"
  kubectl logs -n $ns job/hl7gw-loadtest >"$work/loadtest.json"
}
bench_job() {
  log "3. the in-cluster load Job (k8s/loadtest: 8 clients, 30 s) against the release's MLLP Service"
  start_job
  wait_job
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
  log "8. down: no process, mount, network namespace or bridge left"
  kill "$receiver" 2>/dev/null; receiver=
  [ -z "${keda_up:-}" ] || { scripts/keda.sh down >/dev/null 2>&1; keda_up=; }
  scripts/node.sh down >/dev/null
  left_mounts=$(grep -c " $root/.cache/node-run-" /proc/mounts || true)
  left_ns=$(ip netns list | grep -c '^cni-' || true)
  ip link show hl7gw0 >/dev/null 2>&1 && die "bridge hl7gw0 left"
  [ "$left_mounts" = 0 ] && [ "$left_ns" = 0 ] || die "$left_mounts mounts and $left_ns network namespaces left"
  for c in containerd kubelet kube-scheduler kube-proxy coredns; do
    pgrep -f "$root/.cache/node-.*/bin/$c" >/dev/null && die "$c still running"
  done
  for c in metrics-server keda-operator keda-adapter; do
    pgrep -f "$root/.cache/tools/.*/bin/$c" >/dev/null && die "$c still running"
  done
  log "ok"
}

# The README's `helm install` (Kubernetes section, the block after `<!-- node-check: install -->`), one argument a
# line, its placeholders replaced by this node's Kafka, image and receiver; each placeholder must be there.
readme_install() {
  python3 - "$KAFKA_HOST:$KAFKA_PORT" "$KAFKA_HOST:$receiver_port" <<'EOF'
import re, shlex, sys
text = open("README.md").read()
block = text.split("<!-- node-check: install -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
cmd = re.search(r"^helm install .*?(?<!\\)$", block.replace("\\\n", " "), re.M).group(0)
args = shlex.split(cmd, comments=True)
subs = {"kafka.brokers=my-kafka:9092": "kafka.brokers=" + sys.argv[1],
        "image.repository=registry.example.org/hl7gw": "image.repository=hl7gw",
        "egress.destinations.lab.address=lis.example.org:2575": "egress.destinations.lab.address=" + sys.argv[2]}
for old in subs:
    if old not in args:
        sys.exit(f"the README's helm install has no --set {old}: {cmd}")
for a in args:
    print(subs.get(a, a))
EOF
}

log "1. the README's install: topics by the services (kafka.createTopicsPartitions), scripts/node/values.yaml, --wait"
mapfile -t install < <(readme_install) || die "the README's install block"
[ "${install[0]} ${install[1]}" = "helm install" ] || die "the README's install block: ${install[*]}"
log "   ${install[*]}"
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
"${install[@]}" -f scripts/node/values.yaml ${NODE_CHECK_HELM_ARGS:-} --wait --timeout 180s >/dev/null ||
  { kubectl get pods -n hl7gw -o wide >&2; die "helm install --wait"; }
kubectl -n hl7gw wait deploy --all --for condition=Available --timeout 5m >/dev/null || die "kubectl wait deploy --all"
kubectl get pods -n hl7gw -o wide >&2
if [ "$mode" = check ]; then
  hpas=$(kubectl get hpa -n $ns -o jsonpath='{range .items[*]}{.metadata.name}:{.spec.minReplicas}-{.spec.maxReplicas} {end}')
  [ "$(wc -w <<<"$hpas")" = 3 ] || die "3 HPAs expected (autoscaling is on by default): $hpas"
  # With autoscaling the Deployments leave the count to the HPAs: one pod each at install, minReplicas soon after.
  for _ in $(seq 120); do
    [ "$(kubectl get deploy -n $ns -o jsonpath='{range .items[*]}{.spec.replicas}/{.status.readyReplicas} {end}')" = "2/2 2/2 2/2 " ] && break
    sleep 1
  done
  [ "$(kubectl get deploy -n $ns -o jsonpath='{range .items[*]}{.spec.replicas}/{.status.readyReplicas} {end}')" = "2/2 2/2 2/2 " ] ||
    { kubectl get hpa,deploy -n $ns >&2; die "the HPAs did not bring every Deployment to its minReplicas (2) in 120 s"; }
  log "   HPAs (CPU, metrics-server): $hpas; every Deployment at its minReplicas, Ready"
fi
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
# `kubectl port-forward` to SERVICE's PORT in NAMESPACE on a free local port, its output in LOG: sets `forward`
# (its PID) and `pf` (the local port), or dies.
port_forward() {
  local ns=$1 svc=$2 port=$3 out=$4
  # The file exists before kubectl does: the background job's redirect may come after the first read below, and
  # a failed read (awk: cannot open) in an assignment ends this script under `set -e` (CI, stop 41).
  : >"$out"
  kubectl port-forward -n "$ns" "svc/$svc" ":$port" --address 127.0.0.1 >"$out" 2>&1 &
  forward=$!
  pf=
  for _ in $(seq 100); do
    pf=$(awk '/^Forwarding from 127\.0\.0\.1:/ {split($3, a, ":"); print a[2]; exit}' "$out" || true)
    [ -n "$pf" ] && break
    kill -0 "$forward" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$pf" ] || { cat "$out" >&2; die "kubectl port-forward to $svc did not start"; }
}
# The README's step 5: a first message through `kubectl port-forward` to the MLLP Service, to the receiver.
port_forward "$ns" hl7gw-hl7-gateway-ingress-mllp 2575 "$work/pf-mllp.log"
"target/$profile/hl7gw" send --to "127.0.0.1:$pf" samples/adt_a01.hl7 >"$work/first.ack" 2>&1 ||
  { cat "$work/first.ack" >&2; die "hl7gw send samples/adt_a01.hl7 through the port-forward"; }
kill "$forward" 2>/dev/null; wait "$forward" 2>/dev/null || true; forward=
grep -Eq 'MSA\|(AA|CA)\|' "$work/first.ack" || { cat "$work/first.ack" >&2; die "samples/adt_a01.hl7: no AA/CA"; }
first_id=$(awk -F'|' '/^MSH/ {print $10; exit}' samples/adt_a01.hl7)
for _ in $(seq 60); do
  ls "$work/received" 2>/dev/null | grep -q -- "-$first_id\.hl7$" && break
  sleep 1
done
ls "$work/received" 2>/dev/null | grep -q -- "-$first_id\.hl7$" || die "samples/adt_a01.hl7 ($first_id) did not reach the receiver in 60 s"
log "   samples/adt_a01.hl7 through kubectl port-forward: $(grep -o 'MSA|[A-Z]*' "$work/first.ack" | head -1), and $first_id at the receiver"

if [ "$mode" = bench ]; then
  bench_job
  # shellcheck source=scripts/lib/benchinfo.sh
  . scripts/lib/benchinfo.sh
  bench_info bench-node hl7. >&2
  teardown
  exit 0
fi

log "3. $secs s of load through the MLLP Service: pods deleted, a helm upgrade (rolling update)"
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
# The replica counts belong to the HPAs now (step 5 scales them): no kubectl scale here.
at $((secs * 55 / 100))
log "   helm upgrade: a pod annotation changed, so every Deployment rolls"
ann=node-check/upgraded=yes
# shellcheck disable=SC2086
helm upgrade "${install[@]:2}" -f scripts/node/values.yaml ${NODE_CHECK_HELM_ARGS:-} \
  --set-string "hl7Ingress.podAnnotations.$ann,transformer.podAnnotations.$ann,egress.podAnnotations.$ann" \
  --wait --timeout 180s >/dev/null || { kubectl get pods -n hl7gw -o wide >&2; die "helm upgrade --wait"; }
log "   upgraded: $(kubectl get pods -n hl7gw -l app.kubernetes.io/component!=test --no-headers | wc -l) pods"
wait "$load" || true # connection errors while an ingress pod goes are expected; what was ACKed must arrive
wait "$watcher" || true
python3 - "$work/available.txt" <<'EOF' || die "a Deployment had fewer pods available than its PodDisruptionBudget allows"
import sys
low, fewest_wanted = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3:
        name, want, have = f[0], int(f[1]), int(f[2])
        fewest_wanted[name] = min(want, fewest_wanted.get(name, want))
        if name not in low or have < low[name][1]:
            low[name] = (want, have)
for name, (want, have) in sorted(low.items()):
    print(f"node-check:    {name}: fewest pods available {have} (of {want} wanted then)", file=sys.stderr)
# maxUnavailable 1 (the chart's default); a deleted pod counts against it until its replacement is ready. An HPA
# may raise the count meanwhile (new pods are not a disruption): measured against the fewest wanted.
sys.exit(1 if len(low) < 3 or any(have < fewest_wanted[n] - 1 for n, (_, have) in low.items()) else 0)
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
port_forward hl7gw hl7gw-hl7-gateway-egress 50051 "$work/port-forward.log"
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

log "5. autoscaling: the load Job (8 clients, 60 s) drives CPU past the HPAs' targets; scale out, paced senders, scale in"
ingress=hl7gw-hl7-gateway-ingress
# ready_count DEPLOY: "wanted ready pods" (pods: every pod of the kind, terminating ones too).
ready_count() {
  local want ready
  read -r want ready < <(kubectl get deploy -n $ns "$1" -o jsonpath='{.spec.replicas} {.status.readyReplicas}{"\n"}')
  echo "$want ${ready:-0} $(kubectl get pods -n $ns -l "app.kubernetes.io/component=${1##*-}" --no-headers 2>/dev/null | wc -l)"
}
# Open connections (MLLP + gRPC streams) of each ingress pod, from its /metrics (pods are reachable from here).
ingress_connections() {
  local name ip
  kubectl get pods -n $ns -l app.kubernetes.io/component=ingress -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}' |
    while read -r name ip; do
      [ -n "$ip" ] || continue
      printf '%s=%s ' "$name" "$(curl -fsS --max-time 2 "http://$ip:9464/metrics" 2>/dev/null |
        awk '/^hl7gw_ingress_connections_active/ {n += $NF} END {print n + 0}')"
    done
}
# sample_replicas T0 METRIC (in the background, into a file): every 2 s, the seconds since T0 (a $SECONDS) before
# lines `hpa NAME current desired VALUE` (VALUE: METRIC of the HPA's first current metric) and `deploy NAME wanted ready`.
sample_replicas() {
  local t
  while :; do
    t=$((SECONDS - $1))
    kubectl get hpa -n $ns -o jsonpath='{range .items[*]}{.metadata.name} {.status.currentReplicas} {.status.desiredReplicas} {.status.currentMetrics[0].'"$2"'}{"\n"}{end}' 2>/dev/null |
      sed "s/^/$t hpa /"
    kubectl get deploy -n $ns -o jsonpath='{range .items[*]}{.metadata.name} {.spec.replicas} {.status.readyReplicas}{"\n"}{end}' 2>/dev/null |
      sed "s/^/$t deploy /"
    sleep 2
  done
}
# From a quiet start: every HPA at 2 replicas and under its target (step 3's load has left the metrics' window).
for _ in $(seq 120); do
  quiet=1
  for w in $(kubectl get hpa -n $ns -o jsonpath='{range .items[*]}{.status.currentReplicas}:{.status.currentMetrics[0].resource.current.averageUtilization} {end}'); do
    { [ "${w%%:*}" = 2 ] && [ -n "${w#*:}" ] && [ "${w#*:}" -lt 50 ]; } || quiet=0
  done
  [ "$quiet" = 1 ] && break
  sleep 1
done
log "   before the Job (replicas:CPU% of requests): $(kubectl get hpa -n $ns -o jsonpath='{range .items[*]}{.metadata.name}={.status.currentReplicas}:{.status.currentMetrics[0].resource.current.averageUtilization} {end}' | sed 's/hl7gw-hl7-gateway-//g')"
t_job=$SECONDS
start_job 60 250m
# Replica counts every 2 s from the Job's creation on, the HPAs' value being their CPU%.
sample_replicas "$t_job" resource.current.averageUtilization >"$work/autoscale.txt" 2>/dev/null &
sampler=$!
out_s=
for _ in $(seq 150); do
  read -r want ready _ < <(ready_count $ingress)
  [ "$want" = 3 ] && [ "$ready" = 3 ] && { out_s=$((SECONDS - t_job)); break; }
  sleep 1
done
[ -n "$out_s" ] || { kill "$sampler"; tail -n 12 "$work/autoscale.txt" >&2; die "the ingress did not scale out to 3 Ready pods within 150 s of the load Job"; }
log "   ingress scaled out: 3 pods Ready $out_s s after the load Job was created"
# Senders that connect now spread over the 3 pods (kube-proxy picks an endpoint per connection); paced (9 x 4
# msg/s) so their CPU stays under the target and the HPAs scale in while they are connected.
"target/$profile/hl7gw-load" --to "$svc:2575" --clients 9 --rate 4 --duration 120 --warmup 0 --timeout 10 \
  --record-acked "$work/acked-scale.txt" --json >"$work/paced-scale.json" 2>"$work/paced-scale.log" &
paced=$!
sleep 5
conns_out=$(ingress_connections)
log "   9 paced senders connected; open connections per ingress pod: $conns_out"
wait_job
t_job_end=$((SECONDS - t_job))
log "   the load Job ended at $t_job_end s: $(python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):]); print("%.0f msg/s, acks %s, errors %s" % (j["msgs_per_sec"], j["acks"], j["errors"]))' "$work/loadtest.json")"
in_s=
for _ in $(seq 240); do
  read -r want ready pods < <(ready_count $ingress)
  [ "$want" = 2 ] && [ "$ready" = 2 ] && [ "$pods" = 2 ] && { in_s=$((SECONDS - t_job)); break; }
  sleep 1
done
[ -n "$in_s" ] || { kill "$sampler"; tail -n 12 "$work/autoscale.txt" >&2; die "the ingress did not scale in to 2 pods within 240 s of the load Job's end"; }
log "   ingress scaled in: 2 pods left $((in_s - t_job_end)) s after the load Job ended; connections now: $(ingress_connections)"
# The workers' HPAs scale in on the same signal; step 6 wants them settled (a pod the HPA removes mid-eviction
# would end the eviction with NotFound).
for _ in $(seq 120); do
  settled=1
  for w in transformer egress; do
    read -r want ready pods < <(ready_count "hl7gw-hl7-gateway-$w")
    [ "$want" = 2 ] && [ "$ready" = 2 ] && [ "$pods" = 2 ] || settled=0
  done
  [ "$settled" = 1 ] && break
  sleep 1
done
[ "$settled" = 1 ] || log "   the workers were not both back at 2 pods 120 s after the ingress"
wait "$paced" || true
kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; sampler=
kubectl get events -n $ns --field-selector involvedObject.kind=HorizontalPodAutoscaler \
  -o jsonpath='{range .items[*]}{.lastTimestamp} {.involvedObject.name} {.reason}: {.message}{"\n"}{end}' >"$work/hpa-events.txt"
sed 's/^/node-check:    event /' "$work/hpa-events.txt" >&2
python3 - "$work" "$t_job_end" <<'EOF' || log "   (no summary of the replica counts)"
# The replica counts as they changed (wanted/ready per Deployment), and each HPA's peak CPU utilisation.
import collections, json, sys
work, job_end = sys.argv[1], int(sys.argv[2])
changes, last, peak = collections.defaultdict(list), {}, collections.Counter()
for line in open(f"{work}/autoscale.txt"):
    f = line.split()
    if len(f) >= 4 and f[1] == "deploy":
        t, name, want, ready = int(f[0]), f[2].replace("hl7gw-hl7-gateway-", ""), f[3], f[4] if len(f) > 4 else "0"
        if last.get(name) != (want, ready):
            last[name] = (want, ready)
            changes[name].append(f"{t}s {want}/{ready}")
    elif len(f) >= 6 and f[1] == "hpa" and f[5].isdigit():
        peak[f[2].replace("hl7gw-hl7-gateway-", "")] = max(peak[f[2].replace("hl7gw-hl7-gateway-", "")], int(f[5]))
print(f"node-check:    replicas wanted/ready over time (s since the load Job was created; it ended at {job_end} s):", file=sys.stderr)
for name in sorted(changes):
    print(f"node-check:      {name}: {', '.join(changes[name])}; peak CPU {peak[name]}% of requests", file=sys.stderr)
p = json.load(open(f"{work}/paced-scale.json"))
print(f"node-check:    paced senders: {p['acks']} ACKs, errors {p['errors']} {p['error_kinds']}, reconnects {p['reconnects']}, "
      f"mismatches {p['mismatches']}", file=sys.stderr)
EOF

log "6. PodDisruptionBudgets under paced load: per service one pod evicted, a second refused, then evicted once the first one's replacement is Ready"
evict() {
  kubectl create --raw "/api/v1/namespaces/$ns/pods/$1/eviction" -f - <<JSON
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$1", "namespace": "$ns"}}
JSON
}
"target/$profile/hl7gw-load" --to "$svc:2575" --clients 6 --rate 5 --duration 100 --warmup 0 --timeout 10 \
  --record-acked "$work/acked-evict.txt" --json >"$work/paced-evict.json" 2>"$work/paced-evict.log" &
paced=$!
for kind in ingress transformer egress; do
  # Only Ready pods that are not going (an earlier step's pod may still be draining).
  for _ in $(seq 90); do
    read -r want ready pods < <(ready_count "hl7gw-hl7-gateway-$kind")
    [ "$ready" = "$want" ] && [ "$pods" = "$want" ] && break
    sleep 1
  done
  mapfile -t victims < <(kubectl get pods -n $ns -l "app.kubernetes.io/component=$kind" \
    --field-selector=status.phase=Running -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
  [ "${#victims[@]}" -ge 2 ] || die "two $kind pods expected, found: ${victims[*]}"
  evict "${victims[0]}" >/dev/null 2>"$work/evict-$kind-1.log" || { cat "$work/evict-$kind-1.log" >&2; die "the first $kind eviction was refused"; }
  t0=$SECONDS
  if evict "${victims[1]}" >/dev/null 2>"$work/evict-$kind-refused.log"; then die "a second $kind eviction was allowed at once"; fi
  grep -q "disruption budget" "$work/evict-$kind-refused.log" || { cat "$work/evict-$kind-refused.log" >&2; die "the second $kind eviction failed, but not for the budget"; }
  refusals=1
  until evict "${victims[1]}" >/dev/null 2>"$work/evict-$kind-2.log"; do
    grep -q NotFound "$work/evict-$kind-2.log" && { log "   $kind: ${victims[1]} went meanwhile (its HPA scaled in)"; break; }
    grep -q "disruption budget" "$work/evict-$kind-2.log" || { cat "$work/evict-$kind-2.log" >&2; die "the second $kind eviction failed, but not for the budget"; }
    [ $((SECONDS - t0)) -lt 120 ] || die "the second $kind eviction was still refused after 120 s"
    refusals=$((refusals + 1))
    sleep 1
  done
  log "   $kind: ${victims[0]} evicted; ${victims[1]} refused $refusals times ($(grep -o 'Cannot evict[^.]*' "$work/evict-$kind-refused.log" | head -1 || true)), evicted after $((SECONDS - t0)) s"
done
wait "$paced" || true
python3 - "$work/paced-evict.json" <<'EOF' || log "   (no summary of the paced senders)"
import json, sys
p = json.load(open(sys.argv[1]))
print(f"node-check:    paced senders: {p['acks']} ACKs, errors {p['errors']} {p['error_kinds']}, reconnects {p['reconnects']}, "
      f"mismatches {p['mismatches']}", file=sys.stderr)
EOF
log "   delivery through steps 5 and 6 (the load Job's ACKed ids from its log, the paced senders' from --record-acked)"
python3 - "$work" <<'EOF' || die "delivery through autoscaling and evictions"
import collections, json, os, re, sys, time
work = sys.argv[1]
def ids(path):
    return [l.strip() for l in open(path) if l.strip() and not l.startswith("#")]
text = open(f"{work}/loadtest.json").read()
job = [l for l in text[:text.index("{")].split("\n") if re.fullmatch(r"[A-Za-z0-9_.]+-\d+-\d+", l.strip())]
phases = {"load Job (step 5)": [l.strip() for l in job], "paced, scale-in (step 5)": ids(f"{work}/acked-scale.txt"),
          "paced, evictions (step 6)": ids(f"{work}/acked-evict.txt")}
deadline = time.time() + 300
while True:
    count = collections.Counter(re.sub(r"^\d+-", "", f)[:-4] for f in os.listdir(f"{work}/received") if f.endswith(".hl7"))
    missing = {k: [a for a in v if a not in count] for k, v in phases.items()}
    if not any(missing.values()) or time.time() > deadline:
        break
    time.sleep(2)
bad = False
for k, v in phases.items():
    dup = sum(count[a] - 1 for a in v if count[a] > 1)
    print(f"node-check:    {k}: {len(v)} ACKed, {len(v) - len(missing[k])} delivered, lost {len(missing[k])} "
          f"{missing[k][:3]}, duplicates {dup}", file=sys.stderr)
    bad |= bool(missing[k]) or not v
sys.exit(1 if bad else 0)
EOF

# Step 7 (NODE_CHECK_KEDA=1; `make test` sets it): KEDA built from the Go module proxy on first use (scripts/keda.sh;
# cold ~15 min at nice 19, which scripts/test.sh runs beside the cargo tests). Measured (issue 37,
# docs/BENCHMARKS.md): KEDA made the HPAs and both workers scaled 2 -> 3 -> 2 on their lag in the 20:30 UTC run;
# in an earlier one two debug transformer pods drained the 16,000-message backlog before the HPA's 15 s sync saw
# more than 300 a pod. So the assertions follow the egress (one message at a time per partition here, it falls
# behind the burst every time); the transformer's replicas are reported.
if [ "${NODE_CHECK_KEDA:-0}" = 1 ]; then
  log "7. the workers on consumer lag (autoscaling.engine keda, scripts/keda.sh): the transformer paused, a backlog, resumed"
  scripts/keda.sh up
  keda_up=1
  # The chart's KEDA ScaledObjects for the workers (the ingress's needs a Prometheus for its connections trigger:
  # its CPU scaling was step 5's, here it keeps 2 replicas), polling every 5 s, lagThreshold 300 messages a pod.
  # The egress delivers one message at a time per partition here (max_in_flight 1), as against a receiver that
  # answers slowly: with 16 per partition in the air, two debug pods drain the burst before the HPA's first look.
  # shellcheck disable=SC2086
  helm upgrade "${install[@]:2}" -f scripts/node/values.yaml ${NODE_CHECK_HELM_ARGS:-} \
    --set autoscaling.engine=keda,autoscaling.keda.pollingInterval=5,hl7Ingress.autoscaling.enabled=false \
    --set transformer.autoscaling.lagPerPod=300,egress.autoscaling.lagPerPod=300 \
    --set egress.destinations.lab.max_in_flight=1 \
    --wait --timeout 180s >/dev/null || { kubectl get pods -n $ns -o wide >&2; die "helm upgrade to autoscaling.engine keda"; }
  for _ in $(seq 60); do
    [ "$(kubectl get hpa -n $ns --no-headers 2>/dev/null | grep -c '^keda-hpa-')" = 2 ] && break
    sleep 1
  done
  [ "$(kubectl get hpa -n $ns --no-headers 2>/dev/null | grep -c '^keda-hpa-')" = 2 ] ||
    { kubectl get scaledobject,hpa -n $ns >&2; tail -n 20 ".cache/node-run-$CLUSTER_API_PORT/keda/keda-operator.log" >&2; die "KEDA made no HPAs for the workers' ScaledObjects"; }
  log "   HPAs: $(kubectl get hpa -n $ns -o jsonpath='{range .items[*]}{.metadata.name}:{.spec.minReplicas}-{.spec.maxReplicas}:{.spec.metrics[0].external.metric.name} {end}')"
  tf=hl7gw-hl7-gateway-transformer
  t_k=$SECONDS
  # Replica counts every 2 s, the HPAs' value being the lag per pod (KEDA's external metric, as the HPA last read it).
  sample_replicas "$t_k" external.current.averageValue >"$work/keda.txt" 2>/dev/null &
  sampler=$!
  kubectl annotate scaledobject -n $ns $tf autoscaling.keda.sh/paused-replicas=0 >/dev/null
  for _ in $(seq 90); do
    [ "$(kubectl get pods -n $ns -l app.kubernetes.io/component=transformer --no-headers 2>/dev/null | wc -l)" = 0 ] && break
    sleep 1
  done
  log "   transformer paused (ScaledObject annotation paused-replicas 0): no pod at $((SECONDS - t_k)) s; a backlog: 8 senders x 2000 messages"
  "target/$profile/hl7gw-load" --to "$svc:2575" --clients 8 --messages 2000 --warmup 0 --timeout 10 \
    --record-acked "$work/acked-keda.txt" --json >"$work/keda-load.json" 2>"$work/keda-load.log" || true
  t_resume=$((SECONDS - t_k))
  kubectl annotate scaledobject -n $ns $tf autoscaling.keda.sh/paused-replicas- >/dev/null
  log "   resumed at $t_resume s"
  # The backlog reaches the egress as a burst when the transformer resumes: its lag scales it out.
  eg=hl7gw-hl7-gateway-egress
  out_s=
  for _ in $(seq 120); do
    read -r want ready _ < <(ready_count $eg)
    [ "$want" = 3 ] && [ "$ready" = 3 ] && { out_s=$((SECONDS - t_k)); break; }
    sleep 1
  done
  [ -n "$out_s" ] || { kill "$sampler" || true; tail -n 20 "$work/keda.txt" >&2; die "the egress did not scale out to 3 on its lag within 120 s of the resume"; }
  log "   egress at 3 Ready pods at $out_s s ($((out_s - t_resume)) s after the resume)"
  in_s=
  for _ in $(seq 240); do
    read -r want ready pods < <(ready_count $eg)
    [ "$want" = 2 ] && [ "$pods" = 2 ] && { in_s=$((SECONDS - t_k)); break; }
    sleep 1
  done
  [ -n "$in_s" ] || { kill "$sampler" || true; tail -n 20 "$work/keda.txt" >&2; die "the egress did not scale in to 2 within 240 s"; }
  log "   egress back at 2 pods at $in_s s"
  sleep 4
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; sampler=
  kubectl get events -n $ns --field-selector involvedObject.kind=HorizontalPodAutoscaler \
    -o jsonpath='{range .items[*]}{.lastTimestamp} {.involvedObject.name} {.reason}: {.message}{"\n"}{end}' | grep '^[^ ]* keda-hpa' >"$work/keda-events.txt" || true
  sed 's/^/node-check:    event /' "$work/keda-events.txt" >&2
  python3 - "$work" <<'EOF' || die "delivery through the lag scaling"
import collections, json, os, re, sys, time
work = sys.argv[1]
changes, last, lag = collections.defaultdict(list), {}, collections.defaultdict(list)
for line in open(f"{work}/keda.txt"):
    f = line.split()
    if len(f) >= 4 and f[1] == "deploy" and "gateway-ingress" not in f[2]:
        name, v = f[2].replace("hl7gw-hl7-gateway-", ""), (f[3], f[4] if len(f) > 4 else "0")
        if last.get(name) != v:
            last[name] = v
            changes[name].append(f"{f[0]}s {v[0]}/{v[1]}")
    elif len(f) >= 6 and f[1] == "hpa":
        name = f[2].replace("keda-hpa-hl7gw-hl7-gateway-", "")
        if not lag[name] or lag[name][-1].split()[1] != f[5]:
            lag[name].append(f"{f[0]}s {f[5]}")
print("node-check:    replicas wanted/ready (s since the step began):", file=sys.stderr)
for name in sorted(changes):
    print(f"node-check:      {name}: {', '.join(changes[name])}", file=sys.stderr)
for name in sorted(lag):
    print(f"node-check:      {name} lag per pod as its HPA read it: {', '.join(lag[name][:40])}", file=sys.stderr)
acked = [l.strip() for l in open(f"{work}/acked-keda.txt") if l.strip() and not l.startswith("#")]
deadline = time.time() + 300
while True:
    count = collections.Counter(re.sub(r"^\d+-", "", f)[:-4] for f in os.listdir(f"{work}/received") if f.endswith(".hl7"))
    missing = [a for a in acked if a not in count]
    if not missing or time.time() > deadline:
        break
    time.sleep(2)
dup = sum(count[a] - 1 for a in acked if count[a] > 1)
print(f"node-check:    backlog: {len(acked)} ACKed, {len(acked) - len(missing)} delivered, lost {len(missing)} {missing[:3]}, "
      f"duplicates {dup}", file=sys.stderr)
sys.exit(1 if missing or not acked else 0)
EOF
fi

teardown
