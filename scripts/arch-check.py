#!/usr/bin/env python3
"""The map says what the workspace is (issue 39): docs/architecture.md and the README's "What is here" checked
against `cargo metadata` (no build) and the CLI's source.

  crate-deps  the block between `<!-- crate-deps: begin -->` and `<!-- crate-deps: end -->` in
              docs/architecture.md is the table made from `cargo metadata --no-deps --format-version 1
              --offline`: each workspace crate, what it depends on of ours, its dev-dependencies of ours
  parts       the table under "## The parts" has one row per crate with its folder, and its last column names
              exactly the crate's dependencies of ours
  readme      the README's "## What is here" table has a row for each crate's folder that names the crate
  commands    every command of `hl7gw` (`enum Command` in the CLI's cli.rs) is named in the CLI's row of both
  paths       every path docs/architecture.md names exists: a path from the repository's root
              (`services/...`), or a file or folder (`deliver/window.rs`) under the folder its heading names
  look-for    in the tables of "A message's way", each name of the "look for" column (`Worker`, the last part
              of `a::b`) is a word of one of the files its row names
  tests       each test the invariants table names (`file::test`, `module::tests::test`) is a `fn` of the
              workspace's tests or sources

  scripts/arch-check.py           check; exit 1 and say what differs
  scripts/arch-check.py --write   make the crate-deps block again from cargo metadata, then check the rest
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCH = "docs/architecture.md"
README = "README.md"
BEGIN = "<!-- crate-deps: begin -->"
END = "<!-- crate-deps: end -->"
NOTE = "<!-- made by `scripts/arch-check.py --write` from `cargo metadata`: do not edit by hand -->"


def metadata():
    cmd = ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"arch-check: `{' '.join(cmd)}` failed:\n{r.stderr}")
    return json.loads(r.stdout)


class Crate:
    def __init__(self, pkg, root):
        self.name = pkg["name"]
        self.folder = os.path.relpath(os.path.dirname(pkg["manifest_path"]), root)
        self.pkg = pkg
        self.deps = []  # (kind, name, notes): kind None (normal), "dev" or "build"


def crates():
    """The workspace's crates, lowest layer first (a crate after every crate it depends on), by name within a layer."""
    m = metadata()
    members = set(m["workspace_members"])
    by_name = {}
    for pkg in m["packages"]:
        if pkg["id"] in members:
            c = Crate(pkg, m["workspace_root"])
            by_name[c.name] = c
    for c in by_name.values():
        for d in c.pkg["dependencies"]:
            if d["name"] not in by_name:
                continue
            notes = []
            if d.get("features"):
                notes.append("features: " + ", ".join(d["features"]))
            if not d.get("uses_default_features", True):
                notes.append("no default features")
            if d.get("optional"):
                notes.append("optional")
            if d.get("target"):
                notes.append("only for " + d["target"])
            c.deps.append((d.get("kind"), d["name"], notes))
    level = {}

    def layer(name, seen=()):
        if name not in level:
            if name in seen:
                sys.exit(f"arch-check: a dependency cycle through {name}")
            below = [layer(n, seen + (name,)) for k, n, _ in by_name[name].deps if k != "dev"]
            level[name] = 1 + max(below, default=-1)
        return level[name]

    order = sorted(by_name, key=lambda n: (layer(n), n))
    rank = {n: i for i, n in enumerate(order)}
    for c in by_name.values():
        c.deps.sort(key=lambda d: (rank[d[1]], d[0] or ""))
    return [by_name[n] for n in order]


def normal_deps(c):
    return {n for k, n, _ in c.deps if k is None}


def dep_cell(c, kinds):
    parts = []
    for k, n, notes in c.deps:
        if k in kinds:
            build = "build: " if k == "build" else ""
            parts.append(f"{build}`{n}`" + (f" ({'; '.join(notes)})" if notes else ""))
    return ", ".join(parts) or "nothing"


def deps_block(cs):
    lines = [
        BEGIN,
        NOTE,
        "| crate (folder) | depends on (of ours) | dev-dependencies (of ours) |",
        "|---|---|---|",
    ]
    for c in cs:
        lines.append(f"| `{c.name}` ({c.folder}) | {dep_cell(c, (None, 'build'))} | {dep_cell(c, ('dev',))} |")
    lines.append(END)
    return lines


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def block_span(lines):
    """The indexes of the begin and end marker lines, or None."""
    begins = [i for i, l in enumerate(lines) if l.strip() == BEGIN]
    ends = [i for i, l in enumerate(lines) if l.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        return None
    return begins[0], ends[0]


def cells(row):
    """A Markdown table row's cells; a `|` inside a code span does not split."""
    out, cur, code = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def section_rows(text, heading):
    """The body rows of the first table in the section `heading` (up to the next heading of its level or above)."""
    lines = text.split("\n")
    level = len(heading) - len(heading.lstrip("#"))
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == heading)
    except StopIteration:
        return None
    rows, seen_table = [], False
    for l in lines[start + 1:]:
        m = re.match(r"(#+) ", l)
        if m and len(m.group(1)) <= level:
            break
        if l.startswith("|"):
            seen_table = True
            if not re.fullmatch(r"\|[\s|:-]+\|?", l.strip()):
                rows.append(cells(l))
        elif seen_table:
            break
    return rows[1:]  # the header row


