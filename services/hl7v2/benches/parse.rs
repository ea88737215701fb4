//! Criterion benchmarks: `hl7v2` against `hl7-parser` 0.3 and `rust-hl7` 0.5 on the same fixtures doing the
//! same work. Run with `make bench` (`cargo bench -p hl7v2 --bench parse`); results and targets are in
//! docs/BENCHMARKS.md.
//!
//! Groups:
//! - `T1_parse`: parse only (for `hl7v2`, `Message::parse` / `Batch::parse`; the other crates split the whole
//!   message into fields, repetitions and components up front, `hl7v2` splits on access).
//! - `T2_parse_header_ack`: parse, read the MSH routing fields, PID-3.1 and PID-5, write an ACK.
//! - `T3_parse_edit_encode`: parse, set PID-5.2, serialise (`rust-hl7` has no way to modify a message).
//! - `mllp_decode`: `MllpCodec` over a read buffer (the other crates have no MLLP codec).
//! - `scaling`: parse MSH + PID + N OBX, N = 5, 10, 25, 50, 100, 200.
//!
//! Fixtures: `fixtures/rs7_adt_a01.hl7` and `fixtures/rs7_oru_r01.hl7` (RS7's published benchmark messages,
//! see fixtures/README.md); the batch, the stress message and the scaling series are generated below,
//! deterministically, with synthetic values only.
//!
//! The binary checks first that every crate parses every fixture and that the three crates produce the same
//! ACK and the same edited message, so the numbers compare the same work. `cargo test --benches` runs that
//! check plus each benchmark once.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Duration;

use bytes::BytesMut;
use criterion::measurement::WallTime;
use criterion::{BatchSize, BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group};
use hl7v2::ack::{AckIds, Outcome, ack_code, write_ack};
use hl7v2::{Batch, Message, MllpCodec};
use tokio_util::codec::Decoder;

// ---------------------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------------------

/// RS7's "ADT^A01 Small" (316 bytes, 3 segments).
const ADT: &str = include_str!("fixtures/rs7_adt_a01.hl7");
/// RS7's "ORU^R01 Medium" (1,086 bytes, 13 segments).
const ORU: &str = include_str!("fixtures/rs7_oru_r01.hl7");

/// Segment counts of the scaling series (OBX segments after MSH and PID, as in RS7's series).
const SCALING: [usize; 6] = [5, 10, 25, 50, 100, 200];

/// A ~5 KB batch file: FHS, BHS, six ORU^R01 messages, BTS, FTS.
fn batch_5kb() -> String {
    let mut s = String::with_capacity(6 * 1024);
    s.push_str("FHS|^~\\&|LAB|Hospital|EMR|Hospital|20240315143000||LAB_RESULTS.hl7|FILE0001\r");
    s.push_str("BHS|^~\\&|LAB|Hospital|EMR|Hospital|20240315143000||||BATCH0001\r");
    let messages = 6;
    for m in 1..=messages {
        let _ = write!(
            s,
            "MSH|^~\\&|LAB|Hospital|EMR|Hospital|20240315143{m:03}||ORU^R01^ORU_R01|BATCH0001-{m:03}|P|2.5\r\
             PID|1||MRN{m:05}^^^Hospital^MR||SYNTHETIC^PATIENT^{m}||1980010{m}|F|||{m} Test Road^^SPRINGFIELD^MA^01101^USA\r\
             OBR|1|ORD{m:06}|LAB{m:06}|BMP^Basic Metabolic Panel^LN|||20240315110000|||||||||1234567^DOCTOR^TEST^M^MD||||||20240315120000|||F\r"
        );
        for (i, (code, name, unit, range)) in [
            ("NA", "Sodium", "mmol/L", "135-145"),
            ("K", "Potassium", "mmol/L", "3.5-5.1"),
            ("CL", "Chloride", "mmol/L", "98-107"),
            ("CO2", "Carbon Dioxide", "mmol/L", "22-29"),
            ("BUN", "Urea Nitrogen", "mg/dL", "7-20"),
            ("CREA", "Creatinine", "mg/dL", "0.6-1.2"),
            ("GLU", "Glucose", "mg/dL", "70-99"),
        ]
        .iter()
        .enumerate()
        {
            let n = i + 1;
            let _ = write!(
                s,
                "OBX|{n}|NM|{code}^{name}^LN||{}.{}|{unit}|{range}|N|||F|||20240315115500\r",
                10 * m + n,
                n % 10
            );
        }
        let _ = write!(s, "NTE|1|L|Synthetic batch message {m}\r");
    }
    let _ = write!(s, "BTS|{messages}\rFTS|1\r");
    s
}

