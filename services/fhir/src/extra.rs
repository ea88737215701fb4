//! What the VXU, MDM and SIU maps share beyond `common`: times moved by a v2 duration, a single Address
//! object, Organizations and Locations named by a CWE or PL, and conditional updates kept unique within a
//! Bundle.

use crate::dt::{Ctx, Target};
use crate::json::Writer;
use hl7v2::message::Value;
use std::collections::HashSet;

/// The seconds of one v2 duration unit (an ISO+/UCUM/ANSI code of CWE-1, or its text): `s`, `min`, `h`,
/// `d`, `wk`, and the spellings the corpus uses (`m`, `Min`, `Minutes`, `hr`...). `None` for anything else.
pub(crate) fn unit_seconds(unit: &str) -> Option<i64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "s" | "sec" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600,
        "d" | "day" | "days" => 86_400,
        "wk" | "week" | "weeks" => 604_800,
        _ => return None,
    })
}

/// An NM duration with its CWE unit (default minutes, as v2's scheduling segments say) in seconds.
pub(crate) fn duration_seconds(
    cx: &Ctx<'_, '_>,
    amount: &str,
    unit: Option<Value<'_>>,
) -> Option<i64> {
    let n: f64 = amount
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let per = match unit {
        Some(u) if !u.is_empty() => cx
            .comp(u, 1)
            .and_then(|c| unit_seconds(&c))
            .or_else(|| cx.comp(u, 2).and_then(|t| unit_seconds(&t)))?,
        _ => 60,
    };
    // At most ten years: anything longer is not a schedule's duration.
    let secs = (n * per as f64).round();
    (secs <= 315_360_000.0).then_some(secs as i64)
}

