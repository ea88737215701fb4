//! PID → Patient (the PID[Patient] map), and the patient's match key.

use crate::FhirError;
use crate::context::{Ctx, Target};
use crate::datatypes::cwe::Table;
use crate::json::Writer;
use crate::segments::write_items;
use hl7v2::message::{Segment, Value};

/// The PID fields the PID[Patient] map writes (the rest, when valued, are reported as unmapped).
pub(crate) const PID_MAPPED: &[usize] = &[
    1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 19, 24, 25, 29, 30,
];

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

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "Y" => Some(true),
        "N" => Some(false),
        _ => None,
    }
}
