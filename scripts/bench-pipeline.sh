#!/usr/bin/env bash
# `make bench-pipeline`: the whole pipeline in release on this machine: hl7gw-load (BENCH_CLIENTS=8) -> ingress
# (durable) -> Kafka -> transformer (examples/pipeline/routes.yaml) -> Kafka -> egress -> a receiver, all sharing
# the machine's cores with Kafka (its own port, BENCH_KAFKA_PORT=29792; KAFKA_NODES=3 for the 3-broker cluster).
# The broker's data is wiped at the start, so runs being compared start alike.
#
# The receiver (BENCH_RECEIVER): `ack` (default) answers AA and appends each control id to a file, so it costs
# next to nothing per message (loadtest/examples/fixed_ack_server.rs); `files` is `hl7gw receive`, a file per
# message (without fsync unless BENCH_RECEIVER_SYNC=1).
#
# Two parts, each printed as a table and written to target/bench-pipeline.json, under the settings the run had
# (commit, topics with their partition counts as the broker reports them, broker settings):
# - max: the clients as fast as ACKs come back for BENCH_SECONDS (30) (BENCH_MAX=0 skips it): delivered msg/s,
#   end-to-end p50/p99/p99.9 (ingress receive -> receiver ACK, the egress's hl7gw_egress_end_to_end_seconds
#   histogram over the run, interpolated within buckets as Prometheus' histogram_quantile does), and the CPU time
#   (user+system, from /proc) of every process per delivered message: ingress, transformer, egress, broker(s),
#   receiver, load client.
# - curve: fixed offered rates (BENCH_RATES, default "500 1000 2000 4000", then half the max) for
#   BENCH_CURVE_SECONDS (20) each, open loop (hl7gw-load --rate, timed from each message's scheduled send):
#   offered vs. achieved, the sender's p99 and the end-to-end p50/p99. BENCH_RATES="" skips it, BENCH_HALF_MAX=0
#   skips the half-the-max rate.
# Before them an unreported warm-up of BENCH_WARMUP_SECONDS (60) at the maximum: a fresh broker's JIT compiler
# takes ~40% of its CPU in its first minute under this load (measured with BENCH_BROKER_PROFILE=1: 20 s of C2
# CPU time in the first 42 s, 1 s in the 15 s after 75 s), so a phase after a short warm-up measures the JIT.
# BENCH_KEEP_BROKER=1 uses the broker that is running (already warm) and leaves it running: runs of settings
# being compared can share one warm broker.
# Topics are created before the services start: the inbound topic with BENCH_PARTITIONS (3: the services' own
# kafka.create_topics_partitions and the sizing rule for one broker, docs/BENCHMARKS.md), the output and
# dead-letter topics with BENCH_OUT_PARTITIONS (BENCH_PARTITIONS).
# BENCH_BATCH_LINGER (5ms) and BENCH_BATCH_INTERVAL (20ms) are the transformer's batch_linger and batch_interval.
# BENCH_WORKER_PROPERTIES (e.g. '{"fetch.min.bytes"="8192"}') is kafka.properties for the transformer and the
# egress, to measure consumer settings; BENCH_INGRESS_ENV, BENCH_TRANSFORMER_ENV, BENCH_EGRESS_ENV add
# NAME=VALUE settings to one service (e.g. BENCH_INGRESS_ENV=HL7GW_KAFKA__MAX_IN_FLIGHT=1); KAFKA_EXTRA_PROPERTIES
# adds broker settings (scripts/kafka.sh).
# BENCH_IN_FLIGHT (1) pipelines that many messages per client (hl7gw-load --in-flight): the senders of a feed
# that does not wait for each ACK, fewer Kafka requests per message.
# BENCH_BROKER_PROFILE=1 (`make bench-broker-profile`): the broker's CPU of each phase split by cause (request
# handling by API, log appends, network threads, GC, ...) from its threads' CPU time, a Flight Recording and its
# request counts (scripts/lib/brokerprof.py); one broker only.
# BENCH_FHIR=1 (`make bench-pipeline-fhir`, issue 28) adds examples/pipeline/routes.yaml's `adt-to-fhir` route:
# every ADT also becomes a FHIR R4 transaction Bundle (toFhir) that the egress POSTs to `hl7gw receive --http
# --no-sync` (a file per Bundle), so each ACKed message is delivered twice, over MLLP and over HTTP; without it
# (the default, as in the runs before issue 28) that route is left out. Delivered counts the MLLP receiver's ids;
# the FHIR receiver's files are counted once the run is over (they must be as many).
# Every ACKed control id must reach the receiver (lost: 0), or the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_SECONDS=${BENCH_SECONDS:-30} BENCH_CLIENTS=${BENCH_CLIENTS:-8} BENCH_IN_FLIGHT=${BENCH_IN_FLIGHT:-1}
export BENCH_RATES=${BENCH_RATES-500 1000 2000 4000} BENCH_CURVE_SECONDS=${BENCH_CURVE_SECONDS:-20}
export BENCH_MAX=${BENCH_MAX:-1} BENCH_WARMUP_SECONDS=${BENCH_WARMUP_SECONDS:-60} BENCH_BROKER_PROFILE=${BENCH_BROKER_PROFILE:-0}
partitions=${BENCH_PARTITIONS:-3}
out_partitions=${BENCH_OUT_PARTITIONS:-$partitions}
receiver=${BENCH_RECEIVER:-ack}
export KAFKA_NODES=${KAFKA_NODES:-1}
export KAFKA_PORT=${BENCH_KAFKA_PORT:-29792} KAFKA_DATA_DIR="$PWD/target/kafka-bench-pipeline-$KAFKA_NODES"
if [ "$BENCH_BROKER_PROFILE" = 1 ]; then
  [ "$KAFKA_NODES" = 1 ] || { echo "bench-pipeline: BENCH_BROKER_PROFILE=1 profiles one broker (KAFKA_NODES=1)" >&2; exit 2; }
  KAFKA_JVM_OPTS="${KAFKA_JVM_OPTS:-} $(python3 -c 'import sys; sys.path.insert(0, "scripts/lib"); import brokerprof
