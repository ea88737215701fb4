#!/usr/bin/env bash
# `make bench-egress` (issue 38): the egress alone, in release, draining a backlog into a receiver that answers
# slowly (`hl7gw receive --no-sync --delay D`), over MLLP and over HTTP, one message in flight per partition
# (max_in_flight 1, connections 1: the egress before issue 38) against the defaults (max_in_flight 16 per partition; MLLP with
# connections BENCH_CONNECTIONS, 16). For each receiver delay of BENCH_DELAYS ("5 50 100 200" ms): delivered msg/s
# over BENCH_SECONDS (15) after BENCH_SETTLE (3) s, and the egress's CPU time (user+system, /proc) per delivered
# message. Kafka on its own port (BENCH_KAFKA_PORT=29892, data wiped), the destination topic with
# BENCH_PARTITIONS (3) partitions, filled first by hl7gw-load (8 clients, 20 patients each) through the ingress and
# the transformer (BENCH_MESSAGES, 60000; a run that drains it says so: its rate is then a floor); each run reads it from the start in a consumer group of its own.
# Tables on stderr, JSON in target/bench-egress.json.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_SECONDS:-15} settle=${BENCH_SETTLE:-3} delays=${BENCH_DELAYS:-5 50 100 200}
messages=${BENCH_MESSAGES:-60000} partitions=${BENCH_PARTITIONS:-3} connections=${BENCH_CONNECTIONS:-16}
export KAFKA_NODES=1 KAFKA_PORT=${BENCH_KAFKA_PORT:-29892} KAFKA_DATA_DIR="$PWD/target/kafka-bench-egress"
cargo build --release -p hl7gw-ingress -p hl7gw-transformer -p hl7gw-egress -p hl7gw-cli -p hl7gw-load --bins >&2
scripts/kafka.sh fresh
out=target/bench-egress
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/procs.sh
. scripts/lib/procs.sh
trap 'stop_children; scripts/kafka.sh down || true' EXIT
run="eb$(date +%s)"
brokers=$(scripts/kafka.sh brokers)
scripts/kafka.sh create-topic "$run.inbound" "$partitions"
scripts/kafka.sh create-topic "$run.out.lab" "$partitions"
scripts/kafka.sh create-topic "$run.dlq" "$partitions"
export HL7GW_KAFKA__BROKERS=$brokers RUST_LOG=warn
cat >"$out/routes.yaml" <<'YAML'
apiVersion: hl7gw.io/v1alpha1
kind: HL7Route
metadata: {name: all-to-lab}
spec:
  match: {messageTypes: ['ADT^A*']}
  destinations: [lab]
YAML
echo "bench-egress: filling $run.out.lab with $messages messages" >&2
HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq target/release/hl7gw-ingress \
  --mllp-addr 127.0.0.1:22675 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29564 >/dev/null 2>"$out/ingress.log" &
pids+=($!)
HL7GW_INBOUND_TOPIC=$run.inbound HL7GW_DLQ_TOPIC=$run.dlq HL7GW_OUT_TOPIC_PREFIX=$run.out. HL7GW_GROUP_ID=$run.t \
  HL7GW_ROUTES__FILE="$out/routes.yaml" HL7GW_LEDGER__TOPIC="$run.events" target/release/hl7gw-transformer \
  --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:29565 >/dev/null 2>"$out/transformer.log" &
pids+=($!)
for port in 29564 29565; do
  for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
done
target/release/hl7gw-load --to 127.0.0.1:22675 --clients 8 --messages $((messages / 8)) --warmup 0 --timeout 20 \
  >"$out/load.txt" 2>&1
