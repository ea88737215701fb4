use super::*;
use serde_json::Value as Json;

/// An entry's request as one condition: `Type?identifier=...` for a conditional update (PUT) or a
/// create-if-absent (POST with `ifNoneExist`), `Type/id` for an update by id.
fn condition(e: &Json) -> String {
    let r = &e["request"];
    let url = r["url"].as_str().unwrap_or_default();
    match r["ifNoneExist"].as_str() {
        Some(q) => {
            assert_eq!(r["method"], "POST", "{r}");
            format!("{url}?{q}")
        }
        None => url.to_owned(),
    }
}

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
        datatypes::dtm::dtm("20240102030405", None, false).as_deref(),
        Some("2024-01-02")
    );
    assert_eq!(
        datatypes::dtm::dtm(
            "20240102030405",
            Some(&TimeZone::parse("-05:00").expect("offset")),
            false
        )
        .as_deref(),
        Some("2024-01-02T03:04:05-05:00")
    );
    assert_eq!(
        datatypes::dtm::dtm("202401020304-0500", None, false).as_deref(),
        Some("2024-01-02T03:04:00-05:00")
    );
    assert_eq!(
        datatypes::dtm::dtm("20240102030405.123+0000", None, true).as_deref(),
        Some("2024-01-02T03:04:05.123+00:00")
    );
    assert_eq!(
        datatypes::dtm::dtm("202401", None, false).as_deref(),
        Some("2024-01")
    );
    assert_eq!(datatypes::dtm::dtm("2024010", None, false), None);
    assert_eq!(datatypes::dtm::dtm("20240102", None, true), None);
}

#[test]
fn other_messages_are_refused_by_name() {
    let m = hl7v2::Message::parse(b"MSH|^~\\&|A|B|C|D|20240101||ZZZ^Z01|1|P|2.5\r").expect("parse");
    let err =
        convert(&m, Charset::Utf8, &Options::default(), &mut Vec::new()).expect_err("unsupported");
    assert_eq!(err, FhirError::Unsupported("ZZZ^Z01".into()));
}

const ORU_R01: &[u8] = b"MSH|^~\\&|LAB|MAIN^2.16.840.1.113883.19.2^ISO|EHR|HOSP|20240103101500+0100||ORU^R01^ORU_R01|LAB0001|P|2.5.1\r\
PID|1||12345^^^HOSP^MR||DOE^JANE||19800214|F\r\
PV1|1|O|CLINIC^101||||1234^SMITH^ANNA^^^DR^^^HOSP||||||||||||V200^^^HOSP^VN\r\
ORC|RE|PL1^EHR|FL1^LAB||CM||||20240103080000+0100|||1234^SMITH^ANNA^^^DR^^^HOSP\r\
OBR|1|PL1^EHR|FL1^LAB|24331-1^Lipid panel^LN|||20240103073000+0100|||||||||1234^SMITH^ANNA^^^DR^^^HOSP||||||20240103101000+0100||CH|F\r\
OBX|1|NM|2093-3^Cholesterol^LN||195|mg/dL^mg/dL^UCUM|<200|N|||F|||20240103090000+0100\r\
OBX|2|SN|2571-8^Triglyceride^LN||>^400|mg/dL^mg/dL^UCUM||H|||F\r\
NTE|1||Sample lipemic\r\
SPM|1|SP1&EHR^SPF1&LAB||SER^Serum^HL70487|||||||||||||20240103073000+0100|20240103080000+0100\r\
OBR|2|PL2^EHR|FL2^LAB|600-7^Bacteria identified in Blood by Culture^LN|||20240103073000+0100|||||||||||||||20240103101000+0100||MB|P\r\
OBX|1|CWE|600-7^Bacteria identified^LN|1|3092008^Staphylococcus aureus^SCT||||||P\r\
OBX|2|TX|18769-0^Antimicrobial susceptibility^LN|1|Line one~Line two||||||P\r\
ZLB|1|custom\r";

fn entries(b: &Json) -> &Vec<Json> {
    b["entry"].as_array().expect("entries")
}

/// The entry a `urn:uuid:` reference points at.
fn resolve<'j>(b: &'j Json, reference: &Json) -> &'j Json {
    let r = reference["reference"].as_str().expect("reference");
    let e = entries(b)
        .iter()
        .find(|e| e["fullUrl"] == r)
        .unwrap_or_else(|| panic!("{r} is not in the Bundle"));
    &e["resource"]
}

