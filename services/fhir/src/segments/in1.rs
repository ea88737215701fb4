//! IN1 → Coverage (the IN1[Coverage] map).

use crate::context::{Ctx, Target, reference};
use crate::datatypes::cwe::Table;
use crate::datatypes::dtm::period;
use crate::json::Writer;
use hl7v2::message::Segment;

/// The IN1 fields the IN1[Coverage] map writes (the rest, when valued, are reported as unmapped).
pub(crate) const IN1_MAPPED: &[usize] = &[1, 2, 3, 4, 12, 13, 15, 17];

pub(crate) fn coverage_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    in1: &Segment<'_>,
    patient: &Target,
) {
    let plan = cx.rep1(in1, 2);
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
        cx.rep1(in1, 15),
        Some(Table::new("PlanId", "HL70086")),
    );
    reference(w, "beneficiary", patient);
    cx.codeable_concept(
        w,
        "relationship",
        cx.rep1(in1, 17),
        Some(Table::new("Relationship", "HL70063")),
    );
    let start = cx.field(in1, 12).and_then(|d| cx.date(&d));
    let end = cx.field(in1, 13).and_then(|d| cx.date(&d));
    for (n, v) in [(12, &start), (13, &end)] {
        if v.is_none() {
            cx.dropped(in1, n);
        }
    }
    period(w, "period", start.as_deref(), end.as_deref());
    // payor (1..*): the insurance company by its id (IN1-3) and name (IN1-4).
    let company = cx.rep1(in1, 3).and_then(|c| cx.cx_key(c));
    let name = cx.rep1(in1, 4).and_then(|x| cx.comp(x, 1));
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
