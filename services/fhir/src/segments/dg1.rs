//! DG1 → Condition (the DG1[Condition] map).

use crate::context::{Ctx, Target, reference};
use crate::datatypes::cx::ei_key;
use crate::json::Writer;
use hl7v2::message::Segment;

/// The DG1 fields the DG1[Condition] map writes (the rest, when valued, are reported as unmapped).
pub(crate) const DG1_MAPPED: &[usize] = &[1, 3, 4, 5, 19, 20];

/// A DG1 whose identifier an earlier entry carries: DG1-20 reported.
const DG1_MAPPED_REPEAT: &[usize] = &[1, 3, 4, 5, 19];

/// The DG1[Condition] map; DG1-20 as the identifier unless `t` repeats an earlier entry's (see
/// [`Target::repeat`]). Returns the DG1 fields it mapped.
pub(crate) fn condition_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    dg1: &Segment<'_>,
    t: &Target,
    patient: &Target,
) -> &'static [usize] {
    if !t.repeat
        && let Some((system, value)) = condition_key(cx, dg1)
    {
        w.array("identifier");
        w.begin_object();
        w.string("system", &system);
        w.string("value", &value);
        w.end_object();
        w.end_array();
    }
    let code = cx.rep1(dg1, 3);
    if code.is_some_and(|c| cx.cwe_valued(c)) {
        cx.codeable_concept(w, "code", code, None);
    } else if let Some(text) = cx.field(dg1, 4) {
        w.object("code");
        w.string("text", &text);
        w.end_object();
    }
    reference(w, "subject", patient);
    if let Some(d) = cx.field(dg1, 5) {
        cx.write_date_time(w, "onsetDateTime", &d);
    }
    if let Some(d) = cx.field(dg1, 19) {
        cx.write_date_time(w, "recordedDate", &d);
    }
    if t.repeat {
        DG1_MAPPED_REPEAT
    } else {
        DG1_MAPPED
    }
}

/// The Condition of a DG1: by its identifier (DG1-20), else by the patient, its code and `position`.
pub(crate) fn condition_target(
    cx: &Ctx<'_, '_>,
    dg1: &Segment<'_>,
    patient_key: &str,
    position: &str,
) -> Target {
    let by = condition_key(cx, dg1);
    let code = cx.field(dg1, 3).unwrap_or_default();
    match by {
        Some((s, v)) => cx.target("Condition", &[&s, &v], Some((s.clone(), v.clone()))),
        None => cx.target("Condition", &[patient_key, "DG1", &code, position], None),
    }
}

/// DG1-20 as the Condition's business identifier. An id without an assigning authority is the sender's (its
/// authority in the route, else MSH-4), as patient identifiers are: `1` from two senders is two diagnoses of two
/// patients, not one Condition whose subject the later message would take. Without any scope it is no business
/// identifier at all (the Condition is keyed by its patient), never a global one.
fn condition_key(cx: &Ctx<'_, '_>, dg1: &Segment<'_>) -> Option<(String, String)> {
    let (system, value) = cx.rep1(dg1, 20).and_then(|ei| ei_key(cx, ei, false))?;
    if system != crate::datatypes::cx::UNSCOPED_EI_SYSTEM {
        return Some((system, value));
    }
    Some((cx.sender_scope()?.to_owned(), value))
}
