#!/usr/bin/env bash
# `make run`: the hl7gw CLI end to end on this machine, on the bundled synthetic samples.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/hl7gw
echo "== flat view of samples/adt_a01.hl7"
"$bin" flat samples/adt_a01.hl7 | head -c 400; echo " ..."
echo "== the ACK the gateway would send for samples/oru_r01.hl7"
"$bin" ack samples/oru_r01.hl7