print(brokerprof.JMX_OPTS, brokerprof.JFR_OPTS)')"
  export KAFKA_JVM_OPTS
fi
cargo build --release -p hl7gw-ingress -p hl7gw-transformer -p hl7gw-egress -p hl7gw-cli -p hl7gw-load \
  --bins --examples >&2
keep=${BENCH_KEEP_BROKER:-0}
if [ "$keep" = 1 ] && scripts/kafka.sh status >/dev/null 2>&1; then
  echo "bench-pipeline: BENCH_KEEP_BROKER=1, the running broker is used as it is (and left running)" >&2
else
  scripts/kafka.sh fresh
fi
out=target/bench-pipeline
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/procs.sh
. scripts/lib/procs.sh
trap 'stop_children; [ "$keep" = 1 ] || scripts/kafka.sh down || true' EXIT
run="bench$(date +%s)"
brokers=$(scripts/kafka.sh brokers)
broker_pids=$(for i in $(seq "$KAFKA_NODES"); do
  if [ "$KAFKA_NODES" = 1 ]; then cat "$KAFKA_DATA_DIR/kafka.pid"; else cat "$KAFKA_DATA_DIR/node-$i/kafka.pid"; fi
done | paste -sd,)
scripts/kafka.sh create-topic "$run.inbound" "$partitions"
scripts/kafka.sh create-topic "$run.out.lab" "$out_partitions"
scripts/kafka.sh create-topic "$run.dlq" "$out_partitions"
# librdkafka statistics every second: the Kafka requests per delivered message, by service and API, come from them.
export HL7GW_KAFKA__BROKERS=$brokers RUST_LOG=warn HL7GW_KAFKA__STATISTICS_INTERVAL=1s
cat >"$out/egress.yaml" <<YAML
destinations:
  lab:
    address: 127.0.0.1:22576
    retry: {initial_backoff: 100ms, max_backoff: 1s}
