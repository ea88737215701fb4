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

use crate::bundle::Entries;
use crate::context::{Ctx, Target, reference, references};
use crate::datatypes::cwe::{Table, primary_coding};
use crate::datatypes::cx::{ei_key, identifier_item};
use crate::datatypes::dtm::date_or_period;
use crate::datatypes::nm::{is_decimal, normalise_decimal};
use crate::datatypes::xcn::{Person, Practitioners, practitioner_refs, practitioner_target};
use crate::ids::{Uuid, uuid_of};
use crate::json::Writer;
use crate::messages::common::{
    Visit, encounter_entry, observation_entry, patient_part_entry, patient_part_target,
};
use crate::segments::dg1::condition_target;
use crate::segments::msh::MSH_MAPPED;
use crate::segments::nte::{NTE_MAPPED, note_author, notes_items};
use crate::segments::obx::{ObsLinks, observation_people, observation_target};
use crate::segments::pid::{PID_MAPPED, patient_body, patient_target};
use crate::segments::pv1::{encounter_target, note_encounter, pv1_participants};
use crate::segments::{coded_target, n_key, write_items};
use crate::{FhirError, Outcome};
use hl7v2::message::Segment;
use std::collections::HashMap;

/// The fields of an SPM the SPM[Specimen] map writes.
const SPM_MAPPED: &[usize] = &[1, 2, 4, 6, 7, 8, 12, 14, 17, 18, 20, 24, 27, 30];

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
    pv1: Option<Segment<'a>>,
    pv2: Option<Segment<'a>>,
    /// NK1, AL1, IN1 and DG1 outside an order, in message order, with their targets.
    others: Vec<(Segment<'a>, Option<Target>)>,
    obs: Vec<Obs<'a>>,
    orders: Vec<Order<'a>>,
    patient: Option<Target>,
    encounter: Option<Target>,
    /// False for a repeat of a patient already written (same identifier).
    write: bool,
}

