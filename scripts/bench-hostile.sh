#!/usr/bin/env bash
# `make bench-hostile`: what a normal sender sees while cheap hostile clients go at the ingress (issue 24). The
# release ingress with its default limits (max_connections 1024, grpc_max_connections 1024, frame_timeout 30 s,
# evict_after 10 s, write_timeout 30 s, 256 connections per address on each) and a local single-node Kafka; for each abuse, HOSTILE_CLIENTS (1,100,
# more than every limit) hostile connections from scripts/lib/hostile.py, re-made as soon as they are closed:
#   none       no abuse (the baseline)
#   slow       each opens an MLLP frame and sends one byte every 20 s (slowloris)
#   idle       each connects to the MLLP port and sends nothing
#   noread     each sends ADT messages as fast as its socket takes them and never reads an ACK
#   grpc-idle  each connects to the gRPC port and sends nothing (the normal sender then uses gRPC SendStream)
#   grpc-watch each holds an open grpc.health.v1.Health/Watch stream on the gRPC port, answering PINGs (the
#              normal sender then uses gRPC SendStream)
# The hostile connections come from 127.0.0.2, the normal sender and the health probe from 127.0.0.1: another
# client, as the per-address bounds (max_connections_per_address, grpc_max_connections_per_address) see it.
# During each run the admin port's /readyz (the chart's readiness probe) is asked every 0.5 s: "ready" counts
# its 200s.
# The abuse runs HOSTILE_WARMUP (15) seconds first, so every hostile connection is older than evict_after and
# past its first deadlines, then one normal sender (hl7gw-load, 1 client, send-and-wait) runs BENCH_SECONDS (20).
# Prints a Markdown table: the normal sender's msg/s, latency and errors, the ingress's RSS and CPU, and what the
# ingress counted (evictions, deadline closes, write timeouts, refusals). Rows also in target/bench-hostile.jsonl.
# Sends only to 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_SECONDS:-20} warm=${HOSTILE_WARMUP:-15} hostile=${HOSTILE_CLIENTS:-1100}
export KAFKA_PORT=${BENCH_KAFKA_PORT:-29692} KAFKA_DATA_DIR="$PWD/target/kafka-bench"
cargo build --release -p hl7gw-ingress -p hl7gw-load --bins >&2
scripts/kafka.sh up >&2
broker=$(cat "$KAFKA_DATA_DIR/kafka.pid")
topic="bench.hostile.$(date +%s)"
HL7GW_KAFKA__BROKERS=127.0.0.1:$KAFKA_PORT HL7GW_INBOUND_TOPIC=$topic HL7GW_DLQ_TOPIC=$topic.dlq RUST_LOG=warn \
  target/release/hl7gw-ingress --mllp-addr 127.0.0.1:22575 --grpc-addr 127.0.0.1:22576 \
  --admin-addr 127.0.0.1:29464 >/dev/null &
ingress=$!
hostile_pid=""
cleanup() {
  [ -z "$hostile_pid" ] || kill "$hostile_pid" 2>/dev/null || true
  kill -TERM "$ingress" 2>/dev/null && wait "$ingress" 2>/dev/null || true
  scripts/kafka.sh down >&2 || true
}
trap cleanup EXIT
for _ in $(seq 300); do curl -fsS http://127.0.0.1:29464/readyz >/dev/null 2>&1 && break; sleep 0.2; done
target/release/hl7gw-load --to 127.0.0.1:22575 --messages 500 --warmup 0 >/dev/null
results=target/bench-hostile.jsonl
: >"$results"
for abuse in none slow idle noread grpc-idle grpc-watch; do
  to=(--to 127.0.0.1:22575)
  hostile_pid=""
  if [ "$abuse" != none ]; then
    port=22575
    case $abuse in grpc-*) port=22576; to=(--to 127.0.0.1:22576 --grpc) ;; esac
    python3 scripts/lib/hostile.py "$abuse" "127.0.0.1:$port" "$hostile" $((warm + secs + 5)) \
      >target/bench-hostile.$abuse.json &
    hostile_pid=$!
    sleep "$warm"
  fi
  python3 - "$abuse" "$ingress" "$broker" "${to[@]}" --clients 1 --duration "$secs" --warmup 0 \
    --timeout 10 >>"$results" <<'PY'
