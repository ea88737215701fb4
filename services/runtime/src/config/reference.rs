//! The configuration reference, generated from the code: each service's JSON Schema (`--print-schema`,
//! checked in as `docs/config/<service>.schema.json`) and the tables of `docs/configuration.md` made from it.
//! A unit test in each service compares both with what the code says now ([`check_current`]).

use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The JSON Schema of `T` (draft 2020-12), pretty-printed with a trailing newline: what `--print-schema`
/// prints and `docs/config/<service>.schema.json` holds.
/// Keys are sorted at every depth, so the text is the same whether or not serde_json's `preserve_order` is on
/// (a workspace build turns it on for the CLI, and with it for every crate built alongside).
pub fn schema_json<T: schemars::JsonSchema>() -> String {
    let schema = sorted(schemars::schema_for!(T).to_value());
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    text.push('\n');
    text
}

/// `value` with every object's keys in sorted order.
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// One row of a reference table.
struct Row {
    key: String,
    ty: String,
    default: String,
    meaning: String,
}

/// The markdown table of every key in `schema` (as [`schema_json`] makes it): dotted key, type, default and
/// meaning; a map's keys are `<name>`, a list's items `[]`.
pub fn markdown_table(schema: &Value) -> String {
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut rows = Vec::new();
    walk_object(schema, "", &defs, &mut rows);
    let mut out = String::from("| Key | Type | Default | Meaning |\n|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            r.key,
            cell(&r.ty),
            cell(&r.default),
            cell(&r.meaning)
        );
    }
    out
}

/// The rows of an object schema's properties, each prefixed with `prefix`; nested objects are walked.
fn walk_object(schema: &Value, prefix: &str, defs: &Map<String, Value>, rows: &mut Vec<Row>) {
    let schema = resolve(schema, defs);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, prop) in props {
        let key = format!("{prefix}{name}");
        let target = resolve(non_null(prop), defs);
        let mut meaning = clean(
            prop.get("description").and_then(Value::as_str).unwrap_or(
                target
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            ),
        );
        let variants = enum_variants(target);
        if variants.iter().any(|(_, d)| !d.is_empty()) {
            for (v, d) in variants.iter().filter(|(_, d)| !d.is_empty()) {
                let _ = write!(meaning, "<br>`{v}`: {}", clean(d));
            }
        }
        let default = match prop.get("default") {
            // An object's default is its keys' defaults, each in its own row.
            Some(_) if is_object(target) => "—".to_owned(),
            Some(Value::String(s)) if !s.is_empty() => format!("`{s}`"),
            Some(v) => format!("`{}`", compact(v)),
            None if required.contains(&name.as_str()) => "required".to_owned(),
            None => "—".to_owned(),
        };
        rows.push(Row {
            key: key.clone(),
            ty: type_name(prop, defs),
            default,
            meaning,
        });
        // What is inside: a struct's keys, a map's values, a list's items.
        if is_object(target) {
            walk_object(target, &format!("{key}."), defs, rows);
        } else if let Some(values) = target.get("additionalProperties").filter(|v| v.is_object()) {
            walk_object(values, &format!("{key}.<name>."), defs, rows);
        } else if let Some(items) = target.get("items") {
            walk_object(items, &format!("{key}[]."), defs, rows);
        }
    }
}

/// `schema` with a `$ref` followed (one level is all schemars makes).
fn resolve<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| defs.get(name))
        .unwrap_or(schema)
}

/// An `Option<T>`'s `T`: the branch of `anyOf: [T, null]` that is not null.
fn non_null(schema: &Value) -> &Value {
    match schema.get("anyOf").and_then(Value::as_array) {
        Some(branches) => branches
            .iter()
            .find(|b| b.get("type").and_then(Value::as_str) != Some("null"))
            .unwrap_or(schema),
        None => schema,
    }
}

fn is_object(schema: &Value) -> bool {
    schema.get("properties").is_some()
}

