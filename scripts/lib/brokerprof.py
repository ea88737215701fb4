#!/usr/bin/env python3
"""Where a Kafka broker's CPU goes during a bench phase (scripts/bench-pipeline.sh, BENCH_BROKER_PROFILE=1).

Three sources, each read before and after the phase:
- the CPU time (user + system) of every thread of the broker's JVM, from /proc/PID/task/TID/stat: exact, GC and
  JIT threads included; named with `jcmd PID Thread.print` (the native id of each thread, Java's or the VM's);
- the phase's part of the Flight Recording the broker runs from its start (JFR_OPTS in KAFKA_JVM_OPTS,
  settings=profile: a stack sample of each running thread every 10-20 ms; `jcmd PID JFR.dump begin= end=`): the
  request handler threads' CPU is split by the request they were serving (the `KafkaApis.handleXxx` frame of
  each sample) and, inside it, the samples appending to a log. (A recording started for each phase instead made
  the JIT recompile what it instruments, in the phase: the broker's CPU doubled.);
- the broker's own request counts by API (JMX `kafka.network:type=RequestMetrics,name=RequestsPerSec`, read with
  Kafka's JmxTool): what it answered, including what no client of ours sent (the transaction coordinator's
  verifications, WriteTxnMarkers).
The JVM must listen for JMX on 127.0.0.1 (JMX_OPTS below, in KAFKA_JVM_OPTS).
"""
import collections
import os
import re
import subprocess
import time

JMX_PORT = int(os.environ.get("BENCH_JMX_PORT", "29699"))
JMX_OPTS = (f"-Dcom.sun.management.jmxremote.port={JMX_PORT} -Dcom.sun.management.jmxremote.rmi.port={JMX_PORT} "
            "-Dcom.sun.management.jmxremote.authenticate=false -Dcom.sun.management.jmxremote.ssl=false "
            "-Djava.rmi.server.hostname=127.0.0.1 -Dcom.sun.management.jmxremote.host=127.0.0.1")
JFR_OPTS = "-XX:StartFlightRecording=name=bench,settings=profile,maxage=60m"
TCK = os.sysconf("SC_CLK_TCK")
LIBS = ".cache/kafka-4.3.1/libs"

# Thread name (Java's, or the VM's for its own threads) -> the cause its CPU counts for. First match wins.
GROUPS = [
    (r"kafka-request-handler", "request handlers"),
    (r"network-thread|socket-acceptor", "network threads (read, parse, write every request)"),
    (r"group-coordinator|share-coordinator|coordinator-event", "group coordinator (offset commits, joins)"),
    (r"TxnMarkerSenderThread", "transaction markers sent (WriteTxnMarkers)"),
    (r"AddPartitionsToTxnSenderThread", "verification requests sent (AddPartitionsToTxn)"),
    (r"ReplicaFetcherThread|replica", "replication"),
    (r"^GC Thread|^G1 |^VM Thread", "GC and safepoints"),
    (r"CompilerThread|Sweeper", "JIT compiler"),
    (r"raft|quorum|controller|metadata|broker-\d+-", "KRaft, controller and metadata"),
    (r"ExpirationReaper|kafka-scheduler|log-cleaner|executor-|LogDirFailure", "timers, log scheduler, purgatory reapers"),
]


def group_of(name):
    for pattern, group in GROUPS:
        if re.search(pattern, name):
            return group
    return "other threads"


def thread_ticks(pid):
    """{tid: CPU ticks (user + system)} of every live thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[int(tid)] = int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return out


def thread_names(pid):
    """{tid: name} from `jcmd PID Thread.print` (`"name" ... nid=0x1f2e`), VM threads included."""
    text = subprocess.run(["jcmd", str(pid), "Thread.print"], capture_output=True, text=True).stdout
    names = {}
    for m in re.finditer(r'^"(.*?)".*?nid=(0x[0-9a-f]+|\d+)', text, re.M):
        nid = m.group(2)
        names[int(nid, 16) if nid.startswith("0x") else int(nid)] = m.group(1)
    return names


def jmx_counts():
    """{api: requests answered so far} from the broker's RequestMetrics (all versions summed)."""
    r = subprocess.run(
        ["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{LIBS}/*",
         "org.apache.kafka.tools.JmxTool", "--jmx-url", f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{JMX_PORT}/jmxrmi",
         "--object-name", "kafka.network:type=RequestMetrics,name=RequestsPerSec,*", "--attributes", "Count",
         "--one-time", "true", "--report-format", "tsv"], capture_output=True, text=True)
    counts = collections.Counter()
    for line in r.stdout.splitlines():
        m = re.match(r"kafka\.network:.*request=([A-Za-z]+).*:Count\t(\d+)", line)
        if m:
            counts[m.group(1)] += int(m.group(2))
    return counts


