//! ORU and ORM: reports with their results and specimens, service requests, the conditions they update by.

use super::*;

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
