//! Property tests: generated messages round-trip byte-identical and navigate as generated, edits read back,
//! no input panics the parser or the MLLP codec, and any split of a frame stream decodes the same frames.

use bytes::{BufMut, BytesMut};
use hl7v2::{Batch, Message, MllpCodec};
use proptest::prelude::*;
use tokio_util::codec::Decoder;

/// Five distinct delimiter bytes, none of them CR, LF or a letter/digit.
fn delimiters() -> impl Strategy<Value = [u8; 5]> {
    let pool: Vec<u8> = b"|^~\\&#!@$%*+/:;?".to_vec();
    Just(pool)
        .prop_shuffle()
        .prop_map(|p| [p[0], p[1], p[2], p[3], p[4]])
}

/// A leaf value: bytes that are not delimiters, CR or LF (escapes are added separately).
fn leaf(d: [u8; 5]) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..8).prop_map(move |v| {
        v.into_iter()
            .filter(|b| !d.contains(b) && *b != b'\r' && *b != b'\n')
            .collect()
    })
}

type Field = Vec<Vec<Vec<Vec<u8>>>>; // repetitions > components > subcomponents

fn field(d: [u8; 5]) -> impl Strategy<Value = Field> {
    prop::collection::vec(
        prop::collection::vec(prop::collection::vec(leaf(d), 1..3), 1..4),
        1..3,
    )
}

