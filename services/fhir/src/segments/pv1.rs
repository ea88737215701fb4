//! PV1/PV2 → Encounter (the PV1[Encounter] and PV2[Encounter] maps), its practitioners and Locations.

use crate::context::{Ctx, Target, reference};
use crate::datatypes::cwe::Table;
use crate::datatypes::dtm::period;
use crate::datatypes::pl::pl_locations;
use crate::datatypes::xcn::{Person, Practitioners, practitioner_target};
use crate::json::Writer;
use crate::segments::write_items;
use hl7v2::message::{Segment, Value};

/// The PV1 fields the PV1[Encounter] map writes (the rest, when valued, are reported as unmapped).
pub(crate) const PV1_MAPPED: &[usize] =
    &[1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 14, 17, 19, 36, 42, 44, 45];

/// The PV2 fields the PV2[Encounter] map writes.
pub(crate) const PV2_MAPPED: &[usize] = &[3];

/// XCN fields of PV1 and their participation types (v3-ParticipationType).
const PV1_PARTICIPANTS: &[(usize, &str, &str)] = &[
    (7, "ATND", "attender"),
    (8, "REF", "referrer"),
    (9, "CON", "consultant"),
    (17, "ADM", "admitter"),
];

/// The encounter of a PV1: by its visit number (PV1-19), else by the patient and the admit time (PV1-44), so
/// that the messages of one visit name one Encounter. `None` without either (an A31's `PV1|1|N`): no visit is
/// named, and a new Encounter per message would multiply it; [`note_no_encounter`] reports the PV1.
pub(crate) fn encounter_target(
    cx: &Ctx<'_, '_>,
    pv1: &Segment<'_>,
    patient: Option<&Target>,
) -> Option<Target> {
    if let Some((s, v)) = cx.reps(pv1, 19).into_iter().find_map(|v| cx.cx_key(v)) {
        return Some(cx.target("Encounter", &[&s, &v], Some((s.clone(), v.clone()))));
    }
    let admitted = cx.field(pv1, 44)?;
    let patient = patient?;
    Some(cx.target("Encounter", &[&patient.id, "PV1-44", &admitted], None))
}

/// A PV1 that names no visit ([`encounter_target`] gave none): its fields are reported (PV1-7/8/9/17's
/// Practitioners are still written), and PV2's.
pub(crate) fn note_no_encounter<'a>(
    cx: &mut Ctx<'a, '_>,
    pv1: &Segment<'a>,
    pv2: Option<&Segment<'a>>,
) {
    cx.note_unmapped(pv1, &[1, 7, 8, 9, 17]);
    if let Some(pv2) = pv2 {
        cx.note_unmapped(pv2, &[]);
    }
}

/// A PV1 (and PV2) written as an Encounter: the fields their maps did not write are reported.
pub(crate) fn note_encounter<'a>(
    cx: &mut Ctx<'a, '_>,
    pv1: &Segment<'a>,
    pv2: Option<&Segment<'a>>,
) {
    cx.note_unmapped(pv1, PV1_MAPPED);
    if let Some(pv2) = pv2 {
        cx.note_unmapped(pv2, PV2_MAPPED);
    }
}

/// A participant of the visit: PV1 field, v3-ParticipationType code and display, the Practitioner.
pub(crate) type Participant<'a> = (usize, &'static str, &'static str, Target, Value<'a>);

/// The practitioners of PV1's XCN fields, in field order.
pub(crate) fn pv1_participants<'a>(cx: &Ctx<'a, '_>, pv1: &Segment<'a>) -> Vec<Participant<'a>> {
    PV1_PARTICIPANTS
        .iter()
        .flat_map(|&(n, code, display)| {
            cx.reps(pv1, n)
                .into_iter()
                .map(move |xcn| (n, code, display, xcn))
        })
        .filter_map(|(n, code, display, xcn)| {
            let Some(t) = practitioner_target(cx, Person::Xcn(xcn)) else {
                // Neither an id nor a name: no Practitioner to make of it.
                cx.dropped(pv1, n);
                return None;
            };
            Some((n, code, display, t, xcn))
        })
        .collect()
}

/// A PV1 (and PV2) with the Encounter and the participants made of it.
#[derive(Debug, Default)]
pub(crate) struct Visit<'a> {
    pub pv1: Option<Segment<'a>>,
    pub pv2: Option<Segment<'a>>,
    pub encounter: Option<Target>,
    pub participants: Vec<Participant<'a>>,
}

impl<'a> Visit<'a> {
    /// The visit of a message's PV1 (and PV2), if it has one: its Encounter ([`encounter_target`]), its
    /// participants ([`pv1_participants`]); and the Practitioners of the Bundle, those participants first.
    pub fn of(
        cx: &Ctx<'a, '_>,
        pv1: Option<Segment<'a>>,
        pv2: Option<Segment<'a>>,
        patient: Option<&Target>,
    ) -> (Self, Practitioners<'a>) {
        let encounter = pv1
            .as_ref()
            .and_then(|pv1| encounter_target(cx, pv1, patient));
        let participants = match &pv1 {
            Some(pv1) => pv1_participants(cx, pv1),
            None => Vec::new(),
        };
        let mut practitioners = Practitioners::default();
        for (_, _, _, t, xcn) in &participants {
            practitioners.add_target(t, Person::Xcn(*xcn));
        }
        let visit = Self {
            pv1,
            pv2,
            encounter,
            participants,
        };
        (visit, practitioners)
    }
}

