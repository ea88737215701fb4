//! The parser: a message borrowed from its bytes, indexed by segment, split into fields only on access.

use crate::escape::unescape;
use crate::header::Header;
use crate::path::Path;
use crate::scan::{body_start, nth, read_delimiters};
use crate::{Delimiters, ParseError};
use memchr::{memchr, memchr_iter, memchr2};
use std::borrow::Cow;

/// Byte range of one segment's content (without terminator) in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u32,
    pub(crate) end: u32,
}

/// A parsed HL7 v2 message. Borrows the input; `parse` allocates only the segment index.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    input: &'a [u8],
    delims: Delimiters,
    segs: Vec<Span>,
    header: Header<'a>,
}

/// Java's `Character.isWhitespace` over Latin-1: what a segment's leading whitespace is.
#[inline]
fn is_segment_ws(b: u8) -> bool {
    matches!(b, 0x09..=0x0D | 0x1C..=0x20)
}

/// Splits `input[start..end]` into segments: CR, LF or CRLF end one; leading whitespace is dropped; lines
/// shorter than 3 bytes are ignored; a segment of 4 or more bytes must have the field separator at byte 3.
pub(crate) fn index_segments(
    input: &[u8],
    start: usize,
    end: usize,
    fs: u8,
    segs: &mut Vec<Span>,
) -> Result<(), ParseError> {
    let mut pos = start;
    while pos < end {
        let line_end = memchr2(b'\r', b'\n', &input[pos..end]).map_or(end, |i| pos + i);
        let mut s = pos;
        while s < line_end && is_segment_ws(input[s]) {
            s += 1;
        }
        let len = line_end - s;
        if len >= 3 {
            if len >= 4 && input[s + 3] != fs {
                return Err(ParseError::BadSegmentName { offset: s });
            }
            segs.push(Span {
                start: s as u32,
                end: line_end as u32,
            });
        }
        pos = line_end + 1;
    }
    Ok(())
}

impl<'a> Message<'a> {
    /// Parses one message. Delimiters come from MSH-1/MSH-2; segments end with CR, LF or CRLF; a leading
    /// UTF-8 BOM and leading blank lines are tolerated.
    pub fn parse(input: &'a [u8]) -> Result<Self, ParseError> {
        if input.len() > u32::MAX as usize {
            return Err(ParseError::TooLarge { len: input.len() });
        }
        let start = body_start(input);
        if start == input.len() {
            return Err(ParseError::Empty);
        }
        if !input[start..].starts_with(b"MSH") {
            return Err(ParseError::MissingMsh { offset: start });
        }
        let delims = read_delimiters(input, start)?;
        let mut segs = Vec::with_capacity(input.len() / 48 + 4);
        index_segments(input, start, input.len(), delims.field, &mut segs)?;
        Self::from_index(input, delims, segs)
    }

    /// Validates the header of already indexed segments (the first one being MSH).
    pub(crate) fn from_index(
        input: &'a [u8],
        delims: Delimiters,
        segs: Vec<Span>,
    ) -> Result<Self, ParseError> {
        let first = segs[0];
        let msh = &input[first.start as usize..first.end as usize];
        let checked = Header::validate(msh, delims, first.start as usize);
        // At least 11 field separators in the message (MSH-12 can exist); usually all in MSH already.
        let in_msh = match &checked {
            Ok((_, n)) => *n,
            Err(_) => memchr_iter(delims.field, msh).count(),
        };
        if in_msh < 11 {
            let end_of_last = segs.last().map_or(first.end, |s| s.end) as usize;
            let rest = &input[first.end as usize..end_of_last];
            if in_msh + memchr_iter(delims.field, rest).take(11).count() < 11 {
                return Err(ParseError::TooFewFields {
                    offset: first.end as usize,
                });
            }
        }
        let (header, _) = checked?;
        Ok(Self {
            input,
            delims,
            segs,
            header,
        })
    }

