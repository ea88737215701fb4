//! The converter against the IG's own segment maps (`ig/segments/*.csv`): for every message of a supported
//! type (our sample and the corpus's), every valued field that the IG maps (unconditionally) into a resource
//! must appear in that resource at one of the elements the IG names for it, or be reported as unmapped. A field
//! can be neither dropped silently nor put somewhere the IG does not say. Where the IG maps a field straight to
//! an element (no sub-path, no extension), the element's JSON must have the shape of the IG's FHIR data type
//! (an Identifier an object with a value, a date `YYYY[-MM[-DD]]`, a code a string without spaces...), and for
//! identifiers, names, dates and strings the value must be the field's (CX-1 among the identifiers' values,
//! XPN-1 among the families, the date's digits, the text).

use hl7gw_fhir::{BundleType, Options, TimeZone, convert, supports};
use hl7gw_testkit::{corpus_dir, hl7_files};
use hl7v2::{Charset, Message};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::Path;

/// The segment maps checked, each with the resource it fills.
const MAPS: &[(&str, &str)] = &[
    ("PID[Patient]", "Patient"),
    ("OBR[DiagnosticReport] - OBR", "DiagnosticReport"),
    ("ORC[ServiceRequest] - ORC", "ServiceRequest"),
    ("SPM[Specimen]", "Specimen"),
    ("PV1[Encounter]", "Encounter"),
    ("NK1[RelatedPerson]", "RelatedPerson"),
    ("AL1[AllergyIntolerance]", "AllergyIntolerance"),
    ("DG1[Condition]", "Condition"),
    ("IN1[Coverage]", "Coverage"),
    ("OBX[Observation] - OBX", "Observation"),
    // A repeating OBX-5 makes components (the IG's OBX[Observation-Component]): the same resource.
    ("OBX[Observation-Component] - OBX", "Observation"),
    ("ORC[Immunization] - ORC", "Immunization"),
    ("RXA[Immunization]", "Immunization"),
    ("RXR[Immunization]", "Immunization"),
    ("TXA[DocumentReference]", "DocumentReference"),
    ("OBX[DocumentReference]", "DocumentReference"),
    ("SCH[Appointment]", "Appointment"),
    ("AIS[Appointment]", "Appointment"),
    ("AIG[Appointment]", "Appointment"),
    ("AIL[Appointment]", "Appointment"),
    ("AIP[Appointment]", "Appointment"),
];

/// One row of a map: the top-level element the IG sends a field to, and (when it sends it straight there, no
/// sub-path or extension) the element's FHIR data type.
#[derive(Debug, Clone)]
struct Target {
    element: String,
    data_type: Option<String>,
}

/// One map: v2 field number → the elements the IG sends it to (in any of its rows: a row's condition picks
/// among them, e.g. OBX-5's element by OBX-2).
fn segment_map(name: &str) -> BTreeMap<usize, Vec<Target>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("ig/segments");
    let file = std::fs::read_dir(&dir)
        .expect("ig/segments")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.contains(name))
        })
        .unwrap_or_else(|| panic!("no IG map {name}"));
    let text = std::fs::read_to_string(&file).expect("read");
    let mut map: BTreeMap<usize, Vec<Target>> = BTreeMap::new();
    for row in csv_rows(&text).into_iter().skip(2) {
        let col = |n: usize| row.get(n).map(|s| s.trim()).unwrap_or("");
        let (field, attribute, data_type) = (col(1), col(9), col(11));
        if attribute.is_empty() {
            continue;
        }
        let Some(n) = field
            .split_once('-')
            .and_then(|(_, n)| n.parse::<usize>().ok())
        else {
            continue;
        };
        let top: String = attribute
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if top.is_empty() {
            continue;
        }
        // Straight to the element (`identifier[1]`, `birthDate`): its type is the IG's data type.
        let rest = attribute[top.len()..]
            .trim_start_matches(|c: char| c == '[' || c.is_ascii_digit() || c == ']');
        let direct = rest.is_empty() && top != "extension" && top != "modifierExtension";
        let data_type = (direct && !data_type.is_empty()).then(|| {
            data_type
                .split('(')
                .next()
                .unwrap_or(data_type)
                .trim()
                .to_owned()
        });
        map.entry(n).or_default().push(Target {
            element: top,
            data_type,
        });
    }
    map
}