/// An enum's values and their descriptions (`oneOf` of `const`s, or a plain `enum`).
fn enum_variants(schema: &Value) -> Vec<(String, String)> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .filter_map(|v| Some((v.as_str()?.to_owned(), String::new())))
            .collect();
    }
    schema
        .get("oneOf")
        .and_then(Value::as_array)
        .map(|branches| {
            branches
                .iter()
                .flat_map(|b| {
                    let d = b.get("description").and_then(Value::as_str).unwrap_or("");
                    let values: Vec<&Value> = match (b.get("const"), b.get("enum")) {
                        (Some(c), _) => vec![c],
                        (None, Some(Value::Array(e))) => e.iter().collect(),
                        _ => Vec::new(),
                    };
                    values
                        .into_iter()
                        .filter_map(|v| Some((v.as_str()?.to_owned(), d.to_owned())))
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A short type name: `string`, `integer`, `duration`, `` `a` or `b` ``, `list of string`, `map of object`...;
/// `, optional` when null is allowed.
fn type_name(schema: &Value, defs: &Map<String, Value>) -> String {
    let optional = schema
        .get("anyOf")
        .and_then(Value::as_array)
        .is_some_and(|b| b.iter().any(|x| x.get("type") == Some(&"null".into())))
        || schema
            .get("type")
            .and_then(Value::as_array)
            .is_some_and(|t| t.iter().any(|x| x == "null"));
    let base = base_type(resolve(non_null(schema), defs), defs);
    if optional {
        format!("{base}, optional")
    } else {
        base
    }
}

fn base_type(schema: &Value, defs: &Map<String, Value>) -> String {
    let variants = enum_variants(schema);
    if !variants.is_empty() {
        return variants
            .iter()
            .map(|(v, _)| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(" or ");
    }
    if schema.get("pattern").and_then(Value::as_str) == Some(DURATION_PATTERN) {
        return "duration".to_owned();
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("any"),
        _ => "any",
    };
    match ty {
        "array" => match schema.get("items") {
            Some(items) => format!("list of {}", base_type(resolve(items, defs), defs)),
            None => "list".to_owned(),
        },
        "object" if !is_object(schema) => match schema.get("additionalProperties") {
            Some(v) if v.is_object() => format!("map of {}", base_type(resolve(v, defs), defs)),
            _ => "object".to_owned(),
        },
        "integer" | "number" | "boolean" | "string" | "object" => ty.to_owned(),
        _ => "any".to_owned(),
    }
}

/// A default value as compact JSON.
fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A doc comment as one line of table text: rustdoc links (``[`x`]``) as plain code.
fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("[`") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.find("`]") {
            Some(j) => {
                out.push_str(&after[..j + 1]);
                rest = &after[j + 2..];
                // A link target that follows: `(crate::x)`.
                if let Some(stripped) = rest.strip_prefix('(')
                    && let Some(k) = stripped.find(')')
                    && !stripped[..k].contains(' ')
                {
                    rest = &stripped[k + 1..];
                }
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text safe in a table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The pattern of a duration value (`humantime`: `500ms`, `30s`, `1h 30m`, `0s`).
pub const DURATION_PATTERN: &str = r"^\s*([0-9]+\s*[a-zA-Zµ]+\s*)+$";

/// Where the checked-in schema and reference are: the repository's `docs/`.
fn docs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

/// Compares `docs/config/<service>.schema.json` with `schema` (from [`schema_json`]) and the table between
/// `docs/configuration.md`'s `<!-- config-reference:<service> -->` markers with [`markdown_table`]; with
/// `HL7GW_UPDATE_CONFIG_DOCS=1` rewrites both instead. `Err` says what differs and how to update.
pub fn check_current(service: &str, schema: &str) -> Result<(), String> {
    let update = std::env::var_os("HL7GW_UPDATE_CONFIG_DOCS").is_some();
    let how =
        "run `HL7GW_UPDATE_CONFIG_DOCS=1 cargo test --workspace --lib config` and commit docs/";
    let schema_path = docs_dir().join(format!("config/{service}.schema.json"));
    let value: Value = serde_json::from_str(schema).map_err(|e| e.to_string())?;
    let table = markdown_table(&value);
    let doc_path = docs_dir().join("configuration.md");
    let doc =
        std::fs::read_to_string(&doc_path).map_err(|e| format!("{}: {e}", doc_path.display()))?;
    let begin = format!("<!-- config-reference:{service}:begin -->\n");
    let end = format!("<!-- config-reference:{service}:end -->");
    let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end)) else {
        return Err(format!(
            "{} has no {begin:?} ... {end:?} markers",
            doc_path.display()
        ));
    };
    let current = &doc[b + begin.len()..e];
    if update {
        std::fs::create_dir_all(docs_dir().join("config")).map_err(|e| e.to_string())?;
        std::fs::write(&schema_path, schema).map_err(|e| e.to_string())?;
        let new_doc = format!("{}{table}{}", &doc[..b + begin.len()], &doc[e..]);
        std::fs::write(&doc_path, new_doc).map_err(|e| e.to_string())?;
        return Ok(());
    }
    let on_disk = std::fs::read_to_string(&schema_path).unwrap_or_default();
    if on_disk != schema {
        return Err(format!(
            "{} is not the schema the code makes: {how}",
            schema_path.display()
        ));
    }
    if current != table {
        return Err(format!(
            "the {service} table in {} is not what the schema makes: {how}",
            doc_path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustdoc_links_become_code() {
        assert_eq!(
            clean("see [`Config::unmatched`] and\n [`x`](crate::x), [a](b)"),
            "see `Config::unmatched` and `x`, [a](b)"
        );
    }

    #[test]
    fn the_shared_sections_make_rows() {
        #[derive(schemars::JsonSchema, serde::Serialize, Default)]
        #[serde(default)]
        #[allow(dead_code)]
        struct T {
            /// The service section.
            service: crate::config::ServiceSettings,
            /// Optional list.
            list: Option<Vec<String>>,
        }
        let schema: Value = serde_json::from_str(&schema_json::<T>()).expect("json");
        let table = markdown_table(&schema);
        assert!(
            table.contains("| `service.drain_timeout` | duration | `20s` |"),
            "{table}"
        );
        assert!(
            table.contains("| `list` | list of string, optional | `null` |"),
            "{table}"
        );
    }
}