#[test]
fn an_oru_r01_becomes_reports_with_their_results_and_specimens() {
    let (b, outcome) = convert_json(ORU_R01, &Options::default());
    assert_eq!(b["type"], "transaction");
    assert_eq!(resources(&b, "Patient").len(), 1);
    assert_eq!(resources(&b, "Encounter").len(), 1);
    // PV1-7, ORC-12 and OBR-16 name the same practitioner: one entry.
    assert_eq!(resources(&b, "Practitioner").len(), 1);
    assert_eq!(resources(&b, "ServiceRequest").len(), 2);
    assert_eq!(resources(&b, "DiagnosticReport").len(), 2);
    assert_eq!(resources(&b, "Observation").len(), 4);
    assert_eq!(resources(&b, "Specimen").len(), 1);
    assert_eq!(resources(&b, "Provenance").len(), 1);
    assert_eq!(outcome.resources, entries(&b).len());
    assert!(
        outcome.unmapped.contains(&"ZLB".to_owned()),
        "{:?}",
        outcome.unmapped
    );

    // Every reference resolves within the Bundle.
    let text = serde_json::to_string(&b).expect("json");
    for r in text.split("\"reference\":\"").skip(1) {
        let r = &r[..r.find('"').expect("end")];
        assert!(
            entries(&b).iter().any(|e| e["fullUrl"] == r),
            "{r} does not resolve"
        );
    }

    let reports = resources(&b, "DiagnosticReport");
    let (lipids, culture) = (reports[0], reports[1]);
    assert_eq!(lipids["status"], "final");
    assert_eq!(culture["status"], "preliminary");
    assert_eq!(lipids["code"]["coding"][0]["code"], "24331-1");
    assert_eq!(lipids["code"]["coding"][0]["system"], "http://loinc.org");
    assert_eq!(lipids["effectiveDateTime"], "2024-01-03T07:30:00+01:00");
    assert_eq!(lipids["issued"], "2024-01-03T10:10:00+01:00");
    assert_eq!(lipids["category"][0]["coding"][0]["code"], "CH");
    assert_eq!(
        lipids["category"][0]["coding"][0]["system"],
        "http://terminology.hl7.org/CodeSystem/v2-0074"
    );
    assert_eq!(resolve(&b, &lipids["subject"])["resourceType"], "Patient");
    assert_eq!(
        resolve(&b, &lipids["encounter"])["resourceType"],
        "Encounter"
    );
    let request = resolve(&b, &lipids["basedOn"][0]);
    assert_eq!(request["resourceType"], "ServiceRequest");
    assert_eq!(request["status"], "completed");
    assert_eq!(request["intent"], "order");
    assert_eq!(request["identifier"][0]["value"], "PL1");
    assert_eq!(
        request["identifier"][0]["type"]["coding"][0]["code"],
        "PLAC"
    );
    assert_eq!(request["identifier"][1]["value"], "FL1");
    assert_eq!(
        request["identifier"][1]["type"]["coding"][0]["code"],
        "FILL"
    );
    assert_eq!(
        resolve(&b, &request["requester"])["name"][0]["family"],
        "SMITH"
    );

    // The first report's results: NM and SN (with its comparator), and the NTE as a note.
    let results: Vec<&Json> = lipids["result"]
        .as_array()
        .expect("result")
        .iter()
        .map(|r| resolve(&b, r))
        .collect();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["valueQuantity"]["value"], 195);
    assert_eq!(results[0]["valueQuantity"]["code"], "mg/dL");
    assert_eq!(
        results[0]["valueQuantity"]["system"],
        "http://unitsofmeasure.org"
    );
    assert_eq!(results[0]["effectiveDateTime"], "2024-01-03T09:00:00+01:00");
    assert_eq!(results[0]["referenceRange"][0]["text"], "<200");
    assert_eq!(results[0]["status"], "final");
    assert_eq!(results[1]["valueQuantity"]["comparator"], ">");
    assert_eq!(results[1]["valueQuantity"]["value"], 400);
    assert_eq!(results[1]["note"][0]["text"], "Sample lipemic");
    // Without OBX-14, the OBR's observation time (OBR-7).
    assert_eq!(results[1]["effectiveDateTime"], "2024-01-03T07:30:00+01:00");
    assert_eq!(results[1]["interpretation"][0]["coding"][0]["code"], "H");

    let specimen = resolve(&b, &lipids["specimen"][0]);
    assert_eq!(specimen["resourceType"], "Specimen");
    assert_eq!(specimen["identifier"][0]["value"], "SP1");
    assert_eq!(specimen["identifier"][1]["value"], "SPF1");
    assert_eq!(specimen["type"]["coding"][0]["code"], "SER");
    assert_eq!(
        specimen["type"]["coding"][0]["system"],
        "http://terminology.hl7.org/CodeSystem/v2-0487"
    );
    assert_eq!(
        specimen["collection"]["collectedDateTime"],
        "2024-01-03T07:30:00+01:00"
    );
    assert_eq!(specimen["receivedTime"], "2024-01-03T08:00:00+01:00");
    assert!(culture.get("specimen").is_none());

    // The second report's results: CWE and TX (its repetitions as lines), with OBX-4.
    let results: Vec<&Json> = culture["result"]
        .as_array()
        .expect("result")
        .iter()
        .map(|r| resolve(&b, r))
        .collect();
    let organism = &results[0]["valueCodeableConcept"]["coding"][0];
    assert_eq!(organism["code"], "3092008");
    assert_eq!(organism["system"], "http://snomed.info/sct");
    assert_eq!(results[0]["status"], "preliminary");
    assert_eq!(results[1]["valueString"], "Line one\nLine two");
    assert_eq!(
        results[1]["extension"][0]["url"],
        "http://hl7.org/fhir/StructureDefinition/observation-v2-subid"
    );

    // Reports and orders are updated by their business identifiers and codes, specimens by their
    // identifiers; observations by ids derived from their report's.
    let url_of = |ty: &str, i: usize| -> String {
        entries(&b)
            .iter()
            .filter(|e| e["resource"]["resourceType"] == ty)
            .nth(i)
            .map(condition)
            .expect("request url")
    };
    assert_eq!(
        url_of("DiagnosticReport", 0),
        "DiagnosticReport?identifier=urn:hl7gw:id:LAB%7CFL1&code=http://loinc.org%7C24331-1"
    );
    assert_eq!(
        url_of("ServiceRequest", 1),
        "ServiceRequest?identifier=urn:hl7gw:id:LAB%7CFL2&code=http://loinc.org%7C600-7"
    );
    assert_eq!(
        url_of("Specimen", 0),
        "Specimen?identifier=urn:hl7gw:id:LAB%7CSPF1"
    );
    assert!(url_of("Observation", 0).starts_with("Observation/"));
}

