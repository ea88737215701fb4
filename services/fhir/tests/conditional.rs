//! Conditional updates a FHIR server accepts: every corpus message of a supported type
//! (`../shared/testdata/hl7`, in file-name order, as the egress end-to-end test sends them) and our samples,
//! converted as transaction Bundles, then
//!
//! - within one Bundle no conditional URL, and no resolved identity, appears twice (FHIR's transaction rules;
//!   HAPI JPA refuses the Bundle with 400);
//! - delivered in order to a simulated server (identifier and code token matching, as HAPI's), each
//!   conditional update matches at most one stored resource (else HTTP 412), and delivering everything a
//!   second time changes no count (a redelivery updates, never duplicates); delivered in reverse order, the
//!   same.

use hl7gw_fhir::{Options, TimeZone, convert, supports};
use hl7gw_testkit::{corpus_dir, hl7_files};
use hl7v2::{Charset, Message};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

/// The transaction Bundles, in delivery order: the corpus's, then our samples'.
fn bundles() -> Vec<(String, Value)> {
    let mut messages = hl7_files(&corpus_dir(), "");
    messages.extend(hl7_files(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"),
        "sample-",
    ));
    let opts = Options {
        timezone: Some(TimeZone::parse("-05:00").expect("offset")),
        ..Options::default()
    };
    let mut out = Vec::new();
    for (name, bytes) in messages {
        let Some(msg) = Message::parse(&bytes).ok().filter(|m| supports(m)) else {
            continue;
        };
        let charset = Charset::from_msh18(msg.header().charset).unwrap_or(Charset::Utf8);
        let mut json = Vec::new();
        // Messages the converter refuses (no PID...) send nothing.
        if convert(&msg, charset, &opts, &mut json).is_err() {
            continue;
        }
        let v: Value = serde_json::from_slice(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, v));
    }
    out
}

/// `%XX` decoded (the URL's bytes are ASCII; the decoded bytes UTF-8).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(x) = u8::from_str_radix(h, 16)
        {
            out.push(x);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).expect("UTF-8")
}

/// A token `system|code` (`\` escapes `|`, `,`, `$` and itself) → (system, code); `None` system when the
/// token has no `|` (any system).
fn token(v: &str) -> (Option<String>, String) {
    let mut parts = vec![String::new()];
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    parts.last_mut().expect("one").push(n);
                }
            }
            '|' => parts.push(String::new()),
            ',' => panic!("a token with an unescaped comma (an OR): {v}"),
            _ => parts.last_mut().expect("one").push(c),
        }
    }
    match parts.len() {
        1 => (None, parts.remove(0)),
        2 => {
            let code = parts.remove(1);
            (Some(parts.remove(0)), code)
        }
        _ => panic!("a token with two unescaped bars: {v}"),
    }
}

fn token_match(q: &(Option<String>, String), system: Option<&str>, code: Option<&str>) -> bool {
    let system_ok = match &q.0 {
        None => true,
        Some(s) if s.is_empty() => system.is_none_or(str::is_empty),
        Some(s) => system == Some(s.as_str()),
    };
    system_ok && code == Some(q.1.as_str())
}

/// Whether a stored resource matches a conditional URL's parameters (`identifier`, `code`: the only ones the
/// converter writes).
fn matches(r: &Value, params: &[(String, (Option<String>, String))]) -> bool {
    params.iter().all(|(k, q)| match k.as_str() {
        "identifier" => {
            let mut ids: Vec<&Value> = r["identifier"].as_array().into_iter().flatten().collect();
            // DocumentReference's `identifier` parameter also searches masterIdentifier.
            if r["resourceType"] == "DocumentReference" {
                ids.push(&r["masterIdentifier"]);
            }
            ids.iter()
                .any(|i| token_match(q, i["system"].as_str(), i["value"].as_str()))
        }
        "code" => r["code"]["coding"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| token_match(q, c["system"].as_str(), c["code"].as_str())),
        other => panic!("a conditional URL with the parameter {other}"),
    })
}

/// An entry's request as a URL (`Type?identifier=...` for a conditional update or, with `ifNoneExist`, a
/// create-if-absent; `Type/id` for an update by id) and whether it only creates (POST).
fn request_url(e: &Value) -> (String, bool) {
    let r = &e["request"];
    let url = r["url"].as_str().unwrap_or_default();
    match (r["method"].as_str(), r["ifNoneExist"].as_str()) {
        (Some("POST"), Some(q)) => (format!("{url}?{q}"), true),
        _ => (url.to_owned(), false),
    }
}

