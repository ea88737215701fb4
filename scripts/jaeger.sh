#!/usr/bin/env bash
# A real Jaeger v2 on 127.0.0.1 for looking at the gateway's traces: the services export OpenTelemetry spans over
# OTLP/gRPC when OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/observability.md), and Jaeger stores them in memory and
# serves them on its HTTP API. For people at a workstation (`make jaeger-up`), and for services/egress/tests/jaeger.rs,
# which starts its own (other ports, its own JAEGER_DIR) and checks the pipeline's traces through the query API;
# scripts/test.sh builds the binary before the tests.
#
#   scripts/jaeger.sh build | up | down | status
#
#   build   build the binary once (idempotent; instant when cached) and print its path
#   up      build, then start Jaeger (stops a running one first) and wait until its query API answers
#   down    stop it by PID and wait for it to exit
#   status  show the process and the services it has seen; exit 1 when not running
#
# Listens on (all 127.0.0.1 only):
#   JAEGER_OTLP_GRPC_PORT   OTLP/gRPC receiver: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317   (4317)
#   JAEGER_OTLP_HTTP_PORT   OTLP/HTTP receiver                                                     (4318)
#   JAEGER_QUERY_PORT       query HTTP API: /api/services, /api/traces?service=hl7gw-ingress       (16686)
#   JAEGER_QUERY_GRPC_PORT  query gRPC API                                                         (16685)
# Other settings: JAEGER_MAX_TRACES (memory storage, oldest dropped first; 100000), JAEGER_TIMEOUT (seconds `up`
# waits; 60), JAEGER_UI_ASSETS (a directory with a jaeger-ui build, served on the query port; none).
# Config, log and PID file: JAEGER_DIR (.cache/jaeger/; config.yaml is rewritten by every `up`); one Jaeger per
# JAEGER_DIR, so a test's (its own JAEGER_DIR) and a workstation's run side by side.
#
# Binary: Jaeger's release tarballs and images live on hosts this machine cannot reach, so cmd/jaeger is built from
# the Go module proxy through the wrapper module scripts/jaeger (Jaeger's own go.sum; Jaeger v2 is published as
# github.com/jaegertracing/jaeger v1.x: v1.76.0 = v2.13.0, the newest the proxy serves). It lands in
# .cache/tools/jaeger-v2.13.0/bin/jaeger; one cold build at nice 10 takes 7-15 min on 2 cores (6 min 55 s measured
# with an empty Go build cache beside a running make test, 335 s of CPU; downloading all the modules into an empty
# module cache takes another ~1 min, 1.3 GB). One Go build at a time on this machine (the shared lock
# .cache/.go-build.lock, as scripts/tools.sh, cluster.sh and k6.sh take it).
# The module carries no web UI assets (Jaeger's release build embeds them from the jaeger-ui repository), so
# http://127.0.0.1:16686/ shows only Jaeger's placeholder page: use the HTTP API, or set JAEGER_UI_ASSETS to a
# jaeger-ui build of your own (see docs/observability.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
JAEGER_VERSION=v2.13.0
JAEGER_MODULE_VERSION=v1.76.0 # what scripts/jaeger/go.mod requires
wrapper=$root/scripts/jaeger
tooldir=$root/.cache/tools/jaeger-$JAEGER_VERSION
bin=$tooldir/bin/jaeger
JAEGER_DIR=${JAEGER_DIR:-$root/.cache/jaeger}
JAEGER_OTLP_GRPC_PORT=${JAEGER_OTLP_GRPC_PORT:-4317}
JAEGER_OTLP_HTTP_PORT=${JAEGER_OTLP_HTTP_PORT:-4318}
JAEGER_QUERY_PORT=${JAEGER_QUERY_PORT:-16686}
JAEGER_QUERY_GRPC_PORT=${JAEGER_QUERY_GRPC_PORT:-16685}
JAEGER_MAX_TRACES=${JAEGER_MAX_TRACES:-100000}
JAEGER_TIMEOUT=${JAEGER_TIMEOUT:-60}
JAEGER_UI_ASSETS=${JAEGER_UI_ASSETS:-}
pidfile=$JAEGER_DIR/jaeger.pid
logfile=$JAEGER_DIR/jaeger.log
config=$JAEGER_DIR/config.yaml

log() { printf 'jaeger: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# --- build: from the Go module proxy -----------------------------------------------------------------------------

ldflags() {
  local p=github.com/jaegertracing/jaeger/internal/version
  printf '%s' "-s -w -X $p.latestVersion=$JAEGER_VERSION -X $p.commitSHA=module-$JAEGER_MODULE_VERSION"
}

# The stamp changes when the wrapper module or the flags do, and then build runs again.
stamp() { cat "$wrapper/go.mod" "$wrapper/go.sum" <(ldflags) | sha256sum | cut -c1-16; }

# shellcheck source=scripts/lib/gobuild.sh
. "$root/scripts/lib/gobuild.sh"

build() {
  local want; want=$(stamp)
  grep -Eq "^\s+github.com/jaegertracing/jaeger $JAEGER_MODULE_VERSION( |\$)" "$wrapper/go.mod" ||
    die "scripts/jaeger/go.mod does not require github.com/jaegertracing/jaeger $JAEGER_MODULE_VERSION"
  go_build_once "$tooldir" "$want" "Jaeger $JAEGER_VERSION" build_jaeger
  printf '%s\n' "$bin"
}

# go_build_once's command: in a copy of the wrapper module, so that nothing can ever touch the committed go.mod/go.sum.
build_jaeger() {
  local src=$tooldir/src
  mkdir -p "$src" && cp "$wrapper/go.mod" "$wrapper/go.sum" "$src/" && cd "$src" &&
    GOFLAGS="-mod=readonly -buildvcs=false" nice -n 10 go build -trimpath -ldflags "$(ldflags)" -o "$bin" \
      github.com/jaegertracing/jaeger/cmd/jaeger &&
    "$bin" version && rm -rf "$src"
}

# --- processes ---------------------------------------------------------------------------------------------------

# Alive and not a zombie (an unreaped exited daemon must not count as running).
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null; }

