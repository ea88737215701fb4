//! Every Bundle the converter makes of the corpus's supported messages (`../shared/testdata/hl7`, and a sample
//! of our own) passes HAPI FHIR's R4 validator (8.8.1, offline) with no error, as a transaction and as a
//! message Bundle. Prints the warnings by kind (docs/fhir.md counts them).

use hl7gw_fhir::{BundleType, Options, TimeZone, Unmapped, convert, supports};
use hl7gw_testkit::{corpus_dir, hl7_files};
use hl7v2::{Charset, Message};
use std::collections::BTreeMap;

/// Our own samples: every segment the ADT map covers, with values in every mapped field kind; an ORU_R01 with
/// every OBX value type, notes, specimens and the NDL fields.
const SAMPLE: &[u8] = include_bytes!("data/adt_a01.hl7");
const SAMPLE_ORU: &[u8] = include_bytes!("data/oru_r01.hl7");
/// A VXU_V04 with every RXA/RXR/ORC field the Immunization map writes, a refusal, and OBX in and out of the
/// order group.
const SAMPLE_VXU: &[u8] = include_bytes!("data/vxu_v04.hl7");
/// An MDM_T02 whose document is text lines (TX, FT), a note, a PDF (ED, base64) and a reference pointer (RP).
const SAMPLE_MDM: &[u8] = include_bytes!("data/mdm_t02.hl7");
/// An SIU_S12 with every SCH field the Appointment map writes, comments, and one AIS, AIG, AIL and AIP.
const SAMPLE_SIU: &[u8] = include_bytes!("data/siu_s12.hl7");

/// The messages to convert: (name, bytes) of the corpus's files of a supported type, and the samples.
fn messages() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("sample-adt_a01".to_owned(), SAMPLE.to_vec()),
        ("sample-oru_r01".to_owned(), SAMPLE_ORU.to_vec()),
        ("sample-vxu_v04".to_owned(), SAMPLE_VXU.to_vec()),
        ("sample-mdm_t02".to_owned(), SAMPLE_MDM.to_vec()),
        ("sample-siu_s12".to_owned(), SAMPLE_SIU.to_vec()),
    ];
    out.extend(
        hl7_files(&corpus_dir(), "")
            .into_iter()
            .filter(|(_, bytes)| Message::parse(bytes).is_ok_and(|m| supports(&m))),
    );
    out
}

#[test]
fn every_bundle_passes_hapis_r4_validator() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut written = 0;
    for (name, bytes) in messages() {
        let msg = Message::parse(&bytes).expect("parse");
        let charset = Charset::from_msh18(msg.header().charset).unwrap_or(Charset::Utf8);
        // An Appointment's start and end are instants: SIU routes give the offset of times without one.
        let timezone = (msg.header().message_type == b"SIU")
            .then(|| TimeZone::parse("+01:00").expect("offset"));
        for (suffix, opts) in [
            (
                "transaction",
                Options {
                    timezone: timezone.clone(),
                    // A few corpus senders name no authority anywhere (no CX-4/6, no MSH-4): this test
                    // checks the Bundles, not identity scoping (tests.rs does).
                    unscoped_identifiers_global: true,
                    ..Options::default()
                },
            ),
            (
                "message",
                Options {
                    bundle_type: BundleType::Message,
                    unmapped: Unmapped::Extension,
                    received_at: Some("2026-11-27T10:00:00Z".into()),
                    timezone: timezone.clone(),
                    unscoped_identifiers_global: true,
                    ..Options::default()
                },
            ),
        ] {
            let mut out = Vec::new();
            convert(&msg, charset, &opts, &mut out).unwrap_or_else(|e| panic!("{name}: {e}"));
            std::fs::write(dir.path().join(format!("{name}.{suffix}.json")), &out).expect("write");
            written += 1;
        }
    }
    // The corpus's messages of mapped types give ~350 Bundles; without the corpus only the samples' 10 would pass.
    assert!(
        written > 300,
        "only {written} Bundles: is the corpus at {} missing?",
        corpus_dir().display()
    );
    let results = hl7gw_testkit::fhir::validate_dir(dir.path());
    assert_eq!(results.len(), written, "one result per Bundle");
    let mut errors = Vec::new();
    let mut warnings: BTreeMap<String, usize> = BTreeMap::new();
    let mut total_warnings = 0;
    for r in &results {
        for m in &r.messages {
            match m.severity.as_str() {
                "error" | "fatal" => {
                    errors.push(format!("{}: {} at {}", r.file, m.message, m.location))
                }
                "warning" => {
                    total_warnings += 1;
                    // The kind of warning: its text with quoted values cut away.
                    let kind: String = m
                        .message
                        .split('\'')
                        .step_by(2)
                        .collect::<Vec<_>>()
                        .join("'…'");
                    *warnings.entry(kind).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    println!(
        "{written} Bundles validated: {} errors, {total_warnings} warnings",
        errors.len()
    );
    for (kind, n) in &warnings {
        println!("  {n:5}  {kind}");
    }
    assert!(
        errors.is_empty(),
        "{} validation errors:\n{}",
        errors.len(),
        errors.join("\n")
    );
}
