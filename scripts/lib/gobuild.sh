# Go tools built from the Go module proxy into a folder of their own under .cache/ (sourced, after the sourcing script
# sets `root`, the repository, and defines `log MESSAGE` and `die MESSAGE`).

# go_build_once DIR STAMP WHAT BUILD...: unless DIR/.complete is there and holds STAMP (empty when DIR's name says
# enough), runs the command BUILD... in an emptied DIR with DIR/bin made: in a subshell, GOTOOLCHAIN=local and
# CGO_ENABLED=0 exported (the command sets GOFLAGS and its nice level, and puts the binaries in DIR/bin), its output
# in DIR/build.log; a failure prints the log's tail and dies, a success writes STAMP to DIR/.complete. WHAT names the
# tool in the messages. One Go build at a time on this machine: every script that builds with Go takes the lock
# .cache/.go-build.lock (fd 8) first, here released once the build is done. (The locals start with _: BUILD... runs
# inside this function and sees them.)
# shellcheck disable=SC2154 # root: the sourcing script's
go_build_once() {
  local _dir=$1 _stamp=$2 _what=$3 _t0=$SECONDS
  shift 3
  [ -f "$_dir/.complete" ] && [ "$(cat "$_dir/.complete")" = "$_stamp" ] && return
  command -v go >/dev/null || die "go is not installed"
  mkdir -p "$root/.cache"
  exec 8>"$root/.cache/.go-build.lock"
  flock 8
  if ! { [ -f "$_dir/.complete" ] && [ "$(cat "$_dir/.complete")" = "$_stamp" ]; }; then
    log "building $_what from the Go module proxy (once; log in ${_dir#"$root"/}/build.log)"
    rm -rf "$_dir"
    mkdir -p "$_dir/bin"
    (
      export GOTOOLCHAIN=local CGO_ENABLED=0
      "$@"
    ) >"$_dir/build.log" 2>&1 || { tail -n 30 "$_dir/build.log" >&2; die "the build of $_what failed (log: $_dir/build.log)"; }
    printf '%s' "$_stamp" >"$_dir/.complete"
    log "$_what built in $((SECONDS - _t0)) s"
  fi
  exec 8>&-
}