/// A ~56 KB ORU^R01: 20 orders of ORC, OBR, 18 OBX and an NTE, with repetitions and escape sequences.
fn stress_56kb() -> String {
    let mut s = String::with_capacity(60 * 1024);
    s.push_str(
        "MSH|^~\\&|LAB|Hospital|EMR|Hospital|20240315143000||ORU^R01^ORU_R01|STRESS0001|P|2.5.1|||AL|NE||UNICODE UTF-8\r\
         PID|1||MRN99999^^^Hospital^MR~ENC00042^^^Hospital^AN~SYN000000^^^TEST^PI||STRESS^TEST^PATIENT~ALIAS^TEST^^^^^A||19800101|M|||\
         1 Synthetic Way^Unit 2\\T\\3^SPRINGFIELD^MA^01101^USA~PO Box 9^^SPRINGFIELD^MA^01102^USA^M||^PRN^PH^^1^555^0100000~^NET^Internet^test@example.invalid\r\
         PV1|1|I|ICU^101^A^Hospital||||1234567^DOCTOR^STRESS^M^MD~7654321^OTHER^DOC^^^^MD\r",
    );
    for order in 1..=20 {
        let _ = write!(
            s,
            "ORC|RE|ORD{order:06}|LAB{order:06}||CM||||20240315120000|||1234567^DOCTOR^STRESS^M^MD\r\
             OBR|{order}|ORD{order:06}|LAB{order:06}|PANEL{order}^Panel {order}^LN|||20240315110000|||||||||\
             1234567^DOCTOR^STRESS^M^MD~7654321^OTHER^DOC^^^^MD||||||20240315120000|||F\r"
        );
        for obs in 1..=18 {
            let code = order * 100 + obs;
            if obs % 6 == 0 {
                let _ = write!(
                    s,
                    "OBX|{obs}|TX|T{code:04}^Text Observation {code}^LN||Result \\F\\ flagged\\E\\reviewed \\S\\ see note\\X0D\\\
                     line two~second repetition \\T\\ more||||A|||F|||20240315115500||TECH001^TECHNICIAN^LAB\r"
                );
            } else {
                let _ = write!(
                    s,
                    "OBX|{obs}|NM|T{code:04}^Test Observation {code}^LN||{order}.{obs}|10\\S\\9/L|0.0-100.0|N~A|||F|||\
                     20240315115500||TECH001^TECHNICIAN^LAB~TECH002^SECOND^LAB\r"
                );
            }
        }
        let _ = write!(
            s,
            "NTE|1|L|Panel {order}: value \\F\\ range \\S\\ units \\T\\ checked\\R\\repeat \\E\\ end~second comment\r"
        );
    }
    s
}

/// The scaling series: MSH, PID, then `n` OBX segments (the shape of RS7's size-scaling series).
fn scaling_message(n: usize) -> String {
    let mut s = String::from(
        "MSH|^~\\&|LAB|Hospital|EMR|Hospital|20240315143000||ORU^R01|MSG001|P|2.5\r\
         PID|1||MRN12345^^^Hospital^MR||DOE^JOHN||19800101|M\r",
    );
    for i in 1..=n {
        let _ = write!(s, "OBX|{i}|NM|T{i}^Test {i}^LN||{i}.5|unit|0-100|N|||F\r");
    }
    s
}

