#!/usr/bin/env bash
# `make test` after lint: every test of the workspace. Tests that need Kafka start their own brokers through
# scripts/kafka.sh (ports 29092, 29192, 29292 and 29392 (TLS/SASL listeners on 29394/29395) — below the ephemeral port range, so no client socket takes them — data under target/kafka-test); this script stops them at the end.
# The HL7Route test starts its own Kubernetes API server (scripts/cluster.sh, port 7543); the Python consumer
# test builds its venv through scripts/python-env.sh. Everything they need is fetched first, once, into .cache/.
set -euo pipefail
cd "$(dirname "$0")/.."
stop_brokers() {
  # The cluster test, when this script stops before it: its whole process group (the services it spawned too).
  [ -z "${cluster_pid:-}" ] || kill -- -"$cluster_pid" 2>/dev/null || true
  [ -z "${keda_pid:-}" ] || kill -- -"$keda_pid" 2>/dev/null || true
  for port in 29092 29192 29292 29392; do
    KAFKA_PORT=$port KAFKA_DATA_DIR="$PWD/target/kafka-test/$port" scripts/kafka.sh down >/dev/null 2>&1 || true
  done
  KAFKA_NODES=3 KAFKA_PORT=29500 KAFKA_DATA_DIR="$PWD/target/kafka-test/cluster-29500" scripts/kafka.sh down >/dev/null 2>&1 || true
  CLUSTER_API_PORT=7543 scripts/cluster.sh down >/dev/null 2>&1 || true
  JAEGER_DIR="$PWD/target/tmp/jaeger" scripts/jaeger.sh down >/dev/null 2>&1 || true # services/egress/tests/jaeger.rs's
}
# The Go builds below (Kubernetes, etcd, CoreDNS, helm, k6, ...; their binaries are kept in .cache/) write ~8 GB of
# module sources and build cache that nothing uses once the binaries exist: here they go to a scratch folder that
# is deleted after the fetches (and on exit), not to ~/go and ~/.cache/go-build, where they filled CI's disk.
go_scratch=$PWD/.cache/go-scratch
export GOCACHE=$go_scratch/build GOMODCACHE=$go_scratch/mod
drop_go_scratch() { [ ! -d "$go_scratch" ] || { chmod -R u+w "$go_scratch" && rm -rf "$go_scratch"; }; }
trap 'stop_brokers; drop_go_scratch || true' EXIT
# Fresh brokers each run: their topics would pile up run after run (1,855 after a day of runs here), and every
# ingress's readiness probe asks for all topics' metadata, which then ran the 384 MB test broker out of heap.
stop_brokers
rm -rf target/kafka-test
# Before the tests run in parallel: fetch the broker's jars, build the local Kubernetes control plane, install
# the chart tools (helm, kubeconform, promtool, checkov's venv) and build k6 (once; cached in .cache/: the first
# cluster build takes 6-15 minutes on 2 cores, helm 1-2, checkov's install 1-2, k6 2-5).
scripts/kafka.sh fetch
scripts/cluster.sh fetch
scripts/tools.sh >/dev/null
scripts/checkov-env.sh >/dev/null
scripts/k6.sh build >/dev/null
scripts/prom-check.sh fetch # Prometheus 2.42 (Debian's .deb); the dashboard's schema check (Go, ~1.5 min once)
scripts/node.sh fetch # with metrics-server (cold: ~5 CPU-minutes)
# Jaeger v2 for services/egress/tests/jaeger.rs, built from the Go module proxy once (cold: ~7 min on 2 cores beside
# a running make test, plus ~1 min of module downloads; docs/observability.md).
scripts/jaeger.sh build >/dev/null
drop_go_scratch
# HAPI v2's MLLP client for services/ingress/tests/hapi_client.rs, built where that test looks for it (cargo's
# target/tmp); its jars come from Maven Central once and stay in ~/.m2.
mvn -q -B -Dstyle.color=never --no-transfer-progress -f services/ingress/tests/hapi/pom.xml \
  -Dprobe.out="$PWD/target/tmp/hapi-probe" package
