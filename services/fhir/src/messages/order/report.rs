//! The result (ORU_R01): OBR → DiagnosticReport.

use super::types::{Order, order_identifiers};
use crate::context::{Ctx, Target, reference, references};
use crate::datatypes::dtm::date_or_period;
use crate::datatypes::xcn::{Person, practitioner_refs};
use crate::json::Writer;

/// The OBR[DiagnosticReport] map (and ORC[DiagnosticReport]'s identifiers). Returns the OBR fields it mapped
/// beyond those of the ServiceRequest.
#[allow(clippy::too_many_arguments)]
pub(super) fn report_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    o: &Order<'_>,
    request: &Target,
    patient: &Target,
    encounter: Option<&Target>,
    observations: &[&Target],
    specimens: &[&Target],
) -> Vec<usize> {
    let mut mapped = vec![7, 8, 24, 32, 34, 35];
    // A repeat of an earlier entry's condition carries no order number (see `uniquify`).
    if !o.report.as_ref().is_some_and(|t| t.repeat) {
        mapped.extend([2, 3]);
        order_identifiers(cx, w, o);
    }
    references(w, "basedOn", &[request]);
    let obr = o.obr.as_ref();
    // status (1..1): OBR-25 through the IG's ResultStatus map, else unknown.
    let status = obr
        .and_then(|obr| cx.field(obr, 25))
        .and_then(|s| cx.lookup("ResultStatus[Non-Queries]", &s));
    if status.is_some() {
        mapped.push(25);
    }
    w.string("status", status.map_or("unknown", |s| s.code));
    if let Some(section) = obr.and_then(|obr| cx.field(obr, 24)) {
        w.array("category");
        w.begin_object();
        w.array("coding");
        cx.mapped_coding(w, "DiagnosticServiceSectionID", &section, "HL70074");
        w.end_array();
        w.end_object();
        w.end_array();
    }
    // code (1..1): OBR-4, else the text "unknown".
    if !cx.codeable_concept(
        w,
        "code",
        obr.and_then(|obr| cx.seg_field(obr, 4))
            .and_then(|f| f.repetition(1)),
        None,
    ) {
        w.object("code");
        w.string("text", "unknown");
        w.end_object();
    }
    reference(w, "subject", patient);
    if let Some(e) = encounter {
        reference(w, "encounter", e);
    }
    if let Some(obr) = obr {
        let start = cx.field(obr, 7).and_then(|d| cx.date_time(&d));
        let end = cx.field(obr, 8).and_then(|d| cx.date_time(&d));
        for (n, v) in [(7, &start), (8, &end)] {
            if v.is_none() {
                cx.dropped(obr, n);
            }
        }
        date_or_period(
            w,
            "effectiveDateTime",
            "effectivePeriod",
            start.as_deref(),
            end.as_deref(),
        );
        if let Some(i) = cx.field(obr, 22).and_then(|d| cx.instant(&d)) {
            mapped.push(22);
            w.string("issued", &i);
        }
        let people = |n: usize| -> Vec<Person<'_>> {
            cx.reps(obr, n)
                .into_iter()
                .map(|r| Person::of_ndl(cx, r))
                .collect()
        };
        let performers: Vec<Person<'_>> = people(34).into_iter().chain(people(35)).collect();
        practitioner_refs(cx, w, "performer", &performers);
        practitioner_refs(cx, w, "resultsInterpreter", &people(32));
    }
    references(w, "specimen", specimens);
    references(w, "result", observations);
    mapped
}
