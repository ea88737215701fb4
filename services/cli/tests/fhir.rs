//! `hl7gw fhir`: the toFhir step offline, its settings from a routes file or flags; each Bundle on stdout, what
//! was not mapped (or why a message was refused) on stderr.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw");

fn run(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = Command::new(BIN)
        .arg("fhir")
        .args(args)
        .output()
        .expect("hl7gw fhir");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let first = stdout
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        first,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn converts_files_with_a_routes_settings_or_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let msg = dir.path().join("a04.hl7");
    std::fs::write(
        &msg,
        "MSH|^~\\&|REG|CLINIC|HL7GW|HL7GW|20260715103000||ADT^A04^ADT_A01|C1|P|2.5.1\r\
         PID|1||55555^^^HOSP^MR||DOE^JANE||19700101|9\rZPI|1|ST MARY\r\
         PV1|1|O|||||||||||||||||V1^^^HOSP^VN|||||||||||||||||||||||||20260715103000\r",
    )
    .expect("write");
    let sex = dir.path().join("sex.csv");
    std::fs::write(
        &sex,
        "h,,,,,,,,,\nh,,,,,,,,,\n9,x,L,,,,unknown,,Unknown,http://hl7.org/fhir/administrative-gender\n",
    )
    .expect("write");
    let routes = dir.path().join("routes.yaml");
    std::fs::write(
        &routes,
        format!(
            "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: adt-to-fhir}}\nspec:\n  transforms:\n    \
             - toFhir:\n        timezone: America/New_York\n        identifierSystems: {{HOSP: 'https://hospital.example/mrn'}}\n        \
             codeMaps: {{AdministrativeSex: '{}'}}\n        fieldMaps: [{{from: ZPI-2, to: 'Patient.extension[https://hospital.example/x].valueString'}}]\n  \
             destinations: [fhir]\n",
            sex.display()
        ),
    )
    .expect("write");
    let (code, bundle, stderr) = run(&[
        "--route",
        routes.to_str().expect("utf-8"),
        msg.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(bundle["resourceType"], "Bundle");
    let patient = &bundle["entry"][0]["resource"];
    assert_eq!(
        patient["identifier"][0]["system"],
        "https://hospital.example/mrn"
    );
    assert_eq!(patient["gender"], "unknown");
    assert_eq!(patient["extension"][0]["valueString"], "ST MARY");
    assert!(
        bundle.to_string().contains("2026-07-15T10:30:00-04:00"),
        "{bundle}"
    );
    assert!(stderr.contains("resources"), "{stderr}");
    // Flags alone; one over the route's.
    let (code, bundle, _) = run(&[
        "--timezone",
        "+01:00",
        "--bundle-type",
        "message",
        msg.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0);
    assert_eq!(bundle["type"], "message");
    assert!(
        bundle.to_string().contains("2026-07-15T10:30:00+01:00"),
        "{bundle}"
    );
    // A message the converter refuses: named on stderr with its reason, exit 1.
    let anonymous = dir.path().join("anonymous.hl7");
    std::fs::write(
        &anonymous,
        "MSH|^~\\&|REG||HL7GW|HL7GW|20260715103000||ADT^A04|C2|P|2.5.1\rPID|1||55555||DOE^JANE\r",
    )
    .expect("write");
    let (code, _, stderr) = run(&[anonymous.to_str().expect("utf-8")]);
    assert_eq!(code, 1);
    assert!(stderr.contains("unscoped_patient_identity"), "{stderr}");
    let (code, _, _) = run(&["--unscoped-global", anonymous.to_str().expect("utf-8")]);
    assert_eq!(code, 0);
}

/// A routes file whose toFhir step cannot be compiled, or that is not YAML, is refused with exit 2, the reason
/// said once (the typed error and its cause, not the cause again after it) and drawn as the parser draws it.
#[test]
fn a_bad_sender_setting_is_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let routes = dir.path().join("routes.yaml");
    std::fs::write(
        &routes,
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: adt-to-fhir}\nspec:\n  transforms:\n    \
         - toFhir:\n        senders: {OLD_LAB: {timezone: Mars/Olympus_Mons}}\n  destinations: [fhir]\n",
    )
    .expect("write");
    let (code, _, stderr) = run(&["--route", routes.to_str().expect("utf-8"), "none.hl7"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("senders.OLD_LAB: toFhir"), "{stderr}");
    assert_eq!(stderr.matches("Mars/Olympus_Mons").count(), 1, "{stderr}");
    // A routes file that is not YAML: the parser's snippet as it draws it, the caret under the column.
    std::fs::write(&routes, "apiVersion: v1\nkind: [oops\n  : :\n").expect("write");
    let (code, _, stderr) = run(&["--route", routes.to_str().expect("utf-8"), "none.hl7"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("line 3 column 3"), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.trim_start().starts_with('|')
            && l.ends_with("^ illegal placement of ':' indicator")),
        "{stderr}"
    );
}
