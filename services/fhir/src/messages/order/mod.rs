//! Order and result messages, after the IG's message maps:
//!
//! - ORU_R01: PID → Patient, PV1/PV2 → Encounter, and per ORDER_OBSERVATION group ORC/OBR → ServiceRequest
//!   and DiagnosticReport (basedOn the ServiceRequest), OBX → Observation (the report's results; NTE after an
//!   OBX → its notes), SPM → Specimen (the report's specimens; OBX after an SPM → an Observation whose focus
//!   is the specimen); OBX before any order → Observation of the patient.
//! - ORM_O01 and OML_O21: PID → Patient, PV1/PV2 → Encounter, NK1 → RelatedPerson, AL1 →
//!   AllergyIntolerance, IN1 → Coverage, and per ORDER group ORC/OBR → ServiceRequest (NTE → its notes, DG1 →
//!   Condition as its reasonReference, OBX → Observation as its supportingInfo, SPM → Specimen as its
//!   specimen).
//!
//! One pass a file: `group` (the segments in their groups), `plan` (every resource's target), `entries`
//! (an order's entries); the resources of an order: `request` (ServiceRequest, the order), `report`
//! (DiagnosticReport, the result), `specimen`. Here: the groups, the conversion's course, and the order
//! numbers and identifiers both resources write.
//!
//! Practitioners from the XCN/NDL fields (ORC-12, OBR-16, OBR-32/34/35, OBX-16, NTE-5, PV1), each once;
//! MessageHeader (message Bundles) and the Provenance of the transformation as for ADT.
//!
//! Conditional updates by business identifier: ServiceRequest by the filler order number (ORC-3/OBR-3), else
//! the placer's (ORC-2/OBR-2); DiagnosticReport by OBR-3 (else ORC-3); Specimen by SPM-2 (filler, else
//! placer); Observation by OBX-21. An Observation without OBX-21 gets an id derived from its report (or
//! order, or specimen), its code (OBX-3), sub-id (OBX-4) and rank among its report's OBX of that code and
//! sub-id, so a redelivery, or a corrected report with the same filler number, updates it. A business
//! identifier that two different resources of one message carry (CDC case notifications repeat OBR-3 in
//! every OBR) is not used for a conditional update: each of them gets an id derived from it and its rank.

mod entries;
mod group;
mod plan;
mod report;
mod request;
mod specimen;

use crate::bundle::Entries;
use crate::context::{Ctx, Target};
use crate::datatypes::cx::{ei_key, identifier_item};
use crate::datatypes::xcn::{Person, Practitioners};
use crate::ids::Uuid;
use crate::json::Writer;
use crate::messages::common::{encounter_entry, patient_part_entry};
use crate::segments::nte::note_author;
use crate::segments::obx::{ObsLinks, observation_people};
use crate::segments::pid::{PID_MAPPED, patient_body};
use crate::segments::pv1::{Visit, note_encounter, pv1_participants};
use crate::{FhirError, Outcome};
use entries::{order_entries, planned_observation};
use group::group;
use hl7v2::message::Segment;
use plan::plan;
use request::requester;

/// Which message map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// ORU_R01: results (DiagnosticReport per OBR).
    Results,
    /// ORM_O01, OML_O21: orders (ServiceRequest per ORC/OBR).
    Orders,
}

/// An OBX and the NTE segments after it.
#[derive(Debug)]
struct Obs<'a> {
    obx: Segment<'a>,
    notes: Vec<Segment<'a>>,
    target: Option<Target>,
}

/// An SPM and the OBX segments after it.
#[derive(Debug)]
struct Spec<'a> {
    spm: Segment<'a>,
    obs: Vec<Obs<'a>>,
    target: Option<Target>,
    /// False for a repeat of an SPM already written (same identifier, same content).
    write: bool,
}

/// An ORDER_OBSERVATION (ORU) or ORDER (ORM, OML) group.
#[derive(Debug, Default)]
struct Order<'a> {
    orc: Option<Segment<'a>>,
    obr: Option<Segment<'a>>,
    notes: Vec<Segment<'a>>,
    dg1: Vec<(Segment<'a>, Option<Target>)>,
    obs: Vec<Obs<'a>>,
    specs: Vec<Spec<'a>>,
    request: Option<Target>,
    report: Option<Target>,
}

/// A PATIENT_RESULT (ORU) or the patient of an order message, with its orders.
#[derive(Debug)]
struct Pat<'a> {
    pid: Segment<'a>,
    /// The first PV1 and PV2 before any order; its Encounter (pass 2) and participants (before writing).
    visit: Visit<'a>,
    /// NK1, AL1, IN1 and DG1 outside an order, in message order, with their targets.
    others: Vec<(Segment<'a>, Option<Target>)>,
    obs: Vec<Obs<'a>>,
    orders: Vec<Order<'a>>,
    patient: Option<Target>,
    /// False for a repeat of a patient already written (same identifier).
    write: bool,
}

