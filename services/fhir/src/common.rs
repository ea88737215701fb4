//! What the message maps share: the Bundle's frame, the segment maps of PID, PV1/PV2, NK1, AL1, DG1, IN1, OBX
//! and NTE, practitioners from XCN/CNN, the MessageHeader and the Provenance of the transformation.

use crate::context::{Ctx, Target};
use crate::datatypes::cwe::{Table, primary_coding};
use crate::datatypes::cx::{ei_key, identifier_item};
use crate::datatypes::dtm::{fhir_time, period};
use crate::datatypes::nm::{is_decimal, normalise_decimal};
use crate::datatypes::pl::pl_locations;
use crate::datatypes::xcn::{Person, Practitioners, practitioner_refs, practitioner_target};
use crate::ids::{Uuid, percent_encode, uuid_of};
use crate::json::Writer;
use crate::{BundleType, FhirError, Outcome, Unmapped};
use hl7v2::message::{Segment, Value};

/// The fields each segment map writes (the rest, when valued, are reported as unmapped).
pub(crate) const PID_MAPPED: &[usize] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 19, 24, 25, 29, 30,
];

pub(crate) const PV1_MAPPED: &[usize] =
    &[1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 14, 17, 19, 36, 42, 44, 45];

pub(crate) const PV2_MAPPED: &[usize] = &[3];

pub(crate) const NK1_MAPPED: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16];

pub(crate) const AL1_MAPPED: &[usize] = &[1, 2, 3, 4, 5, 6];

pub(crate) const DG1_MAPPED: &[usize] = &[1, 3, 4, 5, 19, 20];

/// A DG1 whose identifier an earlier entry carries: DG1-20 reported.
const DG1_MAPPED_REPEAT: &[usize] = &[1, 3, 4, 5, 19];

pub(crate) const IN1_MAPPED: &[usize] = &[1, 2, 3, 4, 12, 13, 15, 17];

pub(crate) const MSH_MAPPED: &[usize] = &[3, 4, 5, 6, 7, 9, 10, 11, 12, 18];

/// XCN fields of PV1 and their participation types (v3-ParticipationType).
const PV1_PARTICIPANTS: &[(usize, &str, &str)] = &[
    (7, "ATND", "attender"),
    (8, "REF", "referrer"),
    (9, "CON", "consultant"),
    (17, "ADM", "admitter"),
];

/// A repeating segment's key within the patient: its set id (field 1), else its position.
pub(crate) fn n_key(cx: &Ctx<'_, '_>, seg: &Segment<'_>, position: &str) -> String {
    cx.field(seg, 1)
        .map(|s| s.into_owned())
        .unwrap_or_else(|| position.to_owned())
}

/// A ServiceRequest, DiagnosticReport or Observation with a business identifier: updated by the identifier
/// and the code, `<Type>?identifier=...&code=...` (its id derived from both, so two resources of a message
/// that differ only by their code differ). Without a code it has nothing to tell it from the other tests
/// under its number: it is updated by an id derived from the identifier (a redelivery, or a later message
/// naming the number without a code, updates it) and keeps its identifiers, which no condition of these
/// types matches (each names a code, and it has none).
pub(crate) fn coded_target(
    cx: &Ctx<'_, '_>,
    rtype: &'static str,
    key: (String, String),
    code: Option<(Option<String>, String)>,
) -> Target {
    match code {
        Some((system, c)) => {
            let mut t = cx.target(
                rtype,
                &[&key.0, &key.1, system.as_deref().unwrap_or_default(), &c],
                None,
            );
            t.by = Some(key);
            t.code = Some((system, c));
            t
        }
        None => cx.target(rtype, &[&key.0, &key.1], None),
    }
}

/// The Observation of an OBX: by its instance identifier (OBX-21) and code (OBX-3), else by `derived` (the
/// map's key of the OBX).
pub(crate) fn observation_target(cx: &Ctx<'_, '_>, obx: &Segment<'_>, derived: &[&str]) -> Target {
    match cx.rep1(obx, 21).and_then(|ei| ei_key(cx, ei, false)) {
        Some(key) => coded_target(cx, "Observation", key, primary_coding(cx, cx.rep1(obx, 3))),
        None => cx.target("Observation", derived, None),
    }
}

/// An open Bundle: its timestamp, and where its `entry` array starts (dropped if it stays empty).
#[derive(Debug)]
pub(crate) struct Frame {
    pub timestamp: Option<String>,
    entries_at: usize,
}

/// Opens the Bundle: its id and identifier (the message's), type, timestamp (MSH-7 with an offset, else when
/// the gateway received the message), and the `entry` array.
pub(crate) fn begin_bundle(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, key: &[String; 3]) -> Frame {
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();
    w.begin_object();
    w.string("resourceType", "Bundle");
    let bundle_id = uuid_of("Bundle", &msg_key);
    w.string("id", &bundle_id);
    w.object("identifier");
    if let Some(system) = cx.hd_system(cx.msh(3), false) {
        w.string("system", &system);
    }
    w.string("value", &key[2]);
    w.end_object();
    w.string(
        "type",
        match cx.opts.bundle_type {
            BundleType::Transaction => "transaction",
            BundleType::Message => "message",
        },
    );
    let msh7 = cx.text(cx.msh(7));
    let timestamp = msh7
        .as_deref()
        .and_then(|t| cx.instant(t))
        .or_else(|| cx.received_at.map(str::to_owned));
    if let Some(ts) = &timestamp {
        w.string("timestamp", ts);
    }
    let entries_at = w.len();
    w.array("entry");
    Frame {
        timestamp,
        entries_at,
    }
}

