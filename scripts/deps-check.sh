#!/usr/bin/env bash
# The dependency checks of `make lint`:
#   cargo-machete 0.9.2   no crate declares a dependency it does not use
#   cargo-deny    0.20.2  licences (deny.toml's allow list), bans (no second version of a crate we pin once,
#                         no git or path dependencies from outside the workspace) and sources (crates.io only).
#                         Advisories are not checked here: the RustSec database lives on GitHub, which these
#                         machines cannot reach; run `cargo deny check advisories` where it is reachable.
# Both are built once from crates.io into .cache/tools/<name>-<version>/ (about 1 and 6 minutes on 2 cores).
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

machete=$(cargo_tool cargo-machete "$MACHETE_VERSION")
deny=$(cargo_tool cargo-deny "$DENY_VERSION")
cd "$root"
"$machete" --with-metadata
"$deny" --log-level error check licenses bans sources
log "dependencies: none unused; licences, bans and sources as deny.toml says"