    /// The bytes the message was parsed from.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.input
    }

    /// The delimiters declared in MSH-1/MSH-2.
    pub fn delimiters(&self) -> &Delimiters {
        &self.delims
    }

    /// The MSH essentials.
    pub fn header(&self) -> &Header<'a> {
        &self.header
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segs.len()
    }

    pub(crate) fn spans(&self) -> &[Span] {
        &self.segs
    }

    /// The segments in wire order.
    pub fn segments(&self) -> impl ExactSizeIterator<Item = Segment<'a>> + '_ {
        self.segs
            .iter()
            .enumerate()
            .map(move |(i, s)| self.segment_of(*s, i == 0))
    }

    /// The segment at `index` (0-based wire position).
    pub fn segment_at(&self, index: usize) -> Option<Segment<'a>> {
        self.segs
            .get(index)
            .map(|s| self.segment_of(*s, index == 0))
    }

    fn segment_of(&self, s: Span, first: bool) -> Segment<'a> {
        Segment {
            raw: &self.input[s.start as usize..s.end as usize],
            delims: self.delims,
            first,
        }
    }

    /// The `occurrence`-th (1-based) segment called `name`, counted over the whole message.
    pub fn segment(&self, name: &str, occurrence: usize) -> Option<Segment<'a>> {
        self.find_segment(name.as_bytes(), occurrence)
    }

    pub(crate) fn find_segment(&self, name: &[u8], occurrence: usize) -> Option<Segment<'a>> {
        let mut seen = 0;
        for seg in self.segments() {
            if seg.name() == name {
                seen += 1;
                if seen == occurrence {
                    return Some(seg);
                }
            }
        }
        None
    }

    /// The raw bytes at a terser path (`PID-5-1`, `OBX(3)-5`, `PID-3(2)-4-1`), or `None` when the path is
    /// invalid or the value is absent or empty.
    pub fn get(&self, path: &str) -> Option<&'a [u8]> {
        Path::parse(path).ok().and_then(|p| self.get_path(&p))
    }

    /// Like [`Message::get`] with escape sequences resolved.
    pub fn get_decoded(&self, path: &str) -> Option<Cow<'a, [u8]>> {
        Path::parse(path)
            .ok()
            .and_then(|p| self.get_path_decoded(&p))
    }

    /// The raw bytes at a pre-parsed path.
    pub fn get_path(&self, p: &Path) -> Option<&'a [u8]> {
        let v = self
            .find_segment(p.segment(), p.occurrence)?
            .field(p.field)?
            .repetition(p.repetition)?;
        let v = match p.component {
            None => v,
            Some(c) => v.component(c)?,
        };
        let v = match p.subcomponent {
            None => v,
            Some(s) => v.subcomponent(s)?,
        };
        (!v.raw.is_empty()).then_some(v.raw)
    }

    /// The decoded value at a pre-parsed path.
    pub fn get_path_decoded(&self, p: &Path) -> Option<Cow<'a, [u8]>> {
        let raw = self.get_path(p)?;
        if is_header_name(p.segment()) && p.field <= 2 {
            Some(Cow::Borrowed(raw))
        } else {
            Some(unescape(raw, &self.delims))
        }
    }
}

/// MSH, FHS and BHS number their fields from the field separator (field 1) and encoding characters (field 2).
pub(crate) fn is_header_name(name: &[u8]) -> bool {
    matches!(name, b"MSH" | b"FHS" | b"BHS")
}

/// One segment: its name and fields, split on access.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    raw: &'a [u8],
    delims: Delimiters,
    first: bool,
}

impl<'a> Segment<'a> {
    pub(crate) fn new(raw: &'a [u8], delims: Delimiters, first: bool) -> Self {
        Self { raw, delims, first }
    }

