//! What the Bundles do to a FHIR server's record (HAPI FHIR's RestfulServer, validating every write; the
//! harness in services/egress/tests/fhir, built by `make test` before `cargo test`): a thin message never
//! replaces richer data, two senders' identical unqualified MRNs are two people, a closed visit stays closed,
//! local times carry the offset of their own date, and a route that only references patients writes none.

use hl7gw_fhir::{Options, TimeZone, Write, convert};
use hl7gw_testkit::fhir::FhirServer;
use hl7v2::{Charset, Message};
use serde_json::Value;

/// Converts `hl7` (segments separated by `\n` here, `\r` on the wire) and POSTs the transaction Bundle:
/// (status, response).
fn deliver(server: &FhirServer, hl7: &str, opts: &Options) -> (u16, Value) {
    let wire = hl7.trim().replace('\n', "\r");
    let msg = Message::parse(wire.as_bytes()).expect("parse");
    let mut out = Vec::new();
    convert(&msg, Charset::Utf8, opts, &mut out).expect("convert");
    server.send("POST", "/fhir", &out)
}

fn delivered(server: &FhirServer, hl7: &str, opts: &Options) {
    let (status, body) = deliver(server, hl7, opts);
    assert_eq!(status, 200, "{body}");
}

/// The resources a search finds.
fn search(server: &FhirServer, query: &str) -> Vec<Value> {
    let (status, bundle) = server.call("GET", &format!("/fhir/{query}"));
    assert_eq!(status, 200, "{query}: {bundle}");
    bundle["entry"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["resource"].clone())
        .collect()
}

fn one(server: &FhirServer, query: &str) -> Value {
    let mut found = search(server, query);
    assert_eq!(found.len(), 1, "{query}: {found:?}");
    found.remove(0)
}

const A01_FULL: &str = "
MSH|^~\\&|ADT|HOSP_A|HL7GW|HL7GW|20260115103000||ADT^A01^ADT_A01|A01-1|P|2.5.1
EVN|A01|20260115103000
PID|1||MRN100^^^HOSP_A^MR||OKAFOR^JAMES||19600312|M|||12 HIGH ST^^SPRINGFIELD^IL^62701||^PRN^PH^^^217^5550100|||M
NK1|1|OKAFOR^ADA|SPO^Spouse^HL70063
PV1|1|I|WARD1^101^A||||1234^SMITH^JOHN^^^^^^HOSP_A|||MED|||||||||V100^^^HOSP_A^VN|||||||||||||||||||||||||20260115100000
";

const ORU_THIN: &str = "
MSH|^~\\&|LAB|HOSP_A|HL7GW|HL7GW|20260116090000||ORU^R01^ORU_R01|ORU-1|P|2.5.1
PID|1||MRN100^^^HOSP_A^MR||OKAFOR^J
PV1|1|I|||||||||||||||||V100^^^HOSP_A^VN
OBR|1|PL1|FL1^LAB|2345-7^Glucose^LN|||20260116080000
OBX|1|NM|2345-7^Glucose^LN||95|mg/dL|70-99|N|||F|||20260116080000
";

