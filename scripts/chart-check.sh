#!/usr/bin/env bash
# Checks of the Helm chart (helm/hl7-gateway), the plain manifests (k8s/) and the image's deploy files: offline
# first, then against a real Kubernetes API server. `make chart-check` runs everything; `make k8s-render`
# regenerates the committed renders.
#
#   scripts/chart-check.sh [all]   offline checks, then the cluster checks
#   scripts/chart-check.sh offline lint, kubeconform, values refusals, committed renders, configs, dashboard, rules
#   scripts/chart-check.sh cluster install/upgrade/test/uninstall on a local API server (scripts/cluster.sh)
#   scripts/chart-check.sh render  rewrite k8s/base/hl7-gateway.yaml, k8s/keda/scaledobjects.yaml,
#                                  k8s/routes/hl7routes.yaml and the chart's files/crds/ from the chart and the
#                                  generator, and the values table of the chart's README from values.yaml
#
# Offline (nothing is downloaded once the tools are cached; checkov's venv too, scripts/checkov-env.sh):
#   1. the chart's CRD (files/crds/, rendered by templates/crd.yaml) and the k8s/ renders equal what
#      `hl7gw-transformer crd` and the chart produce now; the CRD template renders the file's spec unchanged
#   2. helm lint --strict with default values and with each helm/hl7-gateway/ci/*-values.yaml (every optional
#      feature on; the KEDA/routes-file/NodePort alternatives); every key of values.yaml has a comment and is in
#      values.schema.json (scripts/chart/check-values-doc.py); the README's values table (between its
#      values-table markers) is what scripts/chart/values-table.py makes of values.yaml
#   3. helm template | kubeconform -strict against Kubernetes 1.36 schemas (scripts/tools.sh) and the CRDs' own
#      schemas: HL7Route from files/crds/, ServiceMonitor, PodMonitor, PrometheusRule, KafkaTopic and
#      ScaledObject from scripts/chart/crds/ (converted by scripts/chart/crd2schema.py); also every
#      kustomization under k8s/; the default render's probes all ask the admin port and it has its 4
#      NetworkPolicies (on by default)
#   4. each scripts/chart/bad-values/*.yaml makes `helm template` fail with the message in its `# expect:` line
#   5. the services accept the configs the chart renders: the real binaries run --check-config on each
#      Deployment's config file and HL7GW_* variables; the example HL7Routes compile (transformer --check-config),
#      the all-features ones too (adt-to-fhir: toFhir to an HTTP(S) destination)
#   6. the dashboard is valid JSON and every metric it, the alerts and the autoscalers query is one the services
#      define (scripts/chart/check-metrics.py); promtool checks the alert rules and runs their unit tests
#      (scripts/chart/rules-test.yaml), covering the release scoping; an alert turned off is left out
#   7. a security review of the default and the all-features renders with checkov (scripts/chart/checkov.sh,
#      pinned in a venv under .cache/, no network at run time): every finding is in
#      scripts/chart/checkov-accepted.yaml with its reason, and every entry there is still found
# Cluster (scripts/cluster.sh up on CHART_CHECK_API_PORT, default 7443; its own data dir; stopped at the end):
#   8. the third-party CRDs are applied, namespaces enforce the `restricted` Pod Security Standard
#   9. helm install with every feature on (but exampleRoutes: see 10), with the KEDA alternative, and with
#      defaults; the first release creates the HL7Route CRD from its template, the others leave it alone
#      (crds.enabled false); every object exists; each Deployment gets a ReplicaSet and Pods (Pending: there is
#      no kubelet) -- which also proves the pods pass `restricted`; the transformer's ServiceAccount may read
#      HL7Routes and patch their status, nothing else; NOTES.txt warns about the default image and destination
#  10. helm upgrade (replicas, HPA bounds, HPA off, a label) shows up in the objects, the CRD's labels too; the
#      example HL7Routes are created now that the CRD exists
#  11. helm test creates its Job and the Job its Pod (the Job cannot finish without a kubelet: `helm test` is
#      given a short --timeout and its failure is expected)
#  12. bad values are refused by helm install and leave no release behind
#  13. helm uninstall removes the releases' objects; the CRD stays (crds.keep)
#  14. a CRD Helm does not own (left by chart 0.3.x's crds/, or by an uninstalled release) is adopted by a new
#      release with the chart README's commands, and helm upgrade then owns it
#
# Binaries: the CRD generator and --check-config use target/debug/hl7gw-{ingress,transformer,egress} (built by
# `cargo test`/`make test`), or those in CHART_CHECK_BIN_DIR (not HL7GW_...: the services read every HL7GW_
# variable as a config key and refuse unknown ones); a missing one (or a transformer older than its sources)
# is built with cargo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-all}
CHART=helm/hl7-gateway
CHART_CHECK_API_PORT=${CHART_CHECK_API_PORT:-7443}
BIN_DIR=${CHART_CHECK_BIN_DIR:-$root/target/debug}
K8S_VERSION=1.36.3
t_start=$SECONDS