def code_spans(s):
    return re.findall(r"`([^`]+)`", s)


def commands():
    """The commands of `hl7gw`, as clap names them (kebab-case), from `enum Command` in the CLI's cli.rs."""
    path = "services/cli/src/cli.rs"
    src = read(path)
    m = re.search(r"^(?:pub(?:\([a-z]+\))? )?enum Command \{\n(.*?)^\}", src, re.S | re.M)
    if not m:
        sys.exit(f"arch-check: no `enum Command` in {path}")
    names = re.findall(r"^    ([A-Z][A-Za-z0-9]*)\b", m.group(1), re.M)
    if not names:
        sys.exit(f"arch-check: no command found in {path}'s `enum Command`")
    return [re.sub(r"(?<!^)(?=[A-Z])", "-", n).lower() for n in names], path


def check_commands_named(row, cli_commands, where, problems):
    """The CLI's row of a table names every command of `hl7gw` (in code spans of its second cell)."""
    missing = [k for k in cli_commands if k not in code_spans(row[1])]
    if missing:
        problems.append(f"{where} does not name " + ", ".join(f"`{k}`" for k in missing))


def check_parts(cs, arch, cli_commands, problems):
    rows = section_rows(arch, "## The parts")
    if rows is None:
        problems.append(f"{ARCH}: no section \"## The parts\"")
        return
    names = {c.name for c in cs}
    table = {}
    for r in rows:
        m = re.fullmatch(r"`([^`]+)` \(([^)]+)\)", r[0])
        if not m:
            problems.append(f"{ARCH}, The parts: a row's first cell is not \"`crate` (folder)\": {r[0]!r}")
            continue
        if m.group(1) not in names:
            problems.append(f"{ARCH}, The parts: `{m.group(1)}` is not a crate of the workspace")
        table[m.group(1)] = (m.group(2), r)
    for c in cs:
        if c.name not in table:
            problems.append(f"{ARCH}, The parts: no row for `{c.name}` ({c.folder})")
            continue
        folder, r = table[c.name]
        if folder != c.folder:
            problems.append(f"{ARCH}, The parts: `{c.name}` is in {c.folder}, the table says {folder}")
        said = {n for n in code_spans(r[-1]) if n in names}
        want = normal_deps(c)
        for n in sorted(want - said):
            problems.append(f"{ARCH}, The parts: `{c.name}` depends on `{n}`, its last column does not say so")
        for n in sorted(said - want):
            problems.append(f"{ARCH}, The parts: `{c.name}` does not depend on `{n}`, its last column says it does")
        if c.folder == "services/cli":
            check_commands_named(r, cli_commands, f"{ARCH}, The parts: `{c.name}`'s row", problems)


def check_readme(cs, cli_commands, problems):
    rows = section_rows(read(README), "## What is here")
    if rows is None:
        problems.append(f"{README}: no section \"## What is here\"")
        return
    by_path = {}
    for r in rows:
        p = code_spans(r[0])
        if p:
            by_path[p[0].rstrip("/")] = r
    for c in cs:
        r = by_path.get(c.folder)
        if r is None:
            problems.append(f"{README}, What is here: no row for `{c.folder}` (the crate `{c.name}`)")
            continue
        if c.name not in code_spans(" | ".join(r[1:])):
            problems.append(f"{README}, What is here: the row of `{c.folder}` does not name `{c.name}`")
        if c.folder == "services/cli":
            check_commands_named(r, cli_commands, f"{README}, What is here: the row of `{c.folder}`", problems)


