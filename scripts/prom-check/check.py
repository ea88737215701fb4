#!/usr/bin/env python3
"""The chart's dashboard and alerts against a real Prometheus scraping a running pipeline (scripts/prom-check.sh).

    check.py --bin DIR --prometheus BIN --brokers HOST:PORT --work DIR --rules FILE --dashboard FILE.json
             --fullname NAME [--namespace NS] [--report FILE.md]

Starts two ingress "pods", a transformer, an egress and three receivers (lab MLLP, fhir HTTP, a `reject` MLLP
receiver answering AR), a stand-in for kube-state-metrics and cAdvisor (served from this process: the
Deployments' desired/available replicas from the pods' /readyz, the pods' CPU and memory from /proc) and
Prometheus (scrape and rule evaluation every 2 s; every target labelled as the chart's ServiceMonitor's scrape
labels it: namespace, service, pod, job). Then:

 1. healthy: hl7gw-load's ADTs to both ingress pods plus the FEED2 sender; every dashboard panel's queries are
    run with the variables resolved as Grafana resolves them; every alert rule must be inactive, but the one the
    run provokes by configuration (HL7GWCertificateExpiry warning: the ingress's gRPC certificate is valid for 10
    days);
 2. provoked: the lab receiver stops, FEED2 goes silent, messages Kafka-ingress refuses (version 3.0), that no
    route takes (SIU) and that the reject receiver refuses (ORU) are sent, bytes outside a frame too, a broken
    HL7Route is added, one ingress pod stops; every provoked rule of the chart's group must turn pending (or
    firing when it has no `for:`) and the same rule of the short-for group must fire; the others stay inactive;
    the panels are queried again.
Every hl7gw metric name is also checked for a unit written twice (`_bytes_bytes`). Exit 1 with the reasons when
anything fails; the report (a Markdown table per panel and per rule) is written either way.
"""
import argparse
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

def free_ports(n, first=29970, last=30200):
    """n ports from first..last (below the ephemeral range) that nothing listens on now."""
    out = []
    for port in range(first, last):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
        if len(out) == n:
            return out
    raise SystemExit(f"fewer than {n} free ports in {first}-{last}")


_f = iter(free_ports(15))
P = {  # ports
    "ingress-a": {"mllp": next(_f), "grpc": next(_f), "admin": next(_f)},
    "ingress-b": {"mllp": next(_f), "grpc": next(_f), "admin": next(_f)},
    "transformer": {"grpc": next(_f), "admin": next(_f)},
    "egress": {"grpc": next(_f), "admin": next(_f)},
    "lab": next(_f),
    "fhir": next(_f),
    "reject": next(_f),
    "prometheus": next(_f),
    "exporter": next(_f),
}
SCRAPE = 2  # seconds: scrape and rule evaluation interval
# Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval), with the data source's
# scrape interval set to 2 s and a 5-minute range ($__interval 2 s, its minimum): 8 s.
RATE_INTERVAL = f"{4 * SCRAPE}s"

failures = []
t_start = time.time()


def log(msg):
    print(f"prom-check [{time.time() - t_start:5.1f}s] {msg}", file=sys.stderr, flush=True)


def fail(msg):
    failures.append(msg)
    log("FAIL " + msg)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def prom(path, **params):
    q = urllib.parse.urlencode(params, doseq=True)
    d = json.loads(http_get(f"http://127.0.0.1:{P['prometheus']}{path}?{q}", timeout=10))
    if d.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {d}")
    return d["data"]


