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
//! (DiagnosticReport, the result), `specimen`. Here: the conversion's course; the groups and the order
//! numbers and identifiers both resources write are in `types`.
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
mod types;

use crate::FhirError;
use crate::bundle::Entries;
use crate::context::{Ctx, Target};
use crate::datatypes::xcn::{Person, Practitioners};
use crate::ids::Uuid;
use crate::messages::Converted;
use crate::messages::common::{encounter_entry, patient_part_entry};
use crate::segments::nte::note_author;
use crate::segments::obx::{ObsLinks, observation_people};
use crate::segments::pid::{PID_MAPPED, patient_body};
use crate::segments::pv1::{note_encounter, pv1_participants};
use entries::{order_entries, planned_observation};
use group::group;
use plan::plan;
use request::requester;
use types::Kind;

pub(crate) fn convert(cx: &mut Ctx<'_, '_>, kind: &str, out: &mut Vec<u8>) -> Converted {
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