#[test]
fn an_oru_r01_gives_the_same_ids_when_delivered_again() {
    let (a, _) = convert_json(ORU_R01, &Options::default());
    let (b, _) = convert_json(ORU_R01, &Options::default());
    assert_eq!(a, b);
    // Another message (a correction, a new control id) about the same reports updates the same
    // observations.
    let other = String::from_utf8_lossy(ORU_R01).replace("|LAB0001|", "|LAB0002|");
    let (c, _) = convert_json(other.as_bytes(), &Options::default());
    let ids = |b: &Json| -> Vec<String> {
        resources(b, "Observation")
            .iter()
            .map(|o| o["id"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(ids(&a), ids(&c));
    assert_ne!(a["id"], c["id"]);
}

#[test]
fn a_filler_number_two_reports_share_updates_each_by_its_code() {
    // CDC case notifications repeat OBR-3 in every OBR, and one order number may hold several tests: the
    // condition names the code too, so each matches its own report.
    let msg = String::from_utf8_lossy(ORU_R01).replace("|PL2^EHR|FL2^LAB|", "|PL1^EHR|FL1^LAB|");
    let (b, _) = convert_json(msg.as_bytes(), &Options::default());
    let reports: Vec<&Json> = entries(&b)
        .iter()
        .filter(|e| e["resource"]["resourceType"] == "DiagnosticReport")
        .collect();
    assert_eq!(reports.len(), 2);
    assert_ne!(reports[0]["fullUrl"], reports[1]["fullUrl"]);
    assert_eq!(
        reports[0]["request"]["url"],
        "DiagnosticReport?identifier=urn:hl7gw:id:LAB%7CFL1&code=http://loinc.org%7C24331-1"
    );
    assert_eq!(
        reports[1]["request"]["url"],
        "DiagnosticReport?identifier=urn:hl7gw:id:LAB%7CFL1&code=http://loinc.org%7C600-7"
    );
    for r in &reports {
        assert_eq!(r["resource"]["identifier"][1]["value"], "FL1");
    }
}

#[test]
fn a_condition_two_resources_share_is_used_by_the_first_only() {
    // Same filler number and same code: the second report (and order) repeats the first's condition. It is
    // updated by an id derived from the condition and its rank, and does not carry the order numbers (which
    // would make the first one's condition match two resources on the server); they are reported.
    let msg = String::from_utf8_lossy(ORU_R01).replace(
        "|PL2^EHR|FL2^LAB|600-7^Bacteria identified in Blood by Culture^LN|",
        "|PL1^EHR|FL1^LAB|24331-1^Lipid panel^LN|",
    );
    let (b, outcome) = convert_json(msg.as_bytes(), &Options::default());
    for ty in ["DiagnosticReport", "ServiceRequest"] {
        let list: Vec<&Json> = entries(&b)
            .iter()
            .filter(|e| e["resource"]["resourceType"] == ty)
            .collect();
        assert_eq!(list.len(), 2, "{ty}");
        let first = condition(list[0]);
        assert!(first.starts_with(&format!("{ty}?identifier=")), "{first}");
        assert_eq!(list[0]["resource"]["identifier"][1]["value"], "FL1");
        let second = list[1]["request"]["url"].as_str().expect("url");
        assert!(second.starts_with(&format!("{ty}/")), "{second}");
        assert!(list[1]["resource"]["identifier"].is_null(), "{ty}");
    }
    assert!(
        outcome.unmapped.iter().any(|u| u == "OBR-2")
            && outcome.unmapped.iter().any(|u| u == "OBR-3"),
        "{:?}",
        outcome.unmapped
    );
    // Delivered again: the same ids.
    let (again, _) = convert_json(msg.as_bytes(), &Options::default());
    assert_eq!(b, again);
}

#[test]
fn an_oru_r01_message_bundle_is_about_its_reports() {
    let opts = Options {
        bundle_type: BundleType::Message,
        ..Options::default()
    };
    let (b, _) = convert_json(ORU_R01, &opts);
    let header = &b["entry"][0]["resource"];
    assert_eq!(header["resourceType"], "MessageHeader");
    assert_eq!(header["eventCoding"]["code"], "R01");
    let focus = header["focus"].as_array().expect("focus");
    assert_eq!(focus.len(), 2);
    for f in focus {
        assert_eq!(resolve(&b, f)["resourceType"], "DiagnosticReport");
    }
}

#[test]
fn an_orm_o01_becomes_its_service_requests() {
    let msg = b"MSH|^~\\&|EHR|HOSP|LAB|MAIN|20240103080000+0100||ORM^O01|ORD0001|P|2.5.1\r\
PID|1||12345^^^HOSP^MR||DOE^JANE||19800214|F\r\
ORC|NW|PL1^EHR|||||||20240103080000+0100|||1234^SMITH^ANNA^^^DR^^^HOSP\r\
OBR|1|PL1^EHR||24331-1^Lipid panel^LN|R||||||||||||||||||||||||||E78.5^Hyperlipidemia^I10\r\
NTE|1||Fasting\r\
DG1|1||E78.5^Hyperlipidemia^I10\r\
OBX|1|NM|3141-9^Body weight^LN||72.5|kg^kg^UCUM|||||F\r";
    let (b, outcome) = convert_json(msg, &Options::default());
    assert!(resources(&b, "DiagnosticReport").is_empty());
    let request = resources(&b, "ServiceRequest")[0];
    assert_eq!(request["status"], "active");
    assert_eq!(request["intent"], "order");
    assert_eq!(request["priority"], "routine");
    assert_eq!(request["authoredOn"], "2024-01-03T08:00:00+01:00");
    assert_eq!(request["note"][0]["text"], "Fasting");
    assert_eq!(request["reasonCode"][0]["coding"][0]["code"], "E78.5");
    assert_eq!(
        resolve(&b, &request["reasonReference"][0])["resourceType"],
        "Condition"
    );
    assert_eq!(
        resolve(&b, &request["supportingInfo"][0])["valueQuantity"]["value"],
        72.5
    );
    assert_eq!(
        condition(&entries(&b)[0]),
        "Patient?identifier=urn:hl7gw:id:HOSP%7C12345"
    );
    // An order message mentions the patient: created when absent, never replaced.
    assert_eq!(entries(&b)[0]["request"]["method"], "POST");
    let sr = entries(&b)
        .iter()
        .find(|e| e["resource"]["resourceType"] == "ServiceRequest")
        .expect("service request");
    assert_eq!(
        sr["request"]["url"],
        "ServiceRequest?identifier=urn:hl7gw:id:EHR%7CPL1&code=http://loinc.org%7C24331-1"
    );
    assert!(outcome.unmapped.is_empty(), "{:?}", outcome.unmapped);
}

const VXU_V04: &[u8] = include_bytes!("../tests/data/vxu_v04.hl7");
const MDM_T02: &[u8] = include_bytes!("../tests/data/mdm_t02.hl7");
const SIU_S12: &[u8] = include_bytes!("../tests/data/siu_s12.hl7");

/// The transaction request of the entry holding `resource`.
fn request_url<'j>(b: &'j Json, resource: &Json) -> &'j Json {
    &entries(b)
        .iter()
        .find(|e| e["resource"] == *resource)
        .expect("entry")["request"]["url"]
}

#[test]
fn a_vxu_v04_becomes_immunizations_with_their_observations() {
    let (b, outcome) = convert_json(VXU_V04, &Options::default());
    let imm = resources(&b, "Immunization");
    assert_eq!(imm.len(), 2);
    let given = imm[0];
    assert_eq!(given["status"], "completed");
    assert_eq!(
        given["vaccineCode"]["coding"][0]["system"],
        "http://hl7.org/fhir/sid/cvx"
    );
    assert_eq!(given["vaccineCode"]["coding"][0]["code"], "08");
    assert_eq!(given["occurrenceDateTime"], "2025-03-01T10:05:00+01:00");
    // RXA-22 is the record time when RXA-21 is A (ORC-9 is then reported).
    assert_eq!(given["recorded"], "2025-03-01T10:10:00+01:00");
    assert!(outcome.unmapped.contains(&"ORC-9".to_owned()));
    assert_eq!(given["doseQuantity"]["value"], 0.5);
    assert_eq!(given["doseQuantity"]["code"], "mL");
    assert_eq!(given["doseQuantity"]["system"], "http://unitsofmeasure.org");
    assert_eq!(given["lotNumber"], "LOT123");
    assert_eq!(given["expirationDate"], "2026-12-31");
    assert_eq!(
        resolve(&b, &given["manufacturer"])["name"],
        "Merck and Co., Inc."
    );
    let place = resolve(&b, &given["location"]);
    assert_eq!(place["name"], "CLINIC R1 CLINIC");
    assert_eq!(place["address"]["city"], "SAMPLETON");
    assert_eq!(given["site"]["coding"][0]["code"], "LD");
    assert_eq!(
        given["route"]["coding"][0]["system"],
        "http://terminology.hl7.org/CodeSystem/v3-RouteOfAdministration"
    );
    assert_eq!(given["performer"][0]["function"]["coding"][0]["code"], "AP");
    assert_eq!(
        resolve(&b, &given["performer"][0]["actor"])["name"][0]["family"],
        "DOCTOR"
    );
    assert_eq!(given["performer"][1]["function"]["coding"][0]["code"], "OP");
    let types: Vec<&Json> = given["identifier"]
        .as_array()
        .expect("identifiers")
        .iter()
        .map(|i| &i["value"])
        .collect();
    assert_eq!(types, ["PL100", "FL200", "PG300"]);
    assert_eq!(
        request_url(&b, given),
        "Immunization?identifier=urn:hl7gw:id:IIS%7CFL200"
    );
    // A refusal: RXA-20 RE through CompletionStatus, RXA-18 its reason.
    assert_eq!(imm[1]["status"], "not-done");
    assert_eq!(imm[1]["statusReason"]["coding"][0]["code"], "00");
    // OBX before the order: the patient's; after the RXA: partOf the Immunization, NTE as its note.
    let obs = resources(&b, "Observation");
    assert_eq!(obs.len(), 3);
    assert!(obs[0].get("partOf").is_none());
    assert_eq!(resolve(&b, &obs[1]["partOf"][0])["lotNumber"], "LOT123");
    assert_eq!(obs[1]["note"][0]["text"], "Eligibility checked at the desk");
    assert_eq!(resources(&b, "RelatedPerson").len(), 1);
    assert_eq!(resources(&b, "Encounter").len(), 1);
    // Delivered again: the same Bundle.
    assert_eq!(b, convert_json(VXU_V04, &Options::default()).0);
}

#[test]
fn a_vxu_without_a_vaccine_is_refused() {
    let msg = b"MSH|^~\\&|A|B|C|D|20250301||VXU^V04^VXU_V04|1|P|2.5.1\rPID|1||1^^^X^MR\rORC|RE||F1^X\rRXA|0|1|20250301||\r";
    let m = hl7v2::Message::parse(msg).expect("parse");
    let err =
        convert(&m, Charset::Utf8, &Options::default(), &mut Vec::new()).expect_err("no RXA-5");
    assert_eq!(err, FhirError::Required("RXA-5"));
}

#[test]
fn an_mdm_t02_becomes_a_document_reference_with_its_attachments() {
    let (b, _) = convert_json(MDM_T02, &Options::default());
    let docs = resources(&b, "DocumentReference");
    assert_eq!(docs.len(), 1);
    let doc = docs[0];
    assert_eq!(doc["masterIdentifier"]["value"], "DOC-0001");
    assert_eq!(doc["masterIdentifier"]["system"], "urn:hl7gw:id:CLINIC");
    assert_eq!(doc["identifier"][0]["value"], "discharge-0001.pdf");
    assert_eq!(doc["status"], "current");
    assert_eq!(doc["docStatus"], "final");
    assert_eq!(doc["type"]["coding"][0]["code"], "DS");
    assert_eq!(doc["date"], "2025-03-02T09:30:00+01:00");
    assert_eq!(doc["description"], "Discharge summary (sample)");
    assert_eq!(doc["securityLabel"][0]["coding"][0]["code"], "R");
    assert_eq!(
        resolve(&b, &doc["author"][0])["name"][0]["family"],
        "WRITER"
    );
    assert_eq!(
        resolve(&b, &doc["authenticator"])["name"][0]["family"],
        "CHECKER"
    );
    assert_eq!(resolve(&b, &doc["subject"])["resourceType"], "Patient");
    assert_eq!(
        resolve(&b, &doc["context"]["encounter"][0])["resourceType"],
        "Encounter"
    );
    let content = doc["content"].as_array().expect("content");
    assert_eq!(content.len(), 4);
    // The TX and FT lines, one text attachment.
    assert_eq!(
        content[0]["attachment"]["contentType"],
        "text/plain; charset=utf-8"
    );
    assert_eq!(
        content[0]["attachment"]["data"],
        crate::messages::mdm::base64(
            b"Admitted for observation.\nDischarged home in good condition.\nFollow-up in \ntwo weeks."
        )
    );
    // The NTE after the FT.
    assert_eq!(
        content[1]["attachment"]["data"],
        crate::messages::mdm::base64(b"Dictated, then reviewed")
    );
    // ED: base64 as sent, the type from ED-2/ED-3.
    assert_eq!(content[2]["attachment"]["contentType"], "application/pdf");
    assert_eq!(
        content[2]["attachment"]["data"],
        crate::messages::mdm::base64(b"%PDF-1.4\n% hl7gw sample, no patient data\n%%EOF\n")
    );
    // RP: by url.
    assert_eq!(
        content[3]["attachment"]["url"],
        "https://documents.example/discharge-0001"
    );
    assert_eq!(
        request_url(&b, doc),
        "DocumentReference?identifier=urn:hl7gw:id:CLINIC%7CDOC-0001"
    );
}

#[test]
fn an_mdm_without_content_is_refused() {
    let msg =
        b"MSH|^~\\&|A|B|C|D|20250301||MDM^T02^MDM_T02|1|P|2.5.1\rPID|1||1^^^X^MR\rTXA|1|DS|TX\r";
    let m = hl7v2::Message::parse(msg).expect("parse");
    let err = convert(&m, Charset::Utf8, &Options::default(), &mut Vec::new()).expect_err("no OBX");
    assert!(matches!(err, FhirError::Required(_)), "{err:?}");
}

#[test]
fn an_siu_s12_becomes_an_appointment_with_its_participants() {
    let (b, outcome) = convert_json(SIU_S12, &Options::default());
    let app = resources(&b, "Appointment")[0];
    assert_eq!(app["status"], "booked");
    assert_eq!(app["identifier"][0]["value"], "PA100");
    assert_eq!(app["identifier"][1]["value"], "FA200");
    assert_eq!(
        request_url(&b, app),
        "Appointment?identifier=urn:hl7gw:id:SCHED%7CFA200"
    );
    assert_eq!(app["start"], "2025-03-10T09:00:00+01:00");
    assert_eq!(app["end"], "2025-03-10T09:30:00+01:00");
    assert_eq!(app["minutesDuration"], 30);
    assert_eq!(app["serviceType"][0]["coding"][0]["code"], "90471");
    assert_eq!(app["appointmentType"]["coding"][0]["code"], "Normal");
    assert_eq!(
        app["reasonCode"][0]["coding"][0]["system"],
        "http://snomed.info/sct"
    );
    assert_eq!(app["comment"], "Bring the vaccination card\n\nSecond dose");
    let parts = app["participant"].as_array().expect("participants");
    assert_eq!(parts.len(), 7);
    assert!(parts.iter().all(|p| p["status"] == "accepted"));
    assert_eq!(resolve(&b, &parts[0]["actor"])["resourceType"], "Patient");
    assert_eq!(parts[1]["type"][0]["text"], "placer contact");
    assert_eq!(parts[3]["type"][0]["coding"][0]["code"], "enterer");
    let kinds: Vec<&Json> = parts[4..]
        .iter()
        .map(|p| &resolve(&b, &p["actor"])["resourceType"])
        .collect();
    assert_eq!(kinds, ["Device", "Location", "Practitioner"]);
    assert_eq!(parts[6]["period"]["end"], "2025-03-10T09:30:00+01:00");
    assert_eq!(parts[6]["type"][0]["coding"][0]["code"], "NUR");
    assert_eq!(resources(&b, "Observation").len(), 1);
    assert_eq!(resources(&b, "Condition").len(), 1);
    assert!(outcome.unmapped.contains(&"RGS".to_owned()));
}

#[test]
fn an_siu_status_without_a_row_follows_the_trigger() {
    let msg = b"MSH|^~\\&|A|B|C|D|20250301||SIU^S15|1|P|2.3\rSCH|1|2|||||||60|m|^^60^20250310090000^20250310100000||||||||||||||Scheduled\rPID|1||1^^^X^MR\rAIP|1|A|7^DOC^A|||||||||Scheduled\r";
    let m = hl7v2::Message::parse(msg).expect("parse");
    // Times without an offset: the route's timezone, or the Appointment cannot have its instants.
    let err = convert(&m, Charset::Utf8, &Options::default(), &mut Vec::new());
    assert!(
        err.is_ok(),
        "a cancelled Appointment needs no times: {err:?}"
    );
    let opts = Options {
        timezone: Some(TimeZone::parse("+01:00").expect("offset")),
        ..Options::default()
    };
    let (b, outcome) = convert_json(msg, &opts);
    let app = resources(&b, "Appointment")[0];
    assert_eq!(app["status"], "cancelled");
    assert_eq!(app["start"], "2025-03-10T09:00:00+01:00");
    assert_eq!(app["participant"][1]["status"], "declined");
    assert!(outcome.unmapped.contains(&"SCH-25".to_owned()));
    assert!(outcome.unmapped.contains(&"AIP-12".to_owned()));
    let booked = String::from_utf8_lossy(msg).replace("SIU^S15", "SIU^S12");
    let m = hl7v2::Message::parse(booked.as_bytes()).expect("parse");
    let err =
        convert(&m, Charset::Utf8, &Options::default(), &mut Vec::new()).expect_err("no instants");
    assert!(matches!(err, FhirError::Required(_)), "{err:?}");
}

/// An ADT^A04 from `facility` (MSH-4) for a patient whose PID-3 is `pid3`.
fn a04(facility: &str, pid3: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|REG|{facility}|HL7GW|HL7GW|20260201080000||ADT^A04^ADT_A01|C1|P|2.5.1\rPID|1||{pid3}||DOE^JANE||19700101|F\rPV1|1|O\r"
    )
    .into_bytes()
}