/// Where an NTE or OBX attaches: the last segment that opens something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Anchor {
    None,
    Patient,
    Order,
    Obx,
    Spm,
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
    let mut participants = Vec::new();
    for p in &pats {
        let part = p
            .pv1
            .as_ref()
            .map(|pv1| pv1_participants(cx, pv1))
            .unwrap_or_default();
        for (_, _, _, t, xcn) in &part {
            practitioners.add_target(t, Person::Xcn(*xcn));
        }
        participants.push(part);
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
        if let (Some(pv1), Some(enc)) = (&p.pv1, &p.encounter)
            && !written.insert(enc.id)
        {
            // The visit of an earlier patient group: its Encounter is written once, its PV1 and PV2 noted.
            note_encounter(cx, pv1, p.pv2.as_ref());
        } else {
            let visit_of = Visit {
                pv1: p.pv1.as_ref(),
                pv2: p.pv2.as_ref(),
                encounter: p.encounter.as_ref(),
                participants: &participants[i],
            };
            encounter_entry(cx, &mut b, None, &visit_of, patient);
        }
        for (seg, t) in &p.others {
            patient_part_entry(cx, &mut b, seg, t.as_ref().expect("planned"), patient);
        }
        for o in &p.obs {
            let links = ObsLinks {
                patient: Some(patient),
                encounter: p.encounter.as_ref(),
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

/// Pass 1: the message's segments in their groups; segments no map covers are reported here. True with
/// them when an ORC, OBR or SPM comes before any PID.
fn group<'a>(cx: &mut Ctx<'a, '_>, map: Kind) -> (Vec<Pat<'a>>, bool) {
    let msg = cx.msg;
    let mut pats: Vec<Pat<'a>> = Vec::new();
    let mut orphans = false;
    let mut anchor = Anchor::None;
    for seg in msg.segments() {
        let name = seg.name();
        match name {
            b"MSH" => {
                cx.note_unmapped(&seg, MSH_MAPPED);
                continue;
            }
            b"PID" => {
                pats.push(Pat {
                    pid: seg,
                    pv1: None,
                    pv2: None,
                    others: Vec::new(),
                    obs: Vec::new(),
                    orders: Vec::new(),
                    patient: None,
                    encounter: None,
                    write: true,
                });
                anchor = Anchor::Patient;
                continue;
            }
            _ => {}
        }
        let Some(p) = pats.last_mut() else {
            orphans |= matches!(name, b"ORC" | b"OBR" | b"SPM");
            cx.note_unmapped_segment(&seg);
            continue;
        };
        match name {
            b"PV1" if p.pv1.is_none() && p.orders.is_empty() => {
                p.pv1 = Some(seg);
                anchor = Anchor::Patient;
            }
            b"PV2" if p.pv2.is_none() && p.pv1.is_some() && p.orders.is_empty() => {
                p.pv2 = Some(seg);
            }
            b"NK1" | b"AL1" | b"IN1" if p.orders.is_empty() => {
                p.others.push((seg, None));
                anchor = Anchor::Patient;
            }
            b"DG1" => match p.orders.last_mut() {
                Some(o) if map == Kind::Orders => o.dg1.push((seg, None)),
                None if map == Kind::Orders => p.others.push((seg, None)),
                _ => cx.note_unmapped_segment(&seg),
            },
            b"ORC" => {
                p.orders.push(Order {
                    orc: Some(seg),
                    ..Order::default()
                });
                anchor = Anchor::Order;
            }
            b"OBR" => {
                match p.orders.last_mut() {
                    Some(o) if o.obr.is_none() && o.obs.is_empty() && o.specs.is_empty() => {
                        o.obr = Some(seg);
                    }
                    _ => p.orders.push(Order {
                        obr: Some(seg),
                        ..Order::default()
                    }),
                }
                anchor = Anchor::Order;
            }
            b"NTE" => {
                let notes = match (anchor, p.orders.last_mut()) {
                    (Anchor::Obx, Some(o)) => match o.specs.last_mut() {
                        Some(s) if !s.obs.is_empty() => s.obs.last_mut().map(|x| &mut x.notes),
                        _ => o.obs.last_mut().map(|x| &mut x.notes),
                    },
                    (Anchor::Obx, None) => p.obs.last_mut().map(|x| &mut x.notes),
                    (Anchor::Order, Some(o)) => Some(&mut o.notes),
                    _ => None,
                };
                match notes {
                    Some(n) => n.push(seg),
                    None => cx.note_unmapped_segment(&seg),
                }
            }
            b"OBX" => {
                let obs = Obs {
                    obx: seg,
                    notes: Vec::new(),
                    target: None,
                };
                match p.orders.last_mut() {
                    // An OBX between ORC and OBR (ORU's ORDER_DOCUMENT): the IG has no map for it.
                    Some(o) if o.obr.is_none() && map == Kind::Results => {
                        cx.note_unmapped_segment(&seg);
                        anchor = Anchor::None;
                        continue;
                    }
                    Some(o) => match o.specs.last_mut() {
                        Some(s) if matches!(anchor, Anchor::Spm) || !s.obs.is_empty() => {
                            s.obs.push(obs)
                        }
                        _ => o.obs.push(obs),
                    },
                    None => p.obs.push(obs),
                }
                anchor = Anchor::Obx;
            }
            b"SPM" => match p.orders.last_mut() {
                Some(o) => {
                    o.specs.push(Spec {
                        spm: seg,
                        obs: Vec::new(),
                        target: None,
                        write: true,
                    });
                    anchor = Anchor::Spm;
                }
                None => cx.note_unmapped_segment(&seg),
            },
            _ => {
                cx.note_unmapped_segment(&seg);
                // What follows a segment no map covers (TXA, FT1, SAC...) does not attach to what came before.
                if !matches!(name, b"PRT" | b"TQ1" | b"TQ2" | b"CTD" | b"TCD") {
                    anchor = Anchor::None;
                }
            }
        }
    }
    (pats, orphans)
}

/// Pass 2: every resource's target (id, and the business identifier a transaction updates it by).
fn plan(cx: &Ctx<'_, '_>, map: Kind, msg_key: &[&str], pats: &mut [Pat<'_>]) {
    let mut patients: std::collections::HashSet<Uuid> = std::collections::HashSet::new();
    for (pi, p) in pats.iter_mut().enumerate() {
        let pn = pi.to_string();
        let fallback: Vec<&str> = msg_key.iter().copied().chain([pn.as_str()]).collect();
        let patient = patient_target(cx, &p.pid, &fallback);
        p.write = patients.insert(patient.id);
        p.encounter = p
            .pv1
            .as_ref()
            .and_then(|pv1| encounter_target(cx, pv1, Some(&patient)));
        for (i, (seg, t)) in p.others.iter_mut().enumerate() {
            *t = Some(patient_part_target(cx, seg, &patient.id, &i.to_string()));
        }
        for (oi, o) in p.orders.iter_mut().enumerate() {
            let on = format!("{pi}.{oi}");
            let order_key: Vec<&str> = msg_key.iter().copied().chain([on.as_str()]).collect();
            let placer = placer_ids(cx, o).into_iter().next();
            let filler = filler_ids(cx, o).into_iter().next();
            let code = order_code(cx, o);
            o.request = Some(match filler.clone().or(placer) {
                Some(key) => coded_target(cx, "ServiceRequest", key, code.clone()),
                None => cx.target("ServiceRequest", &order_key, None),
            });
            if map == Kind::Results {
                o.report = Some(match filler {
                    Some(key) => coded_target(cx, "DiagnosticReport", key, code),
                    None => cx.target("DiagnosticReport", &order_key, None),
                });
            }
            for (i, (seg, t)) in o.dg1.iter_mut().enumerate() {
                *t = Some(condition_target(cx, seg, &patient.id, &format!("{on}.{i}")));
            }
            let parent = o.report.as_ref().or(o.request.as_ref()).expect("planned");
            let parent_id = parent.id;
            for (si, s) in o.specs.iter_mut().enumerate() {
                let by = specimen_ids(cx, &s.spm)
                    .into_iter()
                    .rev()
                    .find_map(|(k, _)| k);
                let n = n_key(cx, &s.spm, &si.to_string());
                s.target = Some(match by {
                    Some((sys, v)) => by_identifier(cx, "Specimen", (sys, v)),
                    None => cx.target("Specimen", &[&parent_id, "SPM", &n], None),
                });
            }
        }
        p.patient = Some(patient);
    }
    // A repeated SPM (same identifier, same segment) is the same specimen: written once.
    let mut seen: std::collections::HashSet<(Uuid, &[u8])> = std::collections::HashSet::new();
    for s in pats
        .iter_mut()
        .flat_map(|p| &mut p.orders)
        .flat_map(|o| &mut o.specs)
    {
        let id = s.target.as_ref().expect("planned").id;
        if !seen.insert((id, s.spm.raw())) {
            s.write = false;
        }
    }
    uniquify(pats);

    // Observations: by OBX-21, else by their parent, code, sub-id and rank.
    let msg_obs_key = msg_key.join("|");
    for p in pats.iter_mut() {
        let patient_id = p.patient.as_ref().expect("planned").id;
        plan_observations(cx, &[&msg_obs_key, &patient_id], &mut p.obs);
        for o in &mut p.orders {
            let parent = o.report.as_ref().or(o.request.as_ref()).expect("planned");
            let parent_id = parent.id;
            plan_observations(cx, &[&parent_id], &mut o.obs);
            for s in &mut o.specs {
                let sid = s.target.as_ref().expect("planned").id;
                plan_observations(cx, &[&parent_id, &sid], &mut s.obs);
            }
        }
    }
    uniquify(pats);
}

/// A target updated by its business identifier.
fn by_identifier(cx: &Ctx<'_, '_>, rtype: &'static str, key: (String, String)) -> Target {
    cx.target(rtype, &[&key.0, &key.1], Some(key.clone()))
}

/// The code of an order (OBR-4, first repetition), as its ServiceRequest and DiagnosticReport write it.
fn order_code(cx: &Ctx<'_, '_>, o: &Order<'_>) -> Option<(Option<String>, String)> {
    let obr = o.obr.as_ref()?;
    primary_coding(cx, cx.seg_field(obr, 4).and_then(|f| f.repetition(1)))
}

fn plan_observations(cx: &Ctx<'_, '_>, parent: &[&str], obs: &mut [Obs<'_>]) {
    if obs.is_empty() {
        return;
    }
    // The parent's parts as one (joined by the separator `uuid_of` puts between parts: the same id), so each
    // observation's key is an array, not a Vec of its own.
    let parent = parent.join("\u{1f}");
    let mut ranks: HashMap<String, usize> = HashMap::with_capacity(obs.len());
    let mut code_key = String::with_capacity(32);
    for o in obs {
        let code = cx.rep1(&o.obx, 3);
        // `<code>^<system>^<sub-id>`.
        code_key.clear();
        for (i, part) in [
            code.and_then(|c| cx.comp(c, 1)),
            code.and_then(|c| cx.comp(c, 3)),
            cx.field(&o.obx, 4),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                code_key.push('^');
            }
            code_key.push_str(part.as_deref().unwrap_or_default());
        }
        let rank = match ranks.get_mut(code_key.as_str()) {
            Some(r) => {
                *r += 1;
                *r
            }
            None => {
                ranks.insert(code_key.clone(), 1);
                1
            }
        };
        let mut r = itoa::Buffer::new();
        let r = r.format(rank);
        o.target = Some(observation_target(
            cx,
            &o.obx,
            &[&parent, "OBX", &code_key, r],
        ));
    }
}

/// Every target that may carry a business identifier, in message order.
fn each_target<'p>(pats: &'p mut [Pat<'_>]) -> Vec<&'p mut Target> {
    let mut out = Vec::new();
    for p in pats {
        out.extend(p.others.iter_mut().filter_map(|(_, t)| t.as_mut()));
        out.extend(p.obs.iter_mut().filter_map(|o| o.target.as_mut()));
        for o in &mut p.orders {
            out.extend(o.request.as_mut());
            out.extend(o.report.as_mut());
            out.extend(o.dg1.iter_mut().filter_map(|(_, t)| t.as_mut()));
            out.extend(o.obs.iter_mut().filter_map(|o| o.target.as_mut()));
            for s in &mut o.specs {
                if s.write {
                    out.extend(s.target.as_mut());
                }
                out.extend(s.obs.iter_mut().filter_map(|o| o.target.as_mut()));
            }
        }
    }
    out
}

/// A condition (business identifier, and code when it names one) two resources of the message share is used
/// by the first only (a transaction may not hold the same conditional update twice). The others get an id
/// derived from the condition and their rank among its resources (so a redelivery updates them) and are marked
/// [`Target::repeat`]: they do not carry the identifier, which would make the first one's condition match
/// several resources on the server.
///
/// A target by id whose id an earlier one has (code-less resources under one order number, see
/// `coded_target`) gets one derived from it and its rank.
fn uniquify(pats: &mut [Pat<'_>]) {
    let mut rank: HashMap<String, usize> = HashMap::new();
    let mut ids: HashMap<Uuid, usize> = HashMap::new();
    for t in each_target(pats) {
        let Some((s, v)) = &t.by else {
            let r = ids.entry(t.id).or_default();
            *r += 1;
            if *r > 1 {
                let mut n = String::with_capacity(4);
                n.push('#');
                n.push_str(itoa::Buffer::new().format(*r));
                t.id = uuid_of(t.rtype, &[&t.id, &n]);
            }
            continue;
        };
        let (cs, cc) = t.code.as_ref().map_or(("", ""), |(cs, cc)| {
            (cs.as_deref().unwrap_or_default(), cc.as_str())
        });
        // Unit separators: no system, value or code holds one.
        let r = rank
            .entry(format!("{}\u{1f}{s}\u{1f}{v}\u{1f}{cs}\u{1f}{cc}", t.rtype))
            .or_default();
        *r += 1;
        if *r == 1 {
            continue;
        }
        let mut n = String::with_capacity(4);
        n.push('#');
        n.push_str(itoa::Buffer::new().format(*r));
        t.id = match &t.code {
            Some(_) => uuid_of(t.rtype, &[s, v, cs, cc, &n]),
            None => uuid_of(t.rtype, &[s, v, &n]),
        };
        t.by = None;
        t.code = None;
        t.repeat = true;
    }
}

/// The placer order numbers of an order: ORC-2, OBR-2 (each once).
fn placer_ids(cx: &Ctx<'_, '_>, o: &Order<'_>) -> Vec<(String, String)> {
    order_ids(cx, o, 2)
}

/// The filler order numbers of an order: ORC-3, OBR-3 (each once).
fn filler_ids(cx: &Ctx<'_, '_>, o: &Order<'_>) -> Vec<(String, String)> {
    order_ids(cx, o, 3)
}

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

/// SPM-2 (EIP): the placer's identifier (EIP-1) and the filler's (EIP-2), with their v2-0203 types.
fn specimen_ids(
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

/// Who ordered: ORC-12, else OBR-16 (first repetition).
fn requester<'a>(cx: &Ctx<'a, '_>, o: &Order<'a>) -> Option<Person<'a>> {
    [(o.orc.as_ref(), 12), (o.obr.as_ref(), 16)]
        .into_iter()
        .filter_map(|(seg, n)| seg?.field(n)?.repetition(1))
        .map(Person::Xcn)
        .find(|p| practitioner_target(cx, *p).is_some())
}

/// An OBX (and its NTE) as its planned Observation.
fn planned_observation<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    o: &Obs<'a>,
    links: ObsLinks<'_, 'a>,
) {
    let t = o.target.as_ref().expect("planned");
    observation_entry(cx, b, t, &o.obx, &o.notes, links);
}

/// An order's entries: ServiceRequest, Conditions, Specimens, Observations, DiagnosticReport.
fn order_entries<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    map: Kind,
    p: &Pat<'a>,
    o: &Order<'a>,
) {
    let patient = p.patient.as_ref().expect("planned");
    let request = o.request.as_ref().expect("planned");
    let spec_targets: Vec<&Target> = o.specs.iter().filter_map(|s| s.target.as_ref()).collect();
    let obs_targets: Vec<&Target> = o.obs.iter().filter_map(|x| x.target.as_ref()).collect();
    let conditions: Vec<&Target> = o.dg1.iter().filter_map(|(_, t)| t.as_ref()).collect();

    let (mut orc_mapped, mut obr_mapped) = b.entry(cx, request, |cx, w| {
        service_request_body(
            cx,
            w,
            map,
            o,
            patient,
            p.encounter.as_ref(),
            &conditions,
            &obs_targets,
            &spec_targets,
        )
    });
    for nte in &o.notes {
        cx.note_unmapped(nte, NTE_MAPPED);
    }

    for (seg, t) in &o.dg1 {
        patient_part_entry(cx, b, seg, t.as_ref().expect("planned"), patient);
    }
    for s in &o.specs {
        let t = s.target.as_ref().expect("planned");
        if s.write {
            b.entry(cx, t, |cx, w| specimen_body(cx, w, &s.spm, t, patient));
        }
        let mut mapped = specimen_mapped(cx, &s.spm);
        if s.write && t.repeat {
            mapped.retain(|&n| n != 2);
        }
        cx.note_unmapped(&s.spm, &mapped);
    }
    let observed = match map {
        Kind::Results => o
            .obr
            .as_ref()
            .and_then(|obr| cx.field(obr, 7))
            .and_then(|d| cx.date_time(&d)),
        Kind::Orders => None,
    };
    let links = ObsLinks {
        patient: Some(patient),
        encounter: p.encounter.as_ref(),
        effective: observed.as_deref(),
        ..ObsLinks::default()
    };
    for x in &o.obs {
        planned_observation(cx, b, x, links);
    }
    for s in &o.specs {
        let focus = ObsLinks {
            focus: s.target.as_ref(),
            encounter: None,
            ..links
        };
        for x in &s.obs {
            planned_observation(cx, b, x, focus);
        }
    }
    if let Some(report) = &o.report {
        let mapped = b.entry(cx, report, |cx, w| {
            report_body(
                cx,
                w,
                o,
                request,
                patient,
                p.encounter.as_ref(),
                &obs_targets,
                &spec_targets,
            )
        });
        obr_mapped.extend(mapped);
        if !report.repeat {
            // The report carries the order numbers (when the ServiceRequest, a repeat, does not).
            orc_mapped.extend([2, 3]);
        }
    }
    if let Some(orc) = &o.orc {
        cx.note_unmapped(orc, &orc_mapped);
    }
    if let Some(obr) = &o.obr {
        cx.note_unmapped(obr, &obr_mapped);
    }
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

/// The ORC[ServiceRequest] and OBR[ServiceRequest] maps (and NTE[ServiceRequest]). Returns the ORC and OBR
/// fields it mapped.
#[allow(clippy::too_many_arguments)]
fn service_request_body(
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
        let ids: Vec<((String, String), &str)> = placer_ids(cx, o)
            .into_iter()
            .map(|k| (k, "PLAC"))
            .chain(filler_ids(cx, o).into_iter().map(|k| (k, "FILL")))
            .collect();
        identifiers(w, &ids);
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

/// The OBR[DiagnosticReport] map (and ORC[DiagnosticReport]'s identifiers). Returns the OBR fields it mapped
/// beyond those of the ServiceRequest.
#[allow(clippy::too_many_arguments)]
fn report_body(
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
        let ids: Vec<((String, String), &str)> = placer_ids(cx, o)
            .into_iter()
            .map(|k| (k, "PLAC"))
            .chain(filler_ids(cx, o).into_iter().map(|k| (k, "FILL")))
            .collect();
        identifiers(w, &ids);
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

/// The SPM fields [`specimen_body`] writes: SPM-12 when it is a number, SPM-20 when the IG maps its code.
fn specimen_mapped(cx: &Ctx<'_, '_>, spm: &Segment<'_>) -> Vec<usize> {
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
fn specimen_body(
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
