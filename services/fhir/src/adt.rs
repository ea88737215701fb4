//! ADT messages (the IG's ADT_A01 map and the triggers that share its structure): MSH → MessageHeader,
//! EVN → Provenance, PID → Patient, NK1 → RelatedPerson, PV1/PV2 → Encounter (and Practitioners from its
//! XCN fields), OBX → Observation, AL1 → AllergyIntolerance, DG1 → Condition, IN1 → Coverage, and a
//! Provenance of the transformation.

use crate::dt::{Ctx, Table, Target};
use crate::json::Writer;
use crate::vocab;
use crate::{BundleType, FhirError, Outcome, Unmapped};
use hl7v2::message::{Segment, Value};

/// The fields each segment map writes (the rest, when valued, are reported as unmapped).
const PID_MAPPED: &[usize] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 19, 24, 25, 29, 30,
];
const PV1_MAPPED: &[usize] = &[1, 2, 3, 4, 7, 8, 9, 10, 14, 17, 19, 36, 44, 45];
const PV2_MAPPED: &[usize] = &[3];
const NK1_MAPPED: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16];
const AL1_MAPPED: &[usize] = &[1, 2, 3, 4, 5, 6];
const DG1_MAPPED: &[usize] = &[1, 3, 4, 5, 19, 20];
const IN1_MAPPED: &[usize] = &[1, 2, 3, 4, 12, 13, 15, 17];
const OBX_MAPPED: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 11, 14];
const EVN_MAPPED: &[usize] = &[1, 2, 4, 6];
const MSH_MAPPED: &[usize] = &[3, 4, 5, 6, 7, 9, 10, 11, 12, 18];

/// XCN fields of PV1 and their participation types (v3-ParticipationType).
const PV1_PARTICIPANTS: &[(usize, &str, &str)] = &[
    (7, "ATND", "attender"),
    (8, "REF", "referrer"),
    (9, "CON", "consultant"),
    (17, "ADM", "admitter"),
];

