#!/usr/bin/env bash
# A real Apache Kafka (KRaft, no ZooKeeper, no Docker) on 127.0.0.1 for `make run` and the tests: a single node
# by default, or KAFKA_NODES combined broker+controller nodes for failover tests.
#
#   scripts/kafka.sh up | down | fresh | status | wait [SECONDS] | fetch
#   scripts/kafka.sh kill N | stop N | start N | brokers | controller
#
#   up          start every node that is not running; wait until each listens and (N>1) is an unfenced broker
#   down        stop every node (SIGTERM, SIGKILL after 30 s)
#   fresh       stop every node, delete KAFKA_DATA_DIR and start as `up` does: an empty cluster (the benches)
#   status      one line per node; exit 1 when one is not running
#   wait        wait as `up` does, starting nothing
#   kill N      SIGKILL node N (a crash)
#   stop N      SIGTERM node N and wait for its exit (controlled shutdown, as in a rolling restart)
#   start N     start node N again on its data; wait until it is an unfenced broker again
#   brokers     print the bootstrap list: 127.0.0.1:p1,127.0.0.1:p2,...
#   controller  print the node id of the active KRaft controller (after a kill: once a live one is elected)
#   scram-user NAME PASSWORD   create or change a SCRAM-SHA-512 user (KAFKA_SECURE=1)
#   create-topic NAME PARTITIONS  create a topic (replication as the cluster's default); an existing one is kept
#   topics [PREFIX]  one line per topic (whose name starts with PREFIX): name, partitions, replication factor
#   config KEY=VALUE...  set cluster-wide dynamic broker settings on the running brokers (e.g. num.io.threads=2),
#               so that settings can be compared on one warm broker; KEY= removes one
#   settings    the server.properties of node 1, one key=value a line, and KAFKA_JVM_OPTS (what a bench ran with)
#
# Jars come from Maven Central through scripts/kafka/pom.xml and are cached in .cache/kafka-$KAFKA_VERSION.
# Settings (environment):
#   KAFKA_NODES            number of nodes                (1)
#   KAFKA_PORT             client listener port (node 1)  (9092)
#   KAFKA_CONTROLLER_PORT  KRaft controller port, N=1     (KAFKA_PORT + 1)
#   KAFKA_DATA_DIR         data, config, log and PID file (.cache/kafka-data/$KAFKA_PORT, N>1: ...$KAFKA_PORT-cluster)
#   KAFKA_HEAP             JVM heap of each node          (384m)
#   KAFKA_PARTITIONS       default partitions of auto-created topics (3)
#   KAFKA_SECURE           1: also listen with TLS and authentication (one node only; see below)    (0)
#   KAFKA_HOST             address of the plaintext client listener (127.0.0.1; scripts/node.sh's bridge address
#                          10.88.0.1 for a broker the local node's pods reach; controllers stay on 127.0.0.1)
#   KAFKA_JVM_OPTS         more JVM options for each node, e.g. a Flight Recording (scripts/bench-pipeline.sh) ()
#   KAFKA_EXTRA_PROPERTIES more server.properties lines, space- or newline-separated key=value, later keys win,
#                          e.g. "num.io.threads=2" to measure a broker setting (the benches)   ()
#
# KAFKA_SECURE=1 adds two listeners beside the plaintext one (which the tools keep using):
#   SASL_SSL on KAFKA_PORT + 2: TLS, SCRAM-SHA-512 user `hl7gw`, password in $KAFKA_DATA_DIR/pki/password
#   SSL on KAFKA_PORT + 3: TLS with a client certificate required (mTLS)
# The test PKI (made once with openssl, in $KAFKA_DATA_DIR/pki): ca.crt (signs the broker and client
# certificates), broker.crt/.key (127.0.0.1, localhost), client.crt/.key (CN=hl7gw-client), and other-ca.crt
# with other-client.crt/.key, a CA the broker does not know (tests of refused certificates).
#
# N=1: node.id 1, everything in KAFKA_DATA_DIR, replication factor 1.
# N>1: node i (1..N) listens for clients on KAFKA_PORT + 10*(i-1) and for KRaft on that + 1 (KAFKA_PORT=39500:
# 39500/39501, 39510/39511, 39520/39521), data in KAFKA_DATA_DIR/node-i. All nodes are voters of one static
# quorum (controller.quorum.voters), formatted with one cluster id (KAFKA_DATA_DIR/cluster.id). Topics, offsets
# and transaction logs default to replication factor min(N,3) and min ISR 2 (1 when that factor is below 3);
# no unclean leader election; failover tuned for a test machine (broker session 3 s, heartbeat 0.5 s, quorum
# fetch timeout 1.5 s, election timeout 0.75 s). A failover that keeps a quorum needs N >= 3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
KAFKA_VERSION=4.3.1
KAFKA_NODES=${KAFKA_NODES:-1}
[[ $KAFKA_NODES =~ ^[1-9][0-9]*$ ]] || { echo "kafka: KAFKA_NODES must be a positive number" >&2; exit 2; }
KAFKA_PORT=${KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}
if [ "$KAFKA_NODES" -eq 1 ]; then
  KAFKA_DATA_DIR=${KAFKA_DATA_DIR:-$root/.cache/kafka-data/$KAFKA_PORT}
