# What a bench ran with, printed above its table (sourced): `bench_info TITLE [TOPIC_PREFIX]` prints the commit
# (and whether the tree had changes), the time, the cores, the topics whose names start with TOPIC_PREFIX with
# their partition counts as the broker reports them (internal topics too), and the broker's settings. Needs
# KAFKA_PORT/KAFKA_DATA_DIR/KAFKA_NODES of the bench's broker in the environment.
bench_info() {
  local dirty=""
  git diff --quiet HEAD -- services loadtest scripts 2>/dev/null || dirty=" (with uncommitted changes)"
  echo "$1 at $(git rev-parse --short HEAD)$dirty, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "topics (as the broker reports them):"
  { scripts/kafka.sh topics "${2:-}"; [ -z "${2:-}" ] || scripts/kafka.sh topics __; } | sed 's/^/  /'
  echo "broker settings (node 1):"
  scripts/kafka.sh settings |
    grep -v -E '^(node\.id|controller\.|listeners|advertised|log\.dirs|listener\.security|inter\.broker|process\.roles)' |
    sed 's/^/  /'
}