/// Closes the `entry` array and the Bundle (with what no map covered, and its values, in `meta` when the
/// route keeps them), and says what was converted.
pub(crate) fn end_bundle(cx: &mut Ctx<'_, '_>, w: &mut Writer<'_>, frame: &Frame) -> Outcome {
    cx.take_dropped();
    w.end_array();
    // Resources only referenced (write: reference): their references name the condition.
    for (id, condition) in std::mem::take(&mut cx.conditional_refs) {
        w.replace_strings(frame.entries_at, &format!("urn:uuid:{id}"), &condition);
    }
    if cx.resources == 0 {
        // FHIR has no empty arrays.
        w.truncate(frame.entries_at, true);
    }
    if cx.opts.unmapped == Unmapped::Extension && !cx.unmapped_values.is_empty() {
        w.object("meta");
        w.array("extension");
        for (id, value) in &cx.unmapped_values {
            w.begin_object();
            w.string("url", "https://hl7gw.io/fhir/StructureDefinition/unmapped");
            w.string_parts("valueString", &[id, "=", value]);
            w.end_object();
        }
        w.end_array();
        w.end_object();
    }
    w.end_object();
    Outcome {
        resources: cx.resources,
        unmapped: std::mem::take(&mut cx.unmapped),
    }
}

/// The patient of a PID: by its match key (the route's rule among PID-3's repetitions, else the first
/// identifier of PID-3, else PID-2/4), else by `fallback` (the message). An identifier that names no authority
/// anywhere refuses the message unless the route allows one global namespace; a rule no repetition meets
/// refuses it too ([`Ctx::refuse`]).
pub(crate) fn patient_target(cx: &Ctx<'_, '_>, pid: &Segment<'_>, fallback: &[&str]) -> Target {
    match patient_key(cx, pid, &[3, 2, 4]) {
        Some((s, v)) => cx.target("Patient", &[&s, &v], Some((s.clone(), v.clone()))),
        None => cx.target("Patient", fallback, None),
    }
}

/// The match key among the identifiers of `fields` of `seg` (the rule's, looked for in the first field; else
/// the first identifier), scoped as [`patient_target`] says.
pub(crate) fn patient_key(
    cx: &Ctx<'_, '_>,
    seg: &Segment<'_>,
    fields: &[usize],
) -> Option<(String, String)> {
    let key = match cx.patient_rule() {
        Some(rule) => {
            let found = cx
                .reps(seg, fields[0])
                .into_iter()
                .find(|v| cx.is_match_key(*v, rule))
                .and_then(|v| cx.patient_key(v));
            if found.is_none() {
                let mut what = Vec::new();
                what.extend(rule.type_code.as_deref().map(|t| format!("type {t}")));
                what.extend(rule.authority.as_deref().map(|a| format!("authority {a}")));
                cx.refuse(FhirError::NoMatchKey(what.join(", ")));
            }
            found
        }
        None => fields
            .iter()
            .flat_map(|&n| cx.reps(seg, n))
            .find_map(|v| cx.patient_key(v)),
    };
    let (key, scoped) = key?;
    if !scoped && !cx.opts.unscoped_identifiers_global {
        cx.refuse(FhirError::UnscopedIdentity);
    }
    Some(key)
}

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

pub(crate) fn reference(w: &mut Writer<'_>, key: &str, t: &Target) {
    w.object(key);
    w.string_parts("reference", &["urn:uuid:", &t.id]);
    w.end_object();
}

/// The MessageHeader (first entry of a message Bundle): the event, source and destination from MSH, and the
/// resources the message is about (`focus`).
pub(crate) fn message_header(
    cx: &mut Ctx<'_, '_>,
    w: &mut Writer<'_>,
    msg_key: &[&str],
    focus: &[&Target],
) -> Result<(), FhirError> {
    let t = cx.target("MessageHeader", msg_key, None);
    cx.begin_entry(w, &t);
    let trigger = cx
        .text(cx.msh(9).and_then(|f| f.component(2)))
        .ok_or(FhirError::Required("MSH-9.2"))?;
    w.object("eventCoding");
    w.string("system", "http://terminology.hl7.org/CodeSystem/v2-0003");
    w.string("code", &trigger);
    w.end_object();
    let dest_app = cx.text(cx.msh(5).and_then(|f| f.component(1)));
    if let Some(d) = &dest_app {
        w.array("destination");
        w.begin_object();
        w.string("name", d);
        let mut endpoint = "urn:hl7gw:application:".to_owned();
        percent_encode(&mut endpoint, d);
        w.string("endpoint", &endpoint);
        w.end_object();
        w.end_array();
    }
    let src = cx
        .text(cx.msh(3).and_then(|f| f.component(1)))
        .unwrap_or(std::borrow::Cow::Borrowed("unknown"));
    w.object("source");
    w.string("name", &src);
    let endpoint = cx
        .hd_system(cx.msh(3), false)
        .filter(|s| s.starts_with("urn:oid:") || s.contains("://"))
        .unwrap_or_else(|| {
            let mut e = "urn:hl7gw:application:".to_owned();
            percent_encode(&mut e, &src);
            e
        });
    w.string("endpoint", &endpoint);
    w.end_object();
    if !focus.is_empty() {
        w.array("focus");
        for f in focus {
            w.begin_object();
            w.string_parts("reference", &["urn:uuid:", &f.id]);
            w.end_object();
        }
        w.end_array();
    }
    cx.end_entry(w, &t);
    Ok(())
}

