#!/usr/bin/env bash
# `make run`: the hl7gw CLI end to end on this machine, on the bundled synthetic samples.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/hl7gw
echo "== flat view of samples/adt_a01.hl7"
"$bin" flat samples/adt_a01.hl7 | head -c 400; echo " ..."
echo "== the ACK the gateway would send for samples/oru_r01.hl7"
"$bin" ack samples/oru_r01.hl7

# MLLP: a receiver on 127.0.0.1 (port chosen by the system) storing into a temporary directory, and a sender.
work=$(mktemp -d "${TMPDIR:-/tmp}/hl7gw-demo.XXXXXX")
rx_pid=""
cleanup() {
    if [[ -n "$rx_pid" ]] && kill -0 "$rx_pid" 2>/dev/null; then
        kill -TERM "$rx_pid" 2>/dev/null || true
        wait "$rx_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "== hl7gw receive --listen 127.0.0.1:0 --out $work/out"
"$bin" receive --listen 127.0.0.1:0 --out "$work/out" --idle-timeout 30 \
    >"$work/receive.out" 2>"$work/receive.log" &
rx_pid=$!
addr=""
for _ in $(seq 100); do
    addr=$(sed -n 's/^listening on //p' "$work/receive.out")
    [[ -n "$addr" ]] && break
    if ! kill -0 "$rx_pid" 2>/dev/null; then
        echo "the receiver exited:" >&2
        cat "$work/receive.log" >&2
        exit 1
    fi
    sleep 0.1
done
if [[ -z "$addr" ]]; then
    echo "the receiver did not start within 10 s:" >&2
    cat "$work/receive.log" >&2
    exit 1
fi
echo "receiver listening on $addr"

echo "== hl7gw send --to $addr samples/*.hl7 (the ACKs)"
status=0
"$bin" send --to "$addr" --timeout 10 samples/*.hl7 || status=$?
echo "send exit status: $status (0: all accepted, 1: some AE/AR/CE/CR, 2: connection/timeout error)"

echo "== files stored by the receiver"
for f in "$work"/out/*.hl7; do
    [[ -e "$f" ]] || { echo "(none)"; break; }
    echo "-- $(basename "$f") ($(wc -c <"$f") bytes)"
    tr '\r' '\n' <"$f"
done

# Stop the receiver (SIGTERM: it finishes in-flight messages and exits) and show its log.
kill -TERM "$rx_pid"
wait "$rx_pid" || true
rx_pid=""
echo "== receiver log (no message content, by design)"
cat "$work/receive.log"
exit "$status"