/// Where the IG's data type is wrong for R4, and the converter writes R4's: (segment, field, element, why).
const IG_TYPE_ERRATA: &[(&str, usize, &str, &str)] = &[(
    "AIS",
    10,
    "status",
    "the IG gives CodeableConcept; R4's Appointment.status is a code (as SCH-25's row says)",
)];

/// Whether a JSON value has the shape of a FHIR data type (the types the maps name; `None` for a type this
/// test does not know, which passes).
fn has_shape(data_type: &str, v: &Json) -> Option<bool> {
    let s = v.as_str();
    let obj = |keys: &[&str]| v.is_object() && keys.iter().any(|k| v.get(k).is_some());
    let date = |t: &str| {
        let b = t.as_bytes();
        matches!(b.len(), 4 | 7 | 10)
            && b.iter().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            })
    };
    let date_time = |t: &str| {
        date(t.get(..10.min(t.len())).unwrap_or(t))
            && (t.len() <= 10
                || (t.as_bytes()[10] == b'T'
                    && (t.ends_with('Z') || t[19..].contains(['+', '-']))
                    && t.len() >= 20))
    };
    Some(match data_type {
        "Identifier" | "identifier" => obj(&["value", "system"]),
        "HumanName" => obj(&["family", "given", "text"]),
        "Address" => obj(&[
            "line",
            "city",
            "state",
            "postalCode",
            "country",
            "text",
            "district",
        ]),
        "ContactPoint" => obj(&["value"]),
        "CodeableConcept" => obj(&["coding", "text"]),
        "Coding" => obj(&["code", "system"]),
        "Reference" => obj(&["reference", "display", "identifier"]),
        "Period" => obj(&["start", "end"]),
        "Quantity" | "SimpleQuantity" | "quantity" => obj(&["value"]),
        "Range" => obj(&["low", "high"]),
        "Annotation" => obj(&["text"]),
        "Attachment" => obj(&["data", "url", "contentType"]),
        "code" => s.is_some_and(|t| !t.is_empty() && t.split(' ').all(|w| !w.is_empty())),
        "string" | "markdown" | "uri" | "url" => s.is_some_and(|t| !t.is_empty()),
        "date" => s.is_some_and(date),
        "dateTime" | "DateTime" => s.is_some_and(date_time),
        "instant" => s.is_some_and(|t| t.len() >= 20 && date_time(t)),
        "time" => s.is_some_and(|t| t.len() >= 8 && t.as_bytes()[2] == b':'),
        "boolean" => v.is_boolean(),
        "decimal" => v.is_number(),
        "positiveInt" | "unsignedInt" | "integer" => v.is_u64() || v.is_i64(),
        _ => return None,
    })
}

/// The items of an element (an array's, or the one value).
fn items(v: &Json) -> Vec<&Json> {
    match v.as_array() {
        Some(a) => a.iter().collect(),
        None => vec![v],
    }
}