pub(crate) fn convert(
    cx: &mut Ctx<'_, '_>,
    kind: &str,
    out: &mut Vec<u8>,
) -> Result<Outcome, FhirError> {
    let msg = cx.msg;
    let pid = msg.segment("PID", 1).ok_or(FhirError::Missing {
        message: kind.to_owned(),
        segment: "PID",
    })?;
    let pv1 = msg.segment("PV1", 1);
    let key = cx.message_key();
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();

    // The patient: by its first identifier (PID-3, else PID-2/4), else by the message.
    let patient_id = [3, 2, 4]
        .iter()
        .flat_map(|&n| cx.reps(&pid, n))
        .find_map(|cx_| cx.cx_key(cx_));
    let patient = match &patient_id {
        Some((s, v)) => cx.target("Patient", &[s, v], Some((s.clone(), v.clone()))),
        None => cx.target("Patient", &msg_key, None),
    };
    let patient_key = patient.id.clone();
    let encounter =
        pv1.as_ref().map(
            |pv1| match cx.reps(pv1, 19).into_iter().find_map(|v| cx.cx_key(v)) {
                Some((s, v)) => cx.target("Encounter", &[&s, &v], Some((s.clone(), v.clone()))),
                None => cx.target("Encounter", &msg_key, None),
            },
        );
    let practitioners: Vec<(usize, &str, &str, Target, Value<'_>)> = match &pv1 {
        Some(pv1) => PV1_PARTICIPANTS
            .iter()
            .flat_map(|&(n, code, display)| {
                cx.reps(pv1, n)
                    .into_iter()
                    .map(move |xcn| (n, code, display, xcn))
            })
            .filter_map(|(n, code, display, xcn)| {
                let t = practitioner_target(cx, xcn)?;
                Some((n, code, display, t, xcn))
            })
            .collect(),
        None => Vec::new(),
    };

    let mut w = Writer::new(out);
    w.begin_object();
    w.string("resourceType", "Bundle");
    let bundle_id = crate::dt::uuid_of("Bundle", &msg_key);
    w.string("id", &bundle_id);
    w.object("identifier");
    if let Some(system) = cx.hd_system(cx.msh(3), false) {
        w.string("system", &system);
    }
    w.string("value", &key[2]);
    w.end_object();
    let bundle_type = cx.opts.bundle_type;
    w.string(
        "type",
        match bundle_type {
            BundleType::Transaction => "transaction",
            BundleType::Message => "message",
        },
    );
    let msh7 = cx.text(cx.msh(7));
    let timestamp = msh7
        .as_deref()
        .and_then(|t| cx.instant(t))
        .or_else(|| cx.opts.received_at.clone());
    if let Some(ts) = &timestamp {
        w.string("timestamp", ts);
    }
    w.array("entry");

    // Every entry's fullUrl, for the MessageHeader's focus and the Provenance's targets.
    let mut targets: Vec<String> = Vec::new();
    if bundle_type == BundleType::Message {
        message_header(cx, &mut w, &msg_key, &patient, encounter.as_ref())?;
    }

    // Patient.
    cx.begin_entry(&mut w, &patient);
    patient_body(cx, &mut w, &pid);
    cx.end_entry(&mut w, &patient);
    targets.push(patient.full_url());
    cx.note_unmapped(&pid, PID_MAPPED);

    // Practitioners of the visit (each once).
    let mut seen: Vec<String> = Vec::new();
    for (_, _, _, t, xcn) in &practitioners {
        if seen.contains(&t.id) {
            continue;
        }
        seen.push(t.id.clone());
        cx.begin_entry(&mut w, t);
        practitioner_body(cx, &mut w, *xcn);
        cx.end_entry(&mut w, t);
        targets.push(t.full_url());
    }

    // Encounter.
    if let (Some(pv1), Some(enc)) = (&pv1, &encounter) {
        let pv2 = msg.segment("PV2", 1);
        cx.begin_entry(&mut w, enc);
        encounter_body(
            cx,
            &mut w,
            kind,
            pv1,
            pv2.as_ref(),
            &patient,
            &practitioners,
        );
        cx.end_entry(&mut w, enc);
        targets.push(enc.full_url());
        cx.note_unmapped(pv1, PV1_MAPPED);
        if let Some(pv2) = &pv2 {
            cx.note_unmapped(pv2, PV2_MAPPED);
        }
    }

    // The repeating segments, in message order.
    let mut evn = None;
    for (i, seg) in msg.segments().enumerate() {
        let name = seg.name();
        let n = i.to_string();
        match name {
            b"MSH" => cx.note_unmapped(&seg, MSH_MAPPED),
            b"PID" | b"PV1" | b"PV2" => {}
            b"EVN" => evn = Some(seg),
            b"NK1" => {
                let t = cx.target(
                    "RelatedPerson",
                    &[&patient_key, "NK1", &n_key(cx, &seg, &n)],
                    None,
                );
                cx.begin_entry(&mut w, &t);
                related_person_body(cx, &mut w, &seg, &patient);
                cx.end_entry(&mut w, &t);
                targets.push(t.full_url());
                cx.note_unmapped(&seg, NK1_MAPPED);
            }
            b"AL1" => {
                let code = cx.field(&seg, 3).unwrap_or_default();
                let t = cx.target(
                    "AllergyIntolerance",
                    &[&patient_key, "AL1", &code, &n],
                    None,
                );
                cx.begin_entry(&mut w, &t);
                allergy_body(cx, &mut w, &seg, &patient);
                cx.end_entry(&mut w, &t);
                targets.push(t.full_url());
                cx.note_unmapped(&seg, AL1_MAPPED);
            }
            b"DG1" => {
                let by = seg
                    .field(20)
                    .and_then(|f| f.repetition(1))
                    .and_then(|ei| ei_key(cx, ei));
                let code = cx.field(&seg, 3).unwrap_or_default();
                let t = match by {
                    Some((s, v)) => cx.target("Condition", &[&s, &v], Some((s.clone(), v.clone()))),
                    None => cx.target("Condition", &[&patient_key, "DG1", &code, &n], None),
                };
                cx.begin_entry(&mut w, &t);
                condition_body(cx, &mut w, &seg, &patient);
                cx.end_entry(&mut w, &t);
                targets.push(t.full_url());
                cx.note_unmapped(&seg, DG1_MAPPED);
            }
            b"IN1" => {
                let t = cx.target(
                    "Coverage",
                    &[&patient_key, "IN1", &n_key(cx, &seg, &n)],
                    None,
                );
                cx.begin_entry(&mut w, &t);
                coverage_body(cx, &mut w, &seg, &patient);
                cx.end_entry(&mut w, &t);
                targets.push(t.full_url());
                cx.note_unmapped(&seg, IN1_MAPPED);
            }
            b"OBX" => {
                let code = cx.field(&seg, 3).unwrap_or_default();
                let t = cx.target("Observation", &[&msg_key.join("|"), "OBX", &code, &n], None);
                cx.begin_entry(&mut w, &t);
                observation_body(cx, &mut w, &seg, &patient, encounter.as_ref());
                cx.end_entry(&mut w, &t);
                targets.push(t.full_url());
                cx.note_unmapped(&seg, OBX_MAPPED);
            }
            _ => cx.note_unmapped_segment(&seg),
        }
    }

    // The Provenance of this transformation (and of the event, EVN).
    let prov = cx.target("Provenance", &msg_key, None);
    cx.begin_entry(&mut w, &prov);
    provenance_body(cx, &mut w, &targets, evn.as_ref(), timestamp.as_deref());
    cx.end_entry(&mut w, &prov);
    if let Some(evn) = &evn {
        cx.note_unmapped(evn, EVN_MAPPED);
    }
    w.end_array();

    // What no map covered, with its values, when the route keeps them.
    if cx.opts.unmapped == Unmapped::Extension && !cx.unmapped_values.is_empty() {
        w.object("meta");
        w.array("extension");
        for (id, value) in &cx.unmapped_values {
            w.begin_object();
            w.string("url", "https://hl7gw.io/fhir/StructureDefinition/unmapped");
            w.string_parts("valueString", &[id, "=", value]);
            w.end_object();
        }
        w.end_array();
        w.end_object();
    }
    w.end_object();
    Ok(Outcome {
        resources: cx.resources,
        unmapped: std::mem::take(&mut cx.unmapped),
    })
}

