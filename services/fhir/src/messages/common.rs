//! What the message maps write alike: a segment the structure requires, the visit's Encounter entry, the
//! patient's NK1/AL1/IN1/DG1 resources, and an OBX's Observation entry with its notes.

use crate::FhirError;
use crate::bundle::Entries;
use crate::context::{Ctx, Target};
use crate::segments::al1::{AL1_MAPPED, allergy_body};
use crate::segments::dg1::{condition_body, condition_target};
use crate::segments::in1::{IN1_MAPPED, coverage_body};
use crate::segments::n_key;
use crate::segments::nk1::{NK1_MAPPED, related_person_body};
use crate::segments::nte::NTE_MAPPED;
use crate::segments::obx::{ObsLinks, observation_body};
use crate::segments::pv1::{Visit, encounter_body, note_encounter, note_no_encounter};
use hl7v2::message::Segment;

/// The first `name` segment, which the message structure `kind` requires: else the error that says so.
pub(crate) fn required<'a>(
    cx: &Ctx<'a, '_>,
    kind: &str,
    name: &'static str,
) -> Result<Segment<'a>, FhirError> {
    cx.msg.segment(name, 1).ok_or_else(|| FhirError::Missing {
        message: kind.to_owned(),
        segment: name,
    })
}

/// An OBX and the NTE segments after it.
#[derive(Debug)]
pub(crate) struct Obs<'a> {
    pub obx: Segment<'a>,
    pub notes: Vec<Segment<'a>>,
}

/// The Encounter of a visit as an entry of `patient` (`event`: the ADT trigger, whose map gives the status),
/// its PV1 and PV2 fields noted; or, when the PV1 names no visit, its fields reported.
pub(crate) fn encounter_entry<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    event: Option<&str>,
    v: &Visit<'a>,
    patient: &Target,
) {
    let pv2 = v.pv2.as_ref();
    match (&v.pv1, &v.encounter) {
        (Some(pv1), Some(enc)) => {
            b.entry(cx, enc, |cx, w| {
                encounter_body(cx, w, event, pv1, pv2, patient, &v.participants)
            });
            note_encounter(cx, pv1, pv2);
        }
        (Some(pv1), None) => note_no_encounter(cx, pv1, pv2),
        _ => {}
    }
}

/// The resource of a patient's NK1 (RelatedPerson), AL1 (AllergyIntolerance), IN1 (Coverage) or DG1
/// (Condition): derived from the patient, the segment's set id or `position` (AL1: its code and position).
pub(crate) fn patient_part_target(
    cx: &Ctx<'_, '_>,
    seg: &Segment<'_>,
    patient: &str,
    position: &str,
) -> Target {
    match seg.name() {
        b"NK1" => cx.target(
            "RelatedPerson",
            &[patient, "NK1", &n_key(cx, seg, position)],
            None,
        ),
        b"AL1" => {
            let code = cx.field(seg, 3).unwrap_or_default();
            cx.target(
                "AllergyIntolerance",
                &[patient, "AL1", &code, position],
                None,
            )
        }
        b"IN1" => cx.target(
            "Coverage",
            &[patient, "IN1", &n_key(cx, seg, position)],
            None,
        ),
        _ => condition_target(cx, seg, patient, position),
    }
}

/// A patient's NK1, AL1, IN1 or DG1 as the entry `t` (see [`patient_part_target`]), its fields noted.
pub(crate) fn patient_part_entry<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    seg: &Segment<'a>,
    t: &Target,
    patient: &Target,
) {
    b.segment(cx, t, seg, |cx, w| match seg.name() {
        b"NK1" => {
            related_person_body(cx, w, seg, patient);
            NK1_MAPPED
        }
        b"AL1" => {
            allergy_body(cx, w, seg, patient);
            AL1_MAPPED
        }
        b"IN1" => {
            coverage_body(cx, w, seg, patient);
            IN1_MAPPED
        }
        _ => condition_body(cx, w, seg, t, patient),
    });
}

/// An OBX and the NTE after it (`notes`) as the Observation entry `t`, linked as `links` says, their fields
/// noted.
pub(crate) fn observation_entry<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    t: &Target,
    obx: &Segment<'a>,
    notes: &[Segment<'a>],
    links: ObsLinks<'_, 'a>,
) {
    let links = ObsLinks {
        notes,
        repeat: t.repeat,
        ..links
    };
    b.segment(cx, t, obx, |cx, w| observation_body(cx, w, obx, links));
    for nte in notes {
        cx.note_unmapped(nte, NTE_MAPPED);
    }
}
