//! The converter's output does not change unnoticed: every corpus message of a supported type
//! (`../shared/testdata/hl7`) and our samples (`tests/data/*.hl7`), converted with three sets of options,
//! hash to what `tests/data/golden.tsv` recorded. Made for speed work, which must not change a byte.
//!
//! Regenerate (after a deliberate change of output): `HL7GW_UPDATE_FHIR_GOLDEN=1 cargo test -p hl7gw-fhir
//! --test golden`. Messages whose name is not in the file (types mapped after it was written) are skipped.

use hl7gw_fhir::{BundleType, Options, TimeZone, Unmapped, convert, supports};
use hl7gw_testkit::{corpus_dir, hl7_files};
use hl7v2::{Charset, Message};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The option sets each message is converted with: both Bundle types, and a route with a time zone, its own
/// identifier and code systems and unmapped values kept.
fn option_sets() -> Vec<(&'static str, Options)> {
    vec![
        ("transaction", Options::default()),
        (
            "message",
            Options {
                bundle_type: BundleType::Message,
                unmapped: Unmapped::Extension,
                received_at: Some("2026-11-27T10:00:00Z".into()),
                ..Options::default()
            },
        ),
        (
            "configured",
            Options {
                bundle_type: BundleType::Transaction,
                unmapped: Unmapped::Extension,
                timezone: Some(TimeZone::parse("+01:00").expect("offset")),
                identifier_systems: [(
                    "HOSP".to_owned(),
                    "https://hospital.example/mrn".to_owned(),
                )]
                .into(),
                identifier_system_prefix: Some("urn:example:".into()),
                code_systems: [("L".to_owned(), "https://lab.example/codes".to_owned())].into(),
                received_at: Some("2026-11-27T10:00:00+01:00".into()),
                ..Options::default()
            },
        ),
    ]
}

/// `<name>\t<options>` → the first 16 bytes of the SHA-256 of the Bundle (or of the error), in hex.
fn compute() -> BTreeMap<String, String> {
    let mut messages = hl7_files(&data_dir(), "sample-");
    messages.extend(hl7_files(&corpus_dir(), ""));
    let mut out = BTreeMap::new();
    for (name, bytes) in messages {
        let Ok(msg) = Message::parse(&bytes) else {
            continue;
        };
        if !supports(&msg) {
            continue;
        }
        let charset = Charset::from_msh18(msg.header().charset).unwrap_or(Charset::Utf8);
        for (label, opts) in option_sets() {
            let mut bundle = Vec::new();
            let hashed = match convert(&msg, charset, &opts, &mut bundle) {
                Ok(outcome) => {
                    bundle.extend_from_slice(format!("\n{outcome:?}").as_bytes());
                    bundle
                }
                Err(e) => format!("error: {e}").into_bytes(),
            };
            let digest = Sha256::digest(&hashed);
            let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
            out.insert(format!("{name}\t{label}"), hex);
        }
    }
    out
}

#[test]
fn bundles_are_unchanged() {
    let path = data_dir().join("golden.tsv");
    let now = compute();
    if std::env::var_os("HL7GW_UPDATE_FHIR_GOLDEN").is_some() {
        let mut text = String::from(
            "# hl7gw-fhir's output per message and option set (tests/golden.rs); regenerate with HL7GW_UPDATE_FHIR_GOLDEN=1\n",
        );
        for (k, v) in &now {
            text.push_str(&format!("{k}\t{v}\n"));
        }
        std::fs::write(&path, text).expect("write golden.tsv");
        println!("{} hashes written to {}", now.len(), path.display());
        return;
    }
    let text = std::fs::read_to_string(&path).expect("tests/data/golden.tsv");
    let mut expected = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut parts = line.rsplitn(2, '\t');
        let (Some(hash), Some(key)) = (parts.next(), parts.next()) else {
            panic!("bad line in golden.tsv: {line}");
        };
        expected.insert(key.to_owned(), hash.to_owned());
    }
    let mut changed = Vec::new();
    let mut compared = 0;
    for (key, hash) in &now {
        // A message of a type mapped after the file was written is not in it.
        let Some(want) = expected.get(key) else {
            continue;
        };
        compared += 1;
        if want != hash {
            changed.push(key.replace('\t', " as "));
        }
    }
    let missing: Vec<&String> = expected.keys().filter(|k| !now.contains_key(*k)).collect();
    println!(
        "{compared} Bundles compared, {} changed, {} not found",
        changed.len(),
        missing.len()
    );
    assert!(
        missing.is_empty() || !corpus_dir().is_dir(),
        "messages in golden.tsv no longer converted: {missing:?}"
    );
    assert!(changed.is_empty(), "output changed for: {changed:?}");
    // Without the corpus only the samples would be compared, and the speed work it guards could change the rest.
    assert!(
        compared > 500,
        "only {compared} Bundles compared: is the corpus at {} missing?",
        corpus_dir().display()
    );
}
