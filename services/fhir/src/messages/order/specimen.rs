//! SPM → Specimen (the SPM[Specimen] map), of an order or a result.

use super::types::identifiers;
use crate::context::{Ctx, Target, reference};
use crate::datatypes::cwe::Table;
use crate::datatypes::cx::ei_key;
use crate::datatypes::dtm::date_or_period;
use crate::datatypes::nm::{is_decimal, normalise_decimal};
use crate::json::Writer;
use crate::segments::write_items;
use hl7v2::message::Segment;

/// The fields of an SPM the SPM[Specimen] map writes.
const SPM_MAPPED: &[usize] = &[1, 2, 4, 6, 7, 8, 12, 14, 17, 18, 20, 24, 27, 30];

/// SPM-2 (EIP): the placer's identifier (EIP-1) and the filler's (EIP-2), with their v2-0203 types.
pub(super) fn specimen_ids(
    cx: &Ctx<'_, '_>,
    spm: &Segment<'_>,
) -> Vec<(Option<(String, String)>, &'static str)> {
    let Some(eip) = cx.rep1(spm, 2) else {
        return Vec::new();
    };
    [(1, "PLAC"), (2, "FILL")]
        .into_iter()
        .map(|(n, ty)| (eip.component(n).and_then(|ei| ei_key(cx, ei, true)), ty))
        .collect()
}

/// The SPM fields [`specimen_body`] writes: SPM-12 when it is a number, SPM-20 when the IG maps its code.
pub(super) fn specimen_mapped(cx: &Ctx<'_, '_>, spm: &Segment<'_>) -> Vec<usize> {
    let amount = cx.rep1(spm, 12);
    let availability = cx.field(spm, 20);
    SPM_MAPPED
        .iter()
        .copied()
        .filter(|&n| match n {
            12 => amount
                .and_then(|a| cx.comp(a, 1))
                .is_some_and(|v| is_decimal(&v)),
            20 => availability
                .as_deref()
                .is_some_and(|a| cx.lookup("YesNoIndicator[AvailabilityStatus]", a).is_some()),
            _ => true,
        })
        .collect()
}

/// The SPM[Specimen] map (SPM-2 as identifiers unless `t` repeats an earlier entry's, see `uniquify`).
pub(super) fn specimen_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    spm: &Segment<'_>,
    t: &Target,
    patient: &Target,
) {
    if !t.repeat {
        let ids: Vec<((String, String), &str)> = specimen_ids(cx, spm)
            .into_iter()
            .filter_map(|(k, ty)| Some((k?, ty)))
            .collect();
        identifiers(w, &ids);
    }
    if let Some(accession) = cx.rep1(spm, 30)
        && let Some((system, value)) = cx.cx_key(accession)
    {
        w.object("accessionIdentifier");
        w.string("system", &system);
        w.string("value", &value);
        w.end_object();
    }
    if let Some(s) = cx
        .field(spm, 20)
        .and_then(|a| cx.lookup("YesNoIndicator[AvailabilityStatus]", &a))
    {
        w.string("status", s.code);
    }
    cx.codeable_concept(
        w,
        "type",
        cx.rep1(spm, 4),
        Some(Table::new("SpecimenType", "HL70487")),
    );
    reference(w, "subject", patient);
    if let Some(d) = cx.field(spm, 18) {
        cx.write_date_time(w, "receivedTime", &d);
    }
    let collected = cx.rep1(spm, 17);
    let start = collected
        .and_then(|c| cx.comp(c, 1))
        .and_then(|d| cx.date_time(&d));
    let end = collected
        .and_then(|c| cx.comp(c, 2))
        .and_then(|d| cx.date_time(&d));
    let amount = cx.rep1(spm, 12);
    let amount_value = amount.and_then(|a| cx.comp(a, 1)).filter(|n| is_decimal(n));
    let method = cx.rep1(spm, 7);
    let site = cx.rep1(spm, 8);
    if start.is_some()
        || end.is_some()
        || amount_value.is_some()
        || method.is_some_and(|m| cx.cwe_valued(m))
        || site.is_some_and(|s| cx.cwe_valued(s))
    {
        w.object("collection");
        date_or_period(
            w,
            "collectedDateTime",
            "collectedPeriod",
            start.as_deref(),
            end.as_deref(),
        );
        if let (Some(a), Some(v)) = (amount, &amount_value) {
            w.object("quantity");
            w.number("value", &normalise_decimal(v));
            let units = a.component(2);
            let code = units.and_then(|u| cx.text(u.subcomponent(1)));
            if let Some(u) = units
                .and_then(|u| cx.text(u.subcomponent(2)))
                .or_else(|| code.clone())
            {
                w.string("unit", &u);
            }
            let system = units
                .and_then(|u| cx.text(u.subcomponent(3)))
                .and_then(|s| cx.coding_system_ref(&s));
            if let (Some(system), Some(code)) = (system, &code) {
                w.string("system", &system);
                w.string("code", code);
            }
            w.end_object();
        }
        cx.codeable_concept(
            w,
            "method",
            method,
            Some(Table::new("SpecimenCollectionMethod", "HL70488")),
        );
        cx.codeable_concept(w, "bodySite", site, None);
        w.end_object();
    }
    let additives = cx.reps(spm, 6);
    let container = cx.rep1(spm, 27);
    if !additives.is_empty() || container.is_some_and(|c| cx.cwe_valued(c)) {
        w.array("container");
        w.begin_object();
        cx.codeable_concept(w, "type", container, None);
        if let Some(a) = additives.first() {
            cx.codeable_concept(
                w,
                "additiveCodeableConcept",
                Some(*a),
                Some(Table::new("AdditivePreservative", "HL70371")),
            );
        }
        w.end_object();
        for a in additives.iter().skip(1) {
            w.begin_object();
            cx.codeable_concept(
                w,
                "additiveCodeableConcept",
                Some(*a),
                Some(Table::new("AdditivePreservative", "HL70371")),
            );
            w.end_object();
        }
        w.end_array();
    }
    let conditions = cx.reps(spm, 24);
    write_items(w, "condition", &conditions, |w, v| {
        cx.codeable_concept_item(w, *v, Some(Table::new("SpecimenCondition", "HL70493")))
    });
    if let Some(d) = cx.field(spm, 14) {
        w.array("note");
        w.begin_object();
        w.string("text", &d);
        w.end_object();
        w.end_array();
    }
}
