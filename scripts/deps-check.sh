#!/usr/bin/env bash
# The dependency checks of `make lint`:
#   cargo-machete 0.9.2   no crate declares a dependency it does not use
#   cargo-deny    0.20.2  licences (deny.toml's allow list), bans (one version of each crate but the second
#                         versions deny.toml's `skip` names with their reasons; no crate it bans), sources (crates.io
#                         only) and advisories (RustSec: vulnerable, unsound or unmaintained crates).
# Both are built once from crates.io into .cache/tools/<name>-<version>/ (about 1 and 6 minutes on 2 cores).
#
# Advisories need the RustSec database, a git repository on GitHub, which these machines cannot reach (no registry
# serves it). It is read offline from .cache/advisory-db/ when a copy is there; otherwise the check says so and
# when it last ran (docs/security.md, "Dependencies"). To get a copy:
#   scripts/deps-check.sh advisories                   where GitHub is reachable: fetches it (cargo deny fetch db)
#   ADVISORY_DB=/path/to/advisory-db scripts/deps-check.sh advisories    from a clone made elsewhere
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
MACHETE_VERSION=0.9.2
DENY_VERSION=0.20.2
tools=$root/.cache/tools

log() { printf 'deps-check: %s\n' "$*" >&2; }

# cargo_tool NAME VERSION: the path of NAME's binary, built once with `cargo install --locked`.
cargo_tool() {
  local name=$1 version=$2 dir=$tools/$1-$2 t0=$SECONDS
  if [ ! -x "$dir/bin/$name" ]; then
    log "cargo install $name $version (once; cached in ${dir#"$root"/})"
    mkdir -p "$dir"
    nice -n 10 cargo install --quiet --locked --root "$dir" --version "$version" "$name" >"$dir/build.log" 2>&1 ||
      { tail -n 20 "$dir/build.log" >&2; log "cargo install $name failed (log: $dir/build.log)"; exit 1; }
    log "  done in $((SECONDS - t0)) s"
  fi
  printf '%s\n' "$dir/bin/$name"
}

deny=$(cargo_tool cargo-deny "$DENY_VERSION")
cd "$root"
# Where cargo-deny keeps the database of deny.toml's db-urls (its folder name is a hash of the URL).
db=$root/.cache/advisory-db/advisory-db-3157b0e258782691
# The date of the last run against a database, and that database's own date (docs/security.md says the same).
LAST_CHECKED="2026-11-27, against the database of 2026-08-21 (bf5c0d2): 0 advisories"

if [ "${1:-}" = advisories ]; then
  if [ -n "${ADVISORY_DB:-}" ]; then
    rm -rf "$db" && mkdir -p "$(dirname "$db")"
    git clone --quiet "$ADVISORY_DB" "$db" || { log "cannot clone $ADVISORY_DB"; exit 1; }
  else
    "$deny" --log-level error fetch db ||
      { log "cannot fetch the RustSec database (GitHub unreachable?): set ADVISORY_DB to a clone"; exit 1; }
  fi
fi

machete=$(cargo_tool cargo-machete "$MACHETE_VERSION")
"$machete" --with-metadata
"$deny" --log-level error check licenses bans sources
if [ -d "$db/.git" ]; then
  "$deny" --offline --log-level error check advisories
  log "advisories: none, against the RustSec database of $(git -C "$db" log -1 --format=%cs) ($(git -C "$db" rev-parse --short HEAD))"
else
  log "advisories NOT checked: no RustSec database in ${db#"$root"/} (see this script's header); last checked $LAST_CHECKED"
fi
log "dependencies: none unused; licences, bans and sources as deny.toml says"
