#!/usr/bin/env python3
"""Lays out what each hl7gw Deployment of a rendered chart would see, so the real binaries can judge it.

    service-configs.py RENDERED.yaml OUT_DIR

For every Deployment running /usr/local/bin/hl7gw-<service>: the files of its ConfigMap volumes (config.yaml, a
routes file) and stand-ins for its Secret items (projected volumes' too) are written under OUT_DIR/<service>/,
the mount paths rewritten to match: `--check-config` reads certificates and keys (the egress's destinations), so
an item named like a certificate (*.crt, *.pem) gets a throwaway self-signed certificate and one named like a key
(*.key, *key.pem) its EC P-384 PKCS#8 key (a TLS key and a SMART ES384 key alike), made with openssl per run;
any other item (tokens, passwords) is empty. OUT_DIR/<service>.args holds the command's arguments with paths
rewritten, and OUT_DIR/<service>.env the HL7GW_* variables the pod would get (literal values with $(VAR) references filled in,
`dummy` for valueFrom, and the kubelet's service-link variables of every Service unless enableServiceLinks is
false: Services named hl7gw-... make HL7GW_... variables), one NAME=VALUE per line. scripts/chart-check.sh then
runs `env -i ... hl7gw-<service> ARGS --check-config`.
"""
import os
import re
import subprocess
import sys

import yaml


def pem_stand_ins(out):
    """(certificate, key) PEMs: a self-signed P-384 certificate (also a CA) and its PKCS#8 key."""
    d = os.path.join(out, ".stand-ins")
    os.makedirs(d, exist_ok=True)
    key, crt = os.path.join(d, "key.pem"), os.path.join(d, "crt.pem")
    run = dict(check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384", "-out", key],
                   **run)
    subprocess.run(["openssl", "req", "-x509", "-new", "-key", key, "-subj", "/CN=stand-in.example", "-days", "2",
                    "-addext", "subjectAltName=DNS:stand-in.example", "-out", crt], **run)
    return open(crt).read(), open(key).read()


def stand_in(path, pems):
    """What a Secret item at PATH holds for --check-config."""
    name = os.path.basename(path)
    if name.endswith(".key") or name.endswith("key.pem"):
        return pems[1]
    if name.endswith(".crt") or name.endswith(".pem"):
        return pems[0]
    return ""


def main():
    rendered, out = sys.argv[1], sys.argv[2]
    pems = pem_stand_ins(out)
    docs = [d for d in yaml.safe_load_all(open(rendered, encoding="utf-8")) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    services = [d for d in docs if d["kind"] == "Service"]
    found = 0
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"]:
            cmd = (c.get("command") or [""])[0]
            m = re.fullmatch(r"/usr/local/bin/hl7gw-(ingress|transformer|egress)", cmd)
            if not m:
                continue
            service = m.group(1)
            found += 1
            fs = os.path.join(out, service)

            def rewrite(text):
                return text.replace("/etc/hl7gw/", fs + "/etc/hl7gw/")

            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for mount in c.get("volumeMounts", []):
                v = volumes[mount["name"]]
                target = fs + mount["mountPath"] if mount["mountPath"].startswith("/etc/hl7gw/") else None
                if not target:
                    continue
                os.makedirs(target, exist_ok=True)
                if "configMap" in v:
                    for key, value in configmaps[v["configMap"]["name"]].items():
                        with open(os.path.join(target, key), "w", encoding="utf-8") as f:
                            f.write(rewrite(value))
                elif "secret" in v or "projected" in v:
                    # projected: an HTTP(S) destination's TLS, bearer token and SMART key Secrets in one directory.
                    sources = [v] if "secret" in v else v["projected"].get("sources", [])
                    for source in sources:
                        for item in source.get("secret", {}).get("items", []):
                            with open(os.path.join(target, item["path"]), "w", encoding="utf-8") as f:
                                f.write(stand_in(item["path"], pems))
            with open(os.path.join(out, service + ".args"), "w", encoding="utf-8") as f:
                f.write("\n".join(rewrite(a) for a in c.get("args", [])) + "\n")
            env = {}
            if pod.get("enableServiceLinks", True):
                # What the kubelet adds for every Service of the namespace (docker-links style variables).
                for svc in services:
                    n = svc["metadata"]["name"].upper().replace("-", "_")
                    env[f"{n}_SERVICE_HOST"] = "10.0.0.10"
                    for port in svc["spec"].get("ports", []):
                        env[f"{n}_SERVICE_PORT"] = str(port["port"])
                        env[f"{n}_PORT"] = f"tcp://10.0.0.10:{port['port']}"
            for e in c.get("env", []):
                if "value" in e:
                    env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), "dummy"), e["value"])
                else:
                    env[e["name"]] = "dummy"
            with open(os.path.join(out, service + ".env"), "w", encoding="utf-8") as f:
                for k, v in env.items():
                    if k.startswith("HL7GW_"):
                        f.write(f"{k}={v}\n")
    if not found:
        sys.exit(f"{rendered}: no hl7gw Deployment")
    print(found)


if __name__ == "__main__":
    main()