/// `input` wrapped in an MLLP frame.
fn framed(input: &str) -> Vec<u8> {
    hl7v2::mllp::frame(input.as_bytes()).to_vec()
}

/// Name used in benchmark ids: `ADT_A01_316B`.
fn label(name: &str, input: &str) -> String {
    format!("{name}_{}B", input.len())
}

// ---------------------------------------------------------------------------------------------------------
// The work, per crate
// ---------------------------------------------------------------------------------------------------------

/// MSH-10 and MSH-7 of the ACKs every crate builds.
const ACK_CONTROL_ID: &str = "ACK00001";
const ACK_TIMESTAMP: &str = "20240315143001";
/// The edit of T3: PID-5.2.
const NEW_GIVEN_NAME: &str = "JANE";

/// Calls `f` with each message of a batch file (from an MSH up to the next MSH, BHS, BTS, FHS or FTS, without
/// the last segment terminator): what a user of a crate without batch support writes.
fn for_each_batch_message<'a>(s: &'a str, mut f: impl FnMut(&'a str)) {
    let mut start = None;
    let mut pos = 0;
    for line in s.split('\r') {
        let msh = line.starts_with("MSH");
        if msh
            || ["BHS", "BTS", "FHS", "FTS"]
                .iter()
                .any(|n| line.starts_with(n))
        {
            if let Some(st) = start.take() {
                f(&s[st..pos - 1]);
            }
            if msh {
                start = Some(pos);
            }
        }
        pos += line.len() + 1;
    }
    if let Some(st) = start {
        f(s[st..].trim_end_matches('\r'));
    }
}

mod ours {
    use super::*;

    pub fn parse(input: &str) -> Message<'_> {
        Message::parse(input.as_bytes()).expect("hl7v2 parses the fixture")
    }

    pub fn parse_batch(input: &str) -> Batch<'_> {
        Batch::parse(input.as_bytes()).expect("hl7v2 parses the batch")
    }

    /// T2. Returns PID-3.1 and PID-5 so the caller can check them; the ACK is in `out`.
    pub fn header_ack<'a>(input: &'a str, out: &mut Vec<u8>) -> (&'a [u8], &'a [u8]) {
        let m = parse(input);
        let h = m.header();
        black_box((h.message_type, h.trigger_event, h.control_id, h.version));
        let pid3 = m.get("PID-3-1").unwrap_or_default();
        let pid5 = m.get("PID-5").unwrap_or_default();
        let ids = AckIds {
            control_id: ACK_CONTROL_ID.as_bytes(),
            timestamp: ACK_TIMESTAMP.as_bytes(),
        };
        write_ack(out, h, ack_code(h, Outcome::Accept), None, &ids);
        (pid3, pid5)
    }

    /// T3: the edited message in `out`.
    pub fn edit_encode(input: &str, out: &mut Vec<u8>) {
        let m = parse(input);
        let mut e = m.edit();
        e.set("PID-5-2", NEW_GIVEN_NAME.as_bytes())
            .expect("hl7v2 sets PID-5-2");
        out.clear();
        e.encode_into(out);
    }
}

/// The ACK the other crates' users write by hand, from MSH-3, 4, 5, 6, 9.2, 10, 11 and 12 of the message.
fn ack_text(out: &mut String, msh: [&str; 8], enhanced: bool) {
    let [sa, sf, ra, rf, trigger, control, processing, version] = msh;
    out.clear();
    let code = if enhanced { "CA" } else { "AA" };
    let _ = write!(
        out,
        "MSH|^~\\&|{ra}|{rf}|{sa}|{sf}|{ACK_TIMESTAMP}||ACK^{trigger}^ACK|{ACK_CONTROL_ID}|{processing}|{version}\r\
         MSA|{code}|{control}\r"
    );
}

mod hl7_parser_crate {
    use super::*;
    use hl7_parser::Message;
    use hl7_parser::builder::MessageBuilder;

