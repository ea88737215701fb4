use super::glob::Glob;
use super::*;
use crate::route::*;
use hl7gw_runtime::proto::v1::{Envelope, TransformRequest};
use hl7v2::{Charset, Message};
use std::sync::Arc;

const ORU_R01: &[u8] = b"MSH|^~\\&|LAB|GOOD HOSP|EPIC|X|20260101||ORU^R01|C2|P|2.5\rPID|1||12345\rOBR|1\rOBX|1|NM|GLU||5.4\r";
const ADT: &[u8] = b"MSH|^~\\&|EPIC|GOOD HOSP^1.2.3^ISO|LAB|X|20260101||ADT^A01^ADT_A01|C1|P|2.5\rPID|1||12345^^^MRN||DOE^JANE||19800101|F\rNK1|1|DOE^JOHN\rNK1|2|ROE^RICH\rZPI|1|x\r";

struct NoPlugins;
impl PluginCaller for NoPlugins {
    async fn call(&self, _: &Plugin, req: TransformRequest) -> Result<(Vec<u8>, String), String> {
        let mut m = req.message.to_vec();
        m.extend_from_slice(b"ZPL|called\r");
        Ok((m, String::new()))
    }
}

fn env_of(raw: &[u8]) -> Envelope {
    let m = Message::parse(raw).unwrap();
    Envelope {
        id: "id-1".into(),
        raw: raw.to_vec().into(),
        header: Some(hl7gw_runtime::envelope::header(m.header(), Charset::Utf8)),
        ..Envelope::default()
    }
}

fn spec(yaml: &str) -> HL7RouteSpec {
    serde_saphyr::from_str(yaml).unwrap()
}

async fn run(yaml: &str) -> Result<(Vec<u8>, &'static str), StepError> {
    let r = Route::compile("r", &spec(yaml)).unwrap();
    r.apply(&env_of(ADT), ADT, Charset::Utf8, &NoPlugins).await
}