/// The PID[Patient] map. Returns the PID fields it mapped: [`PID_MAPPED`] less the names, addresses and
/// phone numbers none of whose values had anything to write.
pub(crate) fn patient_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, pid: &Segment<'_>) -> Vec<usize> {
    // Extensions first (FHIR JSON orders nothing, but readers expect them near the top).
    let maiden = cx
        .rep1(pid, 6)
        .and_then(|x| cx.text(x.component(1).and_then(|c| c.subcomponent(1))));
    let birth = cx.field(pid, 7);
    let birth_time = birth
        .as_deref()
        .filter(|b| b.len() > 8)
        .and_then(|b| cx.date_time(b))
        .filter(|d| d.len() > 10);
    let religion = cx.rep1(pid, 17);
    let has_religion = religion.is_some_and(|r| cx.cwe_valued(r));
    let mapped_fields = cx.has_field_maps("Patient");
    if maiden.is_some() || has_religion || mapped_fields {
        let mark = (w.len(), w.has_members());
        w.array("extension");
        if let Some(m) = &maiden {
            w.begin_object();
            w.string(
                "url",
                "http://hl7.org/fhir/StructureDefinition/patient-mothersMaidenName",
            );
            w.string("valueString", m);
            w.end_object();
        }
        if has_religion {
            w.begin_object();
            w.string(
                "url",
                "http://hl7.org/fhir/StructureDefinition/patient-religion",
            );
            cx.codeable_concept(
                w,
                "valueCodeableConcept",
                religion,
                Some(Table::new("Religion", "HL70006")),
            );
            w.end_object();
        }
        let any = cx.field_map_extensions(w, "Patient");
        w.end_array();
        if !(any || maiden.is_some() || has_religion) {
            w.truncate(mark.0, mark.1);
        }
    }
    let ids: Vec<(Value<'_>, Option<&str>)> = [(2, None), (3, None), (4, None)]
        .iter()
        .flat_map(|&(n, t)| cx.reps(pid, n).into_iter().map(move |v| (v, t)))
        .collect();
    let ssn = cx.field(pid, 19);
    if !ids.is_empty() || ssn.is_some() {
        w.array("identifier");
        for (v, t) in ids {
            cx.identifier(w, v, t);
        }
        if let Some(ssn) = &ssn {
            w.begin_object();
            w.object("type");
            w.array("coding");
            w.begin_object();
            w.string("system", "http://terminology.hl7.org/CodeSystem/v2-0203");
            w.string("code", "SS");
            w.end_object();
            w.end_array();
            w.end_object();
            w.string("system", "http://hl7.org/fhir/sid/us-ssn");
            w.string("value", ssn);
            w.end_object();
        }
        w.end_array();
    }
    // The repeating fields, each noted when one of its values was written.
    let mut written: Vec<usize> = Vec::new();
    let names: Vec<(usize, Value<'_>)> = [5, 9]
        .into_iter()
        .flat_map(|n| cx.reps(pid, n).into_iter().map(move |v| (n, v)))
        .collect();
    write_items(w, "name", &names, |w, (n, v)| {
        let ok = cx.human_name(w, *v);
        if ok {
            written.push(*n);
        }
        ok
    });
    let phones: Vec<(usize, Value<'_>, &str)> = cx
        .reps(pid, 13)
        .into_iter()
        .map(|v| (13, v, "home"))
        .chain(cx.reps(pid, 14).into_iter().map(|v| (14, v, "work")))
        .collect();
    write_items(w, "telecom", &phones, |w, (n, v, u)| {
        let ok = cx.contact_point(w, *v, Some(u));
        if ok {
            written.push(*n);
        }
        ok
    });
    if let Some(g) = cx.field(pid, 8) {
        let code = cx
            .lookup("AdministrativeSex", &g)
            .map_or("unknown", |c| c.code);
        w.string("gender", code);
    }
    let birth_date = birth.as_deref().and_then(|b| cx.date(b));
    if birth.is_some() && birth_date.is_none() {
        cx.dropped(pid, 7);
    }
    if let Some(b) = birth_date {
        w.string("birthDate", &b);
        if let Some(t) = birth_time {
            w.object("_birthDate");
            w.array("extension");
            w.begin_object();
            w.string(
                "url",
                "http://hl7.org/fhir/StructureDefinition/patient-birthTime",
            );
            w.string("valueDateTime", &t);
            w.end_object();
            w.end_array();
            w.end_object();
        }
    }
    // PID-30 only when PID-29 is empty (the IG's condition); a PID-30 that goes nowhere is reported.
    let deceased_at = cx.field(pid, 29).and_then(|d| cx.date_time(&d));
    if deceased_at.is_none() {
        cx.dropped(pid, 29);
    }
    if let Some(d) = deceased_at {
        w.string("deceasedDateTime", &d);
        cx.dropped(pid, 30);
    } else if let Some(b) = cx.field(pid, 30).and_then(|f| yes_no(&f)) {
        w.bool("deceasedBoolean", b);
    } else {
        cx.dropped(pid, 30);
    }
    let addresses = cx.reps(pid, 11);
    write_items(w, "address", &addresses, |w, v| {
        let ok = cx.address(w, *v);
        if ok {
            written.push(11);
        }
        ok
    });
    cx.codeable_concept(
        w,
        "maritalStatus",
        cx.rep1(pid, 16),
        Some(Table::new("MaritalStatus", "HL70002")),
    );
    if let Some(n) = cx
        .field(pid, 25)
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
    {
        w.number("multipleBirthInteger", n.trim_start_matches('0').max("0"));
        cx.dropped(pid, 24);
    } else if let Some(b) = cx.field(pid, 24).and_then(|f| yes_no(&f)) {
        w.bool("multipleBirthBoolean", b);
        cx.dropped(pid, 25);
    } else {
        cx.dropped(pid, 24);
        cx.dropped(pid, 25);
    }
    let language = cx.rep1(pid, 15);
    if language.is_some_and(|l| cx.cwe_valued(l)) {
        w.array("communication");
        w.begin_object();
        cx.codeable_concept(
            w,
            "language",
            language,
            Some(Table {
                fhir_only: true,
                ..Table::new("PrimaryLanguage", "HL70296")
            }),
        );
        w.end_object();
        w.end_array();
    }
    PID_MAPPED
        .iter()
        .copied()
        .filter(|n| !matches!(n, 5 | 9 | 11 | 13 | 14) || written.contains(n))
        .collect()
}

/// Writes `items` as an array under `key`, or nothing when none of them writes anything (a slice, or an
/// iterator of field repetitions with no Vec in between).
pub(crate) fn write_items<I: IntoIterator>(
    w: &mut Writer<'_>,
    key: &str,
    items: I,
    mut one: impl FnMut(&mut Writer<'_>, I::Item) -> bool,
) {
    let (mark, had) = (w.len(), w.has_members());
    let mut open = false;
    let mut any = false;
    for it in items {
        if !open {
            w.array(key);
            open = true;
        }
        any |= one(w, it);
    }
    if open {
        w.end_array();
        if !any {
            w.truncate(mark, had);
        }
    }
}

/// The numbers of the fields a map wrote (for [`Ctx::note_unmapped`]), kept in place: up to 16, which no
/// segment map here exceeds (more panics in tests, never in a release build: the rest are then reported
/// unmapped).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields {
    n: [usize; 16],
    len: usize,
}

impl Fields {
    pub fn of(fields: &[usize]) -> Self {
        let mut f = Self { n: [0; 16], len: 0 };
        for &n in fields {
            f.push(n);
        }
        f
    }

    pub fn push(&mut self, n: usize) {
        debug_assert!(self.len < self.n.len(), "more than 16 mapped fields");
        if let Some(slot) = self.n.get_mut(self.len) {
            *slot = n;
            self.len += 1;
        }
    }
}

impl std::ops::Deref for Fields {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.n[..self.len]
    }
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "Y" => Some(true),
        "N" => Some(false),
        _ => None,
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

pub(crate) fn related_person_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    nk1: &Segment<'_>,
    patient: &Target,
) {
    reference(w, "patient", patient);
    let rel = cx.rep1(nk1, 3);
    let role = cx.rep1(nk1, 7);
    let rels: Vec<(Value<'_>, Table)> = rel
        .into_iter()
        .map(|v| (v, Table::new("Relationship", "HL70063")))
        .chain(
            role.into_iter()
                .map(|v| (v, Table::new("ContactRole", "HL70131"))),
        )
        .collect();
    write_items(w, "relationship", &rels, |w, (v, t)| {
        cx.codeable_concept_item(w, *v, Some(*t))
    });
    let names = cx.reps(nk1, 2);
    write_items(w, "name", &names, |w, v| cx.human_name(w, *v));
    let phones: Vec<(Value<'_>, &str)> = cx
        .reps(nk1, 5)
        .into_iter()
        .map(|v| (v, "home"))
        .chain(cx.reps(nk1, 6).into_iter().map(|v| (v, "work")))
        .collect();
    write_items(w, "telecom", &phones, |w, (v, u)| {
        cx.contact_point(w, *v, Some(u))
    });
    if let Some(g) = cx.field(nk1, 15) {
        w.string(
            "gender",
            cx.lookup("AdministrativeSex", &g)
                .map_or("unknown", |c| c.code),
        );
    }
    if let Some(b) = cx.field(nk1, 16).and_then(|b| cx.date(&b)) {
        w.string("birthDate", &b);
    }
    let addresses = cx.reps(nk1, 4);
    write_items(w, "address", &addresses, |w, v| cx.address(w, *v));
    let start = cx.field(nk1, 8).and_then(|d| cx.date(&d));
    let end = cx.field(nk1, 9).and_then(|d| cx.date(&d));
    period(w, "period", start.as_deref(), end.as_deref());
}

pub(crate) fn allergy_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    al1: &Segment<'_>,
    patient: &Target,
) {
    w.object("clinicalStatus");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical",
    );
    w.string("code", "active");
    w.end_object();
    w.end_array();
    w.end_object();
    if let Some(t) = cx.field(al1, 2) {
        let ty = cx.lookup("AllergyType", &t);
        let cat = cx.lookup("AllergenType[AllergyIntoleranceCategory]", &t);
        if let Some(ty) = ty {
            w.string("type", ty.code);
        }
        if let Some(cat) = cat {
            w.array("category");
            w.item_string(cat.code);
            w.end_array();
        }
        if ty.is_none() && cat.is_none() {
            cx.dropped(al1, 2);
        }
    }
    let severity = cx.field(al1, 4);
    if let Some(c) = severity
        .as_deref()
        .and_then(|s| cx.lookup("AllergySeverity[AllergyIntolerance.criticality]", s))
    {
        w.string("criticality", c.code);
    }
    cx.codeable_concept(w, "code", cx.rep1(al1, 3), None);
    reference(w, "patient", patient);
    if let Some(d) = cx.field(al1, 6) {
        cx.write_date_time(w, "onsetDateTime", &d);
    }
    let reactions: Vec<String> = cx
        .reps(al1, 5)
        .into_iter()
        .filter_map(|r| cx.text(Some(r)).map(|t| t.into_owned()))
        .collect();
    if !reactions.is_empty() {
        w.array("reaction");
        w.begin_object();
        w.array("manifestation");
        for r in &reactions {
            w.begin_object();
            w.string("text", r);
            w.end_object();
        }
        w.end_array();
        if let Some(s) = severity
            .as_deref()
            .and_then(|s| cx.lookup("AllergySeverity[AllergyIntolerance.reaction.severity]", s))
        {
            w.string("severity", s.code);
        }
        w.end_object();
        w.end_array();
    }
}

/// The DG1[Condition] map; DG1-20 as the identifier unless `t` repeats an earlier entry's (see
/// [`Target::repeat`]). Returns the DG1 fields it mapped.
pub(crate) fn condition_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    dg1: &Segment<'_>,
    t: &Target,
    patient: &Target,
) -> &'static [usize] {
    if !t.repeat
        && let Some(ei) = cx.rep1(dg1, 20)
        && let Some((system, value)) = ei_key(cx, ei, false)
    {
        w.array("identifier");
        w.begin_object();
        w.string("system", &system);
        w.string("value", &value);
        w.end_object();
        w.end_array();
    }
    let code = cx.rep1(dg1, 3);
    if code.is_some_and(|c| cx.cwe_valued(c)) {
        cx.codeable_concept(w, "code", code, None);
    } else if let Some(text) = cx.field(dg1, 4) {
        w.object("code");
        w.string("text", &text);
        w.end_object();
    }
    reference(w, "subject", patient);
    if let Some(d) = cx.field(dg1, 5) {
        cx.write_date_time(w, "onsetDateTime", &d);
    }
    if let Some(d) = cx.field(dg1, 19) {
        cx.write_date_time(w, "recordedDate", &d);
    }
    if t.repeat {
        DG1_MAPPED_REPEAT
    } else {
        DG1_MAPPED
    }
}

