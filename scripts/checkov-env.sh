#!/usr/bin/env bash
# checkov (the infrastructure-as-code scanner of the chart's security review, scripts/chart/checkov.sh) in a venv
# of its own: creates it once, then reuses it, and prints the path of the checkov executable (stdout holds that
# path only; progress goes to stderr).
#
#   ckv=$(scripts/checkov-env.sh) && "$ckv" --version
#
# Layout, under the git-ignored .cache/:
#   checkov-<hash>/venv/   scripts/chart/checkov-requirements.txt's exact versions (checkov 3.3.30 and the 95
#                          packages it needs, installed --no-deps, wheels only: ~290 MB, ~70 s on 2 cores);
#                          <hash> covers the list (not its comments) and the base interpreter: a change to either
#                          makes a new venv
# The first setup needs PyPI; a run with the venv in place needs no network and takes milliseconds.
# PYTHON picks the base interpreter (default python3; 3.9 or newer, as checkov 3.3 needs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req=$root/scripts/chart/checkov-requirements.txt
base=${PYTHON:-python3}

# shellcheck source=scripts/lib/venv.sh
. "$root/scripts/lib/venv.sh"

pyid=$(python_id "$base" 9 "checkov needs")
version=$(sed -n 's/^checkov==//p' "$req")
[ -n "$version" ] || fail "${req#"$root"/} pins no checkov version"

env_hash=$({ grep -v "^#" "$req"; printf '%s\n' "$pyid"; } | sha256sum | cut -c1-16)
dir=$root/.cache/checkov-$env_hash
ckv=$dir/venv/bin/checkov

if ready_or_lock checkov 900 "checkov's venv" test -f "$dir/.complete"; then
  echo "$ckv"
  exit 0
fi

started=$SECONDS
log "installing checkov $version into ${dir#"$root"/} (once: ~290 MB from PyPI, about a minute on 2 cores)"
rm -rf "$dir"
mkdir -p "$dir"
make_venv "$base" "$dir/venv"
# --no-deps: the list is complete, so nothing unpinned comes in; wheels only, so nothing is compiled.
if ! nice -n 10 "$dir/venv/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
  --only-binary=:all: --no-deps -r "$req" >&2; then
  rm -rf "$dir"
  fail "could not install checkov $version with Python ${pyid%% *} (pip install -r ${req#"$root"/}, see above):
  the first setup needs PyPI; the list was made with Python 3.11, and another Python may lack wheels of some
  pinned version (the list's header says how to renew it)"
fi
"$ckv" --version >/dev/null 2>&1 || { rm -rf "$dir"; fail "checkov $version was installed but does not run"; }
touch "$dir/.complete"
log "checkov $version installed in $((SECONDS - started)) s"
# Older venvs (another list or interpreter) go.
find "$root/.cache" -mindepth 1 -maxdepth 1 -name 'checkov-*' -type d ! -path "$dir" -exec rm -rf {} +
echo "$ckv"
