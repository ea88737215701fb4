//! ACK building: original (AA/AE/AR) and enhanced (CA/CE/CR) mode, written into a caller's reused buffer.

use crate::escape::escape_into;
use crate::{Delimiters, ErrorCode, Header};
use std::time::{SystemTime, UNIX_EPOCH};

/// The acknowledgment code in MSA-1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckCode {
    /// Application accept (original mode).
    AA,
    /// Application error.
    AE,
    /// Application reject.
    AR,
    /// Commit accept (enhanced mode).
    CA,
    /// Commit error.
    CE,
    /// Commit reject.
    CR,
}

impl AckCode {
    /// The six codes, in the order of [`AckCode::index`].
    pub const ALL: [AckCode; 6] = [Self::AA, Self::AE, Self::AR, Self::CA, Self::CE, Self::CR];

    /// A dense index (0..6), for counters kept per code.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The two letters.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AA => "AA",
            Self::AE => "AE",
            Self::AR => "AR",
            Self::CA => "CA",
            Self::CE => "CE",
            Self::CR => "CR",
        }
    }

    /// Reads MSA-1.
    pub fn parse(b: &[u8]) -> Option<Self> {
        Some(match b {
            b"AA" => Self::AA,
            b"AE" => Self::AE,
            b"AR" => Self::AR,
            b"CA" => Self::CA,
            b"CE" => Self::CE,
            b"CR" => Self::CR,
            _ => return None,
        })
    }

    /// What the code says happened.
    pub fn outcome(self) -> Outcome {
        match self {
            Self::AA | Self::CA => Outcome::Accept,
            Self::AE | Self::CE => Outcome::Error,
            Self::AR | Self::CR => Outcome::Reject,
        }
    }
}

/// What happened to a message, independent of the acknowledgment mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Stored (or processed).
    Accept,
    /// Failed for a reason in the message; resending it unchanged fails again.
    Error,
    /// Refused (unsupported type, version, processing id, or the system is unavailable).
    Reject,
}

/// MSH-15/MSH-16 conditions (HL7 table 0155).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckCondition {
    /// AL: always.
    Always,
    /// NE: never.
    Never,
    /// ER: only on error or reject.
    ErrorOnly,
    /// SU: only on success.
    SuccessOnly,
}

impl AckCondition {
    /// Reads a table 0155 value; empty or unknown gives `None`.
    pub fn parse(b: &[u8]) -> Option<Self> {
        Some(match b {
            b"AL" => Self::Always,
            b"NE" => Self::Never,
            b"ER" => Self::ErrorOnly,
            b"SU" => Self::SuccessOnly,
            _ => return None,
        })
    }

    /// Whether an acknowledgment with this outcome is sent under the condition.
    pub fn wants(self, outcome: Outcome) -> bool {
        match self {
            Self::Always => true,
            Self::Never => false,
            Self::ErrorOnly => outcome != Outcome::Accept,
            Self::SuccessOnly => outcome == Outcome::Accept,
        }
    }
}

/// The code for `outcome` in the mode the message asked for: enhanced (CA/CE/CR) when MSH-15 or MSH-16 is
/// valued, original (AA/AE/AR) otherwise.
pub fn ack_code(h: &Header<'_>, outcome: Outcome) -> AckCode {
    match (h.is_enhanced_mode(), outcome) {
        (false, Outcome::Accept) => AckCode::AA,
        (false, Outcome::Error) => AckCode::AE,
        (false, Outcome::Reject) => AckCode::AR,
        (true, Outcome::Accept) => AckCode::CA,
        (true, Outcome::Error) => AckCode::CE,
        (true, Outcome::Reject) => AckCode::CR,
    }
}

/// Whether the sender wants an accept acknowledgment for `outcome`: always in original mode; per MSH-15 in
/// enhanced mode (an empty or unknown MSH-15 counts as AL).
pub fn accept_ack_wanted(h: &Header<'_>, outcome: Outcome) -> bool {
    if !h.is_enhanced_mode() {
        return true;
    }
    AckCondition::parse(h.accept_ack_type)
        .unwrap_or(AckCondition::Always)
        .wants(outcome)
}