log() { printf 'chart-check: %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
step() { log "[$((SECONDS - t_start))s] $*"; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/chart-check.XXXXXX")
cluster_up=0
cleanup() {
  local rc=$?
  if [ "$cluster_up" = 1 ]; then
    CLUSTER_API_PORT=$CHART_CHECK_API_PORT scripts/cluster.sh down >/dev/null 2>&1 || true
  fi
  rm -rf "$tmp"
  if [ "$rc" = 0 ]; then log "ok ($mode) in $((SECONDS - t_start)) s"; fi
}
trap cleanup EXIT

# --- tools --------------------------------------------------------------------------------------------------------

tools() {
  scripts/tools.sh >/dev/null 2>&1 || scripts/tools.sh
  PATH="$(scripts/tools.sh path):$PATH"
  SCHEMAS=$(scripts/tools.sh schemas)
  command -v promtool >/dev/null || die "promtool missing (scripts/tools.sh could not install it)"
  scripts/cluster.sh fetch # kubectl (kustomize, the cluster checks); instant when cached
  KUBECTL=$root/.cache/k8s-v$K8S_VERSION/bin/kubectl
  [ -x "$KUBECTL" ] || die "no kubectl at $KUBECTL"
  export PATH
}

# The binary. hl7gw-transformer (the CRD generator) is rebuilt with cargo when older than its crate's sources, so
# the CRD check compares against the Rust type as it is now; the others are built only when missing (--check-config
# reads their config types: `make test` has just built them).
bin() {
  local name=$1 crate=${1#hl7gw-} b="$BIN_DIR/$1"
  if [ -n "${CHART_CHECK_BIN_DIR:-}" ]; then
    [ -x "$b" ] || die "no $b (CHART_CHECK_BIN_DIR)"
  elif [ ! -x "$b" ] || { [ "$crate" = transformer ] &&
    [ -n "$(find "services/$crate" -newer "$b" -name '*.rs' 2>/dev/null | head -n 1)" ]; }; then
    log "building $name (cargo build -p $name)"
    cargo build -q -p "$name" --bin "$name" >&2
  fi
  echo "$b"
}

# --- renders ------------------------------------------------------------------------------------------------------

GENERATED="# Generated by \`make k8s-render\` from $CHART (scripts/chart-check.sh render); do not edit.
# \`make chart-check\` fails when this file differs from what the chart renders now."

# render DIR: the CRD and the k8s/ renders, laid out as in the repository.
render() {
  local out=$1 base=(hl7gw "$CHART" --namespace hl7gw --set fullnameOverride=hl7gw)
  mkdir -p "$out/$CHART/files/crds" "$out/k8s/base" "$out/k8s/keda" "$out/k8s/routes"
  "$(bin hl7gw-transformer)" crd >"$out/$CHART/files/crds/hl7routes.hl7gw.io.yaml"
  { echo "$GENERATED"; echo "# Defaults (the HL7Route CRD from templates/crd.yaml), release hl7gw, namespace hl7gw, helm test Job left out."
    helm template "${base[@]}" --skip-tests; } >"$out/k8s/base/hl7-gateway.yaml"
  { echo "$GENERATED"; echo "# autoscaling.engine=keda, release hl7gw."
    helm template "${base[@]}" --set autoscaling.engine=keda --show-only templates/keda.yaml; } >"$out/k8s/keda/scaledobjects.yaml"
  { echo "$GENERATED"; echo "# exampleRoutes.enabled=true."
    helm template "${base[@]}" --set exampleRoutes.enabled=true --show-only templates/example-routes.yaml; } >"$out/k8s/routes/hl7routes.yaml"
}
RENDERED_FILES="$CHART/files/crds/hl7routes.hl7gw.io.yaml k8s/base/hl7-gateway.yaml k8s/keda/scaledobjects.yaml k8s/routes/hl7routes.yaml"

do_render() {
  # The chart's CRD first: templates/crd.yaml reads it from the chart for the base render.
  "$(bin hl7gw-transformer)" crd >"$CHART/files/crds/hl7routes.hl7gw.io.yaml"
  render "$tmp/render"
  local f
  for f in $RENDERED_FILES; do cp "$tmp/render/$f" "$f"; done
  python3 scripts/chart/values-table.py "$CHART/values.yaml" --update "$CHART/README.md"
  log "rendered: $RENDERED_FILES; the values table of $CHART/README.md"
}

# --- offline ------------------------------------------------------------------------------------------------------

kubeconform_strict() { # FILE...
  kubeconform -strict -summary -kubernetes-version "$K8S_VERSION" \
    -schema-location "$SCHEMAS" \
    -schema-location "$tmp/crd-schemas/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json" "$@" >"$tmp/kubeconform.out" 2>&1 ||
    { cat "$tmp/kubeconform.out" >&2; die "kubeconform: $*"; }
  grep -q 'Skipped: 0' "$tmp/kubeconform.out" || { cat "$tmp/kubeconform.out" >&2; die "kubeconform skipped resources (no schema): $*"; }
}

values_files() { echo default; ls "$CHART"/ci/*-values.yaml; }
values_args() { if [ "$1" = default ]; then :; else echo "-f $1"; fi; }

offline() {
  step "1. committed renders and CRD"
  render "$tmp/render"
  local f bad=0
  for f in $RENDERED_FILES; do
    if ! diff -u "$f" "$tmp/render/$f" >"$tmp/diff" 2>&1; then
      head -n 40 "$tmp/diff" >&2; log "$f differs from what the chart/generator produce now"; bad=1
    fi
  done
  [ "$bad" = 0 ] || die "committed renders are stale: run \`make k8s-render\` and commit the result"
  # templates/crd.yaml passes the file through fromYaml/toYaml and adds labels and the keep annotation: the spec
  # must come out as it went in.
  helm template hl7gw "$CHART" --show-only templates/crd.yaml >"$tmp/crd-rendered.yaml"
  python3 - "$CHART/files/crds/hl7routes.hl7gw.io.yaml" "$tmp/crd-rendered.yaml" <<'EOF' || die "templates/crd.yaml changes the CRD"
import sys, yaml
file, rendered = (yaml.safe_load(open(p)) for p in sys.argv[1:])
assert file["spec"] == rendered["spec"], "spec differs"
assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}, rendered["metadata"]
assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
EOF

  step "2. helm lint --strict; every value documented and in values.schema.json; the README's values table"
  python3 scripts/chart/check-values-doc.py "$CHART/values.yaml" "$CHART/values.schema.json" >&2
  python3 scripts/chart/values-table.py "$CHART/values.yaml" >"$tmp/values-table.md"
  awk '/^<!-- values-table:end -->/ {f = 0} f; /^<!-- values-table:start -->/ {f = 1}' "$CHART/README.md" >"$tmp/readme-table.md"
  diff -u "$tmp/readme-table.md" "$tmp/values-table.md" >"$tmp/diff" 2>&1 ||
    { head -n 40 "$tmp/diff" >&2; die "$CHART/README.md's values table differs from values.yaml: run \`make k8s-render\` and commit the result"; }
  log "  README values table: $(($(wc -l <"$tmp/values-table.md") - 2)) keys, as in values.yaml"
  local v
  for v in $(values_files); do
    # shellcheck disable=SC2046
    helm lint --strict "$CHART" $(values_args "$v") >"$tmp/lint.out" 2>&1 || { cat "$tmp/lint.out" >&2; die "helm lint --strict ($v)"; }
  done

  step "3. helm template | kubeconform -strict (Kubernetes $K8S_VERSION + CRD schemas)"
  python3 scripts/chart/crd2schema.py "$tmp/crd-schemas" "$CHART"/files/crds/*.yaml scripts/chart/crds/*.yaml >/dev/null
  local n=0
  for v in $(values_files); do
    n=$((n + 1))
    # shellcheck disable=SC2046
    helm template hl7gw "$CHART" --namespace hl7gw $(values_args "$v") >"$tmp/rendered-$n.yaml"
    kubeconform_strict "$tmp/rendered-$n.yaml"
    log "  $v: $(sed -n 's/^Summary: //p' "$tmp/kubeconform.out")"
    # HPAs ask for hl7gw's own metrics only with autoscaling.customMetrics: without prometheus-adapter an HPA
    # that cannot read a metric never scales down.
    if [ "$v" = default ] && grep -Eq '^ +(pods|external):$' "$tmp/rendered-$n.yaml"; then
      die "the default HPAs ask for custom or external metrics"
    fi
    # Issue 36: every probe asks the admin port (a gRPC probe waits behind a flood of gRPC connections), and
    # NetworkPolicies are on by default: one per service and one for the helm test Job's pod.
    if [ "$v" = default ]; then
      python3 - "$tmp/rendered-$n.yaml" <<'EOF' || die "the default render: probes or NetworkPolicies (above)"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
bad = [f"{d['metadata']['name']}/{c['name']}: {p}" for d in docs if d["kind"] == "Deployment"
       for c in d["spec"]["template"]["spec"]["containers"]
       for p in ("startupProbe", "livenessProbe", "readinessProbe")
       if (c.get(p) or {}).get("httpGet", {}).get("port") != "admin"]
policies = [d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"]
for b in bad:
    print(f"chart-check:   {b} is not httpGet on the admin port", file=sys.stderr)
if len(policies) != 4:
    print(f"chart-check:   NetworkPolicies {policies}, 4 expected", file=sys.stderr)
sys.exit(1 if bad or len(policies) != 4 else 0)
EOF
    fi
    if [ "$v" = "$CHART/ci/all-features-values.yaml" ] && [ "$(grep -Ec '^ +(pods|external):$' "$tmp/rendered-$n.yaml")" != 3 ]; then
      die "autoscaling.customMetrics: the HPAs' Pods/External metrics are missing"
    fi
  done
  kubeconform_strict "$CHART"/files/crds/*.yaml scripts/chart/crds/*.yaml
  local k
  for k in k8s/base k8s/overlays/dev k8s/overlays/keda k8s/kafka k8s/routes k8s/loadtest; do
    "$KUBECTL" kustomize "$k" >"$tmp/kustomize-${k//\//-}.yaml" || die "kustomize build $k"
    kubeconform_strict "$tmp/kustomize-${k//\//-}.yaml"
    log "  $k: $(sed -n 's/^Summary: //p' "$tmp/kubeconform.out")"
  done

  step "4. values.schema.json and the templates refuse bad values"
  local expect out count=0
  for f in scripts/chart/bad-values/*.yaml; do
    expect=$(sed -n 's/^# expect: //p' "$f")
    [ -n "$expect" ] || die "$f has no '# expect:' line"
    if out=$(helm template hl7gw "$CHART" -f "$f" 2>&1 >/dev/null); then
      die "$f was accepted"
    fi
    grep -qF -- "$expect" <<<"$out" || { echo "$out" >&2; die "$f was refused, but not for: $expect"; }
    count=$((count + 1))
  done
  log "  $count bad values files refused, each for its reason"

  step "5. the services accept the rendered configs (--check-config)"
  local s i=0 manifests
  for manifests in $(seq 1 "$n" | sed "s|^|$tmp/rendered-|; s|\$|.yaml|") \
    "$tmp/kustomize-k8s-base.yaml" "$tmp/kustomize-k8s-overlays-dev.yaml" "$tmp/kustomize-k8s-overlays-keda.yaml"; do
    i=$((i + 1))
    python3 scripts/chart/service-configs.py "$manifests" "$tmp/cfg-$i" >/dev/null
    for s in ingress transformer egress; do
      [ -f "$tmp/cfg-$i/$s.args" ] || continue
      local args=() envs=()
      mapfile -t args <"$tmp/cfg-$i/$s.args"
      mapfile -t envs <"$tmp/cfg-$i/$s.env"
      env -i PATH=/usr/bin:/bin "${envs[@]}" "$(bin "hl7gw-$s")" "${args[@]}" --check-config >"$tmp/check.out" 2>&1 ||
        { cat "$tmp/check.out" >&2; die "hl7gw-$s refuses its config and environment in $manifests"; }
    done
  done
  log "  $i renders (chart values files, k8s/base, k8s/overlays/dev, k8s/overlays/keda): every service accepts its config"
  # The example routes (chart exampleRoutes = k8s/routes; with all-features' values also adt-to-fhir, toFhir to an
  # HTTP(S) destination) compile.
  helm template hl7gw "$CHART" -f "$CHART/ci/all-features-values.yaml" --show-only templates/example-routes.yaml \
    >"$tmp/routes-all-features.yaml"
  local routes
  for routes in k8s/routes/hl7routes.yaml "$tmp/routes-all-features.yaml"; do
    printf 'kafka:\n  brokers: 127.0.0.1:9092\nroutes:\n  file: %s\n' "$(realpath "$routes")" >"$tmp/routes-check.yaml"
    env -i PATH=/usr/bin:/bin "$(bin hl7gw-transformer)" --config "$tmp/routes-check.yaml" --check-config >"$tmp/check.out" 2>&1 ||
      { cat "$tmp/check.out" >&2; die "the example HL7Routes do not compile ($routes)"; }
    log "  $(grep -c accepted "$tmp/check.out") example routes accepted (${routes#"$tmp"/})"
  done

  step "6. dashboard, metric names, alert rules"
  local rendered=() j
  for j in $(seq 1 "$n"); do rendered+=(--rendered "$tmp/rendered-$j.yaml"); done
  python3 scripts/chart/check-metrics.py --dashboard "$CHART/files/dashboards/hl7gw.json" "${rendered[@]}" \
    --source services/ingress/src/metrics.rs services/transformer/src/metrics.rs services/egress/src/metrics.rs \
    services/runtime/src/certs.rs >&2
  mkdir -p "$tmp/rules"
  helm template hl7gw "$CHART" --namespace hl7gw --set metrics.prometheusRule.enabled=true \
    -f scripts/chart/rules-values.yaml --show-only templates/prometheusrule.yaml >"$tmp/rules/rule.yaml"
  python3 - "$tmp/rules/rule.yaml" >"$tmp/rules/hl7gw-rules.yaml" <<'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
yaml.safe_dump({"groups": d["spec"]["groups"]}, sys.stdout, sort_keys=False, width=10000)
EOF
  promtool check rules "$tmp/rules/hl7gw-rules.yaml" >&2
  cp scripts/chart/rules-test.yaml "$tmp/rules/"
  (cd "$tmp/rules" && promtool test rules rules-test.yaml) >&2
  # metrics.prometheusRule.alerts.<name>.enabled: false leaves that alert out, and only that one.
  helm template hl7gw "$CHART" --set metrics.prometheusRule.enabled=true \
    --set metrics.prometheusRule.alerts.HL7GWNoTraffic.enabled=false --show-only templates/prometheusrule.yaml >"$tmp/rules/off.yaml"
  ! grep -q 'alert: HL7GWNoTraffic$' "$tmp/rules/off.yaml" || die "alerts.HL7GWNoTraffic.enabled=false left the alert in"
  grep -q 'alert: HL7GWHighNakRate$' "$tmp/rules/off.yaml" || die "alerts.HL7GWNoTraffic.enabled=false took other alerts out"

  step "7. security review: checkov on the default and the all-features renders (scripts/chart/checkov-accepted.yaml)"
  local ckv
  ckv=$(scripts/checkov-env.sh) || die "checkov could not be installed (scripts/checkov-env.sh, above)"
  mkdir -p "$tmp/checkov"
  helm template hl7gw "$CHART" --namespace hl7gw >"$tmp/checkov/default.yaml"
  helm template hl7gw "$CHART" --namespace hl7gw -f "$CHART/ci/all-features-values.yaml" >"$tmp/checkov/all-features.yaml"
  python3 scripts/chart/checkov-review.py "$ckv" scripts/chart/checkov-accepted.yaml \
    default="$tmp/checkov/default.yaml" all-features="$tmp/checkov/all-features.yaml" ||
    die "checkov: findings not accepted, or accepted ones gone (above)"
}

# --- cluster ------------------------------------------------------------------------------------------------------

k() { "$KUBECTL" "$@"; }

# wait_until SECONDS DESCRIPTION CMD...
wait_until() {
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out waiting for: $what"
    sleep 0.5
  done
}

release_objects_exist() { # RELEASE NAMESPACE
  helm get manifest "$1" -n "$2" >"$tmp/manifest.yaml"
  k get -f "$tmp/manifest.yaml" -o name >"$tmp/objects.txt" 2>"$tmp/objects.err" ||
    { cat "$tmp/objects.err" >&2; die "objects of release $1 missing"; }
}

deployments_have_pods() { # NAMESPACE RELEASE COUNT
  local d rs pods
  [ "$(k get deploy -n "$1" -l "app.kubernetes.io/instance=$2" -o name | wc -l)" = "$3" ] || return 1
  for d in $(k get deploy -n "$1" -l "app.kubernetes.io/instance=$2" -o name); do
    rs=$(k get rs -n "$1" -l "app.kubernetes.io/instance=$2,app.kubernetes.io/component=${d##*-}" -o name | wc -l)
    pods=$(k get pods -n "$1" -l "app.kubernetes.io/instance=$2,app.kubernetes.io/component=${d##*-}" -o name | wc -l)
    [ "$rs" -ge 1 ] && [ "$pods" -ge 1 ] || return 1
  done
}

can_i() { # EXPECT(yes|no) SA NAMESPACE VERB RESOURCE [--subresource=...]
  local want=$1 sa=$2 ns=$3; shift 3
  local got; got=$(k auth can-i --as="system:serviceaccount:$ns:$sa" -n "$ns" "$@" 2>/dev/null || true)
  [ "$got" = "$want" ] || die "$sa can-i $*: $got, expected $want"
}

cluster() {
  step "8. local API server on 127.0.0.1:$CHART_CHECK_API_PORT"
  cluster_up=1
  CLUSTER_API_PORT=$CHART_CHECK_API_PORT scripts/cluster.sh up >"$tmp/cluster-env" 2>"$tmp/cluster.log" ||
    { cat "$tmp/cluster.log" >&2; die "scripts/cluster.sh up"; }
  eval "$(grep '^export KUBECONFIG' "$tmp/cluster-env")"
  export KUBECONFIG
  k apply -f scripts/chart/crds/ >/dev/null
  k wait --for=condition=Established --timeout=60s -f scripts/chart/crds/ >/dev/null
  # ci/all-features-values.yaml sets priorityClassName: the class is the cluster admin's to create.
  k create priorityclass hl7gw-critical --value=1000000 --description="hl7gw ingress" >/dev/null
  local ns
  for ns in hl7gw-all hl7gw-keda hl7gw-default hl7gw-adopt; do
    k create namespace "$ns" >/dev/null
    k label namespace "$ns" pod-security.kubernetes.io/enforce=restricted >/dev/null
  done

  step "9. helm install (every feature on; KEDA + routes file; defaults)"
  ! k get crd hl7routes.hl7gw.io >/dev/null 2>&1 || die "the HL7Route CRD exists before any release"
  # exampleRoutes on a first install would be refused (Helm maps every object's kind before the CRD exists):
  # the upgrade (10) turns them on. The CRD belongs to release `all`; `keda` (routes file) has crds.enabled
  # false in its values file, `dflt` gets it here.
  helm install all "$CHART" -n hl7gw-all -f "$CHART/ci/all-features-values.yaml" --set exampleRoutes.enabled=false \
    --timeout 60s >"$tmp/install-all.out"
  helm install keda "$CHART" -n hl7gw-keda -f "$CHART/ci/keda-routes-file-values.yaml" --timeout 60s >/dev/null
  helm install dflt "$CHART" -n hl7gw-default --set crds.enabled=false --timeout 60s >"$tmp/install-dflt.out"
  k wait --for=condition=Established --timeout=60s crd/hl7routes.hl7gw.io >/dev/null
  [ "$(k get crd hl7routes.hl7gw.io -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}/{.metadata.annotations.helm\.sh/resource-policy}')" = all/keep ] ||
    die "the HL7Route CRD is not release all's (with helm.sh/resource-policy: keep)"
  local r
  for r in all:hl7gw-all keda:hl7gw-keda dflt:hl7gw-default; do
    [ "$(helm status "${r%%:*}" -n "${r#*:}" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["info"]["status"])')" = deployed ] ||
      die "release ${r%%:*} not deployed"
    release_objects_exist "${r%%:*}" "${r#*:}"
    wait_until 60 "ReplicaSets and Pods of release ${r%%:*}" deployments_have_pods "${r#*:}" "${r%%:*}" 3
    log "  ${r%%:*}: $(wc -l <"$tmp/objects.txt") objects accepted; 3 Deployments with ReplicaSets and Pods"
  done
  [ "$(k get scaledobjects -n hl7gw-keda -o name | wc -l)" = 3 ] || die "ScaledObjects missing"
  [ "$(k get podmonitors -n hl7gw-keda -o name | wc -l)" = 1 ] || die "PodMonitor missing"
  [ "$(k get hpa -n hl7gw-keda -o name | wc -l)" = 0 ] || die "HPAs rendered next to ScaledObjects"
  [ "$(k get hpa -n hl7gw-all -o name | wc -l)" = 3 ] || die "HPAs missing"
  [ "$(k get deploy all-hl7-gateway-ingress -n hl7gw-all -o jsonpath='{.spec.template.spec.initContainers[0].name}/{.metadata.labels.app\.kubernetes\.io/version}')" = spool-init/0.4.0-rc.1_build.7 ] ||
    die "the ingress's init container or version label is missing"
  local tsa=all-hl7-gateway-transformer
  can_i yes "$tsa" hl7gw-all list hl7routes.hl7gw.io
  can_i yes "$tsa" hl7gw-all watch hl7routes.hl7gw.io
  can_i yes "$tsa" hl7gw-all patch hl7routes.hl7gw.io --subresource=status
  can_i no "$tsa" hl7gw-all patch hl7routes.hl7gw.io
  can_i no "$tsa" hl7gw-all delete hl7routes.hl7gw.io
  can_i no "$tsa" hl7gw-all get secrets
  can_i no "$tsa" hl7gw-default list hl7routes.hl7gw.io
  can_i no all-hl7-gateway hl7gw-all list hl7routes.hl7gw.io
  log "  RBAC: transformer reads HL7Routes and patches their status, nothing else; ingress/egress nothing"
  # NOTES.txt: the defaults' image and destination do not exist, and say so; all-features' image is a real name.
  grep -q "WARNING: the image is the chart's default, hl7gw:" "$tmp/install-dflt.out" &&
    grep -q "WARNING: destination(s) lab (lab-receiver.example.svc:2575)" "$tmp/install-dflt.out" &&
    grep -q "port-forward svc/dflt-hl7-gateway-ingress-mllp 2575:2575" "$tmp/install-dflt.out" &&
    grep -q "port-forward svc/dflt-hl7-gateway-egress 50051:50051" "$tmp/install-dflt.out" &&
    grep -q "hl7gw status --to http://127.0.0.1:50051 --token-file" "$tmp/install-dflt.out" ||
    { cat "$tmp/install-dflt.out" >&2; die "NOTES.txt of the defaults: warnings or the port-forwards missing"; }
  ! grep -q "WARNING: the image" "$tmp/install-all.out" || die "NOTES.txt warns about an image that is set"
  log "  NOTES.txt: the default image and example destination are warned about; port-forwards (MLLP; gRPC with a token) shown"

  step "10. helm upgrade (replicas, HPA bounds, a label; the example routes)"
  helm upgrade all "$CHART" -n hl7gw-all -f "$CHART/ci/all-features-values.yaml" --timeout 60s \
    --set hl7Ingress.autoscaling.minReplicas=3 --set hl7Ingress.autoscaling.maxReplicas=4 \
    --set transformer.autoscaling.enabled=false --set transformer.replicas=3 \
    --set commonLabels.hl7gw-check=upgraded >/dev/null
  [ "$(k get hpa all-hl7-gateway-ingress -n hl7gw-all -o jsonpath='{.spec.minReplicas}/{.spec.maxReplicas}')" = 3/4 ] ||
    die "ingress HPA bounds not upgraded"
  ! k get hpa all-hl7-gateway-transformer -n hl7gw-all >/dev/null 2>&1 || die "transformer HPA not removed"
  [ "$(k get deploy all-hl7-gateway-transformer -n hl7gw-all -o jsonpath='{.spec.replicas}')" = 3 ] ||
    die "transformer replicas not upgraded"
  wait_until 60 "3 transformer pods" bash -c "[ \$('$KUBECTL' get pods -n hl7gw-all -l app.kubernetes.io/instance=all,app.kubernetes.io/component=transformer -o name | wc -l) -ge 3 ]"
  [ "$(helm status all -n hl7gw-all -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')" = 2 ] ||
    die "release revision is not 2"
  [ "$(k get crd hl7routes.hl7gw.io -o jsonpath='{.metadata.labels.hl7gw-check}')" = upgraded ] ||
    die "helm upgrade did not update the HL7Route CRD"
  [ "$(k get hl7routes -n hl7gw-all -o name | wc -l)" = 3 ] || die "example HL7Routes missing after the upgrade"
  log "  ingress HPA 3..4, transformer HPA removed and 3 replicas (3 pods), revision 2; the CRD upgraded; 3 HL7Routes"

  step "11. helm test (creates the Job; it cannot finish without a kubelet)"
  if helm test dflt -n hl7gw-default --timeout 3s >"$tmp/helm-test.out" 2>&1; then
    die "helm test passed without a kubelet?"
  fi
  k get job dflt-hl7-gateway-test-mllp -n hl7gw-default >/dev/null || { cat "$tmp/helm-test.out" >&2; die "helm test Job not created"; }
  wait_until 30 "the test Job's Pod" bash -c "[ \$('$KUBECTL' get pods -n hl7gw-default -l batch.kubernetes.io/job-name=dflt-hl7-gateway-test-mllp -o name | wc -l) = 1 ]"
  [ "$(k get job dflt-hl7-gateway-test-mllp -n hl7gw-default -o jsonpath='{.spec.template.spec.containers[0].args[1]}')" = \
    "dflt-hl7-gateway-ingress-mllp.hl7gw-default.svc:2575" ] || die "the test Job does not target the MLLP Service"
  k delete job dflt-hl7-gateway-test-mllp -n hl7gw-default --cascade=foreground --wait=false >/dev/null
  log "  Job dflt-hl7-gateway-test-mllp and its Pod created (hl7gw-load against the MLLP Service)"

  step "12. bad values refused by helm install"
  for f in scripts/chart/bad-values/05-config-typo.yaml scripts/chart/bad-values/14-transformer-above-partitions.yaml \
    scripts/chart/bad-values/26-run-as-root.yaml scripts/chart/bad-values/45-ingress-renamed.yaml \
    scripts/chart/bad-values/76-anonymous-admin-without-tls-or-policy.yaml; do
    if helm install bad "$CHART" -n hl7gw-default --set crds.enabled=false -f "$f" --timeout 30s >"$tmp/bad.out" 2>&1; then
      die "helm install accepted $f"
    fi
    ! helm status bad -n hl7gw-default >/dev/null 2>&1 || die "a release was left behind by $f"
  done
  log "  5 refused (anonymous on an admin method without gRPC TLS or NetworkPolicy too), no release left behind"

  step "13. helm uninstall"
  helm uninstall all -n hl7gw-all --wait --timeout 60s >/dev/null
  helm uninstall keda -n hl7gw-keda --wait --timeout 60s >/dev/null
  helm uninstall dflt -n hl7gw-default --wait --timeout 60s >/dev/null
  for ns in hl7gw-all hl7gw-keda hl7gw-default; do
    local left
    left=$(k get deploy,svc,cm,sa,role,rolebinding,hpa,pdb,networkpolicy,scaledobjects,servicemonitors,podmonitors,prometheusrules,hl7routes \
      -n "$ns" -l app.kubernetes.io/managed-by=Helm -o name 2>/dev/null | wc -l)
    [ "$left" = 0 ] || die "$left objects left in $ns after uninstall"
  done
  k get crd hl7routes.hl7gw.io >/dev/null || die "helm uninstall deleted the HL7Route CRD despite crds.keep"
  log "  every release object deleted; the HL7Route CRD stays (crds.keep: helm.sh/resource-policy keep)"

  step "14. a CRD no release owns is adopted (the chart README's Upgrading commands)"
  # As chart 0.3.x's crds/ left it: no Helm labels or annotations. A release refuses to take it over...
  k annotate crd hl7routes.hl7gw.io meta.helm.sh/release-name- meta.helm.sh/release-namespace- helm.sh/resource-policy- >/dev/null
  k label crd hl7routes.hl7gw.io app.kubernetes.io/managed-by- >/dev/null
  if helm install adopt "$CHART" -n hl7gw-adopt --timeout 30s >"$tmp/adopt.out" 2>&1; then
    die "helm install took over a CRD it does not own"
  fi
  grep -q "invalid ownership metadata" "$tmp/adopt.out" || { cat "$tmp/adopt.out" >&2; die "not refused for the CRD's ownership"; }
  helm uninstall adopt -n hl7gw-adopt >/dev/null 2>&1 || true
  # ... until the README's commands hand it over.
  k label crd hl7routes.hl7gw.io app.kubernetes.io/managed-by=Helm --overwrite >/dev/null
  k annotate crd hl7routes.hl7gw.io meta.helm.sh/release-name=adopt meta.helm.sh/release-namespace=hl7gw-adopt --overwrite >/dev/null
  helm install adopt "$CHART" -n hl7gw-adopt --timeout 30s >/dev/null
  [ "$(k get crd hl7routes.hl7gw.io -o jsonpath='{.metadata.labels.app\.kubernetes\.io/instance}/{.metadata.annotations.helm\.sh/resource-policy}')" = adopt/keep ] ||
    die "release adopt did not take the CRD over"
  helm uninstall adopt -n hl7gw-adopt --wait --timeout 60s >/dev/null
  log "  refused while unowned (invalid ownership metadata); adopted after kubectl label/annotate"
}

# --- main ---------------------------------------------------------------------------------------------------------

case "$mode" in
  render) tools; do_render ;;
  offline) tools; offline ;;
  cluster) tools; cluster ;;
  all) tools; offline; cluster ;;
  *) echo "usage: $0 [all|offline|cluster|render]" >&2; exit 2 ;;
esac
