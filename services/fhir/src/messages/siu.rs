//! SIU messages of the SIU_S12 structure (S12–S17, S26: a scheduled appointment booked, rescheduled,
//! modified, cancelled, discontinued, deleted, not shown up for), after the IG's SIU_S12 map: SCH (+ NTE) →
//! Appointment, PID → Patient (the Appointment's patient participant), PV1/PV2 → Encounter, OBX →
//! Observation, DG1 → Condition, AIS → the Appointment's serviceType (and its times when SCH has none), AIP →
//! a Practitioner participant, AIL → a Location participant, AIG → a Device participant (equipment, the
//! general resources), SCH-12/16/20 → Practitioner participants.
//!
//! The conditional update: Appointment by the filler appointment id (SCH-2), else the placer's (SCH-1);
//! without either, an id derived from the message.

use super::Converted;
use crate::FhirError;
use crate::bundle::{Entries, Unique};
use crate::context::{Ctx, Target, reference};
use crate::datatypes::cwe::{Table, coding_item};
use crate::datatypes::cx::{ei_key, identifier_item};
use crate::datatypes::dtm::{add_seconds, duration_seconds, period};
use crate::datatypes::xcn::{Person, practitioner_target};
use crate::json::Writer;
use crate::messages::common::{
    Obs, encounter_entry, observation_entry, patient_part_entry, required,
};
use crate::segments::dg1::condition_target;
use crate::segments::msh::MSH_MAPPED;
use crate::segments::obx::{ObsLinks, observation_people, observation_target};
use crate::segments::pid::{patient_body, patient_target};
use crate::segments::pv1::Visit;
use crate::segments::write_items;
use hl7v2::message::{Segment, Value};
use std::borrow::Cow;

const SCH_MAPPED: &[usize] = &[1, 2, 7, 8, 9, 10, 11, 12, 16, 20, 25];
const AIS_MAPPED: &[usize] = &[3, 4, 7, 8, 10];

/// A resource segment (AIG, AIL, AIP): where its fields are, and what it names.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The resource id, its type, the start, the duration, the duration's units, the filler status.
    id: usize,
    kind: usize,
    start: usize,
    duration: usize,
    units: usize,
    status: usize,
}

const AIG: Layout = Layout {
    id: 3,
    kind: 4,
    start: 8,
    duration: 11,
    units: 12,
    status: 14,
};
const AIL: Layout = Layout {
    id: 3,
    kind: 4,
    start: 6,
    duration: 9,
    units: 10,
    status: 12,
};
const AIP: Layout = AIL;

impl Layout {
    fn mapped(&self) -> [usize; 6] {
        [
            self.id,
            self.kind,
            self.start,
            self.duration,
            self.units,
            self.status,
        ]
    }
}

/// A participant of the Appointment besides the patient.
#[derive(Debug)]
struct Part<'a> {
    seg: Segment<'a>,
    layout: Layout,
    actor: Target,
}