    pub fn parse(input: &str) -> Message<'_> {
        Message::parse(input).expect("hl7-parser parses the fixture")
    }

    /// T2 the way a user of hl7-parser writes it.
    pub fn header_ack<'a>(input: &'a str, out: &mut String) -> (&'a str, &'a str) {
        let m = parse(input);
        let msh = m.segment("MSH").expect("MSH");
        let f = |n: usize| msh.field(n).map_or("", |f| f.raw_value());
        let comp = |n: usize, c: usize| {
            msh.field(n)
                .and_then(|f| f.component(c))
                .map_or("", |c| c.raw_value())
        };
        let (sa, sf, ra, rf) = (f(3), f(4), f(5), f(6));
        let (mtype, trigger) = (comp(9, 1), comp(9, 2));
        let (control, processing, version) = (f(10), f(11), f(12));
        let enhanced = !f(15).is_empty() || !f(16).is_empty();
        black_box((mtype, version));
        let pid = m.segment("PID");
        let pid3 = pid
            .and_then(|p| p.field(3))
            .and_then(|f| f.component(1))
            .map_or("", |c| c.raw_value());
        let pid5 = pid.and_then(|p| p.field(5)).map_or("", |f| f.raw_value());
        let msh = [sa, sf, ra, rf, trigger, control, processing, version];
        super::ack_text(out, msh, enhanced);
        (pid3, pid5)
    }

    /// T3 through hl7-parser's builder (the crate's way to modify a parsed message).
    pub fn edit_encode(input: &str, out: &mut String) {
        let m = parse(input);
        let mut b = MessageBuilder::from(&m);
        b.segment_named_mut("PID")
            .and_then(|p| p.field_mut(5))
            .expect("PID-5")
            .set_component(2, NEW_GIVEN_NAME);
        out.clear();
        let _ = write!(out, "{b}");
    }
}

mod rust_hl7_crate {
    use super::*;
    use rusthl7::message::Message;

    pub fn parse(input: &str) -> Message<'_> {
        Message::try_from(input).expect("rust-hl7 parses the fixture")
    }

    /// T2 the way a user of rust-hl7 writes it (numeric indexes: MSH-n is `fields[n - 1]`, PID-n `fields[n]`).
    pub fn header_ack<'a>(input: &'a str, out: &mut String) -> (&'a str, &'a str) {
        let m = parse(input);
        let msh = &m.segments[0];
        let (sa, sf, ra, rf) = (msh[2], msh[3], msh[4], msh[5]);
        let (mtype, trigger) = (msh[(8, 0, 0)], msh[(8, 0, 1)]);
        let (control, processing, version) = (msh[9], msh[10], msh[11]);
        let enhanced = !msh[14].is_empty() || !msh[15].is_empty();
        black_box((mtype, version));
        let pid = m.segments.iter().find(|s| s.fields[0].source == "PID");
        let pid3 = pid.map_or("", |p| p[(3, 0, 0)]);
        let pid5 = pid.map_or("", |p| p[5]);
        let msh = [sa, sf, ra, rf, trigger, control, processing, version];
        super::ack_text(out, msh, enhanced);
        (pid3, pid5)
    }
}

// ---------------------------------------------------------------------------------------------------------
// Check that the crates do the same work
// ---------------------------------------------------------------------------------------------------------