# ---------------------------------------------------------------------------------------------------- processes
class Procs:
    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = {}

    def start(self, name, argv, env=None):
        out = open(os.path.join(self.logdir, f"{name}.log"), "wb")
        e = dict(os.environ)
        e.update(env or {})
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=e,
                                            stdin=subprocess.DEVNULL)
        return self.procs[name]

    def stop(self, name, sig=signal.SIGTERM, wait=15):
        p = self.procs.get(name)
        if not p or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def alive(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def stop_all(self):
        for name in reversed(list(self.procs)):
            self.stop(name, wait=10)


# ---------------------------------------------------------------------------------------------------- MLLP
def mllp_send(port, messages, garbage=b""):
    """Sends each message on one connection and returns the MSA-1 codes."""
    codes = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        if garbage:
            s.sendall(garbage)
        buf = b""
        for m in messages:
            s.sendall(b"\x0b" + m.replace(b"\n", b"\r") + b"\x1c\r")
            while b"\x1c\r" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    codes.append("closed")
                    return codes
                buf += chunk
            frame, buf = buf.split(b"\x1c\r", 1)
            msa = [seg for seg in frame.lstrip(b"\x0b").split(b"\r") if seg.startswith(b"MSA|")]
            codes.append(msa[0].split(b"|")[1].decode() if msa else "?")
    return codes


def message(app, mtype, cid, version="2.5", extra=""):
    return (f"MSH|^~\\&|{app}|PROMFAC|HL7GW|HL7GW|20260101120000||{mtype}|{cid}|P|{version}|||AL|NE\r"
            f"EVN||20260101120000\rPID|1||PC{cid}^^^PROMFAC^MR||CHECK^PROM\r{extra}").encode()


# ---------------------------------------------------------------------------------------------------- exporter
class Exporter:
    """kube-state-metrics' and cAdvisor's series for the pods this run started (their metric and label names)."""

    def __init__(self, ns, pods, deployments, procs):
        self.ns, self.pods, self.deployments, self.procs = ns, pods, deployments, procs

    def ready(self, pod):
        try:
            return http_get(f"http://127.0.0.1:{pod['admin']}/readyz", timeout=1) is not None
        except Exception:
            return False

    def text(self):
        lines = []
        tick = os.sysconf("SC_CLK_TCK")
        for dep, pods in self.deployments.items():
            lab = f'namespace="{self.ns}",deployment="{dep}"'
            lines.append(f"kube_deployment_spec_replicas{{{lab}}} {len(pods)}")
            lines.append(f"kube_deployment_status_replicas_available{{{lab}}} "
                         f"{sum(1 for p in pods if self.ready(self.pods[p]))}")
        for name, pod in self.pods.items():
            proc = self.procs.procs.get(name)
            if not proc or proc.poll() is not None:
                continue  # a stopped pod is gone from kube-state-metrics and cAdvisor too
            lab = f'namespace="{self.ns}",pod="{pod["pod"]}",container="{pod["container"]}"'
            try:
                stat = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
                cpu = (int(stat[11]) + int(stat[12])) / tick
                rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, IndexError, ValueError):
                continue
            lines += [
                f"container_cpu_usage_seconds_total{{{lab}}} {cpu}",
                f"container_memory_working_set_bytes{{{lab}}} {rss}",
                f'kube_pod_container_resource_requests{{{lab},resource="cpu",unit="core"}} 0.1',
                f'kube_pod_container_resource_limits{{{lab},resource="memory",unit="byte"}} 536870912',
                f"kube_pod_container_status_restarts_total{{{lab}}} 0",
            ]
        return "\n".join(lines) + "\n"

    def serve(self):
        exporter = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", P["exporter"]), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv


# ---------------------------------------------------------------------------------------------------- dashboard
def grafana_escape(v):
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", v)


def interpolate(expr, values):
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("${__rate_interval}", RATE_INTERVAL)
    expr = expr.replace("$__interval", f"{SCRAPE}s").replace("${__interval}", f"{SCRAPE}s")
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("[[" + name + "]]", values[name])
        expr = re.sub(r"\$" + re.escape(name) + r"\b", lambda _m: values[name], expr)
    return expr


def resolve_variables(dash):
    """Each variable as Grafana resolves it on a first load (current {}): constants to their query; query
    variables to their first option, which is All when includeAll (allValue, else the values as a regex)."""
    values, found = {}, {}
    tvars = dash.get("templating", {}).get("list", [])
    pending = [v for v in tvars if v.get("type") in ("constant", "custom", "query")]
    for v in [v for v in pending if v["type"] == "constant"]:
        values[v["name"]] = v["query"]
    for _ in range(len(pending)):  # a variable may use another: resolve until none changes
        for v in pending:
            if v["type"] != "query":
                continue
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q, re.S)
            if not m:
                fail(f"variable {v['name']}: query {q!r} is not label_values(selector, label)")
                continue
            sel = interpolate(m.group(1), {**{k: ".*" for k in found if k not in values}, **values})
            vals = prom(f"/api/v1/label/{m.group(2)}/values", **{"match[]": sel})
            found[v["name"]] = vals
            if v.get("includeAll"):
                values[v["name"]] = v.get("allValue") or "(" + "|".join(grafana_escape(x) for x in vals) + ")"
            elif vals:
                values[v["name"]] = grafana_escape(vals[0])
    return values, found