pub(crate) fn coverage_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    in1: &Segment<'_>,
    patient: &Target,
) {
    let plan = cx.rep1(in1, 2);
    if let Some(plan_id) = plan.and_then(|p| cx.comp(p, 1)) {
        w.array("identifier");
        w.begin_object();
        w.string("value", &plan_id);
        w.end_object();
        w.end_array();
    }
    w.string("status", "active");
    cx.codeable_concept(
        w,
        "type",
        cx.rep1(in1, 15),
        Some(Table::new("PlanId", "HL70086")),
    );
    reference(w, "beneficiary", patient);
    cx.codeable_concept(
        w,
        "relationship",
        cx.rep1(in1, 17),
        Some(Table::new("Relationship", "HL70063")),
    );
    let start = cx.field(in1, 12).and_then(|d| cx.date(&d));
    let end = cx.field(in1, 13).and_then(|d| cx.date(&d));
    for (n, v) in [(12, &start), (13, &end)] {
        if v.is_none() {
            cx.dropped(in1, n);
        }
    }
    period(w, "period", start.as_deref(), end.as_deref());
    // payor (1..*): the insurance company by its id (IN1-3) and name (IN1-4).
    let company = cx.rep1(in1, 3).and_then(|c| cx.cx_key(c));
    let name = cx.rep1(in1, 4).and_then(|x| cx.comp(x, 1));
    w.array("payor");
    w.begin_object();
    if let Some((system, value)) = &company {
        w.object("identifier");
        w.string("system", system);
        w.string("value", value);
        w.end_object();
    }
    w.string("display", name.as_deref().unwrap_or("unknown insurer"));
    w.end_object();
    w.end_array();
}