pub(crate) fn convert(cx: &mut Ctx<'_, '_>, kind: &str, out: &mut Vec<u8>) -> Converted {
    let msg = cx.msg;
    let sch = required(cx, kind, "SCH")?;
    let pid = msg.segment("PID", 1);
    let key = cx.message_key();
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();
    let trigger = kind.split('^').nth(1).unwrap_or_default();

    // The segments by role, in message order. NTE: after SCH or an AIS, the Appointment's comment; after an
    // OBX, its note; elsewhere (after AIG, AIL, AIP: the IG maps them nowhere) reported.
    #[derive(Clone, Copy, PartialEq)]
    enum After {
        Sch,
        Ais,
        Obx,
        Other,
    }
    let mut after = After::Other;
    let mut comments: Vec<Segment<'_>> = Vec::new();
    let mut tq1s: Vec<Segment<'_>> = Vec::new();
    let mut services: Vec<Segment<'_>> = Vec::new();
    let mut resources: Vec<(Segment<'_>, Layout)> = Vec::new();
    let mut obs: Vec<Obs<'_>> = Vec::new();
    let mut dg1s: Vec<Segment<'_>> = Vec::new();
    let mut evn = None;
    let mut seen = [false; 4];
    for seg in msg.segments() {
        let first = |seen: &mut [bool; 4], i: usize| !std::mem::replace(&mut seen[i], true);
        match seg.name() {
            b"MSH" => cx.note_unmapped(&seg, MSH_MAPPED),
            b"SCH" if first(&mut seen, 0) => {
                after = After::Sch;
                continue;
            }
            b"PID" if first(&mut seen, 1) => {}
            b"PV1" if first(&mut seen, 2) => {}
            b"PV2" if first(&mut seen, 3) => {}
            b"EVN" => evn = Some(seg),
            b"TQ1" => {
                tq1s.push(seg);
                continue;
            }
            b"NTE" => {
                match (after, obs.last_mut()) {
                    (After::Sch | After::Ais, _) => comments.push(seg),
                    (After::Obx, Some(o)) => o.notes.push(seg),
                    _ => cx.note_unmapped_segment(&seg),
                }
                continue;
            }
            b"OBX" => {
                obs.push(Obs {
                    obx: seg,
                    notes: Vec::new(),
                });
                after = After::Obx;
                continue;
            }
            b"DG1" => dg1s.push(seg),
            b"AIS" => {
                services.push(seg);
                after = After::Ais;
                continue;
            }
            b"AIG" => resources.push((seg, AIG)),
            b"AIL" => resources.push((seg, AIL)),
            b"AIP" => resources.push((seg, AIP)),
            // RGS (the IG maps nothing of it), PD1, SFT, a second SCH or PID...
            _ => cx.note_unmapped_segment(&seg),
        }
        after = After::Other;
    }

    let patient = pid.as_ref().map(|pid| patient_target(cx, pid, &msg_key));
    let (visit, mut practitioners) = Visit::of(
        cx,
        msg.segment("PV1", 1),
        msg.segment("PV2", 1),
        patient.as_ref(),
    );
    for n in [12, 16, 20] {
        practitioners.add_xcn_field(cx, &sch, n);
    }
    // The resources' actors: Practitioner (AIP), Location (AIL), Device (AIG).
    let mut parts: Vec<Part<'_>> = Vec::new();
    let mut locations: Vec<(Target, String)> = Vec::new();
    let mut devices: Vec<(Target, Value<'_>)> = Vec::new();
    // Sets beside the lists: a schedule naming thousands of resources costs linear time.
    let (mut location_ids, mut device_ids) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for (seg, layout) in &resources {
        let Some(id) = seg.field(layout.id).and_then(|f| f.repetition(1)) else {
            cx.note_unmapped(seg, &[]);
            continue;
        };
        let actor = match seg.name() {
            b"AIP" => practitioners.add(cx, Person::Xcn(id)),
            b"AIL" => location_name(cx, id).map(|name| {
                let t = cx.target("Location", &[&name], None);
                if location_ids.insert(t.id) {
                    locations.push((t.clone(), name));
                }
                t
            }),
            _ => device_target(cx, id).inspect(|t| {
                if device_ids.insert(t.id) {
                    devices.push((t.clone(), id));
                }
            }),
        };
        match actor {
            Some(actor) => parts.push(Part {
                seg: *seg,
                layout: *layout,
                actor,
            }),
            None => cx.dropped(seg, layout.id),
        }
    }
    for o in &obs {
        observation_people(cx, &mut practitioners, &o.obx, &o.notes);
    }
    let appointment = appointment_target(cx, &sch, &msg_key);

    // What the Appointment needs before anything is written: its status and, unless it is only proposed or
    // was cancelled, its start and end.
    let status = appointment_status(cx, &sch, &services, trigger)?;
    let (start, end, source) = times(cx, &sch, &tq1s, &services);
    if (start.is_none() || end.is_none())
        && !matches!(status, "proposed" | "cancelled" | "waitlist")
    {
        return Err(FhirError::Required(
            "SCH-11 start and end (instants: with an offset, or the route's timezone)",
        ));
    }
    if patient.is_none() && parts.is_empty() && sch_people(cx, &sch).is_empty() {
        return Err(FhirError::Required(
            "Appointment.participant (PID, AIP, AIL, AIG or SCH-12/16/20)",
        ));
    }

    let mut b = Entries::open(cx, out, &key, || {
        std::iter::once(&appointment)
            .chain(patient.as_ref())
            .collect()
    })?;
    if let (Some(pid), Some(patient)) = (&pid, &patient) {
        b.segment(cx, patient, pid, |cx, w| patient_body(cx, w, pid));
    }
    practitioners.write(cx, &mut b);
    for (t, name) in &locations {
        b.entry(cx, t, |_, w| w.string("name", name));
    }
    for (t, id) in &devices {
        b.entry(cx, t, |cx, w| device_body(cx, w, *id));
    }
    match &patient {
        Some(patient) if visit.encounter.is_some() => {
            encounter_entry(cx, &mut b, None, &visit, patient);
        }
        // No visit named, or a visit without a patient: no Encounter to make of it.
        _ => {
            for seg in [&visit.pv1, &visit.pv2].into_iter().flatten() {
                cx.note_unmapped_segment(seg);
            }
        }
    }
    // Each condition (OBX-21 and code, DG1-20) used once.
    let mut unique = Unique::default();
    for (n, o) in obs.iter().enumerate() {
        let code = cx.field(&o.obx, 3).unwrap_or_default();
        let parent = patient
            .as_ref()
            .map_or(appointment.id.as_str(), |p| p.id.as_str());
        let n = n.to_string();
        let t = observation_target(cx, &o.obx, &[parent, &appointment.id, "OBX", &code, &n]);
        let t = unique.check(cx, t, &n);
        let links = ObsLinks {
            patient: patient.as_ref(),
            encounter: visit.encounter.as_ref(),
            ..ObsLinks::default()
        };
        observation_entry(cx, &mut b, &t, &o.obx, &o.notes, links);
    }
    if let Some(patient) = &patient {
        for (n, dg1) in dg1s.iter().enumerate() {
            let n = n.to_string();
            let t = unique.check(cx, condition_target(cx, dg1, &patient.id, &n), &n);
            patient_part_entry(cx, &mut b, dg1, &t, patient);
        }
    } else {
        for dg1 in &dg1s {
            cx.note_unmapped_segment(dg1);
        }
    }

    let links = AppLinks {
        status,
        start: start.as_deref(),
        end: end.as_deref(),
        patient: patient.as_ref(),
        services: &services,
        comments: &comments,
        parts: &parts,
    };
    b.segment(cx, &appointment, &sch, |cx, w| {
        appointment_body(cx, w, &sch, links);
        SCH_MAPPED
    });
    for (i, tq1) in tq1s.iter().enumerate() {
        if source == Source::Tq1(i) {
            cx.note_unmapped(tq1, &[7, 8]);
        } else {
            cx.note_unmapped_segment(tq1);
        }
    }
    for (i, ais) in services.iter().enumerate() {
        // AIS-4/7/8 (the times) only when they gave the Appointment's.
        if source == Source::Ais(i) {
            cx.note_unmapped(ais, AIS_MAPPED);
        } else {
            cx.note_unmapped(ais, &[3, 10]);
        }
    }
    for nte in &comments {
        cx.note_unmapped(nte, &[1, 3]);
    }
    for p in &parts {
        cx.note_unmapped(&p.seg, &p.layout.mapped());
    }

    Ok(b.finish(cx, &msg_key, evn.as_ref()))
}

/// The Appointment: by SCH-2 (filler), else SCH-1 (placer), else the message.
fn appointment_target(cx: &Ctx<'_, '_>, sch: &Segment<'_>, msg_key: &[&str]) -> Target {
    let by = [2, 1].iter().find_map(|&n| {
        sch.field(n)
            .and_then(|f| f.repetition(1))
            .and_then(|ei| ei_key(cx, ei, false))
    });
    match by {
        Some((s, v)) => cx.target("Appointment", &[&s, &v], Some((s.clone(), v.clone()))),
        None => cx.target("Appointment", msg_key, None),
    }
}

/// PL → a Location's name: its parts with a value (point of care, room, bed, facility, building, floor),
/// the point of care's subcomponents (an HD since v2.7: `11&X-Ray Room`) spelled out.
fn location_name(cx: &Ctx<'_, '_>, pl: Value<'_>) -> Option<String> {
    let mut parts: Vec<Cow<'_, str>> = Vec::new();
    if let Some(c) = pl.component(1) {
        parts.extend([1, 2].iter().filter_map(|&n| cx.text(c.subcomponent(n))));
    }
    parts.extend([2, 3].iter().filter_map(|&n| cx.comp(pl, n)));
    parts.extend(cx.text(pl.component(4).and_then(|c| c.subcomponent(1))));
    parts.extend([7, 8].iter().filter_map(|&n| cx.comp(pl, n)));
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// A Device for an AIG's resource id (CWE): by its code in the system CWE-3 names, else by code and text.
fn device_target(cx: &Ctx<'_, '_>, id: Value<'_>) -> Option<Target> {
    let code = cx.comp(id, 1);
    let text = cx.comp(id, 2);
    let system = cx.comp(id, 3).and_then(|s| {
        cx.coding_system(&s)
            .or_else(|| cx.hd_system_of(Some(s), None, None))
    });
    match (&code, &system) {
        (Some(c), Some(s)) => Some(cx.target("Device", &[s, c], Some((s.clone(), c.to_string())))),
        _ if code.is_some() || text.is_some() => Some(cx.target(
            "Device",
            &[
                code.as_deref().unwrap_or_default(),
                text.as_deref().unwrap_or_default(),
            ],
            None,
        )),
        _ => None,
    }
}

fn device_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, id: Value<'_>) {
    let code = cx.comp(id, 1);
    let system = cx.comp(id, 3).and_then(|s| {
        cx.coding_system(&s)
            .or_else(|| cx.hd_system_of(Some(s), None, None))
    });
    if let Some(c) = &code {
        w.array("identifier");
        w.begin_object();
        if let Some(s) = &system {
            w.string("system", s);
        }
        w.string("value", c);
        w.end_object();
        w.end_array();
    }
    let names: Vec<Cow<'_, str>> = [2, 5].iter().filter_map(|&n| cx.comp(id, n)).collect();
    if !names.is_empty() {
        w.array("deviceName");
        for n in &names {
            w.begin_object();
            w.string("name", n);
            w.string("type", "user-friendly-name");
            w.end_object();
        }
        w.end_array();
    }
}

/// Appointment.status (1..1): SCH-25 through FillerStatusCodes[Appointment]; else (empty) the first AIS-10;
/// else (no row for the code: reported) what the trigger says: S12–S14 booked, S15/S16 cancelled, S17
/// entered-in-error, S26 noshow.
fn appointment_status<'a>(
    cx: &Ctx<'a, '_>,
    sch: &Segment<'a>,
    services: &[Segment<'a>],
    trigger: &str,
) -> Result<&'static str, FhirError> {
    let code_of = |seg: &Segment<'a>, n: usize| {
        seg.field(n)
            .and_then(|f| f.repetition(1))
            .and_then(|v| cx.comp(v, 1))
    };
    // An R4 AppointmentStatus (a site's own map may name anything; only these are written).
    const STATUSES: &[&str] = &[
        "proposed",
        "pending",
        "booked",
        "arrived",
        "fulfilled",
        "cancelled",
        "noshow",
        "entered-in-error",
        "checked-in",
        "waitlist",
    ];
    let lookup = |c: &str| {
        let code = cx.lookup("FillerStatusCodes[Appointment]", c)?.code;
        STATUSES.iter().find(|s| **s == code).copied()
    };
    if let Some(c) = code_of(sch, 25) {
        if let Some(s) = lookup(&c) {
            return Ok(s);
        }
        cx.dropped(sch, 25);
    } else if let Some(s) = services
        .first()
        .and_then(|a| code_of(a, 10))
        .and_then(|c| lookup(&c))
    {
        return Ok(s);
    }
    Ok(match trigger {
        "S12" | "S13" | "S14" => "booked",
        "S15" | "S16" => "cancelled",
        "S17" => "entered-in-error",
        "S26" => "noshow",
        _ => return Err(FhirError::Required("SCH-25")),
    })
}