YAML
fhir=${BENCH_FHIR:-0}
if [ "$fhir" = 1 ]; then
  routes=examples/pipeline/routes.yaml
  cat >>"$out/egress.yaml" <<YAML
  fhir:
    url: http://127.0.0.1:22577/fhir
    retry: {initial_backoff: 100ms, max_backoff: 1s}
YAML
  target/release/hl7gw receive --http --no-sync --listen 127.0.0.1:22577 --out "$out/received-fhir" >/dev/null \
    2>"$out/receiver-fhir.log" &
  pids+=($!)
else
  # The example routes without the FHIR one (documents are separated by ---).
  routes=$out/routes.yaml
  python3 - examples/pipeline/routes.yaml "$routes" <<'PY'
import re, sys
docs = re.split(r"(?m)^---\s*$", open(sys.argv[1]).read())
open(sys.argv[2], "w").write("---".join(d for d in docs if "name: adt-to-fhir" not in d))
PY
fi
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
read -r -a ingress_env <<<"${BENCH_INGRESS_ENV:-}"
read -r -a transformer_env <<<"${BENCH_TRANSFORMER_ENV:-}"
read -r -a egress_env <<<"${BENCH_EGRESS_ENV:-}"
env HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq "${ingress_env[@]}" target/release/hl7gw-ingress \
  --mllp-addr 127.0.0.1:22575 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29464 >/dev/null 2>"$out/ingress.log" &
ingress_pid=$!
pids+=("$ingress_pid")
env HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq HL7GW_OUT_TOPIC_PREFIX=$run.out. HL7GW_GROUP_ID=$run.t \
  HL7GW_BATCH_LINGER="${BENCH_BATCH_LINGER:-5ms}" HL7GW_BATCH_INTERVAL="${BENCH_BATCH_INTERVAL:-20ms}" \
  HL7GW_KAFKA__CREATE_TOPICS_PARTITIONS="$out_partitions" \
  HL7GW_ROUTES__FILE="$routes" HL7GW_KAFKA__PROPERTIES="${BENCH_WORKER_PROPERTIES:-{\}}" \
  "${transformer_env[@]}" target/release/hl7gw-transformer \
  --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29465 >/dev/null 2>"$out/transformer.log" &
transformer_pid=$!
pids+=("$transformer_pid")
env HL7GW_DLQ_TOPIC=$run.dlq HL7GW_OUT_TOPIC_PREFIX=$run.out. HL7GW_GROUP_PREFIX=$run.e \
  HL7GW_KAFKA__PROPERTIES="${BENCH_WORKER_PROPERTIES:-{\}}" "${egress_env[@]}" target/release/hl7gw-egress \
  --config "$out/egress.yaml" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29466 >/dev/null 2>"$out/egress.log" &
egress_pid=$!
pids+=("$egress_pid")
for port in 29464 29465 29466; do
  for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
done
# What ran, printed above the tables: the settings a figure depends on.
# shellcheck source=scripts/lib/benchinfo.sh
. scripts/lib/benchinfo.sh
{
  bench_info bench-pipeline
  echo "settings: clients=$BENCH_CLIENTS in_flight=$BENCH_IN_FLIGHT seconds=$BENCH_SECONDS rates='$BENCH_RATES' curve_seconds=$BENCH_CURVE_SECONDS warmup_seconds=$BENCH_WARMUP_SECONDS batch_linger=${BENCH_BATCH_LINGER:-5ms} batch_interval=${BENCH_BATCH_INTERVAL:-20ms} worker_properties='${BENCH_WORKER_PROPERTIES:-{\}}' ingress_env='${BENCH_INGRESS_ENV:-}' transformer_env='${BENCH_TRANSFORMER_ENV:-}' egress_env='${BENCH_EGRESS_ENV:-}' receiver=$receiver fhir=$fhir routes=$routes brokers=$KAFKA_NODES ($brokers)"
} >"$out/settings.txt"
cat "$out/settings.txt" >&2
python3 - "$out" "$receiver" "$ingress_pid" "$transformer_pid" "$egress_pid" "$broker_pids" \
  "$receiver_pid" <<'PY' | tee target/bench-pipeline.json