/// Whether the sender asks for an application acknowledgment for `outcome`: only in enhanced mode, and only
/// when MSH-16 is one of AL, ER, SU that wants this outcome (empty, unknown or NE: none). Original mode has no
/// separate application ACK (its AA/AE/AR is the one answer).
pub fn application_ack_wanted(h: &Header<'_>, outcome: Outcome) -> bool {
    h.is_enhanced_mode()
        && AckCondition::parse(h.application_ack_type).is_some_and(|c| c.wants(outcome))
}

/// The original-mode code (AA/AE/AR) an application acknowledgment carries for `outcome`.
pub fn application_ack_code(outcome: Outcome) -> AckCode {
    match outcome {
        Outcome::Accept => AckCode::AA,
        Outcome::Error => AckCode::AE,
        Outcome::Reject => AckCode::AR,
    }
}

/// ERR-4 severity (HL7 table 0516).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    Error,
    Warning,
    Information,
    Fatal,
}

impl Severity {
    fn letter(self) -> &'static [u8] {
        match self {
            Self::Error => b"E",
            Self::Warning => b"W",
            Self::Information => b"I",
            Self::Fatal => b"F",
        }
    }
}

/// Where an error is: segment, its occurrence, and optionally a field (0 for none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorLocation<'e> {
    pub segment: &'e [u8],
    pub sequence: usize,
    pub field: usize,
}

/// What goes into the ERR segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckError<'e> {
    pub code: ErrorCode,
    pub severity: Severity,
    /// A short diagnostic for the sender (escaped on write; must not carry PHI).
    pub text: &'e str,
    pub location: Option<ErrorLocation<'e>>,
}

impl<'e> AckError<'e> {
    /// An error-severity ERR with no location: what most refusals carry.
    pub fn error(code: ErrorCode, text: &'e str) -> Self {
        Self {
            code,
            severity: Severity::Error,
            text,
            location: None,
        }
    }
}

/// The new message's own control id (MSH-10) and time (MSH-7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckIds<'p> {
    pub control_id: &'p [u8],
    pub timestamp: &'p [u8],
}

/// Writes the ACK for the message `h` describes into `out` (cleared first): sender and receiver swapped, MSH-9
/// `ACK^<trigger>^ACK`, MSH-11/12 copied, MSA-2 the incoming MSH-10, and an ERR segment when `err` is given
/// (ERR-2/3/4 from v2.5 on, the ERR-1 layout and MSA-3 before). Segments end with CR.
pub fn write_ack(
    out: &mut Vec<u8>,
    h: &Header<'_>,
    code: AckCode,
    err: Option<&AckError<'_>>,
    ids: &AckIds<'_>,
) {
    out.clear();
    // A header from the parser or `Header::salvage` has MSH-2 only when its delimiters are valid.
    let valid = !h.encoding_characters.is_empty();
    let d = if valid {
        h.delimiters
    } else {
        Delimiters {
            field: b'|',
            ..Delimiters::default()
        }
    };
    let f = d.field;
    out.extend_from_slice(b"MSH");
    d.write_msh12(out);
    for v in [
        h.receiving_application,
        h.receiving_facility,
        h.sending_application,
        h.sending_facility,
    ] {
        out.push(f);
        out.extend_from_slice(if valid { at_most(v, MAX_HD) } else { b"" });
    }
    out.push(f);
    out.extend_from_slice(ids.timestamp);
    out.push(f);
    out.push(f);
    out.extend_from_slice(b"ACK");
    if !h.trigger_event.is_empty() && valid {
        out.push(d.component);
        out.extend_from_slice(at_most(h.trigger_event, MAX_CODE));
        out.push(d.component);
        out.extend_from_slice(b"ACK");
    }
    out.push(f);
    escape_into(ids.control_id, &d, out);
    out.push(f);
    if valid && !h.processing_field.is_empty() {
        out.extend_from_slice(at_most(h.processing_field, MAX_PROCESSING_FIELD));
    } else {
        out.push(b'P');
    }
    out.push(f);
    if valid && !h.version_field.is_empty() {
        out.extend_from_slice(at_most(h.version_field, MAX_VERSION_FIELD));
    } else {
        out.extend_from_slice(b"2.5");
    }
    out.extend_from_slice(b"\rMSA");
    out.push(f);
    out.extend_from_slice(code.as_str().as_bytes());
    out.push(f);
    let control_id = at_most(h.control_id, MAX_CONTROL_ID);
    if valid {
        out.extend_from_slice(control_id);
    } else {
        escape_into(control_id, &d, out);
    }
    let old_layout = h.version_number().is_some_and(|v| v < (2, 5));
    if let Some(e) = err {
        if old_layout {
            out.push(f);
            escape_into(e.text.as_bytes(), &d, out);
        }
        out.extend_from_slice(b"\rERR");
        out.push(f);
        if old_layout {
            write_location(out, &d, e.location.as_ref());
            out.push(d.component);
            write_code(out, &d, e.code, d.subcomponent);
        } else {
            out.push(f);
            write_location(out, &d, e.location.as_ref());
            out.push(f);
            write_code(out, &d, e.code, d.component);
            out.push(f);
            out.extend_from_slice(e.severity.letter());
            out.extend_from_slice(&[f, f, f, f]);
            escape_into(e.text.as_bytes(), &d, out);
        }
    }
    out.push(b'\r');
}