    /// The segment's bytes, without terminator.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// The name: the first three bytes of the first segment, else everything before the first field separator.
    pub fn name(&self) -> &'a [u8] {
        if self.first || (self.raw.len() > 3 && self.raw[3] == self.delims.field) {
            &self.raw[..3.min(self.raw.len())]
        } else {
            let end = memchr(self.delims.field, self.raw).unwrap_or(self.raw.len());
            &self.raw[..end]
        }
    }

    /// True for MSH, FHS and BHS, whose field 1 is the field separator.
    pub fn is_header(&self) -> bool {
        is_header_name(self.name())
    }

    /// The bytes after the name and its field separator (fields 1.., or 2.. for header segments).
    fn body(&self) -> Option<&'a [u8]> {
        let n = self.name().len();
        (self.raw.len() > n).then(|| &self.raw[n + 1..])
    }

    /// Field `n` (HL7 numbering, 1-based). For MSH/FHS/BHS, field 1 is the separator and field 2 the encoding
    /// characters, neither of them split further.
    pub fn field(&self, n: usize) -> Option<Value<'a>> {
        if n == 0 {
            return None;
        }
        let header = self.is_header();
        let body = self.body()?;
        let (idx, atomic) = if header {
            if n == 1 {
                let at = self.name().len();
                return self
                    .raw
                    .get(at..at + 1)
                    .map(|sep| Value::atomic(sep, self.delims));
            }
            (n - 1, n == 2)
        } else {
            (n, false)
        };
        let raw = nth(body, self.delims.field, idx)?;
        Some(Value {
            raw,
            delims: self.delims,
            atomic,
        })
    }

    /// The fields with their HL7 numbers, in order (empty ones included).
    pub fn fields(&self) -> impl Iterator<Item = (usize, Value<'a>)> + '_ {
        let header = self.is_header();
        let d = self.delims;
        // A header segment written without any separator (`MSH` alone on a later line) has no fields.
        let sep = if header {
            let at = self.name().len();
            self.raw
                .get(at..at + 1)
                .map(|sep| (1, Value::atomic(sep, d)))
        } else {
            None
        };
        let offset = if header { 2 } else { 1 };
        let body = self.body();
        sep.into_iter().chain(body.into_iter().flat_map(move |b| {
            b.split(move |&c| c == d.field)
                .enumerate()
                .map(move |(i, raw)| {
                    let n = i + offset;
                    (
                        n,
                        Value {
                            raw,
                            delims: d,
                            atomic: header && n == 2,
                        },
                    )
                })
        }))
    }

    /// The delimiters this segment is split with.
    pub fn delimiters(&self) -> &Delimiters {
        &self.delims
    }
}

/// A field, repetition, component or subcomponent: raw bytes that split further on access.
#[derive(Debug, Clone, Copy)]
pub struct Value<'a> {
    raw: &'a [u8],
    delims: Delimiters,
    /// MSH-1 and MSH-2 are never split.
    atomic: bool,
}

impl<'a> Value<'a> {
    fn atomic(raw: &'a [u8], delims: Delimiters) -> Self {
        Self {
            raw,
            delims,
            atomic: true,
        }
    }

