//! ADT messages (the IG's ADT_A01 map and the triggers that share its structure): MSH → MessageHeader,
//! EVN → Provenance, PID → Patient, NK1 → RelatedPerson, PV1/PV2 → Encounter (and Practitioners from its
//! XCN fields), OBX → Observation, AL1 → AllergyIntolerance, DG1 → Condition, IN1 → Coverage, and a
//! Provenance of the transformation.

use super::Converted;
use crate::bundle::{Entries, Unique};
use crate::context::{Ctx, Target, reference};
use crate::datatypes::xcn::{Person, Practitioners};
use crate::json::Writer;
use crate::messages::common::{
    encounter_entry, observation_entry, patient_part_entry, patient_part_target, required,
};
use crate::segments::msh::MSH_MAPPED;
use crate::segments::obx::{ObsLinks, observation_people, observation_target};
use crate::segments::pid::{patient_body, patient_key, patient_target};
use crate::segments::pv1::Visit;
use crate::segments::write_items;
use crate::{FhirError, Write};
use hl7v2::message::Segment;

pub(crate) fn convert(cx: &mut Ctx<'_, '_>, kind: &str, out: &mut Vec<u8>) -> Converted {
    let msg = cx.msg;
    if kind == "ADT^A17" {
        return convert_swap(cx, out);
    }
    let pid = required(cx, kind, "PID")?;
    let key = cx.message_key();
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();
    let trigger = kind.split('^').nth(1).unwrap_or_default();

    let patient = patient_target(cx, &pid, &msg_key);
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
    let (visit, mut practitioners) = Visit::of(
        cx,
        msg.segment("PV1", 1),
        msg.segment("PV2", 1),
        Some(&patient),
    );
    for seg in msg.segments().filter(|s| s.name() == b"OBX") {
        observation_people(cx, &mut practitioners, &seg, &[]);
    }

    let mut b = Entries::open(cx, out, &key, || {
        std::iter::once(&patient)
            .chain(visit.encounter.as_ref())
            .collect()
    })?;

    // Patient (and the one it replaces).
    b.segment(cx, &patient, &pid, |cx, w| {
        let mapped = patient_body(cx, w, &pid);
        if let Some(old) = &merged {
            patient_link(w, old, "replaces");
        }
        mapped
    });
    if let (Some(old), Some(mrg)) = (&merged, &mrg) {
        b.segment(cx, old, mrg, |cx, w| {
            merged_body(cx, w, mrg, &patient);
            MRG_MAPPED
        });
    }

    // Practitioners (each once).
    practitioners.write(cx, &mut b);

    // Encounter.
    encounter_entry(cx, &mut b, Some(trigger), &visit, &patient);

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
            b"PV1" if same(&seg, visit.pv1.as_ref()) => {}
            b"PV2" if same(&seg, visit.pv2.as_ref()) => {}
            b"MRG" if merged.is_some() && same(&seg, mrg.as_ref()) => {}
            b"EVN" => evn = Some(seg),
            b"NK1" | b"AL1" | b"IN1" | b"DG1" => {
                let t = patient_part_target(cx, &seg, &patient.id, &n);
                // Each condition used once.
                let t = match name {
                    b"DG1" => unique.check(cx, t, &n),
                    _ => t,
                };
                patient_part_entry(cx, &mut b, &seg, &t, &patient);
            }
            b"OBX" => {
                let at = Obx {
                    seg: &seg,
                    position: &n,
                    msg_key: &msg_key,
                };
                let subject = (&patient, visit.encounter.as_ref());
                subject_observation(cx, &mut b, &mut unique, at, subject);
            }
            _ => cx.note_unmapped_segment(&seg),
        }
    }

    // The Provenance of this transformation (and of the event, EVN).
    Ok(b.finish(cx, &msg_key, evn.as_ref()))
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
fn convert_swap(cx: &mut Ctx<'_, '_>, out: &mut Vec<u8>) -> Converted {
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
        let (visit, _) = Visit::of(cx, find(b"PV1"), find(b"PV2"), Some(&patient));
        for (_, _, _, t, xcn) in &visit.participants {
            practitioners.add_target(t, Person::Xcn(*xcn));
        }
        for seg in segs[start..end].iter().filter(|s| s.name() == b"OBX") {
            observation_people(cx, &mut practitioners, seg, &[]);
        }
        groups.push(SwapGroup {
            range: start..end,
            patient,
            visit,
        });
    }

    if groups[0].patient.id == groups[1].patient.id {
        // Both PIDs name one patient: no swap to write (and one Patient twice would fail the transaction).
        return Err(FhirError::Required(
            "a second patient (both PIDs of the A17 name one)",
        ));
    }
    let mut b = Entries::open(cx, out, &key, || {
        groups
            .iter()
            .flat_map(|g| std::iter::once(&g.patient).chain(g.visit.encounter.as_ref()))
            .collect()
    })?;
    for g in &groups {
        let pid = &segs[g.range.start];
        b.segment(cx, &g.patient, pid, |cx, w| patient_body(cx, w, pid));
    }
    practitioners.write(cx, &mut b);
    for g in &groups {
        encounter_entry(cx, &mut b, Some("A17"), &g.visit, &g.patient);
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
                if same(seg, g.visit.pv1.as_ref()) || same(seg, g.visit.pv2.as_ref()) => {}
            (b"OBX", Some(g)) => {
                let n = i.to_string();
                let at = Obx {
                    seg,
                    position: &n,
                    msg_key: &msg_key,
                };
                let subject = (&g.patient, g.visit.encounter.as_ref());
                subject_observation(cx, &mut b, &mut unique, at, subject);
            }
            _ => cx.note_unmapped_segment(seg),
        }
    }
    Ok(b.finish(cx, &msg_key, evn.as_ref()))
}

/// One patient of an A17: its segments, Patient, visit.
struct SwapGroup<'a> {
    range: std::ops::Range<usize>,
    patient: Target,
    visit: Visit<'a>,
}

/// An OBX, its position in the message and the message's key (the Observation's derived id without OBX-21).
struct Obx<'s, 'a> {
    seg: &'s Segment<'a>,
    position: &'s str,
    msg_key: &'s [&'s str],
}

/// An OBX as an Observation entry of `subject` (the patient, and the encounter when there is one): by OBX-21
/// and its code, else derived from the message, OBX-3 and its position; each condition used once.
fn subject_observation<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    unique: &mut Unique,
    at: Obx<'_, 'a>,
    subject: (&Target, Option<&Target>),
) {
    let code = cx.field(at.seg, 3).unwrap_or_default();
    let t = observation_target(
        cx,
        at.seg,
        &[&at.msg_key.join("|"), "OBX", &code, at.position],
    );
    let t = unique.check(cx, t, at.position);
    let links = ObsLinks {
        patient: Some(subject.0),
        encounter: subject.1,
        ..ObsLinks::default()
    };
    observation_entry(cx, b, &t, at.seg, &[], links);
}
