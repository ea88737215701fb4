#!/usr/bin/env bash
# `make bench-e2e`: the ingress end to end under hl7gw-load on this machine (load client, ingress and a
# single-node Kafka all share its cores). For each ACK mode: 1 client x 10,000, 8 x 5,000 and 8 clients for
# 30 s, ADT^A01 fixture; prints msg/s, latency percentiles, ACK codes, and the ingress's CPU time per message.
# BENCH_SECONDS shortens the sustained run (default 30). Results also go to target/bench-e2e.json.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_SECONDS:-30}
export KAFKA_PORT=29092 KAFKA_DATA_DIR="$PWD/target/kafka-bench"
cargo build --release -p hl7gw-ingress -p hl7gw-load >&2
scripts/kafka.sh up
ingress_pid=""
cleanup() {
  [[ -n "$ingress_pid" ]] && kill "$ingress_pid" 2>/dev/null && wait "$ingress_pid" 2>/dev/null || true
  scripts/kafka.sh down || true
}
trap cleanup EXIT
tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
results=target/bench-e2e.jsonl
: >"$results"
for mode in fast durable; do
  topic="bench.$mode.$(date +%s)"
  HL7GW_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT HL7GW_INBOUND_TOPIC=$topic HL7GW_DLQ_TOPIC=$topic.dlq \
  HL7GW_ACK_MODE=$mode RUST_LOG=warn target/release/hl7gw-ingress \
    --mllp-addr 127.0.0.1:22575 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29464 >/dev/null &
  ingress_pid=$!
  for _ in $(seq 300); do curl -fsS http://127.0.0.1:29464/readyz >/dev/null 2>&1 && break; sleep 0.2; done
  for scenario in "1 --messages 10000" "8 --messages 5000" "8 --duration $secs"; do
    read -r clients rest <<<"$scenario"
    before=$(cpu_ticks "$ingress_pid")
    json=$(target/release/hl7gw-load --to 127.0.0.1:22575 --clients "$clients" $rest --warmup 200 --json || true)
    after=$(cpu_ticks "$ingress_pid")
    python3 - "$mode" "$clients" "$rest" "$before" "$after" "$tck" "$json" >>"$results" <<'PY'
import json, sys
mode, clients, rest, before, after, tck, raw = sys.argv[1:8]
r = json.loads(raw)
n = r["messages"] + r.get("warmup", {}).get("messages", 0)
cpu_us = (int(after) - int(before)) * 1e6 / int(tck) / max(n, 1)
print(json.dumps({"mode": mode, "clients": int(clients), "run": rest, "msgs_per_sec": r["msgs_per_sec"],
                  "p50_ms": r["latency_us"]["p50"] / 1000, "p99_ms": r["latency_us"]["p99"] / 1000,
                  "max_ms": r["latency_us"]["max"] / 1000, "acks": {k: v for k, v in r["acks"].items() if v},
                  "errors": r["errors"], "ingress_cpu_us_per_msg": round(cpu_us, 1)}))
PY
  done
  kill -TERM "$ingress_pid"; wait "$ingress_pid" || true; ingress_pid=""
done
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| mode | clients | run | msg/s | p50 ms | p99 ms | max ms | ACKs | errors | ingress CPU µs/msg |")
print("|---|---:|---|---:|---:|---:|---:|---|---:|---:|")
for r in rows:
    acks = ", ".join(f"{k} {v}" for k, v in r["acks"].items())
    print(f'| {r["mode"]} | {r["clients"]} | {r["run"]} | {r["msgs_per_sec"]:,.0f} | {r["p50_ms"]:.3f} | '
          f'{r["p99_ms"]:.3f} | {r["max_ms"]:.1f} | {acks} | {r["errors"]} | {r["ingress_cpu_us_per_msg"]} |')
PY