# The PID in the file, if that process is alive and still runs jaeger (PIDs get reused).
pid_of() {
  local pid argv0
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  alive "$pid" || return 1
  argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1)
  [ "${argv0##*/}" = jaeger ] || return 1
  echo "$pid"
}

down() {
  local pid
  if pid=$(pid_of); then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then
      log "pid $pid ignored TERM for 15 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      while alive "$pid"; do sleep 0.1; done
    fi
    log "stopped (pid $pid)"
  fi
  rm -f "$pidfile"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_config() {
  local ui="" # jaeger_query's ui: block, when there are assets to serve
  if [ -n "$JAEGER_UI_ASSETS" ]; then
    [ -f "$JAEGER_UI_ASSETS/index.html" ] || die "JAEGER_UI_ASSETS=$JAEGER_UI_ASSETS has no index.html (a jaeger-ui build/ directory)"
    ui=$(printf '    ui:\n      assets_path: %s' "$(cd "$JAEGER_UI_ASSETS" && pwd)")
  fi
  cat >"$config" <<EOF
# Written by scripts/jaeger.sh up: Jaeger $JAEGER_VERSION, loopback only, traces in memory.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none # no :8888 listener for Jaeger's own metrics
    logs:
      level: info

extensions:
  jaeger_query:
    storage:
      traces: memstore
    # No traces of Jaeger's own query API: only the gateway's spans go into the store.
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:$JAEGER_QUERY_PORT
    grpc:
      endpoint: 127.0.0.1:$JAEGER_QUERY_GRPC_PORT${ui:+
$ui}

  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: $JAEGER_MAX_TRACES

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$JAEGER_OTLP_GRPC_PORT
      http:
        endpoint: 127.0.0.1:$JAEGER_OTLP_HTTP_PORT

processors:
  batch:

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
EOF
}

api_ready() { curl -fsS --max-time 2 "http://127.0.0.1:$JAEGER_QUERY_PORT/api/services" >/dev/null 2>&1; }

up() {
  local jaeger p deadline
  jaeger=$(build)
  mkdir -p "$JAEGER_DIR"
  down
  for p in "$JAEGER_OTLP_GRPC_PORT" "$JAEGER_OTLP_HTTP_PORT" "$JAEGER_QUERY_PORT" "$JAEGER_QUERY_GRPC_PORT"; do
    port_free "$p" || die "127.0.0.1:$p is in use (another Jaeger or collector?); set the JAEGER_*_PORT variables"
  done
  write_config
  # 8>&- 9>&-: the lock files stay ours; a daemon holding them would block the next build/up/down forever.
  setsid "$jaeger" --config "$config" >"$logfile" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$pidfile"
  deadline=$((SECONDS + JAEGER_TIMEOUT))
  until api_ready; do
    alive "$(cat "$pidfile")" || { tail -n 20 "$logfile" >&2; rm -f "$pidfile"; die "jaeger exited (log: $logfile)"; }
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 20 "$logfile" >&2; die "jaeger not ready after ${JAEGER_TIMEOUT}s (log: $logfile)"; }
    sleep 0.2
  done
  log "up (pid $(cat "$pidfile")): Jaeger $JAEGER_VERSION, traces in memory (log: ${logfile#"$root"/})"
  log "  send:  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$JAEGER_OTLP_GRPC_PORT (OTLP/gRPC; OTLP/HTTP on :$JAEGER_OTLP_HTTP_PORT)"
  log "  query: curl -s 'http://127.0.0.1:$JAEGER_QUERY_PORT/api/traces?service=hl7gw-ingress&limit=20'"
  if [ -n "$JAEGER_UI_ASSETS" ]; then log "  UI:    http://127.0.0.1:$JAEGER_QUERY_PORT/ (assets: $JAEGER_UI_ASSETS)"
  else log "  no web UI in this build (JAEGER_UI_ASSETS; docs/observability.md)"; fi
  log "  stop:  make jaeger-down"
}

status() {
  local pid
  pid=$(pid_of) || { log "not running"; return 1; }
  log "running (pid $pid), config ${config#"$root"/}, log ${logfile#"$root"/}"
  if api_ready; then
    log "services seen: $(curl -fsS --max-time 2 "http://127.0.0.1:$JAEGER_QUERY_PORT/api/services")"
  else
    log "query API on 127.0.0.1:$JAEGER_QUERY_PORT does not answer"; return 1
  fi
}

case "${1:-}" in
  build) build ;;
  up | down | status)
    mkdir -p "$JAEGER_DIR"
    exec 9>"$JAEGER_DIR.lock"
    flock 9 # one up/down at a time
    "$1"
    ;;
  *) echo "usage: $0 build|up|down|status" >&2; exit 2 ;;
esac