    /// The raw bytes (escape sequences not resolved).
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The value with escape sequences resolved (borrowed when there are none).
    pub fn decoded(&self) -> Cow<'a, [u8]> {
        if self.atomic {
            Cow::Borrowed(self.raw)
        } else {
            unescape(self.raw, &self.delims)
        }
    }

    fn split_level(&self, sep: u8, n: usize) -> Option<Value<'a>> {
        if self.atomic {
            return (n == 1).then_some(*self);
        }
        nth(self.raw, sep, n).map(|raw| Value { raw, ..*self })
    }

    fn iter_level(&self, sep: u8) -> impl Iterator<Item = Value<'a>> + use<'a> {
        let this = *self;
        let sep = if this.atomic { None } else { Some(sep) };
        let mut rest = Some(this.raw);
        std::iter::from_fn(move || {
            let r = rest?;
            match sep.and_then(|s| memchr(s, r)) {
                Some(i) => {
                    rest = Some(&r[i + 1..]);
                    Some(Value {
                        raw: &r[..i],
                        ..this
                    })
                }
                None => {
                    rest = None;
                    Some(Value { raw: r, ..this })
                }
            }
        })
    }

    /// Repetition `n` (1-based) of a field.
    pub fn repetition(&self, n: usize) -> Option<Value<'a>> {
        self.split_level(self.delims.repetition, n)
    }

    /// The repetitions of a field.
    pub fn repetitions(&self) -> impl Iterator<Item = Value<'a>> + use<'a> {
        self.iter_level(self.delims.repetition)
    }

    /// Component `n` (1-based).
    pub fn component(&self, n: usize) -> Option<Value<'a>> {
        self.split_level(self.delims.component, n)
    }

    /// The components.
    pub fn components(&self) -> impl Iterator<Item = Value<'a>> + use<'a> {
        self.iter_level(self.delims.component)
    }

    /// Subcomponent `n` (1-based).
    pub fn subcomponent(&self, n: usize) -> Option<Value<'a>> {
        self.split_level(self.delims.subcomponent, n)
    }

    /// The subcomponents.
    pub fn subcomponents(&self) -> impl Iterator<Item = Value<'a>> + use<'a> {
        self.iter_level(self.delims.subcomponent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADT: &[u8] =
        b"MSH|^~\\&|SEND|FAC|RECV|RFAC|20200101120000||ADT^A01^ADT_A01|MSG1|P|2.5.1\r\
EVN|A01|20200101\r\
PID|1||123^^^HOSP^MR~456^^^OTHER^PI^X&Y||DOE^JOHN^Q||19700101|M|||1 Main St^^Town\\F\\City\r\
OBX|1|TX|A\r\
OBX|2|TX|B\r\
OBX|3|TX|C^D\r";

    #[test]
    fn navigation_by_path() {
        let m = Message::parse(ADT).unwrap();
        assert_eq!(m.segment_count(), 6);
        assert_eq!(m.get("PID-5-1"), Some(&b"DOE"[..]));
        assert_eq!(m.get("PID-5"), Some(&b"DOE^JOHN^Q"[..]));
        assert_eq!(m.get("OBX(3)-3"), Some(&b"C^D"[..]));
        assert_eq!(m.get("OBX(3)-3-2"), Some(&b"D"[..]));
        assert_eq!(m.get("PID-3(2)-4-1"), Some(&b"OTHER"[..]));
        assert_eq!(m.get("PID-3(2)-6-2"), Some(&b"Y"[..]));
        assert_eq!(m.get("PID-3(3)"), None);
        assert_eq!(m.get("PID-2"), None);
        assert_eq!(m.get("OBX(4)-1"), None);
        assert_eq!(m.get("MSH-1"), Some(&b"|"[..]));
        assert_eq!(m.get("MSH-2"), Some(&b"^~\\&"[..]));
        assert_eq!(m.get("MSH-2-2"), None);
        assert_eq!(m.get("MSH-9-2"), Some(&b"A01"[..]));
        assert_eq!(m.get("MSH-10"), Some(&b"MSG1"[..]));
        assert_eq!(m.get("not a path"), None);
        assert_eq!(m.get("PID-11-3"), Some(&b"Town\\F\\City"[..]));
        assert_eq!(&*m.get_decoded("PID-11-3").unwrap(), b"Town|City");
        assert_eq!(&*m.get_decoded("MSH-2").unwrap(), b"^~\\&");
    }

    #[test]
    fn segments_fields_and_iterators() {
        let m = Message::parse(ADT).unwrap();
        let names: Vec<_> = m.segments().map(|s| s.name()).collect();
        assert_eq!(names, [&b"MSH"[..], b"EVN", b"PID", b"OBX", b"OBX", b"OBX"]);
        let pid = m.segment("PID", 1).unwrap();
        let reps: Vec<_> = pid
            .field(3)
            .unwrap()
            .repetitions()
            .map(|r| r.raw())
            .collect();
        assert_eq!(reps, [&b"123^^^HOSP^MR"[..], b"456^^^OTHER^PI^X&Y"]);
        let msh = m.segment("MSH", 1).unwrap();
        let f: Vec<_> = msh.fields().take(4).map(|(n, v)| (n, v.raw())).collect();
        assert_eq!(
            f,
            [(1, &b"|"[..]), (2, b"^~\\&"), (3, b"SEND"), (4, b"FAC")]
        );
        assert_eq!(m.segment("OBX", 2).unwrap().field(3).unwrap().raw(), b"B");
    }

    #[test]
    fn terminators_bom_and_blank_lines() {
        let crlf =
            b"\xEF\xBB\xBF\r\n  \nMSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\r\nPID|1\n\n \tPV1|1\r";
        let m = Message::parse(crlf).unwrap();
        let names: Vec<_> = m.segments().map(|s| s.name()).collect();
        assert_eq!(names, [&b"MSH"[..], b"PID", b"PV1"]);
    }

    #[test]
    fn odd_delimiters() {
        let m = Message::parse(b"MSH#@!$%#A#B#C#D#2020##ADT@A01#1#P#2.5\rPID#1##X@Y!Z%W").unwrap();
        assert_eq!(m.get("PID-3-2"), Some(&b"Y"[..]));
        assert_eq!(m.get("PID-3(2)-1-2"), Some(&b"W"[..]));
        assert_eq!(m.header().trigger_event, b"A01");
    }

    /// Issue 10: real senders repeat encoding characters (`^~\\&` from an exported sample, `^^^^`); the
    /// reference parser accepts them and splits field, repetition, component, subcomponent in that order.
    #[test]
    fn repeated_encoding_characters_are_read_as_the_reference_reads_them() {
        let m = Message::parse(
            b"MSH|^~\\\\&|APP|FAC|||20260101||ADT^A01|C1|P|2.5\rPID|1||123^^^H~456|A&B|\\T\\",
        )
        .unwrap();
        assert_eq!(m.get("MSH-3"), Some(&b"APP"[..]));
        assert_eq!(m.get("MSH-9-2"), Some(&b"A01"[..]));
        assert_eq!(m.get("PID-3-1"), Some(&b"123"[..]));
        assert_eq!(m.get("PID-3(2)"), Some(&b"456"[..]));
        // The 5th character (&) is the truncation character, not a separator.
        assert_eq!(m.get("PID-4"), Some(&b"A&B"[..]));
        let m = Message::parse(b"MSH|^^^^|APP|FAC^X|||20260101||ADT^A01|C1|P|2.5\r").unwrap();
        assert_eq!(m.get("MSH-4(2)"), Some(&b"X"[..]));
    }

    #[test]
    fn header_errors() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b" \r\n", "empty"),
            (b"PID|1", "missing_msh"),
            (b"MSH", "missing_field_separator"),
            (b"MSH\r", "missing_field_separator"),
            (b"MSH|^~", "bad_encoding_characters"),
            (b"MSH|^~\\&^~|A", "bad_encoding_characters"),
            (b"MSH|^~\r\\&|A", "bad_encoding_characters"),
            (b"MSH|^~\\&|A|B", "too_few_fields"),
            (
                b"MSH|^~\\&|A|B|C|D|E|F|ADT^A01|1|P|2.5\rPIDX|1",
                "bad_segment_name",
            ),
            (b"MSH|^~\\&|A|B|C|D|E|F|ADT|1|P|2.5", "missing_message_type"),
            (
                b"MSH|^~\\&|A|B|C|D|E|F|^A01|1|P|2.5",
                "missing_message_type",
            ),
            (b"MSH|^~\\&|A|B|C|D|E|F||1|P|2.5", "missing_message_type"),
            (b"MSH|^~\\&|A|B|C|D|E|F|ADT^A01|1|P||x", "missing_version"),
        ];
        for (input, kind) in cases {
            let e = Message::parse(input).unwrap_err();
            assert_eq!(e.kind(), *kind, "{:?}", String::from_utf8_lossy(input));
        }
        assert!(Message::parse(b"MSH|^~\\&|A|B|C|D|E|F|ACK|1|P|2.5").is_ok());
        assert!(Message::parse(b"MSH|^~\\&|A|B|C|D|E|F|ADT^A01|1|P").is_err());
        assert!(Message::parse(b"MSH|^~\\&|A|B|C|D|E|F|ADT^A01|1|P\rPID|1|2").is_ok());
    }

    #[test]
    fn a_bare_header_name_later_in_a_message_has_no_fields() {
        // Found by `cargo fuzz` (target parse): `MSH` alone on a later line used to slice past its end.
        let input = b"MSH|^~\\&|A|B|C|D|E|F|ADT^A01|1|P|2.5\nMSH\nBHS\n";
        let m = Message::parse(input).unwrap();
        let later = m.segment_at(1).unwrap();
        assert!(later.is_header());
        assert_eq!(later.fields().count(), 0);
        assert!(later.field(1).is_none() && later.field(2).is_none());
        assert_eq!(m.get("MSH(2)-1"), None);
        let _ = m.flat();
    }

    #[test]
    fn error_offsets_point_at_the_problem() {
        let input = b"MSH|^~\\&|A|B|C|D|E|F|ADT^A01|1|P|2.5\rPID|1\rXXXXX";
        let e = Message::parse(input).unwrap_err();
        assert_eq!(e.offset(), 43);
        assert_eq!(e.code().code(), 100);
    }
}
