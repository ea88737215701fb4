#!/usr/bin/env bash
# `make bench-e2e`: the ingress end to end under hl7gw-load on this machine (load client, ingress and a
# single-node Kafka all share its cores). For each ACK mode, the scaling from 1 to 4 to 8 clients, each
# sustained for BENCH_SECONDS (30), ADT^A01 fixture; prints msg/s, latency percentiles, ACK codes, and the CPU
# time (user+system) per message of the ingress, the broker and the load client. Results also go to
# target/bench-e2e.json.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_SECONDS:-30}
export KAFKA_PORT=${BENCH_KAFKA_PORT:-29692} KAFKA_DATA_DIR="$PWD/target/kafka-bench"
cargo build --release -p hl7gw-ingress -p hl7gw-load >&2
scripts/kafka.sh up
ingress_pid=""
cleanup() {
  [[ -n "$ingress_pid" ]] && kill "$ingress_pid" 2>/dev/null && wait "$ingress_pid" 2>/dev/null || true
  scripts/kafka.sh down || true
}
trap cleanup EXIT
results=target/bench-e2e.jsonl
: >"$results"
for mode in fast durable; do
  topic="bench.$mode.$(date +%s)"
  HL7GW_KAFKA__BROKERS=127.0.0.1:$KAFKA_PORT HL7GW_INBOUND_TOPIC=$topic HL7GW_DLQ_TOPIC=$topic.dlq \
  HL7GW_ACK_MODE=$mode RUST_LOG=warn target/release/hl7gw-ingress \
    --mllp-addr 127.0.0.1:22575 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29464 >/dev/null &
  ingress_pid=$!
  for _ in $(seq 300); do curl -fsS http://127.0.0.1:29464/readyz >/dev/null 2>&1 && break; sleep 0.2; done
  for clients in 1 4 8; do
    python3 scripts/lib/loadrun.py run --field mode="$mode" --field clients="$clients" --field run="--duration $secs" \
      --pid ingress="$ingress_pid" --pid broker="$(cat "$KAFKA_DATA_DIR/kafka.pid")" -- \
      --to 127.0.0.1:22575 --clients "$clients" --duration "$secs" --warmup 200 >>"$results"
  done
  kill -TERM "$ingress_pid"; wait "$ingress_pid" || true; ingress_pid=""
done
# shellcheck source=scripts/lib/benchinfo.sh
. scripts/lib/benchinfo.sh
bench_info bench-e2e bench.
python3 scripts/lib/loadrun.py table "$results" mode clients=clients=d run msgs_per_sec=msg/s=,.0f \
  "p50_ms=p50 ms=.3f" "p99_ms=p99 ms=.3f" "max_ms=max ms=.1f" acks=ACKs errors=errors=d \
  "ingress_us=CPU µs/msg: ingress=.1f" broker_us=broker=.1f "load_us=load client=.1f"