fn patient_condition(msg: &[u8], opts: &Options) -> Result<String, FhirError> {
    let m = hl7v2::Message::parse(msg).expect("parse");
    let mut out = Vec::new();
    convert(&m, Charset::Utf8, opts, &mut out)?;
    let b: Json = serde_json::from_slice(&out).expect("json");
    Ok(condition(&entries(&b)[0]))
}

#[test]
fn a_patient_identifier_is_scoped_by_its_authority_else_the_sender_else_refused() {
    let opts = Options::default();
    // CX-4, then CX-6 (assigning facility), then MSH-4.
    assert_eq!(
        patient_condition(&a04("CLINIC_1", "55555^^^HOSP_A^MR^FAC_B"), &opts).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:HOSP_A%7C55555")
    );
    assert_eq!(
        patient_condition(&a04("CLINIC_1", "55555^^^^MR^FAC_B"), &opts).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:FAC_B%7C55555")
    );
    assert_eq!(
        patient_condition(&a04("CLINIC_1", "55555"), &opts).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:CLINIC_1%7C55555")
    );
    // Nothing names an authority: refused, whatever else the message holds, and nothing is written.
    let anonymous = a04("", "55555");
    let m = hl7v2::Message::parse(&anonymous).expect("parse");
    let mut out = b"kept".to_vec();
    assert_eq!(
        convert(&m, Charset::Utf8, &opts, &mut out),
        Err(FhirError::UnscopedIdentity)
    );
    assert_eq!(out, b"kept");
    assert_eq!(
        FhirError::UnscopedIdentity.kind(),
        "unscoped_patient_identity"
    );
    // ...unless the route names the sender's authority, or opts in to one global namespace.
    let sender = Options {
        senders: [(
            "REG".to_owned(),
            crate::Sender {
                authority: Some("REG_MRN".into()),
                ..crate::Sender::default()
            },
        )]
        .into(),
        ..Options::default()
    };
    assert_eq!(
        patient_condition(&a04("", "55555"), &sender).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:REG_MRN%7C55555")
    );
    // The sender's authority comes before MSH-4 (`APP^FAC`, then `FAC`, then `APP`).
    assert_eq!(
        patient_condition(&a04("CLINIC_1", "55555"), &sender).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:REG_MRN%7C55555")
    );
    let global = Options {
        unscoped_identifiers_global: true,
        ..Options::default()
    };
    assert_eq!(
        patient_condition(&a04("", "55555"), &global).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:unknown%7C55555")
    );
}