fn check_fixtures() {
    assert_eq!((ADT.len(), ADT.split('\r').count()), (316, 3), "RS7 ADT");
    assert_eq!((ORU.len(), ORU.split('\r').count()), (1086, 13), "RS7 ORU");
    let batch = batch_5kb();
    let stress = stress_56kb();
    let mut all: Vec<(String, String)> = vec![
        ("ADT".into(), ADT.into()),
        ("ORU".into(), ORU.into()),
        ("stress".into(), stress.clone()),
    ];
    all.extend(
        SCALING
            .iter()
            .map(|&n| (format!("scaling {n}"), scaling_message(n))),
    );
    for (name, input) in &all {
        let ours = ours::parse(input).segment_count();
        let hp = hl7_parser_crate::parse(input).segments.len();
        let rh = rust_hl7_crate::parse(input)
            .segments
            .iter()
            .filter(|s| !s.source.is_empty())
            .count();
        assert_eq!((ours, hp, rh), (ours, ours, ours), "{name}: segment counts");
    }
    let b = ours::parse_batch(&batch);
    let mut n = 0;
    for_each_batch_message(&batch, |m| {
        n += 1;
        let hp = hl7_parser_crate::parse(m).segments.len();
        let rh = rust_hl7_crate::parse(m).segments.len();
        assert_eq!(hp, rh, "batch message {n}");
    });
    assert_eq!((b.messages().count(), n), (6, 6), "batch messages");
    assert!(b.count_mismatches().is_empty());

    for (name, input, pid3, pid5) in [
        ("ADT", ADT, "MRN12345", "DOE^JOHN^ALLEN"),
        ("ORU", ORU, "MRN12345", "DOE^JOHN^ALLEN"),
    ] {
        let mut ack = Vec::new();
        let got = ours::header_ack(input, &mut ack);
        assert_eq!(got, (pid3.as_bytes(), pid5.as_bytes()), "{name}: hl7v2 PID");
        let ack = String::from_utf8(ack).expect("ACK is ASCII");
        let mut other = String::new();
        assert_eq!(
            hl7_parser_crate::header_ack(input, &mut other),
            (pid3, pid5)
        );
        assert_eq!(other, ack, "{name}: hl7-parser ACK");
        assert_eq!(rust_hl7_crate::header_ack(input, &mut other), (pid3, pid5));
        assert_eq!(other, ack, "{name}: rust-hl7 ACK");

        let expected = input.replace("DOE^JOHN^ALLEN", "DOE^JANE^ALLEN");
        let mut edited = Vec::new();
        ours::edit_encode(input, &mut edited);
        assert_eq!(edited, expected.as_bytes(), "{name}: hl7v2 edit");
        let mut edited = String::new();
        hl7_parser_crate::edit_encode(input, &mut edited);
        assert_eq!(edited, expected, "{name}: hl7-parser edit");
    }
    eprintln!(
        "fixtures: ADT {} B, ORU {} B, batch {} B, stress {} B ({} segments), scaling {:?} B",
        ADT.len(),
        ORU.len(),
        batch.len(),
        stress.len(),
        stress.split('\r').filter(|l| !l.is_empty()).count(),
        SCALING.map(|n| scaling_message(n).len()),
    );
}

// ---------------------------------------------------------------------------------------------------------
// Benchmarks
// ---------------------------------------------------------------------------------------------------------

const HL7V2: &str = "hl7v2";
const HL7_PARSER: &str = "hl7-parser";
const RUST_HL7: &str = "rust-hl7";

/// T1 (parse) of `input` by hl7v2, hl7-parser and rust-hl7, under `id`.
fn parse_three_ways(g: &mut BenchmarkGroup<'_, WallTime>, id: &str, input: &str) {
    g.bench_with_input(BenchmarkId::new(HL7V2, id), input, |b, i| {
        b.iter(|| ours::parse(black_box(i)))
    });
    g.bench_with_input(BenchmarkId::new(HL7_PARSER, id), input, |b, i| {
        b.iter(|| hl7_parser_crate::parse(black_box(i)))
    });
    g.bench_with_input(BenchmarkId::new(RUST_HL7, id), input, |b, i| {
        b.iter(|| rust_hl7_crate::parse(black_box(i)))
    });
}

