# The setup of a Python venv under .cache/ (sourced by scripts/checkov-env.sh and scripts/python-env.sh, after
# they set `root`, the repository).

# log MESSAGE, fail MESSAGE: to stderr, after the sourcing script's name (`checkov-env: ...`); fail exits 1.
log() { printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2; }
fail() {
  log "$*"
  exit 1
}

# python_id BASE MINOR NEEDS: prints "VERSION EXECUTABLE" of the interpreter BASE; fails unless it is Python 3.MINOR
# or newer (NEEDS says who needs that: "checkov needs").
python_id() {
  local base=$1 id
  command -v "$base" >/dev/null 2>&1 || fail "no '$base' on PATH: install Python 3.$2 or newer (or set PYTHON)"
  id=$("$base" -c 'import sys; print(sys.version.split()[0], sys.executable)') ||
    fail "'$base' does not run"
  "$base" -c "import sys; sys.exit(sys.version_info < (3, $2))" ||
    fail "'$base' is Python ${id%% *}; $3 3.$2 or newer (set PYTHON)"
  printf '%s\n' "$id"
}

# ready_or_lock NAME SECONDS WHAT READY...: true when the command READY... succeeds, at once or after waiting for the
# lock .cache/NAME.lock (up to SECONDS; WHAT names the setup in the timeout's message); when it is false, the lock is
# held (fd 9, until the script exits) and the caller sets up. Several runs may ask at once: one sets up, the others
# wait and reuse.
# shellcheck disable=SC2154 # root: the sourcing script's
ready_or_lock() {
  local name=$1 secs=$2 what=$3
  shift 3
  "$@" && return 0
  mkdir -p "$root/.cache"
  exec 9>"$root/.cache/$name.lock"
  flock -w "$secs" 9 || fail "timed out waiting for another setup of $what"
  "$@"
}

# make_venv BASE DIR: a venv in DIR, made by the interpreter BASE (its output goes to stderr).
make_venv() {
  "$1" -m venv "$2" >&2 ||
    fail "'$1 -m venv' failed (on Debian/Ubuntu the python3-venv package provides it)"
}
