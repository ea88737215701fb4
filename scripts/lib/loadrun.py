#!/usr/bin/env python3
"""Measured runs of hl7gw-load for the bench scripts, and their Markdown tables.

  loadrun.py run [--field KEY=VALUE]... [--pid NAME=PID]... -- HL7GW_LOAD_ARGS...
      Runs target/release/hl7gw-load HL7GW_LOAD_ARGS --json once and prints one JSON line: the fields, then
      msgs_per_sec, messages, seconds, p50_ms, p99_ms, max_ms, acks (the codes seen), errors, NAME_us for each
      process (its CPU time, user + system, per message, from /proc before and after the run) and load_us (the
      load client's). Per message means per message sent, warm-up included (the CPU time covers it too).
  loadrun.py table FILE KEY[=HEADER[=FORMAT]]...
      Prints the JSON lines of FILE as a Markdown table, a column per KEY (`acks` as "AA 100, AE 2";
      FORMAT a Python format spec such as ",.0f"; a numeric format right-aligns the column).
  loadrun.py rounds FILE
      bench-peers' repeated runs (a `round` field per line): one row per peer, clients and in-flight with the
      median and the range (min–max) of each figure over the rounds, then each round's ratios of hl7gw to Camel
      (durable / sync, fast / fire-and-forget, 8 sequential clients).
"""
import json
import os
import resource
import subprocess
import sys
import urllib.request

LOAD = "target/release/hl7gw-load"
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def ticks(pid):
    """CPU time (user + system) of process `pid` so far, in clock ticks."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def children_seconds():
    """CPU time (user + system) of this process's finished children so far, in seconds."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def produce_requests(metrics_url):
    """The Kafka produce requests a service has sent (hl7gw_kafka_requests_total, librdkafka statistics)."""
    text = urllib.request.urlopen(metrics_url).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("hl7gw_kafka_requests_total{") and 'api="Produce"' in line)


def measure(load_args, pids):
    """One hl7gw-load run with `load_args`, and the CPU per message of each process in `pids` (name: pid)."""
    before = {name: ticks(pid) for name, pid in pids.items()}
    load_before = children_seconds()
    run = subprocess.run([LOAD, *load_args, "--json"], capture_output=True, text=True)
    load_after = children_seconds()
    after = {name: ticks(pid) for name, pid in pids.items()}
    try:
        r = json.loads(run.stdout)
    except json.JSONDecodeError:
        sys.exit(f"loadrun: hl7gw-load {' '.join(load_args)} exited {run.returncode}: {run.stderr.strip()}")
    n = max(r["messages"] + r.get("warmup", {}).get("messages", 0), 1)
    row = {
        "msgs_per_sec": r["msgs_per_sec"], "messages": r["messages"], "seconds": r["seconds"],
        "p50_ms": r["latency_us"]["p50"] / 1000, "p99_ms": r["latency_us"]["p99"] / 1000,
        "max_ms": r["latency_us"]["max"] / 1000, "acks": {k: v for k, v in r["acks"].items() if v},
        "errors": r["errors"],
    }
    for name in pids:
        row[f"{name}_us"] = round((after[name] - before[name]) * 1e6 / TICKS_PER_SECOND / n, 1)
    row["load_us"] = round((load_after - load_before) * 1e6 / n, 1)
    return row


def table(rows, columns):
    """`rows` as a Markdown table; `columns` are KEY[=HEADER[=FORMAT]]."""
    specs = [(c.split("=", 2) + [None, None])[:3] for c in columns]
    print("| " + " | ".join(header or key for key, header, _ in specs) + " |")
    print("|" + "|".join("---:" if fmt else "---" for _, _, fmt in specs) + "|")
    for r in rows:
        cells = []
        for key, _, fmt in specs:
            v = r.get(key, "")
            if key == "acks":
                v = ", ".join(f"{k} {n}" for k, n in v.items())
            cells.append(format(v, fmt) if fmt else str(v))
        print("| " + " | ".join(cells) + " |")


def rounds(rows):
    """bench-peers' rounds as a table of medians and ranges, then the ratios of each round."""
    import statistics
    groups = {}
    for r in rows:
        groups.setdefault((r["peer"], r["clients"], r["in_flight"]), []).append(r)
    cols = [("msgs_per_sec", "msg/s", ",.0f"), ("p50_ms", "p50 ms", ".3f"), ("p99_ms", "p99 ms", ".3f"),
            ("server_us", "CPU µs/msg: server", ".1f"), ("broker_us", "broker", ".1f"),
            ("load_us", "load client", ".1f")]
    print("| peer | clients | in flight each | runs | " + " | ".join(h for _, h, _ in cols) + " | errors |")
    print("|---|---:|---:|---:|" + "---:|" * len(cols) + "---:|")
    for (peer, clients, in_flight), rs in groups.items():
        cells = []
        for key, _, fmt in cols:
            v = [r[key] for r in rs]
            cells.append(f"{format(statistics.median(v), fmt)} ({format(min(v), fmt)}–{format(max(v), fmt)})")
        print(f"| {peer} | {clients} | {in_flight} | {len(rs)} | " + " | ".join(cells)
              + f" | {sum(r['errors'] for r in rs)} |")
    def seq(peer, rnd):
        """The run of `peer` in round `rnd` with several sequential clients."""
        return next((r for r in rows if r["peer"] == peer and r["in_flight"] == 1 and r["clients"] > 1
                     and r.get("round") == rnd), None)
    print("\nEach cell: the median over the rounds (the range). Each round's ratio of msg/s, hl7gw / Camel, sequential clients:")
    for ours, theirs in (("hl7gw-durable", "camel-sync"), ("hl7gw-fast", "camel-ff")):
        ratios = []
        for rnd in sorted({r.get("round") for r in rows}):
            a, b = seq(ours, rnd), seq(theirs, rnd)
            if a and b and b["msgs_per_sec"]:
                ratios.append(a["msgs_per_sec"] / b["msgs_per_sec"])
        if ratios:
            print(f"- {ours} / {theirs}: " + ", ".join(f"{x:.2f}x" for x in ratios)
                  + f" (median {statistics.median(ratios):.2f}x)")


def main(argv):
    if argv[:1] == ["rounds"] and len(argv) == 2:
        rounds([json.loads(line) for line in open(argv[1])])
        return
    if argv[:1] == ["table"] and len(argv) > 2:
        table([json.loads(line) for line in open(argv[1])], argv[2:])
        return
    if argv[:1] != ["run"] or "--" not in argv:
        sys.exit(__doc__)
    options, load_args = argv[1:argv.index("--")], argv[argv.index("--") + 1:]
    fields, pids = {}, {}
    for flag, value in zip(options[::2], options[1::2]):
        key, _, v = value.partition("=")
        if flag == "--field":
            fields[key] = int(v) if v.isdigit() else v
        elif flag == "--pid":
            pids[key] = int(v)
        else:
            sys.exit(__doc__)
    print(json.dumps({**fields, **measure(load_args, pids)}))


if __name__ == "__main__":
    main(sys.argv[1:])
