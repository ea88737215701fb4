//! The Bundle as a whole and the route's options: the same message gives the same Bundle, message Bundles,
//! unmapped values, times and zones, a site's maps, refusals, fixed review findings, large messages.

use super::*;

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
