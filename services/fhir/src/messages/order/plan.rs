//! Pass 2 of the order and result maps: every resource's target (its id, and the business identifier a
//! transaction updates it by), each conditional update used once.

use super::specimen::specimen_ids;
use super::types::{Kind, Obs, Order, Pat, filler_ids, placer_ids};
use crate::context::{Ctx, Target};
use crate::datatypes::cwe::primary_coding;
use crate::ids::{Uuid, uuid_of};
use crate::messages::common::patient_part_target;
use crate::segments::dg1::condition_target;
use crate::segments::obx::observation_target;
use crate::segments::pid::patient_target;
use crate::segments::pv1::encounter_target;
use crate::segments::{coded_target, n_key};
use std::collections::HashMap;

/// Pass 2: every resource's target (id, and the business identifier a transaction updates it by).
pub(super) fn plan(cx: &Ctx<'_, '_>, map: Kind, msg_key: &[&str], pats: &mut [Pat<'_>]) {
    let mut patients: std::collections::HashSet<Uuid> = std::collections::HashSet::new();
    for (pi, p) in pats.iter_mut().enumerate() {
        let pn = pi.to_string();
        let fallback: Vec<&str> = msg_key.iter().copied().chain([pn.as_str()]).collect();
        let patient = patient_target(cx, &p.pid, &fallback);
        p.write = patients.insert(patient.id);
        p.visit.encounter = p
            .visit
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
