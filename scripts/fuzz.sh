#!/usr/bin/env bash
# `make fuzz`: run each cargo-fuzz target of services/hl7v2/fuzz for $1 seconds (default 60).
# Needs the nightly toolchain (rustup's nightly is on the development machines) and installs cargo-fuzz
# from crates.io into .cache/ when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
export CARGO_INSTALL_ROOT="$PWD/.cache/cargo-tools"
export PATH="$CARGO_INSTALL_ROOT/bin:$PATH"
command -v cargo-fuzz >/dev/null || cargo +nightly install --locked cargo-fuzz
cd services/hl7v2
for target in parse mllp_decode; do
  cargo +nightly fuzz run "$target" -- -max_total_time="$secs" -max_len=4096
done