/// A repeating segment's key within the patient: its set id (field 1), else its position.
fn n_key(cx: &Ctx<'_, '_>, seg: &Segment<'_>, position: &str) -> String {
    cx.field(seg, 1)
        .map(|s| s.into_owned())
        .unwrap_or_else(|| position.to_owned())
}

/// EI → (system, value): EI-1 with the authority of EI-2..4.
fn ei_key(cx: &Ctx<'_, '_>, ei: Value<'_>) -> Option<(String, String)> {
    let value = cx.comp(ei, 1)?;
    let ns = cx.comp(ei, 2);
    let system = match (cx.comp(ei, 3), cx.comp(ei, 4).as_deref()) {
        (Some(uid), Some("ISO")) if crate::dt::is_oid(&uid) => format!("urn:oid:{uid}"),
        (Some(uid), Some("URI" | "URL")) => uid.into_owned(),
        _ => match ns {
            Some(ns) => cx
                .opts
                .identifier_systems
                .get(ns.as_ref())
                .cloned()
                .unwrap_or_else(|| {
                    let mut s = cx
                        .opts
                        .identifier_system_prefix
                        .clone()
                        .unwrap_or_else(|| "urn:hl7gw:id:".to_owned());
                    crate::dt::percent_encode(&mut s, &ns);
                    s
                }),
            None => "urn:hl7gw:id:unknown".to_owned(),
        },
    };
    Some((system, value.into_owned()))
}

fn reference(w: &mut Writer<'_>, key: &str, t: &Target) {
    w.object(key);
    w.string_parts("reference", &["urn:uuid:", &t.id]);
    w.end_object();
}

fn message_header(
    cx: &mut Ctx<'_, '_>,
    w: &mut Writer<'_>,
    msg_key: &[&str],
    patient: &Target,
    encounter: Option<&Target>,
) -> Result<(), FhirError> {
    let t = cx.target("MessageHeader", msg_key, None);
    cx.begin_entry(w, &t);
    let trigger = cx
        .text(cx.msh(9).and_then(|f| f.component(2)))
        .ok_or(FhirError::Required("MSH-9.2"))?;
    w.object("eventCoding");
    w.string("system", "http://terminology.hl7.org/CodeSystem/v2-0003");
    w.string("code", &trigger);
    w.end_object();
    let dest_app = cx.text(cx.msh(5).and_then(|f| f.component(1)));
    if let Some(d) = &dest_app {
        w.array("destination");
        w.begin_object();
        w.string("name", d);
        let mut endpoint = "urn:hl7gw:application:".to_owned();
        crate::dt::percent_encode(&mut endpoint, d);
        w.string("endpoint", &endpoint);
        w.end_object();
        w.end_array();
    }
    let src = cx
        .text(cx.msh(3).and_then(|f| f.component(1)))
        .unwrap_or(std::borrow::Cow::Borrowed("unknown"));
    w.object("source");
    w.string("name", &src);
    let endpoint = cx
        .hd_system(cx.msh(3), false)
        .filter(|s| s.starts_with("urn:oid:") || s.contains("://"))
        .unwrap_or_else(|| {
            let mut e = "urn:hl7gw:application:".to_owned();
            crate::dt::percent_encode(&mut e, &src);
            e
        });
    w.string("endpoint", &endpoint);
    w.end_object();
    w.array("focus");
    w.begin_object();
    w.string_parts("reference", &["urn:uuid:", &patient.id]);
    w.end_object();
    if let Some(e) = encounter {
        w.begin_object();
        w.string_parts("reference", &["urn:uuid:", &e.id]);
        w.end_object();
    }
    w.end_array();
    cx.end_entry(w, &t);
    Ok(())
}

