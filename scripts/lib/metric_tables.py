"""The metrics the services declare in their `hl7gw_runtime::metric_set!` tables (and the egress's
`per_destination!` one), read from the Rust source the way prometheus_client names them, for the checks that
compare documented or queried names with what is declared (scripts/docs-check.py, scripts/chart/check-metrics.py).

    declared(text) -> [(name, kind, field)]

name: hl7gw_<prefix>_<field or its `as "alias"`>[_<unit>] (no `_total`/`_bucket` suffix: the callers add what they
match); kind: "counter", "gauge", "histogram", or None when the type names none of them.
"""
import re

# The table: the macro's name, its comments or one-line attributes, `[pub] struct Name under "prefix"[, ...] {`, the rows,
# the closing brace (and metric_set!'s optional `with { ... }`).
TABLE = re.compile(
    r'\b(?:metric_set|per_destination)!\s*\{\s*(?:(?://|#\[)[^\n]*\n\s*)*'
    r'(?:pub(?:\([^)]*\))?\s+)?struct\s+\w+\s+under\s+"(\w+)"[^{\n]*\{(.*?)\n\s*\}\s*(?:with\s*\{[^}]*\}\s*)?\}',
    re.S)
# A row: `[pub] field [as "alias"]: Type = "help"[, unit Unit][, new ...];`
ROW = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(\w+)(?:\s+as\s+"(\w+)")?\s*:\s*([^=;]+?)\s*=\s*"(?:[^"\\]|\\[\s\S])*"'
    r'(?:\s*,\s*unit\s+(\w+))?',
    re.M)
UNITS = {"Seconds": "seconds", "Bytes": "bytes"}


def kind_of(ty):
    for k in ("Histogram", "Counter", "Gauge"):
        if k in ty:
            return k.lower()
    return None


def declared(text):
    out = []
    # a test module's tables are not the service's
    text = re.split(r"\n#\[cfg\(test\)\]\s*\n\s*mod\s", text)[0]
    for table in TABLE.finditer(text):
        prefix, body = table.groups()
        body = re.sub(r"(?m)^\s*//[^\n]*$", "", body)
        for field, alias, ty, unit in ROW.findall(body):
            name = f"hl7gw_{prefix}_{alias or field}" + (f"_{UNITS.get(unit, unit.lower())}" if unit else "")
            out.append((name, kind_of(ty), field))
    return out
