#!/usr/bin/env bash
# The Python environment of the example consumer (examples/consumer-python): creates it once, then reuses it,
# and prints the interpreter to run the example with (stdout holds that path only; progress goes to stderr).
#
#   py=$(scripts/python-env.sh) && "$py" examples/consumer-python/consumer.py --help
#
# Layout, all under the git-ignored .cache/:
#   py-consumer-<hash>/venv/     a venv with requirements.txt's exact versions; <hash> covers requirements.txt
#                                and the base interpreter, so a change to either makes a new environment
#   py-consumer-<hash>/gen-<h>/  Python code generated from proto/ by grpcio-tools' protoc; <h> covers the
#                                .proto files; a .pth file in the venv puts the current one on sys.path
# Nothing generated is committed. A run with everything in place needs no network and takes milliseconds.
# PYTHON picks the base interpreter (default python3; 3.10 or newer).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req=$root/examples/consumer-python/requirements.txt
protos=$root/proto
base=${PYTHON:-python3}

# shellcheck source=scripts/lib/venv.sh
. "$root/scripts/lib/venv.sh"

pyid=$(python_id "$base" 10 "the pinned packages need")

env_hash=$({ cat "$req"; printf '%s\n' "$pyid"; } | sha256sum | cut -c1-16)
proto_hash=$(cd "$protos" && find . -name '*.proto' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
dir=$root/.cache/py-consumer-$env_hash
venv=$dir/venv
py=$venv/bin/python
gen=$dir/gen-$proto_hash
pth_name=hl7gw_generated.pth

ready() {
  [ -f "$dir/.complete" ] && [ -f "$gen/.complete" ] && [ -f "$dir/site" ] &&
    [ "$(cat "$(cat "$dir/site")/$pth_name" 2>/dev/null)" = "$gen" ]
}

if ready_or_lock py-consumer 600 "the Python environment" ready; then
  echo "$py"
  exit 0
fi

if [ ! -f "$dir/.complete" ]; then
  started=$SECONDS
  log "creating ${dir#"$root"/} (Python ${pyid%% *}, packages from requirements.txt)"
  rm -rf "$dir"
  mkdir -p "$dir"
  make_venv "$base" "$venv"
  # Wheels only: a missing wheel fails here with pip's message instead of compiling librdkafka or grpc.
  "$py" -m pip install --disable-pip-version-check --no-input --quiet --only-binary=:all: -r "$req" >&2 ||
    fail "pip install -r ${req#"$root"/} failed (see above); PyPI must be reachable for the first setup"
  "$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$dir/site"
  touch "$dir/.complete"
  log "packages installed in $((SECONDS - started))s"
fi

if [ ! -f "$gen/.complete" ]; then
  log "generating Python code from proto/ into ${gen#"$root"/}"
  rm -rf "$gen"
  mkdir -p "$gen"
  # grpc_tools ships the well-known types (google/protobuf/timestamp.proto) next to its protoc.
  wkt=$("$py" -c 'import importlib.resources as r; print(r.files("grpc_tools") / "_proto")')
  (cd "$protos" && find . -name '*.proto' | LC_ALL=C sort | sed 's|^\./||' |
    xargs "$py" -m grpc_tools.protoc -I. -I"$wkt" --python_out="$gen" --pyi_out="$gen") ||
    fail "protoc (grpcio-tools) failed on proto/"
  touch "$gen/.complete"
fi

# Point the venv at this generation of the code; older generations are removed.
printf '%s\n' "$gen" >"$(cat "$dir/site")/$pth_name"
find "$dir" -mindepth 1 -maxdepth 1 -name 'gen-*' ! -path "$gen" -exec rm -rf {} +
"$py" -c 'from hl7gw.v1 import envelope_pb2' ||
  fail "the generated code does not import (see above)"
echo "$py"