fn patient_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, pid: &Segment<'_>) {
    // Extensions first (FHIR JSON orders nothing, but readers expect them near the top).
    let maiden = pid
        .field(6)
        .and_then(|f| f.repetition(1))
        .and_then(|x| cx.text(x.component(1).and_then(|c| c.subcomponent(1))));
    let birth = cx.field(pid, 7);
    let birth_time = birth
        .as_deref()
        .filter(|b| b.len() > 8)
        .and_then(|b| cx.date_time(b))
        .filter(|d| d.len() > 10);
    let religion = pid.field(17).and_then(|f| f.repetition(1));
    let has_religion = religion.is_some_and(|r| cx.cwe_valued(r));
    if maiden.is_some() || has_religion {
        w.array("extension");
        if let Some(m) = &maiden {
            w.begin_object();
            w.string(
                "url",
                "http://hl7.org/fhir/StructureDefinition/patient-mothersMaidenName",
            );
            w.string("valueString", m);
            w.end_object();
        }
        if has_religion {
            w.begin_object();
            w.string(
                "url",
                "http://hl7.org/fhir/StructureDefinition/patient-religion",
            );
            cx.codeable_concept(
                w,
                "valueCodeableConcept",
                religion,
                Some(Table::new("Religion", "HL70006")),
            );
            w.end_object();
        }
        w.end_array();
    }
    let ids: Vec<(Value<'_>, Option<&str>)> = [(2, None), (3, None), (4, None)]
        .iter()
        .flat_map(|&(n, t)| cx.reps(pid, n).into_iter().map(move |v| (v, t)))
        .collect();
    let ssn = cx.field(pid, 19);
    if !ids.is_empty() || ssn.is_some() {
        w.array("identifier");
        for (v, t) in ids {
            cx.identifier(w, v, t);
        }
        if let Some(ssn) = &ssn {
            w.begin_object();
            w.object("type");
            w.array("coding");
            w.begin_object();
            w.string("system", "http://terminology.hl7.org/CodeSystem/v2-0203");
            w.string("code", "SS");
            w.end_object();
            w.end_array();
            w.end_object();
            w.string("system", "http://hl7.org/fhir/sid/us-ssn");
            w.string("value", ssn);
            w.end_object();
        }
        w.end_array();
    }
    let names: Vec<Value<'_>> = cx.reps(pid, 5).into_iter().chain(cx.reps(pid, 9)).collect();
    write_items(w, "name", &names, |w, v| cx.human_name(w, *v));
    let phones: Vec<(Value<'_>, &str)> = cx
        .reps(pid, 13)
        .into_iter()
        .map(|v| (v, "home"))
        .chain(cx.reps(pid, 14).into_iter().map(|v| (v, "work")))
        .collect();
    write_items(w, "telecom", &phones, |w, (v, u)| {
        cx.contact_point(w, *v, Some(u))
    });
    if let Some(g) = cx.field(pid, 8) {
        let code = vocab::lookup("AdministrativeSex", &g).map_or("unknown", |c| c.code);
        w.string("gender", code);
    }
    if let Some(b) = birth.as_deref().and_then(|b| cx.date(b)) {
        w.string("birthDate", &b);
        if let Some(t) = birth_time {
            w.object("_birthDate");
            w.array("extension");
            w.begin_object();
            w.string(
                "url",
                "http://hl7.org/fhir/StructureDefinition/patient-birthTime",
            );
            w.string("valueDateTime", &t);
            w.end_object();
            w.end_array();
            w.end_object();
        }
    }
    if let Some(d) = cx.field(pid, 29).and_then(|d| cx.date_time(&d)) {
        w.string("deceasedDateTime", &d);
    } else if let Some(b) = cx.field(pid, 30).and_then(|f| yes_no(&f)) {
        w.bool("deceasedBoolean", b);
    }
    let addresses = cx.reps(pid, 11);
    write_items(w, "address", &addresses, |w, v| cx.address(w, *v));
    cx.codeable_concept(
        w,
        "maritalStatus",
        pid.field(16).and_then(|f| f.repetition(1)),
        Some(Table::new("MaritalStatus", "HL70002")),
    );
    if let Some(n) = cx
        .field(pid, 25)
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
    {
        w.number("multipleBirthInteger", &n);
    } else if let Some(b) = cx.field(pid, 24).and_then(|f| yes_no(&f)) {
        w.bool("multipleBirthBoolean", b);
    }
    let language = pid.field(15).and_then(|f| f.repetition(1));
    if language.is_some_and(|l| cx.cwe_valued(l)) {
        w.array("communication");
        w.begin_object();
        cx.codeable_concept(
            w,
            "language",
            language,
            Some(Table {
                fhir_only: true,
                ..Table::new("PrimaryLanguage", "HL70296")
            }),
        );
        w.end_object();
        w.end_array();
    }
}

/// Writes `items` as an array under `key`, or nothing when none of them writes anything.
fn write_items<T>(
    w: &mut Writer<'_>,
    key: &str,
    items: &[T],
    mut one: impl FnMut(&mut Writer<'_>, &T) -> bool,
) {
    if items.is_empty() {
        return;
    }
    let (mark, had) = (w.len(), w.has_members());
    w.array(key);
    let mut any = false;
    for it in items {
        any |= one(w, it);
    }
    w.end_array();
    if !any {
        w.truncate(mark, had);
    }
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "Y" => Some(true),
        "N" => Some(false),
        _ => None,
    }
}

/// A practitioner from an XCN: by its id (XCN-1, authority XCN-9), else by its name.
fn practitioner_target(cx: &Ctx<'_, '_>, xcn: Value<'_>) -> Option<Target> {
    let id = cx.comp(xcn, 1);
    let family = cx.text(xcn.component(2).and_then(|c| c.subcomponent(1)));
    let given = cx.comp(xcn, 3);
    match id {
        Some(id) => {
            let system = cx
                .hd_system(xcn.component(9), true)
                .unwrap_or_else(|| "urn:hl7gw:id:practitioner".to_owned());
            let id = id.into_owned();
            Some(cx.target(
                "Practitioner",
                &[&system, &id],
                Some((system.clone(), id.clone())),
            ))
        }
        None if family.is_some() || given.is_some() => Some(cx.target(
            "Practitioner",
            &[
                family.as_deref().unwrap_or_default(),
                given.as_deref().unwrap_or_default(),
            ],
            None,
        )),
        None => None,
    }
}

fn practitioner_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, xcn: Value<'_>) {
    if let Some(id) = cx.comp(xcn, 1) {
        let system = cx
            .hd_system(xcn.component(9), true)
            .unwrap_or_else(|| "urn:hl7gw:id:practitioner".to_owned());
        w.array("identifier");
        w.begin_object();
        w.string("system", &system);
        w.string("value", &id);
        w.end_object();
        w.end_array();
    }
    let family = cx.text(xcn.component(2).and_then(|c| c.subcomponent(1)));
    let given = [cx.comp(xcn, 3), cx.comp(xcn, 4)];
    let suffix = cx.comp(xcn, 5);
    let prefix = cx.comp(xcn, 6);
    if family.is_some() || given.iter().any(Option::is_some) {
        w.array("name");
        w.begin_object();
        if let Some(f) = &family {
            w.string("family", f);
        }
        if given.iter().any(Option::is_some) {
            w.array("given");
            for g in given.iter().flatten() {
                w.item_string(g);
            }
            w.end_array();
        }
        if let Some(p) = &prefix {
            w.array("prefix");
            w.item_string(p);
            w.end_array();
        }
        if let Some(s) = &suffix {
            w.array("suffix");
            w.item_string(s);
            w.end_array();
        }
        w.end_object();
        w.end_array();
    }
}

