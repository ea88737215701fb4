//! VXU_V04 (unsolicited vaccination record update), after the IG's message map: PID → Patient, NK1 →
//! RelatedPerson, PV1/PV2 → Encounter, OBX before any order → Observation of the patient, and per ORDER
//! group ORC + RXA + RXR → Immunization (ORC[Immunization], RXA[Immunization], RXR[Immunization]), RXA-17 →
//! Organization (the manufacturer), RXA-27/28 → Location, RXA-10 and ORC-12 → Practitioner (performer
//! functions AP and OP), OBX after the RXA → Observation `partOf` the Immunization, NTE after an OBX → its
//! notes. MessageHeader (message Bundles) and the Provenance of the transformation as for ADT.
//!
//! Conditional updates: Immunization by the filler order number (ORC-3), else the placer's (ORC-2); without
//! either, an id derived from the patient, the vaccine (RXA-5), the time (RXA-3) and the group's position.
//! Organization by its code in its coding system (MVX), Location by its name.

use super::Converted;
use crate::FhirError;
use crate::bundle::{Entries, Unique};
use crate::context::{Ctx, Target, reference};
use crate::datatypes::cwe::{Table, coded};
use crate::datatypes::cx::{ei_key, identifier_item};
use crate::datatypes::nm::{is_decimal, normalise_decimal};
use crate::datatypes::xad::address_object;
use crate::datatypes::xcn::{Person, practitioner_target};
use crate::ids::Uuid;
use crate::json::Writer;
use crate::messages::common::{
    Obs, encounter_entry, observation_entry, patient_part_entry, patient_part_target, required,
};
use crate::segments::msh::MSH_MAPPED;
use crate::segments::obx::{ObsLinks, observation_people, observation_target};
use crate::segments::pid::{patient_body, patient_target};
use crate::segments::pv1::Visit;
use crate::segments::write_items;
use hl7v2::message::{Segment, Value};

/// The fields of the segments the ORC[Immunization], RXA[Immunization] and RXR[Immunization] maps write.
const ORC_MAPPED: &[usize] = &[2, 3, 4, 9, 12];
const RXA_MAPPED: &[usize] = &[3, 5, 6, 7, 10, 15, 16, 17, 18, 19, 20, 21, 27, 28];
const RXR_MAPPED: &[usize] = &[1, 2];

/// An ORDER group: ORC, RXA, RXR and the OBX after the RXA.
#[derive(Debug, Default)]
struct Order<'a> {
    orc: Option<Segment<'a>>,
    rxa: Option<Segment<'a>>,
    rxr: Option<Segment<'a>>,
    obs: Vec<Obs<'a>>,
}

/// Where the last OBX went (for the NTE segments after it).
#[derive(Debug, Clone, Copy)]
enum Last {
    None,
    Patient,
    Order,
}