/// A FHIR dateTime with a time of day and an offset (`YYYY-MM-DDThh:mm:ss[.f]±hh:mm` or `Z`), moved by
/// `seconds`. `None` for a dateTime without a time (a date alone cannot carry a duration).
pub(crate) fn add_seconds(date_time: &str, seconds: i64) -> Option<String> {
    let b = date_time.as_bytes();
    if b.len() < 20 || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { date_time.get(r)?.parse().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // The fraction and the offset, kept as written.
    let rest = &date_time[19..];
    let (frac, offset) = match rest.find(['+', '-', 'Z']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => return None,
    };
    let days = days_from_civil(y, mo, d);
    let total = days * 86_400 + h * 3_600 + mi * 60 + s + seconds;
    let (days, secs) = (total.div_euclid(86_400), total.rem_euclid(86_400));
    let (y, mo, d) = civil_from_days(days);
    if !(1..=9999).contains(&y) {
        return None;
    }
    Some(format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}{frac}{offset}",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// XAD → an Address object under `key` (for elements of cardinality 0..1, as Location.address). False when
/// the XAD has nothing to write.
pub(crate) fn address_object(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    key: &str,
    xad: Value<'_>,
) -> bool {
    let street = cx.text(xad.component(1).and_then(|c| c.subcomponent(1)));
    let other = cx.comp(xad, 2);
    let parts = [
        ("city", cx.comp(xad, 3)),
        ("district", cx.comp(xad, 9)),
        ("state", cx.comp(xad, 4)),
        ("postalCode", cx.comp(xad, 5)),
        ("country", cx.comp(xad, 6)),
    ];
    if street.is_none() && other.is_none() && parts.iter().all(|(_, v)| v.is_none()) {
        return false;
    }
    w.object(key);
    if street.is_some() || other.is_some() {
        w.array("line");
        for l in [&street, &other].into_iter().flatten() {
            w.item_string(l);
        }
        w.end_array();
    }
    for (k, v) in &parts {
        if let Some(v) = v {
            w.string(k, v);
        }
    }
    w.end_object();
    true
}

/// A CWE naming an organization (RXA-17, a manufacturer): its identifier (CWE-1 in the coding system
/// CWE-3 names, as `MVX`) and its name (CWE-2, else CWE-1).
#[derive(Debug, Clone)]
pub(crate) struct Org {
    pub target: Target,
    pub identifier: Option<(String, String)>,
    pub name: Option<String>,
}

/// The Organization of a CWE, if it has a code or a text.
pub(crate) fn organization(cx: &Ctx<'_, '_>, cwe: Value<'_>) -> Option<Org> {
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

/// Writes an Organization entry.
pub(crate) fn organization_entry(cx: &mut Ctx<'_, '_>, w: &mut Writer<'_>, org: &Org) {
    cx.begin_entry(w, &org.target);
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
    cx.end_entry(w, &org.target);
}

/// The conditional updates of one Bundle: a condition (business identifier, and code when it names one) two
/// resources of the message share is used for the first only; the others get an id derived from it and their
/// position (a transaction may not hold the same conditional update twice) and are marked
/// [`Target::repeat`]: they do not carry the identifier, so the first one's condition matches it alone, in
/// this message and in later ones.
#[derive(Debug, Default)]
pub(crate) struct Unique {
    seen: HashSet<String>,
    ids: HashSet<crate::dt::Uuid>,
}

impl Unique {
    /// `t`, or (its condition already used) a target by id derived from it and `position`; a target by id
    /// whose id an earlier one has (a code-less order number, see `coded_target`) gets one derived from it
    /// and `position`.
    pub fn check(&mut self, cx: &Ctx<'_, '_>, t: Target, position: &str) -> Target {
        let Some((s, v)) = &t.by else {
            if self.ids.insert(t.id) {
                return t;
            }
            let mut r = cx.target(t.rtype, &[&t.id, position], None);
            self.ids.insert(r.id);
            r.repeat = t.repeat;
            return r;
        };
        let (cs, cc) = t.code.as_ref().map_or(("", ""), |(cs, cc)| {
            (cs.as_deref().unwrap_or_default(), cc.as_str())
        });
        // Unit separators: no system, value or code holds one.
        if self
            .seen
            .insert(format!("{}\u{1f}{s}\u{1f}{v}\u{1f}{cs}\u{1f}{cc}", t.rtype))
        {
            return t;
        }
        let mut r = match &t.code {
            Some(_) => cx.target(t.rtype, &[s, v, cs, cc, position], None),
            None => cx.target(t.rtype, &[s, v, position], None),
        };
        r.repeat = true;
        r
    }
}

/// A CodeableConcept under `key` with one coding (system, code, display).
pub(crate) fn coded(
    w: &mut Writer<'_>,
    key: &str,
    system: &str,
    code: &str,
    display: Option<&str>,
) {
    w.object(key);
    w.array("coding");
    coding_item(w, system, code, display);
    w.end_array();
    w.end_object();
}

/// A Coding array item.
pub(crate) fn coding_item(w: &mut Writer<'_>, system: &str, code: &str, display: Option<&str>) {
    w.begin_object();
    w.string("system", system);
    w.string("code", code);
    if let Some(d) = display {
        w.string("display", d);
    }
    w.end_object();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_move_times_across_days_months_and_years() {
        assert_eq!(
            add_seconds("2021-09-24T09:30:00+02:15", 50 * 60).as_deref(),
            Some("2021-09-24T10:20:00+02:15")
        );
        assert_eq!(
            add_seconds("2020-02-28T23:30:00Z", 3_600).as_deref(),
            Some("2020-02-29T00:30:00Z")
        );
        assert_eq!(
            add_seconds("2021-12-31T23:59:59.5-05:00", 1).as_deref(),
            Some("2022-01-01T00:00:00.5-05:00")
        );
        assert_eq!(add_seconds("2021-12-31", 1), None);
        assert_eq!(unit_seconds("Min"), Some(60));
        assert_eq!(unit_seconds("hr"), Some(3_600));
        assert_eq!(unit_seconds("furlong"), None);
    }
}