/// What an Observation refers to besides its OBX: the patient, the visit, the specimen it is about
/// (SPECIMEN_OBSERVATION), and the NTE segments that follow the OBX.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ObsLinks<'x, 'a> {
    pub patient: Option<&'x Target>,
    pub encounter: Option<&'x Target>,
    pub focus: Option<&'x Target>,
    pub notes: &'x [Segment<'a>],
    /// When OBX-14 is empty: the time of the observations of its OBR (OBR-7), as v2 says.
    pub effective: Option<&'x str>,
    /// The Observation's target repeats an earlier entry's OBX-21 and code ([`Target::repeat`]): OBX-21 is
    /// not written, and reported.
    pub repeat: bool,
}

/// The practitioners an OBX (OBX-16) and its NTE segments (NTE-5) name.
pub(crate) fn observation_people<'a>(
    cx: &Ctx<'a, '_>,
    practitioners: &mut Practitioners<'a>,
    obx: &Segment<'a>,
    notes: &[Segment<'a>],
) {
    practitioners.add_xcn_field(cx, obx, 16);
    for nte in notes {
        note_author(cx, practitioners, nte);
    }
}

/// The practitioner who wrote an NTE (NTE-5), when the NTE has a comment to write.
pub(crate) fn note_author<'a>(
    cx: &Ctx<'a, '_>,
    practitioners: &mut Practitioners<'a>,
    nte: &Segment<'a>,
) {
    if cx
        .reps(nte, 3)
        .into_iter()
        .any(|r| cx.text(Some(r)).is_some())
        && let Some(x) = cx.rep1(nte, 5)
    {
        practitioners.add(cx, Person::Xcn(x));
    }
}