pub(crate) fn convert(cx: &mut Ctx<'_, '_>, kind: &str, out: &mut Vec<u8>) -> Converted {
    let msg = cx.msg;
    let pid = required(cx, kind, "PID")?;
    let key = cx.message_key();
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();

    // The groups, in message order; what belongs to none is reported.
    let mut patient_obs: Vec<Obs<'_>> = Vec::new();
    let mut orders: Vec<Order<'_>> = Vec::new();
    let mut nk1s = Vec::new();
    let mut evn = None;
    let mut last = Last::None;
    // The first PID, PV1 and PV2 are the patient's and the visit's; a second one is reported.
    let mut seen = [false; 3];
    for seg in msg.segments() {
        let mut first = |i: usize| !std::mem::replace(&mut seen[i], true);
        match seg.name() {
            b"MSH" => cx.note_unmapped(&seg, MSH_MAPPED),
            b"PID" if first(0) => {}
            b"PV1" if first(1) => {}
            b"PV2" if first(2) => {}
            b"EVN" => evn = Some(seg),
            b"NK1" => nk1s.push(seg),
            b"ORC" => {
                orders.push(Order {
                    orc: Some(seg),
                    ..Order::default()
                });
                last = Last::None;
            }
            b"RXA" => {
                match orders.last_mut() {
                    Some(o) if o.rxa.is_none() => o.rxa = Some(seg),
                    // An RXA without its ORC (allowed before v2.5): a group of its own.
                    _ => orders.push(Order {
                        rxa: Some(seg),
                        ..Order::default()
                    }),
                }
                last = Last::None;
            }
            b"RXR" => match orders.last_mut() {
                Some(o) if o.rxa.is_some() && o.rxr.is_none() => o.rxr = Some(seg),
                _ => cx.note_unmapped_segment(&seg),
            },
            b"OBX" => {
                let obs = Obs {
                    obx: seg,
                    notes: Vec::new(),
                };
                match orders.last_mut() {
                    Some(o) => {
                        o.obs.push(obs);
                        last = Last::Order;
                    }
                    None => {
                        patient_obs.push(obs);
                        last = Last::Patient;
                    }
                }
            }
            b"NTE" => {
                let target = match last {
                    Last::Patient => patient_obs.last_mut(),
                    Last::Order => orders.last_mut().and_then(|o| o.obs.last_mut()),
                    Last::None => None,
                };
                match target {
                    Some(o) => o.notes.push(seg),
                    None => cx.note_unmapped_segment(&seg),
                }
            }
            _ => cx.note_unmapped_segment(&seg),
        }
    }
    if orders.iter().any(|o| o.rxa.is_none()) {
        // An ORC without its RXA: nothing to make an Immunization of.
        return Err(FhirError::Missing {
            message: kind.to_owned(),
            segment: "RXA",
        });
    }

    let patient = patient_target(cx, &pid, &msg_key);
    let (visit, mut practitioners) = Visit::of(
        cx,
        msg.segment("PV1", 1),
        msg.segment("PV2", 1),
        Some(&patient),
    );
    let mut unique = Unique::default();
    let mut immunizations: Vec<Target> = Vec::new();
    let mut orgs: Vec<Org> = Vec::new();
    let mut org_ids = std::collections::HashSet::new();
    let mut locations: Vec<Option<Target>> = Vec::new();
    for (i, o) in orders.iter().enumerate() {
        let rxa = o.rxa.as_ref().ok_or(FhirError::Required("RXA"))?;
        practitioners.add_xcn_field(cx, rxa, 10);
        if let Some(orc) = &o.orc {
            practitioners.add_xcn_field(cx, orc, 12);
        }
        let t = immunization_target(cx, o, &patient.id, i);
        immunizations.push(unique.check(cx, t, &i.to_string()));
        if let Some(org) = rxa
            .field(17)
            .and_then(|f| f.repetition(1))
            .and_then(|c| organization(cx, c))
            && org_ids.insert(org.target.id)
        {
            orgs.push(org);
        }
        locations.push(location_target(cx, rxa));
    }
    for obs in patient_obs.iter().chain(orders.iter().flat_map(|o| &o.obs)) {
        observation_people(cx, &mut practitioners, &obs.obx, &obs.notes);
    }

    let mut b = Entries::open(cx, out, &key, || {
        std::iter::once(&patient)
            .chain(immunizations.iter())
            .collect()
    })?;
    b.segment(cx, &patient, &pid, |cx, w| patient_body(cx, w, &pid));
    practitioners.write(cx, &mut b);
    for org in &orgs {
        b.entry(cx, &org.target, |_, w| organization_body(w, org));
    }
    let mut written_locations: std::collections::HashSet<Uuid> = std::collections::HashSet::new();
    for (o, loc) in orders.iter().zip(&locations) {
        if let (Some(rxa), Some(loc)) = (&o.rxa, loc)
            && written_locations.insert(loc.id)
        {
            b.entry(cx, loc, |cx, w| location_body(cx, w, rxa));
        }
    }
    encounter_entry(cx, &mut b, None, &visit, &patient);
    for (i, nk1) in nk1s.iter().enumerate() {
        let t = patient_part_target(cx, nk1, &patient.id, &i.to_string());
        patient_part_entry(cx, &mut b, nk1, &t, &patient);
    }

    let links = ObsLinks {
        patient: Some(&patient),
        encounter: visit.encounter.as_ref(),
        ..ObsLinks::default()
    };
    write_observations(cx, &mut b, &mut unique, &patient_obs, &patient.id, links);

    for (i, o) in orders.iter().enumerate() {
        let Some(rxa) = &o.rxa else { continue };
        let imm = &immunizations[i];
        let org = rxa
            .field(17)
            .and_then(|f| f.repetition(1))
            .and_then(|c| organization(cx, c));
        // Not by `b.entry`: a failing body returns its error before the entry is closed.
        cx.begin_entry(&mut b.w, imm);
        let mut rxa_mapped = RXA_MAPPED.to_vec();
        let orc_mapped = immunization_body(
            cx,
            &mut b.w,
            o,
            rxa,
            ImmLinks {
                patient: &patient,
                encounter: visit.encounter.as_ref(),
                manufacturer: org.as_ref().map(|o| &o.target),
                location: locations[i].as_ref(),
                repeat: imm.repeat,
            },
            &mut rxa_mapped,
        )?;
        cx.end_entry(&mut b.w, imm);
        b.targets.push(imm.id);
        cx.note_unmapped(rxa, &rxa_mapped);
        if let Some(orc) = &o.orc {
            cx.note_unmapped(orc, &orc_mapped);
        }
        if let Some(rxr) = &o.rxr {
            cx.note_unmapped(rxr, RXR_MAPPED);
        }
        let links = ObsLinks {
            part_of: Some(imm),
            ..links
        };
        write_observations(cx, &mut b, &mut unique, &o.obs, &imm.id, links);
    }

    Ok(b.finish(cx, &msg_key, evn.as_ref()))
}

