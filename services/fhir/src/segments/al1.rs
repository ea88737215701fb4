//! AL1 → AllergyIntolerance (the AL1[AllergyIntolerance] map).

use crate::context::{Ctx, Target, reference};
use crate::json::Writer;
use hl7v2::message::Segment;

/// The AL1 fields the AL1[AllergyIntolerance] map writes (the rest, when valued, are reported as unmapped).
pub(crate) const AL1_MAPPED: &[usize] = &[1, 2, 3, 4, 5, 6];

pub(crate) fn allergy_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    al1: &Segment<'_>,
    patient: &Target,
) {
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
        let ty = cx.lookup("AllergyType", &t);
        let cat = cx.lookup("AllergenType[AllergyIntoleranceCategory]", &t);
        if let Some(ty) = ty {
            w.string("type", ty.code);
        }
        if let Some(cat) = cat {
            w.array("category");
            w.item_string(cat.code);
            w.end_array();
        }
        if ty.is_none() && cat.is_none() {
            cx.dropped(al1, 2);
        }
    }
    let severity = cx.field(al1, 4);
    if let Some(c) = severity
        .as_deref()
        .and_then(|s| cx.lookup("AllergySeverity[AllergyIntolerance.criticality]", s))
    {
        w.string("criticality", c.code);
    }
    cx.codeable_concept(w, "code", cx.rep1(al1, 3), None);
    reference(w, "patient", patient);
    if let Some(d) = cx.field(al1, 6) {
        cx.write_date_time(w, "onsetDateTime", &d);
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
            .and_then(|s| cx.lookup("AllergySeverity[AllergyIntolerance.reaction.severity]", s))
        {
            w.string("severity", s.code);
        }
        w.end_object();
        w.end_array();
    }
}