/// The OBX[Observation] map (and OBX[Observation-Component] when OBX-5 repeats); NTE[Observation] for the
/// notes. Returns the OBX fields it mapped (OBX-5 and OBX-6 depend on the value type).
pub(crate) fn observation_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    obx: &Segment<'_>,
    links: ObsLinks<'_, '_>,
) -> Fields {
    let mut mapped = Fields::of(&[1, 2, 3, 4, 7, 8, 11, 14, 16, 17, 20]);
    if !links.repeat {
        mapped.push(21);
    }
    // OBX-4 (OG, or ST before v2.8.2): the Extensions Pack's observation-v2-subid, as the IG's OG map says.
    let parts: Vec<(&str, bool, Option<std::borrow::Cow<'_, str>>)> = match cx.rep1(obx, 4) {
        Some(sub) if !sub.is_empty() => [
            ("original-sub-identifier", false, cx.comp(sub, 1)),
            ("group", true, cx.comp(sub, 2)),
            ("sequence", true, cx.comp(sub, 3)),
            ("identifier", false, cx.comp(sub, 4)),
        ]
        .into_iter()
        .filter(|(_, number, v)| v.as_deref().is_some_and(|v| !number || is_decimal(v)))
        .collect(),
        _ => Vec::new(),
    };
    if !parts.is_empty() || cx.has_field_maps("Observation") {
        let mark = (w.len(), w.has_members());
        w.array("extension");
        if !parts.is_empty() {
            w.begin_object();
            w.string(
                "url",
                "http://hl7.org/fhir/StructureDefinition/observation-v2-subid",
            );
            w.array("extension");
            for (url, number, v) in &parts {
                let v = v.as_deref().unwrap_or_default();
                w.begin_object();
                w.string("url", url);
                if *number {
                    w.number("valueDecimal", &normalise_decimal(v));
                } else {
                    w.string("valueString", v);
                }
                w.end_object();
            }
            w.end_array();
            w.end_object();
        }
        let any = cx.field_map_extensions(w, "Observation");
        w.end_array();
        if !any && parts.is_empty() {
            w.truncate(mark.0, mark.1);
        }
    }
    if !links.repeat
        && let Some(ei) = cx.rep1(obx, 21)
        && let Some(key) = ei_key(cx, ei, false)
    {
        w.array("identifier");
        identifier_item(w, &key, Some("FILL"));
        w.end_array();
    }
    let status = cx
        .field(obx, 11)
        .and_then(|s| cx.lookup("ObservationResultStatusCodesInterpretation", &s))
        .map_or("unknown", |c| c.code);
    w.string("status", status);
    let code = cx.rep1(obx, 3);
    observation_code(cx, w, code);
    if let Some(p) = links.patient {
        reference(w, "subject", p);
    }
    if let Some(f) = links.focus {
        w.array("focus");
        w.begin_object();
        w.string_parts("reference", &["urn:uuid:", &f.id]);
        w.end_object();
        w.end_array();
    }
    if let Some(e) = links.encounter {
        reference(w, "encounter", e);
    }
    if !cx
        .field(obx, 14)
        .is_some_and(|d| cx.write_date_time(w, "effectiveDateTime", &d))
        && let Some(d) = links.effective
    {
        w.string("effectiveDateTime", d);
    }
    let performers: Vec<Person<'_>> = cx.reps(obx, 16).into_iter().map(Person::Xcn).collect();
    practitioner_refs(cx, w, "performer", &performers);
    let used = observation_value(cx, w, obx, code);
    if used.value {
        mapped.push(5);
    }
    if used.units {
        mapped.push(6);
    }
    let flags = cx
        .seg_field(obx, 8)
        .into_iter()
        .flat_map(|f| f.repetitions())
        .filter(|v| !v.is_empty());
    write_items(w, "interpretation", flags, |w, v| {
        let Some(code) = cx.comp(v, 1) else {
            return false;
        };
        w.begin_object();
        w.array("coding");
        cx.mapped_coding(w, "InterpretationCodes", &code, "HL70078");
        w.end_array();
        w.end_object();
        true
    });
    notes_items(cx, w, links.notes);
    cx.codeable_concept(w, "bodySite", cx.rep1(obx, 20), None);
    cx.codeable_concept(w, "method", cx.rep1(obx, 17), None);
    if let Some(range) = cx.field(obx, 7) {
        w.array("referenceRange");
        w.begin_object();
        w.string("text", &range);
        w.end_object();
        w.end_array();
    }
    mapped
}

/// `code` (1..1): OBX-3, else the text "unknown".
fn observation_code(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, code: Option<Value<'_>>) {
    if !cx.codeable_concept(w, "code", code, None) {
        w.object("code");
        w.string("text", "unknown");
        w.end_object();
    }
}

/// The fields of an NTE the NTE[Observation] and NTE[ServiceRequest] maps write.
pub(crate) const NTE_MAPPED: &[usize] = &[1, 3, 5, 6];

/// NTE segments as `note` (Annotation): the comment (NTE-3, its repetitions as lines), the author (NTE-5) and
/// the time (NTE-6). An NTE without a comment writes nothing.
pub(crate) fn notes_items(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, notes: &[Segment<'_>]) {
    write_items(w, "note", notes, |w, nte| {
        let lines: Vec<String> = cx
            .reps(nte, 3)
            .into_iter()
            .filter_map(|r| cx.text(Some(r)).map(|t| t.into_owned()))
            .collect();
        if lines.is_empty() {
            return false;
        }
        w.begin_object();
        if let Some(t) = cx
            .rep1(nte, 5)
            .and_then(|x| practitioner_target(cx, Person::Xcn(x)))
        {
            reference(w, "authorReference", &t);
        }
        if let Some(d) = cx.field(nte, 6) {
            cx.write_date_time(w, "time", &d);
        }
        w.string("text", &lines.join("\n"));
        w.end_object();
        true
    });
}

/// Which of OBX-5 and OBX-6 an Observation's value used.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ValueUse {
    pub value: bool,
    pub units: bool,
}

impl std::ops::BitOrAssign for ValueUse {
    fn bitor_assign(&mut self, o: Self) {
        self.value |= o.value;
        self.units |= o.units;
    }
}

/// OBX-5 by OBX-2: ST/TX/FT → valueString (repetitions as lines); one value of another type → `value[x]`
/// (see [`value_x`]); a repeating value → one `component` per repetition, coded by OBX-3 (the IG's
/// OBX[Observation-Component] map).
pub(crate) fn observation_value(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    obx: &Segment<'_>,
    code: Option<Value<'_>>,
) -> ValueUse {
    let ty = cx.field(obx, 2).unwrap_or_default();
    let Some(value) = cx.seg_field(obx, 5) else {
        return ValueUse::default();
    };
    let reps: Vec<Value<'_>> = value.repetitions().filter(|r| !r.is_empty()).collect();
    match (ty.as_ref(), reps.as_slice()) {
        (_, []) => ValueUse::default(),
        ("ST" | "TX" | "FT", _) => {
            let esc = char::from(cx.msg.delimiters().escape);
            let parts: Vec<String> = reps
                .iter()
                .filter_map(|r| cx.text(Some(*r)))
                .map(|t| match ty.as_ref() {
                    "ST" => t.into_owned(),
                    _ => formatted_text(&t, esc),
                })
                .filter(|t| !t.is_empty())
                .collect();
            if parts.is_empty() {
                return ValueUse::default();
            }
            w.string("valueString", &parts.join("\n"));
            ValueUse {
                value: true,
                units: false,
            }
        }
        (_, [one]) => value_x(cx, w, &ty, *one, obx),
        _ => {
            let mut used = ValueUse::default();
            w.array("component");
            for r in &reps {
                w.begin_object();
                observation_code(cx, w, code);
                used |= value_x(cx, w, &ty, *r, obx);
                w.end_object();
            }
            w.end_array();
            used
        }
    }
}