#[test]
fn a_route_names_the_patients_match_key_among_pid3s_repetitions() {
    let pid3 = "SSN1^^^SSA^SS~MRN-B^^^HOSP_B^MR~MRN-A^^^HOSP_A^MR";
    let rule = |t: Option<&str>, a: Option<&str>| Options {
        patient_identifier: Some(crate::IdentifierRule {
            type_code: t.map(str::to_owned),
            authority: a.map(str::to_owned),
        }),
        ..Options::default()
    };
    assert_eq!(
        patient_condition(&a04("F", pid3), &Options::default()).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:SSA%7CSSN1")
    );
    assert_eq!(
        patient_condition(&a04("F", pid3), &rule(Some("MR"), Some("HOSP_A"))).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:HOSP_A%7CMRN-A")
    );
    assert_eq!(
        patient_condition(&a04("F", pid3), &rule(Some("MR"), None)).as_deref(),
        Ok("Patient?identifier=urn:hl7gw:id:HOSP_B%7CMRN-B")
    );
    let err = patient_condition(&a04("F", pid3), &rule(Some("MR"), Some("HOSP_C")))
        .expect_err("no such identifier");
    assert_eq!(err.kind(), "no_patient_match_key");
    assert!(err.to_string().contains("HOSP_C"), "{err}");
}

