//! OBX → Observation (the OBX[Observation] and OBX[Observation-Component] maps): the value by its type, its
//! people and links.

use crate::context::{Ctx, Target, reference, references};
use crate::datatypes::cwe::primary_coding;
use crate::datatypes::cx::{ei_key, identifier_item};
use crate::datatypes::dtm::fhir_time;
use crate::datatypes::nm::{is_decimal, normalise_decimal};
use crate::datatypes::xcn::{Person, Practitioners, practitioner_refs};
use crate::json::Writer;
use crate::segments::nte::{note_author, notes_items};
use crate::segments::{Fields, coded_target, write_items};
use hl7v2::message::{Segment, Value};

/// The Observation of an OBX: by its instance identifier (OBX-21) and code (OBX-3), else by `derived` (the
/// map's key of the OBX).
pub(crate) fn observation_target(cx: &Ctx<'_, '_>, obx: &Segment<'_>, derived: &[&str]) -> Target {
    match cx.rep1(obx, 21).and_then(|ei| ei_key(cx, ei, false)) {
        Some(key) => coded_target(cx, "Observation", key, primary_coding(cx, cx.rep1(obx, 3))),
        None => cx.target("Observation", derived, None),
    }
}

/// What an Observation refers to besides its OBX: the patient, the visit, the specimen it is about
/// (SPECIMEN_OBSERVATION), the event it is part of, and the NTE segments that follow the OBX.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ObsLinks<'x, 'a> {
    pub patient: Option<&'x Target>,
    pub encounter: Option<&'x Target>,
    pub focus: Option<&'x Target>,
    /// The event (an Immunization) the observation was made as part of.
    pub part_of: Option<&'x Target>,
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
        references(w, "focus", &[f]);
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
    if let Some(p) = links.part_of {
        references(w, "partOf", &[p]);
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
                    _ => plain_text(&t, esc).trim().to_owned(),
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
/// `\.sp\` as line breaks, the other commands (`\.in\`, `\.ce\`, `\H\`, `\N\`...) dropped. (OBX-5 and
/// MDM's document text alike.)
pub(crate) fn plain_text(t: &str, esc: char) -> String {
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
    out
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