fn encode_field(f: &Field, d: [u8; 5]) -> Vec<u8> {
    let [_, cs, rs, _, ss] = d;
    let mut out = Vec::new();
    for (i, rep) in f.iter().enumerate() {
        if i > 0 {
            out.push(rs);
        }
        for (j, comp) in rep.iter().enumerate() {
            if j > 0 {
                out.push(cs);
            }
            for (k, sub) in comp.iter().enumerate() {
                if k > 0 {
                    out.push(ss);
                }
                out.extend_from_slice(sub);
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
struct Generated {
    bytes: Vec<u8>,
    delims: [u8; 5],
    segments: Vec<(Vec<u8>, Vec<Field>)>,
}

fn message() -> impl Strategy<Value = Generated> {
    delimiters().prop_flat_map(|d| {
        let seg = (
            "[A-Z][A-Z0-9]{2}".prop_filter("not a header", |n| {
                !matches!(n.as_str(), "MSH" | "FHS" | "BHS")
            }),
            prop::collection::vec(field(d), 0..6),
        );
        (
            Just(d),
            prop::collection::vec(seg, 0..6),
            prop::sample::select(vec![&b"\r"[..], b"\n", b"\r\n"]),
            any::<bool>(),
        )
            .prop_map(|(d, segs, term, trailing)| {
                let [fs, cs, rs, es, ss] = d;
                let mut bytes = b"MSH".to_vec();
                bytes.extend_from_slice(&[fs, cs, rs, es, ss]);
                for f in ["SND", "FAC", "RCV", "RFAC", "20200101", ""] {
                    bytes.push(fs);
                    bytes.extend_from_slice(f.as_bytes());
                }
                bytes.push(fs);
                bytes.extend_from_slice(&[b'A', b'D', b'T', cs, b'A', b'0', b'1']);
                for f in ["CTRL1", "P", "2.5"] {
                    bytes.push(fs);
                    bytes.extend_from_slice(f.as_bytes());
                }
                let mut segments = Vec::new();
                for (name, fields) in segs {
                    bytes.extend_from_slice(term);
                    bytes.extend_from_slice(name.as_bytes());
                    for f in &fields {
                        bytes.push(fs);
                        bytes.extend_from_slice(&encode_field(f, d));
                    }
                    segments.push((name.into_bytes(), fields));
                }
                if trailing {
                    bytes.extend_from_slice(term);
                }
                Generated {
                    bytes,
                    delims: d,
                    segments,
                }
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn generated_messages_round_trip_and_navigate(g in message()) {
        let m = Message::parse(&g.bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(m.edit().encode(), g.bytes.clone());
        prop_assert_eq!(m.delimiters().field, g.delims[0]);
        // Segments of 3 bytes with no fields are ignored only when shorter than 3: ours are always 3+.
        prop_assert_eq!(m.segment_count(), g.segments.len() + 1);
        for (i, (name, fields)) in g.segments.iter().enumerate() {
            let seg = m.segment_at(i + 1).expect("segment present");
            prop_assert_eq!(seg.name(), &name[..]);
            for (fi, f) in fields.iter().enumerate() {
                let fv = seg.field(fi + 1).expect("field present");
                for (ri, rep) in f.iter().enumerate() {
                    let rv = fv.repetition(ri + 1).expect("rep present");
                    for (ci, comp) in rep.iter().enumerate() {
                        let cv = rv.component(ci + 1).expect("comp present");
                        for (si, sub) in comp.iter().enumerate() {
                            let sv = cv.subcomponent(si + 1).expect("sub present");
                            prop_assert_eq!(sv.raw(), &sub[..]);
                        }
                    }
                }
            }
        }
        let _ = m.flat();
    }

    #[test]
    fn edits_read_back(g in message(), value in prop::collection::vec(any::<u8>(), 0..24),
                       field in 1usize..12, rep in 1usize..3, comp in 1usize..4, sub in 1usize..3) {
        let m = Message::parse(&g.bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let name = g.segments.first().map_or("MSH".to_owned(), |s| String::from_utf8_lossy(&s.0).into_owned());
        // MSH-1/2 are the delimiters, MSH-9/12 must stay valid for the message to parse again.
        let field = match (name.as_str(), field) {
            ("MSH", 9 | 12) => field + 1,
            ("MSH", _) => field.max(3),
            _ => field,
        };
        let path = format!("{name}-{field}({rep})-{comp}-{sub}");
        let mut e = m.edit();
        e.set(&path, &value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let out = e.encode();
        let m2 = Message::parse(&out).map_err(|e| TestCaseError::fail(format!("{e}: {path}")))?;
        match m2.get_decoded(&path) {
            Some(v) => prop_assert_eq!(&*v, &value[..]),
            None => prop_assert!(value.is_empty()),
        }
        // Everything else is untouched: other segments re-encode as they were.
        prop_assert_eq!(m2.segment_count(), m.segment_count());
    }

    #[test]
    fn no_input_panics_the_parser(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        exercise(&bytes);
        let mut prefixed = b"MSH|^~\\&|".to_vec();
        prefixed.extend_from_slice(&bytes);
        exercise(&prefixed);
    }

    #[test]
    fn no_structured_input_panics_the_parser(parts in prop::collection::vec(
        prop::sample::select(vec![&b"MSH"[..], b"|", b"^", b"~", b"\\", b"&", b"\r", b"\n", b"PID", b"FHS", b"BHS",
                                  b"BTS", b"FTS", b"\\X0D\\", b"\\F\\", b"ADT", b"A01", b"2.5", b" ", b"\xEF\xBB\xBF", b"x"]),
        0..64)) {
        exercise(&parts.concat());
    }

    #[test]
    fn any_split_of_a_frame_stream_decodes_the_same(
        frames in prop::collection::vec(prop::collection::vec(any::<u8>().prop_filter("no block bytes", |b| *b != 0x0B && *b != 0x1C), 0..64), 0..6),
        noise in prop::collection::vec(prop::collection::vec(any::<u8>().prop_filter("no start block", |b| *b != 0x0B), 0..4), 6),
        cuts in prop::collection::vec(1usize..16, 1..64),
    ) {
        let mut stream = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            stream.extend_from_slice(&noise[i]);
            stream.extend_from_slice(&hl7v2::mllp::frame(f));
        }
        let whole = decode_chunks(&stream, &[stream.len().max(1)]);
        prop_assert_eq!(&whole, &frames);
        let split = decode_chunks(&stream, &cuts);
        prop_assert_eq!(&split, &frames);
    }

    #[test]
    fn no_input_panics_the_codec(bytes in prop::collection::vec(any::<u8>(), 0..512),
                                 cuts in prop::collection::vec(1usize..32, 1..32), max in 0usize..64) {
        let mut codec = MllpCodec::new(max);
        let mut buf = BytesMut::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < bytes.len() {
            let n = cuts[i % cuts.len()].min(bytes.len() - pos);
            buf.put_slice(&bytes[pos..pos + n]);
            pos += n;
            i += 1;
            loop {
                match codec.decode(&mut buf) {
                    Ok(Some(f)) => prop_assert!(f.len() <= max),
                    Ok(None) => break,
                    Err(_) => {}
                }
            }
            prop_assert!(buf.len() <= max + 2, "buffered {} past limit {}", buf.len(), max);
        }
        let _ = codec.decode_eof(&mut buf);
    }
}

/// Inputs that once crashed a fuzz target (tests/fuzz-regressions): each must now pass every check.
#[test]
fn fuzz_regressions_stay_fixed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("regressions dir") {
        let bytes = std::fs::read(entry.expect("entry").path()).expect("read");
        exercise(&bytes);
        n += 1;
    }
    assert!(n > 0);
}

fn exercise(bytes: &[u8]) {
    if let Ok(m) = Message::parse(bytes) {
        let _ = m.flat();
        let _ = m.header().version_number();
        for p in ["MSH-9-1", "PID-3(2)-4-1", "OBX(2)-5", "MSH-2", "MSH-1"] {
            let _ = m.get_decoded(p);
        }
        assert_eq!(m.edit().encode(), bytes);
    }
    let _ = Batch::parse(bytes).map(|b| (b.flat(), b.count_mismatches()));
    let _ = hl7v2::Header::salvage(bytes);
}

fn decode_chunks(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut codec = MllpCodec::default();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < stream.len() {
        let n = cuts[i % cuts.len()].min(stream.len() - pos);
        buf.put_slice(&stream[pos..pos + n]);
        pos += n;
        i += 1;
        while let Some(f) = codec.decode(&mut buf).expect("valid stream") {
            out.push(f.to_vec());
        }
    }
    out
}