import json, os, resource, subprocess, sys, time, urllib.request
out, receiver = sys.argv[1:3]
procs = dict(zip(["ingress", "transformer", "egress", "broker", "receiver"], sys.argv[3:8]))
broker_pids = procs["broker"].split(",")
profile = os.environ["BENCH_BROKER_PROFILE"] == "1"
secs, clients = int(os.environ["BENCH_SECONDS"]), int(os.environ["BENCH_CLIENTS"])
rates, curve_secs = [float(r) for r in os.environ["BENCH_RATES"].split()], int(os.environ["BENCH_CURVE_SECONDS"])
sys.path.insert(0, "scripts/lib")
from loadrun import TICKS_PER_SECOND as tck, ticks as ticks1
import brokerprof


def ticks(pid):
    """CPU ticks of a process, or of several (the brokers of a cluster: "pid,pid,pid")."""
    return sum(ticks1(p) for p in str(pid).split(","))


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
    prof = brokerprof.Phase(broker_pids[0], name, out) if profile and name != "warmup" else None
    if prof:
        prof.start()
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
    if prof:
        prof.stop()
    time.sleep(1.2)  # one more statistics report
    q1, x1 = requests(), transformer()
    txns = max(x1[0] - x0[0], 1)
    got = delivered.poll() - have0
    per_msg = {f"{svc}.{api}": round((q1[k] - q0.get(k, 0.0)) / max(got, 1), 3)
               for k in sorted(q1) for svc, api in [k] if q1[k] > q0.get(k, 0.0)}
    cpu = {k: round((t1[k] - t0[k]) * 1e6 / tck / max(got, 1), 1) for k in procs}
    cpu["load"] = round(((c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)) * 1e6 / max(got, 1), 1)
    cpu["total"] = round(sum(cpu[k] for k in ("ingress", "transformer", "egress", "broker")), 1)
    row = {
        "phase": name, "acked": len(acked), "delivered": got,
        "ingress_msgs_per_sec": round(load.get("msgs_per_sec", 0)),
        "delivered_msgs_per_sec": round(got / max(end - start, 1e-9)),
        "sender_p99_ms": load.get("latency_us", {}).get("p99", 0) / 1000,
        "late_sends": load.get("late_sends", 0),
        "e2e_p50_ms": round(quantile(b0, b1, 0.5) * 1000, 1), "e2e_p99_ms": round(quantile(b0, b1, 0.99) * 1000, 1),
        "e2e_p999_ms": round(quantile(b0, b1, 0.999) * 1000, 1),
        "cpu_us_per_delivered": cpu,
        "kafka_requests_per_delivered": per_msg,
        "transformer_messages_per_transaction": round(got / txns, 1),
        "transformer_batch_ms_mean": round((x1[1] - x0[1]) * 1000 / txns, 1),
    }
    if prof:
        row.update(prof.result(got))
    return row

# Warm-up, not reported: the broker's JIT and the topics' first segments (the first run was half as fast).
phase("warmup", ["--duration", os.environ["BENCH_WARMUP_SECONDS"]])
rows = [phase("max", ["--duration", str(secs)])] if os.environ["BENCH_MAX"] == "1" else []
maximum = rows[0]["delivered_msgs_per_sec"] if rows else 0
half = [round(maximum / 2)] if rates and maximum and os.environ.get("BENCH_HALF_MAX", "1") == "1" else []
for rate in rates + half:
    row = phase(f"rate-{int(rate)}", ["--duration", str(curve_secs), "--rate", str(rate / clients)])
    row["offered_msgs_per_sec"] = int(rate)
    rows.append(row)