#[allow(clippy::too_many_arguments)]
fn encounter_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    kind: &str,
    pv1: &Segment<'_>,
    pv2: Option<&Segment<'_>>,
    patient: &Target,
    practitioners: &[(usize, &str, &str, Target, Value<'_>)],
) {
    let visits = cx.reps(pv1, 19);
    write_items(w, "identifier", &visits, |w, v| {
        cx.identifier(w, *v, Some("VN"))
    });
    // Status: discharged when PV1-45 is valued, else by the event (the IG's Event[EncounterStatus] map).
    let trigger = kind.split('^').nth(1).unwrap_or_default();
    let status = if cx.field(pv1, 45).is_some() {
        "finished"
    } else {
        vocab::lookup("Event[EncounterStatus]", trigger).map_or("unknown", |c| c.code)
    };
    w.string("status", status);
    // Class (1..1): PatientClass[EncounterClass], else unknown.
    w.object("class");
    match cx
        .field(pv1, 2)
        .and_then(|c| vocab::lookup("PatientClass[EncounterClass]", &c))
    {
        Some(c) => {
            w.string("system", c.system);
            w.string("code", c.code);
            if !c.display.is_empty() {
                w.string("display", c.display);
            }
        }
        None => {
            w.string(
                "system",
                "http://terminology.hl7.org/CodeSystem/v3-NullFlavor",
            );
            w.string("code", "UNK");
            w.string("display", "unknown");
        }
    }
    w.end_object();
    let admission = pv1.field(4).and_then(|f| f.repetition(1));
    if admission.is_some_and(|a| cx.cwe_valued(a)) {
        w.array("type");
        cx.codeable_concept_item(
            w,
            admission.expect("checked"),
            Some(Table::new("AdmissionType", "HL70007")),
        );
        w.end_array();
    }
    cx.codeable_concept(
        w,
        "serviceType",
        pv1.field(10).and_then(|f| f.repetition(1)),
        Some(Table::new("HospitalService", "HL70069")),
    );
    reference(w, "subject", patient);
    if !practitioners.is_empty() {
        w.array("participant");
        for (_, code, display, t, _) in practitioners {
            w.begin_object();
            w.array("type");
            w.begin_object();
            w.array("coding");
            w.begin_object();
            w.string(
                "system",
                "http://terminology.hl7.org/CodeSystem/v3-ParticipationType",
            );
            w.string("code", code);
            w.string("display", display);
            w.end_object();
            w.end_array();
            w.end_object();
            w.end_array();
            reference(w, "individual", t);
            w.end_object();
        }
        w.end_array();
    }
    let start = cx.field(pv1, 44).and_then(|d| cx.date_time(&d));
    let end = cx.field(pv1, 45).and_then(|d| cx.date_time(&d));
    if start.is_some() || end.is_some() {
        w.object("period");
        if let Some(s) = &start {
            w.string("start", s);
        }
        if let Some(e) = &end {
            w.string("end", e);
        }
        w.end_object();
    }
    if let Some(pv2) = pv2 {
        let reasons = cx.reps(pv2, 3);
        write_items(w, "reasonCode", &reasons, |w, v| {
            cx.codeable_concept_item(w, *v, None)
        });
    }
    let admit_source = pv1.field(14).and_then(|f| f.repetition(1));
    let disposition = pv1.field(36).and_then(|f| f.repetition(1));
    if admit_source.is_some_and(|a| cx.cwe_valued(a))
        || disposition.is_some_and(|d| cx.cwe_valued(d))
    {
        w.object("hospitalization");
        cx.codeable_concept(w, "admitSource", admit_source, None);
        cx.codeable_concept(
            w,
            "dischargeDisposition",
            disposition,
            Some(Table::new("DischargeDisposition", "HL70112")),
        );
        w.end_object();
    }
    if let Some(place) = pv1
        .field(3)
        .and_then(|f| f.repetition(1))
        .and_then(|pl| cx.location_text(pl))
    {
        w.array("location");
        w.begin_object();
        w.object("location");
        w.string("display", &place);
        w.end_object();
        w.end_object();
        w.end_array();
    }
}

fn related_person_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, nk1: &Segment<'_>, patient: &Target) {
    reference(w, "patient", patient);
    let rel = nk1.field(3).and_then(|f| f.repetition(1));
    let role = nk1.field(7).and_then(|f| f.repetition(1));
    let rels: Vec<(Value<'_>, Table)> = rel
        .into_iter()
        .map(|v| (v, Table::new("Relationship", "HL70063")))
        .chain(
            role.into_iter()
                .map(|v| (v, Table::new("ContactRole", "HL70131"))),
        )
        .collect();
    write_items(w, "relationship", &rels, |w, (v, t)| {
        cx.codeable_concept_item(w, *v, Some(*t))
    });
    let names = cx.reps(nk1, 2);
    write_items(w, "name", &names, |w, v| cx.human_name(w, *v));
    let phones: Vec<(Value<'_>, &str)> = cx
        .reps(nk1, 5)
        .into_iter()
        .map(|v| (v, "home"))
        .chain(cx.reps(nk1, 6).into_iter().map(|v| (v, "work")))
        .collect();
    write_items(w, "telecom", &phones, |w, (v, u)| {
        cx.contact_point(w, *v, Some(u))
    });
    if let Some(g) = cx.field(nk1, 15) {
        w.string(
            "gender",
            vocab::lookup("AdministrativeSex", &g).map_or("unknown", |c| c.code),
        );
    }
    if let Some(b) = cx.field(nk1, 16).and_then(|b| cx.date(&b)) {
        w.string("birthDate", &b);
    }
    let addresses = cx.reps(nk1, 4);
    write_items(w, "address", &addresses, |w, v| cx.address(w, *v));
    let start = cx.field(nk1, 8).and_then(|d| cx.date(&d));
    let end = cx.field(nk1, 9).and_then(|d| cx.date(&d));
    if start.is_some() || end.is_some() {
        w.object("period");
        if let Some(s) = &start {
            w.string("start", s);
        }
        if let Some(e) = &end {
            w.string("end", e);
        }
        w.end_object();
    }
}

fn allergy_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, al1: &Segment<'_>, patient: &Target) {
    w.object("clinicalStatus");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical",
    );
    w.string("code", "active");
    w.end_object();
    w.end_array();
    w.end_object();
    if let Some(t) = cx.field(al1, 2) {
        if let Some(ty) = vocab::lookup("AllergyType", &t) {
            w.string("type", ty.code);
        }
        if let Some(cat) = vocab::lookup("AllergenType[AllergyIntoleranceCategory]", &t) {
            w.array("category");
            w.item_string(cat.code);
            w.end_array();
        }
    }
    let severity = cx.field(al1, 4);
    if let Some(c) = severity
        .as_deref()
        .and_then(|s| vocab::lookup("AllergySeverity[AllergyIntolerance.criticality]", s))
    {
        w.string("criticality", c.code);
    }
    cx.codeable_concept(w, "code", al1.field(3).and_then(|f| f.repetition(1)), None);
    reference(w, "patient", patient);
    if let Some(d) = cx.field(al1, 6).and_then(|d| cx.date_time(&d)) {
        w.string("onsetDateTime", &d);
    }
    let reactions: Vec<String> = cx
        .reps(al1, 5)
        .into_iter()
        .filter_map(|r| cx.text(Some(r)).map(|t| t.into_owned()))
        .collect();
    if !reactions.is_empty() {
        w.array("reaction");
        w.begin_object();
        w.array("manifestation");
        for r in &reactions {
            w.begin_object();
            w.string("text", r);
            w.end_object();
        }
        w.end_array();
        if let Some(s) = severity
            .as_deref()
            .and_then(|s| vocab::lookup("AllergySeverity[AllergyIntolerance.reaction.severity]", s))
        {
            w.string("severity", s.code);
        }
        w.end_object();
        w.end_array();
    }
}

