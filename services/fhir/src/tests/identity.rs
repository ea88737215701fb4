//! Who a resource is: the patient's identifier and match key, who owns a resource (update, create if absent,
//! reference), a diagnosis id's authority.

use super::*;

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