/// One OBX-5 value as `value[x]`: NM → valueQuantity (unit OBX-6); CE/CWE/CNE/CF/IS → valueCodeableConcept;
/// DT/DTM/TS → valueDateTime; TM → valueTime; SN → valueQuantity (with its comparator), valueRange (`-`) or
/// valueRatio (`:` `/`), else its parts and unit as a string; NR → valueRange; DR → valuePeriod; ED (an
/// encapsulated document, which R4's Observation has no element for) → nothing; anything else, and values
/// that do not parse as their type, → valueString of the components.
fn value_x(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    ty: &str,
    v: Value<'_>,
    obx: &Segment<'_>,
) -> ValueUse {
    let value_only = ValueUse {
        value: true,
        units: false,
    };
    let with_units = ValueUse {
        value: true,
        units: cx.seg_field(obx, 6).is_some_and(|f| !f.is_empty()),
    };
    match ty {
        "NM" => match cx.text(Some(v)) {
            Some(n) if is_decimal(&n) => {
                quantity(cx, w, "valueQuantity", &n, None, obx);
                with_units
            }
            Some(_) => string_value(cx, w, v),
            None => ValueUse::default(),
        },
        "CE" | "CWE" | "CNE" | "IS" | "CF" => {
            if cx.codeable_concept(w, "valueCodeableConcept", Some(v), None) {
                value_only
            } else {
                ValueUse::default()
            }
        }
        "DT" | "DTM" | "TS" => match cx.comp(v, 1) {
            Some(d) => match cx.date_time(&d) {
                Some(d) => {
                    w.string("valueDateTime", &d);
                    value_only
                }
                None => string_value(cx, w, v),
            },
            None => ValueUse::default(),
        },
        "TM" => match cx.comp(v, 1) {
            Some(t) => match fhir_time(&t) {
                Some(t) => {
                    w.string("valueTime", &t);
                    value_only
                }
                None => string_value(cx, w, v),
            },
            None => ValueUse::default(),
        },
        "SN" => structured_numeric(cx, w, v, obx),
        "NR" => {
            let lo = cx.comp(v, 1).filter(|n| is_decimal(n));
            let hi = cx.comp(v, 2).filter(|n| is_decimal(n));
            if lo.is_none() && hi.is_none() {
                return string_value(cx, w, v);
            }
            w.object("valueRange");
            if let Some(lo) = &lo {
                quantity(cx, w, "low", lo, None, obx);
            }
            if let Some(hi) = &hi {
                quantity(cx, w, "high", hi, None, obx);
            }
            w.end_object();
            with_units
        }
        "DR" => {
            let start = cx.comp(v, 1).and_then(|d| cx.date_time(&d));
            let end = cx.comp(v, 2).and_then(|d| cx.date_time(&d));
            if start.is_none() && end.is_none() {
                return string_value(cx, w, v);
            }
            w.object("valuePeriod");
            if let Some(s) = &start {
                w.string("start", s);
            }
            if let Some(e) = &end {
                w.string("end", e);
            }
            w.end_object();
            value_only
        }
        "ED" => ValueUse::default(),
        _ => string_value(cx, w, v),
    }
}

/// valueString: the value's components with a value, space separated (the IG's default).
fn string_value(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, v: Value<'_>) -> ValueUse {
    let parts: Vec<String> = v
        .components()
        .filter_map(|c| cx.text(Some(c)).map(|t| t.into_owned()))
        .collect();
    if parts.is_empty() {
        return ValueUse::default();
    }
    w.string("valueString", &parts.join(" "));
    ValueUse {
        value: true,
        units: false,
    }
}

