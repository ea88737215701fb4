#!/usr/bin/env bash
# `make run`: the whole gateway on this machine. Starts the local Kafka (KRaft, 127.0.0.1:9092; KAFKA_PORT to
# change), a receiver standing in for the lab system (`hl7gw receive` on 127.0.0.1:2576, storing into
# .cache/run/received), one standing in for a FHIR server (`hl7gw receive --http` on 127.0.0.1:2577, storing
# into .cache/run/received-fhir), the ingress (MLLP 127.0.0.1:2575), the transformer (routes: examples/pipeline/routes.yaml)
# and the egress (examples/pipeline/egress.yaml), sends the samples, shows where they landed, then keeps running
# until Ctrl-C.
# KAFKA_BROKERS=host:port[,host:port...] uses that Kafka instead: nothing is started or stopped there and no Java
# is needed. The services create the topics they use when missing (kafka.create_topics_partitions, 3 by default):
# hl7.inbound, hl7.dlq, hl7.out.lab, hl7.out.analytics, hl7.out.fhir, hl7.events; their consumer groups are hl7gw-transformer
# and hl7gw-egress.<destination>. A Kafka that needs TLS or SASL: export the services' HL7GW_KAFKA__* settings as well.
# RUN_ONCE=1 stops everything once the samples arrived (a smoke test of the whole path).
# The services' logs: .cache/run/{ingress,transformer,egress,receiver,receiver-fhir}.log.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CARGO_TARGET_DIR:-target}/release
log=.cache/run
received=$log/received
received_fhir=$log/received-fhir
mkdir -p "$log"
rm -rf "$received" "$received_fhir"
# shellcheck source=scripts/lib/procs.sh
. scripts/lib/procs.sh
trap 'exit 0' INT TERM

