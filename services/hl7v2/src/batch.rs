//! Batches: FHS/BHS ... BTS/FTS files split into their messages, with the trailer counts checked.

use crate::flat::{FlatEntry, flatten};
use crate::message::{Segment, Span, index_segments};
use crate::scan::{body_start, read_delimiters};
use crate::{Delimiters, Message, ParseError};

/// Why a batch file could not be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The file does not start with FHS, BHS or MSH.
    #[error("batch does not start with FHS, BHS or MSH at byte {offset}")]
    NotABatch { offset: usize },
    /// The batch header itself is unusable.
    #[error("batch header: {0}")]
    Header(ParseError),
    /// A segment stands outside any message where only FHS/BHS/BTS/FTS may.
    #[error("segment outside a message at byte {offset}")]
    StraySegment { offset: usize },
    /// An embedded message failed to parse.
    #[error("message {index} of the batch: {source}")]
    Message {
        index: usize,
        #[source]
        source: ParseError,
    },
}

/// A count in a trailer that disagrees with what the file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountMismatch {
    /// `BTS` (messages in a batch) or `FTS` (batches in the file).
    pub trailer: &'static str,
    /// Which batch (0-based) for BTS; 0 for FTS.
    pub batch: usize,
    /// What the trailer says.
    pub declared: u64,
    /// What was counted.
    pub actual: u64,
}

/// One BHS ... BTS group (or the implicit group of a file without BHS).
#[derive(Debug, Clone)]
pub struct SubBatch<'a> {
    pub header: Option<Segment<'a>>,
    pub trailer: Option<Segment<'a>>,
    pub messages: Vec<Message<'a>>,
}

/// A parsed batch file.
#[derive(Debug, Clone)]
pub struct Batch<'a> {
    delims: Delimiters,
    segments: Vec<Span>,
    input: &'a [u8],
    pub file_header: Option<Segment<'a>>,
    pub file_trailer: Option<Segment<'a>>,
    pub batches: Vec<SubBatch<'a>>,
}

/// True when the input (after BOM and leading blank lines) starts with FHS or BHS.
pub fn is_batch(input: &[u8]) -> bool {
    let b = &input[body_start(input)..];
    b.starts_with(b"FHS") || b.starts_with(b"BHS")
}

/// One piece of a batch: a batch segment (FHS, BHS, BTS, FTS) or a message's bytes, with its offset.
#[derive(Debug, Clone)]
enum Part<'a> {
    Segment(Segment<'a>),
    Message(&'a [u8], usize),
}

/// Cuts `input` into batch segments and messages (MSH up to the next MSH or batch segment) without parsing
/// the messages.
fn parts(input: &[u8]) -> Result<(Delimiters, Vec<Span>, Vec<Part<'_>>), BatchError> {
    let start = body_start(input);
    let b = &input[start..];
    if !(b.starts_with(b"FHS") || b.starts_with(b"BHS") || b.starts_with(b"MSH")) {
        return Err(BatchError::NotABatch { offset: start });
    }
    let delims = read_delimiters(input, start).map_err(BatchError::Header)?;
    let mut segments = Vec::with_capacity(input.len() / 48 + 4);
    index_segments(input, start, input.len(), delims.field, &mut segments)
        .map_err(BatchError::Header)?;
    let name = |s: Span| &input[s.start as usize..(s.start as usize + 3).min(s.end as usize)];
    let mut out = Vec::new();
    let mut i = 0;
    while i < segments.len() {
        let s = segments[i];
        match name(s) {
            b"FTS" | b"BHS" | b"BTS" => {}
            b"FHS" if i == 0 => {}
            b"MSH" => {
                let mut j = i + 1;
                while j < segments.len()
                    && !matches!(
                        name(segments[j]),
                        b"MSH" | b"BHS" | b"BTS" | b"FHS" | b"FTS"
                    )
                {
                    j += 1;
                }
                let to = segments.get(j).map_or(input.len(), |s| s.start as usize);
                out.push(Part::Message(
                    &input[s.start as usize..to],
                    s.start as usize,
                ));
                i = j;
                continue;
            }
            _ => {
                return Err(BatchError::StraySegment {
                    offset: s.start as usize,
                });
            }
        }
        out.push(Part::Segment(Segment::new(
            &input[s.start as usize..s.end as usize],
            delims,
            i == 0,
        )));
        i += 1;
    }
    Ok((delims, segments, out))
}

/// A batch cut into its messages without parsing them, so each can be answered on its own (the ingress
/// accepts or rejects every message of a batch separately).
#[derive(Debug, Clone)]
pub struct Split<'a> {
    pub delims: Delimiters,
    /// The FHS segment, if any.
    pub file_header: Option<Segment<'a>>,
    /// The first BHS segment, if any.
    pub batch_header: Option<Segment<'a>>,
    /// Each message's bytes (MSH up to the next MSH or batch segment).
    pub messages: Vec<&'a [u8]>,
    /// Trailer counts (BTS-1, FTS-1) that disagree with the messages and batches found: a message lost or
    /// merged into the one before it (a misnamed `msh|` segment) shows here.
    pub mismatches: Vec<CountMismatch>,
}

