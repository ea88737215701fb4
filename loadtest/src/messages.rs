//! The messages a run sends: built-in fixtures or files, as templates with slots for the control id (MSH-10)
//! and, in the fixtures, the patient id (PID-3.1).
//!
//! A message is built by splicing bytes into a reused buffer (no parse, no allocation once the buffer has
//! grown), before the latency timer of that message starts. Files go through the `hl7v2` parser and editor
//! once, at start-up, to find where their MSH-10 is.

use crate::ids::{push_control_id, push_patient_id};
use anyhow::{Context, bail};
use hl7v2::Message;
use hl7v2::mllp::{CR, EB, SB};
use std::ops::Range;
use std::path::Path;

/// The built-in message mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fixture {
    /// ADT^A01, 3 segments, ~327 bytes (RS7's "ADT^A01 Small" is 316 with shorter ids).
    Adt,
    /// ORU^R01, 13 segments, ~1,100 bytes (RS7's "ORU^R01 Medium" is 1,086 with shorter ids).
    Oru,
    /// ADT and ORU alternating.
    Mix,
}

/// Synthetic ADT^A01 in the shape of RS7's small benchmark message: MSH, PID, PV1 (no EVN, as in RS7's), with
/// 301 bytes around the two ids (RS7: 300). Every value is fake.
pub const ADT_A01: &str = "MSH|^~\\&|LOADGEN|LOADFAC|HL7GW|HL7GW|20260101120000||ADT^A01^ADT_A01|{CID}|P|2.5|||AL|NE\r\
PID|1||{PID}^^^LOADFAC^MR||ZZTEST^FAKE^LOAD||19700101|U|||1 FAKE ST^^NOWHERE^ZZ^00000^ZZZ||^PRN^PH^^1^555^5550100\r\
PV1|1|I|ZZW^101^A^LOADFAC||||0000001^ZZDOC^FAKE^X^MD^^MD|||||||||VIP|||||||||||||||||||||||||20260101115500\r";

/// Synthetic ORU^R01 in the shape of RS7's medium benchmark message: MSH, PID, PV1, ORC, OBR and 8 OBX.
pub const ORU_R01: &str = "MSH|^~\\&|LOADLAB|LOADFAC|HL7GW|HL7GW|20260101120000||ORU^R01^ORU_R01|{CID}|P|2.5|||AL|NE\r\
PID|1||{PID}^^^LOADFAC^MR||ZZTEST^FAKE^LOAD||19700101|U|||1 FAKE ST^^NOWHERE^ZZ^00000^ZZZ\r\
PV1|1|O|TESTER^201^B^LOADFAC||||0000001^ZZDOC^FAKE^X^MD\r\
ORC|RE|ORD000001|LAB000001||CM||||20260101110000|||0000001^ZZDOC^FAKE^X^MD\r\
OBR|1|ORD000001|LAB000001|CBC^Complete Blood Count^LN|||20260101100000|||||||||0000001^ZZDOC^FAKE^X^MD||||||20260101110000|||F\r\
OBX|1|NM|WBC^White Blood Cell Count^LN||7.5|10*9/L|4.5-11.0|N|||F|||20260101105500\r\
OBX|2|NM|RBC^Red Blood Cell Count^LN||4.8|10*12/L|4.2-5.9|N|||F|||20260101105500\r\
OBX|3|NM|HGB^Hemoglobin^LN||14.5|g/dL|12.0-16.0|N|||F|||20260101105500\r\
OBX|4|NM|HCT^Hematocrit^LN||42.0|%|36.0-46.0|N|||F|||20260101105500\r\
OBX|5|NM|PLT^Platelet Count^LN||250|10*9/L|150-400|N|||F|||20260101105500\r\
OBX|6|NM|MCV^Mean Corpuscular Volume^LN||88.0|fL|80.0-100.0|N|||F|||20260101105500\r\
OBX|7|NM|MCH^Mean Corpuscular Hemoglobin^LN||30.2|pg|27.0-33.0|N|||F|||20260101105500\r\
OBX|8|NM|MCHC^Mean Corpuscular Hemoglobin Concentration^LN||34.5|g/dL|32.0-36.0|N|||F|||20260101105500\r";

/// The sending application (MSH-3) of test traffic: routes do not take it unless they name it.
pub const TEST_SENDING_APPLICATION: &str = "HL7GW-TEST";

/// A fixture pattern as test traffic: MSH-3 [`TEST_SENDING_APPLICATION`] and MSH-11 `T` (training/test), so
/// `helm test` against a live pipeline is never taken for a production admission.
pub fn mark_as_test(pattern: &str) -> String {
    let mut fields: Vec<&str> = pattern.splitn(13, '|').collect();
    if fields.len() == 13 {
        fields[2] = TEST_SENDING_APPLICATION;
        fields[10] = "T";
    }
    fields.join("|")
}