for _ in $(seq 600); do
  routed=$(curl -fsS http://127.0.0.1:29565/metrics | awk '/^hl7gw_transformer_outputs_total/ {s += $2} END {print s + 0}')
  [ "${routed%.*}" -ge "$messages" ] && break
  sleep 0.5
done
echo "bench-egress: $routed outputs on $run.out.lab" >&2
stop_children
# shellcheck source=scripts/lib/benchinfo.sh
. scripts/lib/benchinfo.sh
bench_info bench-egress >"$out/settings.txt"
echo "settings: seconds=$secs settle=$settle delays='$delays' messages=$messages partitions=$partitions connections=$connections" >>"$out/settings.txt"
cat "$out/settings.txt" >&2
BENCH_MESSAGES_TOTAL=$messages python3 - "$out" "$run" "$secs" "$settle" "$delays" "$connections" <<'PY' | tee target/bench-egress.json
import json, os, subprocess, sys, time, urllib.request
out, run, secs, settle, delays, connections = sys.argv[1:7]
secs, settle, connections = int(secs), int(settle), int(connections)
sys.path.insert(0, "scripts/lib")
from loadrun import TICKS_PER_SECOND as tck, ticks

def delivered():
    try:
        text = urllib.request.urlopen("http://127.0.0.1:29566/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith('hl7gw_egress_delivered_total{destination="lab"}'))

def wait_ready(port, what, proc=None):
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                sys.exit(f"bench-egress: {what} exited")
            time.sleep(0.2)
    sys.exit(f"bench-egress: {what} not ready")

rows = []
n = 0
for proto in ("mllp", "http"):
    for delay in [int(d) for d in delays.split()]:
        for label, in_flight, conns in (("1 in flight per partition", 1, 1), ("default", 16, connections)):
            n += 1
            got = f"{out}/received-{n}"
            recv = subprocess.Popen(
                ["target/release/hl7gw", "receive", "--listen", "127.0.0.1:22676", "--out", got, "--no-sync",
                 "--delay", str(delay)] + (["--http"] if proto == "http" else []),
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            recv.stdout.readline()
            dest = ("    url: http://127.0.0.1:22676/\n" if proto == "http" else
                    f"    address: 127.0.0.1:22676\n    connections: {conns}\n")
            cfg = f"{out}/egress-{n}.yaml"
            with open(cfg, "w") as f:
                f.write(f"destinations:\n  lab:\n{dest}    max_in_flight: {in_flight}\n"
                        "    retry: {initial_backoff: 100ms, max_backoff: 1s}\n")
            env = dict(os.environ, HL7GW_DLQ_TOPIC=f"{run}.dlq", HL7GW_OUT_TOPIC_PREFIX=f"{run}.out.",
                       HL7GW_GROUP_PREFIX=f"{run}.e{n}", HL7GW_LEDGER__TOPIC=f"{run}.events")
            egress = subprocess.Popen(
                ["target/release/hl7gw-egress", "--config", cfg, "--grpc-addr", "127.0.0.1:0",
                 "--admin-addr", "127.0.0.1:29566"],
                env=env, stdout=subprocess.DEVNULL, stderr=open(f"{out}/egress-{n}.log", "w"))
            wait_ready(29566, "the egress", egress)
            time.sleep(settle)
            d0, c0, t0 = delivered(), ticks(egress.pid), time.monotonic()
            time.sleep(secs)
            d1, c1, t1 = delivered(), ticks(egress.pid), time.monotonic()
            egress.terminate(); egress.wait(timeout=60)
            recv.terminate(); recv.wait(timeout=30)
            got_n = d1 - d0
            drained = d1 >= int(os.environ.get("BENCH_MESSAGES_TOTAL", "0")) * 0.99
            row = {"protocol": proto, "receiver_ms": delay, "setting": label, "max_in_flight": in_flight,
                   "connections": conns if proto == "mllp" else None,
                   "delivered_per_s": round(got_n / (t1 - t0), 1),
                   "egress_cpu_us_per_msg": round((c1 - c0) / tck * 1e6 / got_n, 1) if got_n else None,
                   "drained_backlog": drained}
            rows.append(row)
            print(f"bench-egress: {row}", file=sys.stderr)
print("| protocol | receiver answers in | setting | delivered msg/s | egress CPU µs/msg |", file=sys.stderr)
print("| --- | --- | --- | --- | --- |", file=sys.stderr)
for r in rows:
    s = r["setting"] if r["protocol"] == "http" or r["setting"] != "default" else f"default, connections {r['connections']}"
    if r["setting"] == "default":
        s += f", max_in_flight {r['max_in_flight']}"
    rate = f"{r['delivered_per_s']}" + (" (backlog drained: at least)" if r["drained_backlog"] else "")
    print(f"| {r['protocol']} | {r['receiver_ms']} ms | {s} | {rate} | {r['egress_cpu_us_per_msg']} |",
          file=sys.stderr)
json.dump({"runs": rows}, sys.stdout, indent=1)
print()
PY
