//! NK1 → RelatedPerson (the NK1[RelatedPerson] map).

use crate::context::{Ctx, Target, reference};
use crate::datatypes::cwe::Table;
use crate::datatypes::dtm::period;
use crate::json::Writer;
use crate::segments::write_items;
use hl7v2::message::{Segment, Value};

/// The NK1 fields the NK1[RelatedPerson] map writes (the rest, when valued, are reported as unmapped).
pub(crate) const NK1_MAPPED: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16];

pub(crate) fn related_person_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    nk1: &Segment<'_>,
    patient: &Target,
) {
    reference(w, "patient", patient);
    let rel = cx.rep1(nk1, 3);
    let role = cx.rep1(nk1, 7);
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
            cx.lookup("AdministrativeSex", &g)
                .map_or("unknown", |c| c.code),
        );
    }
    if let Some(b) = cx.field(nk1, 16).and_then(|b| cx.date(&b)) {
        w.string("birthDate", &b);
    }
    let addresses = cx.reps(nk1, 4);
    write_items(w, "address", &addresses, |w, v| cx.address(w, *v));
    let start = cx.field(nk1, 8).and_then(|d| cx.date(&d));
    let end = cx.field(nk1, 9).and_then(|d| cx.date(&d));
    period(w, "period", start.as_deref(), end.as_deref());
}