/// FT/TX text with its formatting commands (kept as written by the unescaping) made plain: `\.br\` and
/// `\.sp\` as line breaks, the other commands (`\.in\`, `\.ce\`, `\H\`, `\N\`...) dropped.
fn formatted_text(t: &str, esc: char) -> String {
    let mut out = String::with_capacity(t.len());
    let mut rest = t;
    while let Some(i) = rest.find(esc) {
        out.push_str(&rest[..i]);
        let after = &rest[i + esc.len_utf8()..];
        match after.find(esc) {
            Some(j) if after.starts_with('.') || matches!(&after[..j], "H" | "N") => {
                let command = &after[..j];
                if command.starts_with(".br") || command.starts_with(".sp") {
                    out.push('\n');
                }
                rest = &after[j + esc.len_utf8()..];
            }
            _ => {
                out.push(esc);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.trim().to_owned()
}

/// SN (comparator, number, separator, number) by the IG's SN maps.
fn structured_numeric(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    sn: Value<'_>,
    obx: &Segment<'_>,
) -> ValueUse {
    let comparator = cx.comp(sn, 1);
    let n1 = cx.comp(sn, 2).filter(|n| is_decimal(n));
    let sep = cx.comp(sn, 3);
    let n2 = cx.comp(sn, 4).filter(|n| is_decimal(n));
    let units = cx.seg_field(obx, 6).is_some_and(|f| !f.is_empty());
    let cmp = match comparator.as_deref() {
        None | Some("=") => Some(None),
        Some(c @ ("<" | "<=" | ">=" | ">")) => Some(Some(c)),
        Some(_) => None,
    };
    match (cmp, sep.as_deref(), &n1, &n2) {
        (Some(cmp), None, Some(n), None) => {
            quantity(cx, w, "valueQuantity", n, cmp, obx);
        }
        (Some(None), Some("-"), Some(lo), Some(hi)) => {
            w.object("valueRange");
            quantity(cx, w, "low", lo, None, obx);
            quantity(cx, w, "high", hi, None, obx);
            w.end_object();
        }
        (Some(None), Some(":" | "/"), Some(a), Some(b)) => {
            w.object("valueRatio");
            quantity(cx, w, "numerator", a, None, obx);
            quantity(cx, w, "denominator", b, None, obx);
            w.end_object();
        }
        _ => {
            let mut text: Vec<String> = [1, 2, 3, 4]
                .iter()
                .filter_map(|&n| cx.comp(sn, n).map(|t| t.into_owned()))
                .collect();
            if text.is_empty() {
                return ValueUse::default();
            }
            if let Some(u) = cx
                .rep1(obx, 6)
                .and_then(|u| cx.comp(u, 2).or_else(|| cx.comp(u, 1)))
            {
                text.push(u.into_owned());
            }
            w.string("valueString", &text.join(" "));
        }
    }
    ValueUse { value: true, units }
}

/// A Quantity under `key`: the value, the unit from OBX-6 (UCUM when OBX-6.3 says so).
fn quantity(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    key: &str,
    value: &str,
    comparator: Option<&str>,
    obx: &Segment<'_>,
) {
    w.object(key);
    w.number("value", &normalise_decimal(value));
    if let Some(c) = comparator {
        w.string("comparator", c);
    }
    if let Some(units) = cx.rep1(obx, 6) {
        let code = cx.comp(units, 1);
        let text = cx.comp(units, 2).or_else(|| code.clone());
        if let Some(t) = &text {
            w.string("unit", t);
        }
        let system = cx.comp(units, 3).and_then(|s| cx.coding_system_ref(&s));
        if let (Some(system), Some(code)) = (system, &code) {
            w.string("system", &system);
            w.string("code", code);
        }
    }
    w.end_object();
}

/// EVN fields the Provenance maps (EVN-1, EVN-2, EVN-4, EVN-6); the others are reported unmapped.
pub(crate) const EVN_MAPPED: &[usize] = &[1, 2, 4, 6];

/// The Bundle's last entry, the Provenance of this conversion (its targets: the resources written, and the
/// event of EVN when there is one), then the Bundle's end.
pub(crate) fn provenance_and_end<'a>(
    cx: &mut Ctx<'a, '_>,
    w: &mut Writer<'_>,
    msg_key: &[&str],
    targets: &[Uuid],
    evn: Option<&Segment<'a>>,
    frame: &Frame,
) -> Outcome {
    let prov = cx.target("Provenance", msg_key, None);
    cx.begin_entry(w, &prov);
    provenance_body(cx, w, targets, evn, frame.timestamp.as_deref());
    cx.end_entry(w, &prov);
    if let Some(evn) = evn {
        cx.note_unmapped(evn, EVN_MAPPED);
    }
    end_bundle(cx, w, frame)
}

pub(crate) fn provenance_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    targets: &[Uuid],
    evn: Option<&Segment<'_>>,
    timestamp: Option<&str>,
) {
    w.array("target");
    for t in targets {
        w.begin_object();
        w.string_parts("reference", &["urn:uuid:", t]);
        w.end_object();
    }
    w.end_array();
    if let Some(evn) = evn {
        let occurred = cx
            .field(evn, 6)
            .or_else(|| cx.field(evn, 2))
            .and_then(|d| cx.date_time(&d));
        if let Some(o) = occurred {
            w.string("occurredDateTime", &o);
        }
    }
    // recorded (1..1, instant): when the message was written (MSH-7 with an offset) or received.
    let recorded = evn
        .and_then(|e| cx.field(e, 2))
        .and_then(|d| cx.instant(&d))
        .or_else(|| timestamp.map(str::to_owned))
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_owned());
    w.string("recorded", &recorded);
    if let Some(reason) = evn.and_then(|e| cx.rep1(e, 4))
        && cx.cwe_valued(reason)
    {
        w.array("reason");
        cx.codeable_concept_item(w, reason, Some(Table::new("EventReason", "HL70062")));
        w.end_array();
    }
    w.object("activity");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/v3-DataOperation",
    );
    w.string("code", "UPDATE");
    w.end_object();
    w.end_array();
    w.string(
        "text",
        "HL7 v2 message converted to FHIR by hl7gw (v2-to-FHIR IG maps)",
    );
    w.end_object();
    w.array("agent");
    w.begin_object();
    w.object("type");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/provenance-participant-type",
    );
    w.string("code", "assembler");
    w.end_object();
    w.end_array();
    w.end_object();
    w.object("who");
    w.string("display", "hl7gw");
    w.end_object();
    w.end_object();
    w.end_array();
}

/// The Condition of a DG1: by its identifier (DG1-20), else by the patient, its code and `position`.
pub(crate) fn condition_target(
    cx: &Ctx<'_, '_>,
    dg1: &Segment<'_>,
    patient_key: &str,
    position: &str,
) -> Target {
    let by = cx.rep1(dg1, 20).and_then(|ei| ei_key(cx, ei, false));
    let code = cx.field(dg1, 3).unwrap_or_default();
    match by {
        Some((s, v)) => cx.target("Condition", &[&s, &v], Some((s.clone(), v.clone()))),
        None => cx.target("Condition", &[patient_key, "DG1", &code, position], None),
    }
}