/// A participant's status (1..1) from a filler status code (AIP-12, AIL-12, AIG-14), else from the
/// Appointment's: accepted for what is booked or under way, declined for what was cancelled or missed,
/// needs-action for what is not yet booked.
fn participant_status(appointment: &str) -> &'static str {
    match appointment {
        "booked" | "arrived" | "fulfilled" | "checked-in" => "accepted",
        "cancelled" | "noshow" | "entered-in-error" => "declined",
        _ => "needs-action",
    }
}

/// start and end (instants): SCH-11's (TQ-4, TQ-5; an end from SCH-9/10 when only the start is given), else
/// TQ1-7/8 (SCH-11 was withdrawn in v2.7 for TQ1, which the IG's SIU map leaves out), else the first AIS
/// with a start (AIS-4, and AIS-7 in AIS-8's units). Also says which segment gave them.
fn times(
    cx: &Ctx<'_, '_>,
    sch: &Segment<'_>,
    tq1s: &[Segment<'_>],
    services: &[Segment<'_>],
) -> (Option<String>, Option<String>, Source) {
    let sub1 = |v: Option<Value<'_>>, n: usize| {
        v.and_then(|v| v.component(n))
            .and_then(|c| cx.text(c.subcomponent(1)))
            .and_then(|d| cx.instant(&d))
    };
    let tq = sch.field(11).and_then(|f| f.repetition(1));
    let start = sub1(tq, 4);
    let mut end = sub1(tq, 5);
    if let (Some(s), None) = (&start, &end)
        && let Some(d) = cx.field(sch, 9)
    {
        end = duration_seconds(cx, &d, sch.field(10).and_then(|f| f.repetition(1)))
            .and_then(|secs| add_seconds(s, secs));
    }
    if start.is_some() && end.is_some() {
        return (start, end, Source::Sch);
    }
    for (i, tq1) in tq1s.iter().enumerate() {
        let s = cx.field(tq1, 7).and_then(|d| cx.instant(&d));
        let e = cx.field(tq1, 8).and_then(|d| cx.instant(&d));
        if s.is_some() && e.is_some() {
            return (s, e, Source::Tq1(i));
        }
    }
    for (i, ais) in services.iter().enumerate() {
        if let Some(s) = cx.field(ais, 4).and_then(|d| cx.instant(&d)) {
            let e = cx
                .field(ais, 7)
                .and_then(|d| duration_seconds(cx, &d, ais.field(8).and_then(|f| f.repetition(1))))
                .and_then(|secs| add_seconds(&s, secs));
            if e.is_some() {
                return (Some(s), e, Source::Ais(i));
            }
        }
    }
    (None, None, Source::None)
}

/// Which segment gave the Appointment's start and end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    None,
    Sch,
    Tq1(usize),
    Ais(usize),
}