fn get(out: &[u8], path: &str) -> Option<String> {
    Message::parse(out)
        .unwrap()
        .get_decoded(path)
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

fn glob(pattern: &str, text: &str) -> bool {
    Glob::new(pattern).matches(text)
}

#[test]
fn routes_are_indexed_by_type_and_trigger_in_evaluation_order() {
    let specs = [
        ("a-any", "destinations: [a]"),
        ("b-adt", "{match: {messageTypes: [ADT]}, destinations: [a]}"),
        (
            "c-a01",
            "{match: {messageTypes: ['ADT^A01', 'ADT^A01']}, destinations: [a]}",
        ),
        (
            "d-a02",
            "{match: {messageTypes: ['ADT^A02']}, destinations: [a]}",
        ),
        (
            "e-oru",
            "{match: {messageTypes: ['ORU^R01', 'ADT^A0?']}, destinations: [a]}",
        ),
        (
            "f-glob",
            "{match: {messageTypes: ['A*^A01']}, destinations: [a]}",
        ),
        (
            "g-both",
            "{match: {messageTypes: ['ADT^A01', 'ADT^*']}, destinations: [a]}",
        ),
        (
            "h-oru",
            "{match: {messageTypes: ['ORU']}, destinations: [a]}",
        ),
    ];
    let routes = Routes::new(
        specs
            .iter()
            .rev()
            .map(|(n, y)| Arc::new(Route::compile(n, &spec(y)).unwrap()))
            .collect(),
    );
    let names = |ty: &str, tr: &str| -> Vec<String> {
        routes.candidates(ty, tr).map(|r| r.name.clone()).collect()
    };
    assert_eq!(
        names("ADT", "A01"),
        ["a-any", "b-adt", "c-a01", "e-oru", "f-glob", "g-both"]
    );
    assert_eq!(
        names("ADT", "A02"),
        ["a-any", "b-adt", "d-a02", "e-oru", "f-glob", "g-both"]
    );
    assert_eq!(names("ORU", "R01"), ["a-any", "e-oru", "f-glob", "h-oru"]);
    assert_eq!(names("SIU", "S12"), ["a-any", "f-glob"]);
    // The index only narrows: what matches is what a scan of every route matches.
    for raw in [ADT, ORU_R01] {
        let (m, env) = (Message::parse(raw).unwrap(), env_of(raw));
        let h = env.header.clone().unwrap_or_default();
        let scan: Vec<&str> = routes
            .routes
            .iter()
            .filter(|r| r.matches(&env, &m, Charset::Utf8).is_ok())
            .map(|r| r.name.as_str())
            .collect();
        let indexed: Vec<&str> = routes
            .candidates(&h.message_type, &h.trigger_event)
            .filter(|r| r.matches(&env, &m, Charset::Utf8).is_ok())
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(scan, indexed);
        assert!(!scan.is_empty());
    }
}

#[test]
fn globs() {
    assert!(!Glob::new("ADT*").is_literal() && Glob::new("ADT").is_literal());
    assert!(glob("ADT*", "ADT"));
    assert!(glob("AD*", "ADT"));
    assert!(!glob("AD*", "AT"));
    assert!(glob("A*T", "ADT"));
    assert!(glob("A?T", "ADT"));
    assert!(!glob("A?", "ADT"));
    assert!(glob("ADT", "ADT"));
    assert!(glob("A0?", "A01"));
    assert!(glob("*", ""));
    assert!(glob("2.5*", "2.5.1"));
    assert!(!glob("A0?", "A011"));
    assert!(!glob("ORU", "ADT"));
}

#[test]
fn matching_uses_type_trigger_sender_version_and_predicates() {
    let adt = (Message::parse(ADT).unwrap(), env_of(ADT));
    // Test traffic (MSH-11 T) only through a route that names HL7GW-TEST.
    let test = b"MSH|^~\\&|HL7GW-TEST|GOOD HOSP|B|G|20260101||ADT^A01|T1|T|2.5\rPID|1||P1\r";
    let test = (Message::parse(test).unwrap(), env_of(test));
    let takes = |(m, env): &(Message<'_>, Envelope), matches: &str| {
        let yaml = format!("{{match: {matches}, destinations: [a]}}");
        let route = Route::compile("r", &spec(&yaml)).unwrap();
        route.matches(env, m, Charset::Utf8)
    };
    for (taken, msg, matches) in [
        (true, &adt, "{}"),
        (true, &adt, "{messageTypes: ['ADT^A0?']}"),
        (true, &adt, "{messageTypes: [ADT]}"),
        (false, &adt, "{messageTypes: ['ORU^*']}"),
        (true, &adt, "{sendingFacilities: ['GOOD HOSP']}"),
        (false, &adt, "{sendingApplications: [LAB]}"),
        (true, &adt, "{versions: ['2.5*']}"),
        (false, &test, "{messageTypes: [ADT]}"),
        (false, &test, "{}"),
        (true, &test, "{sendingApplications: [HL7GW-TEST]}"),
        (true, &adt, "{where: [{path: PID-8, equals: F}]}"),
        (false, &adt, "{where: [{path: PID-8, in: [M, U]}]}"),
        (true, &adt, "{where: [{path: PID-3-1, regex: '[0-9]+'}]}"),
        (false, &adt, "{where: [{path: PID-3-1, regex: '[0-9]'}]}"),
        (true, &adt, "{where: [{path: PID-19, exists: false}]}"),
    ] {
        assert_eq!(takes(msg, matches).is_ok(), taken, "{matches}");
    }
    let miss = takes(&adt, "{where: [{path: PID-19, exists: true}]}");
    assert_eq!(miss.unwrap_err().to_string(), "where PID-19");
}

#[test]
fn bad_routes_are_refused_with_a_reason() {
    let bad = [
        ("destinations: []", "destinations"),
        ("destinations: ['a b']", "destinations"),
        (
            "{transforms: [{set: {path: PID, value: x}}], destinations: [a]}",
            "transforms[0]",
        ),
        ("{transforms: [{}], destinations: [a]}", "exactly one"),
        (
            "{transforms: [{clear: {path: PID-5}, mask: {path: PID-5}}], destinations: [a]}",
            "exactly one",
        ),
        (
            "{transforms: [{toJson: {}}, {clear: {path: PID-5}}], destinations: [a]}",
            "toJson",
        ),
        (
            "{match: {where: [{path: PID-3, regex: '('}]}, destinations: [a]}",
            "regex",
        ),
        (
            "{match: {where: [{path: PID-3}]}, destinations: [a]}",
            "exactly one",
        ),
        (
            "{transforms: [{deleteSegment: {segment: MSH}}], destinations: [a]}",
            "MSH",
        ),
        (
            "{transforms: [{plugin: {endpoint: 'tcp://x'}}], destinations: [a]}",
            "endpoint",
        ),
        (
            "{transforms: [{hash: {path: PID-3, saltEnv: HL7GW_NO_SUCH_VAR}}], destinations: [a]}",
            "HL7GW_NO_SUCH_VAR",
        ),
        (
            "{transforms: [{renameSegment: {from: ZPI, to: ZPI}}], destinations: [a]}",
            "renameSegment",
        ),
        ("{keyPaths: [PID], destinations: [a]}", "keyPaths"),
        (
            "{transforms: [{plugin: {endpoint: 'https://deid:1', onFailure: skip}}, {hash: {path: PID-3-1}}], destinations: [a]}",
            "onFailure: skip is not allowed",
        ),
    ];
    for (y, want) in bad {
        let e = Route::compile("r", &spec(y)).unwrap_err().to_string();
        assert!(e.contains(want), "{y}: {e}");
    }
}

#[tokio::test]
async fn transforms_edit_the_message() {
    let (out, ct) = run("{transforms: [
            {set: {path: MSH-5, value: 'NEW^APP'}},
            {copy: {from: PID-3-1, to: PID-2}},
            {clear: {path: PID-7}},
            {map: {path: PID-8, table: {F: female}, default: unknown}},
            {deleteSegment: {segment: NK1}},
            {renameSegment: {from: ZPI, to: ZPX}},
            {mask: {path: PID-5}},
            {hash: {path: PID-3-1}}
        ], destinations: [a]}")
    .await
    .unwrap();
    assert_eq!(ct, HL7_CONTENT_TYPE);
    assert_eq!(
        get(&out, "MSH-5").as_deref(),
        Some("NEW^APP"),
        "set escapes"
    );
    assert_eq!(get(&out, "PID-2").as_deref(), Some("12345"));
    assert_eq!(get(&out, "PID-7"), None);
    assert_eq!(get(&out, "PID-8").as_deref(), Some("female"));
    assert_eq!(get(&out, "NK1-1"), None);
    assert_eq!(get(&out, "ZPX-1").as_deref(), Some("1"));
    assert_eq!(get(&out, "PID-5").as_deref(), Some("***"));
    let hashed = get(&out, "PID-3-1").unwrap();
    assert_eq!(hashed.len(), 64);
    assert_ne!(hashed, "12345");
    assert!(
        !String::from_utf8_lossy(&out).contains("DOE"),
        "no PHI left: {}",
        String::from_utf8_lossy(&out)
    );
}

