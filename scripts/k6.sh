#!/usr/bin/env bash
# k6 for hl7gw: k6 v1.8.1 with our own `k6/x/mllp` extension (loadtest/k6), and the two scripts that drive the
# ingress over MLLP (loadtest/k6/mllp.js) and over the gRPC Ingest API (loadtest/k6/grpc.js, k6/net/grpc).
#
#   scripts/k6.sh build    build the binary once (idempotent; instant when cached), print its path
#   scripts/k6.sh path     print the binary's path (empty when not built)
#   scripts/k6.sh smoke    both scripts, 2 VUs for K6_SMOKE_SECONDS (3) each, against a debug (else release)
#                          hl7gw-ingress on ephemeral ports and the shared test broker (127.0.0.1:29092, left
#                          running); fails unless every ACK is CA and the p99 thresholds hold. Part of `make test`.
#   scripts/k6.sh bench    both scripts, 1/4/8 VUs x K6_ITERATIONS (5000) messages each and 8 VUs for
#                          K6_SECONDS (30), against a release ingress (durable ACKs; K6_ACK_MODES="fast durable"
#                          for both) and a Kafka on 127.0.0.1:29092 (K6_KAFKA_PORT; started and stopped here, as
#                          `make bench-e2e` does: do not run both at once); K6_SCRIPTS (mllp grpc) picks the
#                          scripts. 2 s of MLLP warm-up first. Prints a table; rows also in target/k6-bench/results.jsonl
#   scripts/k6.sh run SCRIPT [k6 args]   k6 run with the built binary (e.g. against your own ingress:
#                          scripts/k6.sh run loadtest/k6/mllp.js -e MLLP_ADDR=gw:2575 -e SCENARIO=sustained)
#
# Build: xk6 and the xk6 TCP extensions are not on the Go module proxy we reach, and need none of them: the
# module loadtest/k6 is a main package that calls go.k6.io/k6/cmd and blank-imports our extension, so a plain
# `go build` makes the binary from go.k6.io/k6 alone (its go.sum was copied in before `go mod tidy`). It lands in
# .cache/tools/k6-v1.8.1-mllp-<hash of the module's sources>/bin/k6, so a changed extension builds anew. One Go
# build at a time on this machine (the shared lock .cache/.go-build.lock) and at nice 10.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
K6_VERSION=v1.8.1
src=$root/loadtest/k6