/// Whether the element carries the field's value, for the types whose value can be read back (`None`: not
/// compared): an identifier's CX-1, a name's XPN-1 (family), a date's or dateTime's digits, a string's text.
/// Values with escape sequences are not compared.
fn carries_value(data_type: &str, v: &Json, field: &hl7v2::message::Value<'_>) -> Option<bool> {
    let text = |x: Option<hl7v2::message::Value<'_>>| -> Option<String> {
        let raw = x?.raw();
        (!raw.is_empty() && !raw.contains(&b'\\'))
            .then(|| String::from_utf8_lossy(raw).trim().to_owned())
    };
    let reps: Vec<_> = (1..=field.repetitions().count())
        .filter_map(|i| field.repetition(i))
        .collect();
    let first = |n: usize| -> Vec<String> {
        reps.iter()
            .filter_map(|r| text(r.component(n).and_then(|c| c.subcomponent(1))))
            .filter(|t| !t.is_empty())
            .collect()
    };
    let all = items(v);
    match data_type {
        "Identifier" | "identifier" => {
            let want = first(1);
            // An identifier that is itself a URI (an OID or UUID with no authority) is written as one.
            let is = |got: Option<&str>, w: &str| {
                got.is_some_and(|g| {
                    g == w || g == format!("urn:oid:{w}") || g == format!("urn:uuid:{w}")
                })
            };
            (!want.is_empty()).then(|| {
                want.iter()
                    .any(|w| all.iter().any(|i| is(i["value"].as_str(), w)))
            })
        }
        "HumanName" => {
            let want = first(1);
            (!want.is_empty()).then(|| {
                want.iter()
                    .any(|w| all.iter().any(|n| n["family"].as_str() == Some(w.as_str())))
            })
        }
        "date" | "dateTime" | "DateTime" => {
            let want: String = text(reps.first().copied())?
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .take(8)
                .collect();
            let got: String = all
                .first()?
                .as_str()?
                .chars()
                .filter(char::is_ascii_digit)
                .take(want.len())
                .collect();
            (want.len() >= 4).then(|| got == want)
        }
        "string" => {
            let want = text(reps.first().copied())?;
            (!want.contains(['^', '&', '~']))
                .then(|| all.iter().any(|s| s.as_str() == Some(want.as_str())))
        }
        _ => None,
    }
}

/// A small CSV reader (quoted fields with commas, doubled quotes and line breaks).
fn csv_rows(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, '\r') => {}
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

fn messages() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        (
            "sample-adt_a01".to_owned(),
            include_bytes!("data/adt_a01.hl7").to_vec(),
        ),
        (
            "sample-vxu_v04".to_owned(),
            include_bytes!("data/vxu_v04.hl7").to_vec(),
        ),
        (
            "sample-mdm_t02".to_owned(),
            include_bytes!("data/mdm_t02.hl7").to_vec(),
        ),
        (
            "sample-siu_s12".to_owned(),
            include_bytes!("data/siu_s12.hl7").to_vec(),
        ),
    ];
    out.extend(
        hl7_files(&corpus_dir(), "")
            .into_iter()
            .filter(|(_, bytes)| Message::parse(bytes).is_ok_and(|m| supports(&m))),
    );
    out
}

/// A segment, the resource its map fills, and the map.
type SegmentMap = (&'static str, &'static str, BTreeMap<usize, Vec<Target>>);

