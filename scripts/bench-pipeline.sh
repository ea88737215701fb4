#!/usr/bin/env bash
# `make bench-pipeline`: the whole pipeline in release on this machine: hl7gw-load (BENCH_CLIENTS=8) -> ingress
# (durable) -> Kafka -> transformer (examples/pipeline/routes.yaml) -> Kafka -> egress -> a receiver, all sharing
# the machine's cores with a single-node Kafka (its own port, BENCH_KAFKA_PORT=29792).
#
# The receiver (BENCH_RECEIVER): `ack` (default) answers AA and appends each control id to a file, so it costs
# next to nothing per message (loadtest/examples/fixed_ack_server.rs); `files` is `hl7gw receive`, a file per
# message (without fsync unless BENCH_RECEIVER_SYNC=1).
#
# Two parts, each printed as a table and written to target/bench-pipeline.json:
# - max: the clients as fast as ACKs come back for BENCH_SECONDS (30): delivered msg/s, end-to-end p50/p99
#   (ingress receive -> receiver ACK, the egress's hl7gw_egress_end_to_end_seconds histogram over the run,
#   interpolated within buckets as Prometheus' histogram_quantile does), and the CPU time (user+system, from
#   /proc) of every process per delivered message: ingress, transformer, egress, broker, receiver, load client.
# - curve: fixed offered rates (BENCH_RATES, default "500 1000 2000 4000", then half the max) for
#   BENCH_CURVE_SECONDS (20) each (after an unreported warm-up of 1,500 messages per client), open loop (hl7gw-load --rate, timed from each message's scheduled send):
#   offered vs. achieved, the sender's p99 and the end-to-end p50/p99. BENCH_RATES="" skips it.
# BENCH_WORKER_PROPERTIES (e.g. '{"fetch.min.bytes"="8192"}') is kafka.properties for the transformer and the
# egress, to measure consumer settings.
# BENCH_IN_FLIGHT (1) pipelines that many messages per client (hl7gw-load --in-flight): the senders of a feed
# that does not wait for each ACK, fewer Kafka requests per message.
# Every ACKed control id must reach the receiver (lost: 0), or the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_SECONDS=${BENCH_SECONDS:-30} BENCH_CLIENTS=${BENCH_CLIENTS:-8} BENCH_IN_FLIGHT=${BENCH_IN_FLIGHT:-1}
export BENCH_RATES=${BENCH_RATES-500 1000 2000 4000} BENCH_CURVE_SECONDS=${BENCH_CURVE_SECONDS:-20}
receiver=${BENCH_RECEIVER:-ack}
export KAFKA_PORT=${BENCH_KAFKA_PORT:-29792} KAFKA_DATA_DIR="$PWD/target/kafka-bench-pipeline"
cargo build --release -p hl7gw-ingress -p hl7gw-transformer -p hl7gw-egress -p hl7gw-cli -p hl7gw-load \
  --bins --examples >&2
scripts/kafka.sh up
out=target/bench-pipeline
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/procs.sh
. scripts/lib/procs.sh
trap 'stop_children; scripts/kafka.sh down || true' EXIT
run="bench$(date +%s)"
# librdkafka statistics every second: the Kafka requests per delivered message, by service and API, come from them.
export HL7GW_KAFKA__BROKERS=127.0.0.1:$KAFKA_PORT RUST_LOG=warn HL7GW_KAFKA__STATISTICS_INTERVAL=1s
cat >"$out/egress.yaml" <<YAML
destinations:
  lab:
    address: 127.0.0.1:22576
    retry: {initial_backoff: 100ms, max_backoff: 1s}
YAML
case $receiver in
  ack) target/release/examples/fixed_ack_server 22576 1 "$out/received.ids" >/dev/null 2>"$out/receiver.log" & ;;
  files)
    sync_flag=--no-sync
    [[ "${BENCH_RECEIVER_SYNC:-0}" == 1 ]] && sync_flag=
    target/release/hl7gw receive --listen 127.0.0.1:22576 --out "$out/received" $sync_flag >/dev/null \
      2>"$out/receiver.log" & ;;
  *) echo "bench-pipeline: BENCH_RECEIVER is ack or files, not $receiver" >&2; exit 2 ;;
esac
receiver_pid=$!
pids+=("$receiver_pid")
HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq target/release/hl7gw-ingress \
  --mllp-addr 127.0.0.1:22575 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29464 >/dev/null 2>"$out/ingress.log" &