delivered.poll()
lost = len(all_acked - delivered.ids)
settings = open(f"{out}/settings.txt").read()
summary = {"settings": settings, "clients": clients, "in_flight": int(os.environ["BENCH_IN_FLIGHT"]), "seconds": secs, "receiver": receiver, "acked": len(all_acked),
           "lost": lost, "duplicates": delivered.copies - len(delivered.ids), "phases": rows}
print(json.dumps(summary))
print("\n" + settings, file=sys.stderr)
print("| run | offered msg/s | ingress msg/s | delivered msg/s | sender p99 ms | e2e p50 ms | e2e p99 ms | e2e p99.9 ms | late sends |",
      file=sys.stderr)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
for r in rows:
    print(f'| {r["phase"]} | {r.get("offered_msgs_per_sec", "max")} | {r["ingress_msgs_per_sec"]:,} | '
          f'{r["delivered_msgs_per_sec"]:,} | {r["sender_p99_ms"]:.2f} | {r["e2e_p50_ms"]} | {r["e2e_p99_ms"]} | '
          f'{r["e2e_p999_ms"]} | {r["late_sends"]} |', file=sys.stderr)
print("\nCPU µs per delivered message:\n\n| phase | ingress | transformer | egress | broker | **these four** | receiver | "
      "load client | messages per transaction | ingress Produce per message |", file=sys.stderr)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
for r in rows:
    c = r["cpu_us_per_delivered"]
    print(f'| {r["phase"]} | {c["ingress"]} | {c["transformer"]} | {c["egress"]} | {c["broker"]} | **{c["total"]}** | '
          f'{c["receiver"]} | {c["load"]} | {r["transformer_messages_per_transaction"]} | '
          f'{r["kafka_requests_per_delivered"].get("ingress.Produce", 0)} |', file=sys.stderr)
for r in rows:
    print(f'\nKafka requests per delivered message ({r["phase"]}, librdkafka statistics): '
          + ", ".join(f"{k} {v}" for k, v in r["kafka_requests_per_delivered"].items()), file=sys.stderr)
if profile:
    for r in rows:
        total = r["cpu_us_per_delivered"]["broker"]
        print(f'\nBroker CPU µs per delivered message by cause ({r["phase"]}: {total} µs over the phase; '
              f'{r["handler_samples"]} request-handler samples):\n\n| cause | µs per delivered message | share |\n|---|---:|---:|',
              file=sys.stderr)
        for cause, us in r["broker_us_by_cause"]:
            print(f"| {cause} | {us} | {100 * us / max(total, 1e-9):.0f}% |", file=sys.stderr)
        print(f'\nRequests the broker answered per delivered message ({r["phase"]}, its RequestMetrics): '
              + ", ".join(f"{k} {v}" for k, v in r["broker_requests_per_delivered"].items()), file=sys.stderr)
print(f"\nacked {len(all_acked)}, lost {lost}, duplicate deliveries {summary['duplicates']}", file=sys.stderr)
sys.exit(1 if lost else 0)
PY
if [ "$fhir" = 1 ]; then
  # The Bundles trail the MLLP deliveries a little: counted once their number stops growing for 3 s.
  prev=-1 n=0
  while [ "$n" != "$prev" ]; do
    prev=$n
    sleep 3
    n=$(find "$out/received-fhir" -name '*.json' | wc -l)
  done
  echo "FHIR Bundles at the HTTP receiver: $n; egress: $(curl -fsS http://127.0.0.1:29466/metrics |
    grep -E '^hl7gw_egress_(delivered_total|dlq_writes_total)\{destination="fhir"' | paste -sd' ')" >&2
fi
