#!/usr/bin/env bash
# `make bench-peers`: "how does it compare to Camel?" as a command. The same load (hl7gw-load, ADT^A01, unique
# control ids, BENCH_CLIENTS=8 clients for BENCH_SECONDS=15 s after a warm-up) against, in one run on this
# machine with one local Kafka:
#   echo          an MLLP server answering a fixed ACK, no parse, no Kafka (the floor)
#   hl7gw-fast    hl7gw-ingress, ack_mode fast (AA after parse, publish behind it)
#   hl7gw-durable hl7gw-ingress, ack_mode durable (AA after acks=all)
#   camel-ff      Camel 4 camel-mllp -> camel-kafka through a wire tap (AA before Kafka's ack)
#   camel-sync    Camel 4 camel-mllp -> camel-kafka (AA after acks=all, idempotent, linger 0)
# plus one client for 10 s against the two durable ones (latency of a sequential sender), and the same 8 clients
# pipelining BENCH_IN_FLIGHT=8 messages each (hl7gw-load --in-flight; 0 skips these rows). For each: msg/s,
# p50/p99, and CPU time (user+system) per message of the server, the broker and the load client, read from
# /proc before and after the measured run. Results: target/bench-peers.jsonl and a Markdown table on stdout.
# The Camel peer is loadtest/peers/camel (Maven; jars from Maven Central into its target/).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_SECONDS:-15}
clients=${BENCH_CLIENTS:-8}
in_flight=${BENCH_IN_FLIGHT:-8}
# Its own port (not the tests' 29092): a test broker left running would answer in its place.
export KAFKA_PORT=${BENCH_KAFKA_PORT:-29692} KAFKA_DATA_DIR="$PWD/target/kafka-bench"
port=22575
cargo build --release -p hl7gw-ingress -p hl7gw-load --bins --examples >&2
(cd loadtest/peers/camel && mvn -q -B -Dstyle.color=never --no-transfer-progress package) >&2
scripts/kafka.sh up
broker_pid=$(cat "$KAFKA_DATA_DIR/kafka.pid")
server_pid=""
stop_server() {
  if [[ -n "$server_pid" ]]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  server_pid=""
}
cleanup() { stop_server; scripts/kafka.sh down || true; }
trap cleanup EXIT
results=target/bench-peers.jsonl
: >"$results"

# start PEER: the server under test on 127.0.0.1:$port, answering MLLP before this returns.
start() {
  local topic="bench.peers.$1.$(date +%s%N)"
  case $1 in
    echo) target/release/examples/fixed_ack_server "$port" 2 >/dev/null & ;;
    hl7gw-fast | hl7gw-durable)
      HL7GW_KAFKA__BROKERS=127.0.0.1:$KAFKA_PORT HL7GW_INBOUND_TOPIC=$topic HL7GW_DLQ_TOPIC=$topic.dlq \
        HL7GW_ACK_MODE=${1#hl7gw-} RUST_LOG=warn target/release/hl7gw-ingress \
        --mllp-addr 127.0.0.1:$port --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 >/dev/null & ;;
    camel-ff | camel-sync)
      java -Xms512m -Xmx512m -cp 'loadtest/peers/camel/target/classes:loadtest/peers/camel/target/libs/*' \
        -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
        hl7gw.peers.CamelPeer "$port" "127.0.0.1:$KAFKA_PORT" "$topic" "${1#camel-}" >/dev/null & ;;
  esac
  server_pid=$!
  for _ in $(seq 300); do
    if target/release/hl7gw-load --to 127.0.0.1:$port --clients 1 --messages 1 --warmup 0 --timeout 5 \
      >/dev/null 2>&1; then return; fi
    sleep 0.2
  done
  echo "bench-peers: $1 never answered" >&2
  return 1
}

# measure PEER CLIENTS SECS WARMUP IN_FLIGHT: one run; appends a JSON line.
measure() {
  python3 - "$@" "$server_pid" "$broker_pid" "$port" >>"$results" <<'PY'
import json, os, resource, subprocess, sys
peer, clients, secs, warmup, in_flight, server, broker, port = sys.argv[1:9]
tck = os.sysconf("SC_CLK_TCK")
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
# Warm-up first (a JIT needs it; hl7gw does not, but gets the same), not measured.
subprocess.run(["target/release/hl7gw-load", "--to", f"127.0.0.1:{port}", "--clients", clients,
                "--messages", warmup, "--warmup", "0", "--in-flight", in_flight], capture_output=True)
s0, b0 = ticks(server), ticks(broker)
c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
r = subprocess.run(["target/release/hl7gw-load", "--to", f"127.0.0.1:{port}", "--clients", clients,
                    "--duration", secs, "--warmup", "0", "--in-flight", in_flight, "--json"],
                   capture_output=True, text=True)
c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
s1, b1 = ticks(server), ticks(broker)
j = json.loads(r.stdout)
n = max(j["messages"], 1)
us = lambda t: round(t * 1e6 / tck / n, 1)
print(json.dumps({
    "peer": peer, "clients": int(clients), "in_flight": int(in_flight), "seconds": j["seconds"], "messages": j["messages"],
    "msgs_per_sec": round(j["msgs_per_sec"]), "p50_ms": j["latency_us"]["p50"] / 1000,
    "p99_ms": j["latency_us"]["p99"] / 1000, "acks": {k: v for k, v in j["acks"].items() if v},
    "errors": j["errors"], "server_us": us(s1 - s0), "broker_us": us(b1 - b0),
    "load_us": round(((c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)) * 1e6 / n, 1),
}))
PY
}

for peer in echo hl7gw-fast hl7gw-durable camel-ff camel-sync; do
  echo "bench-peers: $peer, $clients clients, ${secs} s" >&2
  start "$peer"
  measure "$peer" "$clients" "$secs" 2000 1
  case $peer in
    hl7gw-durable | camel-sync)
      measure "$peer" 1 10 2000 1
      if [[ "$in_flight" -gt 1 ]]; then measure "$peer" "$clients" "$secs" 2000 "$in_flight"; fi ;;
  esac
  stop_server
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| peer | clients | in flight each | msg/s | p50 ms | p99 ms | CPU µs/msg: server | broker | load client | ACKs | errors |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for r in rows:
    acks = ", ".join(f"{k} {v}" for k, v in r["acks"].items())
    print(f'| {r["peer"]} | {r["clients"]} | {r.get("in_flight", 1)} | {r["msgs_per_sec"]:,} | {r["p50_ms"]:.3f} | {r["p99_ms"]:.3f} | '
          f'{r["server_us"]} | {r["broker_us"]} | {r["load_us"]} | {acks} | {r["errors"]} |')
PY
