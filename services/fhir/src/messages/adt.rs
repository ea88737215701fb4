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
    // A route that only references Patients writes no merge: its MRG is reported.
    let merged = match (&mrg, trigger) {
        (Some(mrg), "A34" | "A40") => {
            merged_target(cx, mrg).filter(|t| t.id != patient.id && t.write != Write::Reference)
        }
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
    let visit_of = Visit {
        pv1: pv1.as_ref(),
        pv2: msg.segment("PV2", 1),
        encounter: encounter.as_ref(),
        participants: &participants,
    };
    encounter_entry(cx, &mut w, trigger, &visit_of, &patient, &mut targets);

    // The repeating segments, in message order; each condition used once.
    let mut unique = Unique::default();
    let mut evn = None;
    for (i, seg) in msg.segments().enumerate() {
        let name = seg.name();
        let n = i.to_string();
        match name {
            b"MSH" => cx.note_unmapped(&seg, MSH_MAPPED),
            // The first PID, PV1, PV2 (and MRG of a merge) are written above; any further group (an A40's
            // second merge) is reported, never silently left out.
            b"PID" if same(&seg, Some(&pid)) => {}
            b"PV1" if same(&seg, pv1.as_ref()) => {}
            b"PV2" if same(&seg, msg.segment("PV2", 1).as_ref()) => {}
            b"MRG" if merged.is_some() && same(&seg, mrg.as_ref()) => {}
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
                let at = Obx {
                    seg: &seg,
                    position: &n,
                    msg_key: &msg_key,
                };
                let subject = (&patient, encounter.as_ref());
                observation_entry(cx, &mut w, &mut unique, at, subject, &mut targets);
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

/// Whether `seg` is `other` (the same bytes of the message).
fn same(seg: &Segment<'_>, other: Option<&Segment<'_>>) -> bool {
    other.is_some_and(|o| std::ptr::eq(o.raw().as_ptr(), seg.raw().as_ptr()))
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

    if groups[0].patient.id == groups[1].patient.id {
        // Both PIDs name one patient: no swap to write (and one Patient twice would fail the transaction).
        return Err(FhirError::Required(
            "a second patient (both PIDs of the A17 name one)",
        ));
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
        let visit_of = Visit {
            pv1: g.pv1.as_ref(),
            pv2: g.pv2,
            encounter: g.encounter.as_ref(),
            participants: &g.participants,
        };
        encounter_entry(cx, &mut w, "A17", &visit_of, &g.patient, &mut targets);
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
                let at = Obx {
                    seg,
                    position: &n,
                    msg_key: &msg_key,
                };
                let subject = (&g.patient, g.encounter.as_ref());
                observation_entry(cx, &mut w, &mut unique, at, subject, &mut targets);
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

/// A PV1 (and PV2) with the Encounter and the participants made of it.
struct Visit<'v, 'a> {
    pv1: Option<&'v Segment<'a>>,
    pv2: Option<Segment<'a>>,
    encounter: Option<&'v Target>,
    participants: &'v [Participant<'a>],
}

/// The Encounter of a visit as an entry (its PV1 and PV2 fields noted), or, when the PV1 names no visit, its
/// fields reported.
fn encounter_entry<'a>(
    cx: &mut Ctx<'a, '_>,
    w: &mut Writer<'_>,
    trigger: &str,
    v: &Visit<'_, 'a>,
    patient: &Target,
    targets: &mut Vec<Uuid>,
) {
    match (v.pv1, v.encounter) {
        (Some(pv1), Some(enc)) => {
            cx.begin_entry(w, enc);
            encounter_body(
                cx,
                w,
                Some(trigger),
                pv1,
                v.pv2.as_ref(),
                patient,
                v.participants,
            );
            cx.end_entry(w, enc);
            targets.push(enc.id);
            cx.note_unmapped(pv1, PV1_MAPPED);
            if let Some(pv2) = &v.pv2 {
                cx.note_unmapped(pv2, PV2_MAPPED);
            }
        }
        (Some(pv1), None) => note_no_encounter(cx, pv1, v.pv2.as_ref()),
        _ => {}
    }
}

/// An OBX, its position in the message and the message's key (the Observation's derived id without OBX-21).
struct Obx<'s, 'a> {
    seg: &'s Segment<'a>,
    position: &'s str,
    msg_key: &'s [&'s str],
}

/// An OBX as an Observation entry of `subject` (the patient, and the encounter when there is one), each
/// condition used once.
fn observation_entry<'a>(
    cx: &mut Ctx<'a, '_>,
    w: &mut Writer<'_>,
    unique: &mut Unique,
    at: Obx<'_, 'a>,
    subject: (&Target, Option<&Target>),
    targets: &mut Vec<Uuid>,
) {
    let code = cx.field(at.seg, 3).unwrap_or_default();
    let t = observation_target(
        cx,
        at.seg,
        &[&at.msg_key.join("|"), "OBX", &code, at.position],
    );
    let t = unique.check(cx, t, at.position);
    cx.begin_entry(w, &t);
    let links = ObsLinks {
        patient: Some(subject.0),
        encounter: subject.1,
        repeat: t.repeat,
        ..ObsLinks::default()
    };
    let mapped = observation_body(cx, w, at.seg, links);
    cx.end_entry(w, &t);
    targets.push(t.id);
    cx.note_unmapped(at.seg, &mapped);
}