/// The resources a simulated server holds: type → id → resource.
type Store = HashMap<String, BTreeMap<String, Value>>;

/// Delivers one Bundle as a transaction: the conditions are evaluated against the store as it was before the
/// Bundle, then the writes happen. Errors: what a server would refuse.
fn deliver(store: &mut Store, bundle: &Value, next_id: &mut usize) -> Result<(), String> {
    let mut conditions = HashSet::new();
    let mut resolved = HashSet::new();
    let mut writes = Vec::new();
    for e in bundle["entry"].as_array().into_iter().flatten() {
        let (url, create_only) = request_url(e);
        let url = url.as_str();
        if url.is_empty() {
            return Err("an entry without a url".into());
        }
        let r = &e["resource"];
        let mut matched = false;
        let (ty, id) = match url.split_once('?') {
            Some((ty, query)) => {
                if !conditions.insert(url.to_owned()) {
                    return Err(format!("400: the condition {url} appears twice"));
                }
                let params: Vec<(String, (Option<String>, String))> = query
                    .split('&')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        (percent_decode(k), token(&percent_decode(v)))
                    })
                    .collect();
                let hits: Vec<&String> = store
                    .get(ty)
                    .into_iter()
                    .flatten()
                    .filter(|(_, s)| matches(s, &params))
                    .map(|(id, _)| id)
                    .collect();
                match hits.as_slice() {
                    [] => {
                        *next_id += 1;
                        (ty.to_owned(), format!("new-{next_id}"))
                    }
                    [one] => {
                        // A create-if-absent that finds one leaves it as it is.
                        matched = create_only;
                        (ty.to_owned(), (*one).clone())
                    }
                    _ => {
                        return Err(format!("412: {url} matches {} {ty} resources", hits.len()));
                    }
                }
            }
            None => {
                let (ty, id) = url.split_once('/').ok_or("a url without an id")?;
                (ty.to_owned(), id.to_owned())
            }
        };
        if !resolved.insert((ty.clone(), id.clone())) {
            return Err(format!("400: {ty}/{id} is written twice ({url})"));
        }
        if !matched {
            writes.push((ty, id, r.clone()));
        }
    }
    for (ty, id, r) in writes {
        store.entry(ty).or_default().insert(id, r);
    }
    Ok(())
}

fn counts(store: &Store) -> BTreeMap<String, usize> {
    store.iter().map(|(t, m)| (t.clone(), m.len())).collect()
}

#[test]
fn no_conditional_url_twice_in_a_bundle() {
    let bundles = bundles();
    assert!(!bundles.is_empty());
    let mut repeated = Vec::new();
    for (name, b) in &bundles {
        let mut seen = HashSet::new();
        for e in b["entry"].as_array().into_iter().flatten() {
            let (url, _) = request_url(e);
            if !seen.insert(url.clone()) {
                repeated.push(format!("{name}: {url}"));
            }
        }
    }
    println!("{} transaction Bundles", bundles.len());
    assert!(
        repeated.is_empty(),
        "request urls repeated in a Bundle:\n{}",
        repeated.join("\n")
    );
}

#[test]
fn each_condition_matches_at_most_one_resource_across_the_corpus() {
    let bundles = bundles();
    let mut store = Store::new();
    let mut next_id = 0;
    let mut refused = Vec::new();
    for (name, b) in &bundles {
        if let Err(e) = deliver(&mut store, b, &mut next_id) {
            refused.push(format!("{name}: {e}"));
        }
    }
    let first = counts(&store);
    println!("{} Bundles delivered; resources: {first:?}", bundles.len());
    assert!(
        refused.is_empty(),
        "{} Bundles refused:\n{}",
        refused.len(),
        refused.join("\n")
    );
    for (name, b) in &bundles {
        if let Err(e) = deliver(&mut store, b, &mut next_id) {
            refused.push(format!("{name} (again): {e}"));
        }
    }
    assert!(
        refused.is_empty(),
        "{} Bundles refused on redelivery:\n{}",
        refused.len(),
        refused.join("\n")
    );
    assert_eq!(counts(&store), first, "a redelivery changed the counts");

    // Another order (the reverse): the same resources, no refusal.
    let mut reverse = Store::new();
    for (name, b) in bundles.iter().rev() {
        if let Err(e) = deliver(&mut reverse, b, &mut next_id) {
            refused.push(format!("{name} (reverse order): {e}"));
        }
    }
    assert!(
        refused.is_empty(),
        "{} Bundles refused in reverse order:\n{}",
        refused.len(),
        refused.join("\n")
    );
    assert_eq!(counts(&reverse), first, "the order changed the counts");
}
