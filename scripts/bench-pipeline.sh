#!/usr/bin/env bash
# `make bench-pipeline`: the whole pipeline in release on this machine: hl7gw-load (8 clients, BENCH_SECONDS,
# default 30) -> ingress (durable) -> Kafka -> transformer (examples/pipeline/routes.yaml) -> Kafka -> egress ->
# `hl7gw receive` (stores each message; without fsync unless BENCH_RECEIVER_SYNC=1, so the figure is the
# gateway's, not this disk's: one fsync costs several ms here, and the egress has one message in flight per
# partition). Destination topics get BENCH_PARTITIONS (12) partitions. Everything shares the machine's cores.
# Prints messages/s delivered, end-to-end latency (ingress receive -> receiver ACK, from the egress's
# hl7gw_egress_end_to_end_seconds histogram, interpolated within buckets as Prometheus' histogram_quantile
# does), and checks that every ACKed control id reached the receiver. Results also go to target/bench-pipeline.json.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_SECONDS:-30}
clients=${BENCH_CLIENTS:-8}
export KAFKA_PORT=29092 KAFKA_DATA_DIR="$PWD/target/kafka-bench"
cargo build --release -p hl7gw-ingress -p hl7gw-transformer -p hl7gw-egress -p hl7gw-cli -p hl7gw-load >&2
scripts/kafka.sh up
out=target/bench-pipeline
rm -rf "$out"
mkdir -p "$out"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  scripts/kafka.sh down || true
}
trap cleanup EXIT
run="bench$(date +%s)"
export HL7GW_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT RUST_LOG=warn
cat >"$out/egress.yaml" <<YAML
destinations:
  lab:
    address: 127.0.0.1:22576
    retry: {initial_backoff: 100ms, max_backoff: 1s}
YAML
sync_flag=--no-sync
[[ "${BENCH_RECEIVER_SYNC:-0}" == 1 ]] && sync_flag=
target/release/hl7gw receive --listen 127.0.0.1:22576 --out "$out/received" $sync_flag >/dev/null 2>"$out/receiver.log" &
pids+=($!)
HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq target/release/hl7gw-ingress \
  --mllp-addr 127.0.0.1:22575 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29464 >/dev/null 2>"$out/ingress.log" &
pids+=($!)
HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq HL7GW_OUT_TOPIC_PREFIX=$run.out. HL7GW_GROUP_ID=$run.t \
HL7GW_BATCH_LINGER=${BENCH_BATCH_LINGER:-5ms} HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS=${BENCH_PARTITIONS:-12} \
HL7GW_ROUTES__FILE=examples/pipeline/routes.yaml target/release/hl7gw-transformer \
  --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29465 >/dev/null 2>"$out/transformer.log" &
pids+=($!)
HL7GW_DLQ_TOPIC=$run.dlq HL7GW_OUT_TOPIC_PREFIX=$run.out. HL7GW_GROUP_PREFIX=$run.e target/release/hl7gw-egress \
  --config "$out/egress.yaml" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29466 >/dev/null 2>"$out/egress.log" &
pids+=($!)
for port in 29464 29465 29466; do
  for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
done
start=$(date +%s.%N)
json=$(target/release/hl7gw-load --to 127.0.0.1:22575 --clients "$clients" --duration "$secs" --warmup 0 \
  --record-acked "$out/acked.txt" --json || true)
acked=$(wc -l <"$out/acked.txt")
# Wait for the receiver to hold every ACKed message (or give up after 180 s).
last=0
for _ in $(seq 900); do
  n=$(find "$out/received" -maxdepth 1 -name '*.hl7' | wc -l)
  if [[ $n -ne $last ]]; then last=$n; end=$(date +%s.%N); fi
  [[ $n -ge $acked ]] && break
  sleep 0.2
done
curl -fsS http://127.0.0.1:29466/metrics >"$out/egress.metrics"
python3 - "$out" "$start" "$end" "$acked" "$clients" "$secs" "$json" <<'PY' | tee target/bench-pipeline.json
import json, os, sys
out, start, end, acked, clients, secs, raw = sys.argv[1:8]
ids = set(open(f"{out}/acked.txt").read().split())
got = {}
for name in os.listdir(f"{out}/received"):
    if name.endswith(".hl7"):
        cid = name.split("-", 1)[1][:-4]
        got[cid] = got.get(cid, 0) + 1
missing = len(ids - set(got))
dups = sum(n - 1 for n in got.values())
buckets = []
for line in open(f"{out}/egress.metrics"):
    if line.startswith("hl7gw_egress_end_to_end_seconds_bucket"):
        le = line.split('le="')[1].split('"')[0]
        buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
buckets.sort()
total = buckets[-1][1] if buckets else 0
def q(p):
    rank, prev_le, prev_n = p * total, 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_n) / max(n - prev_n, 1e-9))
        prev_le, prev_n = le, n
    return float("nan")
load = json.loads(raw) if raw else {}
elapsed = float(end) - float(start)
print(json.dumps({
    "clients": int(clients), "seconds": int(secs), "acked": int(acked),
    "ingress_msgs_per_sec": round(load.get("msgs_per_sec", 0)),
    "delivered": len(got), "delivered_msgs_per_sec": round(len(got) / elapsed),
    "first_to_last_delivery_s": round(elapsed, 1),
    "e2e_p50_ms": round(q(0.5) * 1000, 1), "e2e_p99_ms": round(q(0.99) * 1000, 1),
    "lost": missing, "duplicates": dups,
}))
sys.exit(1 if missing else 0)
PY