#[tokio::test]
async fn key_paths_read_the_transformed_message() {
    let r = Route::compile(
        "r",
        &spec("{transforms: [{hash: {path: PID-3-1}}, {toJson: {}}], keyPaths: [MSH-4-1, PID-3-1], destinations: [a]}"),
    )
    .unwrap();
    let a = r
        .run(&env_of(ADT), ADT, Charset::Utf8, &NoPlugins)
        .await
        .unwrap();
    assert_eq!(a.content_type, JSON_CONTENT_TYPE);
    let key = a.key.unwrap();
    assert!(
        key.starts_with("GOOD HOSP|") && key.len() == 10 + 64,
        "{key}"
    );
    assert!(!key.contains("12345"));
    let plain = Route::compile("p", &spec("destinations: [a]")).unwrap();
    let a = plain
        .run(&env_of(ADT), ADT, Charset::Utf8, &NoPlugins)
        .await
        .unwrap();
    assert_eq!(a.key, None, "no keyPaths: the inbound key");
}

#[tokio::test]
async fn to_json_is_the_canonical_form_and_plugins_run_after() {
    let (out, ct) = run("{transforms: [{toJson: {}}], destinations: [a]}")
        .await
        .unwrap();
    assert_eq!(ct, JSON_CONTENT_TYPE);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["format"], "hl7gw.canonical.v1");
    assert_eq!(v["messageType"], "ADT");
    assert_eq!(v["controlId"], "C1");
    assert_eq!(v["flat"]["PID(1)-3(1)-1-1"], "12345");
    assert_eq!(v["flat"]["NK1(2)-2(1)-1-1"], "ROE");
    assert_eq!(v["segments"][3], "NK1");

    let (out, _) =
        run("{transforms: [{plugin: {endpoint: 'http://127.0.0.1:1'}}], destinations: [a]}")
            .await
            .unwrap();
    assert!(out.ends_with(b"ZPL|called\r"));
}