const CID_SLOT: &str = "{CID}";
const PID_SLOT: &str = "{PID}";
/// Put in MSH-10 of a file's message to find where the control id goes (no delimiter, nothing to escape).
const MARKER: &[u8] = b"HL7GWLOADCONTROLIDSLOT";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(Vec<u8>),
    ControlId,
    PatientId,
}

/// One message with its slots.
#[derive(Debug, Clone)]
pub struct Template {
    name: String,
    pieces: Vec<Piece>,
}

impl Template {
    /// A template from text where `{CID}` marks the control id and `{PID}` the patient id.
    pub fn from_pattern(name: &str, pattern: &str) -> Self {
        let mut pieces = Vec::new();
        let mut rest = pattern;
        while let Some(i) = rest.find('{') {
            let slot = if rest[i..].starts_with(CID_SLOT) {
                Some((Piece::ControlId, CID_SLOT.len()))
            } else if rest[i..].starts_with(PID_SLOT) {
                Some((Piece::PatientId, PID_SLOT.len()))
            } else {
                None
            };
            match slot {
                Some((piece, len)) => {
                    if i > 0 {
                        pieces.push(Piece::Lit(rest.as_bytes()[..i].to_vec()));
                    }
                    pieces.push(piece);
                    rest = &rest[i + len..];
                }
                None => {
                    pieces.push(Piece::Lit(rest.as_bytes()[..=i].to_vec()));
                    rest = &rest[i + 1..];
                }
            }
        }
        if !rest.is_empty() {
            pieces.push(Piece::Lit(rest.as_bytes().to_vec()));
        }
        Self {
            name: name.to_owned(),
            pieces,
        }
    }

    /// A template from one message (segments CR-terminated): checked with the parser, MSH-10 becomes the slot.
    pub fn from_message(name: &str, msg: &[u8]) -> anyhow::Result<Self> {
        let parsed =
            Message::parse(msg).with_context(|| format!("{name}: not an HL7 v2 message"))?;
        let mut edit = parsed.edit();
        edit.set("MSH-10", MARKER)
            .with_context(|| format!("{name}: cannot set MSH-10"))?;
        let bytes = edit.encode();
        let Some(at) = find(&bytes, MARKER) else {
            bail!("{name}: MSH-10 could not be located");
        };
        if find(&bytes[at + MARKER.len()..], MARKER).is_some() {
            bail!("{name}: the message already holds the placeholder text");
        }
        let mut pieces = vec![Piece::Lit(bytes[..at].to_vec()), Piece::ControlId];
        if at + MARKER.len() < bytes.len() {
            pieces.push(Piece::Lit(bytes[at + MARKER.len()..].to_vec()));
        }
        Ok(Self {
            name: name.to_owned(),
            pieces,
        })
    }

    /// Where it came from (fixture name, or file and message number).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Appends the message `id` wrapped in an MLLP frame; returns the range of the control id inside `out`.
    pub fn write_frame(&self, out: &mut Vec<u8>, id: MessageId<'_>) -> Range<usize> {
        out.push(SB);
        let cid = self.write_payload(out, id);
        out.extend_from_slice(&[EB, CR]);
        cid
    }

    /// Appends the bare message `id`; returns the range of the control id inside `out`.
    pub fn write_payload(&self, out: &mut Vec<u8>, id: MessageId<'_>) -> Range<usize> {
        let mut cid = 0..0;
        for piece in &self.pieces {
            match piece {
                Piece::Lit(b) => out.extend_from_slice(b),
                Piece::ControlId => {
                    let start = out.len();
                    push_control_id(out, id.run, id.client, id.seq, id.warmup);
                    cid = start..out.len();
                }
                Piece::PatientId => push_patient_id(out, id.client, id.seq),
            }
        }
        cid
    }
}

/// Which message to write: message `seq` of `client` in run `run` (its control id `<run>-<client>-<seq>`, marked
/// when `warmup`).
#[derive(Debug, Clone, Copy)]
pub struct MessageId<'a> {
    pub run: &'a [u8],
    pub client: u32,
    pub seq: u64,
    pub warmup: bool,
}

/// The templates of a run, sent round-robin: message `seq` of every client uses template `seq % len`.
#[derive(Debug, Clone)]
pub struct MessageSet {
    templates: Vec<Template>,
    label: String,
}