def jfr(pid, *args):
    subprocess.run(["jcmd", str(pid), *args], capture_output=True, text=True)


class Phase:
    """One phase's profile: start() before the load, stop() after; result() is the breakdown."""

    def __init__(self, pid, name, out_dir):
        self.pid, self.name, self.file = pid, name, os.path.abspath(f"{out_dir}/broker-{name}.jfr")

    def start(self):
        self.jmx0 = jmx_counts()
        self.begin = time.time()
        self.ticks0 = thread_ticks(self.pid)

    def stop(self):
        self.ticks1 = thread_ticks(self.pid)
        self.names = thread_names(self.pid)
        self.end = time.time()
        iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        jfr(self.pid, "JFR.dump", "name=bench", f"begin={iso(self.begin)}", f"end={iso(self.end + 1)}",
            f"filename={self.file}")
        self.jmx1 = jmx_counts()

    def samples(self):
        """The request handler threads' samples in the phase (execution and native, not the waiting ones),
        counted by (the API whose KafkaApis.handleXxx frame they are in, whether they append to a log)."""
        if not os.path.exists(self.file):
            return collections.Counter()
        text = subprocess.run(["jfr", "print", "--stack-depth", "400", "--events",
                               "jdk.ExecutionSample,jdk.NativeMethodSample", self.file],
                              capture_output=True, text=True).stdout
        by_api = collections.Counter()
        # startTime is printed as local time of day (HH:MM:SS.mmm); the dump holds whole chunks, so filter.
        day = lambda t: time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"
        begin, end = day(self.begin), day(self.end)
        for event in text.split("\njdk.")[1:]:
            when = re.search(r"startTime = (\d\d:\d\d:\d\d\.\d+)", event)
            if not when or not begin <= when.group(1)[:12] <= end:
                continue
            thread = re.search(r'sampledThread = "(.*?)"', event)
            if not thread or "kafka-request-handler" not in thread.group(1):
                continue
            top = re.search(r"stackTrace = \[\s*\n\s*(\S+)", event)
            if top and re.match(r"(jdk\.internal\.misc\.Unsafe\.park|java\.lang\.Object\.wait|java\.lang\.Thread\.sleep)", top.group(1)):
                continue  # waiting (for a request, a lock), not working
            handle = re.findall(r"kafka\.server\.KafkaApis\.handle([A-Za-z]+?)(?:Request)?[($]", event)
            api = handle[-1] if handle else "(no KafkaApis frame)"
            appending = re.search(r"UnifiedLog\.append|LogSegment\.append|FileRecords\.append", event)
            by_api[(api, bool(appending))] += 1
        return by_api

    def result(self, delivered):
        """Rows (cause, µs per delivered message) summing to the broker's CPU over the phase, and the request
        counts per delivered message by API."""
        n = max(delivered, 1)
        per_group = collections.Counter()
        for tid, t1 in self.ticks1.items():
            d = t1 - self.ticks0.get(tid, 0)
            if d > 0:
                per_group[group_of(self.names.get(tid, f"tid {tid}"))] += d * 1e6 / TCK / n
        rows = []
        handlers = per_group.pop("request handlers", 0.0)
        samples = self.samples()
        total_samples = sum(samples.values())
        if total_samples:
            append = sum(v for (api, app), v in samples.items() if app)
            rows.append(("request handlers: log appends (all APIs)", handlers * append / total_samples))
            by_api = collections.Counter()
            for (api, app), v in samples.items():
                if not app:
                    by_api[api] += v
            for api, v in by_api.most_common():
                rows.append((f"request handlers: {api}", handlers * v / total_samples))
        else:
            rows.append(("request handlers", handlers))
        rows += sorted(per_group.items(), key=lambda kv: -kv[1])
        requests = {api: round((self.jmx1[api] - self.jmx0.get(api, 0)) / n, 4)
                    for api in sorted(self.jmx1) if self.jmx1[api] > self.jmx0.get(api, 0)}
        return {"broker_us_by_cause": [(c, round(us, 1)) for c, us in rows],
                "handler_samples": total_samples, "broker_requests_per_delivered": requests}