def expand(token):
    """`pipeline/{accept,publish}.rs` as its paths."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    return [p for alt in m.group(1).split(",") for p in expand(token[:m.start()] + alt + token[m.end():])]


def check_paths(arch, problems):
    """Every path in a code span of docs/architecture.md exists. A path is one whose first part is an entry of
    the repository's root (`services/egress/src/`), or, under a heading that names a folder, a `.rs` file or
    a folder (ending in `/`) below that folder. Globs and placeholders (`*`, `<...>`) are not paths."""
    top = set(os.listdir(ROOT))
    base, n = None, 0
    for lineno, line in enumerate(arch.split("\n"), 1):
        if line.startswith("#"):
            base = next((s for s in code_spans(line) if s.endswith("/") and os.path.isdir(os.path.join(ROOT, s))),
                        None)
            continue
        for span in code_spans(line):
            if not re.fullmatch(r"[\w.{},/-]+", span):
                continue
            for p in expand(span):
                rooted = "/" in p and p.split("/")[0] in top
                below = base is not None and (p.endswith(".rs") or p.endswith("/"))
                if not (rooted or below):
                    continue
                n += 1
                where = [p] if rooted else [os.path.join(base, p)]
                if not any(os.path.exists(os.path.join(ROOT, w)) for w in where):
                    problems.append(f"{ARCH}:{lineno}: `{span}` names {where[0]}, which does not exist")
    return n


def files_of(cell, base):
    """The files a table cell names (folders: the `.rs` files below them), as paths from the root."""
    top = set(os.listdir(ROOT))
    out = []
    for span in code_spans(cell):
        for p in expand(span):
            if "/" in p and p.split("/")[0] in top:
                path = p
            elif base and (p.endswith(".rs") or p.endswith("/")):
                path = os.path.join(base, p)
            else:
                continue
            full = os.path.join(ROOT, path)
            if os.path.isdir(full):
                for d, _, names in os.walk(full):
                    out += [os.path.join(d, n) for n in names if n.endswith(".rs")]
            elif os.path.isfile(full):
                out.append(full)
    return out


def check_look_for(arch, problems):
    """Under "## A message's way", each "look for" name is a word of the files its row names."""
    lines = arch.split("\n")
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith("## A message's way"))
    except StopIteration:
        problems.append(f"{ARCH}: no section \"## A message's way\"")
        return 0
    base, n = None, 0
    for lineno, line in enumerate(lines[start + 1:], start + 2):
        if re.match(r"## ", line):
            break
        if line.startswith("#"):
            base = next((s for s in code_spans(line) if s.endswith("/")), None)
            continue
        if not line.startswith("|") or re.fullmatch(r"\|[\s|:-]+\|?", line.strip()):
            continue
        row = cells(line)
        if len(row) < 3 or row[2] == "look for":
            continue
        text = ""
        for f in files_of(row[1], base):
            with open(f, encoding="utf-8") as fh:
                text += fh.read()
        for name in code_spans(row[2]):
            word = name.split("::")[-1].rstrip("()")
            n += 1
            if not re.search(r"\b" + re.escape(word) + r"\b", text):
                problems.append(f"{ARCH}:{lineno}: `{name}` is in none of the files of its row ({row[1]})")
    return n


def check_tests(arch, problems):
    """Each `module::test` of the invariants table is a `fn` somewhere in the workspace's Rust files."""
    sec = arch.split("## The invariants", 1)
    if len(sec) < 2:
        problems.append(f"{ARCH}: no section \"## The invariants\"")
        return 0
    fns = set()
    for top in ("services", "proto", "loadtest"):
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            if "/target" in d or "/fuzz/" in d:
                continue
            for name in names:
                if name.endswith(".rs"):
                    with open(os.path.join(d, name), encoding="utf-8") as fh:
                        fns.update(re.findall(r"\bfn ([a-z0-9_]+)", fh.read()))
    n = 0
    for span in code_spans(sec[1]):
        if re.fullmatch(r"[a-z0-9_]+(::[a-z0-9_]+)+", span):
            n += 1
            if span.split("::")[-1] not in fns:
                problems.append(f"{ARCH}, the invariants: no test `{span}` in the workspace")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="make the crate-deps block again from cargo metadata")
    args = ap.parse_args()

    cs = crates()
    arch = read(ARCH)
    lines = arch.split("\n")
    span = block_span(lines)
    if span is None:
        sys.exit(f"arch-check: {ARCH} needs exactly one `{BEGIN}` line and one `{END}` line after it")
    want = deps_block(cs)
    have = [l.rstrip() for l in lines[span[0]:span[1] + 1]]
    problems = []
    if args.write:
        if have != want:
            lines[span[0]:span[1] + 1] = want
            arch = "\n".join(lines)
            with open(os.path.join(ROOT, ARCH), "w", encoding="utf-8") as f:
                f.write(arch)
            print(f"arch-check: wrote the crate-deps block of {ARCH}")
    elif have != want:
        diff = difflib.unified_diff(have, want, f"{ARCH} (crate-deps block)", "cargo metadata", lineterm="")
        problems.append(f"{ARCH}: the crate-deps block is not what cargo metadata says "
                        "(scripts/arch-check.py --write makes it again):\n" + "\n".join(diff))

    cli_commands, _ = commands()
    check_parts(cs, arch, cli_commands, problems)
    check_readme(cs, cli_commands, problems)
    n_paths = check_paths(arch, problems)
    n_names = check_look_for(arch, problems)
    n_tests = check_tests(arch, problems)

    if problems:
        for p in problems:
            print(f"arch-check: {p}", file=sys.stderr)
        print(f"arch-check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"arch-check: {ARCH} and {README} agree with cargo metadata ({len(cs)} crates, "
          f"{len(cli_commands)} commands of hl7gw, {n_paths} paths, {n_names} names to look for, {n_tests} tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
