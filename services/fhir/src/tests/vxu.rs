//! VXU: immunizations with their observations.

use super::*;

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
