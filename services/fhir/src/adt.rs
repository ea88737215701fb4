//! ADT messages (the IG's ADT_A01 map and the triggers that share its structure): MSH → MessageHeader,
//! EVN → Provenance, PID → Patient, NK1 → RelatedPerson, PV1/PV2 → Encounter (and Practitioners from its
//! XCN fields), OBX → Observation, AL1 → AllergyIntolerance, DG1 → Condition, IN1 → Coverage, and a
//! Provenance of the transformation.

use crate::common::*;
use crate::dt::Ctx;
use crate::extra::Unique;
use crate::json::Writer;
use crate::{BundleType, FhirError, Outcome};

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
    let trigger = kind.split('^').nth(1).unwrap_or_default();

    let patient = patient_target(cx, &pid, &msg_key);
    let patient_key = patient.id;
    let encounter = pv1
        .as_ref()
        .and_then(|pv1| encounter_target(cx, pv1, Some(&patient)));
    let participants = match &pv1 {
        Some(pv1) => pv1_participants(cx, pv1),
        None => Vec::new(),
    };
    // The practitioners: of the visit, then those who observed (OBX-16).
    let mut practitioners = Practitioners::default();
    for (_, _, _, t, xcn) in &participants {
        practitioners.add_target(t, Person::Xcn(*xcn));
    }
    for seg in msg.segments().filter(|s| s.name() == b"OBX") {
        observation_people(cx, &mut practitioners, &seg, &[]);
    }

    let mut w = Writer::new(out);
    let frame = begin_bundle(cx, &mut w, &key);

    // Every entry's fullUrl, for the Provenance's targets.
    let mut targets: Vec<crate::dt::Uuid> = Vec::new();
    if cx.opts.bundle_type == BundleType::Message {
        let focus: Vec<&_> = std::iter::once(&patient)
            .chain(encounter.as_ref())
            .collect();
        message_header(cx, &mut w, &msg_key, &focus)?;
    }

    // Patient.
    cx.begin_entry(&mut w, &patient);
    let pid_mapped = patient_body(cx, &mut w, &pid);
    cx.end_entry(&mut w, &patient);
    targets.push(patient.id);
    cx.note_unmapped(&pid, &pid_mapped);

    // Practitioners (each once).
    practitioners.write(cx, &mut w, &mut targets);

    // Encounter.
    if let (Some(pv1), Some(enc)) = (&pv1, &encounter) {
        let pv2 = msg.segment("PV2", 1);
        cx.begin_entry(&mut w, enc);
        encounter_body(
            cx,
            &mut w,
            Some(trigger),
            pv1,
            pv2.as_ref(),
            &patient,
            &participants,
        );
        cx.end_entry(&mut w, enc);
        targets.push(enc.id);
        cx.note_unmapped(pv1, PV1_MAPPED);
        if let Some(pv2) = &pv2 {
            cx.note_unmapped(pv2, PV2_MAPPED);
        }
    } else if let Some(pv1) = &pv1 {
        note_no_encounter(cx, pv1, msg.segment("PV2", 1).as_ref());
    }

    // The repeating segments, in message order; each condition used once.
    let mut unique = Unique::default();
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
                targets.push(t.id);
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
                targets.push(t.id);
                cx.note_unmapped(&seg, AL1_MAPPED);
            }
            b"DG1" => {
                let t = unique.check(cx, condition_target(cx, &seg, &patient_key, &n), &n);
                cx.begin_entry(&mut w, &t);
                let mapped = condition_body(cx, &mut w, &seg, &t, &patient);
                cx.end_entry(&mut w, &t);
                targets.push(t.id);
                cx.note_unmapped(&seg, mapped);
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
                targets.push(t.id);
                cx.note_unmapped(&seg, IN1_MAPPED);
            }
            b"OBX" => {
                let code = cx.field(&seg, 3).unwrap_or_default();
                let t = observation_target(cx, &seg, &[&msg_key.join("|"), "OBX", &code, &n]);
                let t = unique.check(cx, t, &n);
                cx.begin_entry(&mut w, &t);
                let links = ObsLinks {
                    patient: Some(&patient),
                    encounter: encounter.as_ref(),
                    repeat: t.repeat,
                    ..ObsLinks::default()
                };
                let mapped = observation_body(cx, &mut w, &seg, links);
                cx.end_entry(&mut w, &t);
                targets.push(t.id);
                cx.note_unmapped(&seg, &mapped);
            }
            _ => cx.note_unmapped_segment(&seg),
        }
    }

    // The Provenance of this transformation (and of the event, EVN).
    Ok(provenance_and_end(
        cx,
        &mut w,
        &msg_key,
        &targets,
        evn.as_ref(),
        &frame,
    ))
}