fn condition_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, dg1: &Segment<'_>, patient: &Target) {
    if let Some(ei) = dg1.field(20).and_then(|f| f.repetition(1))
        && let Some((system, value)) = ei_key(cx, ei)
    {
        w.array("identifier");
        w.begin_object();
        w.string("system", &system);
        w.string("value", &value);
        w.end_object();
        w.end_array();
    }
    let code = dg1.field(3).and_then(|f| f.repetition(1));
    if code.is_some_and(|c| cx.cwe_valued(c)) {
        cx.codeable_concept(w, "code", code, None);
    } else if let Some(text) = cx.field(dg1, 4) {
        w.object("code");
        w.string("text", &text);
        w.end_object();
    }
    reference(w, "subject", patient);
    if let Some(d) = cx.field(dg1, 5).and_then(|d| cx.date_time(&d)) {
        w.string("onsetDateTime", &d);
    }
    if let Some(d) = cx.field(dg1, 19).and_then(|d| cx.date_time(&d)) {
        w.string("recordedDate", &d);
    }
}

fn coverage_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, in1: &Segment<'_>, patient: &Target) {
    let plan = in1.field(2).and_then(|f| f.repetition(1));
    if let Some(plan_id) = plan.and_then(|p| cx.comp(p, 1)) {
        w.array("identifier");
        w.begin_object();
        w.string("value", &plan_id);
        w.end_object();
        w.end_array();
    }
    w.string("status", "active");
    cx.codeable_concept(
        w,
        "type",
        in1.field(15).and_then(|f| f.repetition(1)),
        Some(Table::new("PlanId", "HL70086")),
    );
    reference(w, "beneficiary", patient);
    cx.codeable_concept(
        w,
        "relationship",
        in1.field(17).and_then(|f| f.repetition(1)),
        Some(Table::new("Relationship", "HL70063")),
    );
    let start = cx.field(in1, 12).and_then(|d| cx.date(&d));
    let end = cx.field(in1, 13).and_then(|d| cx.date(&d));
    if start.is_some() || end.is_some() {
        w.object("period");
        if let Some(s) = &start {
            w.string("start", s);
        }
        if let Some(e) = &end {
            w.string("end", e);
        }
        w.end_object();
    }
    // payor (1..*): the insurance company by its id (IN1-3) and name (IN1-4).
    let company = in1
        .field(3)
        .and_then(|f| f.repetition(1))
        .and_then(|c| cx.cx_key(c));
    let name = in1
        .field(4)
        .and_then(|f| f.repetition(1))
        .and_then(|x| cx.comp(x, 1));
    w.array("payor");
    w.begin_object();
    if let Some((system, value)) = &company {
        w.object("identifier");
        w.string("system", system);
        w.string("value", value);
        w.end_object();
    }
    w.string("display", name.as_deref().unwrap_or("unknown insurer"));
    w.end_object();
    w.end_array();
}