/// Longest value of an HD field (MSH-3 to MSH-6) the ACK echoes (HL7 2.7: 227).
pub const MAX_HD: usize = 227;
/// Longest MSH-10 the ACK echoes in MSA-2 (HL7 2.7, ST: 199).
pub const MAX_CONTROL_ID: usize = 199;
/// Longest component of MSH-9 (message code, trigger event, structure) the ACK echoes; HL7 says 3, 3 and 7,
/// and site-defined codes run a little longer.
pub const MAX_CODE: usize = 16;
/// Longest MSH-11 (PT: processing id and mode) the ACK echoes.
pub const MAX_PROCESSING_FIELD: usize = 16;
/// Longest MSH-12 (VID: version id, and optionally internationalization code and version) the ACK echoes.
pub const MAX_VERSION_FIELD: usize = 64;

/// `v` cut to `max` bytes: an echoed field is never longer than HL7 allows, whatever the sender wrote (a message
/// with a longer one is refused, and its NAK stays small).
fn at_most(v: &[u8], max: usize) -> &[u8] {
    &v[..v.len().min(max)]
}

fn write_location(out: &mut Vec<u8>, d: &Delimiters, loc: Option<&ErrorLocation<'_>>) {
    let Some(l) = loc else {
        return;
    };
    escape_into(l.segment, d, out);
    out.push(d.component);
    push_num(out, l.sequence);
    if l.field > 0 {
        out.push(d.component);
        push_num(out, l.field);
    }
}

fn write_code(out: &mut Vec<u8>, d: &Delimiters, code: ErrorCode, sep: u8) {
    push_num(out, usize::from(code.code()));
    out.push(sep);
    escape_into(code.text().as_bytes(), d, out);
    out.push(sep);
    out.extend_from_slice(b"HL70357");
}

