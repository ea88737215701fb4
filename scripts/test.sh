#!/usr/bin/env bash
# `make test` after lint: every test of the workspace. Tests that need Kafka start their own brokers through
# scripts/kafka.sh (ports 39092 and 39192, data under target/kafka-test); this script stops them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
stop_brokers() {
  for port in 39092 39192; do
    KAFKA_PORT=$port KAFKA_DATA_DIR="$PWD/target/kafka-test/$port" scripts/kafka.sh down >/dev/null 2>&1 || true
  done
}
trap stop_brokers EXIT
# Fetch the broker's jars before the tests run in parallel (once; cached in .cache/).
scripts/kafka.sh fetch
cargo test --workspace --all-targets
cargo test --workspace --doc