fn observation_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    obx: &Segment<'_>,
    patient: &Target,
    encounter: Option<&Target>,
) {
    let status = cx
        .field(obx, 11)
        .and_then(|s| vocab::lookup("ObservationResultStatusCodesInterpretation", &s))
        .map_or("unknown", |c| c.code);
    w.string("status", status);
    let code = obx.field(3).and_then(|f| f.repetition(1));
    if !cx.codeable_concept(w, "code", code, None) {
        w.object("code");
        w.string("text", "unknown");
        w.end_object();
    }
    reference(w, "subject", patient);
    if let Some(e) = encounter {
        reference(w, "encounter", e);
    }
    if let Some(d) = cx.field(obx, 14).and_then(|d| cx.date_time(&d)) {
        w.string("effectiveDateTime", &d);
    }
    observation_value(cx, w, obx);
    let flags = cx.reps(obx, 8);
    write_items(w, "interpretation", &flags, |w, v| {
        let Some(code) = cx.comp(*v, 1) else {
            return false;
        };
        w.begin_object();
        w.array("coding");
        cx.mapped_coding(w, "InterpretationCodes", &code, "HL70078");
        w.end_array();
        w.end_object();
        true
    });
    if let Some(range) = cx.field(obx, 7) {
        w.array("referenceRange");
        w.begin_object();
        w.string("text", &range);
        w.end_object();
        w.end_array();
    }
}