/// Messages found and BTS-1 declared in each BHS ... BTS group, in order.
#[derive(Debug, Default)]
struct Groups(Vec<(u64, Option<u64>, bool)>);

impl Groups {
    fn message(&mut self) {
        match self.0.last_mut() {
            Some((n, _, false)) => *n += 1,
            _ => self.0.push((1, None, false)),
        }
    }

    fn header(&mut self) {
        self.0.push((0, None, false));
    }

    fn trailer(&mut self, declared: Option<u64>) {
        match self.0.last_mut() {
            Some((_, d, closed @ false)) => {
                *d = declared;
                *closed = true;
            }
            _ => self.0.push((0, declared, true)),
        }
    }

    fn mismatches(&self, file_declared: Option<u64>) -> Vec<CountMismatch> {
        let mut out: Vec<CountMismatch> = (self.0.iter().enumerate())
            .filter_map(|(batch, &(actual, declared, _))| {
                let declared = declared?;
                (declared != actual).then_some(CountMismatch {
                    trailer: "BTS",
                    batch,
                    declared,
                    actual,
                })
            })
            .collect();
        if let Some(declared) = file_declared {
            let actual = self.0.len() as u64;
            if declared != actual {
                out.push(CountMismatch {
                    trailer: "FTS",
                    batch: 0,
                    declared,
                    actual,
                });
            }
        }
        out
    }
}

/// Cuts a batch (FHS/BHS ... BTS/FTS) into its messages' bytes. Only the batch structure is checked: a message
/// that does not parse is still returned, for the caller to reject alone.
pub fn split(input: &[u8]) -> Result<Split<'_>, BatchError> {
    let (delims, _, parts) = parts(input)?;
    let mut out = Split {
        delims,
        file_header: None,
        batch_header: None,
        messages: Vec::new(),
        mismatches: Vec::new(),
    };
    let mut groups = Groups::default();
    let mut file_declared = None;
    for p in parts {
        match p {
            Part::Message(m, _) => {
                out.messages.push(m);
                groups.message();
            }
            Part::Segment(s) => match s.name() {
                b"FHS" => out.file_header = Some(s),
                b"BHS" => {
                    groups.header();
                    if out.batch_header.is_none() {
                        out.batch_header = Some(s);
                    }
                }
                b"BTS" => groups.trailer(count_field(&s)),
                b"FTS" => file_declared = count_field(&s),
                _ => {}
            },
        }
    }
    out.mismatches = groups.mismatches(file_declared);
    Ok(out)
}

impl<'a> Batch<'a> {
    /// Splits a batch file into its messages; every message must parse.
    pub fn parse(input: &'a [u8]) -> Result<Self, BatchError> {
        let (delims, segments, parts) = parts(input)?;
        let mut file_header = None;
        let mut file_trailer = None;
        let mut batches: Vec<SubBatch<'a>> = Vec::new();
        let mut index = 0;
        for p in parts {
            let s = match p {
                Part::Segment(s) => s,
                Part::Message(bytes, from) => {
                    let msg = Message::parse(bytes).map_err(|source| BatchError::Message {
                        index,
                        source: shift(source, from),
                    })?;
                    index += 1;
                    match batches.last_mut() {
                        Some(last) if last.trailer.is_none() => last.messages.push(msg),
                        _ => batches.push(SubBatch {
                            header: None,
                            trailer: None,
                            messages: vec![msg],
                        }),
                    }
                    continue;
                }
            };
            match s.name() {
                b"FHS" => file_header = Some(s),
                b"FTS" => file_trailer = Some(s),
                b"BHS" => batches.push(SubBatch {
                    header: Some(s),
                    trailer: None,
                    messages: Vec::new(),
                }),
                _ => match batches.last_mut() {
                    Some(last) if last.trailer.is_none() => last.trailer = Some(s),
                    _ => batches.push(SubBatch {
                        header: None,
                        trailer: Some(s),
                        messages: Vec::new(),
                    }),
                },
            }
        }
        Ok(Self {
            delims,
            segments,
            input,
            file_header,
            file_trailer,
            batches,
        })
    }

