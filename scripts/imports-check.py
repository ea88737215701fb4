#!/usr/bin/env python3
"""No import circle in the house (issue 39): within each crate, the modules (one per file) and the paths each
file names (`crate::a::b`, `super::x`, `self::y`, a child's name); a circle is a set of modules that reach each
other. A module's inline `#[cfg(test)] mod tests` is left out (it is part of the module it tests), and so are
the `mod` declarations themselves (a parent declaring its children depends on nothing).

  scripts/imports-check.py          check every crate: exit 1 and name each circle
  scripts/imports-check.py --graph  also print every crate's module edges
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = re.compile(r"(?<![\w:])(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"(?<![\w:])(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}", re.S)


def crate_dirs():
    out = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    import json
    for p in json.loads(out)["packages"]:
        src = os.path.join(os.path.dirname(p["manifest_path"]), "src")
        if os.path.isdir(src):
            yield p["name"], src


def modules(src):
    """{module path tuple: file} for every .rs under src (lib.rs/main.rs the root, a/mod.rs is a)."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]):
                parts = []
            elif len(parts) == 1 and parts[0] in ("lib", "main"):
                parts = []
            mods.setdefault(tuple(parts), os.path.join(dirpath, f))
    return mods


def strip(text):
    """The file's text without comments, strings and its inline test module."""
    out, i, n = [], 0, len(text)
    token = re.compile(r"""//[^\n]*|/\*[\s\S]*?\*/|(?<![\w])b?r(#*)"[\s\S]*?"\1|b?"(?:\\[\s\S]|[^"\\])*"|b?'(?:\\[\s\S]|[^'\\])'""")
    for m in token.finditer(text):
        out.append(text[i:m.start()])
        out.append('""' if m.group(0).lstrip("b").startswith(('"', "r")) else " ")
        i = m.end()
    out.append(text[i:])
    text = "".join(out)
    m = re.search(r"^#\[cfg\(test\)\]\s*\n(?:\s*#\[[^\n]*\]\s*\n)*\s*(?:pub(?:\([^)]*\))? )?mod tests\s*\{", text, re.M)
    return text[: m.start()] if m else text


# {module: names of the items it defines itself}, filled by main(): an item a module defines is not looked up
# through its glob re-exports (Rust's rule too: a glob import is shadowed by the module's own items).
DEFINED = {}
ITEM = re.compile(r"^\s*(?:pub(?:\([^)]*\))? )?(?:(?:async|const|unsafe|extern \"C\") )*"
                  r"(?:fn|struct|enum|union|trait|type|const|static|mod|macro_rules!)\s+(\w+)", re.M)


def resolve(mods, base, comps, reexports=None, depth=0):
    """The module that defines what `base` + comps names: the deepest module it reaches, followed through that
    module's `pub use` of the next name (a re-export is where the item is looked up, not where it is); a glob
    re-export only where the module does not define the name itself, and the glob whose module does."""
    cur = tuple(base)
    rest = list(comps)
    while rest and cur + (rest[0],) in mods:
        cur = cur + (rest.pop(0),)
    if reexports and rest and depth < 8:
        table = reexports.get(cur, {})
        if rest[0] in table:
            target, rest = table[rest[0]], rest[1:]
        elif rest[0] in DEFINED.get(cur, ()):
            return cur
        else:
            globs = table.get("*", [])
            target = next((g for g in globs if rest[0] in DEFINED.get(g, ())), globs[-1] if globs else None)
        if target is not None and target != cur:
            return resolve(mods, target, rest, reexports, depth + 1)
    return cur


REEXPORT = re.compile(r"^\s*pub(?:\([^)]*\))? use ((?:crate|super|self)?(?:::)?[\w:]*?)(?:::\{([^}]*)\}|::(\w+|\*))(?: as \w+)?;", re.M)