def panels(dash):
    out = []

    def walk(ps):
        for p in ps:
            if p.get("type") != "row":
                out.append(p)
            walk(p.get("panels", []))

    walk(dash["panels"])
    return out


def query_panels(dash, phase, results):
    values, found = resolve_variables(dash)
    for name, vals in found.items():
        results.setdefault(("var", name), {})[phase] = len(vals)
    for p in panels(dash):
        for t in p.get("targets", []):
            key = (p["title"], t.get("refId", "A"))
            expr = interpolate(t["expr"], values)
            try:
                res = prom("/api/v1/query", query=expr)["result"]
            except Exception as e:  # a query Prometheus refuses is a failure of its own
                fail(f"panel {p['title']!r} {key[1]}: Prometheus refused {expr!r}: {e}")
                res = []
            vals = [float(r["value"][1]) for r in res]
            results.setdefault(key, {"expr": t["expr"], "legend": t.get("legendFormat", ""),
                                    "type": p.get("type")})[phase] = (
                len(res), sum(1 for x in vals if x == x))  # series, series with a number (not NaN)


# ---------------------------------------------------------------------------------------------------- rules
def rule_key(group, rule):
    labels = {k: v for k, v in rule.get("labels", {}).items() if k not in ("check",)}
    extra = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("severity",) or
                     rule["name"] in ("HL7GWCertificateExpiry", "HL7GWUndeliveredNearRetention"))
    return rule["name"] + (f"{{{extra}}}" if extra else "")


def rule_states():
    """{(group, key): (state, duration for:)} from /api/v1/rules."""
    out = {}
    for g in prom("/api/v1/rules", type="alert")["groups"]:
        for r in g["rules"]:
            out[(g["name"], rule_key(g["name"], r))] = (r["state"], r.get("duration", 0), r.get("health"),
                                                        r.get("lastError", ""))
    return out