pub(crate) fn convert(
    cx: &mut Ctx<'_, '_>,
    kind: &str,
    out: &mut Vec<u8>,
) -> Result<Outcome, FhirError> {
    let map = if kind.starts_with("ORU") {
        Kind::Results
    } else {
        Kind::Orders
    };
    let key = cx.message_key();
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();
    let (mut pats, orphans) = group(cx, map);
    // An order or a result needs its patient (ServiceRequest.subject is 1..1). A message with neither
    // patient nor order gives a Bundle without resources, its segments reported as unmapped.
    if orphans {
        return Err(FhirError::Missing {
            message: kind.to_owned(),
            segment: "PID",
        });
    }
    plan(cx, map, &msg_key, &mut pats);

    // The practitioners, each once, in the order they are named.
    let mut practitioners = Practitioners::default();
    for p in &mut pats {
        if let Some(pv1) = &p.visit.pv1 {
            p.visit.participants = pv1_participants(cx, pv1);
        }
        for (_, _, _, t, xcn) in &p.visit.participants {
            practitioners.add_target(t, Person::Xcn(*xcn));
        }
        for o in &p.obs {
            observation_people(cx, &mut practitioners, &o.obx, &o.notes);
        }
        for order in &p.orders {
            if let Some(x) = requester(cx, order) {
                practitioners.add(cx, x);
            }
            if map == Kind::Results
                && let Some(obr) = &order.obr
            {
                for n in [32, 34, 35] {
                    for r in cx.reps(obr, n) {
                        practitioners.add(cx, Person::of_ndl(cx, r));
                    }
                }
            }
            for nte in &order.notes {
                note_author(cx, &mut practitioners, nte);
            }
            let spec_obs = order.specs.iter().flat_map(|s| &s.obs);
            for o in order.obs.iter().chain(spec_obs) {
                observation_people(cx, &mut practitioners, &o.obx, &o.notes);
            }
        }
    }

    let mut b = Entries::open(cx, out, &key, || {
        let mut focus: Vec<&Target> = pats
            .iter()
            .flat_map(|p| &p.orders)
            .filter_map(|o| match map {
                Kind::Results => o.report.as_ref(),
                Kind::Orders => o.request.as_ref(),
            })
            .collect();
        if focus.is_empty() {
            focus.extend(pats.iter().filter_map(|p| p.patient.as_ref()));
        }
        focus
    })?;

    let mut written: std::collections::HashSet<Uuid> = std::collections::HashSet::new();
    for (i, p) in pats.iter().enumerate() {
        let patient = p.patient.as_ref().expect("planned");
        // A repeated patient is written once; its PID's fields count as mapped like the first one's.
        if p.write {
            b.segment(cx, patient, &p.pid, |cx, w| patient_body(cx, w, &p.pid));
        } else {
            cx.note_unmapped(&p.pid, PID_MAPPED);
        }
        if i == 0 {
            practitioners.write(cx, &mut b);
        }
        if let (Some(pv1), Some(enc)) = (&p.visit.pv1, &p.visit.encounter)
            && !written.insert(enc.id)
        {
            // The visit of an earlier patient group: its Encounter is written once, its PV1 and PV2 noted.
            note_encounter(cx, pv1, p.visit.pv2.as_ref());
        } else {
            encounter_entry(cx, &mut b, None, &p.visit, patient);
        }
        for (seg, t) in &p.others {
            patient_part_entry(cx, &mut b, seg, t.as_ref().expect("planned"), patient);
        }
        for o in &p.obs {
            let links = ObsLinks {
                patient: Some(patient),
                encounter: p.visit.encounter.as_ref(),
                ..ObsLinks::default()
            };
            planned_observation(cx, &mut b, o, links);
        }
        for order in &p.orders {
            order_entries(cx, &mut b, map, p, order);
        }
    }

    // No Provenance without a resource (a message with neither patient nor order).
    Ok(b.finish(cx, &msg_key, None))
}

/// Writes the identifiers of `keys` with the v2-0203 type `ty`.
fn identifiers(w: &mut Writer<'_>, keys: &[((String, String), &str)]) {
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
fn order_identifiers(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, o: &Order<'_>) {
    let ids: Vec<((String, String), &str)> = placer_ids(cx, o)
        .into_iter()
        .map(|k| (k, "PLAC"))
        .chain(filler_ids(cx, o).into_iter().map(|k| (k, "FILL")))
        .collect();
    identifiers(w, &ids);
}

/// The placer order numbers of an order: ORC-2, OBR-2 (each once).
fn placer_ids(cx: &Ctx<'_, '_>, o: &Order<'_>) -> Vec<(String, String)> {
    order_ids(cx, o, 2)
}

/// The filler order numbers of an order: ORC-3, OBR-3 (each once).
fn filler_ids(cx: &Ctx<'_, '_>, o: &Order<'_>) -> Vec<(String, String)> {
    order_ids(cx, o, 3)
}

/// The order numbers of field `n` of ORC and OBR (each once).
fn order_ids(cx: &Ctx<'_, '_>, o: &Order<'_>, n: usize) -> Vec<(String, String)> {
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