import json, sys, threading, time, urllib.request
sys.path.insert(0, "scripts/lib")
from loadrun import measure

abuse, ingress, broker, load_args = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
COUNTED = {
    "evicted": "hl7gw_ingress_connections_evicted_total",
    "idle_closes": "hl7gw_ingress_idle_closes_total",
    "frame_timeouts": 'hl7gw_ingress_framing_errors_total{reason="frame_timeout"}',
    "write_timeouts": "hl7gw_ingress_write_timeouts_total",
    "refused": 'hl7gw_ingress_connections_refused_total{reason="max_connections"}',
    "refused_address": 'hl7gw_ingress_connections_refused_total{reason="max_connections_per_address"}',
    "grpc_refused_address": 'hl7gw_grpc_connections_closed_total{reason="max_connections_per_address"}',
    "grpc_evicted": 'hl7gw_grpc_connections_closed_total{reason="evicted"}',
    "budget_waits": "hl7gw_ingress_budget_waits_total",
}


def counters():
    text = urllib.request.urlopen("http://127.0.0.1:29464/metrics").read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("hl7gw_"):
            name, _, v = line.rpartition(" ")
            values[name] = float(v)
    return {k: values.get(series, 0.0) for k, series in COUNTED.items()}


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


probes = {"ok": 0, "all": 0}
running = threading.Event()


def probe():
    """The chart's readiness probe (/readyz on the admin port), every 0.5 s with its 2 s timeout."""
    while not running.is_set():
        probes["all"] += 1
        try:
            if urllib.request.urlopen("http://127.0.0.1:29464/readyz", timeout=2).status == 200:
                probes["ok"] += 1
        except OSError:
            pass
        time.sleep(0.5)


before = counters()
prober = threading.Thread(target=probe)
prober.start()
try:
    row = measure(load_args, {"ingress": ingress, "broker": broker})
except SystemExit as e:  # the normal sender could not even start
    row = {"msgs_per_sec": 0.0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "ingress_us": 0.0,
           "errors": str(e)}
running.set()
prober.join()
after = counters()
row.update({k: int(after[k] - before[k]) for k in COUNTED})
row["ready"] = f"{probes['ok']}/{probes['all']}"
print(json.dumps({"abuse": abuse, **row, "ingress_rss_mib": round(rss_mib(ingress), 1)}))
PY
  if [ -n "$hostile_pid" ]; then
    kill "$hostile_pid" 2>/dev/null || true
    wait "$hostile_pid" 2>/dev/null || true
    hostile_pid=""
    sleep 2
  fi
done
echo "hl7gw-ingress defaults, $hostile hostile connections per abuse (${warm} s before the normal sender), normal sender 1 client x ${secs} s:"
# shellcheck source=scripts/lib/benchinfo.sh
. scripts/lib/benchinfo.sh
bench_info bench-hostile bench.
python3 scripts/lib/loadrun.py table "$results" abuse msgs_per_sec=msg/s=,.0f "p50_ms=p50 ms=.2f" \
  "p99_ms=p99 ms=.2f" "max_ms=max ms=.1f" errors=errors "ingress_rss_mib=ingress RSS MiB=.0f" \
  "ingress_us=ingress CPU µs/msg=.1f" evicted=evicted=d idle_closes=idle=d "frame_timeouts=frame timeouts=d" \
  "write_timeouts=write timeouts=d" refused=refused=d "refused_address=refused (per address)=d" \
  "grpc_refused_address=gRPC refused (per address)=d" "grpc_evicted=gRPC evicted=d" ready=ready \
  "budget_waits=budget waits=d"
