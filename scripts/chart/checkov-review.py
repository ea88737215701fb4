#!/usr/bin/env python3
"""The chart's security review: checkov's Kubernetes checks on rendered manifests, against the accepted list.

    checkov-review.py CHECKOV ACCEPTED.yaml NAME=RENDER.yaml...

Each render is scanned on its own (checkov's graph checks, such as "a pod without a NetworkPolicy", would
otherwise match one render's objects with another's), with no way to the network: in a network namespace of
its own (unshare -n, or unshare -rn without root), else with every proxy variable pointing at a closed port;
and in any case with checkov's update check, platform download and API off (CKV_SKIP_PACKAGE_UPDATE_CHECK,
BC_SKIP_MAPPING, --skip-download, no API key), HOME and the working directory in an empty temporary directory
(so no ~/.checkov.yml or .checkov.yaml is read).

Fails when a finding is not in ACCEPTED.yaml (fix the chart, or add it there with the reason) and when an
accepted entry is no longer found (take it out: the list says what is true of the chart now). Each entry:

    - check: CKV_K8S_11          # checkov's check id
      renders: [default]         # NAMEs of the renders it is accepted in
      resources: [Deployment.hl7gw.hl7gw-hl7-gateway-ingress, ...]   # checkov's resource ids (globs: *)
      reason: why this is how it should be

Every pattern of an entry must match a finding in each of its renders.
"""
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml


def isolation():
    """The command prefix that cuts a process off the network, and its name."""
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        if shutil.which(prefix[0]):
            try:
                if subprocess.run(prefix + ["true"], capture_output=True, timeout=10).returncode == 0:
                    return prefix, " ".join(prefix)
            except (OSError, subprocess.TimeoutExpired):
                pass
    return [], "proxies pointed at 127.0.0.1:9 (no unshare here)"


def scan(checkov, prefix, path):
    """checkov's JSON report of one render: (summary, [(check_id, check_name, resource)])."""
    with tempfile.TemporaryDirectory(prefix="checkov-") as work:
        shutil.copy(path, os.path.join(work, "render.yaml"))
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": work,
            "LANG": "C.UTF-8",
            "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true",
            "BC_SKIP_MAPPING": "TRUE",
            "LOG_LEVEL": "WARNING",
        }
        if not prefix:
            for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
                env[var] = "http://127.0.0.1:9"
        cmd = prefix + [checkov, "--directory", ".", "--framework", "kubernetes", "--skip-download",
                        "--download-external-modules", "false", "--output", "json"]
        run = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        try:
            report = json.loads(run.stdout)
        except json.JSONDecodeError:
            sys.exit(f"checkov did not report on {path} (exit {run.returncode}):\n{run.stderr[-3000:]}")
    if isinstance(report, list):  # one report per framework; only kubernetes ran
        report = next(r for r in report if r.get("check_type") == "kubernetes")
    if report.get("summary", {}).get("parsing_errors"):
        sys.exit(f"checkov could not parse {path}: {report['summary']}")
    failed = [(f["check_id"], f["check_name"], f["resource"]) for f in report.get("results", {}).get("failed_checks", [])]
    return report.get("summary", {}), failed


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    checkov, accepted_path = sys.argv[1], sys.argv[2]
    renders = dict(a.split("=", 1) for a in sys.argv[3:])
    accepted = yaml.safe_load(open(accepted_path, encoding="utf-8")) or []
    allowed = {}  # (render, check, resource pattern) -> entry index
    for i, e in enumerate(accepted):
        missing = {"check", "renders", "resources", "reason"} - set(e)
        if missing or not str(e.get("reason", "")).strip():
            sys.exit(f"{accepted_path}: entry {i + 1} ({e.get('check')}) lacks {', '.join(sorted(missing)) or 'a reason'}")
        for r in e["renders"]:
            if r not in renders:
                sys.exit(f"{accepted_path}: entry {i + 1} ({e['check']}) names render {r!r}, not one of {sorted(renders)}")
            for res in e["resources"]:
                allowed[(r, e["check"], res)] = i
    prefix, how = isolation()
    version = subprocess.run([checkov, "--version"], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true"}).stdout.strip()
    def accepting(name, check, res):
        return [k for k in allowed if k[0] == name and k[1] == check and fnmatch.fnmatchcase(res, k[2])]

    used, unaccepted, lines, total = set(), [], [], 0
    for name, path in renders.items():
        summary, failed = scan(checkov, prefix, path)
        total += len(failed)
        ok = 0
        for check, title, res in failed:
            keys = accepting(name, check, res)
            used.update(keys)
            ok += bool(keys)
            if not keys:
                unaccepted.append(f"  {name}: {check} {res}: {title}")
        lines.append(f"  {name}: {summary.get('resource_count', 0)} objects, {summary.get('passed', 0)} checks passed, "
                     f"{len(failed)} failed, {ok} of them accepted")
    stale = sorted(f"  {r}: {c} {res} (entry {i + 1})" for (r, c, res), i in allowed.items() if (r, c, res) not in used)
    print(f"checkov {version}, network cut off by {how}:", file=sys.stderr)
    print("\n".join(lines), file=sys.stderr)
    if unaccepted:
        print("findings not in " + accepted_path + " (fix the chart, or accept them there with the reason):",
              file=sys.stderr)
        print("\n".join(unaccepted), file=sys.stderr)
    if stale:
        print("accepted in " + accepted_path + " but no longer found (take them out):", file=sys.stderr)
        print("\n".join(stale), file=sys.stderr)
    if unaccepted or stale:
        sys.exit(1)
    print(f"  {total} findings, each accepted ({len(accepted)} entries of {accepted_path}); none stale",
          file=sys.stderr)


if __name__ == "__main__":
    main()
