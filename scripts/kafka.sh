#!/usr/bin/env bash
# A real single-node Apache Kafka (KRaft, no ZooKeeper, no Docker) on 127.0.0.1 for `make run` and the tests.
#
#   scripts/kafka.sh up | down | status | wait
#
# Jars come from Maven Central through scripts/kafka/pom.xml and are cached in .cache/kafka-$KAFKA_VERSION.
# Settings (environment):
#   KAFKA_PORT             client listener port           (9092)
#   KAFKA_CONTROLLER_PORT  KRaft controller port          (KAFKA_PORT + 1)
#   KAFKA_DATA_DIR         data, config, log and PID file (.cache/kafka-data/$KAFKA_PORT)
#   KAFKA_HEAP             JVM heap                       (384m)
#   KAFKA_PARTITIONS       default partitions of auto-created topics (3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
KAFKA_VERSION=4.3.1
KAFKA_PORT=${KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}
KAFKA_DATA_DIR=${KAFKA_DATA_DIR:-$root/.cache/kafka-data/$KAFKA_PORT}
KAFKA_HEAP=${KAFKA_HEAP:-384m}
KAFKA_PARTITIONS=${KAFKA_PARTITIONS:-3}
libs=$root/.cache/kafka-$KAFKA_VERSION/libs
pidfile=$KAFKA_DATA_DIR/kafka.pid

log() { printf 'kafka: %s\n' "$*" >&2; }

fetch() {
  if [ -f "$libs/.complete" ]; then return; fi
  log "fetching Kafka $KAFKA_VERSION jars from Maven Central (once; cached in ${libs#"$root"/})"
  rm -rf "$libs"
  mvn -q -B -Dstyle.color=never --no-transfer-progress -f "$root/scripts/kafka/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$libs" -DincludeScope=runtime
  touch "$libs/.complete"
}

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null; }

java_run() { java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$KAFKA_DATA_DIR/log4j2.properties" -cp "$libs/*" "$@"; }

configure() {
  mkdir -p "$KAFKA_DATA_DIR/logs"
  cat >"$KAFKA_DATA_DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$KAFKA_DATA_DIR/logs
num.partitions=$KAFKA_PARTITIONS
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=24
PROPS
  cat >"$KAFKA_DATA_DIR/log4j2.properties" <<'PROPS'
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
PROPS
  if [ ! -f "$KAFKA_DATA_DIR/logs/meta.properties" ]; then
    local id
    id=$(java_run kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
    java_run kafka.tools.StorageTool format -t "$id" -c "$KAFKA_DATA_DIR/server.properties" >/dev/null
  fi
}

wait_ready() {
  local deadline=$((SECONDS + ${1:-90}))
  until port_open; do
    if ! running; then log "broker exited; see $KAFKA_DATA_DIR/kafka.log"; tail -n 20 "$KAFKA_DATA_DIR/kafka.log" >&2; return 1; fi
    if [ $SECONDS -ge $deadline ]; then log "broker not listening on 127.0.0.1:$KAFKA_PORT in time"; return 1; fi
    sleep 0.3
  done
}

up() {
  mkdir -p "$KAFKA_DATA_DIR"
  # Tests of several binaries may ask for the same broker at once: one of them starts it.
  exec 9>"$KAFKA_DATA_DIR.lock"
  flock -w 300 9 || { log "timed out waiting for another start of this broker"; return 1; }
  if running; then log "already running on 127.0.0.1:$KAFKA_PORT (pid $(cat "$pidfile"))"; wait_ready 120; return; fi
  fetch
  configure
  nohup bash -c 'exec "$@"' _ java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_DATA_DIR/log4j2.properties" -cp "$libs/*" \
    kafka.Kafka "$KAFKA_DATA_DIR/server.properties" >"$KAFKA_DATA_DIR/kafka.log" 2>&1 9>&- &
  echo $! >"$pidfile"
  wait_ready 120
  log "up on 127.0.0.1:$KAFKA_PORT (pid $(cat "$pidfile"), data in $KAFKA_DATA_DIR)"
}

down() {
  if ! running; then rm -f "$pidfile"; log "not running"; return; fi
  local pid; pid=$(cat "$pidfile")
  kill "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$pidfile"
  log "stopped (pid $pid)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) if running && port_open; then echo "running on 127.0.0.1:$KAFKA_PORT (pid $(cat "$pidfile"))"; else echo "not running"; exit 1; fi ;;
  wait) wait_ready "${2:-90}" ;;
  fetch) fetch ;;
  *) echo "usage: $0 up|down|status|wait|fetch" >&2; exit 2 ;;
esac
