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


def main(argv):
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
