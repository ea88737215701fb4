#!/usr/bin/env python3
"""Every key of the chart's values.yaml has a comment, and values.yaml and values.schema.json name the same keys.

    check-values-doc.py values.yaml values.schema.json

A value is documented when the line above it is a comment; a group (a key whose schema lists properties) is
documented by its keys. Keys inside maps the schema leaves open (the example entry of egress.destinations, the
fields of seccompProfile) are content, not keys of the chart, and are skipped.
"""
import json
import re
import sys

import yaml

KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-\"]+):(\s|$)")


def schema_keys(node, prefix=""):
    """path -> schema node, for every key the schema names."""
    out = {}
    for k, v in (node.get("properties") or {}).items():
        path = f"{prefix}{k}"
        out[path] = v
        if v.get("properties"):
            out.update(schema_keys(v, path + "."))
    return out


def main():
    values_path, schema_path = sys.argv[1], sys.argv[2]
    lines = open(values_path, encoding="utf-8").read().splitlines()
    schema = json.load(open(schema_path, encoding="utf-8"))
    known = schema_keys(schema)
    stack = []  # (indent, key)
    undocumented, unknown = [], []
    for i, line in enumerate(lines):
        m = KEY.match(line)
        if not m or line.lstrip().startswith("#") or line.lstrip().startswith("- "):
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = m.group(2).strip('"')
        path = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        parent = ".".join(k for _, k in stack[:-1])
        if parent and (parent not in known or not known[parent].get("properties")):
            continue  # inside a map the schema leaves open (an example entry, a securityContext field)
        if path not in known:
            unknown.append(f"{values_path}:{i + 1}: {path} is not in {schema_path}")
            continue
        if known[path].get("properties") and line.rstrip().endswith(":"):
            continue  # a group: its keys carry the comments
        prev = lines[i - 1].strip() if i else ""
        if not prev.startswith("#"):
            undocumented.append(f"{values_path}:{i + 1}: {path} has no comment")
    in_values = set()

    def walk(d, prefix=""):
        for k, v in d.items():
            p = f"{prefix}{k}"
            if p in known:
                in_values.add(p)
                if isinstance(v, dict):
                    walk(v, p + ".")

    walk(yaml.safe_load(open(values_path, encoding="utf-8")))
    # Every schema key has a default in values.yaml, except the optional service config keys (<service>.config.*:
    # absent means the service's own default), `global` (Helm's) and keys marked deprecated (an old name the
    # templates refuse with its new one).
    missing = sorted(k for k in known if k not in in_values and ".config." not in k and k != "global"
                     and not known[k].get("deprecated"))
    for p in undocumented + unknown:
        print(p, file=sys.stderr)
    for k in missing:
        print(f"{schema_path}: {k} has no default in {values_path}", file=sys.stderr)
    if undocumented or unknown or missing:
        sys.exit(1)
    print(f"values: {len(in_values)} keys, each documented and in the schema")


if __name__ == "__main__":
    main()
