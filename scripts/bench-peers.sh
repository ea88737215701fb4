#!/usr/bin/env bash
# `make bench-peers`: "how does it compare to Camel?" as a command. The same load (hl7gw-load, ADT^A01, unique
# control ids, BENCH_CLIENTS=8 clients for BENCH_SECONDS=15 s after BENCH_WARMUP_SECONDS=10 s of warm-up) against,
# on this machine with one local Kafka:
#   echo          an MLLP server answering a fixed ACK, no parse, no Kafka (the floor)
#   hl7gw-fast    hl7gw-ingress, ack_mode fast (AA after parse, publish behind it)
#   hl7gw-durable hl7gw-ingress, ack_mode durable (AA after acks=all)
#   camel-ff      Camel 4 camel-mllp -> camel-kafka through a wire tap (AA before Kafka's ack)
#   camel-sync    Camel 4 camel-mllp -> camel-kafka (AA after acks=all, idempotent, linger 0)
# plus one client for 10 s against the two durable ones (latency of a sequential sender), and the same 8 clients
# pipelining BENCH_IN_FLIGHT=8 messages each (hl7gw-load --in-flight; 0 skips these rows). For each: msg/s,
# p50/p99, and CPU time (user+system) per message of the server, the broker and the load client, read from
# /proc before and after the measured run.
# Robust to the order and the machine's drift: BENCH_ROUNDS (3) rounds, each with the peers in another order
# (rotated, every other round reversed), each peer restarted and warmed up in each round; before the first round
# the broker itself is warmed up for BENCH_BROKER_WARMUP_SECONDS (60) (its JIT compiler takes ~40% of its CPU
# in its first minute under load). Every peer writes to a topic of BENCH_PARTITIONS (6) partitions created
# beforehand (the hl7gw ingress used to create 6 and Camel's producer got the broker's default 3).
# Results: target/bench-peers.jsonl (one line per measured run), then the settings and a Markdown table of the
# median and the range over the rounds of each row, and the durable/Camel-sync ratio of each round.
# The Camel peer is loadtest/peers/camel (Maven; jars from Maven Central into its target/).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${BENCH_SECONDS:-15}
clients=${BENCH_CLIENTS:-8}
in_flight=${BENCH_IN_FLIGHT:-8}
rounds=${BENCH_ROUNDS:-3}
warmup=${BENCH_WARMUP_SECONDS:-10}
partitions=${BENCH_PARTITIONS:-6}
peers=(${BENCH_PEERS:-echo hl7gw-fast hl7gw-durable camel-ff camel-sync})
# Its own port (not the tests' 29092): a test broker left running would answer in its place.
export KAFKA_PORT=${BENCH_KAFKA_PORT:-29692} KAFKA_DATA_DIR="$PWD/target/kafka-bench"
port=22575
cargo build --release -p hl7gw-ingress -p hl7gw-load --bins --examples >&2
(cd loadtest/peers/camel && mvn -q -B -Dstyle.color=never --no-transfer-progress package) >&2
scripts/kafka.sh fresh
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
  scripts/kafka.sh create-topic "$topic" "$partitions"
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

# measure PEER CLIENTS SECS WARMUP_SECS IN_FLIGHT ROUND: one run after WARMUP_SECS of the same load, not
# measured (a JIT needs it; hl7gw does not, but gets the same); appends a JSON line.
measure() {
  local load=(--to "127.0.0.1:$port" --clients "$2" --in-flight "$5" --warmup 0)
  target/release/hl7gw-load "${load[@]}" --duration "$4" >/dev/null 2>&1 || true
  python3 scripts/lib/loadrun.py run --field peer="$1" --field clients="$2" --field in_flight="$5" --field round="$6" \
    --pid server="$server_pid" --pid broker="$broker_pid" -- "${load[@]}" --duration "$3" >>"$results"
}

# The broker's own warm-up (its JIT), through the durable ingress; not measured.
echo "bench-peers: warming the broker up for ${BENCH_BROKER_WARMUP_SECONDS:-60} s" >&2
start hl7gw-durable
target/release/hl7gw-load --to "127.0.0.1:$port" --clients "$clients" --warmup 0 \
  --duration "${BENCH_BROKER_WARMUP_SECONDS:-60}" >/dev/null 2>&1 || true
stop_server

n=${#peers[@]}
for round in $(seq 1 "$rounds"); do
  order=()
  for k in $(seq 0 $((n - 1))); do order+=("${peers[$(((k + round - 1) % n))]}"); done
  if ((round % 2 == 0)); then mapfile -t order < <(printf '%s\n' "${order[@]}" | tac); fi
  for peer in "${order[@]}"; do
    echo "bench-peers: round $round/$rounds, $peer, $clients clients, ${secs} s" >&2
    start "$peer"
    measure "$peer" "$clients" "$secs" "$warmup" 1 "$round"
    case $peer in
      hl7gw-durable | camel-sync)
        measure "$peer" 1 10 3 1 "$round"
        if [[ "$in_flight" -gt 1 ]]; then measure "$peer" "$clients" "$secs" 3 "$in_flight" "$round"; fi ;;
    esac
    stop_server
  done
done

# shellcheck source=scripts/lib/benchinfo.sh
. scripts/lib/benchinfo.sh
{
  bench_info bench-peers bench.peers.
  echo "settings: $rounds rounds, peers in rotated order, $clients clients x ${secs} s after ${warmup} s of warm-up, broker warmed up ${BENCH_BROKER_WARMUP_SECONDS:-60} s"
  echo
} >&2
python3 scripts/lib/loadrun.py rounds "$results" >&2