/// OBX-5 by OBX-2: NM → valueQuantity (unit OBX-6), ST/TX/FT → valueString, CE/CWE/CNE/IS → valueCodeableConcept,
/// DT/DTM/TS → valueDateTime, SN → valueQuantity (with comparator) or valueRange or valueRatio; other types as
/// a string of the raw value.
pub(crate) fn observation_value(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, obx: &Segment<'_>) {
    let ty = cx.field(obx, 2).unwrap_or_default();
    let Some(value) = obx.field(5) else { return };
    let first = value.repetition(1);
    match ty.as_ref() {
        "NM" => {
            if let Some(n) = cx.text(first).filter(|n| is_decimal(n)) {
                quantity(cx, w, "valueQuantity", &n, None, obx);
            }
        }
        "ST" | "TX" | "FT" => {
            let parts: Vec<String> = value
                .repetitions()
                .filter_map(|r| cx.text(Some(r)).map(|t| t.into_owned()))
                .collect();
            if !parts.is_empty() {
                w.string("valueString", &parts.join("\n"));
            }
        }
        "CE" | "CWE" | "CNE" | "IS" | "CF" => {
            cx.codeable_concept(w, "valueCodeableConcept", first, None);
        }
        "DT" | "DTM" | "TS" => {
            if let Some(d) = cx.text(first).and_then(|d| cx.date_time(&d)) {
                w.string("valueDateTime", &d);
            }
        }
        "SN" => {
            let Some(sn) = first else { return };
            let comparator = cx.comp(sn, 1);
            let n1 = cx.comp(sn, 2).filter(|n| is_decimal(n));
            let sep = cx.comp(sn, 3);
            let n2 = cx.comp(sn, 4).filter(|n| is_decimal(n));
            match (sep.as_deref(), &n1, &n2) {
                (None, Some(n), None) => {
                    let cmp = comparator
                        .as_deref()
                        .filter(|c| matches!(*c, "<" | "<=" | ">=" | ">"));
                    quantity(cx, w, "valueQuantity", n, cmp, obx);
                }
                (Some("-"), Some(lo), Some(hi)) => {
                    w.object("valueRange");
                    quantity(cx, w, "low", lo, None, obx);
                    quantity(cx, w, "high", hi, None, obx);
                    w.end_object();
                }
                (Some(":" | "/"), Some(a), Some(b)) => {
                    w.object("valueRatio");
                    quantity(cx, w, "numerator", a, None, obx);
                    quantity(cx, w, "denominator", b, None, obx);
                    w.end_object();
                }
                _ => {
                    let text: Vec<String> = [1, 2, 3, 4]
                        .iter()
                        .filter_map(|&n| cx.comp(sn, n).map(|t| t.into_owned()))
                        .collect();
                    if !text.is_empty() {
                        w.string("valueString", &text.join(" "));
                    }
                }
            }
        }
        _ => {
            if let Some(t) = cx.text(first) {
                w.string("valueString", &t);
            }
        }
    }
}

/// A Quantity under `key`: the value, the unit from OBX-6 (UCUM when OBX-6.3 says so).
fn quantity(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    key: &str,
    value: &str,
    comparator: Option<&str>,
    obx: &Segment<'_>,
) {
    w.object(key);
    w.number("value", &normalise_decimal(value));
    if let Some(c) = comparator {
        w.string("comparator", c);
    }
    if let Some(units) = obx.field(6).and_then(|f| f.repetition(1)) {
        let code = cx.comp(units, 1);
        let text = cx.comp(units, 2).or_else(|| code.clone());
        if let Some(t) = &text {
            w.string("unit", t);
        }
        let system = cx.comp(units, 3).and_then(|s| cx.coding_system(&s));
        if let (Some(system), Some(code)) = (system, &code) {
            w.string("system", &system);
            w.string("code", code);
        }
    }
    w.end_object();
}

/// True for a decimal FHIR (and JSON) accept once normalised: optional sign, digits, optional fraction.
fn is_decimal(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    (!int.is_empty() || !frac.is_empty())
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// A v2 NM (checked by [`is_decimal`]) as a JSON number: no `+`, no leading zeros, a digit on each side of
/// the point.
fn normalise_decimal(s: &str) -> String {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let mut out = String::with_capacity(s.len() + 1);
    if neg {
        out.push('-');
    }
    out.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

fn provenance_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    targets: &[String],
    evn: Option<&Segment<'_>>,
    timestamp: Option<&str>,
) {
    w.array("target");
    for t in targets {
        w.begin_object();
        w.string("reference", t);
        w.end_object();
    }
    w.end_array();
    if let Some(evn) = evn {
        let occurred = cx
            .field(evn, 6)
            .or_else(|| cx.field(evn, 2))
            .and_then(|d| cx.date_time(&d));
        if let Some(o) = occurred {
            w.string("occurredDateTime", &o);
        }
    }
    // recorded (1..1, instant): when the message was written (MSH-7 with an offset) or received.
    let recorded = evn
        .and_then(|e| cx.field(e, 2))
        .and_then(|d| cx.instant(&d))
        .or_else(|| timestamp.map(str::to_owned))
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_owned());
    w.string("recorded", &recorded);
    if let Some(reason) = evn.and_then(|e| e.field(4)).and_then(|f| f.repetition(1))
        && cx.cwe_valued(reason)
    {
        w.array("reason");
        cx.codeable_concept_item(w, reason, Some(Table::new("EventReason", "HL70062")));
        w.end_array();
    }
    w.object("activity");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/v3-DataOperation",
    );
    w.string("code", "UPDATE");
    w.end_object();
    w.end_array();
    w.string(
        "text",
        "HL7 v2 message converted to FHIR by hl7gw (v2-to-FHIR IG maps)",
    );
    w.end_object();
    w.array("agent");
    w.begin_object();
    w.object("type");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/provenance-participant-type",
    );
    w.string("code", "assembler");
    w.end_object();
    w.end_array();
    w.end_object();
    w.object("who");
    w.string("display", "hl7gw");
    w.end_object();
    w.end_object();
    w.end_array();
}
