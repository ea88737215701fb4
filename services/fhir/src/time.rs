//! The time zone of a sender's times written without an offset: a fixed offset, or an IANA zone whose offset
//! (daylight saving included) is found per value from the zone database compiled into the binary (jiff's
//! bundled copy, so a scratch image without `/usr/share/zoneinfo` converts the same as a developer's machine).

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, Offset};

/// A route's (or a sender's) time zone.
#[derive(Debug, Clone)]
pub struct TimeZone {
    name: String,
    zone: Zone,
}

#[derive(Debug, Clone)]
enum Zone {
    /// `Z`, `+01:00`: written as given.
    Fixed(String),
    Iana(jiff::tz::TimeZone),
}

/// What the local time of a value is in a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalOffset<'z> {
    /// One offset: written after the time (`+01:00`, `Z`).
    Fixed(&'z str),
    /// One offset, found in the zone database.
    Found(Offset),
    /// The clock was set back and the time happened twice (the hour after daylight saving ends): which one is
    /// not known.
    Ambiguous,
    /// The clock was set forward past the time (the hour daylight saving skips): no such time.
    Skipped,
}

impl TimeZone {
    /// `Z`, `+hh:mm` / `-hh:mm`, or an IANA zone name (`Europe/Berlin`, `America/New_York`, `UTC`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let b = s.as_bytes();
        let offset = b.len() == 6
            && matches!(b[0], b'+' | b'-')
            && b[1..3].iter().all(u8::is_ascii_digit)
            && b[3] == b':'
            && b[4..6].iter().all(u8::is_ascii_digit)
            && format!("{}{}", &s[1..3], &s[4..6]).as_str() <= "1400"
            && s[4..6] <= *"59";
        if s == "Z" || offset {
            return Ok(Self {
                name: s.to_owned(),
                zone: Zone::Fixed(s.to_owned()),
            });
        }
        match jiff::tz::db().get(s) {
            Ok(tz) => Ok(Self {
                name: s.to_owned(),
                zone: Zone::Iana(tz),
            }),
            Err(_) => Err(format!(
                "timezone {s:?}: expected an IANA zone name (America/New_York), Z, +hh:mm or -hh:mm"
            )),
        }
    }

    /// As configured.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The offset of a local date and time (already checked to be a real calendar date and time of day).
    pub(crate) fn offset_of(&self, y: i16, mo: i8, d: i8, h: i8, mi: i8, s: i8) -> LocalOffset<'_> {
        let tz = match &self.zone {
            Zone::Fixed(z) => return LocalOffset::Fixed(z),
            Zone::Iana(tz) => tz,
        };
        let Ok(dt) = DateTime::new(y, mo, d, h, mi, s, 0) else {
            return LocalOffset::Skipped;
        };
        match tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => LocalOffset::Found(offset),
            AmbiguousOffset::Fold { .. } => LocalOffset::Ambiguous,
            AmbiguousOffset::Gap { .. } => LocalOffset::Skipped,
        }
    }
}

/// `+hh:mm` / `-hh:mm` (or `Z` for UTC, as the fixed form writes it too when configured so) of an offset.
pub(crate) fn write_offset(out: &mut Vec<u8>, offset: Offset) {
    let secs = offset.seconds();
    let sign = if secs < 0 { b'-' } else { b'+' };
    let m = secs.unsigned_abs() / 60;
    let (h, m) = (m / 60, m % 60);
    out.push(sign);
    out.push(b'0' + (h / 10) as u8);
    out.push(b'0' + (h % 10) as u8);
    out.push(b':');
    out.push(b'0' + (m / 10) as u8);
    out.push(b'0' + (m % 10) as u8);
}

/// The days of a month of the proleptic Gregorian calendar.
pub(crate) fn days_in_month(y: i32, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 0,
    }
}
