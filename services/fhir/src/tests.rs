use super::*;
use serde_json::Value as Json;

const ADT_A01: &[u8] = b"MSH|^~\\&|EPIC|MAIN^2.16.840.1.113883.19.1^ISO|LAB|LABFAC|20240102030405+0100||ADT^A01^ADT_A01|MSG00001|P|2.5.1\r\
EVN|A01|20240102030405+0100||ADM\r\
PID|1||12345^^^HOSP^MR~999-99-9999^^^SSA^SS||DOE^JANE^Q^^DR||19800214|F|||1 MAIN ST^APT 2^SPRINGFIELD^IL^62701^USA^H||^PRN^PH^^1^217^5551234|^WPN^PH^^1^217^5559876|ENG|M\r\
NK1|1|DOE^JOHN|SPO^Spouse^HL70063|1 MAIN ST^^SPRINGFIELD^IL^62701|^PRN^PH^^1^217^5551234\r\
PV1|1|I|W3^301^A^MAIN||||1234^SMITH^ANNA^^^DR^^^HOSP|||MED||||7|||1234^SMITH^ANNA^^^DR^^^HOSP||V100^^^HOSP^VN|||||||||||||||||||||||||20240102030000+0100\r\
OBX|1|NM|29463-7^Body weight^LN||72.5|kg^kilogram^UCUM|||||F|||20240102030000+0100\r\
AL1|1|DA|70618^Penicillin^RXNORM|SV|Hives~Rash|20100101\r\
DG1|1||I10^Essential hypertension^I10||20240101\r\
IN1|1|PLAN1^Gold plan|INS1^^^PAYERS|ACME INSURANCE|||||||||20240101|20241231\r\
ZPI|1|custom|value\r";

fn convert_json(msg: &[u8], opts: &Options) -> (Json, Outcome) {
    let m = hl7v2::Message::parse(msg).expect("parse");
    let mut out = Vec::new();
    let outcome = convert(&m, Charset::Utf8, opts, &mut out).expect("convert");
    let json: Json = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));
    (json, outcome)
}

fn resources<'j>(b: &'j Json, ty: &str) -> Vec<&'j Json> {
    b["entry"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| &e["resource"])
        .filter(|r| r["resourceType"] == ty)
        .collect()
}

#[test]
fn an_adt_a01_becomes_a_transaction_of_its_resources() {
    let (b, outcome) = convert_json(ADT_A01, &Options::default());
    assert_eq!(b["resourceType"], "Bundle");
    assert_eq!(b["type"], "transaction");
    assert_eq!(b["timestamp"], "2024-01-02T03:04:05+01:00");
    let patient = resources(&b, "Patient")[0];
    assert_eq!(patient["identifier"][0]["value"], "12345");
    assert_eq!(patient["identifier"][0]["system"], "urn:hl7gw:id:HOSP");
    assert_eq!(patient["identifier"][0]["type"]["coding"][0]["code"], "MR");
    assert_eq!(patient["name"][0]["family"], "DOE");
    assert_eq!(patient["name"][0]["given"][0], "JANE");
    assert_eq!(patient["name"][0]["prefix"][0], "DR");
    assert_eq!(patient["gender"], "female");
    assert_eq!(patient["birthDate"], "1980-02-14");
    assert_eq!(patient["address"][0]["line"][1], "APT 2");
    assert_eq!(patient["address"][0]["postalCode"], "62701");
    assert_eq!(patient["telecom"][0]["use"], "home");
    assert_eq!(patient["telecom"][1]["use"], "work");
    let enc = resources(&b, "Encounter")[0];
    assert_eq!(enc["identifier"][0]["value"], "V100");
    assert_eq!(enc["class"]["code"], "IMP");
    assert_eq!(enc["status"], "in-progress");
    assert_eq!(
        enc["participant"][0]["type"][0]["coding"][0]["code"],
        "ATND"
    );
    assert_eq!(enc["location"][0]["location"]["display"], "W3 301 A MAIN");
    assert_eq!(enc["period"]["start"], "2024-01-02T03:00:00+01:00");
    // One Practitioner, though PV1-7 and PV1-17 both name her.
    assert_eq!(resources(&b, "Practitioner").len(), 1);
    let obs = resources(&b, "Observation")[0];
    assert_eq!(obs["valueQuantity"]["value"], 72.5);
    assert_eq!(obs["valueQuantity"]["system"], "http://unitsofmeasure.org");
    assert_eq!(obs["code"]["coding"][0]["system"], "http://loinc.org");
    assert_eq!(obs["status"], "final");
    let allergy = resources(&b, "AllergyIntolerance")[0];
    assert_eq!(allergy["criticality"], "high");
    assert_eq!(allergy["reaction"][0]["manifestation"][1]["text"], "Rash");
    assert_eq!(resources(&b, "Condition")[0]["onsetDateTime"], "2024-01-01");
    assert_eq!(
        resources(&b, "Coverage")[0]["payor"][0]["display"],
        "ACME INSURANCE"
    );
    // The IG's translation first, then the v2 code in its table's system.
    let rel = &resources(&b, "RelatedPerson")[0]["relationship"][0]["coding"];
    assert_eq!(rel[0]["code"], "SPS");
    assert_eq!(
        rel[0]["system"],
        "http://terminology.hl7.org/CodeSystem/v3-RoleCode"
    );
    assert_eq!(rel[1]["code"], "SPO");
    assert_eq!(
        rel[1]["system"],
        "http://terminology.hl7.org/CodeSystem/v2-0063"
    );
    assert_eq!(resources(&b, "Provenance").len(), 1);
    // References resolve within the Bundle.
    let urls: Vec<&str> = b["entry"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["fullUrl"].as_str().expect("fullUrl"))
        .collect();
    assert!(urls.contains(&enc["subject"]["reference"].as_str().expect("subject")));
    // The patient is updated by its identifier; resources without one by their derived id.
    let first = &b["entry"][0];
    assert_eq!(first["request"]["method"], "PUT");
    assert_eq!(
        first["request"]["url"],
        "Patient?identifier=urn:hl7gw:id:HOSP%7C12345"
    );
    assert!(first["resource"].get("id").is_none());
    let obs_entry = b["entry"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["resource"]["resourceType"] == "Observation")
        .expect("observation entry");
    assert_eq!(
        obs_entry["request"]["url"].as_str().expect("url"),
        format!(
            "Observation/{}",
            obs_entry["resource"]["id"].as_str().expect("id")
        )
    );
    assert_eq!(
        outcome.resources,
        b["entry"].as_array().expect("entries").len()
    );
    assert!(
        outcome.unmapped.contains(&"ZPI".to_owned()),
        "{:?}",
        outcome.unmapped
    );
}

