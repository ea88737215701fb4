#!/usr/bin/env bash
# `make test` after lint: every test of the workspace. Tests that need Kafka start their own brokers through
# scripts/kafka.sh (ports 29092, 29192, 29292 and 29392 (TLS/SASL listeners on 29394/29395) — below the ephemeral port range, so no client socket takes them — data under target/kafka-test); this script stops them at the end.
# The HL7Route test starts its own Kubernetes API server (scripts/cluster.sh, port 7543); the Python consumer
# test builds its venv through scripts/python-env.sh. Everything they need is fetched first, once, into .cache/.
set -euo pipefail
cd "$(dirname "$0")/.."
stop_brokers() {
  for port in 29092 29192 29292 29392; do
    KAFKA_PORT=$port KAFKA_DATA_DIR="$PWD/target/kafka-test/$port" scripts/kafka.sh down >/dev/null 2>&1 || true
  done
  KAFKA_NODES=3 KAFKA_PORT=29500 KAFKA_DATA_DIR="$PWD/target/kafka-test/cluster-29500" scripts/kafka.sh down >/dev/null 2>&1 || true
  CLUSTER_API_PORT=7543 scripts/cluster.sh down >/dev/null 2>&1 || true
}
trap stop_brokers EXIT
# Before the tests run in parallel: fetch the broker's jars, build the local Kubernetes control plane, install
# the chart tools (helm, kubeconform, promtool) and build k6 (once; cached in .cache/: the first cluster build
# takes 6-15 minutes on 2 cores, helm 1-2, k6 2-5).
scripts/kafka.sh fetch
scripts/cluster.sh fetch
scripts/tools.sh >/dev/null
scripts/k6.sh build >/dev/null
cargo test --workspace --all-targets
cargo test --workspace --doc
# k6 with our k6/x/mllp extension drives the debug ingress over MLLP and gRPC for a few seconds; thresholds
# (every message CA, no errors, p99) must pass.
scripts/k6.sh smoke
# Helm chart and k8s/: lint, kubeconform, bad values refused, rendered configs accepted by the binaries,
# committed renders up to date, dashboard/alert metric names, promtool; then install/upgrade/test/uninstall on a
# local API server (port 7443). Installs its tools once into .cache/tools and stops its cluster on exit.
scripts/chart-check.sh