else
  KAFKA_DATA_DIR=${KAFKA_DATA_DIR:-$root/.cache/kafka-data/$KAFKA_PORT-cluster}
fi
KAFKA_HEAP=${KAFKA_HEAP:-384m}
KAFKA_PARTITIONS=${KAFKA_PARTITIONS:-3}
KAFKA_SECURE=${KAFKA_SECURE:-0}
KAFKA_HOST=${KAFKA_HOST:-127.0.0.1}
if [ "$KAFKA_SECURE" = 1 ] && [ "$KAFKA_NODES" -ne 1 ]; then echo "kafka: KAFKA_SECURE=1 needs KAFKA_NODES=1" >&2; exit 2; fi
libs=$root/.cache/kafka-$KAFKA_VERSION/libs

log() { printf 'kafka: %s\n' "$*" >&2; }

# at I: select node I (id, dir, port, cport, pidfile, name). With one node its files are in KAFKA_DATA_DIR itself.
at() {
  id=$1
  if [ "$KAFKA_NODES" -eq 1 ]; then
    dir=$KAFKA_DATA_DIR port=$KAFKA_PORT cport=$KAFKA_CONTROLLER_PORT name=broker
  else
    dir=$KAFKA_DATA_DIR/node-$id port=$((KAFKA_PORT + 10 * (id - 1))) name="node $id"
    cport=$((port + 1))
  fi
  pidfile=$dir/kafka.pid
}
ids() { seq 1 "$KAFKA_NODES"; }
node_arg() {
  [[ ${1:-} =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$KAFKA_NODES" ] ||
    { log "a node id 1..$KAFKA_NODES is needed (KAFKA_NODES=$KAFKA_NODES)"; exit 2; }
  at "$1"
}
brokers() { local i l=(); for i in $(ids); do at "$i"; l+=("$KAFKA_HOST:$port"); done; (IFS=,; echo "${l[*]}"); }
controllers() { local i l=(); for i in $(ids); do at "$i"; l+=("127.0.0.1:$cport"); done; (IFS=,; echo "${l[*]}"); }
voters() { local i l=(); for i in $(ids); do at "$i"; l+=("$i@127.0.0.1:$cport"); done; (IFS=,; echo "${l[*]}"); }

fetch() {
  if [ -f "$libs/.complete" ]; then return; fi
  log "fetching Kafka $KAFKA_VERSION jars from Maven Central (once; cached in ${libs#"$root"/})"
  rm -rf "$libs"
  mvn -q -B -Dstyle.color=never --no-transfer-progress -f "$root/scripts/kafka/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$libs" -DincludeScope=runtime
  touch "$libs/.complete"
}

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

# port_open [PORT] [HOST]: the client listener by default; controllers and the secure listeners are on 127.0.0.1.
port_open() { (exec 3<>"/dev/tcp/${2:-$KAFKA_HOST}/${1:-$port}") 2>/dev/null; }

java_run() { java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$libs/*" "$@"; }

# A Kafka command-line tool (Admin client) with short timeouts, quiet, with a small quick-starting JVM.
tool() {
  if [ ! -f "$KAFKA_DATA_DIR/tools.properties" ]; then
    mkdir -p "$KAFKA_DATA_DIR"
    printf 'request.timeout.ms=3000\ndefault.api.timeout.ms=4000\n' >"$KAFKA_DATA_DIR/tools.properties"
    printf 'status = error\nrootLogger.level = off\n' >"$KAFKA_DATA_DIR/tools-log4j2.properties"
  fi
  java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_DATA_DIR/tools-log4j2.properties" -cp "$libs/*" "$@"
}

# The ids of the unfenced brokers, one a line, as the cluster reports them.
unfenced() {
  tool org.apache.kafka.tools.ClusterTool list-endpoints --bootstrap-server "$(brokers)" \
    --command-config "$KAFKA_DATA_DIR/tools.properties" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && $5 == "unfenced" { print $1 }'
}

configure() {
  mkdir -p "$dir/logs"
  local rf=1 isr=1
  if [ "$KAFKA_NODES" -gt 1 ]; then rf=$((KAFKA_NODES < 3 ? KAFKA_NODES : 3)) isr=$((KAFKA_NODES < 3 ? 1 : 2)); fi
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$(voters)
listeners=PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/logs
num.partitions=$KAFKA_PARTITIONS
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=24
PROPS
  if [ "$KAFKA_NODES" -gt 1 ]; then
    cat >>"$dir/server.properties" <<PROPS
unclean.leader.election.enable=false
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
controller.quorum.fetch.timeout.ms=1500
controller.quorum.election.timeout.ms=750
controller.quorum.election.backoff.max.ms=750
replica.lag.time.max.ms=10000
PROPS
  fi
  if [ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]; then tr ' ' '\n' <<<"$KAFKA_EXTRA_PROPERTIES" | grep . >>"$dir/server.properties"; fi
  if [ "$KAFKA_SECURE" = 1 ]; then
    # Later keys win in a properties file: the listener lines below replace the plaintext-only ones.
    pki
    secure_config
  fi
  cat >"$dir/log4j2.properties" <<'PROPS'
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
}

# The test PKI of KAFKA_SECURE=1 (EC P-256 keys, PKCS#8, 10 years), made once.
pki() {
  local d=$KAFKA_DATA_DIR/pki
  [ -f "$d/.complete" ] && return
  command -v openssl >/dev/null || { log "KAFKA_SECURE=1 needs the openssl command"; return 1; }
  rm -rf "$d"; mkdir -p "$d"
  (
    cd "$d"
    key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
    # A config of our own: the system's default one adds extensions that OpenSSL 1.1.1 then duplicates.
    printf '[req]\ndistinguished_name = dn\n[dn]\n' >req.cnf
    ca() { key "$1.key"; openssl req -config req.cnf -x509 -new -key "$1.key" -out "$1.crt" -days 3650 -subj "/CN=$2" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null; }
    # leaf NAME CA CN EXT
    leaf() {
      key "$1.key"
      openssl req -config req.cnf -new -key "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
      printf '%s\n' "$4" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -out "$1.crt" -days 3650 \
        -extfile "$1.ext" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    ca ca "hl7gw test CA"
    ca other-ca "hl7gw unknown CA"
    leaf broker ca localhost $'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth'
    leaf client ca hl7gw-client 'extendedKeyUsage=clientAuth'
    leaf other-client other-ca hl7gw-client 'extendedKeyUsage=clientAuth'
    cat broker.key broker.crt >broker.pem
    # Not a secret worth the name: a test broker on 127.0.0.1.
    printf 'hl7gw-test-password' >password
  )
  touch "$d/.complete"
}

# A PEM value inline in a Java properties file (Kafka reads inline PEM keys unencrypted; a PEM file needs a
# key password).
pem_prop() { awk 'BEGIN { ORS = "" } { if (NR > 1) print "\\n"; print }' "$1"; }

secure_config() {
  local d=$KAFKA_DATA_DIR/pki
  cat >>"$dir/server.properties" <<PROPS
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SASL_SSL://127.0.0.1:$((port + 2)),MTLS://127.0.0.1:$((port + 3))
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$((port + 2)),MTLS://127.0.0.1:$((port + 3))
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.mtls.ssl.client.auth=required
ssl.keystore.type=PEM
ssl.keystore.certificate.chain=$(pem_prop "$d/broker.crt")
ssl.keystore.key=$(pem_prop "$d/broker.key")
ssl.truststore.type=PEM
ssl.truststore.certificates=$(pem_prop "$d/ca.crt")
PROPS
}

# With KAFKA_SECURE=1: the secure listeners answer (a broker started without it has none) and the SCRAM user
# exists (a data dir formatted before KAFKA_SECURE=1 has none; setting it again is harmless).
secure_ready() {
  [ "$KAFKA_SECURE" = 1 ] || return 0
  port_open $((port + 2)) 127.0.0.1 && port_open $((port + 3)) 127.0.0.1 ||
    { log "no TLS listeners on $((port + 2))/$((port + 3)): this broker was started without KAFKA_SECURE=1 (down, then up)"; return 1; }
  scram_user hl7gw "$(cat "$KAFKA_DATA_DIR/pki/password")"
}

formatted() { [ -f "$dir/logs/meta.properties" ]; }

format() {
  local scram=()
  if [ "$KAFKA_SECURE" = 1 ]; then
    scram=(--add-scram "SCRAM-SHA-512=[name=hl7gw,password=$(cat "$KAFKA_DATA_DIR/pki/password")]")
  fi
  java_run kafka.tools.StorageTool format -t "$1" -c "$dir/server.properties" "${scram[@]}" >/dev/null
}

launch() {
  local extra=()
  if [ -n "${KAFKA_JVM_OPTS:-}" ]; then read -r -a extra <<<"$KAFKA_JVM_OPTS"; fi
  nohup bash -c 'exec "$@"' _ java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    "${extra[@]}" -Dlog4j2.configurationFile="$dir/log4j2.properties" -cp "$libs/*" \
    kafka.Kafka "$dir/server.properties" >"$dir/kafka.log" 2>&1 9>&- &
  echo $! >"$pidfile"
}

# wait_listening DEADLINE: the selected node accepts connections on its client port.
wait_listening() {
  until port_open; do
    if ! running; then log "$name exited; see $dir/kafka.log"; tail -n 20 "$dir/kafka.log" >&2; return 1; fi
    if [ $SECONDS -ge "$1" ]; then log "$name not listening on $KAFKA_HOST:$port in time"; return 1; fi
    sleep 0.3
  done
}

# wait_unfenced DEADLINE ID...: the cluster lists each of these nodes as an unfenced broker.
wait_unfenced() {
  local deadline=$1 i got missing; shift
  while :; do
    # A tool that fails while a node restarts is a retry, not the end of the script (set -e).
    got=$(unfenced) || got=""
    missing=()
    for i; do grep -qx "$i" <<<"$got" || missing+=("$i"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ $SECONDS -ge "$deadline" ]; then log "node(s) ${missing[*]} not unfenced brokers in time"; return 1; fi
    sleep 0.5
  done
}

wait_ready() {
  local deadline=$((SECONDS + ${1:-90})) i
  for i in $(ids); do at "$i"; wait_listening "$deadline" || return 1; done
  if [ "$KAFKA_NODES" -gt 1 ]; then wait_unfenced "$deadline" $(ids); fi
}

lock() {
  mkdir -p "$KAFKA_DATA_DIR"
  # Tests of several binaries may ask for the same broker at once: one of them starts it.
  exec 9>"$KAFKA_DATA_DIR.lock"
  flock -w 300 9 || { log "timed out waiting for another start of this broker"; return 1; }
}

# A cluster's size is fixed when it is formatted.
same_size() {
  if [ -f "$KAFKA_DATA_DIR/nodes" ] && [ "$(cat "$KAFKA_DATA_DIR/nodes")" != "$KAFKA_NODES" ]; then
    log "$KAFKA_DATA_DIR holds a cluster of $(cat "$KAFKA_DATA_DIR/nodes") nodes, not $KAFKA_NODES"; return 1
  fi
}

# start_nodes ID...: configure, format (once, in parallel) and launch these nodes of a cluster.
start_nodes() {
  local i cid pids=() p
  same_size
  echo "$KAFKA_NODES" >"$KAFKA_DATA_DIR/nodes"
  if [ ! -s "$KAFKA_DATA_DIR/cluster.id" ]; then
    at 1
    mkdir -p "$dir"
    configure
    java_run kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1 >"$KAFKA_DATA_DIR/cluster.id"
  fi
  cid=$(cat "$KAFKA_DATA_DIR/cluster.id")
  for i; do
    at "$i"
    if port_open "$port" || port_open "$cport" 127.0.0.1; then log "$name: $KAFKA_HOST:$port or 127.0.0.1:$cport is in use"; return 1; fi
    configure
    if ! formatted; then format "$cid" & pids+=($!); fi
  done
  for p in "${pids[@]}"; do wait "$p" || { log "formatting failed"; return 1; }; done
  for i; do at "$i"; launch; done
}

up() {
  lock
  if [ "$KAFKA_NODES" -eq 1 ]; then
    at 1
    if running; then log "already running on $KAFKA_HOST:$KAFKA_PORT (pid $(cat "$pidfile"))"; wait_ready 120; secure_ready; return; fi
    fetch
    configure
    if ! formatted; then format "$(java_run kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"; fi
    launch
    wait_ready 120
    secure_ready
    log "up on $KAFKA_HOST:$KAFKA_PORT (pid $(cat "$pidfile"), data in $KAFKA_DATA_DIR)"
    return
  fi
  local i todo=()
  same_size
  for i in $(ids); do at "$i"; running || todo+=("$i"); done
  if [ ${#todo[@]} -eq 0 ]; then
    log "already running: $KAFKA_NODES nodes on $(brokers)"
  else
    fetch
    start_nodes "${todo[@]}"
  fi
  wait_ready 180
  log "up: $KAFKA_NODES nodes on $(brokers) (controllers $(controllers), data in $KAFKA_DATA_DIR)"
}

# stop_pid PID: SIGTERM, then SIGKILL after 30 s.
stop_pid() {
  kill "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.3; done
  kill -0 "$1" 2>/dev/null && kill -9 "$1"
  return 0
}

down() {
  if [ "$KAFKA_NODES" -eq 1 ]; then
    at 1
    if ! running; then rm -f "$pidfile"; log "not running"; return; fi
    local pid; pid=$(cat "$pidfile")
    stop_pid "$pid"
    rm -f "$pidfile"
    log "stopped (pid $pid)"
    return
  fi
  local i pids=() stopped=()
  for i in $(ids); do
    at "$i"
    if running; then pids+=("$(cat "$pidfile")") stopped+=("$i"); kill "${pids[-1]}"; fi
  done
  for i in "${pids[@]}"; do stop_pid "$i"; done
  for i in $(ids); do at "$i"; rm -f "$pidfile"; done
  if [ ${#stopped[@]} -eq 0 ]; then log "not running"; else log "stopped node(s) ${stopped[*]} (pids ${pids[*]})"; fi
}

stop_node() {
  node_arg "$1"
  if ! running; then rm -f "$pidfile"; log "$name not running"; return; fi
  local pid t=$SECONDS; pid=$(cat "$pidfile")
  stop_pid "$pid"
  rm -f "$pidfile"
  log "$name stopped (pid $pid, $((SECONDS - t)) s)"
}

kill_node() {
  node_arg "$1"
  if ! running; then rm -f "$pidfile"; log "$name not running"; return; fi
  local pid; pid=$(cat "$pidfile")
  kill -9 "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$pidfile"
  log "$name killed (pid $pid)"
}

start_node() {
  node_arg "$1"
  if [ "$KAFKA_NODES" -eq 1 ]; then up; return; fi
  lock
  if running; then
    log "$name already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"
  else
    fetch
    start_nodes "$1"
    node_arg "$1"
  fi
  local deadline=$((SECONDS + 120))
  wait_listening "$deadline"
  wait_unfenced "$deadline" "$1"
  log "$name up on 127.0.0.1:$port (pid $(cat "$pidfile"))"
}

status() {
  local i bad=0
  for i in $(ids); do
    at "$i"
    if running && port_open; then
      line="running on 127.0.0.1:$port (pid $(cat "$pidfile"))"
    else
      line="not running" bad=1
      [ "$KAFKA_NODES" -gt 1 ] && line="not running (127.0.0.1:$port)"
    fi
    if [ "$KAFKA_NODES" -eq 1 ]; then echo "$line"; else echo "node $i: $line"; fi
  done
  return $bad
}

# The active controller as the quorum reports it; a leader that is not running (just killed) is asked again
# until a live one is elected (30 s at most).
controller() {
  local deadline=$((SECONDS + 30)) leader
  while :; do
    # A quorum that is still electing makes the tool fail: that is a retry, not the end (set -e).
    leader=$(tool org.apache.kafka.tools.MetadataQuorumCommand --bootstrap-controller "$(controllers)" \
      --command-config "$KAFKA_DATA_DIR/tools.properties" describe --status 2>/dev/null |
      sed -n 's/^LeaderId:[[:space:]]*\([0-9][0-9]*\)[[:space:]]*$/\1/p') || leader=""
    if [ -n "$leader" ] && [ "$leader" -ge 1 ] && [ "$leader" -le "$KAFKA_NODES" ]; then
      at "$leader"
      if running && port_open "$cport" 127.0.0.1; then echo "$leader"; return; fi
    fi
    if [ $SECONDS -ge $deadline ]; then log "no live active controller found"; return 1; fi
    sleep 0.5
  done
}

# scram_user NAME PASSWORD: create the user or set its password (through the plaintext listener).
scram_user() {
  [ -n "${1:-}" ] && [ -n "${2:-}" ] || { log "usage: scram-user NAME PASSWORD"; exit 2; }
  tool kafka.admin.ConfigCommand --bootstrap-server "$KAFKA_HOST:$KAFKA_PORT" \
    --command-config "$KAFKA_DATA_DIR/tools.properties" --alter --entity-type users --entity-name "$1" \
    --add-config "SCRAM-SHA-512=[password=$2]" >/dev/null
}

create_topic() {
  [ -n "${1:-}" ] && [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { log "usage: create-topic NAME PARTITIONS"; exit 2; }
  tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(brokers)" \
    --command-config "$KAFKA_DATA_DIR/tools.properties" --create --if-not-exists --topic "$1" --partitions "$2" >/dev/null
}

# Internal topics (__consumer_offsets, __transaction_state) are listed too: their partitions are part of a bench's shape.
topics() {
  tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(brokers)" \
    --command-config "$KAFKA_DATA_DIR/tools.properties" --describe 2>/dev/null |
    sed -n 's/^Topic: \([^[:space:]]*\)[[:space:]].*PartitionCount: \([0-9]*\)[[:space:]]*ReplicationFactor: \([0-9]*\).*/\1 \2 \3/p' |
    awk -v p="${1:-}" 'index($1, p) == 1 { printf "%s partitions=%s replication=%s\n", $1, $2, $3 }' | sort
}

config() {
  local add=() del=() kv
  for kv; do if [ -z "${kv#*=}" ]; then del+=("${kv%%=*}"); else add+=("$kv"); fi; done
  local args=()
  [ ${#add[@]} -eq 0 ] || args+=(--add-config "$(IFS=,; echo "${add[*]}")")
  [ ${#del[@]} -eq 0 ] || args+=(--delete-config "$(IFS=,; echo "${del[*]}")")
  [ ${#args[@]} -gt 0 ] || { log "usage: config KEY=VALUE..."; exit 2; }
  tool kafka.admin.ConfigCommand --bootstrap-server "$(brokers)" --command-config "$KAFKA_DATA_DIR/tools.properties" \
    --alter --entity-type brokers --entity-default "${args[@]}" >/dev/null
  log "set on the running brokers: $*"
}

fresh() {
  down >/dev/null 2>&1 || true
  rm -rf "$KAFKA_DATA_DIR"
  up
}

settings() {
  at 1
  grep -v -E '^(#|$)|password|pem' "$dir/server.properties"
  echo "jvm: -Xmx$KAFKA_HEAP -XX:+UseG1GC ${KAFKA_JVM_OPTS:-}"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  fresh) fresh ;;
  status) status ;;
  wait) wait_ready "${2:-90}" ;;
  fetch) fetch ;;
  kill) kill_node "${2:-}" ;;
  stop) stop_node "${2:-}" ;;
  start) start_node "${2:-}" ;;
  brokers) brokers ;;
  controller) controller ;;
  scram-user) scram_user "${2:-}" "${3:-}" ;;
  create-topic) create_topic "${2:-}" "${3:-}" ;;
  topics) topics "${2:-}" ;;
  settings) settings; tool kafka.admin.ConfigCommand --bootstrap-server "$(brokers)" \
    --command-config "$KAFKA_DATA_DIR/tools.properties" --describe --entity-type brokers --entity-default 2>/dev/null |
    sed -n 's/^ *\([a-z.]*=[^ ]*\) sensitive=.*/\1 (dynamic)/p' ;;
  config) shift; config "$@" ;;
  *) echo "usage: $0 up|down|fresh|status|wait|fetch|kill N|stop N|start N|brokers|controller|scram-user NAME PASSWORD|create-topic NAME PARTITIONS|topics [PREFIX]|config KEY=VALUE...|settings" >&2; exit 2 ;;
esac