    /// Every message of every batch, in order.
    pub fn messages(&self) -> impl Iterator<Item = &Message<'a>> {
        self.batches.iter().flat_map(|b| b.messages.iter())
    }

    /// Trailer counts (BTS-1, FTS-1) that disagree with the messages and batches present.
    pub fn count_mismatches(&self) -> Vec<CountMismatch> {
        let groups = self.batches.iter().map(|b| {
            let declared = b.trailer.and_then(|t| count_field(&t));
            (b.messages.len() as u64, declared, b.trailer.is_some())
        });
        Groups(groups.collect()).mismatches(self.file_trailer.and_then(|t| count_field(&t)))
    }

    /// The flat view of the whole file, occurrences counted over all its segments.
    pub fn flat(&self) -> Vec<FlatEntry<'a>> {
        let input = self.input;
        let d = self.delims;
        flatten(
            self.segments.iter().enumerate().map(move |(i, s)| {
                Segment::new(&input[s.start as usize..s.end as usize], d, i == 0)
            }),
        )
    }
}

fn count_field(s: &Segment<'_>) -> Option<u64> {
    let v = s.field(1)?.raw();
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// Re-bases a parse error's offset from a message inside the batch to the batch input.
fn shift(mut e: ParseError, by: usize) -> ParseError {
    use ParseError::*;
    if let MissingMsh { offset }
    | MissingFieldSeparator { offset }
    | BadEncodingCharacters { offset }
    | BadSegmentName { offset }
    | TooFewFields { offset }
    | MissingMessageType { offset }
    | MissingVersion { offset } = &mut e
    {
        *offset += by;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &[u8] = b"FHS|^~\\&|APP\rBHS|^~\\&|APP\r\
MSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\rPID|1\r\
MSH|^~\\&|A|B|C|D|2020||ADT^A08|2|P|2.5\rPID|2\r\
BTS|2\rFTS|1\r";

    #[test]
    fn splits_messages_and_checks_counts() {
        let b = Batch::parse(FILE).unwrap();
        let ids: Vec<_> = b.messages().map(|m| m.header().control_id).collect();
        assert_eq!(ids, [&b"1"[..], b"2"]);
        assert!(b.count_mismatches().is_empty());
        assert_eq!(b.messages().nth(1).unwrap().get("PID-1"), Some(&b"2"[..]));
        assert!(is_batch(FILE));
    }

    #[test]
    fn reports_disagreeing_trailers() {
        let f = String::from_utf8_lossy(FILE)
            .replace("BTS|2", "BTS|3")
            .replace("FTS|1", "FTS|2");
        let b = Batch::parse(f.as_bytes()).unwrap();
        let m = b.count_mismatches();
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].trailer, m[0].declared, m[0].actual), ("BTS", 3, 2));
        assert_eq!((m[1].trailer, m[1].declared, m[1].actual), ("FTS", 2, 1));
    }

    /// Issue 24, item 15: the split the ingress uses checks the trailers too. A message whose `MSH` is
    /// misnamed `msh` is merged into the one before it, and BTS-1 then disagrees with what was found.
    #[test]
    fn split_reports_trailer_counts_that_disagree() {
        assert!(split(FILE).unwrap().mismatches.is_empty());
        let merged = String::from_utf8_lossy(FILE).replace(
            "MSH|^~\\&|A|B|C|D|2020||ADT^A08",
            "msh|^~\\&|A|B|C|D|2020||ADT^A08",
        );
        let s = split(merged.as_bytes()).unwrap();
        assert_eq!(s.messages.len(), 1);
        let m = &s.mismatches;
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!((m[0].trailer, m[0].declared, m[0].actual), ("BTS", 2, 1));
        let two_batches = String::from_utf8_lossy(FILE).replace("FTS|1", "FTS|2");
        let m = split(two_batches.as_bytes()).unwrap().mismatches;
        assert_eq!((m[0].trailer, m[0].declared, m[0].actual), ("FTS", 2, 1));
    }

    #[test]
    fn a_bad_message_fails_the_batch() {
        let f = String::from_utf8_lossy(FILE).replace("ADT^A08", "");
        let e = Batch::parse(f.as_bytes()).unwrap_err();
        assert!(matches!(e, BatchError::Message { index: 1, .. }), "{e}");
        let e = Batch::parse(b"FHS|^~\\&\rPID|1\r").unwrap_err();
        assert!(matches!(e, BatchError::StraySegment { .. }));
    }
}
