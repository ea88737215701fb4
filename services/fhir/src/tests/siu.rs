//! SIU: an appointment with its participants and status.

use super::*;

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
