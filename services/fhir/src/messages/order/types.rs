//! The groups an order or result message is read into (a patient, its orders, their observations and
//! specimens) and the order numbers that both the ServiceRequest and the DiagnosticReport write.

use crate::context::{Ctx, Target};
use crate::datatypes::cx::{ei_key, identifier_item};
use crate::json::Writer;
use crate::segments::pv1::Visit;
use hl7v2::message::Segment;

/// Which message map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// ORU_R01: results (DiagnosticReport per OBR).
    Results,
    /// ORM_O01, OML_O21: orders (ServiceRequest per ORC/OBR).
    Orders,
}

/// An OBX and the NTE segments after it.
#[derive(Debug)]
pub(super) struct Obs<'a> {
    pub(super) obx: Segment<'a>,
    pub(super) notes: Vec<Segment<'a>>,
    pub(super) target: Option<Target>,
}

/// An SPM and the OBX segments after it.
#[derive(Debug)]
pub(super) struct Spec<'a> {
    pub(super) spm: Segment<'a>,
    pub(super) obs: Vec<Obs<'a>>,
    pub(super) target: Option<Target>,
    /// False for a repeat of an SPM already written (same identifier, same content).
    pub(super) write: bool,
}

/// An ORDER_OBSERVATION (ORU) or ORDER (ORM, OML) group.
#[derive(Debug, Default)]
pub(super) struct Order<'a> {
    pub(super) orc: Option<Segment<'a>>,
    pub(super) obr: Option<Segment<'a>>,
    pub(super) notes: Vec<Segment<'a>>,
    pub(super) dg1: Vec<(Segment<'a>, Option<Target>)>,
    pub(super) obs: Vec<Obs<'a>>,
    pub(super) specs: Vec<Spec<'a>>,
    pub(super) request: Option<Target>,
    pub(super) report: Option<Target>,
}

/// A PATIENT_RESULT (ORU) or the patient of an order message, with its orders.
#[derive(Debug)]
pub(super) struct Pat<'a> {
    pub(super) pid: Segment<'a>,
    /// The first PV1 and PV2 before any order; its Encounter (pass 2) and participants (before writing).
    pub(super) visit: Visit<'a>,
    /// NK1, AL1, IN1 and DG1 outside an order, in message order, with their targets.
    pub(super) others: Vec<(Segment<'a>, Option<Target>)>,
    pub(super) obs: Vec<Obs<'a>>,
    pub(super) orders: Vec<Order<'a>>,
    pub(super) patient: Option<Target>,
    /// False for a repeat of a patient already written (same identifier).
    pub(super) write: bool,
}

/// Writes the identifiers of `keys` with the v2-0203 type `ty`.
pub(super) fn identifiers(w: &mut Writer<'_>, keys: &[((String, String), &str)]) {
    if keys.is_empty() {
        return;
    }
    w.array("identifier");
    for (k, ty) in keys {
        identifier_item(w, k, Some(ty));
    }
    w.end_array();
}

/// The order numbers as identifiers: the placer's (PLAC) and the filler's (FILL), as the ServiceRequest and
/// the DiagnosticReport both write them.
pub(super) fn order_identifiers(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, o: &Order<'_>) {
    let ids: Vec<((String, String), &str)> = placer_ids(cx, o)
        .into_iter()
        .map(|k| (k, "PLAC"))
        .chain(filler_ids(cx, o).into_iter().map(|k| (k, "FILL")))
        .collect();
    identifiers(w, &ids);
}

/// The placer order numbers of an order: ORC-2, OBR-2 (each once).
pub(super) fn placer_ids(cx: &Ctx<'_, '_>, o: &Order<'_>) -> Vec<(String, String)> {
    order_ids(cx, o, 2)
}

/// The filler order numbers of an order: ORC-3, OBR-3 (each once).
pub(super) fn filler_ids(cx: &Ctx<'_, '_>, o: &Order<'_>) -> Vec<(String, String)> {
    order_ids(cx, o, 3)
}

/// The order numbers of field `n` of ORC and OBR (each once).
pub(super) fn order_ids(cx: &Ctx<'_, '_>, o: &Order<'_>, n: usize) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for seg in [&o.orc, &o.obr].into_iter().flatten() {
        if let Some(k) = cx.rep1(seg, n).and_then(|ei| ei_key(cx, ei, false))
            && !out.contains(&k)
        {
            out.push(k);
        }
    }
    out
}