/// OBX (and their NTE) as Observations of the patient, `partOf` an Immunization when in its group (`links`).
/// By OBX-21 and OBX-3 when OBX-21 is valued (each such condition once in the Bundle: `unique`), else by an
/// id derived from `parent`, OBX-3, OBX-4 and the position.
fn write_observations<'a>(
    cx: &mut Ctx<'a, '_>,
    b: &mut Entries<'_>,
    unique: &mut Unique,
    obs: &[Obs<'a>],
    parent: &str,
    links: ObsLinks<'_, 'a>,
) {
    for (n, o) in obs.iter().enumerate() {
        let code = cx.field(&o.obx, 3).unwrap_or_default();
        let sub = cx.field(&o.obx, 4).unwrap_or_default();
        let n = n.to_string();
        let t = observation_target(cx, &o.obx, &[parent, "OBX", &code, &sub, &n]);
        let t = unique.check(cx, t, &format!("{parent}/{n}"));
        observation_entry(cx, b, &t, &o.obx, &o.notes, links);
    }
}

/// The Immunization of an ORDER group: by ORC-3, else ORC-2; else derived from the patient, RXA-5, RXA-3 and
/// the group's position.
fn immunization_target(cx: &Ctx<'_, '_>, o: &Order<'_>, patient: &str, position: usize) -> Target {
    let by = o.orc.as_ref().and_then(|orc| {
        [3, 2].iter().find_map(|&n| {
            orc.field(n)
                .and_then(|f| f.repetition(1))
                .and_then(|ei| ei_key(cx, ei, false))
        })
    });
    match by {
        Some((s, v)) => cx.target("Immunization", &[&s, &v], Some((s.clone(), v.clone()))),
        None => {
            let rxa = o.rxa.as_ref();
            let code = rxa
                .and_then(|r| r.field(5).and_then(|f| f.repetition(1)))
                .and_then(|c| cx.comp(c, 1))
                .unwrap_or_default();
            let when = rxa.and_then(|r| cx.field(r, 3)).unwrap_or_default();
            cx.target(
                "Immunization",
                &[patient, "RXA", &code, &when, &position.to_string()],
                None,
            )
        }
    }
}

/// The Location of RXA-27 (PL) and RXA-28 (XAD), by its name, else its address.
fn location_target(cx: &Ctx<'_, '_>, rxa: &Segment<'_>) -> Option<Target> {
    let name = rxa
        .field(27)
        .and_then(|f| f.repetition(1))
        .and_then(|pl| cx.location_text(pl));
    let address = cx.field(rxa, 28);
    if name.is_none() && address.is_none() {
        return None;
    }
    Some(cx.target(
        "Location",
        &[
            name.as_deref().unwrap_or_default(),
            address.as_deref().unwrap_or_default(),
        ],
        None,
    ))
}

fn location_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, rxa: &Segment<'_>) {
    if let Some(name) = rxa
        .field(27)
        .and_then(|f| f.repetition(1))
        .and_then(|pl| cx.location_text(pl))
    {
        w.string("name", &name);
    }
    if let Some(xad) = rxa.field(28).and_then(|f| f.repetition(1))
        && !address_object(cx, w, "address", xad)
    {
        cx.dropped(rxa, 28);
    }
}

/// What an Immunization refers to.
#[derive(Debug, Clone, Copy)]
struct ImmLinks<'x> {
    patient: &'x Target,
    encounter: Option<&'x Target>,
    manufacturer: Option<&'x Target>,
    location: Option<&'x Target>,
    /// The Immunization repeats an earlier entry's condition ([`Target::repeat`]): no ORC-2/ORC-3 identifiers.
    repeat: bool,
}

