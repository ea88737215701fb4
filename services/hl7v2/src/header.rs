//! The MSH essentials as typed, borrowed values.

use crate::scan::{body_start, nth, read_delimiters};
use crate::{Delimiters, ParseError};
use memchr::{memchr_iter, memchr2};

/// MSH fields the gateway routes, keys and acknowledges by. Values are raw bytes as on the wire (escape
/// sequences not resolved); an absent field is empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header<'a> {
    /// The delimiters from MSH-1/MSH-2.
    pub delimiters: Delimiters,
    /// MSH-2 exactly as written; empty when the delimiters are unusable ([`Header::salvage`] of broken input),
    /// which tells [`write_ack`](crate::ack::write_ack) to answer with the default delimiters.
    pub encoding_characters: &'a [u8],
    /// MSH-3, the whole HD field.
    pub sending_application: &'a [u8],
    /// MSH-4, the whole HD field.
    pub sending_facility: &'a [u8],
    /// MSH-5, the whole HD field.
    pub receiving_application: &'a [u8],
    /// MSH-6, the whole HD field.
    pub receiving_facility: &'a [u8],
    /// MSH-7.
    pub timestamp: &'a [u8],
    /// MSH-9.1, e.g. `ADT`.
    pub message_type: &'a [u8],
    /// MSH-9.2, e.g. `A01`.
    pub trigger_event: &'a [u8],
    /// MSH-9.3, e.g. `ADT_A01`.
    pub structure: &'a [u8],
    /// MSH-10.
    pub control_id: &'a [u8],
    /// MSH-11.1: P, D or T.
    pub processing_id: &'a [u8],
    /// MSH-11, the whole field (copied into ACKs).
    pub processing_field: &'a [u8],
    /// MSH-12.1, e.g. `2.5.1`.
    pub version: &'a [u8],
    /// MSH-12, the whole field (copied into ACKs).
    pub version_field: &'a [u8],
    /// MSH-15 accept acknowledgment type (AL, NE, ER, SU).
    pub accept_ack_type: &'a [u8],
    /// MSH-16 application acknowledgment type.
    pub application_ack_type: &'a [u8],
    /// MSH-18, first repetition: the character set.
    pub charset: &'a [u8],
}

/// The MSH fields a header reads, by HL7 number (index 0 and 1 unused).
const LAST_FIELD: usize = 18;

impl<'a> Header<'a> {
    /// Reads the header of a well-formed MSH segment (`msh` without terminator) and applies the parser's rules
    /// to MSH-9 and MSH-12. `base` is the segment's offset in the input, for error offsets.
    pub(crate) fn validate(
        msh: &'a [u8],
        d: Delimiters,
        base: usize,
    ) -> Result<(Self, usize), ParseError> {
        let (h, split) = Self::read(msh, d);
        let comps = trimmed_count(split.msh9, d.component);
        if h.message_type.is_empty() || (comps < 2 && h.message_type != b"ACK") {
            return Err(ParseError::MissingMessageType {
                offset: base + field_offset(msh, d, 9),
            });
        }
        if split.last_nonempty >= 12 && h.version.is_empty() {
            return Err(ParseError::MissingVersion {
                offset: base + field_offset(msh, d, 12),
            });
        }
        Ok((h, split.separators))
    }

    /// Reads what it can of the header of bytes that may not parse (for a NAK that still names the sender and
    /// the control id). Falls back to the default delimiters when MSH-2 is unusable.
    pub fn salvage(input: &'a [u8]) -> Self {
        let start = body_start(input);
        let b = &input[start..];
        if !b.starts_with(b"MSH") || b.len() < 4 || matches!(b[3], b'\r' | b'\n') {
            return Self::default();
        }
        let line = &b[..memchr2(b'\r', b'\n', b).unwrap_or(b.len())];
        let d = read_delimiters(input, start).unwrap_or(Delimiters {
            field: b[3],
            ..Delimiters::default()
        });
        let valid = read_delimiters(input, start).is_ok();
        let (mut h, _) = Self::read(line, d);
        if !valid {
            // Empty MSH-2 tells the ACK writer to fall back to the default delimiters.
            h.encoding_characters = b"";
        }
        h
    }

