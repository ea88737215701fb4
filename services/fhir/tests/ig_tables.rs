//! The converter against the IG's own segment maps (`ig/segments/*.csv`): for every message of a supported
//! type (our sample and the corpus's), every valued field that the IG maps (unconditionally) into a resource
//! must appear in that resource at one of the elements the IG names for it, or be reported as unmapped. A field
//! can be neither dropped silently nor put somewhere the IG does not say.

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

/// One map: v2 field number → the top-level elements the IG sends it to (in any of its rows: a row's condition
/// picks among them, e.g. OBX-5's element by OBX-2).
fn segment_map(name: &str) -> BTreeMap<usize, Vec<String>> {
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
    let mut map: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for row in csv_rows(&text).into_iter().skip(2) {
        let col = |n: usize| row.get(n).map(|s| s.trim()).unwrap_or("");
        let (field, attribute) = (col(1), col(9));
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
        if !top.is_empty() {
            map.entry(n).or_default().push(top);
        }
    }
    map
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
type SegmentMap = (&'static str, &'static str, BTreeMap<usize, Vec<String>>);

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
                let placed = elements.iter().any(|e| resource.get(e).is_some());
                if !placed && !outcome.unmapped.contains(&id) {
                    failures.push(format!(
                        "{name}: {id} is valued; the IG maps it to {rtype}.{} but it is neither there nor reported",
                        elements.join(" or ")
                    ));
                }
            }
        }
    }
    println!("{checked} valued fields checked against the IG's segment maps");
    assert!(checked > 100, "too few fields checked: {checked}");
    assert!(
        failures.is_empty(),
        "{} fields not where the IG says:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
