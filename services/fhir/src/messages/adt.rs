//! ADT messages (the IG's ADT_A01 map and the triggers that share its structure): MSH → MessageHeader,
//! EVN → Provenance, PID → Patient, NK1 → RelatedPerson, PV1/PV2 → Encounter (and Practitioners from its
//! XCN fields), OBX → Observation, AL1 → AllergyIntolerance, DG1 → Condition, IN1 → Coverage, and a
//! Provenance of the transformation.

use crate::bundle::{Unique, open_bundle, provenance_and_end};
use crate::context::{Ctx, Target, reference};
use crate::datatypes::xcn::{Person, Practitioners};
use crate::ids::Uuid;
use crate::json::Writer;
use crate::segments::al1::{AL1_MAPPED, allergy_body};
use crate::segments::dg1::{condition_body, condition_target};
use crate::segments::in1::{IN1_MAPPED, coverage_body};
use crate::segments::msh::MSH_MAPPED;
use crate::segments::nk1::{NK1_MAPPED, related_person_body};
use crate::segments::obx::{ObsLinks, observation_body, observation_people, observation_target};
use crate::segments::pid::{patient_body, patient_key, patient_target};
use crate::segments::pv1::{
    PV1_MAPPED, PV2_MAPPED, Participant, encounter_body, note_no_encounter, visit,
};
use crate::segments::{n_key, write_items};
use crate::{FhirError, Outcome, Write};
use hl7v2::message::Segment;

pub(crate) fn convert(
    cx: &mut Ctx<'_, '_>,
    kind: &str,
    out: &mut Vec<u8>,
) -> Result<Outcome, FhirError> {
    let msg = cx.msg;
    if kind == "ADT^A17" {
        return convert_swap(cx, out);
    }
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
    // A merge (A34, A40): the record MRG names is retired into this one.
    let mrg = msg.segment("MRG", 1);
    let merged = match (&mrg, trigger) {
        (Some(mrg), "A34" | "A40") => merged_target(cx, mrg).filter(|t| t.id != patient.id),
        _ => None,
    };
    // The practitioners: of the visit, then those who observed (OBX-16).
    let (encounter, participants, mut practitioners) = visit(cx, pv1.as_ref(), Some(&patient));
    for seg in msg.segments().filter(|s| s.name() == b"OBX") {
        observation_people(cx, &mut practitioners, &seg, &[]);
    }

    let mut w = Writer::new(out);
    let frame = open_bundle(cx, &mut w, &key, || {
        std::iter::once(&patient)
            .chain(encounter.as_ref())
            .collect()
    })?;

    // Every entry's fullUrl, for the Provenance's targets.
    let mut targets: Vec<Uuid> = Vec::new();

    // Patient (and the one it replaces).
    cx.begin_entry(&mut w, &patient);
    let pid_mapped = patient_body(cx, &mut w, &pid);
    if let Some(old) = &merged {
        patient_link(&mut w, old, "replaces");
    }
    cx.end_entry(&mut w, &patient);
    targets.push(patient.id);
    cx.note_unmapped(&pid, &pid_mapped);
    if let (Some(old), Some(mrg)) = (&merged, &mrg) {
        cx.begin_entry(&mut w, old);
        merged_body(cx, &mut w, mrg, &patient);
        cx.end_entry(&mut w, old);
        targets.push(old.id);
        cx.note_unmapped(mrg, MRG_MAPPED);
    }

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
            b"MRG" if merged.is_some() => {}
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

/// MRG's fields the merge writes: the prior identifiers (1, and the older 4) and the prior name (7).
const MRG_MAPPED: &[usize] = &[1, 4, 7];

/// The record a merge retires: by MRG-1 (else MRG-4), scoped like a PID's match key. It is always updated (the
/// merge message owns its retirement), unless the route only references patients.
fn merged_target(cx: &Ctx<'_, '_>, mrg: &hl7v2::message::Segment<'_>) -> Option<Target> {
    let (s, v) = patient_key(cx, mrg, &[1, 4])?;
    let mut t = cx.target("Patient", &[&s, &v], Some((s.clone(), v.clone())));
    if t.write != Write::Reference {
        t.write = Write::Update;
    }
    Some(t)
}

/// The retired record: its identifiers (MRG-1, MRG-4), its name (MRG-7), inactive, replaced by `survivor`.
/// Its other elements are not carried by MRG: the update leaves the record with these alone (it is retired).
fn merged_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    mrg: &hl7v2::message::Segment<'_>,
    survivor: &Target,
) {
    let ids: Vec<_> = [1, 4].iter().flat_map(|&n| cx.reps(mrg, n)).collect();
    write_items(w, "identifier", &ids, |w, v| cx.identifier(w, *v, None));
    w.bool("active", false);
    let names = cx.reps(mrg, 7);
    write_items(w, "name", &names, |w, v| cx.human_name(w, *v));
    patient_link(w, survivor, "replaced-by");
}

/// `link`: the other Patient and how this one relates to it (`replaces`, `replaced-by`).
fn patient_link(w: &mut Writer<'_>, other: &Target, kind: &str) {
    w.array("link");
    w.begin_object();
    reference(w, "other", other);
    w.string("type", kind);
    w.end_object();
    w.end_array();
}