# ---------------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rules", nargs="+", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--fullname", required=True)
    ap.add_argument("--namespace", default="hl7gw")
    ap.add_argument("--report", required=True)
    a = ap.parse_args()
    work, ns, full = a.work, a.namespace, a.fullname
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    procs = Procs(logs)
    dash = json.load(open(a.dashboard))

    # The ingress's gRPC listener serves a certificate valid for 10 days: HL7GWCertificateExpiry's warning
    # (21 days) fires, its critical level (7 days) does not.
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "10", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", f"{work}/grpc.key", "-out", f"{work}/grpc.crt"], check=True, capture_output=True)
    kafka = f"kafka:\n  brokers: {a.brokers}\n"
    for name in ("ingress-a", "ingress-b"):
        p = P[name]
        open(f"{work}/{name}.yaml", "w").write(
            f"mllp_addr: 127.0.0.1:{p['mllp']}\nack_timeout: 5s\n"
            "senders:\n  - {name: main, sending_application: LOADGEN}\n  - {name: feed2, sending_application: FEED2}\n"
            f"service:\n  grpc_addr: 127.0.0.1:{p['grpc']}\n  admin_addr: 127.0.0.1:{p['admin']}\n"
            f"grpc:\n  tls:\n    cert: {work}/grpc.crt\n    key: {work}/grpc.key\n" + kafka)
    routes = f"{work}/routes.yaml"
    open(routes, "w").write(ROUTES)
    open(f"{work}/transformer.yaml", "w").write(
        f"routes:\n  file: {routes}\nservice:\n  grpc_addr: 127.0.0.1:{P['transformer']['grpc']}\n"
        f"  admin_addr: 127.0.0.1:{P['transformer']['admin']}\n" + kafka)
    open(f"{work}/egress.yaml", "w").write(EGRESS.format(**P) +
        f"service:\n  grpc_addr: 127.0.0.1:{P['egress']['grpc']}\n  admin_addr: 127.0.0.1:{P['egress']['admin']}\n"
        + kafka)

    pods = {  # process name -> the pod it stands for
        "ingress-a": {"service": f"{full}-ingress", "pod": f"{full}-ingress-5d8c7b9f6-a1b2c", "container": "ingress"},
        "ingress-b": {"service": f"{full}-ingress", "pod": f"{full}-ingress-5d8c7b9f6-d3e4f", "container": "ingress"},
        "transformer": {"service": f"{full}-transformer", "pod": f"{full}-transformer-6c9d8f7b5-g5h6i",
                        "container": "transformer"},
        "egress": {"service": f"{full}-egress", "pod": f"{full}-egress-7f6e5d4c3-j7k8l", "container": "egress"},
    }
    for name, pod in pods.items():
        pod["admin"] = P[name]["admin"]
    deployments = {f"{full}-ingress": ["ingress-a", "ingress-b"], f"{full}-transformer": ["transformer"],
                   f"{full}-egress": ["egress"]}

    b = a.bin
    results, report_rules = {}, {}
    feed2_stop = threading.Event()
    try:
        procs.start("lab", [f"{b}/hl7gw", "receive", "--no-sync", "--listen", f"127.0.0.1:{P['lab']}", "--out", f"{work}/lab"])
        procs.start("fhir", [f"{b}/hl7gw", "receive", "--http", "--no-sync", "--listen", f"127.0.0.1:{P['fhir']}",
                             "--out", f"{work}/fhir"])
        procs.start("reject", [f"{b}/hl7gw", "receive", "--reject-every", "1", "--listen", f"127.0.0.1:{P['reject']}",
                               "--out", f"{work}/reject"])
        for name in ("ingress-a", "ingress-b"):
            procs.start(name, [f"{b}/hl7gw-ingress", "--config", f"{work}/{name}.yaml"])
        procs.start("transformer", [f"{b}/hl7gw-transformer", "--config", f"{work}/transformer.yaml"])
        procs.start("egress", [f"{b}/hl7gw-egress", "--config", f"{work}/egress.yaml"])
        deadline = time.time() + 90
        for name, pod in pods.items():
            while True:
                if not procs.alive(name):
                    raise SystemExit(f"{name} exited; its log: {logs}/{name}.log\n" +
                                     open(f"{logs}/{name}.log").read()[-3000:])
                try:
                    http_get(f"http://127.0.0.1:{pod['admin']}/readyz", timeout=2)
                    break
                except Exception:
                    if time.time() > deadline:
                        raise SystemExit(f"{name} not ready within 90 s; log: {logs}/{name}.log")
                    time.sleep(0.3)
        log("services ready")

        # FEED2: one message every second to ingress A, from now until the provoked phase.
        def feed2():
            i = 0
            while not feed2_stop.is_set():
                i += 1
                try:
                    mllp_send(P["ingress-a"]["mllp"], [message("FEED2", "ADT^A08^ADT_A01", f"F2-{i}")])
                except OSError as e:
                    log(f"feed2: {e}")
                feed2_stop.wait(1)

        threading.Thread(target=feed2, daemon=True).start()
        for name in ("ingress-a", "ingress-b"):
            procs.start(f"load-{name}", [f"{b}/hl7gw-load", "--to", f"127.0.0.1:{P[name]['mllp']}", "--clients", "2",
                                         "--rate", "10", "--duration", "600", "--warmup", "0", "--threads", "1"])
        exporter = Exporter(ns, pods, deployments, procs).serve()

        scrape = []
        for name, pod in pods.items():
            scrape.append({"job_name": f"{name}", "scrape_interval": f"{SCRAPE}s",
                           "static_configs": [{"targets": [f"127.0.0.1:{pod['admin']}"],
                                               "labels": {"namespace": ns, "service": pod["service"],
                                                          "pod": pod["pod"], "container": pod["container"],
                                                          "endpoint": "admin"}}],
                           # the ServiceMonitor's scrape: job = the Service's name
                           "relabel_configs": [{"target_label": "job", "replacement": pod["service"]}]})
        scrape.append({"job_name": "kube-state-metrics-and-cadvisor", "honor_labels": True,
                       "static_configs": [{"targets": [f"127.0.0.1:{P['exporter']}"]}]})
        cfg = {"global": {"scrape_interval": f"{SCRAPE}s", "evaluation_interval": f"{SCRAPE}s",
                          "scrape_timeout": f"{SCRAPE - 1}s"},
               "rule_files": a.rules, "scrape_configs": scrape}
        open(f"{work}/prometheus.yml", "w").write(json.dumps(cfg, indent=1))
        procs.start("prometheus", [a.prometheus, f"--config.file={work}/prometheus.yml",
                                   f"--storage.tsdb.path={work}/prometheus-data",
                                   f"--web.listen-address=127.0.0.1:{P['prometheus']}", "--log.level=warn"])
        deadline = time.time() + 60
        while True:
            try:
                http_get(f"http://127.0.0.1:{P['prometheus']}/-/ready", timeout=2)
                break
            except Exception:
                if not procs.alive("prometheus") or time.time() > deadline:
                    raise SystemExit("Prometheus did not start: " + open(f"{logs}/prometheus.log").read()[-3000:])
                time.sleep(0.3)
        log("Prometheus ready; healthy phase (load on both ingress pods, FEED2 sending)")
        time.sleep(6 * SCRAPE)
        # every target up
        for t in prom("/api/v1/targets")["activeTargets"]:
            if t["health"] != "up":
                fail(f"target {t['scrapeUrl']} is {t['health']}: {t.get('lastError')}")
        # metric names: no unit written twice
        names = prom("/api/v1/label/__name__/values")
        for n in names:
            if n.startswith("hl7gw_") and re.search(r"_(bytes|seconds)_\1(_|$)", n):
                fail(f"metric {n}: its unit is in its name twice")
        # The docs name only metrics the services serve (issue 39): every hl7gw_ name in the README, the runbook,
        # the troubleshooting page, observability.md and the chart's values, against these scrapes.
        scrapes = []
        for name, pod in pods.items():
            path = f"{work}/scrape-{name}.txt"
            open(path, "w").write(http_get(f"http://127.0.0.1:{pod['admin']}/metrics").decode())
            scrapes.append(path)
        r = subprocess.run([sys.executable, "scripts/docs-check.py", "metrics", *scrapes], capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            fail("documented metric names that no service serves (docs-check above)")
        time.sleep(24)
        states_healthy = rule_states()
        query_panels(dash, "healthy", results)
        provoked_by_config = {"HL7GWCertificateExpiry{severity=warning}"}
        for (g, k), (st, _, health, err) in states_healthy.items():
            report_rules.setdefault(k, {})[g + ":healthy"] = st
            if health != "ok":
                fail(f"rule {k} ({g}): health {health}: {err}")
            want = "firing" if k in provoked_by_config else "inactive"
            if st != want:
                fail(f"healthy pipeline: rule {k} ({g}) is {st}, not {want}")
        log(f"healthy phase checked: {len(states_healthy)} rules, "
            f"{sum(1 for k in results if k[0] != 'var')} panel queries")

        # ------------------------------------------------------------------------------------ provoke
        t_provoke = time.time()
        log("provoking: lab receiver stopped, FEED2 silent, refused/unrouted/rejected messages, framing errors, "
            "a broken route, ingress pod b stopped")
        procs.stop("lab")
        feed2_stop.set()
        open(routes, "a").write(BROKEN_ROUTE)
        procs.stop("load-ingress-b")
        procs.stop("ingress-b")
        codes = []

        def bad_input():  # ~25 s of refused versions, unrouted SIUs, rejected ORUs and truncated frames
            for i in range(6):
                codes.extend(mllp_send(P["ingress-a"]["mllp"], [
                    message("BADVER", "ADT^A01^ADT_A01", f"V{i}-{j}", version="3.0") for j in range(40)]))
                mllp_send(P["ingress-a"]["mllp"], [message("SCHED", "SIU^S12^SIU_S12", f"S{i}-{j}") for j in range(5)])
                mllp_send(P["ingress-a"]["mllp"], [message("LABSYS", "ORU^R01^ORU_R01", f"R{i}-{j}",
                                                           extra="OBR|1\rOBX|1|NM|GLU||5.5\r") for j in range(2)])
                try:  # a frame the sender never ends: framing error `truncated`
                    mllp_send(P["ingress-a"]["mllp"], [], garbage=b"\x0bMSH|^~\\&|TRUNC|")
                except OSError:
                    pass
                time.sleep(4)
            log(f"refused-version messages answered {sorted(set(codes))}")

        sender = threading.Thread(target=bad_input, daemon=True)
        sender.start()

        expected = {  # rule -> what the chart's group must show; the short-for group must show firing
            "HL7GWHighNakRate": "pending",
            "HL7GWDeadLettersGrowing{stage=ingress}": "pending",
            "HL7GWDeadLettersGrowing{stage=transformer}": "pending",
            "HL7GWDeadLettersGrowing{stage=egress}": "pending",
            "HL7GWEgressConsumerLag": "pending",
            "HL7GWEgressRetrying": "pending",
            "HL7GWRoutesRefused": "pending",
            "HL7GWPodsUnavailable{service=ingress}": "pending",
            "HL7GWUndeliveredNearRetention{severity=warning}": "pending",
            "HL7GWSenderSilent{sender=feed2}": "firing",
            "HL7GWCertificateExpiry{severity=warning}": "firing",
        }
        real_group, short_group = "hl7gw.alerts", "hl7gw.alerts.short-for"
        seen = {}
        deadline = time.time() + 90
        while True:
            st = rule_states()
            now = time.time() - t_provoke
            for (g, k), (s, _, _, _) in st.items():
                if s != "inactive":
                    seen.setdefault((g, k, s), now)
            ok = all(st.get((real_group, k), ("?",))[0] == w and st.get((short_group, k), ("?",))[0] == "firing"
                     for k, w in expected.items())
            if (ok and not sender.is_alive()) or time.time() > deadline:
                break
            time.sleep(SCRAPE)
        query_panels(dash, "provoked", results)
        for q in ("hl7gw_egress_consumer_lag", "hl7gw_egress_oldest_undelivered_age_seconds"):
            log(q + " after provoking: " + ", ".join(
                f"{r['metric'].get('destination')}={float(r['value'][1]):.0f}" for r in prom("/api/v1/query", query=q)["result"]))
        for (g, k), (s, dur, health, err) in st.items():
            report_rules.setdefault(k, {})[g + ":provoked"] = s
            report_rules[k][g + ":for"] = dur
            for s2 in ("pending", "firing"):
                if (g, k, s2) in seen:
                    report_rules[k][f"{g}:{s2}_after"] = seen[(g, k, s2)]
            want = expected.get(k, "inactive")
            if g == short_group and k in expected:
                want = "firing"
            if s != want:
                fail(f"provoked: rule {k} ({g}) is {s}, not {want}")
        for k in expected:
            if (real_group, k) not in st:
                fail(f"no rule {k} in the chart's group")

        # ------------------------------------------------------------------------------------ Kafka down
        log("Kafka stopped: messages to ingress pod a wait their ack_timeout (5 s) and get AR/CR 207")
        subprocess.run(["scripts/kafka.sh", "down"], check=True, capture_output=True)
        t_kafka = time.time()

        def unavailable():
            try:
                return mllp_send(P["ingress-a"]["mllp"], [message("LOADGEN", "ADT^A01^ADT_A01", f"K{i}-{time.time()}")
                                                          for i in range(2)])
            except OSError as e:
                return [str(e)]

        answers = []
        senders = [threading.Thread(target=lambda: answers.extend(unavailable()), daemon=True) for _ in range(4)]
        for t in senders:
            t.start()
        key, seen_k = "HL7GWKafkaUnavailable", {}
        deadline = time.time() + 60
        while True:
            st = rule_states()
            for g in (real_group, short_group):
                s = st[(g, key)][0]
                if s != "inactive":
                    seen_k.setdefault((g, s), time.time() - t_kafka)
            if (st[(real_group, key)][0] == "pending" and st[(short_group, key)][0] == "firing") or time.time() > deadline:
                break
            time.sleep(SCRAPE)
        log(f"answers while Kafka was down: {sorted(set(answers))}")
        for g in (real_group, short_group):
            want = "pending" if g == real_group else "firing"
            s = st[(g, key)][0]
            report_rules[key][g + ":provoked"] = s
            if (g, s) in seen_k:
                report_rules[key][f"{g}:{s}_after"] = seen_k[(g, s)]
            if s != want:
                fail(f"Kafka down: rule {key} ({g}) is {s}, not {want}")
    finally:
        feed2_stop.set()
        procs.stop_all()

    # ------------------------------------------------------------------------------------ report
    for key, r in results.items():
        if key[0] == "var":
            if not any(r.get(ph) for ph in ("healthy", "provoked")):
                fail(f"dashboard variable ${key[1]}: its query returned no value")
            continue
        if not any((r.get(ph) or (0, 0))[0] for ph in ("healthy", "provoked")):
            fail(f"panel {key[0]!r} query {key[1]}: no series, healthy or provoked")
        # A stat shows one number: "No data" on a healthy pipeline reads as broken (a timeseries of retries or
        # rejects may well be empty then).
        if r["type"] == "stat" and not (r.get("healthy") or (0, 0))[0]:
            fail(f"stat panel {key[0]!r} query {key[1]}: no series while the pipeline is healthy")
    write_report(a.report, results, report_rules, P)
    if failures:
        print("\nprom-check: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)
    log(f"ok: every panel query answered, every rule as expected (report: {a.report})")


def write_report(path, results, rules, ports):
    def cell(v):
        if not v:
            return "no series"
        n, num = v
        return f"{n} series" + ("" if num == n else f" ({n - num} NaN)")

    out = ["| panel | query | healthy, under load | provoked |", "| --- | --- | --- | --- |"]
    for key, r in results.items():
        if key[0] == "var":
            continue
        out.append(f"| {key[0]} | {key[1]} `{r['legend'] or '-'}` | {cell(r.get('healthy'))} | {cell(r.get('provoked'))} |")
    out += ["", "| variable | values healthy | values provoked |", "| --- | --- | --- |"]
    for key, r in results.items():
        if key[0] == "var":
            out.append(f"| ${key[1]} | {r.get('healthy', 0)} | {r.get('provoked', 0)} |")
    out += ["", "| rule | chart's `for` | healthy | provoked (chart's `for`) | provoked (`for: 10s`) |",
            "| --- | --- | --- | --- | --- |"]
    rg, sg = "hl7gw.alerts", "hl7gw.alerts.short-for"
    for k, r in sorted(rules.items()):
        def st(g):
            s = r.get(f"{g}:provoked", "?")
            after = r.get(f"{g}:{s}_after")
            return s + (f" after {after:.0f} s" if after is not None and s != "inactive" else "")
        dur = r.get(f"{rg}:for", 0)
        out.append(f"| {k} | {str(int(dur)) + ' s' if dur else 'none'} | {r.get(rg + ':healthy')} / "
                   f"{r.get(sg + ':healthy')} | {st(rg)} | {st(sg)} |")
    open(path, "w").write("\n".join(out) + "\n")
    print("\n".join(out))


def route(name, types, destinations, *transforms):
    """One HL7Route document: `name` matches message `types` and sends them, through `transforms` (each a YAML
    flow mapping), to `destinations`."""
    steps = "".join(f"\n    - {t}" for t in transforms)
    return (f"apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: {name}}}\nspec:\n"
            f"  match: {{messageTypes: {types}}}\n" + (f"  transforms:{steps}\n" if transforms else "")
            + f"  destinations: {destinations}\n")


ROUTES = "---\n".join([
    route("adt-to-lab", '["ADT^*"]', "[lab]", "set: {path: MSH-5, value: LAB}"),
    route("adt-to-fhir", '["ADT^*"]', "[fhir]",
          "toFhir: {bundleType: transaction, timezone: Europe/Berlin, onUnsupported: skip}"),
    route("results-to-reject", '["ORU^R01"]', "[reject]"),
])
BROKEN_ROUTE = "---\n" + route("broken", '["ADT^A01"]', "[lab]", "set: {path: NOT-A-PATH, value: x}")
EGRESS = """\
destinations:
  lab:
    address: 127.0.0.1:{lab}
    connect_timeout: 1s
    response_timeout: 5s
    retry: {{initial_backoff: 200ms, max_backoff: 1s}}
  fhir:
    url: http://127.0.0.1:{fhir}/fhir
    connect_timeout: 1s
    response_timeout: 10s
  reject:
    address: 127.0.0.1:{reject}
    connect_timeout: 1s
    response_timeout: 5s
    retry: {{initial_backoff: 100ms, max_backoff: 200ms}}
    ack_policy: {{max_retries: 1}}
"""

if __name__ == "__main__":
    main()