brokers=${KAFKA_BROKERS:-}
if [[ -n "$brokers" ]]; then
  # Someone else's Kafka: fail early and plainly when its first address does not take connections.
  first=${brokers%%,*} host=${brokers%%,*} port=9092
  if [[ $first == *:* && $first != *] ]]; then host=${first%:*} port=${first##*:}; fi
  host=${host#[} host=${host%]}
  if ! timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$host" "$port" 2>/dev/null; then
    echo "make run: nothing listens at $first (KAFKA_BROKERS=$brokers)" >&2
    exit 1
  fi
  trap 'stop_children' EXIT
  kafka_note="$brokers (KAFKA_BROKERS: not started or stopped by make run)"
else
  if ! command -v java >/dev/null; then
    echo "make run: the local Kafka needs Java 17 (and Maven, to fetch its jars once); or use a Kafka you have:" >&2
    echo "  make run KAFKA_BROKERS=host:port" >&2
    exit 1
  fi
  trap 'stop_children; scripts/kafka.sh down || true' EXIT
  scripts/kafka.sh up
  brokers=$(scripts/kafka.sh brokers)
  kafka_note="$brokers (local, data in .cache/kafka-data/; stopped when make run ends)"
fi
export HL7GW_KAFKA__BROKERS=$brokers
# The admin gRPC methods (hl7gw status, trace, deadletters, replay, senders, dry-run) refuse every caller unless
# grpc.allow lets them in, and the CLI sends a token only over TLS: here the gRPC listeners are on 127.0.0.1 and
# carry the samples, so anyone on this machine may call them (production: TLS and tokens or client certificates,
# README "Security").
anyone='["anonymous"]'
"$bin/hl7gw" receive --listen 127.0.0.1:2576 --out "$received" >"$log/receiver.out" 2>"$log/receiver.log" &
pids+=($!)
"$bin/hl7gw" receive --http --listen 127.0.0.1:2577 --out "$received_fhir" >"$log/receiver-fhir.out" \
  2>"$log/receiver-fhir.log" &
pids+=($!)
HL7GW_GRPC__ALLOW="{Senders=$anyone}" "$bin/hl7gw-ingress" --mllp-addr 127.0.0.1:2575 --grpc-addr 127.0.0.1:50051 --admin-addr 127.0.0.1:9464 \
  >"$log/ingress.out" 2>"$log/ingress.log" &
pids+=($!)
HL7GW_ROUTES__FILE=examples/pipeline/routes.yaml HL7GW_GRPC__ALLOW="{Transform=$anyone}" "$bin/hl7gw-transformer" \
  --grpc-addr 127.0.0.1:50052 --admin-addr 127.0.0.1:9465 >"$log/transformer.out" 2>"$log/transformer.log" &
pids+=($!)
HL7GW_GRPC__ALLOW="{Status=$anyone,ListDeadLetters=$anyone,ReadMessages=$anyone,Replay=$anyone,Trace=$anyone}" "$bin/hl7gw-egress" \
  --config examples/pipeline/egress.yaml --grpc-addr 127.0.0.1:50053 --admin-addr 127.0.0.1:9466 \
  >"$log/egress.out" 2>"$log/egress.log" &
pids+=($!)
for port in 9464 9465 9466; do
  for _ in $(seq 300); do
    if curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then break; fi
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "a service exited; logs in $log/" >&2; tail -5 "$log"/*.log >&2; exit 1; }
    done
    sleep 0.2
  done
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null || {
    echo "the service on admin port $port did not get ready within 60 s: $(curl -sS "http://127.0.0.1:$port/readyz" 2>&1)" >&2
    echo "logs in $log/" >&2
    exit 1
  }
done

cat <<TXT
hl7gw is running (ingress -> Kafka -> transformer -> Kafka -> egress -> receiver):
  send     $bin/hl7gw send --to 127.0.0.1:2575 samples/adt_a01.hl7
  ingress  MLLP 127.0.0.1:2575, gRPC 127.0.0.1:50051 (hl7gw.v1.Ingest), admin http://127.0.0.1:9464/metrics
  routes   examples/pipeline/routes.yaml (edit it: reloaded within 2 s); dry run: gRPC hl7gw.v1.Transform on :50052
  egress   destinations lab -> MLLP 127.0.0.1:2576, fhir -> POST http://127.0.0.1:2577/fhir;
           gRPC hl7gw.v1.Egress on :50053 (status, dead letters, replay)
  lands in $received/ (ADT, transformed for the lab); ADT as FHIR R4 transaction Bundles in
           $received_fhir/ (via topic hl7.out.fhir); ORU as JSON on topic hl7.out.analytics
  Kafka    $kafka_note
           topics hl7.inbound, hl7.out.lab, hl7.out.analytics, hl7.out.fhir, hl7.dlq, hl7.events (created by the services)
  logs     $log/ingress.log, transformer.log, egress.log, receiver.log, receiver-fhir.log
  admin    $bin/hl7gw status --to http://127.0.0.1:50053
           $bin/hl7gw trace --to http://127.0.0.1:50053 --control-id <MSH-10>
           $bin/hl7gw deadletters --to http://127.0.0.1:50053 --since 1h
           $bin/hl7gw senders --to http://127.0.0.1:50051
TXT
echo "== sending samples/*.hl7"
"$bin/hl7gw" send --to 127.0.0.1:2575 samples/*.hl7
# Waits up to 30 s for a file matching the glob $1; says $2 and exits 1 when none comes.
wait_for_file() {
  for _ in $(seq 150); do
    if compgen -G "$1" >/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "$2; logs in $log/" >&2
  exit 1
}
echo "== waiting for the ADT sample at the receiver"
wait_for_file "$received/*.hl7" "nothing arrived at the receiver"
for f in "$received"/*.hl7; do
  echo "-- $f"
  tr '\r' '\n' <"$f"
done
echo "== waiting for the ADT sample as a FHIR Bundle at the HTTP receiver"
wait_for_file "$received_fhir/*.json" "no FHIR Bundle arrived at the HTTP receiver"
for f in "$received_fhir"/*.json; do
  echo "-- $f (resources: $(grep -o '"resourceType":"[A-Za-z]*"' "$f" | cut -d'"' -f4 | sort | uniq -c |
    awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}'))"
  head -c 600 "$f"
  echo " ..."
done
# The egress counts a delivery once the receiver's ACK is read, a moment after the file is written.
sleep 1
echo "== $bin/hl7gw status --to http://127.0.0.1:50053"
"$bin/hl7gw" status --to http://127.0.0.1:50053 --timeout 10 || true
if [[ "${RUN_ONCE:-}" == 1 ]]; then exit 0; fi
if [[ -n "${KAFKA_BROKERS:-}" ]]; then echo "Ctrl-C stops the services."; else echo "Ctrl-C stops the services and Kafka."; fi
wait "${pids[0]}"