def reexports_of(mods, me, text):
    """{name: module it comes from} for the `pub use` lines of module `me` ("*" for a glob)."""
    out = {}
    for m in REEXPORT.finditer(text):
        prefix = m.group(1)
        names = [n.strip().split(" as ")[0].split("::")[-1] for n in m.group(2).split(",")] if m.group(2) else [m.group(3)]
        comps = [c for c in prefix.split("::") if c]
        if comps and comps[0] == "crate":
            base, comps = (), comps[1:]
        elif comps and comps[0] == "super":
            base, comps = me[:-1], comps[1:]
        elif comps and comps[0] == "self":
            base, comps = me, comps[1:]
        else:
            base = me
        target = resolve(mods, base, comps)
        if target == me:
            continue
        for n in names:
            if n == "*":
                out.setdefault("*", []).append(target)
            elif n:
                out[n] = target
    return out


def edges_of(mods, me, text, reexports):
    out = set()
    children = {m[-1] for m in mods if len(m) == len(me) + 1 and m[: len(me)] == me}

    def add(kind, rest):
        comps = [c for c in rest.split("::") if c]
        if kind == "crate":
            base = ()
        elif kind == "self":
            base = me
        else:
            base = me
            while comps is not None and kind == "super":
                base = base[:-1]
                if comps and comps[0] == "super":
                    comps = comps[1:]
                    continue
                break
        target = resolve(mods, base, comps, reexports)
        if target != me:
            out.add(target)

    for m in GROUP.finditer(text):
        for item in m.group(3).split(","):
            first = item.strip().split("::")[0].split(" ")[0]
            if first and first != "self":
                add(m.group(1), m.group(2) + "::" + first)
            else:
                add(m.group(1), m.group(2))
    for m in PATH.finditer(text):
        add(m.group(1), m.group(2))
    # a child named by its bare name, and a module's children brought in by `use that::module::*`
    named = {c: me + (c,) for c in children}
    for g in re.finditer(r"(?<![\w:])use ((?:crate|super|self)(?:::\w+)*|\w+(?:::\w+)*)::\*;", text):
        comps = g.group(1).split("::")
        base = () if comps[0] == "crate" else me[:-1] if comps[0] == "super" else me
        rest = comps[1:] if comps[0] in ("crate", "super", "self") else comps
        glob = resolve(mods, base, rest)
        for m in mods:
            if len(m) == len(glob) + 1 and m[: len(glob)] == glob:
                named.setdefault(m[-1], m)
    for c, module in named.items():
        for m in re.finditer(r"(?<![\w:])" + re.escape(c) + r"((?:::\w+)+)", text):
            target = resolve(mods, module[:-1], [c] + [x for x in m.group(1).split("::") if x], reexports)
            if target != me:
                out.add(target)
    return out


def sccs(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def name(crate, m):
    return crate + ("::" + "::".join(m) if m else "")


def main():
    show = "--graph" in sys.argv
    circles, total = [], 0
    for crate, src in crate_dirs():
        mods = modules(src)
        graph = {}
        texts = {m: strip(open(f, encoding="utf-8").read()) for m, f in mods.items()}
        DEFINED.clear()
        DEFINED.update({m: set(ITEM.findall(t)) for m, t in texts.items()})
        reexports = {m: reexports_of(mods, m, t) for m, t in texts.items()}
        for m in mods:
            # a module's own re-exports are its interface, not a use: left out of its edges
            text = REEXPORT.sub("", texts[m])
            graph[m] = edges_of(mods, m, text, reexports)
            total += len(graph[m])
            if show:
                for t in sorted(graph[m]):
                    print(f"{name(crate, m)} -> {name(crate, t)}")
        for comp in sccs(graph):
            if len(comp) > 1:
                circles.append(sorted(name(crate.replace("-", "_"), c) for c in comp))
    for c in circles:
        print("imports-check: an import circle: " + " <-> ".join(c), file=sys.stderr)
    if circles:
        sys.exit(1)
    print(f"imports-check: no import circle ({total} module edges in the workspace's crates)", file=sys.stderr)


if __name__ == "__main__":
    main()