/// The people of SCH-12 (placer contact), SCH-16 (filler contact) and SCH-20 (entered by), with how the
/// participant's type is written.
fn sch_people<'a>(cx: &Ctx<'a, '_>, sch: &Segment<'a>) -> Vec<(usize, Target)> {
    [12, 16, 20]
        .iter()
        .flat_map(|&n| cx.reps(sch, n).into_iter().map(move |x| (n, x)))
        .filter_map(|(n, x)| match practitioner_target(cx, Person::Xcn(x)) {
            Some(t) => Some((n, t)),
            None => {
                cx.dropped(sch, n);
                None
            }
        })
        .collect()
}

/// What the Appointment's body needs besides SCH.
#[derive(Debug, Clone, Copy)]
struct AppLinks<'x, 'a> {
    status: &'static str,
    start: Option<&'x str>,
    end: Option<&'x str>,
    patient: Option<&'x Target>,
    services: &'x [Segment<'a>],
    comments: &'x [Segment<'a>],
    parts: &'x [Part<'a>],
}

/// The SCH[Appointment], AIS/AIG/AIL/AIP[Appointment], NTE[Appointment-Comment] and PID[Appointment] maps.
fn appointment_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, sch: &Segment<'_>, l: AppLinks<'_, '_>) {
    let mut ids: Vec<((String, String), &str)> = Vec::new();
    for (n, ty) in [(1, "PLAC"), (2, "FILL")] {
        if let Some(k) = sch
            .field(n)
            .and_then(|f| f.repetition(1))
            .and_then(|ei| ei_key(cx, ei, false))
        {
            ids.push((k, ty));
        }
    }
    if !ids.is_empty() {
        w.array("identifier");
        for (k, ty) in &ids {
            identifier_item(w, k, Some(ty));
        }
        w.end_array();
    }
    w.string("status", l.status);
    // serviceType: AIS-3 of every AIS.
    let services: Vec<Value<'_>> = l
        .services
        .iter()
        .filter_map(|a| a.field(3).and_then(|f| f.repetition(1)))
        .collect();
    write_items(w, "serviceType", &services, |w, v| {
        cx.codeable_concept_item(w, *v, None)
    });
    // appointmentType: SCH-8, else SCH-7 when it names table 0277; reasonCode: SCH-7 otherwise.
    let reason = sch.field(7).and_then(|f| f.repetition(1));
    let reason_is_type = reason
        .and_then(|r| cx.comp(r, 3))
        .is_some_and(|s| s == "HL70277" || s == "0277");
    let ty = sch
        .field(8)
        .and_then(|f| f.repetition(1))
        .filter(|v| cx.cwe_valued(*v))
        .or(reason.filter(|_| reason_is_type));
    cx.codeable_concept(
        w,
        "appointmentType",
        ty,
        Some(Table::new("AppointmentTypeCodes", "HL70277")),
    );
    if !reason_is_type && let Some(r) = reason.filter(|r| cx.cwe_valued(*r)) {
        w.array("reasonCode");
        cx.codeable_concept_item(w, r, Some(Table::new("AppointmentReasonCodes", "HL70276")));
        w.end_array();
    } else if reason_is_type && sch.field(8).is_some_and(|f| !f.is_empty()) {
        cx.dropped(sch, 7);
    }
    if let (Some(s), Some(e)) = (l.start, l.end) {
        w.string("start", s);
        w.string("end", e);
    }
    // minutesDuration: SCH-9 in SCH-10's units (default minutes).
    match cx
        .field(sch, 9)
        .and_then(|d| duration_seconds(cx, &d, sch.field(10).and_then(|f| f.repetition(1))))
        .map(|s| (s + 30) / 60)
        .filter(|m| *m > 0)
    {
        Some(m) => w.integer("minutesDuration", m.unsigned_abs()),
        None => cx.dropped(sch, 9),
    }
    // comment: the NTE after SCH and AIS, one paragraph each (R4 has one comment string).
    let comments: Vec<String> = l
        .comments
        .iter()
        .flat_map(|nte| cx.reps(nte, 3))
        .filter_map(|r| cx.text(Some(r)).map(|t| t.into_owned()))
        .collect();
    if !comments.is_empty() {
        w.string("comment", &comments.join("\n\n"));
    }
    // participant (1..*): the patient, the SCH people, the AIG/AIL/AIP resources.
    let own = participant_status(l.status);
    w.array("participant");
    if let Some(p) = l.patient {
        w.begin_object();
        reference(w, "actor", p);
        w.string("status", own);
        w.end_object();
    }
    for (n, t) in sch_people(cx, sch) {
        w.begin_object();
        w.array("type");
        w.begin_object();
        match n {
            20 => {
                w.array("coding");
                coding_item(
                    w,
                    "http://terminology.hl7.org/CodeSystem/provenance-participant-type",
                    "enterer",
                    Some("Enterer"),
                );
                w.end_array();
            }
            12 => w.string("text", "placer contact"),
            _ => w.string("text", "filler contact"),
        }
        w.end_object();
        w.end_array();
        reference(w, "actor", &t);
        w.string("status", own);
        w.end_object();
    }
    for p in l.parts {
        let lay = p.layout;
        w.begin_object();
        let types = cx.reps(&p.seg, lay.kind);
        write_items(w, "type", &types, |w, v| {
            cx.codeable_concept_item(w, *v, None)
        });
        reference(w, "actor", &p.actor);
        let code = p
            .seg
            .field(lay.status)
            .and_then(|f| f.repetition(1))
            .and_then(|v| cx.comp(v, 1));
        let status = match code
            .as_deref()
            .map(|c| cx.lookup("FillerStatusCodes[Appointment]", c))
        {
            Some(Some(c)) => participant_status(c.code),
            Some(None) => {
                // No row for the code (Dc, Scheduled...): the Appointment's, and the code reported.
                cx.dropped(&p.seg, lay.status);
                own
            }
            None => own,
        };
        w.string("status", status);
        let start = cx.field(&p.seg, lay.start).and_then(|d| cx.instant(&d));
        let end = start.as_deref().and_then(|s| {
            cx.field(&p.seg, lay.duration)
                .and_then(|d| {
                    duration_seconds(cx, &d, p.seg.field(lay.units).and_then(|f| f.repetition(1)))
                })
                .and_then(|secs| add_seconds(s, secs))
        });
        if start.is_none() {
            cx.dropped(&p.seg, lay.start);
        }
        if end.is_none() {
            cx.dropped(&p.seg, lay.duration);
        }
        period(w, "period", start.as_deref(), end.as_deref());
        w.end_object();
    }
    w.end_array();
}