#[test]
fn the_record_is_never_made_worse() {
    let server = FhirServer::start(0, &[]);
    let opts = Options::default();

    // An ADT with full demographics, then a lab result whose PID has only the MRN and a shorter name: the
    // Patient keeps its address, phone and name; the ORU's Bundle references it.
    delivered(&server, A01_FULL, &opts);
    delivered(&server, ORU_THIN, &opts);
    let patient = one(&server, "Patient?identifier=urn:hl7gw:id:HOSP_A%7CMRN100");
    assert_eq!(patient["address"][0]["city"], "SPRINGFIELD", "{patient}");
    assert_eq!(patient["telecom"][0]["value"], "217 5550100", "{patient}");
    assert_eq!(patient["name"][0]["given"][0], "JAMES", "{patient}");
    assert_eq!(
        patient["maritalStatus"]["coding"][0]["code"], "M",
        "{patient}"
    );
    let obs = one(&server, "Observation?code=http://loinc.org%7C2345-7");
    let subject = obs["subject"]["reference"].as_str().expect("subject");
    assert_eq!(
        subject,
        format!("Patient/{}", patient["id"].as_str().expect("id"))
    );

    // A discharge, then a result for that visit whose PV1 has no discharge time: the Encounter stays
    // finished.
    let a03 = A01_FULL
        .replace("ADT^A01^ADT_A01|A01-1", "ADT^A03^ADT_A03|A03-1")
        .replace("EVN|A01|", "EVN|A03|")
        .replace("|20260115100000\n", "|20260115100000|20260118120000\n");
    delivered(&server, &a03, &opts);
    let visit = one(&server, "Encounter?identifier=urn:hl7gw:id:HOSP_A%7CV100");
    assert_eq!(visit["status"], "finished", "{visit}");
    delivered(
        &server,
        &ORU_THIN
            .replace("ORU-1", "ORU-2")
            .replace("FL1^LAB|2345-7^Glucose", "FL2^LAB|2951-2^Sodium")
            .replace(
                "2345-7^Glucose^LN||95|mg/dL|70-99",
                "2951-2^Sodium^LN||140|mmol/L|135-145",
            ),
        &opts,
    );
    let visit = one(&server, "Encounter?identifier=urn:hl7gw:id:HOSP_A%7CV100");
    assert_eq!(visit["status"], "finished", "{visit}");
    assert_eq!(
        visit["period"]["end"].as_str().map(|e| &e[..10]),
        Some("2026-01-18")
    );

    // The owner updates: an A08 with a new address replaces the old one.
    let a08 = A01_FULL
        .replace("ADT^A01^ADT_A01|A01-1", "ADT^A08^ADT_A01|A08-1")
        .replace("EVN|A01|", "EVN|A08|")
        .replace("12 HIGH ST^^SPRINGFIELD", "4 MILL RD^^DECATUR");
    delivered(&server, &a08, &opts);
    let patient = one(&server, "Patient?identifier=urn:hl7gw:id:HOSP_A%7CMRN100");
    assert_eq!(patient["address"][0]["city"], "DECATUR", "{patient}");
    let counts = server.counts();
    assert_eq!(counts["Patient"], 1, "{counts:?}");
    assert_eq!(counts["Encounter"], 1, "{counts:?}");
}

#[test]
fn two_senders_same_unqualified_mrn_are_two_people() {
    let server = FhirServer::start(0, &[]);
    let opts = Options::default();
    let a04 = |facility: &str, control: &str, name: &str, sex: &str, birth: &str| {
        format!(
            "MSH|^~\\&|REG|{facility}|HL7GW|HL7GW|20260201080000||ADT^A04^ADT_A01|{control}|P|2.5.1\n\
             EVN|A04|20260201080000\n\
             PID|1||55555||{name}||{birth}|{sex}\n\
             PV1|1|O\n"
        )
    };
    delivered(
        &server,
        &a04("CLINIC_1", "C1-1", "OKAFOR^JAMES", "M", "19600312"),
        &opts,
    );
    delivered(
        &server,
        &a04("CLINIC_2", "C2-1", "LINDQVIST^MARTA", "F", "19920704"),
        &opts,
    );
    let james = one(&server, "Patient?identifier=urn:hl7gw:id:CLINIC_1%7C55555");
    let marta = one(&server, "Patient?identifier=urn:hl7gw:id:CLINIC_2%7C55555");
    assert_eq!(james["name"][0]["family"], "OKAFOR");
    assert_eq!(james["birthDate"], "1960-03-12");
    assert_eq!(marta["name"][0]["family"], "LINDQVIST");
    assert_eq!(marta["gender"], "female");
    assert_eq!(server.counts()["Patient"], 2);
}

