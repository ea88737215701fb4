#!/usr/bin/env python3
"""Every hl7gw metric the dashboard, the alerts and the autoscalers query is one the services export.

    check-metrics.py --rendered MANIFESTS.yaml [--dashboard FILE.json] [--source metrics.rs...] [--scrape FILE...]

Known names come from the services' metric definitions (--source: the `metric_set!` tables of each
services/*/src/metrics.rs, and services/runtime/src/certs.rs's, read by scripts/lib/metric_tables.py the way
prometheus_client names them: hl7gw_<service>_<name>[_<unit>], `_total` for counters, `_bucket`/`_sum`/`_count` for
histograms) and/or from Prometheus text scrapes of running services (--scrape: a `curl .../metrics` output; a scrape
lists a labelled family only once it has a sample, so a scrape after traffic is the stronger check). Queried names
are every `hl7gw_...` identifier in the dashboard's expressions, the PrometheusRules' expressions, the HPAs' metric
names and the KEDA prometheus triggers' queries of the rendered manifests.

Also checks the dashboard is valid JSON with a uid, a title and a query in every non-row panel.
Exit 1 with a list when anything is missing.
"""
import argparse
import json
import os
import re
import sys

import yaml

NAME = re.compile(r"\bhl7gw_[a-z0-9_]+\b")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import metric_tables  # noqa: E402 (scripts/lib, found through the path set above)


def from_source(path):
    names = set()
    for base, kind, field in metric_tables.declared(open(path, encoding="utf-8").read()):
        if kind == "histogram":
            names |= {base + s for s in ("_bucket", "_sum", "_count")}
        elif kind == "counter":
            names |= {base + "_total", base + "_created"}
        elif kind == "gauge":
            names.add(base)
        else:
            sys.exit(f"{path}: cannot tell the type of metric {field}")
    if not names:
        sys.exit(f"{path}: no metric_set! table")
    return names


def from_scrape(path):
    names = set()
    for line in open(path, encoding="utf-8"):
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            if kind == "counter":
                names |= {name + "_total", name + "_created"} if not name.endswith("_total") else {name}
            elif kind == "histogram":
                names |= {name + s for s in ("_bucket", "_sum", "_count")}
            else:
                names.add(name)
        elif line.strip() and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def queried(rendered, dashboard):
    out = {}  # name -> where

    def note(text, where):
        for n in NAME.findall(text):
            out.setdefault(n, where)

    if dashboard:
        dash = json.load(open(dashboard, encoding="utf-8"))
        problems = [k for k in ("uid", "title", "panels") if not dash.get(k)]
        for p in dash.get("panels", []):
            if p.get("type") == "row":
                continue
            exprs = [t.get("expr", "") for t in p.get("targets", [])]
            if not exprs or not all(exprs):
                problems.append(f"panel {p.get('title')!r} has no query")
            for e in exprs:
                note(e, f"dashboard panel {p.get('title')!r}")
        for v in dash.get("templating", {}).get("list", []):
            note(json.dumps(v.get("query", "")), f"dashboard variable {v.get('name')}")
        if problems:
            sys.exit("dashboard: " + "; ".join(problems))
    for doc in yaml.safe_load_all(open(rendered, encoding="utf-8")):
        if not doc:
            continue
        kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
        spec = doc.get("spec") or {}
        if kind == "PrometheusRule":
            for g in spec.get("groups", []):
                for r in g.get("rules", []):
                    note(str(r.get("expr", "")), f"PrometheusRule {r.get('alert') or r.get('record')}")
        elif kind == "HorizontalPodAutoscaler":
            for m in spec.get("metrics", []):
                for key in ("pods", "external", "object"):
                    if key in m:
                        note(m[key]["metric"]["name"], f"HPA {name}")
        elif kind == "ScaledObject":
            for t in spec.get("triggers", []):
                if t.get("type") == "prometheus":
                    note(t["metadata"].get("query", ""), f"ScaledObject {name}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rendered", action="append", default=[])
    ap.add_argument("--dashboard")
    ap.add_argument("--source", nargs="*", default=[])
    ap.add_argument("--scrape", nargs="*", default=[])
    a = ap.parse_args()
    known = set()
    for s in a.source:
        known |= from_source(s)
    for s in a.scrape:
        known |= from_scrape(s)
    if not known:
        sys.exit("no known metrics: give --source or --scrape")
    wanted = {}
    for i, r in enumerate(a.rendered or [None]):
        if r:
            wanted.update(queried(r, a.dashboard if i == 0 else None))
    if not a.rendered and a.dashboard:
        sys.exit("--rendered is required")
    missing = {n: w for n, w in wanted.items() if n not in known}
    for n, w in sorted(missing.items()):
        print(f"metric {n} (queried by {w}) is not exported by any service", file=sys.stderr)
    if missing:
        sys.exit(1)
    print(f"metrics: {len(wanted)} queried names, all among the {len(known)} the services export")


if __name__ == "__main__":
    main()