/// The ORC[Immunization], RXA[Immunization] and RXR[Immunization] maps. Returns the ORC fields mapped;
/// adds RXA-22 to `rxa_mapped` when it is the record time.
fn immunization_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    o: &Order<'_>,
    rxa: &Segment<'_>,
    links: ImmLinks<'_>,
    rxa_mapped: &mut Vec<usize>,
) -> Result<Vec<usize>, FhirError> {
    let mut orc_mapped = ORC_MAPPED.to_vec();
    // A repeat carries no order number: the first one's condition matches it alone.
    let orders: &[(usize, &str)] = if links.repeat {
        orc_mapped.retain(|&n| !matches!(n, 2 | 3));
        &[]
    } else {
        &[(2, "PLAC"), (3, "FILL")]
    };
    // identifier: ORC-2 (PLAC), ORC-3 (FILL), ORC-4 (the placer group, PGN).
    if let Some(orc) = &o.orc {
        let mut ids: Vec<((String, String), &str)> = Vec::new();
        for &(n, ty) in orders {
            if let Some(k) = orc
                .field(n)
                .and_then(|f| f.repetition(1))
                .and_then(|ei| ei_key(cx, ei, false))
            {
                ids.push((k, ty));
            }
        }
        if let Some(k) = orc
            .field(4)
            .and_then(|f| f.repetition(1))
            .and_then(|eip| ei_key(cx, eip.component(1).unwrap_or(eip), true))
        {
            ids.push((k, "PGN"));
        } else if orc.field(4).is_some_and(|f| !f.is_empty()) {
            cx.dropped(orc, 4);
        }
        if !ids.is_empty() {
            w.array("identifier");
            for (k, ty) in &ids {
                if *ty == "PGN" {
                    // PGN is not in the validator's v2-0203 (2.9): the type as text.
                    w.begin_object();
                    w.object("type");
                    w.string("text", "Placer Group Number");
                    w.end_object();
                    w.string("system", &k.0);
                    w.string("value", &k.1);
                    w.end_object();
                } else {
                    identifier_item(w, k, Some(ty));
                }
            }
            w.end_array();
        }
    }
    // status (1..1): RXA-21 D → entered-in-error; else RXA-20 through CompletionStatus (empty: completed).
    let action = cx.field(rxa, 21);
    let status = if action.as_deref() == Some("D") {
        "entered-in-error"
    } else {
        match cx.field(rxa, 20) {
            None => "completed",
            Some(c) => {
                cx.lookup("CompletionStatus", &c)
                    .ok_or(FhirError::Required("RXA-20 (a code of HL7 table 0322)"))?
                    .code
            }
        }
    };
    w.string("status", status);
    cx.codeable_concept(
        w,
        "statusReason",
        rxa.field(18).and_then(|f| f.repetition(1)),
        None,
    );
    // vaccineCode (1..1).
    if !cx.codeable_concept(
        w,
        "vaccineCode",
        rxa.field(5).and_then(|f| f.repetition(1)),
        None,
    ) {
        return Err(FhirError::Required("RXA-5"));
    }
    reference(w, "patient", links.patient);
    if let Some(e) = links.encounter {
        reference(w, "encounter", e);
    }
    // occurrence[x] (1..1): RXA-3.
    let Some(when) = cx.field(rxa, 3).and_then(|d| cx.date_time(&d)) else {
        return Err(FhirError::Required("RXA-3"));
    };
    w.string("occurrenceDateTime", &when);
    // recorded: RXA-22 when RXA-21 is A, else ORC-9.
    let entered = (action.as_deref() == Some("A"))
        .then(|| cx.field(rxa, 22).and_then(|d| cx.date_time(&d)))
        .flatten();
    let ordered = o
        .orc
        .as_ref()
        .and_then(|orc| cx.field(orc, 9))
        .and_then(|d| cx.date_time(&d));
    if let Some(r) = &entered {
        rxa_mapped.push(22);
        w.string("recorded", r);
        if let Some(orc) = &o.orc {
            cx.dropped(orc, 9);
        }
    } else if let Some(r) = &ordered {
        w.string("recorded", r);
    } else if let Some(orc) = &o.orc {
        cx.dropped(orc, 9);
    }
    if let Some(l) = links.location {
        reference(w, "location", l);
    }
    if let Some(m) = links.manufacturer {
        reference(w, "manufacturer", m);
    }
    if let Some(lot) = cx.field(rxa, 15) {
        w.string("lotNumber", &lot);
    }
    match cx.field(rxa, 16).and_then(|d| cx.date(&d)) {
        Some(d) => w.string("expirationDate", &d),
        None => cx.dropped(rxa, 16),
    }
    if let Some(rxr) = &o.rxr {
        cx.codeable_concept(
            w,
            "site",
            rxr.field(2).and_then(|f| f.repetition(1)),
            Some(Table::new("BodySite", "HL70163")),
        );
        cx.codeable_concept(
            w,
            "route",
            rxr.field(1).and_then(|f| f.repetition(1)),
            Some(Table::new("RouteOfAdministration", "HL70162")),
        );
    }
    // doseQuantity: RXA-6 with the unit of RXA-7.
    match cx.field(rxa, 6).filter(|n| is_decimal(n)) {
        Some(n) => {
            w.object("doseQuantity");
            w.number("value", &normalise_decimal(&n));
            if let Some(u) = rxa.field(7).and_then(|f| f.repetition(1)) {
                let code = cx.comp(u, 1);
                if let Some(t) = cx.comp(u, 2).or_else(|| code.clone()) {
                    w.string("unit", &t);
                }
                if let (Some(s), Some(c)) =
                    (cx.comp(u, 3).and_then(|s| cx.coding_system(&s)), &code)
                {
                    w.string("system", &s);
                    w.string("code", c);
                }
            }
            w.end_object();
        }
        None => {
            cx.dropped(rxa, 6);
            cx.dropped(rxa, 7);
        }
    }
    // performer: RXA-10 (administering, AP), ORC-12 (ordering, OP).
    let mut performers: Vec<(Target, &str, &str)> = Vec::new();
    for x in cx.reps(rxa, 10) {
        match practitioner_target(cx, Person::Xcn(x)) {
            Some(t) => performers.push((t, "AP", "Administering Provider")),
            None => cx.dropped(rxa, 10),
        }
    }
    if let Some(orc) = &o.orc {
        for x in cx.reps(orc, 12) {
            match practitioner_target(cx, Person::Xcn(x)) {
                Some(t) => performers.push((t, "OP", "Ordering Provider")),
                None => cx.dropped(orc, 12),
            }
        }
    }
    if !performers.is_empty() {
        w.array("performer");
        for (t, code, display) in &performers {
            w.begin_object();
            coded(
                w,
                "function",
                "http://terminology.hl7.org/CodeSystem/v2-0443",
                code,
                Some(display),
            );
            reference(w, "actor", t);
            w.end_object();
        }
        w.end_array();
    }
    let reasons = cx.reps(rxa, 19);
    write_items(w, "reasonCode", &reasons, |w, v| {
        cx.codeable_concept_item(w, *v, None)
    });
    Ok(orc_mapped)
}

