#!/usr/bin/env bash
# `scripts/bench-ingress.sh LABEL [CLIENTS (8)] [SECONDS (10)] [NAME=VALUE ...]`: one durable ingress setting under
# load, for comparing settings run after run (e.g. HL7GW_KAFKA__MAX_IN_FLIGHT=1, TOKIO_WORKER_THREADS=1): starts
# the bench broker (BENCH_KAFKA_PORT, 29692) if needed, the release ingress with the given environment and
# librdkafka statistics every second, 1,000 warm-up messages per client, then prints one line: msg/s, p50/p99,
# CPU µs per message of the ingress, the broker and the load client, and messages per Kafka produce request (from
# hl7gw_kafka_requests_total). BENCH_LOAD_ARGS adds hl7gw-load flags (e.g. "--in-flight 8": pipelined senders).
# BENCH_INGRESS runs another ingress binary (a copy of an earlier build, for before/after runs alternated).
# BENCH_GRPC=1 sends over the gRPC Ingest/SendStream (hl7gw-load --grpc) instead of MLLP.
# Leaves the broker running (scripts/kafka.sh down with the same KAFKA_* to stop).
set -euo pipefail
cd "$(dirname "$0")/.."
label=$1 clients=${2:-8} secs=${3:-10}
shift $(($# < 3 ? $# : 3))
export KAFKA_PORT=${BENCH_KAFKA_PORT:-29692} KAFKA_DATA_DIR="$PWD/target/kafka-bench"
cargo build --release -p hl7gw-ingress -p hl7gw-load --bins >&2
scripts/kafka.sh up >&2
broker=$(cat "$KAFKA_DATA_DIR/kafka.pid")
topic="bench.ingress.$label.$(date +%s%N)"
env "$@" HL7GW_KAFKA__BROKERS=127.0.0.1:$KAFKA_PORT HL7GW_INBOUND_TOPIC=$topic HL7GW_DLQ_TOPIC=$topic.dlq \
  HL7GW_KAFKA__STATISTICS_INTERVAL=1s RUST_LOG=warn "${BENCH_INGRESS:-target/release/hl7gw-ingress}" \
  --mllp-addr 127.0.0.1:22575 --grpc-addr 127.0.0.1:22576 --admin-addr 127.0.0.1:29464 >/dev/null &
ingress=$!
trap 'kill -TERM $ingress 2>/dev/null; wait $ingress 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -fsS http://127.0.0.1:29464/readyz >/dev/null 2>&1 && break; sleep 0.2; done
to=(--to 127.0.0.1:22575)
if [ "${BENCH_GRPC:-0}" = 1 ]; then to=(--to 127.0.0.1:22576 --grpc); fi
target/release/hl7gw-load "${to[@]}" --clients "$clients" --messages 1000 --warmup 0 >/dev/null
sleep 1.2
python3 - "$label" "$clients" "$secs" "$ingress" "$broker" "${to[@]}" <<'PY'
import os, sys, time
sys.path.insert(0, "scripts/lib")
from loadrun import measure, produce_requests
label, clients, secs, ingress, broker = sys.argv[1:6]
metrics = "http://127.0.0.1:29464/metrics"
p0 = produce_requests(metrics)
r = measure([*sys.argv[6:], "--clients", clients, "--duration", secs, "--warmup", "0",
             *os.environ.get("BENCH_LOAD_ARGS", "").split()], {"ingress": ingress, "broker": broker})
time.sleep(1.2)  # the next statistics report
per_request = r["messages"] / max(produce_requests(metrics) - p0, 1)
print(f'{label} clients={clients}: {r["msgs_per_sec"]:,.0f} msg/s, p50 {r["p50_ms"]:.3f} ms, p99 {r["p99_ms"]:.3f} ms; '
      f'CPU µs/msg ingress {r["ingress_us"]}, broker {r["broker_us"]}, load {r["load_us"]}; '
      f'{per_request:.2f} messages per produce request; errors {r["errors"]}')
PY
echo "  topic: $(scripts/kafka.sh topics "$topic")" >&2
