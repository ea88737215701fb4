# Processes started and stopped by PID (sourced). Daemons of scripts/cluster.sh and scripts/node.sh: PROCS_DIR
# holds each one's NAME.pid and NAME.log. A foreground script's children: `pids` and stop_children.

pidfile() { echo "$PROCS_DIR/$1.pid"; }

# Alive and not a zombie (an unreaped exited daemon must not count as running).
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null; }

# The PID in the file, if that process is alive and still runs the same program (PIDs get reused).
pid_of() {
  local f pid argv0; f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  alive "$pid" || return 1
  argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1)
  case "${argv0##*/}" in *"$1"*) echo "$pid" ;; *) return 1 ;; esac
}

# start NAME ARGS...: run in its own session, output to NAME.log, PID to NAME.pid.
start() {
  local name=$1; shift
  # 8>&- 9>&-: the lock files stay ours; a daemon holding them would block the next up/down forever.
  setsid "$@" >"$PROCS_DIR/$name.log" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$(pidfile "$name")"
  # Until the forked shell has exec'd the program, pid_of would not recognise it (and a caller would take
  # it for dead).
  for _ in $(seq 1 50); do pid_of "$name" >/dev/null && return; sleep 0.1; done
}

# stop_pid NAME: TERM, KILL after 10 s; the PID file goes.
stop_pid() {
  local name=$1 pid
  pid=$(pid_of "$name") || { rm -f "$(pidfile "$name")"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$(pidfile "$name")"
}

# Children a foreground script started in the background (pids+=($!)); stop_children sends each SIGTERM and
# waits for them all (scripts/run.sh, scripts/bench-pipeline.sh, from their EXIT trap).
pids=()
stop_children() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
