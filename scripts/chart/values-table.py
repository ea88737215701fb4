#!/usr/bin/env python3
"""The chart's values as a Markdown table: key, type, default, and the `# --` comment above the key.

    values-table.py values.yaml                   print the table
    values-table.py values.yaml --update README.md  replace the table between the README's markers

A row for every key with a `# --` comment (continued by the comment lines after it); groups without one (their
keys carry the comments) and the contents of example maps (egress.destinations.lab) get none. The README keeps
the table between `<!-- values-table:start -->` and `<!-- values-table:end -->`; scripts/chart-check.sh offline
fails when it differs from this script's output, and `scripts/chart-check.sh render` (`make k8s-render`)
rewrites it.
"""
import json
import re
import sys

import yaml

KEY = re.compile(r"^(\s*)([A-Za-z0-9_.\-\"]+):(\s|$)")
START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"


# bool before int: a YAML boolean is a Python int too.
TYPES = ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"), (list, "list"), (dict, "object"))


def type_of(v):
    return next((name for t, name in TYPES if isinstance(v, t)), "null")


def cell(text):
    return text.replace("|", "\\|")


def prose(text):
    """A description cell: `|` escaped, and `<` `>` outside code spans as entities (<release> is no HTML tag)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return cell("`".join(parts))


def rows(values_path):
    lines = open(values_path, encoding="utf-8").read().splitlines()
    values = yaml.safe_load("\n".join(lines))
    stack, doc, out = [], None, []
    for line in lines:
        s = line.strip()
        if s.startswith("# --"):
            doc = [s[4:].strip()]
            continue
        if s.startswith("#"):
            if doc is not None:
                doc.append(s[1:].strip())
            continue
        m = KEY.match(line)
        if not m or s.startswith("- "):
            doc = None
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = m.group(2).strip('"')
        stack.append((indent, key))
        if doc is None:
            continue
        path = [k for _, k in stack]
        v = values
        for k in path:
            v = v[k]
        default = json.dumps(v, ensure_ascii=False, separators=(", ", ": "))
        out.append(f"| `{'.'.join(path)}` | {type_of(v)} | `{cell(default)}` | {prose(' '.join(d for d in doc if d))} |")
        doc = None
    return out


def table(values_path):
    return "\n".join(["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"] + rows(values_path)) + "\n"


def main():
    args = sys.argv[1:]
    if len(args) == 1:
        sys.stdout.write(table(args[0]))
    elif len(args) == 3 and args[1] == "--update":
        readme = open(args[2], encoding="utf-8").read()
        if START not in readme or END not in readme:
            sys.exit(f"{args[2]}: no {START} ... {END} markers")
        head, rest = readme.split(START, 1)
        _, tail = rest.split(END, 1)
        with open(args[2], "w", encoding="utf-8") as f:
            f.write(f"{head}{START}\n{table(args[0])}{END}{tail}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