/// The PV1[Encounter] and PV2[Encounter] maps. `event`: the ADT trigger, whose IG map gives the status.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encounter_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    event: Option<&str>,
    pv1: &Segment<'_>,
    pv2: Option<&Segment<'_>>,
    patient: &Target,
    practitioners: &[Participant<'_>],
) {
    let visits = cx.reps(pv1, 19);
    write_items(w, "identifier", &visits, |w, v| {
        cx.identifier(w, *v, Some("VN"))
    });
    // Status, as the IG's PV1[Encounter] map says: `finished` when PV1-45 is valued, else by the patient class
    // (PatientClass[EncounterStatus]); by the event (Event[EncounterStatus], the IG's MSH[Encounter] map) only
    // for the events that say what became of the visit: A11 cancels it (the IG's ADT_A11 map), A03 ends it and
    // A13 undoes an end (departures: a discharge without PV1-45 is still a discharge).
    let status = if cx.field(pv1, 45).is_some() {
        "finished"
    } else if let Some(trigger) = event.filter(|t| matches!(*t, "A03" | "A11" | "A13")) {
        cx.lookup("Event[EncounterStatus]", trigger)
            .map_or("unknown", |c| c.code)
    } else {
        cx.field(pv1, 2)
            .and_then(|c| cx.lookup("PatientClass[EncounterStatus]", &c))
            .map_or("unknown", |c| c.code)
    };
    w.string("status", status);
    // Class (1..1): PatientClass[EncounterClass], else unknown.
    w.object("class");
    match cx
        .field(pv1, 2)
        .and_then(|c| cx.lookup("PatientClass[EncounterClass]", &c))
    {
        Some(c) => {
            w.string("system", c.system);
            w.string("code", c.code);
            if !c.display.is_empty() {
                w.string("display", c.display);
            }
        }
        None => {
            w.string(
                "system",
                "http://terminology.hl7.org/CodeSystem/v3-NullFlavor",
            );
            w.string("code", "UNK");
            w.string("display", "unknown");
        }
    }
    w.end_object();
    let admission = cx.rep1(pv1, 4);
    if admission.is_some_and(|a| cx.cwe_valued(a)) {
        w.array("type");
        cx.codeable_concept_item(
            w,
            admission.expect("checked"),
            Some(Table::new("AdmissionType", "HL70007")),
        );
        w.end_array();
    }
    cx.codeable_concept(
        w,
        "serviceType",
        cx.rep1(pv1, 10),
        Some(Table::new("HospitalService", "HL70069")),
    );
    reference(w, "subject", patient);
    if !practitioners.is_empty() {
        w.array("participant");
        for (_, code, display, t, _) in practitioners {
            w.begin_object();
            w.array("type");
            w.begin_object();
            w.array("coding");
            w.begin_object();
            w.string(
                "system",
                "http://terminology.hl7.org/CodeSystem/v3-ParticipationType",
            );
            w.string("code", code);
            w.string("display", display);
            w.end_object();
            w.end_array();
            w.end_object();
            w.end_array();
            reference(w, "individual", t);
            w.end_object();
        }
        w.end_array();
    }
    let start = cx.field(pv1, 44).and_then(|d| cx.date_time(&d));
    let end = cx.field(pv1, 45).and_then(|d| cx.date_time(&d));
    for (n, v) in [(44, &start), (45, &end)] {
        if v.is_none() {
            cx.dropped(pv1, n);
        }
    }
    period(w, "period", start.as_deref(), end.as_deref());
    if let Some(pv2) = pv2 {
        let reasons = cx.reps(pv2, 3);
        write_items(w, "reasonCode", &reasons, |w, v| {
            cx.codeable_concept_item(w, *v, None)
        });
    }
    let admit_source = cx.rep1(pv1, 14);
    let disposition = cx.rep1(pv1, 36);
    if admit_source.is_some_and(|a| cx.cwe_valued(a))
        || disposition.is_some_and(|d| cx.cwe_valued(d))
    {
        w.object("hospitalization");
        cx.codeable_concept(w, "admitSource", admit_source, None);
        cx.codeable_concept(
            w,
            "dischargeDisposition",
            disposition,
            Some(Table::new("DischargeDisposition", "HL70112")),
        );
        w.end_object();
    }
    // Where the patient is (PV1-3), was (PV1-6), is for now (PV1-11) and will be (PV1-42), as the IG's PV1 map
    // says: each a Location (with the levels above it, the PL[Location] map), written after the Encounter.
    let planned = cx.field(pv1, 2).as_deref() == Some("P");
    let places = [
        (3, if planned { "planned" } else { "active" }),
        (6, "completed"),
        (11, "active"),
        (42, "reserved"),
    ];
    let mut any = false;
    for (n, status) in places {
        let Some(pl) = cx.rep1(pv1, n) else {
            continue;
        };
        let levels = pl_locations(cx, pl);
        let Some(place) = levels.last() else {
            cx.dropped(pv1, n);
            continue;
        };
        if !any {
            w.array("location");
            any = true;
        }
        w.begin_object();
        w.object("location");
        w.string_parts("reference", &["urn:uuid:", &place.target.id]);
        if let Some(text) = cx.location_text(pl) {
            w.string("display", &text);
        }
        w.end_object();
        w.string("status", status);
        w.end_object();
        cx.pending_locations.borrow_mut().extend(levels);
    }
    if any {
        w.end_array();
    }
}