#[test]
fn the_same_message_gives_the_same_bundle() {
    let (a, _) = convert_json(ADT_A01, &Options::default());
    let (b, _) = convert_json(ADT_A01, &Options::default());
    assert_eq!(a, b);
}

#[test]
fn a_message_bundle_starts_with_its_message_header() {
    let opts = Options {
        bundle_type: BundleType::Message,
        ..Options::default()
    };
    let (b, _) = convert_json(ADT_A01, &opts);
    assert_eq!(b["type"], "message");
    let header = &b["entry"][0]["resource"];
    assert_eq!(header["resourceType"], "MessageHeader");
    assert_eq!(header["eventCoding"]["code"], "A01");
    assert_eq!(header["source"]["endpoint"], "urn:hl7gw:application:EPIC");
    assert!(b["entry"][1].get("request").is_none());
}

#[test]
fn unmapped_values_are_kept_when_the_route_asks() {
    let opts = Options {
        unmapped: Unmapped::Extension,
        ..Options::default()
    };
    let (b, outcome) = convert_json(ADT_A01, &opts);
    let ext = b["meta"]["extension"].as_array().expect("meta.extension");
    assert!(
        ext.iter().any(|e| e["valueString"]
            .as_str()
            .is_some_and(|v| v.starts_with("ZPI=ZPI|1|custom"))),
        "{ext:?}"
    );
    assert_eq!(ext.len(), outcome.unmapped.len());
}

#[test]
fn times_without_an_offset_keep_their_date_unless_the_route_gives_one() {
    assert_eq!(
        dt::dtm("20240102030405", None, false).as_deref(),
        Some("2024-01-02")
    );
    assert_eq!(
        dt::dtm("20240102030405", Some("-05:00"), false).as_deref(),
        Some("2024-01-02T03:04:05-05:00")
    );
    assert_eq!(
        dt::dtm("202401020304-0500", None, false).as_deref(),
        Some("2024-01-02T03:04:00-05:00")
    );
    assert_eq!(
        dt::dtm("20240102030405.123+0000", None, true).as_deref(),
        Some("2024-01-02T03:04:05.123+00:00")
    );
    assert_eq!(dt::dtm("202401", None, false).as_deref(), Some("2024-01"));
    assert_eq!(dt::dtm("2024010", None, false), None);
    assert_eq!(dt::dtm("20240102", None, true), None);
}

#[test]
fn other_messages_are_refused_by_name() {
    let m = hl7v2::Message::parse(b"MSH|^~\\&|A|B|C|D|20240101||ZZZ^Z01|1|P|2.5\r").expect("parse");
    let err =
        convert(&m, Charset::Utf8, &Options::default(), &mut Vec::new()).expect_err("unsupported");
    assert_eq!(err, FhirError::Unsupported("ZZZ^Z01".into()));
}