# HAPI FHIR's R4 validator (offline) and a FHIR R4 server on HAPI's RestfulServer for the egress's FHIR tests
# (issue 28; services/egress/tests/fhir/README.md), built where they look for it; ~200 MB of jars from Maven
# Central once (~2 min), then 6-16 s.
mvn -q -B -Dstyle.color=never --no-transfer-progress -f services/egress/tests/fhir/pom.xml \
  -Dharness.out="$PWD/target/tmp/fhir-harness" package
cargo test --workspace --all-targets --no-run
# The docs say what the binaries do: every `hl7gw ...` command line of the README, the runbook and the
# troubleshooting page against the built binaries' --help (the metric names: scripts/prom-check.sh, against a scrape).
python3 scripts/docs-check.py commands --bin target/debug
# KEDA for the node check's lag-scaling step, built from the Go module proxy once (.cache/tools/keda-*; cold ~15
# CPU-minutes): at nice 19 beside the tests, which mostly wait on brokers and processes, instead of before them.
mkdir -p target/test-logs
setsid nice -n 19 scripts/keda.sh fetch >target/test-logs/keda-build.log 2>&1 &
keda_pid=$!
cargo test --workspace --all-targets
# k6 with our k6/x/mllp extension drives the debug ingress over MLLP and gRPC for a few seconds; thresholds
# (every message CA, no errors, p99) must pass. Before anything runs beside it, for the p99.
scripts/k6.sh smoke
# The 3-broker cluster test (its own brokers on 29500-29521, ~5 min, most of it waiting on failovers) runs beside
# the doc tests and the chart checks, which measure no time: marked #[ignore] so `cargo test` passes it by, run
# here with --ignored from its binary, as cargo would run it (cargo holds the build directory's lock while its
# tests run, so a second `cargo test` would wait). Beside the other integration tests it made one of them miss
# a 60 s readiness wait.
cluster_bin=$(cargo test --workspace --all-targets --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cluster" and m.get("executable"):
        print(m["executable"])')
[ -x "$cluster_bin" ] || { echo "test.sh: the egress's cluster test binary was not built" >&2; exit 1; }
mkdir -p target/test-logs
(cd services/egress && exec setsid "$cluster_bin" --ignored >../../target/test-logs/cluster.log 2>&1) &
cluster_pid=$!
cargo test --workspace --doc
# Helm chart and k8s/: lint, kubeconform, bad values refused, rendered configs accepted by the binaries,
# committed renders up to date, dashboard/alert metric names, promtool; then install/upgrade/test/uninstall on a
# local API server (port 7443). Installs its tools once into .cache/tools and stops its cluster on exit.
scripts/chart-check.sh
echo "test.sh: waiting for the 3-broker cluster test (services/egress/tests/cluster.rs)" >&2
if wait "$cluster_pid"; then cluster_rc=0; else cluster_rc=$?; fi
cluster_pid=
cat target/test-logs/cluster.log
[ "$cluster_rc" = 0 ] || { echo "test.sh: the 3-broker cluster test failed (exit $cluster_rc)" >&2; exit 1; }
# The dashboard's queries and the alert rules against a real Prometheus scraping the debug pipeline on a Kafka of
# its own (port 29960): panels answer under load, rules inactive while healthy, pending/firing when provoked. ~2 min.
scripts/prom-check.sh
# The chart on a real node (containerd, kubelet, kube-proxy, CoreDNS, metrics-server; the debug binaries in a
# local image): the README's install, helm test, load through the Service while pods are deleted and the release
# upgraded, the HPAs scaling out and in under the load Job, the PodDisruptionBudgets against evictions under load,
# a clean teardown; the workers scaled on consumer lag by KEDA (NODE_CHECK_KEDA=1). ~12 min warm.
if wait "$keda_pid"; then keda_rc=0; else keda_rc=$?; fi
keda_pid=
[ "$keda_rc" = 0 ] || { cat target/test-logs/keda-build.log; echo "test.sh: the KEDA build failed" >&2; exit 1; }
NODE_CHECK_KEDA=1 scripts/node-check.sh