#[test]
fn who_owns_a_resource_updates_it_the_others_create_it_if_absent_or_reference_it() {
    let (adt, _) = convert_json(ADT_A01, &Options::default());
    let methods = |b: &Json, ty: &str| -> Vec<String> {
        entries(b)
            .iter()
            .filter(|e| e["resource"]["resourceType"] == ty)
            .map(|e| {
                e["request"]["method"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(methods(&adt, "Patient"), ["PUT"]);
    assert_eq!(methods(&adt, "Encounter"), ["PUT"]);
    assert!(methods(&adt, "Practitioner").iter().all(|m| m == "POST"));
    let (oru, _) = convert_json(ORU_R01, &Options::default());
    assert_eq!(methods(&oru, "Patient"), ["POST"]);
    let patient = entries(&oru)
        .iter()
        .find(|e| e["resource"]["resourceType"] == "Patient")
        .expect("a Patient");
    assert!(patient["resource"]["id"].is_null(), "the server names it");
    assert!(methods(&oru, "Observation").iter().all(|m| m == "PUT"));
    // Only referenced: no Patient entry; every reference to it names its identifier.
    let opts = Options {
        write: [("Patient".to_owned(), Write::Reference)].into(),
        ..Options::default()
    };
    let (b, outcome) = convert_json(ORU_R01, &opts);
    assert!(methods(&b, "Patient").is_empty());
    let text = b.to_string();
    let refs = text.matches("\"Patient?identifier=").count();
    assert!(refs >= 3, "{refs} references: {text}");
    let (all, _) = convert_json(ORU_R01, &Options::default());
    assert_eq!(outcome.resources + 1, entries(&all).len());
    // A message Bundle knows no requests: every resource is in it.
    let message = Options {
        bundle_type: BundleType::Message,
        ..opts
    };
    let (m, _) = convert_json(ORU_R01, &message);
    assert!(
        entries(&m)
            .iter()
            .any(|e| e["resource"]["resourceType"] == "Patient")
    );
}

#[test]
fn iana_zones_give_each_date_its_own_offset_and_impossible_times_are_left_out() {
    let ny = TimeZone::parse("America/New_York").expect("a zone");
    let at = |v: &str, instant: bool| datatypes::dtm::dtm(v, Some(&ny), instant);
    assert_eq!(
        at("20260115103000", false).as_deref(),
        Some("2026-01-15T10:30:00-05:00")
    );
    assert_eq!(
        at("20260715103000", true).as_deref(),
        Some("2026-07-15T10:30:00-04:00")
    );
    // The message's own offset wins over the zone.
    assert_eq!(
        at("20260715103000+0100", false).as_deref(),
        Some("2026-07-15T10:30:00+01:00")
    );
    // 02:30 on 8 March 2026 never happened in New York; 01:30 on 1 November happened twice.
    assert_eq!(at("20260308023000", false), None);
    assert_eq!(at("20261101013000", false).as_deref(), Some("2026-11-01"));
    assert_eq!(at("20261101013000", true), None);
    // Dates and times that do not exist.
    for bad in [
        "99999999",
        "20230229",
        "20241301",
        "20240431",
        "20240101250000",
        "20240101106000",
        "20240101105960",
        "202401011030+2500",
        "00000101",
    ] {
        assert_eq!(datatypes::dtm::dtm(bad, None, false), None, "{bad}");
    }
    assert_eq!(
        datatypes::dtm::dtm("20240229", None, false).as_deref(),
        Some("2024-02-29")
    );
    assert!(TimeZone::parse("Mars/Olympus_Mons").is_err());
    assert!(TimeZone::parse("+25:00").is_err());
    assert_eq!(TimeZone::parse("UTC").expect("UTC").name(), "UTC");
    // A sender's zone wins over the route's.
    let opts = Options {
        timezone: Some(TimeZone::parse("Europe/Berlin").expect("a zone")),
        senders: [(
            "REG^F".to_owned(),
            crate::Sender {
                timezone: Some(ny.clone()),
                ..crate::Sender::default()
            },
        )]
        .into(),
        ..Options::default()
    };
    let with_admit = |facility: &str| {
        let mut m = a04(facility, "1^^^H^MR");
        m.truncate(m.len() - 1);
        m.extend_from_slice(b"||||||||||||||||||||||||||||||||||||||||||20260715103000\r");
        let (b, _) = convert_json(&m, &opts);
        entries(&b)
            .iter()
            .find(|e| e["resource"]["resourceType"] == "Encounter")
            .map(|e| e["resource"]["period"]["start"].clone())
            .expect("an Encounter")
    };
    assert_eq!(with_admit("F"), "2026-07-15T10:30:00-04:00");
    assert_eq!(with_admit("G"), "2026-07-15T10:30:00+02:00");
}

#[test]
fn encounter_status_and_identity_follow_pv1_as_the_ig_says() {
    let adt = |trigger: &str, pv1: &str| -> Json {
        let m = format!(
            "MSH|^~\\&|REG|F|HL7GW|HL7GW|20260201080000||ADT^{trigger}^ADT_A01|C1|P|2.5.1\rPID|1||1^^^H^MR||DOE^JANE\r{pv1}\r"
        );
        convert_json(m.as_bytes(), &Options::default()).0
    };
    let encounters = |b: &Json| -> Vec<Json> {
        entries(b)
            .iter()
            .filter(|e| e["resource"]["resourceType"] == "Encounter")
            .map(|e| e["resource"].clone())
            .collect()
    };
    let with_visit = "PV1|1|I|||||||||||||||||V1^^^H^VN";
    // An update (A08) of an inpatient's visit is in progress (the event's own map said `unknown`); a
    // registration (A04) of an outpatient too (it said `planned`); a pre-admit class is planned.
    assert_eq!(
        encounters(&adt("A08", with_visit))[0]["status"],
        "in-progress"
    );
    assert_eq!(
        encounters(&adt("A04", &with_visit.replace("|I|", "|O|")))[0]["status"],
        "in-progress"
    );
    assert_eq!(
        encounters(&adt("A05", &with_visit.replace("|I|", "|P|")))[0]["status"],
        "planned"
    );
    // The events that say what became of the visit: A03 ends it, A11 cancels it, A13 undoes the end.
    assert_eq!(encounters(&adt("A03", with_visit))[0]["status"], "finished");
    assert_eq!(
        encounters(&adt("A11", with_visit))[0]["status"],
        "cancelled"
    );
    assert_eq!(
        encounters(&adt("A13", with_visit))[0]["status"],
        "in-progress"
    );
    // No visit number and no admit time (an A31's `PV1|1|N`): no Encounter, the PV1 reported.
    let m = "MSH|^~\\&|REG|F|HL7GW|HL7GW|20260201080000||ADT^A31^ADT_A05|C1|P|2.5.1\rPID|1||1^^^H^MR||DOE^JANE\rPV1|1|N\r";
    let (b, outcome) = convert_json(m.as_bytes(), &Options::default());
    assert!(encounters(&b).is_empty());
    assert!(
        outcome.unmapped.contains(&"PV1-2".to_owned()),
        "{outcome:?}"
    );
    // No visit number, an admit time: the messages of that visit name one Encounter.
    let admitted = format!("PV1|1|I{}20260201073000", "|".repeat(42));
    let id = |b: &Json| encounters(b)[0]["id"].clone();
    assert_eq!(id(&adt("A01", &admitted)), id(&adt("A03", &admitted)));
    assert_ne!(
        id(&adt("A01", &admitted)),
        id(&adt("A01", &admitted.replace("0730", "0731")))
    );
}

#[test]
fn a_sites_code_maps_and_field_maps_change_the_bundle() {
    // The IG's CSV layout: two header rows, then v2 code, ..., FHIR code (7), display (9), system (10).
    let sex = crate::CodeMap::from_ig_csv(
        "HL7 v2,,,Condition,,,HL7 FHIR,,,\nCode,Text,System,a,b,c,Code,,Display,System\n\
         F,Female,HL70001,,,,female,,Woman,http://hl7.org/fhir/administrative-gender\n\
         9,Local unknown,L,,,,unknown,,Unknown,http://hl7.org/fhir/administrative-gender\n",
    )
    .expect("csv");
    assert_eq!(sex.len(), 2);
    let lab = crate::CodeMap::from_concept_map_json(
        r#"{"resourceType":"ConceptMap","group":[{"source":"urn:lab","target":"http://loinc.org",
           "element":[{"code":"GLU","target":[{"code":"2345-7","display":"Glucose","equivalence":"equivalent"}]},
                      {"code":"XX","target":[{"equivalence":"unmatched"}]}]}]}"#,
    )
    .expect("json");
    assert_eq!(lab.len(), 1);
    assert!(crate::CodeMap::from_concept_map_json(r#"{"resourceType":"Patient"}"#).is_err());
    let opts = Options {
        code_maps: [
            ("AdministrativeSex".to_owned(), std::sync::Arc::new(sex)),
            ("99LAB".to_owned(), std::sync::Arc::new(lab)),
        ]
        .into(),
        field_maps: vec![
            crate::FieldMap::parse(
                "ZPI-3",
                "Patient.extension[https://hospital.example/fhir/StructureDefinition/parish].valueString",
            )
            .expect("field map"),
            crate::FieldMap::parse(
                "ZPI-4",
                "Patient.extension[https://hospital.example/fhir/StructureDefinition/donor].valueBoolean",
            )
            .expect("field map"),
            crate::FieldMap::parse(
                "ZEN-2",
                "Encounter.extension[https://hospital.example/fhir/StructureDefinition/ward-code].valueCodeableConcept",
            )
            .expect("field map"),
        ],
        ..Options::default()
    };
    let m = "MSH|^~\\&|REG|F|HL7GW|HL7GW|20260201080000||ADT^A01^ADT_A01|C1|P|2.5.1\r\
             PID|1||1^^^H^MR||DOE^JANE||19700101|9\r\
             ZPI|1|x|ST MARY~ST PAUL|Y|unmapped\r\
             PV1|1|I|||||||||||||||||V1^^^H^VN\r\
             ZEN|1|W4^Ward four^L\r\
             OBX|1|NM|GLU^Glucose^99LAB||95|mg/dL\r";
    let (b, outcome) = convert_json(m.as_bytes(), &opts);
    let resource = |ty: &str| -> Json {
        entries(&b)
            .iter()
            .find(|e| e["resource"]["resourceType"] == ty)
            .map(|e| e["resource"].clone())
            .expect(ty)
    };
    let patient = resource("Patient");
    // The local sex code 9 through the site's map (the IG's has no row for it).
    assert_eq!(patient["gender"], "unknown", "{patient}");
    let ext = patient["extension"].as_array().expect("extensions");
    let values: Vec<&Json> = ext
        .iter()
        .filter(|e| e["url"] == "https://hospital.example/fhir/StructureDefinition/parish")
        .map(|e| &e["valueString"])
        .collect();
    assert_eq!(values, [&Json::from("ST MARY"), &Json::from("ST PAUL")]);
    assert!(ext.iter().any(|e| e["valueBoolean"] == true));
    let encounter = resource("Encounter");
    assert_eq!(
        encounter["extension"][0]["valueCodeableConcept"]["coding"][0]["code"],
        "W4"
    );
    // The local lab code: the site's translation first, the local code kept.
    let obs = resource("Observation");
    assert_eq!(obs["code"]["coding"][0]["system"], "http://loinc.org");
    assert_eq!(obs["code"]["coding"][0]["code"], "2345-7");
    assert_eq!(obs["code"]["coding"][1]["code"], "GLU");
    // Mapped fields are not reported; the others of the Z-segments are.
    assert!(
        outcome.unmapped.contains(&"ZPI-5".to_owned()),
        "{outcome:?}"
    );
    assert!(
        !outcome
            .unmapped
            .iter()
            .any(|u| u == "ZPI-3" || u == "ZPI-4" || u == "ZPI" || u == "ZEN")
    );
    // Field maps that cannot be.
    for (from, to) in [
        ("ZPI", "Patient.extension[https://x.example/a].valueString"),
        (
            "ZPI-0",
            "Patient.extension[https://x.example/a].valueString",
        ),
        (
            "ZPI-3",
            "Patients.extension[https://x.example/a].valueString",
        ),
        (
            "ZPI-3",
            "Patient.extension[https://x.example/a].valueQuantity",
        ),
        ("ZPI-3", "Patient.extension[not a uri].valueString"),
        ("ZPI-3", "Patient.name"),
    ] {
        assert!(crate::FieldMap::parse(from, to).is_err(), "{from} -> {to}");
    }
}

#[test]
fn a_transfer_names_the_new_and_the_prior_location_each_a_location_with_its_levels() {
    let m = "MSH|^~\\&|ADT|F|HL7GW|HL7GW|20260201080000||ADT^A02^ADT_A02|C1|P|2.5.1\r\
             PID|1||1^^^H^MR||DOE^JANE\r\
             PV1|1|I|W5^202^B^HOSP||||||||||||||||V1^^^H^VN||||||||||||||||||||||||20260201073000\r";
    // PV1-6 (prior location) after PV1-3: fields 4 and 5 empty.
    let m = m.replace("|W5^202^B^HOSP||||||", "|W5^202^B^HOSP|||W4^101^A^HOSP|||");
    let (b, _) = convert_json(m.as_bytes(), &Options::default());
    let encounter = entries(&b)
        .iter()
        .find(|e| e["resource"]["resourceType"] == "Encounter")
        .map(|e| e["resource"].clone())
        .expect("an Encounter");
    let places = encounter["location"].as_array().expect("locations");
    assert_eq!(places.len(), 2, "{encounter}");
    assert_eq!(places[0]["status"], "active");
    assert_eq!(places[1]["status"], "completed");
    let bed = resolve(&b, &places[0]["location"]);
    assert_eq!(bed["name"], "B");
    assert_eq!(bed["physicalType"]["coding"][0]["code"], "bd");
    let room = resolve(&b, &bed["partOf"]);
    assert_eq!(
        (
            room["name"].as_str(),
            room["physicalType"]["coding"][0]["code"].as_str()
        ),
        (Some("202"), Some("ro"))
    );
    let ward = resolve(&b, &room["partOf"]);
    assert_eq!(ward["name"], "W5");
    let site = resolve(&b, &ward["partOf"]);
    assert_eq!(site["physicalType"]["coding"][0]["code"], "si");
    // The facility both places share is one Location, written once.
    let locations: Vec<&Json> = entries(&b)
        .iter()
        .filter(|e| e["resource"]["resourceType"] == "Location")
        .collect();
    assert_eq!(locations.len(), 7, "HOSP, W5, 202, B, W4, 101, A");
    // The same place in another message is the same Location.
    let (again, _) = convert_json(m.replace("C1", "C2").as_bytes(), &Options::default());
    let ids = |b: &Json| -> Vec<Json> {
        entries(b)
            .iter()
            .filter(|e| e["resource"]["resourceType"] == "Location")
            .map(|e| e["fullUrl"].clone())
            .collect()
    };
    assert_eq!(ids(&b), ids(&again));
}

#[test]
fn a_swap_a17_moves_two_patients_each_with_its_visit_and_results() {
    let m = "MSH|^~\\&|ADT|F|HL7GW|HL7GW|20260201080000||ADT^A17^ADT_A17|S1|P|2.5.1\r\
             EVN|A17|20260201080000\r\
             PID|1||P1^^^H^MR||ONE^ANN\r\
             PV1|1|I|W5^201^A^HOSP||||||||||||||||V1^^^H^VN\r\
             OBX|1|NM|8867-4^Heart rate^LN||72|/min\r\
             PID|2||P2^^^H^MR||TWO^BEN\r\
             PV1|1|I|W5^202^B^HOSP||||||||||||||||V2^^^H^VN\r\
             OBX|1|NM|8867-4^Heart rate^LN||80|/min\r";
    let (b, outcome) = convert_json(m.as_bytes(), &Options::default());
    let of = |ty: &str| -> Vec<Json> {
        entries(&b)
            .iter()
            .filter(|e| e["resource"]["resourceType"] == ty)
            .cloned()
            .collect()
    };
    let patients = of("Patient");
    let encounters = of("Encounter");
    assert_eq!((patients.len(), encounters.len()), (2, 2));
    // Not the owner of the demographics: created if absent; the visits are updated (ADT owns them).
    assert!(patients.iter().all(|p| p["request"]["method"] == "POST"));
    assert!(encounters.iter().all(|e| e["request"]["method"] == "PUT"));
    for (i, obs) in of("Observation").iter().enumerate() {
        assert_eq!(
            obs["resource"]["subject"]["reference"],
            patients[i]["fullUrl"]
        );
        assert_eq!(
            obs["resource"]["encounter"]["reference"],
            encounters[i]["fullUrl"]
        );
    }
    let bed = |e: &Json| resolve(&b, &e["resource"]["location"][0]["location"])["name"].clone();
    assert_eq!(
        (bed(&encounters[0]), bed(&encounters[1])),
        ("A".into(), "B".into())
    );
    assert!(outcome.unmapped.is_empty(), "{outcome:?}");
    // One patient only: refused, it is not a swap.
    let one = m.split("PID|2").next().expect("first group");
    let msg = hl7v2::Message::parse(one.as_bytes()).expect("parse");
    assert!(matches!(
        convert(&msg, Charset::Utf8, &Options::default(), &mut Vec::new()),
        Err(FhirError::Required(_))
    ));
}

#[test]
fn review_findings_stay_fixed() {
    // A suffix that is not an offset FHIR can write is not taken as "no offset" (which would give the time the
    // route's zone); an ISO date is not cut to its year; a fraction belongs to the seconds.
    let berlin = TimeZone::parse("Europe/Berlin").expect("a zone");
    for bad in [
        "202607151030-05:00",
        "202607151030-05",
        "2024-03-15",
        "202401011030+1401",
        "2024010112.5",
        "20240101120000.",
    ] {
        assert_eq!(dt_of(bad, &berlin), None, "{bad}");
    }
    assert_eq!(
        dt_of("20240101120000.5+1400", &berlin).as_deref(),
        Some("2024-01-01T12:00:00.5+14:00")
    );
    assert!(TimeZone::parse("+14:30").is_err());
    // A visit number scoped by its assigning facility (CX-6): the condition and the identifier agree.
    let m = "MSH|^~\\&|ADT|ADT1|HL7GW|HL7GW|20260201080000||ADT^A08^ADT_A01|C1|P|2.5.1\r\
             PID|1||1^^^H^MR||DOE^JANE\rPV1|1|I|||||||||||||||||V100^^^^VN^HOSP_B\r";
    let (b, _) = convert_json(m.as_bytes(), &Options::default());
    let enc = entries(&b)
        .iter()
        .find(|e| e["resource"]["resourceType"] == "Encounter")
        .expect("an Encounter");
    assert_eq!(
        enc["request"]["url"],
        "Encounter?identifier=urn:hl7gw:id:HOSP_B%7CV100"
    );
    assert_eq!(
        enc["resource"]["identifier"][0]["system"],
        "urn:hl7gw:id:HOSP_B"
    );
    // An A17 whose two PIDs name one patient is refused, not a Bundle with that Patient twice.
    let a17 = "MSH|^~\\&|ADT|F|HL7GW|HL7GW|20260201080000||ADT^A17|S1|P|2.5.1\r\
               PID|1||P1^^^H^MR\rPV1|1|I\rPID|2||P1^^^H^MR\rPV1|1|I\r";
    let msg = hl7v2::Message::parse(a17.as_bytes()).expect("parse");
    assert!(matches!(
        convert(&msg, Charset::Utf8, &Options::default(), &mut Vec::new()),
        Err(FhirError::Required(_))
    ));
    // An A40 with two merges: the second group is reported, not silently left out; a route that only
    // references Patients writes no merge and reports the MRG.
    let a40 = "MSH|^~\\&|ADT|F|HL7GW|HL7GW|20260201080000||ADT^A40^ADT_A39|M1|P|2.5.1\r\
               PID|1||P1^^^H^MR\rMRG|P0^^^H^MR\rPID|2||P2^^^H^MR\rMRG|P9^^^H^MR\r";
    let (_, outcome) = convert_json(a40.as_bytes(), &Options::default());
    assert!(
        outcome.unmapped.contains(&"PID".to_owned())
            && outcome.unmapped.contains(&"MRG".to_owned()),
        "{outcome:?}"
    );
    let reference = Options {
        write: [("Patient".to_owned(), Write::Reference)].into(),
        ..Options::default()
    };
    let (b, outcome) = convert_json(a40.as_bytes(), &reference);
    assert!(!b.to_string().contains("replaced-by"));
    assert!(outcome.unmapped.contains(&"MRG".to_owned()), "{outcome:?}");
    // Field maps in a message of several patients are not applied (ZPI could be either's): reported.
    let maps = Options {
        field_maps: vec![
            crate::FieldMap::parse(
                "ZPI-2",
                "Patient.extension[https://h.example/x].valueString",
            )
            .expect("map"),
        ],
        ..Options::default()
    };
    let two = "MSH|^~\\&|ADT|F|HL7GW|HL7GW|20260201080000||ADT^A17|S1|P|2.5.1\r\
               PID|1||P1^^^H^MR\rZPI|1|DONOR\rPV1|1|I\rPID|2||P2^^^H^MR\rZPI|1|NONE\rPV1|1|I\r";
    let (b, outcome) = convert_json(two.as_bytes(), &maps);
    assert!(!b.to_string().contains("DONOR"));
    assert!(
        outcome.unmapped.contains(&"ZPI-2".to_owned()),
        "{outcome:?}"
    );
    // A place without a facility belongs to its sender: two hospitals' W5 are two Locations.
    let at = |facility: &str| -> Vec<Json> {
        let m = format!(
            "MSH|^~\\&|ADT|{facility}|HL7GW|HL7GW|20260201080000||ADT^A01|C1|P|2.5.1\r\
             PID|1||1^^^H^MR\rPV1|1|I|W5^101||||||||||||||||V1^^^H^VN\r"
        );
        let (b, _) = convert_json(m.as_bytes(), &Options::default());
        entries(&b)
            .iter()
            .filter(|e| e["resource"]["resourceType"] == "Location")
            .map(|e| e["fullUrl"].clone())
            .collect()
    };
    assert_ne!(at("HOSP_A"), at("HOSP_B"));
}

fn dt_of(v: &str, tz: &TimeZone) -> Option<String> {
    datatypes::dtm::dtm(v, Some(tz), false)
}

#[test]
fn a_diagnosis_id_without_authority_belongs_to_its_sender() {
    let with = |facility: &str, pid: &str| -> String {
        let m = format!(
            "MSH|^~\\&|ADT|{facility}|HL7GW|HL7GW|20260201080000||ADT^A08^ADT_A01|C1|P|2.5.1\r\
             PID|1||{pid}^^^H^MR\rDG1|1||I10^Hypertension^I10||20260101|||||||||||||||1\r"
        );
        let (b, _) = convert_json(m.as_bytes(), &Options::default());
        let c = entries(&b)
            .iter()
            .find(|e| e["resource"]["resourceType"] == "Condition")
            .expect("a Condition")
            .clone();
        assert_eq!(
            c["request"]["url"]
                .as_str()
                .map(|u| u.contains("identifier=")),
            Some(true),
            "{c}"
        );
        c["request"]["url"].as_str().unwrap_or_default().to_owned()
    };
    // Two senders' DG1-20 `1`: two Conditions, not one whose subject the later message would take.
    assert_ne!(with("HOSP_A", "P1"), with("HOSP_B", "P2"));
    assert!(with("HOSP_A", "P1").contains("urn:hl7gw:id:HOSP_A%7C1"));
}

/// Issue 36, item 6: messages of 10,000 segments and more convert in time linear in their segments (no
/// search of what was already written for each segment): ADT with 10,000 unmapped Z segments and NK1s, ORU
/// with 10,000 OBX, an ORU of 40,000 patients, one of 2,500 patients with visits and orders, a VXU of 2,500
/// orders. A loose bound (a debug build on a shared machine), each well under it.
#[test]
fn messages_of_ten_thousand_segments_convert_in_linear_time() {
    const MSH: &str = "MSH|^~\\&|EPIC|MAIN|LAB|LABFAC|20240102030405+0100||";
    let pid = |i: usize| format!("PID|1||P{i}^^^HOSP^MR||DOE^JANE||19800214|F\r");
    let mut shapes: Vec<(&str, String)> = Vec::new();
    let mut adt = format!(
        "{MSH}ADT^A01^ADT_A01|BIG1|P|2.5.1\rEVN|A01|20240102\r{}",
        pid(0)
    );
    adt.push_str("PV1|1|I|W3^301^A^MAIN\r");
    for i in 0..5_000 {
        adt.push_str(&format!("NK1|{i}|DOE^JOHN{i}|SPO^Spouse^HL70063\r"));
        adt.push_str(&format!("ZPI|{i}|custom{i}|value{i}\r"));
    }
    shapes.push(("ADT^A01 with 10,000 NK1 and Z segments", adt));
    let mut oru = format!(
        "{MSH}ORU^R01^ORU_R01|BIG2|P|2.5.1\r{}OBR|1|PL1|FL1|24331-1^Lipid^LN|||20240102\r",
        pid(0)
    );
    for i in 0..10_000 {
        oru.push_str(&format!(
            "OBX|{i}|NM|2093-3^Cholesterol^LN|{i}|{i}|mg/dL|||||F|||20240102\r"
        ));
    }
    shapes.push(("ORU^R01 with 10,000 OBX", oru));
    // The search per patient of the patients and encounters already written was quadratic: 7.5 s here
    // before, 1.1 s after (debug build).
    let mut pids = format!("{MSH}ORU^R01^ORU_R01|BIG5|P|2.5.1\r");
    for i in 0..40_000 {
        pids.push_str(&pid(i));
    }
    shapes.push(("ORU^R01 of 40,000 patients", pids));
    let mut many = format!("{MSH}ORU^R01^ORU_R01|BIG3|P|2.5.1\r");
    for i in 0..2_500 {
        many.push_str(&pid(i));
        many.push_str(&format!(
            "PV1|1|O|CLINIC^{i}||||||||||||||||V{i}^^^HOSP^VN\r"
        ));
        many.push_str(&format!("OBR|1|PL{i}|FL{i}|24331-1^Lipid^LN|||20240102\r"));
        many.push_str(&format!(
            "OBX|1|NM|2093-3^Cholesterol^LN||{i}|mg/dL|||||F\r"
        ));
    }
    shapes.push(("ORU^R01 of 2,500 patients", many));
    let mut vxu = format!("{MSH}VXU^V04^VXU_V04|BIG4|P|2.5.1\r{}", pid(0));
    for i in 0..2_500 {
        vxu.push_str(&format!("ORC|RE||IZ{i}^HOSP\r"));
        vxu.push_str(&format!(
            "RXA|0|1|20240102|20240102|08^HepB^CVX|0.5|mL^mL^UCUM||00^new^NIP001||^^^CLINIC{}||||L{i}\r",
            i % 50
        ));
        vxu.push_str("RXR|IM^Intramuscular^HL70162\r");
        vxu.push_str(&format!(
            "OBX|1|CE|64994-7^Eligibility^LN|{i}|V02^VFC^HL70064||||||F\r"
        ));
    }
    shapes.push(("VXU^V04 of 2,500 orders", vxu));
    let opts = Options {
        unmapped: Unmapped::Extension,
        ..Options::default()
    };
    for (what, msg) in shapes {
        let m = hl7v2::Message::parse(msg.as_bytes()).expect("parse");
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        let outcome = convert(&m, Charset::Utf8, &opts, &mut out);
        let took = started.elapsed();
        assert!(outcome.is_ok(), "{what}: {outcome:?}");
        assert!(
            took < std::time::Duration::from_secs(4),
            "{what}: converted in {took:?}"
        );
    }
}
