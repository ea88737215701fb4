//! ADT: the A01 map's resources, the Encounter's status and identity, transfers' Locations, the A17 swap.

use super::*;

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