#[test]
fn local_times_carry_the_offset_of_their_date() {
    let server = FhirServer::start(0, &[]);
    let opts = Options {
        timezone: Some(TimeZone::parse("America/New_York").expect("a zone")),
        ..Options::default()
    };
    for (visit, admitted) in [
        ("V-WINTER", "20260115103000"),
        ("V-SUMMER", "20260715103000"),
    ] {
        let a01 = A01_FULL
            .replace("A01-1", visit)
            .replace("V100^", &format!("{visit}^"))
            .replace("|20260115100000\n", &format!("|{admitted}\n"));
        delivered(&server, &a01, &opts);
    }
    let start = |visit: &str| -> String {
        let e = one(
            &server,
            &format!("Encounter?identifier=urn:hl7gw:id:HOSP_A%7C{visit}"),
        );
        e["period"]["start"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(start("V-WINTER"), "2026-01-15T10:30:00-05:00");
    assert_eq!(start("V-SUMMER"), "2026-07-15T10:30:00-04:00");
}

#[test]
fn a_route_that_only_references_patients_writes_none() {
    let server = FhirServer::start(0, &[]);
    let reference = Options {
        write: [("Patient".to_owned(), Write::Reference)].into(),
        ..Options::default()
    };
    // No such patient yet: the server refuses the Bundle (the egress dead-letters it, `rejected`).
    let (status, body) = deliver(&server, ORU_THIN, &reference);
    assert!(
        (400..500).contains(&status),
        "a result for an unknown patient: {status} {body}"
    );
    assert_eq!(server.counts()["Patient"], 0);
    delivered(&server, A01_FULL, &Options::default());
    delivered(&server, ORU_THIN, &reference);
    let patient = one(&server, "Patient?identifier=urn:hl7gw:id:HOSP_A%7CMRN100");
    let obs = one(&server, "Observation?code=http://loinc.org%7C2345-7");
    assert_eq!(
        obs["subject"]["reference"].as_str(),
        Some(format!("Patient/{}", patient["id"].as_str().expect("id")).as_str())
    );
    assert_eq!(patient["name"][0]["given"][0], "JAMES");
}

#[test]
fn a_merge_retires_the_old_record_and_links_it_to_the_survivor() {
    let server = FhirServer::start(0, &[]);
    let opts = Options::default();
    // Two records of one person: the survivor MRN100 and a duplicate MRN200 registered elsewhere.
    delivered(&server, A01_FULL, &opts);
    let duplicate = A01_FULL
        .replace("A01-1", "A01-2")
        .replace("MRN100^", "MRN200^")
        .replace("V100^", "V200^");
    delivered(&server, &duplicate, &opts);
    let a40 = "
MSH|^~\\&|ADT|HOSP_A|HL7GW|HL7GW|20260120090000||ADT^A40^ADT_A39|A40-1|P|2.5.1
EVN|A40|20260120090000
PID|1||MRN100^^^HOSP_A^MR||OKAFOR^JAMES
MRG|MRN200^^^HOSP_A^MR||||||OKAFOR^JAMES
";
    delivered(&server, a40, &opts);
    let survivor = one(&server, "Patient?identifier=urn:hl7gw:id:HOSP_A%7CMRN100");
    let retired = one(&server, "Patient?identifier=urn:hl7gw:id:HOSP_A%7CMRN200");
    assert_eq!(retired["active"], false, "{retired}");
    assert_eq!(retired["link"][0]["type"], "replaced-by", "{retired}");
    assert_eq!(
        retired["link"][0]["other"]["reference"].as_str(),
        Some(format!("Patient/{}", survivor["id"].as_str().expect("id")).as_str())
    );
    // The survivor is left as its owner wrote it (a merge message does not own its demographics).
    assert_eq!(survivor["address"][0]["city"], "SPRINGFIELD", "{survivor}");
    assert!(survivor["active"].is_null(), "{survivor}");
    // Delivered again, nothing changes.
    delivered(&server, a40, &opts);
    assert_eq!(server.counts()["Patient"], 2);
}

#[test]
fn a_swap_moves_two_patients_to_each_others_beds() {
    let server = FhirServer::start(0, &[]);
    let opts = Options::default();
    let a17 = "
MSH|^~\\&|ADT|HOSP_A|HL7GW|HL7GW|20260201080000||ADT^A17^ADT_A17|S1|P|2.5.1
EVN|A17|20260201080000
PID|1||MRN1^^^HOSP_A^MR||ONE^ANN
PV1|1|I|W5^201^A^HOSP_A||||||||||||||||V1^^^HOSP_A^VN
PID|2||MRN2^^^HOSP_A^MR||TWO^BEN
PV1|1|I|W5^202^B^HOSP_A||||||||||||||||V2^^^HOSP_A^VN
";
    delivered(&server, a17, &opts);
    let counts = server.counts();
    assert_eq!(
        (counts["Patient"], counts["Encounter"]),
        (2, 2),
        "{counts:?}"
    );
    let visit = one(&server, "Encounter?identifier=urn:hl7gw:id:HOSP_A%7CV2");
    assert_eq!(visit["location"][0]["status"], "active", "{visit}");
    // Delivered again, nothing is added.
    delivered(&server, a17, &opts);
    assert_eq!(server.counts()["Location"], counts["Location"]);
}
