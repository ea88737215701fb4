#!/usr/bin/env bash
# `make prom-check` (and `make test`): the chart's Grafana dashboard and PrometheusRule alerts against a real
# Prometheus (2.42, the server from Debian's `prometheus` .deb, as promtool: scripts/tools.sh) scraping a running
# pipeline: two ingress pods, transformer, egress, receivers, on a Kafka of its own (port 29960, data under
# target/prom-check). scripts/prom-check/check.py says what it runs and checks; in short:
#   - the dashboard (helm template, release hl7gw in namespace hl7gw, as the chart's ConfigMap carries it): every
#     variable's query returns values and every panel's query returns at least one series, with the variables
#     resolved as Grafana resolves them on a first load, under load and again once trouble was provoked;
#   - the alert rules (the PrometheusRule's spec, rendered with scripts/prom-check/values.yaml): all inactive
#     while the pipeline is healthy (but the certificate warning the run provokes by configuration); once it
#     provokes them (a receiver down, a sender silent, dead letters at every stage, undelivered age, a refused
#     route, a pod unavailable, NAKs), each provoked rule is pending under the chart's `for:` and firing in a second
#     copy with `for: 10s` (scripts/prom-check/short-for.yaml); the rest stay inactive.
# The table it prints is the one in docs/observability.md ("The dashboard and the alerts against a real
# Prometheus"); it is also written to target/prom-check/report.md. ~2.5 minutes once the binaries are built.
# Before Prometheus starts, the dashboard (the chart's file and its render) is decoded strictly against the schema
# of the Grafana foundation SDK (github.com/grafana/grafana-foundation-sdk/go v0.0.22, Apache-2.0: Go types
# generated from Grafana's schemas; an unknown or mistyped field in a panel, its options, a variable or a query is
# an error) and passed through the SDK's Validate(): scripts/prom-check/grafana-schema, built from the Go module
# proxy once (~1.5 min on 2 cores) into .cache/tools/grafana-schema-v0.0.22. Grafana itself (AGPL) is not used.
#   scripts/prom-check.sh [run]  the check
#   scripts/prom-check.sh fetch  only install Prometheus and build the schema checker (scripts/test.sh's fetch step)
#   PROM_CHECK_BIN=DIR  the hl7gw binaries to run (default: target/debug, built here with cargo build --bins)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$PWD/target/prom-check
export KAFKA_PORT=${PROM_CHECK_KAFKA_PORT:-29960} KAFKA_DATA_DIR=$work/kafka
CHART=helm/hl7-gateway
GRAFANA_SDK_VERSION=v0.0.22 # scripts/prom-check/grafana-schema/go.mod's
log() { printf 'prom-check: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

schema_dir=$PWD/.cache/tools/grafana-schema-$GRAFANA_SDK_VERSION
schema_bin=$schema_dir/bin/grafana-schema
schema_src=scripts/prom-check/grafana-schema
# shellcheck source=scripts/lib/gobuild.sh
. scripts/lib/gobuild.sh
build_schema_checker() {
  local stamp
  stamp=$(cat "$schema_src/go.mod" "$schema_src/go.sum" "$schema_src/main.go" | sha256sum | cut -c1-16)
  go_build_once "$schema_dir" "$stamp" "the Grafana foundation SDK's schema check" go_build_schema_checker
}
# go_build_once's command.
go_build_schema_checker() {
  cd "$schema_src" && GOFLAGS="-buildvcs=false -modcacherw -mod=readonly" nice -n 19 go build -trimpath -ldflags "-s -w" \
    -o "$schema_bin" .
}

prometheus=$(scripts/tools.sh prometheus)
build_schema_checker
[ "${1:-run}" != fetch ] || exit 0
[ "${1:-run}" = run ] || die "usage: $0 [run|fetch]"
scripts/tools.sh >/dev/null
export PATH="$(scripts/tools.sh path):$PATH"
command -v promtool >/dev/null || die "promtool missing (scripts/tools.sh could not install it)"
bin=${PROM_CHECK_BIN:-}
if [ -z "$bin" ]; then
  cargo build --bins -p hl7gw-ingress -p hl7gw-transformer -p hl7gw-egress -p hl7gw-cli -p hl7gw-load >&2
  bin=$PWD/${CARGO_TARGET_DIR:-target}/debug
fi

scripts/kafka.sh down >/dev/null 2>&1 || true
rm -rf "$work"
mkdir -p "$work/render"
trap 'scripts/kafka.sh down >/dev/null 2>&1 || true' EXIT

# The rules and the dashboard as the chart renders them.
render() { helm template hl7gw "$CHART" --namespace hl7gw -f scripts/prom-check/values.yaml "$@"; }
render --show-only templates/prometheusrule.yaml >"$work/render/rule.yaml"
render -f scripts/prom-check/short-for.yaml --show-only templates/prometheusrule.yaml >"$work/render/rule-short.yaml"
render --show-only templates/dashboard.yaml >"$work/render/dashboard.yaml"
fullname=$(render --show-only templates/dashboard.yaml | python3 -c '
import sys, yaml; print(yaml.safe_load(sys.stdin)["metadata"]["name"].removesuffix("-dashboard"))')
python3 - "$work/render" <<'EOF'
import json, sys, yaml
d = sys.argv[1]
for src, dst, suffix in (("rule.yaml", "rules.yaml", ""), ("rule-short.yaml", "rules-short.yaml", ".short-for")):
    groups = yaml.safe_load(open(f"{d}/{src}"))["spec"]["groups"]
    for g in groups:
        g["name"] += suffix
    yaml.safe_dump({"groups": groups}, open(f"{d}/{dst}", "w"), sort_keys=False, width=10000)
cm = yaml.safe_load(open(f"{d}/dashboard.yaml"))
json.dump(json.loads(cm["data"]["hl7gw.json"]), open(f"{d}/dashboard.json", "w"), indent=1)
EOF
promtool check rules "$work/render/rules.yaml" "$work/render/rules-short.yaml" >&2
"$schema_bin" "$CHART/files/dashboards/hl7gw.json" "$work/render/dashboard.json" >&2 ||
  die "the dashboard does not decode against the Grafana foundation SDK's schema (above)"

scripts/kafka.sh up >&2
t0=$SECONDS
python3 scripts/prom-check/check.py --bin "$bin" --prometheus "$prometheus" --brokers "$(scripts/kafka.sh brokers)" \
  --work "$work" --rules "$work/render/rules.yaml" "$work/render/rules-short.yaml" \
  --dashboard "$work/render/dashboard.json" --fullname "$fullname" --namespace hl7gw --report "$work/report.md"
log "ok in $((SECONDS - t0)) s after Kafka was up (logs: ${work#"$PWD"/}/logs)"
