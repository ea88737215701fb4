//! The order (ORM_O01, OML_O21, and the order an ORU result is based on): ORC/OBR → ServiceRequest, and who
//! requested it.

use super::types::{Kind, Order, order_identifiers};
use crate::context::{Ctx, Target, reference, references};
use crate::datatypes::cwe::Table;
use crate::datatypes::cx::ei_key;
use crate::datatypes::xcn::{Person, practitioner_target};
use crate::json::Writer;
use crate::segments::nte::notes_items;
use crate::segments::write_items;

/// Who ordered: ORC-12, else OBR-16 (first repetition).
pub(super) fn requester<'a>(cx: &Ctx<'a, '_>, o: &Order<'a>) -> Option<Person<'a>> {
    [(o.orc.as_ref(), 12), (o.obr.as_ref(), 16)]
        .into_iter()
        .filter_map(|(seg, n)| seg?.field(n)?.repetition(1))
        .map(Person::Xcn)
        .find(|p| practitioner_target(cx, *p).is_some())
}

/// The ORC[ServiceRequest] and OBR[ServiceRequest] maps (and NTE[ServiceRequest]). Returns the ORC and OBR
/// fields it mapped.
#[allow(clippy::too_many_arguments)]
pub(super) fn service_request_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    map: Kind,
    o: &Order<'_>,
    patient: &Target,
    encounter: Option<&Target>,
    conditions: &[&Target],
    observations: &[&Target],
    specimens: &[&Target],
) -> (Vec<usize>, Vec<usize>) {
    let mut orc_mapped = Vec::with_capacity(8);
    let mut obr_mapped = vec![1, 4, 31];
    // A repeat of an earlier entry's condition carries no order number (see `uniquify`).
    if !o.request.as_ref().is_some_and(|t| t.repeat) {
        orc_mapped.extend([2, 3]);
        obr_mapped.extend([2, 3]);
        order_identifiers(cx, w, o);
    }
    if let Some(orc) = &o.orc
        && let Some((system, value)) = cx.rep1(orc, 4).and_then(|ei| ei_key(cx, ei, false))
    {
        orc_mapped.push(4);
        // The IG's type, PGN, is not a code of v2-0203 (terminology.hl7.org): as text.
        w.object("requisition");
        w.object("type");
        w.string("text", "Placer Group Number");
        w.end_object();
        w.string("system", &system);
        w.string("value", &value);
        w.end_object();
    }
    // status (1..1): ORC-5 (OrderStatus), else ORC-1 (OrderControlCode), else unknown.
    let orc = o.orc.as_ref();
    let by_status = orc
        .and_then(|orc| cx.field(orc, 5))
        .and_then(|s| cx.lookup("OrderStatus", &s));
    let by_control = orc
        .filter(|orc| cx.field(orc, 5).is_none())
        .and_then(|orc| cx.field(orc, 1))
        .and_then(|c| cx.lookup("OrderControlCode[ServiceRequest.status]", &c));
    let status = match (by_status, by_control) {
        (Some(s), _) => {
            orc_mapped.push(5);
            s.code
        }
        (None, Some(c)) => {
            orc_mapped.push(1);
            c.code
        }
        _ => "unknown",
    };
    w.string("status", status);
    let obr = o.obr.as_ref();
    let intent = match obr.and_then(|obr| cx.field(obr, 11)).as_deref() {
        Some("G") => {
            obr_mapped.push(11);
            "reflex-order"
        }
        _ => "order",
    };
    w.string("intent", intent);
    if let Some(p) = obr
        .and_then(|obr| cx.field(obr, 5))
        .and_then(|p| cx.lookup("ExtendedPriorityCodes", &p))
    {
        obr_mapped.push(5);
        w.string("priority", p.code);
    }
    cx.codeable_concept(
        w,
        "code",
        obr.and_then(|obr| cx.seg_field(obr, 4))
            .and_then(|f| f.repetition(1)),
        None,
    );
    reference(w, "subject", patient);
    if let Some(e) = encounter {
        reference(w, "encounter", e);
    }
    if let Some(d) = obr
        .and_then(|obr| cx.field(obr, 6))
        .and_then(|d| cx.date_time(&d))
    {
        obr_mapped.push(6);
        w.string("occurrenceDateTime", &d);
    }
    if let Some(orc) = orc
        && cx.field(orc, 1).as_deref() == Some("NW")
        && let Some(d) = cx.field(orc, 9).and_then(|d| cx.date_time(&d))
    {
        orc_mapped.push(9);
        w.string("authoredOn", &d);
    }
    if let Some(p) = requester(cx, o)
        && let Some(t) = practitioner_target(cx, p)
    {
        reference(w, "requester", &t);
        orc_mapped.push(12);
        // OBR-16 is written when ORC-12 names no one, or names the same practitioner.
        let obr16 = obr
            .and_then(|obr| cx.seg_field(obr, 16))
            .and_then(|f| f.repetition(1))
            .and_then(|x| practitioner_target(cx, Person::Xcn(x)));
        if obr16.is_none_or(|o| o.id == t.id) {
            obr_mapped.push(16);
        }
    }
    if let Some(order_type) = orc
        .and_then(|orc| cx.seg_field(orc, 29))
        .and_then(|f| f.repetition(1))
        .filter(|t| cx.cwe_valued(*t))
    {
        orc_mapped.push(29);
        w.array("locationCode");
        cx.codeable_concept_item(w, order_type, Some(Table::new("OrderType", "HL70482")));
        w.end_array();
    }
    if let Some(obr) = obr {
        let reasons = cx.reps(obr, 31);
        write_items(w, "reasonCode", &reasons, |w, v| {
            cx.codeable_concept_item(w, *v, None)
        });
    }
    references(w, "reasonReference", conditions);
    if map == Kind::Orders {
        references(w, "supportingInfo", observations);
        references(w, "specimen", specimens);
    }
    notes_items(cx, w, &o.notes);
    (orc_mapped, obr_mapped)
}
