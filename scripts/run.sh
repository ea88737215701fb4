#!/usr/bin/env bash
# `make run`: the whole gateway on this machine. Starts the local Kafka (KRaft, 127.0.0.1:9092), a receiver
# standing in for the lab system (`hl7gw receive` on 127.0.0.1:2576, storing into .cache/run/received), the
# ingress (MLLP 127.0.0.1:2575), the transformer (routes: examples/pipeline/routes.yaml) and the egress
# (examples/pipeline/egress.yaml), sends the samples, shows where they landed, then keeps running until Ctrl-C.
# RUN_ONCE=1 stops everything once the samples arrived (a smoke test of the whole path).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release
log=.cache/run
received=$log/received
mkdir -p "$log"
rm -rf "$received"
# shellcheck source=scripts/lib/procs.sh
. scripts/lib/procs.sh
trap 'stop_children; scripts/kafka.sh down || true' EXIT
trap 'exit 0' INT TERM

scripts/kafka.sh up
export HL7GW_KAFKA__BROKERS=127.0.0.1:9092
"$bin/hl7gw" receive --listen 127.0.0.1:2576 --out "$received" >"$log/receiver.out" 2>"$log/receiver.log" &
pids+=($!)
"$bin/hl7gw-ingress" --mllp-addr 127.0.0.1:2575 --grpc-addr 127.0.0.1:50051 --admin-addr 127.0.0.1:9464 \
  >"$log/ingress.out" 2>"$log/ingress.log" &
pids+=($!)
HL7GW_ROUTES__FILE=examples/pipeline/routes.yaml "$bin/hl7gw-transformer" \
  --grpc-addr 127.0.0.1:50052 --admin-addr 127.0.0.1:9465 >"$log/transformer.out" 2>"$log/transformer.log" &
pids+=($!)
"$bin/hl7gw-egress" --config examples/pipeline/egress.yaml --grpc-addr 127.0.0.1:50053 --admin-addr 127.0.0.1:9466 \
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
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null || { echo "the service on admin port $port did not get ready" >&2; exit 1; }
done

cat <<TXT
hl7gw is running (ingress -> Kafka -> transformer -> Kafka -> egress -> receiver):
  send     $bin/hl7gw send --to 127.0.0.1:2575 samples/adt_a01.hl7
  ingress  MLLP 127.0.0.1:2575, gRPC 127.0.0.1:50051 (hl7gw.v1.Ingest), admin http://127.0.0.1:9464/metrics
  routes   examples/pipeline/routes.yaml (edit it: reloaded within 2 s); dry run: gRPC hl7gw.v1.Transform on :50052
  egress   destination lab -> 127.0.0.1:2576; gRPC hl7gw.v1.Egress on :50053 (status, dead letters, replay)
  lands in $received/ (ADT, transformed for the lab); ORU as JSON on topic hl7.out.analytics
  Kafka    127.0.0.1:9092: hl7.inbound, hl7.out.lab, hl7.out.analytics, hl7.dlq
  logs     $log/*.log
TXT
echo "== sending samples/*.hl7"
"$bin/hl7gw" send --to 127.0.0.1:2575 samples/*.hl7
echo "== waiting for the ADT sample at the receiver"
for _ in $(seq 150); do
  if compgen -G "$received/*.hl7" >/dev/null; then break; fi
  sleep 0.2
done
if ! compgen -G "$received/*.hl7" >/dev/null; then
  echo "nothing arrived at the receiver; logs in $log/" >&2
  exit 1
fi
for f in "$received"/*.hl7; do
  echo "-- $f"
  tr '\r' '\n' <"$f"
done
if [[ "${RUN_ONCE:-}" == 1 ]]; then exit 0; fi
echo "Ctrl-C stops the services and Kafka."
wait "${pids[0]}"