fn t1_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("T1_parse");
    let stress = stress_56kb();
    let messages = [
        ("ADT_A01", ADT.to_owned()),
        ("ORU_R01", ORU.to_owned()),
        ("stress", stress),
    ];
    for (name, input) in &messages {
        let id = label(name, input);
        g.throughput(Throughput::Bytes(input.len() as u64));
        parse_three_ways(&mut g, &id, input);
    }
    let batch = batch_5kb();
    let id = label("batch", &batch);
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_with_input(BenchmarkId::new(HL7V2, &id), batch.as_str(), |b, i| {
        b.iter(|| ours::parse_batch(black_box(i)))
    });
    g.bench_with_input(BenchmarkId::new(HL7_PARSER, &id), batch.as_str(), |b, i| {
        b.iter(|| {
            for_each_batch_message(black_box(i), |m| {
                black_box(hl7_parser_crate::parse(m));
            })
        })
    });
    g.bench_with_input(BenchmarkId::new(RUST_HL7, &id), batch.as_str(), |b, i| {
        b.iter(|| {
            for_each_batch_message(black_box(i), |m| {
                black_box(rust_hl7_crate::parse(m));
            })
        })
    });
    g.finish();
}

/// Benchmarks each crate's `$run(input, &mut out)` on the ADT and the ORU, under the crate's name: one output
/// buffer (`Vec<u8>` or `String`, whichever `$run` takes) reused by every iteration, as a service would.
macro_rules! bench_buffered {
    ($g:expr; $($name:expr => $run:path),+) => {
        for (fixture, input) in [("ADT_A01", ADT), ("ORU_R01", ORU)] {
            let id = label(fixture, input);
            $g.throughput(Throughput::Bytes(input.len() as u64));
            $(
                $g.bench_with_input(BenchmarkId::new($name, &id), input, |b, i| {
                    let mut out = Default::default();
                    b.iter(|| {
                        let r = $run(black_box(i), &mut out);
                        black_box((r, out.len()));
                    })
                });
            )+
        }
    };
}

fn t2_parse_header_ack(c: &mut Criterion) {
    let mut g = c.benchmark_group("T2_parse_header_ack");
    bench_buffered!(g;
        HL7V2 => ours::header_ack,
        HL7_PARSER => hl7_parser_crate::header_ack,
        RUST_HL7 => rust_hl7_crate::header_ack
    );
    g.finish();
}

/// rust-hl7 0.5 has no API to modify a message (its Message, Segment and Field only borrow the source).
fn t3_parse_edit_encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("T3_parse_edit_encode");
    bench_buffered!(g; HL7V2 => ours::edit_encode, HL7_PARSER => hl7_parser_crate::edit_encode);
    g.finish();
}

fn mllp_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("mllp_decode");
    let stress = stress_56kb();
    let one = |s: &str| framed(s);
    let stream: Vec<u8> = (0..100).flat_map(|_| framed(ADT)).collect();
    let cases = [
        (format!("ORU_R01_frame_{}B", ORU.len() + 3), one(ORU), 1),
        (
            format!("stress_frame_{}B", stress.len() + 3),
            one(&stress),
            1,
        ),
        (
            format!("ADT_A01_x100_stream_{}B", stream.len()),
            stream,
            100,
        ),
    ];
    for (id, bytes, frames) in &cases {
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_with_input(BenchmarkId::new(HL7V2, id), bytes, |b, input| {
            b.iter_batched(
                || BytesMut::from(&input[..]),
                |mut buf| {
                    let mut codec = MllpCodec::default();
                    let mut n = 0;
                    while let Some(frame) = codec.decode(&mut buf).expect("valid MLLP") {
                        black_box(&frame);
                        n += 1;
                    }
                    assert_eq!(n, *frames);
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("scaling");
    for n in SCALING {
        let input = scaling_message(n);
        let id = format!("{n}_OBX_{}B", input.len());
        g.throughput(Throughput::Bytes(input.len() as u64));
        parse_three_ways(&mut g, &id, &input);
    }
    g.finish();
}

/// 43 benchmarks at about 1 s warm-up + 3 s measurement each: about 3 minutes, plus the build.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(60)
}

criterion_group! {
    name = benches;
    config = config();
    targets = t1_parse, t2_parse_header_ack, t3_parse_edit_encode, mllp_decode, scaling
}

fn main() {
    check_fixtures();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
