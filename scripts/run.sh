#!/usr/bin/env bash
# `make run`: the gateway end to end on this machine. Starts the local Kafka (KRaft, 127.0.0.1:9092) and the
# ingress (MLLP 127.0.0.1:2575, gRPC :50051, admin :9464), sends the samples, then keeps running until Ctrl-C.
# RUN_ONCE=1 stops everything after the samples were sent (a smoke test of the whole path).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release
log=.cache/run
mkdir -p "$log"
ingress_pid=""
cleanup() {
  if [[ -n "$ingress_pid" ]] && kill -0 "$ingress_pid" 2>/dev/null; then
    kill -TERM "$ingress_pid"; wait "$ingress_pid" 2>/dev/null || true
  fi
  scripts/kafka.sh down || true
}
trap cleanup EXIT
trap 'exit 0' INT TERM

scripts/kafka.sh up
HL7GW_KAFKA_BROKERS=127.0.0.1:9092 "$bin/hl7gw-ingress" \
  --mllp-addr 127.0.0.1:2575 --grpc-addr 127.0.0.1:50051 --admin-addr 127.0.0.1:9464 \
  >"$log/ingress.out" 2>"$log/ingress.log" &
ingress_pid=$!
for _ in $(seq 300); do
  if curl -fsS http://127.0.0.1:9464/readyz >/dev/null 2>&1; then break; fi
  if ! kill -0 "$ingress_pid" 2>/dev/null; then echo "the ingress exited:" >&2; cat "$log/ingress.log" >&2; exit 1; fi
  sleep 0.2
done
curl -fsS http://127.0.0.1:9464/readyz >/dev/null || { echo "the ingress did not get ready" >&2; exit 1; }

cat <<TXT
hl7gw is running:
  MLLP   127.0.0.1:2575   (send: $bin/hl7gw send --to 127.0.0.1:2575 samples/adt_a01.hl7)
  gRPC   127.0.0.1:50051  (hl7gw.v1.Ingest, grpc.health.v1)
  admin  http://127.0.0.1:9464/metrics  /readyz  /healthz
  Kafka  127.0.0.1:9092   topics hl7.inbound, hl7.dlq
  logs   $log/ingress.log, .cache/kafka-data/9092/kafka.log
TXT
echo "== sending samples/*.hl7"
"$bin/hl7gw" send --to 127.0.0.1:2575 samples/*.hl7
if [[ "${RUN_ONCE:-}" == 1 ]]; then exit 0; fi
echo "Ctrl-C stops the ingress and Kafka."
wait "$ingress_pid"