/// ADT^A17 (swap patients, the IG's ADT_A17 map): two patient groups (PID, PD1, PV1, PV2, DB1, OBX), each a
/// Patient, its Encounter at its new place and its Observations, in one Bundle.
fn convert_swap(cx: &mut Ctx<'_, '_>, out: &mut Vec<u8>) -> Result<Outcome, FhirError> {
    let msg = cx.msg;
    let segs: Vec<Segment<'_>> = msg.segments().collect();
    let starts: Vec<usize> = segs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name() == b"PID")
        .map(|(i, _)| i)
        .collect();
    if starts.len() != 2 {
        return Err(FhirError::Required("a second PID (A17 swaps two patients)"));
    }
    let key = cx.message_key();
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();
    let mut groups: Vec<SwapGroup<'_>> = Vec::with_capacity(2);
    let mut practitioners = Practitioners::default();
    for (g, &start) in starts.iter().enumerate() {
        let end = starts.get(g + 1).copied().unwrap_or(segs.len());
        let find = |name: &[u8]| segs[start..end].iter().find(|s| s.name() == name).copied();
        let gn = g.to_string();
        let fallback: Vec<&str> = msg_key.iter().copied().chain([gn.as_str()]).collect();
        let patient = patient_target(cx, &segs[start], &fallback);
        let (pv1, pv2) = (find(b"PV1"), find(b"PV2"));
        let (encounter, participants, _) = visit(cx, pv1.as_ref(), Some(&patient));
        for (_, _, _, t, xcn) in &participants {
            practitioners.add_target(t, Person::Xcn(*xcn));
        }
        for seg in segs[start..end].iter().filter(|s| s.name() == b"OBX") {
            observation_people(cx, &mut practitioners, seg, &[]);
        }
        groups.push(SwapGroup {
            range: start..end,
            patient,
            pv1,
            pv2,
            encounter,
            participants,
        });
    }

    let mut w = Writer::new(out);
    let frame = open_bundle(cx, &mut w, &key, || {
        groups
            .iter()
            .flat_map(|g| std::iter::once(&g.patient).chain(g.encounter.as_ref()))
            .collect()
    })?;
    let mut targets: Vec<Uuid> = Vec::new();
    for g in &groups {
        let pid = &segs[g.range.start];
        cx.begin_entry(&mut w, &g.patient);
        let mapped = patient_body(cx, &mut w, pid);
        cx.end_entry(&mut w, &g.patient);
        targets.push(g.patient.id);
        cx.note_unmapped(pid, &mapped);
    }
    practitioners.write(cx, &mut w, &mut targets);
    for g in &groups {
        match (&g.pv1, &g.encounter) {
            (Some(pv1), Some(enc)) => {
                cx.begin_entry(&mut w, enc);
                encounter_body(
                    cx,
                    &mut w,
                    Some("A17"),
                    pv1,
                    g.pv2.as_ref(),
                    &g.patient,
                    &g.participants,
                );
                cx.end_entry(&mut w, enc);
                targets.push(enc.id);
                cx.note_unmapped(pv1, PV1_MAPPED);
                if let Some(pv2) = &g.pv2 {
                    cx.note_unmapped(pv2, PV2_MAPPED);
                }
            }
            (Some(pv1), None) => note_no_encounter(cx, pv1, g.pv2.as_ref()),
            _ => {}
        }
    }
    let mut unique = Unique::default();
    let mut evn = None;
    for (i, seg) in segs.iter().enumerate() {
        let group = groups.iter().find(|g| g.range.contains(&i));
        match (seg.name(), group) {
            (b"MSH", _) => cx.note_unmapped(seg, MSH_MAPPED),
            (b"EVN", _) => evn = Some(*seg),
            (b"PID", _) => {}
            (b"PV1" | b"PV2", Some(g))
                if g.pv1
                    .is_some_and(|p| p.raw().as_ptr() == seg.raw().as_ptr())
                    || g.pv2
                        .is_some_and(|p| p.raw().as_ptr() == seg.raw().as_ptr()) => {}
            (b"OBX", Some(g)) => {
                let n = i.to_string();
                let code = cx.field(seg, 3).unwrap_or_default();
                let t = observation_target(cx, seg, &[&msg_key.join("|"), "OBX", &code, &n]);
                let t = unique.check(cx, t, &n);
                cx.begin_entry(&mut w, &t);
                let links = ObsLinks {
                    patient: Some(&g.patient),
                    encounter: g.encounter.as_ref(),
                    repeat: t.repeat,
                    ..ObsLinks::default()
                };
                let mapped = observation_body(cx, &mut w, seg, links);
                cx.end_entry(&mut w, &t);
                targets.push(t.id);
                cx.note_unmapped(seg, &mapped);
            }
            _ => cx.note_unmapped_segment(seg),
        }
    }
    Ok(provenance_and_end(
        cx,
        &mut w,
        &msg_key,
        &targets,
        evn.as_ref(),
        &frame,
    ))
}

/// One patient of an A17: its segments, Patient, visit.
struct SwapGroup<'a> {
    range: std::ops::Range<usize>,
    patient: Target,
    pv1: Option<Segment<'a>>,
    pv2: Option<Segment<'a>>,
    encounter: Option<Target>,
    participants: Vec<Participant<'a>>,
}