ingress_pid=$!
pids+=("$ingress_pid")
HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq HL7GW_OUT_TOPIC_PREFIX=$run.out. HL7GW_GROUP_ID=$run.t \
HL7GW_BATCH_LINGER=${BENCH_BATCH_LINGER:-5ms} HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS=${BENCH_PARTITIONS:-12} \
HL7GW_ROUTES__FILE=examples/pipeline/routes.yaml HL7GW_KAFKA__PROPERTIES=${BENCH_WORKER_PROPERTIES:-{\}} \
  target/release/hl7gw-transformer \
  --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29465 >/dev/null 2>"$out/transformer.log" &
transformer_pid=$!
pids+=("$transformer_pid")
HL7GW_DLQ_TOPIC=$run.dlq HL7GW_OUT_TOPIC_PREFIX=$run.out. HL7GW_GROUP_PREFIX=$run.e \
  HL7GW_KAFKA__PROPERTIES=${BENCH_WORKER_PROPERTIES:-{\}} target/release/hl7gw-egress \
  --config "$out/egress.yaml" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29466 >/dev/null 2>"$out/egress.log" &
egress_pid=$!
pids+=("$egress_pid")
for port in 29464 29465 29466; do
  for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
done
python3 - "$out" "$receiver" "$ingress_pid" "$transformer_pid" "$egress_pid" "$(cat "$KAFKA_DATA_DIR/kafka.pid")" \
  "$receiver_pid" <<'PY' | tee target/bench-pipeline.json
import json, os, resource, subprocess, sys, time, urllib.request
out, receiver = sys.argv[1:3]
procs = dict(zip(["ingress", "transformer", "egress", "broker", "receiver"], sys.argv[3:8]))
secs, clients = int(os.environ["BENCH_SECONDS"]), int(os.environ["BENCH_CLIENTS"])
rates, curve_secs = [float(r) for r in os.environ["BENCH_RATES"].split()], int(os.environ["BENCH_CURVE_SECONDS"])
sys.path.insert(0, "scripts/lib")
from loadrun import TICKS_PER_SECOND as tck, ticks

class Delivered:
    """Distinct control ids the receiver holds, read incrementally."""
    def __init__(self):
        self.ids, self.offset, self.copies = set(), 0, 0
    def poll(self):
        if receiver == "ack":
            path = f"{out}/received.ids"
            if os.path.exists(path):
                with open(path, "rb") as f:
                    f.seek(self.offset)
                    chunk = f.read()
                done = chunk.rfind(b"\n") + 1
                self.offset += done
                for cid in chunk[:done].split():
                    self.copies += 1
                    self.ids.add(cid.decode())
        elif os.path.isdir(f"{out}/received"):
            names = [n for n in os.listdir(f"{out}/received") if n.endswith(".hl7")]
            self.copies = len(names)
            self.ids = {n.split("-", 1)[1][:-4] for n in names}
        return len(self.ids)

delivered = Delivered()

def buckets():
    text = urllib.request.urlopen("http://127.0.0.1:29466/metrics").read().decode()
    b = {}
    for line in text.splitlines():
        if line.startswith("hl7gw_egress_end_to_end_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            b[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    return b

def quantile(before, after, p):
    bs = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = bs[-1][1] if bs else 0
    rank, prev_le, prev_n = p * total, 0.0, 0.0
    for le, n in bs:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_n) / max(n - prev_n, 1e-9))
        prev_le, prev_n = le, n
    return float("nan")

all_acked = set()
admin = {"ingress": 29464, "transformer": 29465, "egress": 29466}

def transformer():
    """The transformer's committed transactions and the summed time of its batches (route, produce, commit)."""
    n, secs = 0.0, 0.0
    for line in urllib.request.urlopen("http://127.0.0.1:29465/metrics").read().decode().splitlines():
        if line.startswith("hl7gw_transformer_transactions_total{") and 'result="committed"' in line:
            n += float(line.split()[-1])
        elif line.startswith("hl7gw_transformer_batch_duration_seconds_sum"):
            secs += float(line.split()[-1])
    return n, secs

def requests():
    """hl7gw_kafka_requests_total summed by service and API (librdkafka statistics, every second)."""
    n = {}
    for svc, port in admin.items():
        for line in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode().splitlines():
            if line.startswith("hl7gw_kafka_requests_total{"):
                api = line.split('api="')[1].split('"')[0]
                n[(svc, api)] = n.get((svc, api), 0.0) + float(line.split()[-1])
    return n