/// A CWE naming an organization (RXA-17, a manufacturer): its identifier (CWE-1 in the coding system
/// CWE-3 names, as `MVX`) and its name (CWE-2, else CWE-1).
#[derive(Debug, Clone)]
struct Org {
    target: Target,
    identifier: Option<(String, String)>,
    name: Option<String>,
}

/// The Organization of a CWE, if it has a code or a text.
fn organization(cx: &Ctx<'_, '_>, cwe: Value<'_>) -> Option<Org> {
    let code = cx.comp(cwe, 1);
    let name = cx
        .comp(cwe, 2)
        .or_else(|| code.clone())
        .map(|n| n.into_owned());
    let system = cx.comp(cwe, 3).and_then(|s| cx.coding_system(&s));
    let identifier = match (&system, &code) {
        (Some(s), Some(c)) => Some((s.clone(), c.to_string())),
        _ => None,
    };
    let target = match &identifier {
        Some((s, v)) => cx.target("Organization", &[s, v], Some((s.clone(), v.clone()))),
        None => cx.target(
            "Organization",
            &[code.as_deref().unwrap_or_default(), name.as_deref()?],
            None,
        ),
    };
    Some(Org {
        target,
        identifier,
        name,
    })
}

/// An Organization's elements: its identifier and name.
fn organization_body(w: &mut Writer<'_>, org: &Org) {
    if let Some((system, value)) = &org.identifier {
        w.array("identifier");
        w.begin_object();
        w.string("system", system);
        w.string("value", value);
        w.end_object();
        w.end_array();
    }
    if let Some(n) = &org.name {
        w.string("name", n);
    }
}
