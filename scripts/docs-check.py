#!/usr/bin/env python3
"""The docs say what the binaries do (issue 39): every `hl7gw ...` command line and every metric name that the
README, the runbook and the troubleshooting page show, checked against the built binaries.

  commands  every `hl7gw SUBCOMMAND --flag ...` in a code block or code span: the subcommand exists and each
            long flag is in `hl7gw SUBCOMMAND --help` (`hl7gw-ingress --flag` and the other services' the same,
            against their own --help)
  metrics   every `hl7gw_...` name is served by a running service: names read from the services' /metrics
            (a file of scraped text per service, written by scripts/prom-check/check.py), with Prometheus's
            suffixes (_total, _bucket, _sum, _count, _created) allowed on the family names

  scripts/docs-check.py commands --bin target/debug
  scripts/docs-check.py metrics SCRAPE.txt...
"""
import argparse
import functools
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import metric_tables  # noqa: E402 (scripts/lib, found through the path set above)
DOCS = ["README.md", "docs/runbook.md", "docs/troubleshooting.md"]
# Metric names are also quoted by the chart's values (examples of relabelings) and its README.
METRIC_DOCS = DOCS + ["docs/observability.md", "helm/hl7-gateway/values.yaml", "helm/hl7-gateway/README.md"]
BINARIES = ["hl7gw", "hl7gw-ingress", "hl7gw-transformer", "hl7gw-egress", "hl7gw-load"]


def code_lines(path):
    """(line number, text) of what is code in a Markdown file: fenced blocks whole, elsewhere the code spans."""
    fenced = False
    for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield n, line.rstrip("\n")
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield n, span


@functools.lru_cache(maxsize=None)
def help_text(binary, sub=None):
    args = [binary] + ([sub] if sub else []) + ["--help"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return None
    return r.stdout


def subcommands(binary):
    text = help_text(binary) or ""
    m = re.search(r"^Commands:\n((?:  .*\n)+)", text, re.M)
    return {line.split()[0] for line in m.group(1).splitlines()} if m else set()


def long_flags(text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


def check_commands(bindir):
    failures, checked = [], 0
    subs = {b: subcommands(os.path.join(bindir, b)) for b in BINARIES}
    if not subs["hl7gw"]:
        return [f"{bindir}/hl7gw --help lists no command"], 0
    pattern = re.compile(r"(?:^|[\s`$(])(hl7gw(?:-ingress|-transformer|-egress|-load)?)((?: +[^\s#|;&`)]+)*)")
    for path in DOCS:
        for n, text in code_lines(path):
            # a comment after the command is prose, and `kubectl -n hl7gw ...` names the namespace
            text = re.split(r"\s#\s", text, maxsplit=1)[0]
            for m in pattern.finditer(text):
                binary, rest = m.group(1), m.group(2).split()
                before = text[: m.start(1)].rstrip()
                if before.endswith(("-n", "--namespace", "-p", "--package", "--bin", "=")) or text[m.end(1):m.end(1) + 1] not in ("", " "):
                    continue
                exe = os.path.join(bindir, binary)
                where = f"{path}:{n}"
                sub = None
                if subs[binary]:
                    if not rest or rest[0].startswith(("-", "<", "[", "$", ".", "/")) or rest[0] == "...":
                        continue  # the command named in prose (`hl7gw` itself, `hl7gw --help`)
                    if not re.fullmatch(r"[a-z][a-z-]*", rest[0]):
                        continue
                    sub = rest[0]
                    if sub not in subs[binary]:
                        failures.append(f"{where}: `{binary} {sub}`: no such command ({binary} --help lists "
                                        f"{', '.join(sorted(subs[binary]))})")
                        continue
                    rest = rest[1:]
                known = long_flags(help_text(exe, sub) or "") | {"--help", "--version"}
                for flag in long_flags(" ".join(rest)):
                    checked += 1
                    if flag not in known:
                        failures.append(f"{where}: `{binary}{' ' + sub if sub else ''} {flag}`: "
                                        f"not in its --help")
    return failures, checked


def served_names(scrapes):
    names = set()
    for path in scrapes:
        for line in open(path, encoding="utf-8"):
            m = re.match(r"# (?:TYPE|HELP|UNIT) (\S+)", line) or re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", line)
            if m:
                names.add(m.group(1))
    return names


def declared_names():
    """The names the services' `metric_set!` tables declare (hl7gw_<prefix>_<name or alias>[_<unit>], counters
    with _total): a family with no series yet is not in a scrape (the client writes nothing for it), so a name
    a scrape lacks counts as served when a table declares it."""
    names = set()
    for base in ("services", "loadtest"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, base)):
            if "/target" in dirpath or "/tests" in dirpath:
                continue
            for f in files:
                if not f.endswith(".rs"):
                    continue
                for name, kind, _ in metric_tables.declared(open(os.path.join(dirpath, f), encoding="utf-8").read()):
                    names.add(name)
                    if kind == "counter":
                        names.add(name + "_total")
    return names


def check_metrics(scrapes):
    served = served_names(scrapes)
    declared = declared_names()
    failures, checked = [], 0
    suffixes = ("", "_total", "_bucket", "_sum", "_count", "_created", "_info")
    for path in METRIC_DOCS:
        text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        for n, line in enumerate(text.splitlines(), 1):
            for name in re.findall(r"(?<![\w-])(hl7gw_[a-z0-9_]*[a-z0-9])(?![\w*{:=-])", line):
                # a prefix written to stand for several (`hl7gw_ingress_`) is caught by the lookahead above
                if re.fullmatch(r"hl7gw_(ingress|transformer|egress|runtime|cli|load|fhir|tls|proto)", name):
                    continue  # a crate's name (a log target, RUST_LOG), not a metric
                checked += 1
                if not any(name.removesuffix(s) in served | declared for s in suffixes if name.endswith(s)):
                    failures.append(f"{path}:{n}: metric {name} is served by no service")
    return failures, checked


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="what", required=True)
    c = sp.add_parser("commands")
    c.add_argument("--bin", default=os.path.join(ROOT, "target", "debug"))
    m = sp.add_parser("metrics")
    m.add_argument("scrapes", nargs="+")
    a = ap.parse_args()
    if a.what == "commands":
        failures, checked = check_commands(a.bin)
        what = "long flags of documented command lines"
    else:
        failures, checked = check_metrics(a.scrapes)
        what = "documented metric names"
    for f in failures:
        print(f"docs-check: {f}", file=sys.stderr)
    if failures:
        print(f"docs-check: {len(failures)} of {checked} {what} do not match the binaries", file=sys.stderr)
        sys.exit(1)
    if not checked:
        print(f"docs-check: no {what} found: the check read nothing", file=sys.stderr)
        sys.exit(1)
    print(f"docs-check: {checked} {what} match the binaries", file=sys.stderr)


if __name__ == "__main__":
    main()