def phase(name, extra):
    """One load run, then waits until the receiver holds every id it ACKed (or 180 s without progress)."""
    acked_file = f"{out}/acked-{name}.txt"
    x0, q0, b0, t0 = transformer(), requests(), buckets(), {k: ticks(v) for k, v in procs.items()}
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    have0 = delivered.poll()
    start = time.time()
    r = subprocess.run(["target/release/hl7gw-load", "--to", "127.0.0.1:22575", "--clients", str(clients),
                        "--warmup", "0", "--record-acked", acked_file, "--json",
                        "--in-flight", os.environ["BENCH_IN_FLIGHT"]] + extra,
                       capture_output=True, text=True)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = json.loads(r.stdout) if r.stdout.strip() else {}
    acked = set(open(acked_file).read().split())
    all_acked.update(acked)
    end, last, idle_since = time.time(), delivered.poll(), time.time()
    while not acked <= delivered.ids and time.time() - idle_since < 180:
        time.sleep(0.2)
        n = delivered.poll()
        if n != last:
            last, end, idle_since = n, time.time(), time.time()
    t1, b1 = {k: ticks(v) for k, v in procs.items()}, buckets()
    time.sleep(1.2)  # one more statistics report
    q1, x1 = requests(), transformer()
    txns = max(x1[0] - x0[0], 1)
    got = delivered.poll() - have0
    per_msg = {f"{svc}.{api}": round((q1[k] - q0.get(k, 0.0)) / max(got, 1), 3)
               for k in sorted(q1) for svc, api in [k] if q1[k] > q0.get(k, 0.0)}
    cpu = {k: round((t1[k] - t0[k]) * 1e6 / tck / max(got, 1), 1) for k in procs}
    cpu["load"] = round(((c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)) * 1e6 / max(got, 1), 1)
    cpu["total"] = round(sum(cpu[k] for k in ("ingress", "transformer", "egress", "broker")), 1)
    return {
        "phase": name, "acked": len(acked), "delivered": got,
        "ingress_msgs_per_sec": round(load.get("msgs_per_sec", 0)),
        "delivered_msgs_per_sec": round(got / max(end - start, 1e-9)),
        "sender_p99_ms": load.get("latency_us", {}).get("p99", 0) / 1000,
        "late_sends": load.get("late_sends", 0),
        "e2e_p50_ms": round(quantile(b0, b1, 0.5) * 1000, 1), "e2e_p99_ms": round(quantile(b0, b1, 0.99) * 1000, 1),
        "cpu_us_per_delivered": cpu,
        "kafka_requests_per_delivered": per_msg,
        "transformer_messages_per_transaction": round(got / txns, 1),
        "transformer_batch_ms_mean": round((x1[1] - x0[1]) * 1000 / txns, 1),
    }

# Warm-up, not reported: the broker's JIT and the topics' first segments (the first run was half as fast).
phase("warmup", ["--messages", "1500"])
rows = [phase("max", ["--duration", str(secs)])]
maximum = rows[0]["delivered_msgs_per_sec"]
for rate in rates + ([round(maximum / 2)] if rates and maximum else []):
    row = phase(f"rate-{int(rate)}", ["--duration", str(curve_secs), "--rate", str(rate / clients)])
    row["offered_msgs_per_sec"] = int(rate)
    rows.append(row)
delivered.poll()
lost = len(all_acked - delivered.ids)
summary = {"clients": clients, "in_flight": int(os.environ["BENCH_IN_FLIGHT"]), "seconds": secs, "receiver": receiver, "acked": len(all_acked),
           "lost": lost, "duplicates": delivered.copies - len(delivered.ids), "phases": rows}
print(json.dumps(summary))
m = rows[0]
c = m["cpu_us_per_delivered"]
print("\n| run | offered msg/s | ingress msg/s | delivered msg/s | sender p99 ms | e2e p50 ms | e2e p99 ms | late sends |",
      file=sys.stderr)
print("|---|---:|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
for r in rows:
    print(f'| {r["phase"]} | {r.get("offered_msgs_per_sec", "max")} | {r["ingress_msgs_per_sec"]:,} | '
          f'{r["delivered_msgs_per_sec"]:,} | {r["sender_p99_ms"]:.2f} | {r["e2e_p50_ms"]} | {r["e2e_p99_ms"]} | '
          f'{r["late_sends"]} |', file=sys.stderr)
print("\nCPU µs per delivered message (max run): | ingress | transformer | egress | broker | total (these four) | "
      "receiver | load client |", file=sys.stderr)
print(f'| {c["ingress"]} | {c["transformer"]} | {c["egress"]} | {c["broker"]} | {c["total"]} | {c["receiver"]} | '
      f'{c["load"]} |', file=sys.stderr)
print(f'\nTransformer (max run): {m["transformer_messages_per_transaction"]} messages per transaction, a batch '
      f'(route, produce, commit) takes {m["transformer_batch_ms_mean"]} ms on average', file=sys.stderr)
print("\nKafka requests per delivered message (max run): "
      + ", ".join(f"{k} {v}" for k, v in m["kafka_requests_per_delivered"].items()), file=sys.stderr)
print(f"\nacked {len(all_acked)}, lost {lost}, duplicate deliveries {summary['duplicates']}", file=sys.stderr)
sys.exit(1 if lost else 0)
PY