    /// Splits MSH once (a plain byte loop: MSH fields are short, a `memchr` call per field costs more).
    fn read(msh: &'a [u8], d: Delimiters) -> (Self, Split<'a>) {
        let mut f: [&'a [u8]; LAST_FIELD + 1] = [b""; LAST_FIELD + 1];
        let mut last_nonempty = 1;
        let mut n = 2;
        let mut separators = usize::from(msh.len() > 3);
        let mut start = 4.min(msh.len());
        let fs = d.field;
        for (i, &b) in msh.iter().enumerate().skip(start) {
            if b != fs {
                continue;
            }
            separators += 1;
            if i > start {
                last_nonempty = n;
            }
            if n <= LAST_FIELD {
                f[n] = &msh[start..i];
            }
            n += 1;
            start = i + 1;
        }
        if start < msh.len() {
            last_nonempty = n;
        }
        if n <= LAST_FIELD {
            f[n] = &msh[start..];
        }
        let cs = d.component;
        let (message_type, trigger_event, structure) = three(f[9], cs);
        let h = Self {
            delimiters: d,
            encoding_characters: f[2],
            sending_application: f[3],
            sending_facility: f[4],
            receiving_application: f[5],
            receiving_facility: f[6],
            timestamp: f[7],
            message_type,
            trigger_event,
            structure,
            control_id: f[10],
            processing_id: first(f[11], cs),
            processing_field: f[11],
            version: first(f[12], cs),
            version_field: f[12],
            accept_ack_type: f[15],
            application_ack_type: f[16],
            charset: first(f[18], d.repetition),
        };
        (
            h,
            Split {
                msh9: f[9],
                last_nonempty,
                separators,
            },
        )
    }

    /// True when MSH-15 or MSH-16 is valued: the sender asked for enhanced acknowledgment mode.
    pub fn is_enhanced_mode(&self) -> bool {
        !self.accept_ack_type.is_empty() || !self.application_ack_type.is_empty()
    }

    /// MSH-12's major and minor number (`2.5.1` gives `(2, 5)`), when it reads as one.
    pub fn version_number(&self) -> Option<(u8, u8)> {
        let mut parts = self.version.split(|&c| c == b'.');
        let major = parse_small(parts.next()?)?;
        let minor = parts.next().map_or(Some(0), parse_small)?;
        Some((major, minor))
    }
}

/// What the single MSH split found besides the header fields.
struct Split<'a> {
    msh9: &'a [u8],
    last_nonempty: usize,
    /// Field separators in MSH (MSH-1 counts).
    separators: usize,
}

/// The part of `v` before the first `sep`.
#[inline]
fn first(v: &[u8], sep: u8) -> &[u8] {
    match v.iter().position(|&b| b == sep) {
        Some(i) => &v[..i],
        None => v,
    }
}

/// Components 1, 2 and 3 of `v`.
#[inline]
fn three(v: &[u8], sep: u8) -> (&[u8], &[u8], &[u8]) {
    let a = first(v, sep);
    let rest = v.get(a.len() + 1..).unwrap_or_default();
    let b = first(rest, sep);
    let rest = rest.get(b.len() + 1..).unwrap_or_default();
    (a, b, first(rest, sep))
}

fn parse_small(s: &[u8]) -> Option<u8> {
    if s.is_empty() || s.len() > 2 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u8, |a, c| a * 10 + (c - b'0')))
}

/// Header field `n` of an MSH segment (n >= 2).
fn h_field(msh: &[u8], d: Delimiters, n: usize) -> &[u8] {
    msh.get(4..)
        .and_then(|b| nth(b, d.field, n - 1))
        .unwrap_or_default()
}

/// Offset of header field `n` within the segment (its end when missing).
fn field_offset(msh: &[u8], d: Delimiters, n: usize) -> usize {
    let f = h_field(msh, d, n);
    if f.is_empty() {
        // Point at the separator before the missing field, or the end of the segment.
        return memchr_iter(d.field, msh).nth(n - 2).unwrap_or(msh.len());
    }
    f.as_ptr() as usize - msh.as_ptr() as usize
}

/// Number of pieces of `v` split on `sep`, trailing empty pieces dropped.
fn trimmed_count(v: &[u8], sep: u8) -> usize {
    let mut end = v.len();
    while end > 0 && v[end - 1] == sep {
        end -= 1;
    }
    if end == 0 {
        return 0;
    }
    1 + memchr_iter(sep, &v[..end]).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    #[test]
    fn reads_the_essentials() {
        let m = Message::parse(
            b"MSH|^~\\&|APP^1.2^ISO|FAC|RAPP|RFAC|20200101||ORU^R01^ORU_R01|CTRL-9|P^T|2.5.1^HL7|||AL|NE||UNICODE UTF-8~8859/1\rPID|1",
        )
        .unwrap();
        let h = m.header();
        assert_eq!(h.sending_application, b"APP^1.2^ISO");
        assert_eq!(h.sending_facility, b"FAC");
        assert_eq!(h.receiving_application, b"RAPP");
        assert_eq!(h.receiving_facility, b"RFAC");
        assert_eq!(
            (h.message_type, h.trigger_event, h.structure),
            (&b"ORU"[..], &b"R01"[..], &b"ORU_R01"[..])
        );
        assert_eq!(h.control_id, b"CTRL-9");
        assert_eq!(h.processing_id, b"P");
        assert_eq!(h.version, b"2.5.1");
        assert_eq!(h.version_field, b"2.5.1^HL7");
        assert_eq!(h.accept_ack_type, b"AL");
        assert_eq!(h.application_ack_type, b"NE");
        assert_eq!(h.charset, b"UNICODE UTF-8");
        assert!(h.is_enhanced_mode());
        assert_eq!(h.version_number(), Some((2, 5)));
    }

    #[test]
    fn salvage_reads_broken_headers() {
        let h = Header::salvage(b"MSH|^~\\&|APP|FAC|R|RF|2020||ADT|CTL1");
        assert_eq!(h.sending_application, b"APP");
        assert_eq!(h.control_id, b"CTL1");
        let h = Header::salvage(b"MSH|^|APP|FAC");
        assert_eq!(h.sending_facility, b"FAC");
        assert_eq!(h.delimiters.component, b'^');
        assert_eq!(Header::salvage(b"garbage"), Header::default());
        assert_eq!(Header::salvage(b"MSH"), Header::default());
    }
}