fn push_num(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// MSA-1 and MSA-2 of an acknowledgment, read leniently: a receiver's ACK need not be a message that
/// [`Message::parse`](crate::Message::parse) accepts (many omit MSH-12). `None` when there is no MSA with a
/// known code.
pub fn read_ack(bytes: &[u8]) -> Option<(AckCode, &[u8])> {
    let start = crate::scan::body_start(bytes);
    let b = &bytes[start..];
    if !b.starts_with(b"MSH") || b.len() < 4 {
        return None;
    }
    let fs = b[3];
    b.split(|&c| c == b'\r' || c == b'\n')
        .map(|l| {
            let n = l.iter().take_while(|c| c.is_ascii_whitespace()).count();
            &l[n..]
        })
        .find(|l| l.starts_with(b"MSA") && l.get(3) == Some(&fs))
        .and_then(|msa| {
            let mut f = msa[4..].split(|&c| c == fs);
            let code = AckCode::parse(f.next()?.trim_ascii())?;
            Some((code, f.next().unwrap_or_default()))
        })
}

/// `YYYYMMDDHHMMSS+0000` (UTC) for MSH-7.
pub fn hl7_timestamp(t: SystemTime) -> [u8; 19] {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let mut out = *b"00000000000000+0000";
    let mut put = |at: usize, v: u64, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            out[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y as u64, 4);
    put(4, m, 2);
    put(6, d, 2);
    put(8, rem / 3600, 2);
    put(10, rem % 3600 / 60, 2);
    put(12, rem % 60, 2);
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use std::time::Duration;

    const IDS: AckIds<'static> = AckIds {
        control_id: b"ACK1",
        timestamp: b"20260101000000+0000",
    };

    fn ack(input: &[u8], outcome: Outcome, err: Option<&AckError<'_>>) -> String {
        let m = Message::parse(input).unwrap();
        let mut out = Vec::new();
        write_ack(
            &mut out,
            m.header(),
            ack_code(m.header(), outcome),
            err,
            &IDS,
        );
        String::from_utf8(out).unwrap()
    }

    /// Issue 24, item 9: every field the ACK echoes is bounded by its HL7 length, so a crafted header cannot
    /// make an ACK (and the duplicate window that keeps it) a megabyte long.
    #[test]
    fn echoed_fields_are_bounded() {
        let long = "9".repeat(1 << 20);
        let input = format!(
            "MSH|^~\\&|{long}|{long}|{long}|{long}|2020||ADT^{long}^ADT_A01|{long}|P{long}|2.5{long}\rPID|1"
        );
        let a = ack(input.as_bytes(), Outcome::Reject, None);
        assert!(a.len() < 2048, "an ACK of {} bytes", a.len());
        let trigger = format!("|ACK^{}^ACK|", "9".repeat(MAX_CODE));
        assert!(a.contains(&trigger), "{}", &a[..a.len().min(600)]);
    }

    #[test]
    fn original_mode_accept() {
        let a = ack(
            b"MSH|^~\\&|SAPP|SFAC|RAPP|RFAC|2020||ADT^A01^ADT_A01|MSG1|P|2.5.1\rPID|1",
            Outcome::Accept,
            None,
        );
        assert_eq!(
            a,
            "MSH|^~\\&|RAPP|RFAC|SAPP|SFAC|20260101000000+0000||ACK^A01^ACK|ACK1|P|2.5.1\rMSA|AA|MSG1\r"
        );
        let m = Message::parse(a.as_bytes()).unwrap();
        assert_eq!(m.header().message_type, b"ACK");
    }

    #[test]
    fn enhanced_mode_reject_with_err_v25() {
        let input = b"MSH|^~\\&|SAPP|SFAC|RAPP|RFAC|2020||ORU^R01|M2|T|2.6|||ER|NE\rPID|1";
        let e = AckError::error(
            ErrorCode::ApplicationInternalError,
            "system unavailable|retry",
        );
        let a = ack(input, Outcome::Reject, Some(&e));
        assert_eq!(
            a,
            "MSH|^~\\&|RAPP|RFAC|SAPP|SFAC|20260101000000+0000||ACK^R01^ACK|ACK1|T|2.6\rMSA|CR|M2\r\
             ERR|||207^Application internal error^HL70357|E||||system unavailable\\F\\retry\r"
        );
        let h = *Message::parse(input).unwrap().header();
        assert!(accept_ack_wanted(&h, Outcome::Reject));
        assert!(!accept_ack_wanted(&h, Outcome::Accept));
    }

    #[test]
    fn old_versions_get_err1_and_msa3() {
        let e = AckError {
            code: ErrorCode::RequiredFieldMissing,
            severity: Severity::Error,
            text: "MSH-10 missing",
            location: Some(ErrorLocation {
                segment: b"MSH",
                sequence: 1,
                field: 10,
            }),
        };
        let a = ack(
            b"MSH|^~\\&|S|F|R|RF|2020||ADT^A04|X9|P|2.3\rPID|1",
            Outcome::Error,
            Some(&e),
        );
        assert!(
            a.ends_with(
                "MSA|AE|X9|MSH-10 missing\rERR|MSH^1^10^101&Required field missing&HL70357\r"
            ),
            "{a}"
        );
    }

    #[test]
    fn nak_for_unparseable_input_carries_what_could_be_read() {
        let h = Header::salvage(b"MSH|^~\\&|SAPP|SFAC|R|RF|2020||ADT|C77|P|");
        let mut out = Vec::with_capacity(256);
        let e = AckError::error(ErrorCode::UnsupportedMessageType, "MSH-9 incomplete");
        write_ack(&mut out, &h, AckCode::AR, Some(&e), &IDS);
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("MSH|^~\\&|R|RF|SAPP|SFAC|"), "{s}");
        assert!(s.contains("\rMSA|AR|C77\r"), "{s}");
        // Garbage in: still a well-formed NAK with defaults.
        let mut out = Vec::new();
        write_ack(
            &mut out,
            &Header::salvage(b"\x00\xff junk"),
            AckCode::AR,
            Some(&e),
            &IDS,
        );
        assert!(Message::parse(&out).is_ok());
    }

    #[test]
    fn reuses_the_buffer() {
        let m = Message::parse(b"MSH|^~\\&|S|F|R|RF|2020||ADT^A01|1|P|2.5").unwrap();
        let mut out = Vec::with_capacity(512);
        let cap = out.capacity();
        for _ in 0..3 {
            write_ack(&mut out, m.header(), AckCode::AA, None, &IDS);
        }
        assert_eq!(out.capacity(), cap);
    }

    #[test]
    fn read_ack_is_lenient() {
        assert_eq!(
            read_ack(b"MSH|^~\\&|R|F|S|SF|2020||ACK|9\rMSA|AE|MSG7|oops\r"),
            Some((AckCode::AE, &b"MSG7"[..]))
        );
        assert_eq!(
            read_ack(b"MSH|^~\\&\nMSA|CA\n"),
            Some((AckCode::CA, &b""[..]))
        );
        assert_eq!(read_ack(b"MSH|^~\\&\rMSA|XX|1"), None);
        assert_eq!(read_ack(b"garbage"), None);
        // Other field separator, LF endings, a padded code (lax receivers).
        assert_eq!(
            read_ack(b"MSH#^~\\&#R\nMSA# CE #1\n"),
            Some((AckCode::CE, &b"1"[..]))
        );
        assert_eq!(read_ack(b"MSH|^~\\&\rPID|1\r"), None);
        assert_eq!(read_ack(b""), None);
        for code in AckCode::ALL {
            let a = format!(
                "MSH|^~\\&|R|RF|S|SF|2026||ACK|X|P|2.5\rMSA|{}|M\rERR|||207\r",
                code.as_str()
            );
            assert_eq!(read_ack(a.as_bytes()), Some((code, &b"M"[..])));
            assert_eq!(AckCode::ALL[code.index()], code);
        }
    }

    #[test]
    fn application_ack_follows_msh16_in_enhanced_mode_only() {
        let want = |msh: &[u8], o| {
            let h = Header::salvage(msh);
            application_ack_wanted(&h, o)
        };
        let base = b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|M1|P|2.5.1|||";
        let with = |f15: &str, f16: &str| {
            let mut v = base.to_vec();
            v.extend_from_slice(format!("{f15}|{f16}\r").as_bytes());
            v
        };
        assert!(!want(&with("", ""), Outcome::Accept), "original mode");
        assert!(want(&with("AL", "AL"), Outcome::Accept));
        assert!(want(&with("NE", "AL"), Outcome::Reject));
        assert!(!want(&with("AL", "NE"), Outcome::Accept));
        assert!(
            !want(&with("AL", ""), Outcome::Accept),
            "MSH-16 empty: none"
        );
        assert!(!want(&with("AL", "XX"), Outcome::Accept), "unknown: none");
        assert!(want(&with("AL", "ER"), Outcome::Error));
        assert!(!want(&with("AL", "ER"), Outcome::Accept));
        assert!(want(&with("AL", "SU"), Outcome::Accept));
        assert!(!want(&with("AL", "SU"), Outcome::Reject));
        assert_eq!(application_ack_code(Outcome::Accept), AckCode::AA);
        assert_eq!(application_ack_code(Outcome::Error), AckCode::AE);
        assert_eq!(application_ack_code(Outcome::Reject), AckCode::AR);
    }

    #[test]
    fn conditions() {
        assert!(AckCondition::parse(b"SU").unwrap().wants(Outcome::Accept));
        assert!(!AckCondition::parse(b"SU").unwrap().wants(Outcome::Error));
        assert!(!AckCondition::parse(b"NE").unwrap().wants(Outcome::Reject));
        assert_eq!(AckCode::parse(b"CE").unwrap().outcome(), Outcome::Error);
    }

    #[test]
    fn timestamps() {
        assert_eq!(&hl7_timestamp(UNIX_EPOCH), b"19700101000000+0000");
        // 2026-11-22 17:46:40 UTC
        assert_eq!(
            &hl7_timestamp(
                UNIX_EPOCH + Duration::from_secs(1_795_305_600 + 17 * 3600 + 46 * 60 + 40)
            ),
            b"20261122174640+0000"
        );
        assert_eq!(
            &hl7_timestamp(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            b"20000229000000+0000"
        );
    }
}