impl MessageSet {
    /// A built-in fixture; `test_traffic` marks every message as test traffic ([`mark_as_test`]).
    pub fn fixture(f: Fixture, test_traffic: bool) -> Self {
        let pattern = |p: &str| {
            if test_traffic {
                mark_as_test(p)
            } else {
                p.to_owned()
            }
        };
        let adt = || Template::from_pattern("ADT^A01", &pattern(ADT_A01));
        let oru = || Template::from_pattern("ORU^R01", &pattern(ORU_R01));
        let (templates, label) = match f {
            Fixture::Adt => (vec![adt()], "fixture adt (ADT^A01)"),
            Fixture::Oru => (vec![oru()], "fixture oru (ORU^R01)"),
            Fixture::Mix => (vec![adt(), oru()], "fixture mix (ADT^A01, ORU^R01)"),
        };
        Self {
            templates,
            label: label.to_owned(),
        }
    }

    /// Every message of every file, in order (a file may hold several messages, or a batch).
    pub fn from_files(paths: &[impl AsRef<Path>]) -> anyhow::Result<Self> {
        let mut templates = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let messages = split_messages(&bytes)
                .with_context(|| format!("reading messages from {}", path.display()))?;
            for (i, msg) in messages.iter().enumerate() {
                let name = format!("{}#{}", path.display(), i + 1);
                templates.push(Template::from_message(&name, msg)?);
            }
        }
        if templates.is_empty() {
            bail!("no message in the given files");
        }
        let label = format!(
            "{} message(s) from {} file(s)",
            templates.len(),
            paths.len()
        );
        Ok(Self { templates, label })
    }

    /// The template of message `seq`.
    pub fn pick(&self, seq: u64) -> &Template {
        &self.templates[(seq % self.templates.len() as u64) as usize]
    }

    /// All templates.
    pub fn templates(&self) -> &[Template] {
        &self.templates
    }

    /// What the set is, for the report.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// Splits file content into messages: segments end with CR, LF or CRLF and are re-terminated with CR; a new