log() { printf 'k6: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

src_hash() { (cd "$src" && cat go.mod go.sum main.go mllp/*.go) | sha256sum | cut -c1-12; }
dir() { printf '%s\n' "$root/.cache/tools/k6-$K6_VERSION-mllp-$(src_hash)"; }

# shellcheck source=scripts/lib/gobuild.sh
. "$root/scripts/lib/gobuild.sh"

build() {
  local d
  d=$(dir)
  grep -q "go.k6.io/k6 $K6_VERSION\$" "$src/go.mod" || die "loadtest/k6/go.mod does not require go.k6.io/k6 $K6_VERSION"
  # An empty stamp: the folder's name has the version and the sources' hash.
  go_build_once "$d" "" "k6 $K6_VERSION + k6/x/mllp" build_k6 "$d"
  printf '%s\n' "$d/bin/k6"
}

# build_k6 DIR: go_build_once's command.
build_k6() {
  cd "$src" && GOFLAGS="-buildvcs=false -mod=readonly" nice -n 10 go build -trimpath -ldflags "-s -w" -o "$1/bin/k6" . &&
    "$1/bin/k6" version
}

# --- running the ingress --------------------------------------------------------------------------------------------

ingress_pid=""
stop_ingress() {
  if [ -n "$ingress_pid" ]; then
    kill -TERM "$ingress_pid" 2>/dev/null || true
    wait "$ingress_pid" 2>/dev/null || true
    ingress_pid=""
  fi
}

# start_ingress BIN BROKERS TOPIC MODE OUTDIR: on ephemeral loopback ports; sets mllp_addr, grpc_addr, admin_addr.
start_ingress() {
  local bin=$1 brokers=$2 topic=$3 mode=$4 out=$5 line=""
  HL7GW_KAFKA__BROKERS=$brokers HL7GW_INBOUND_TOPIC=$topic HL7GW_DLQ_TOPIC=$topic.dlq HL7GW_ACK_MODE=$mode \
    RUST_LOG=${RUST_LOG:-warn} "$bin" --mllp-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
    >"$out/ingress.out" 2>"$out/ingress.log" &
  ingress_pid=$!
  for _ in $(seq 300); do
    line=$(grep -m1 'listening' "$out/ingress.out" 2>/dev/null || true)
    [ -n "$line" ] && break
    kill -0 "$ingress_pid" 2>/dev/null || { tail -n 20 "$out/ingress.log" >&2; die "hl7gw-ingress exited"; }
    sleep 0.1
  done
  [ -n "$line" ] || die "hl7gw-ingress printed no listening line"
  mllp_addr=$(sed -n 's/.* mllp=\([^ ]*\).*/\1/p' <<<"$line")
  grpc_addr=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' <<<"$line")
  admin_addr=$(sed -n 's/.* admin=\([^ ]*\).*/\1/p' <<<"$line")
  for _ in $(seq 300); do
    curl -fsS "http://$admin_addr/readyz" >/dev/null 2>&1 && return
    sleep 0.2
  done
  die "hl7gw-ingress not ready on $admin_addr within 60 s"
}

# k6_run K6 SCRIPT SUMMARY_JSON [k6 args]: the script's exit status is k6's (99 = a threshold failed).
k6_run() {
  local k6=$1 script=$2 summary=$3
  shift 3
  K6_NO_USAGE_REPORT=true "$k6" run --quiet --no-color --summary-export "$summary" \
    -e MLLP_ADDR="$mllp_addr" -e GRPC_ADDR="$grpc_addr" -e PROTO_DIR="$root/proto" "$@" "$root/$script"
}

# summary_row SUMMARY_JSON LABEL...: one JSON line with the figures of a k6 summary export.
summary_row() {
  python3 - "$@" <<'PY'
import json, sys
path, proto, mode, scenario = sys.argv[1:5]
m = json.load(open(path))["metrics"]
acc = m[f"{proto}_accepted"]
lat = m["mllp_ack_duration" if proto == "mllp" else "grpc_req_duration"]
it = m["iterations"]
print(json.dumps({"protocol": proto, "mode": mode, "scenario": scenario, "iterations": it["count"],
                  "msgs_per_sec": it["rate"], "accepted": acc["passes"], "not_accepted": acc["fails"],
                  "p50_ms": lat["med"], "p90_ms": lat["p(90)"], "p99_ms": lat["p(99)"], "max_ms": lat["max"],
                  "errors": m.get(f"{proto}_errors", {}).get("count", 0)}))
PY
}

ingress_bin() {
  if [ -n "${HL7GW_INGRESS_BIN:-}" ]; then printf '%s\n' "$HL7GW_INGRESS_BIN"; return; fi
  local b
  for b in "$root/target/debug/hl7gw-ingress" "$root/target/release/hl7gw-ingress"; do
    [ -x "$b" ] && { printf '%s\n' "$b"; return; }
  done
  die "no hl7gw-ingress in target/debug or target/release: cargo build -p hl7gw-ingress first"
}

smoke() {
  local k6 bin out secs=${K6_SMOKE_SECONDS:-3} t0=$SECONDS script proto topic rc=0
  k6=$(build)
  bin=$(ingress_bin)
  out=$root/target/k6-smoke
  rm -rf "$out"
  mkdir -p "$out"
  # The broker the tests share: started if needed and left running (scripts/test.sh stops it at the end).
  KAFKA_PORT=29092 KAFKA_DATA_DIR="$root/target/kafka-test/29092" "$root/scripts/kafka.sh" up
  topic="k6.smoke.$(date +%s).$$"
  trap stop_ingress EXIT
  start_ingress "$bin" 127.0.0.1:29092 "$topic" durable "$out"
  log "smoke: ${bin#"$root"/} mllp=$mllp_addr grpc=$grpc_addr, 2 VUs x $secs s per script"
  for script in mllp grpc; do
    if k6_run "$k6" "loadtest/k6/$script.js" "$out/$script.json" -e SCENARIO=smoke -e SECONDS="$secs" \
      >"$out/$script.out" 2>&1; then
      summary_row "$out/$script.json" "$script" durable smoke | tee "$out/$script.row" >&2
      python3 - "$out/$script.row" <<'PY' || rc=1
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["iterations"] > 0 and r["accepted"] == r["iterations"] and r["not_accepted"] == 0
sys.exit(0 if ok else f"k6 smoke: {r['protocol']}: {r['accepted']} of {r['iterations']} accepted")
PY
    else
      rc=1
      tail -n 30 "$out/$script.out" >&2
      log "smoke: $script.js failed (exit status 99 = a threshold failed; output in ${out#"$root"/}/$script.out)"
    fi
  done
  stop_ingress
  [ "$rc" = 0 ] || die "smoke failed"
  log "smoke: both scripts passed their thresholds in $((SECONDS - t0)) s"
}

bench() {
  local k6 out mode script scenario topic t0=$SECONDS
  local iters=${K6_ITERATIONS:-5000} secs=${K6_SECONDS:-30} modes=${K6_ACK_MODES:-durable}
  local scripts=${K6_SCRIPTS:-mllp grpc}
  k6=$(build)
  if [ -z "${HL7GW_INGRESS_BIN:-}" ]; then
    (cd "$root" && cargo build --release -p hl7gw-ingress >&2)
    HL7GW_INGRESS_BIN=$root/target/release/hl7gw-ingress
  fi
  out=$root/target/k6-bench
  rm -rf "$out"
  mkdir -p "$out"
  # The broker of `make bench-e2e` (same port and data dir): two benches at once would share it, and the first to
  # finish would stop it under the other.
  export KAFKA_PORT=${K6_KAFKA_PORT:-29092} KAFKA_DATA_DIR="$root/target/kafka-bench"
  "$root/scripts/kafka.sh" up
  trap 'stop_ingress; "$root/scripts/kafka.sh" down || true' EXIT
  for mode in $modes; do
    topic="k6.bench.$mode.$(date +%s)"
    start_ingress "$HL7GW_INGRESS_BIN" "127.0.0.1:$KAFKA_PORT" "$topic" "$mode" "$out"
    # Warm-up, not counted (hl7gw-load sends 200 per client first): the topic's creation, the producer id.
    k6_run "$k6" loadtest/k6/mllp.js "$out/warmup.json" -e SCENARIO=smoke -e SECONDS=2 >"$out/warmup.out" 2>&1 || true
    for script in $scripts; do
      for scenario in vus1 vus4 vus8 sustained; do
        log "bench: $mode $script.js $scenario"
        k6_run "$k6" "loadtest/k6/$script.js" "$out/$mode-$script-$scenario.json" -e SCENARIO=$scenario \
          -e ITERATIONS="$iters" -e SECONDS="$secs" >"$out/$mode-$script-$scenario.out" 2>&1 ||
          log "  thresholds failed (exit $?): see ${out#"$root"/}/$mode-$script-$scenario.out"
        summary_row "$out/$mode-$script-$scenario.json" "$script" "$mode" "$scenario" >>"$out/results.jsonl"
      done
    done
    stop_ingress
  done
  # shellcheck source=scripts/lib/benchinfo.sh
  (cd "$root" && . scripts/lib/benchinfo.sh && bench_info bench-k6 k6.bench.)
  python3 - "$out/results.jsonl" "$iters" "$secs" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
iters, secs = sys.argv[2], sys.argv[3]
run = {"vus1": ("1", f"{int(iters):,}"), "vus4": ("4", f"{int(iters):,} each"), "vus8": ("8", f"{int(iters):,} each"),
       "sustained": ("8", f"{secs} s")}
print("| protocol | mode | VUs | run | msg/s | p50 ms | p90 ms | p99 ms | max ms | accepted (CA) | not CA | errors |")
print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    vus, what = run[r["scenario"]]
    print(f'| {r["protocol"]} | {r["mode"]} | {vus} | {what} | {r["msgs_per_sec"]:,.0f} | {r["p50_ms"]:.3f} | '
          f'{r["p90_ms"]:.3f} | {r["p99_ms"]:.3f} | {r["max_ms"]:.1f} | {r["accepted"]:,} | {r["not_accepted"]} | '
          f'{r["errors"]} |')
PY
  log "bench: done in $((SECONDS - t0)) s"
}

case "${1:-}" in
  build) build ;;
  path) d=$(dir); if [ -f "$d/.complete" ]; then printf '%s\n' "$d/bin/k6"; fi ;;
  smoke) smoke ;;
  bench) bench ;;
  run)
    shift
    [ $# -ge 1 ] || die "usage: $0 run SCRIPT [k6 args]"
    k6=$(build)
    script=$1
    shift
    K6_NO_USAGE_REPORT=true exec "$k6" run -e PROTO_DIR="$root/proto" "$@" "$script"
    ;;
  *) echo "usage: $0 build|path|smoke|bench|run SCRIPT [k6 args]" >&2; exit 2 ;;
esac
