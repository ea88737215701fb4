//! DTM/TS/DT → FHIR dateTime, date and instant (offsets from the message or the route's time zone), TM → time,
//! Periods, and times moved by a v2 duration.

use crate::TimeZone;
use crate::context::Ctx;
use crate::json::Writer;
use crate::time::LocalOffset;
use hl7v2::message::Value;

impl<'a, 'm> Ctx<'a, 'm> {
    /// DTM/TS → FHIR `dateTime`: `YYYY`, `YYYY-MM`, `YYYY-MM-DD`, or with a time of day and an offset (the
    /// message's, else the route's `timezone`; without either, the date alone).
    pub fn date_time(&self, v2: &str) -> Option<String> {
        dtm(v2, self.tz, false)
    }

    /// [`Ctx::date_time`] written as `"key":"<dateTime>"` straight into the output, when there is one.
    pub fn write_date_time(&self, w: &mut Writer<'_>, key: &str, v2: &str) -> bool {
        // Digits, `-`, `:`, `T`, `.` and an offset checked to be `Z` or `±hh:mm`: nothing to escape.
        w.string_with(key, |out| dtm_into(out, v2, self.tz, false))
    }

    /// DTM → FHIR `date` (the date part).
    pub fn date(&self, v2: &str) -> Option<String> {
        let mut d = dtm(v2, None, false)?;
        d.truncate(10);
        Some(d)
    }

    /// DTM → FHIR `instant` (to the second, with an offset), when the value allows it.
    pub fn instant(&self, v2: &str) -> Option<String> {
        dtm(v2, self.tz, true)
    }
}

/// A Period under `key`, when either end is known.
pub(crate) fn period(w: &mut Writer<'_>, key: &str, start: Option<&str>, end: Option<&str>) {
    if start.is_none() && end.is_none() {
        return;
    }
    w.object(key);
    if let Some(s) = start {
        w.string("start", s);
    }
    if let Some(e) = end {
        w.string("end", e);
    }
    w.end_object();
}

/// A time under `single` (`effectiveDateTime`) when only the start is known, else a Period under `period`.
pub(crate) fn date_or_period(
    w: &mut Writer<'_>,
    single: &str,
    period_key: &str,
    start: Option<&str>,
    end: Option<&str>,
) {
    match (start, end) {
        (Some(s), None) => w.string(single, s),
        _ => period(w, period_key, start, end),
    }
}

/// v2 DTM (`YYYY[MM[DD[HH[MM[SS[.S+]]]]]][+/-ZZZZ]`) as FHIR dateTime (or instant: seconds and offset required).
pub(crate) fn dtm(v2: &str, default_tz: Option<&TimeZone>, instant: bool) -> Option<String> {
    let mut s = Vec::with_capacity(32);
    if !dtm_into(&mut s, v2, default_tz, instant) {
        return None;
    }
    // Pieces of `v2` and the zone's offset, cut at ASCII characters: UTF-8.
    String::from_utf8(s).ok()
}

