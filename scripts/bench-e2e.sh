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
  for scenario in "1 --duration $secs" "4 --duration $secs" "8 --duration $secs"; do
    read -r clients rest <<<"$scenario"
    python3 - "$mode" "$clients" "$rest" "$ingress_pid" "$(cat "$KAFKA_DATA_DIR/kafka.pid")" >>"$results" <<'PY'
import json, os, resource, subprocess, sys
mode, clients, rest, ingress, broker = sys.argv[1:6]
tck = os.sysconf("SC_CLK_TCK")
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
i0, b0, c0 = ticks(ingress), ticks(broker), resource.getrusage(resource.RUSAGE_CHILDREN)
p = subprocess.run(["target/release/hl7gw-load", "--to", "127.0.0.1:22575", "--clients", clients, *rest.split(),
                    "--warmup", "200", "--json"], capture_output=True, text=True)
i1, b1, c1 = ticks(ingress), ticks(broker), resource.getrusage(resource.RUSAGE_CHILDREN)
r = json.loads(p.stdout)
n = max(r["messages"] + r.get("warmup", {}).get("messages", 0), 1)
us = lambda t: round(t * 1e6 / tck / n, 1)
print(json.dumps({"mode": mode, "clients": int(clients), "run": rest, "msgs_per_sec": r["msgs_per_sec"],
                  "p50_ms": r["latency_us"]["p50"] / 1000, "p99_ms": r["latency_us"]["p99"] / 1000,
                  "max_ms": r["latency_us"]["max"] / 1000, "acks": {k: v for k, v in r["acks"].items() if v},
                  "errors": r["errors"], "ingress_cpu_us_per_msg": us(i1 - i0), "broker_cpu_us_per_msg": us(b1 - b0),
                  "load_cpu_us_per_msg": round(((c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)) * 1e6 / n, 1)}))
PY
  done
  kill -TERM "$ingress_pid"; wait "$ingress_pid" || true; ingress_pid=""
done
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| mode | clients | run | msg/s | p50 ms | p99 ms | max ms | ACKs | errors | CPU µs/msg: ingress | broker | load client |")
print("|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
for r in rows:
    acks = ", ".join(f"{k} {v}" for k, v in r["acks"].items())
    print(f'| {r["mode"]} | {r["clients"]} | {r["run"]} | {r["msgs_per_sec"]:,.0f} | {r["p50_ms"]:.3f} | '
          f'{r["p99_ms"]:.3f} | {r["max_ms"]:.1f} | {acks} | {r["errors"]} | {r["ingress_cpu_us_per_msg"]} | '
          f'{r["broker_cpu_us_per_msg"]} | {r["load_cpu_us_per_msg"]} |')
PY