/// message starts at each MSH; batch envelopes (FHS, BHS, BTS, FTS), blank lines, a BOM and stray MLLP
/// framing bytes are dropped.
pub fn split_messages(input: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
    let input = input.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(input);
    let mut messages: Vec<Vec<u8>> = Vec::new();
    for line in input.split(|&b| b == b'\r' || b == b'\n') {
        let line: Vec<u8> = line
            .iter()
            .copied()
            .filter(|&b| b != SB && b != EB)
            .collect();
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let name = &line[..line.len().min(3)];
        if matches!(name, b"FHS" | b"BHS" | b"BTS" | b"FTS") {
            continue;
        }
        if name == b"MSH" {
            messages.push(Vec::new());
        }
        let Some(current) = messages.last_mut() else {
            bail!("content before the first MSH segment");
        };
        current.extend_from_slice(&line);
        current.push(CR);
    }
    Ok(messages)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(t: &Template, client: u32, seq: u64) -> (Vec<u8>, Range<usize>) {
        let mut out = Vec::new();
        let cid = t.write_payload(
            &mut out,
            MessageId {
                run: b"RUNID",
                client,
                seq,
                warmup: false,
            },
        );
        (out, cid)
    }

    #[test]
    fn fixtures_parse_and_carry_control_and_patient_ids() {
        for (pattern, segments, kind) in [(ADT_A01, 3, "ADT"), (ORU_R01, 13, "ORU")] {
            let t = Template::from_pattern(kind, pattern);
            let (bytes, cid) = render(&t, 3, 45);
            let m = Message::parse(&bytes).expect("fixture parses");
            assert_eq!(m.segment_count(), segments, "{kind}");
            assert_eq!(m.header().message_type, kind.as_bytes());
            assert_eq!(m.header().control_id, b"RUNID-3-45");
            assert_eq!(&bytes[cid], b"RUNID-3-45");
            assert_eq!(m.get("PID-3-1"), Some(&b"LOAD3-5"[..]));
        }
    }

    #[test]
    fn fixture_sizes_match_rs7() {
        // RS7: ADT 316 bytes, ORU 1,086 bytes with 8-character control and patient ids. With a typical
        // 18-character control id and 7-character patient id ours stay within a few percent.
        let (adt, _) = render(&Template::from_pattern("ADT", ADT_A01), 1, 7);
        let (oru, _) = render(&Template::from_pattern("ORU", ORU_R01), 1, 7);
        let cid_extra = "0123456789A-1-1234".len() - "RUNID-1-7".len();
        let (adt, oru) = (adt.len() + cid_extra, oru.len() + cid_extra);
        assert!((300..=340).contains(&adt), "ADT is {adt} bytes");
        assert!((1_050..=1_120).contains(&oru), "ORU is {oru} bytes");
    }

    #[test]
    fn frames_are_mllp_wrapped_and_buffers_reused() {
        let set = MessageSet::fixture(Fixture::Mix, false);
        let mut out = Vec::new();
        for seq in 0..4 {
            out.clear();
            let cid = set.pick(seq).write_frame(
                &mut out,
                MessageId {
                    run: b"R",
                    client: 0,
                    seq,
                    warmup: seq == 0,
                },
            );
            assert_eq!(out[0], SB);
            assert_eq!(&out[out.len() - 2..], &[EB, CR]);
            let m = Message::parse(&out[1..out.len() - 2]).expect("parses");
            assert_eq!(m.header().control_id, &out[cid]);
            let want: &[u8] = if seq % 2 == 0 { b"ADT" } else { b"ORU" };
            assert_eq!(m.header().message_type, want);
        }
        let mut out = Vec::new();
        let cid = set.pick(0).write_payload(
            &mut out,
            MessageId {
                run: b"R",
                client: 1,
                seq: 2,
                warmup: true,
            },
        );
        assert_eq!(&out[cid], b"R-1-W2");
    }

    #[test]
    fn file_messages_get_their_msh10_replaced_and_nothing_else() {
        let msg = b"MSH|^~\\&|A|B|C|D|20260101||ADT^A08|ORIGINAL1|P|2.5\rPID|1||X1\r";
        let t = Template::from_message("f", msg).expect("template");
        let (bytes, cid) = render(&t, 2, 9);
        assert_eq!(
            bytes,
            b"MSH|^~\\&|A|B|C|D|20260101||ADT^A08|RUNID-2-9|P|2.5\rPID|1||X1\r"
        );
        assert_eq!(&bytes[cid], b"RUNID-2-9");
        // An empty MSH-10 is filled.
        let empty = b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01||P|2.5\r";
        let t = Template::from_message("empty", empty).expect("template");
        assert_eq!(
            render(&t, 0, 0).0,
            b"MSH|^~\\&|A|B|C|D|20260101||ADT^A01|RUNID-0-0|P|2.5\r"
        );
    }

    #[test]
    fn files_split_into_messages_with_cr_terminators() {
        let content = b"\xEF\xBB\xBFFHS|^~\\&|X\nBHS|^~\\&|X\r\nMSH|^~\\&|A|B|C|D|1||ADT^A01|1|P|2.5\nPID|1\n\nMSH|^~\\&|A|B|C|D|1||ADT^A02|2|P|2.5\r\nBTS|2\nFTS|1\n";
        let msgs = split_messages(content).expect("splits");
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0], b"MSH|^~\\&|A|B|C|D|1||ADT^A01|1|P|2.5\rPID|1\r");
        assert_eq!(msgs[1], b"MSH|^~\\&|A|B|C|D|1||ADT^A02|2|P|2.5\r");
        assert!(split_messages(b"PID|1\rMSH|^~\\&|A\r").is_err());
        let framed = b"\x0bMSH|^~\\&|A|B|C|D|1||ADT^A01|1|P|2.5\r\x1c\r";
        assert_eq!(split_messages(framed).expect("splits").len(), 1);
    }

    #[test]
    fn files_load_and_reject_what_does_not_parse() {
        let two =
            "MSH|^~\\&|A|B|C|D|1||ADT^A01|1|P|2.5\nPID|1\nMSH|^~\\&|A|B|C|D|1||ORU^R01|2|P|2.5\n";
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.hl7");
        std::fs::write(&good, two).expect("write");
        let set = MessageSet::from_files(&[&good]).expect("loads");
        assert_eq!(set.templates().len(), 2);
        assert!(set.templates()[1].name().ends_with("good.hl7#2"));
        let bad = dir.path().join("bad.hl7");
        std::fs::write(&bad, "MSH|^~\\&|A\n").expect("write");
        assert!(MessageSet::from_files(&[&bad]).is_err());
        assert!(MessageSet::from_files(&[dir.path().join("missing.hl7")]).is_err());
        let empty = dir.path().join("empty.hl7");
        std::fs::write(&empty, "\n\n").expect("write");
        assert!(MessageSet::from_files(&[&empty]).is_err());
    }

    #[test]
    fn patterns_keep_unknown_braces() {
        let t = Template::from_pattern("x", "A{B}{CID}C{PID}{");
        let (bytes, _) = render(&t, 1, 2);
        assert_eq!(bytes, b"A{B}RUNID-1-2CLOAD1-2{");
    }

    #[test]
    fn test_traffic_is_marked_in_msh3_and_msh11() {
        for p in [ADT_A01, ORU_R01] {
            let marked = mark_as_test(p)
                .replace("{CID}", "C1")
                .replace("{PID}", "P1");
            let m = Message::parse(marked.as_bytes()).unwrap();
            assert_eq!(m.get("MSH-3"), Some(TEST_SENDING_APPLICATION.as_bytes()));
            assert_eq!(m.get("MSH-11"), Some(&b"T"[..]));
            assert_eq!(m.get("MSH-10"), Some(&b"C1"[..]));
        }
    }
}