/// [`dtm`] appended to `s` (nothing appended when it gives `None`), without a String of its own. A date or
/// time that does not exist (month 13, 29 February 2023, 25:00, an offset of +2500, a local time that daylight
/// saving skips) gives `None`: the caller reports the field, nothing is written. A local time that happened
/// twice (the hour after daylight saving ends) keeps only its date.
pub(crate) fn dtm_into(
    s: &mut Vec<u8>,
    v2: &str,
    default_tz: Option<&TimeZone>,
    instant: bool,
) -> bool {
    let (body, tz) = match v2.find(['+', '-']) {
        Some(i) if i >= 4 => (&v2[..i], Some(&v2[i..])),
        _ => (v2, None),
    };
    let (digits, frac) = match body.find('.') {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let n = digits.len();
    if !matches!(n, 4 | 6 | 8 | 10 | 12 | 14) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let d = digits;
    let num = |r: std::ops::Range<usize>| -> u32 {
        d.as_bytes()[r]
            .iter()
            .fold(0, |n, b| n * 10 + u32::from(b - b'0'))
    };
    let (y, mo, day) = (
        num(0..4),
        if n >= 6 { num(4..6) } else { 1 },
        if n >= 8 { num(6..8) } else { 1 },
    );
    let (h, mi, sec) = (
        if n >= 10 { num(8..10) } else { 0 },
        if n >= 12 { num(10..12) } else { 0 },
        if n >= 14 { num(12..14) } else { 0 },
    );
    if y == 0
        || !(1..=12).contains(&mo)
        || day == 0
        || day > crate::time::days_in_month(y as i32, mo)
        || h > 23
        || mi > 59
        || sec > 59
    {
        return false;
    }
    // The message's offset (`+HHMM`), else the route's time zone.
    // Anything after the digits that is not an offset FHIR can write (`±HHMM` up to ±1400: a `-05:00`, an ISO
    // date `2024-03-15`) is not taken as "no offset", which would give the time the route's zone instead of
    // its own: the value is reported.
    let own = match tz {
        Some(z) => {
            let b = z.as_bytes();
            if b.len() != 5
                || !b[1..].iter().all(u8::is_ascii_digit)
                || &z[1..5] > "1400"
                || &z[3..5] > "59"
            {
                return false;
            }
            Some(z)
        }
        None => None,
    };
    // A fraction belongs to the seconds (DTM): after anything shorter, or not digits, the value is not one.
    if frac.is_some_and(|f| n < 14 || f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    let local = match (own, default_tz) {
        (None, Some(zone)) if n > 8 => {
            Some(zone.offset_of(y as i16, mo as i8, day as i8, h as i8, mi as i8, sec as i8))
        }
        _ => None,
    };
    if local == Some(LocalOffset::Skipped) {
        return false;
    }
    if n <= 8 || (own.is_none() && local.is_none()) || local == Some(LocalOffset::Ambiguous) {
        if instant {
            return false;
        }
        s.extend_from_slice(&d.as_bytes()[..4]);
        if n >= 6 {
            s.push(b'-');
            s.extend_from_slice(&d.as_bytes()[4..6]);
        }
        if n >= 8 {
            s.push(b'-');
            s.extend_from_slice(&d.as_bytes()[6..8]);
        }
        return true;
    }
    s.extend_from_slice(&d.as_bytes()[..4]);
    s.push(b'-');
    s.extend_from_slice(&d.as_bytes()[4..6]);
    s.push(b'-');
    s.extend_from_slice(&d.as_bytes()[6..8]);
    s.push(b'T');
    s.extend_from_slice(&d.as_bytes()[8..10]);
    s.push(b':');
    s.extend_from_slice((if n >= 12 { &d[10..12] } else { "00" }).as_bytes());
    s.push(b':');
    s.extend_from_slice((if n >= 14 { &d[12..14] } else { "00" }).as_bytes());
    if let Some(f) = frac {
        s.push(b'.');
        s.extend_from_slice(f.as_bytes());
    }
    match (own, local) {
        (Some(z), _) => {
            s.extend_from_slice(&z.as_bytes()[..3]);
            s.push(b':');
            s.extend_from_slice(&z.as_bytes()[3..5]);
        }
        (None, Some(LocalOffset::Fixed(z))) => s.extend_from_slice(z.as_bytes()),
        (None, Some(LocalOffset::Found(offset))) => crate::time::write_offset(s, offset),
        _ => {}
    }
    true
}

/// v2 TM (`HH[MM[SS[.S+]]]`, no offset) as FHIR `time`.
pub(crate) fn fhir_time(v2: &str) -> Option<String> {
    let (digits, frac) = match v2.split_once('.') {
        Some((d, f)) => (d, Some(f)),
        None => (v2, None),
    };
    if !matches!(digits.len(), 2 | 4 | 6) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let part = |i: usize| digits.get(i..i + 2).unwrap_or("00");
    let (h, m, s) = (part(0), part(2), part(4));
    if h > "23" || m > "59" || s > "59" {
        return None;
    }
    let mut t = format!("{h}:{m}:{s}");
    if let Some(f) = frac {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.push('.');
        t.push_str(f);
    }
    Some(t)
}

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