#[tokio::test]
async fn to_fhir_makes_a_bundle_and_takes_its_settings_from_the_route() {
    let (out, ct) = run(
        "{transforms: [{mask: {path: PID-5}}, {toFhir: {bundleType: message, identifierSystems: \
         {HOSP: 'https://hospital.example/mrn'}}}], destinations: [a]}",
    )
    .await
    .unwrap();
    assert_eq!(ct, FHIR_CONTENT_TYPE);
    let b: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(b["type"], "message");
    assert_eq!(b["entry"][0]["resource"]["resourceType"], "MessageHeader");
    let patient = &b["entry"][1]["resource"];
    assert_eq!(patient["resourceType"], "Patient");
    // The steps before it ran first: the name is masked.
    assert_ne!(patient["name"][0]["family"], "DOE");

    let e = Route::compile(
        "r",
        &spec("{transforms: [{toFhir: {}}, {toJson: {}}], destinations: [a]}"),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("only plugin steps may follow"),
        "{e}"
    );
    let e = Route::compile(
        "r",
        &spec("{transforms: [{toFhir: {timezone: 'Central/Europe'}}], destinations: [a]}"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("timezone"), "{e}");
    for bad in [
        "{toFhir: {senders: {LAB: {timezone: '+25:00'}}}}",
        "{toFhir: {write: {Patients: reference}}}",
        "{toFhir: {write: {Patient: replace}}}",
    ] {
        let yaml = format!("{{transforms: [{bad}], destinations: [a]}}");
        assert!(
            serde_saphyr::from_str::<HL7RouteSpec>(&yaml)
                .map_err(|e| e.to_string())
                .and_then(|s| Route::compile("r", &s).map_err(|e| e.to_string()))
                .is_err(),
            "{bad} accepted"
        );
    }
}

#[tokio::test]
async fn to_fhir_takes_iana_zones_write_modes_senders_and_refuses_unscoped_patients() {
    let (out, _) = run(
        "{transforms: [{toFhir: {timezone: America/New_York, write: {Patient: reference}, \
         patientIdentifier: {authority: MRN}, senders: {HIS: {authority: HIS_MRN, timezone: Europe/Berlin}}, \
         unscopedIdentifiers: refuse}}], destinations: [a]}",
    )
    .await
    .unwrap();
    let b: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(
        b["entry"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["resource"]["resourceType"] != "Patient"),
        "{b}"
    );
    // A patient identifier that names no authority, from a sender without MSH-4: refused by its own kind.
    let anonymous =
        b"MSH|^~\\&|APP||HL7GW|HL7GW|20240101||ADT^A04|1|P|2.5.1\rPID|1||55555||DOE^JANE\r";
    let r = Route::compile(
        "r",
        &spec("{transforms: [{toFhir: {}}], destinations: [a]}"),
    )
    .unwrap();
    let e = r
        .apply(&env_of(anonymous), anonymous, Charset::Utf8, &NoPlugins)
        .await
        .unwrap_err();
    assert_eq!(e.kind, "unscoped_patient_identity", "{e}");
    let global = Route::compile(
        "r",
        &spec("{transforms: [{toFhir: {unscopedIdentifiers: global}}], destinations: [a]}"),
    )
    .unwrap();
    let (out, _) = global
        .apply(&env_of(anonymous), anonymous, Charset::Utf8, &NoPlugins)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out).contains("urn:hl7gw:id:unknown"));
}

#[tokio::test]
async fn a_failing_step_names_route_step_and_kind() {
    let e = run("{transforms: [{set: {path: 'OBX(3)-5', value: x}}], destinations: [a]}")
        .await
        .unwrap_err();
    assert_eq!((e.step, e.kind), (0, "edit"));
    assert!(e.to_string().contains("OBX"), "{e}");
}