#[test]
fn every_valued_field_is_where_the_ig_says_or_reported() {
    let mut maps: Vec<SegmentMap> = Vec::new();
    for (name, rtype) in MAPS {
        let (seg, map) = (&name[..3], segment_map(name));
        match maps.iter_mut().find(|(s, r, _)| s == &seg && r == rtype) {
            Some((_, _, m)) => {
                for (n, elements) in map {
                    m.entry(n).or_default().extend(elements);
                }
            }
            None => maps.push((seg, rtype, map)),
        }
    }
    let mut failures = Vec::new();
    let mut checked = 0usize;
    let typed_checked = std::cell::Cell::new(0usize);
    for (name, bytes) in messages() {
        let msg = Message::parse(&bytes).expect("parse");
        let charset = Charset::from_msh18(msg.header().charset).unwrap_or(Charset::Utf8);
        // An Appointment's start and end are instants: SIU routes give the offset of times without one.
        let opts = Options {
            bundle_type: BundleType::Message,
            timezone: (msg.header().message_type == b"SIU")
                .then(|| TimeZone::parse("+01:00").expect("offset")),
            // A few corpus senders name no authority anywhere (no CX-4/6, no MSH-4): this test checks the maps,
            // not identity scoping (tests.rs does), so their identifiers go to the global namespace.
            unscoped_identifiers_global: true,
            ..Options::default()
        };
        let mut out = Vec::new();
        let outcome = convert(&msg, charset, &opts, &mut out).expect("convert");
        let bundle: Json = serde_json::from_slice(&out).expect("json");
        for (seg, rtype, map) in &maps {
            // The first segment of this kind and the first resource of the type: the maps write one
            // resource per segment, in message order.
            let Some(segment) = msg.segment(seg, 1) else {
                continue;
            };
            let resource = bundle["entry"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| &e["resource"])
                .find(|r| r["resourceType"] == *rtype);
            let Some(resource) = resource else {
                // Only the patient is made whatever the message (an ORM's OBR makes no DiagnosticReport).
                if *rtype == "Patient" {
                    failures.push(format!("{name}: {seg} present, no {rtype}"));
                }
                continue;
            };
            for (&n, elements) in map {
                let valued = segment.field(n).is_some_and(|f| {
                    let raw = f.raw();
                    !raw.is_empty() && raw != b"\"\""
                });
                if !valued {
                    continue;
                }
                checked += 1;
                let id = format!("{seg}-{n}");
                let reported = outcome.unmapped.contains(&id);
                let placed: Vec<&Target> = elements
                    .iter()
                    .filter(|t| resource.get(&t.element).is_some())
                    .collect();
                if placed.is_empty() {
                    if !reported {
                        let names: Vec<&str> =
                            elements.iter().map(|t| t.element.as_str()).collect();
                        failures.push(format!(
                            "{name}: {id} is valued; the IG maps it to {rtype}.{} but it is neither there nor reported",
                            names.join(" or ")
                        ));
                    }
                    continue;
                }
                // The element's type and, where it can be read back, the field's value: one of the IG's rows
                // for the field must fit (a field the map could not write whole is reported).
                let typed: Vec<(&Target, &str)> = placed
                    .iter()
                    .filter(|t| {
                        !IG_TYPE_ERRATA
                            .iter()
                            .any(|(s, f, e, _)| s == seg && *f == n && *e == t.element)
                    })
                    .filter_map(|t| t.data_type.as_deref().map(|d| (*t, d)))
                    .collect();
                if typed.is_empty() || reported {
                    continue;
                }
                let field = segment.field(n).expect("valued");
                let mut shape_known = false;
                let fits = typed.iter().any(|(t, d)| {
                    let v = &resource[&t.element];
                    let shape = items(v).iter().map(|i| has_shape(d, i)).collect::<Vec<_>>();
                    if shape.iter().any(Option::is_none) {
                        return true;
                    }
                    shape_known = true;
                    if !shape.iter().all(|s| *s == Some(true)) {
                        return false;
                    }
                    if carries_value(d, v, &field) == Some(false) {
                        return false;
                    }
                    typed_checked.set(typed_checked.get() + 1);
                    true
                });
                if shape_known && !fits {
                    let rows: Vec<String> = typed
                        .iter()
                        .map(|(t, d)| format!("{}: {d} = {}", t.element, resource[&t.element]))
                        .collect();
                    failures.push(format!(
                        "{name}: {id} is not what the IG says: {}",
                        rows.join("; ")
                    ));
                }
            }
        }
    }
    println!(
        "{checked} valued fields checked against the IG's segment maps, {} of them by type and value",
        typed_checked.get()
    );
    assert!(checked > 100, "too few fields checked: {checked}");
    assert!(
        typed_checked.get() > 1000,
        "too few fields checked by type: {}",
        typed_checked.get()
    );
    assert!(
        failures.is_empty(),
        "{} fields not where the IG says:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
