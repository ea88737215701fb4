//! MDM messages of the MDM_T02 structure (T02, T04, T06, T08, T10: a document's notification with its
//! content), after the IG's MDM_T02 map: PID → Patient, PV1 → Encounter, TXA + OBX (+ NTE) →
//! DocumentReference, TXA-9/10 (and TXA-5, TXA-22) → Practitioner, EVN → the Provenance's event.
//!
//! The content (OBX[DocumentReference], by OBX-2): ED → an attachment with the data in base64 (ED-4 Base64 as
//! sent, Hex re-encoded, text encoded) and the type of ED-2/ED-3; RP → an attachment by `url` (RP-1); TX, ST
//! and FT lines → one text/plain attachment (the lines in order, FT formatting made plain). NTE after an OBX
//! (NTE[DocumentReference]) → a text/plain attachment of its own.
//!
//! The conditional update: DocumentReference by its unique document number (TXA-12), else its file name
//! (TXA-16); without either, an id derived from the message.

use super::Converted;
use crate::FhirError;
use crate::bundle::Entries;
use crate::context::{Ctx, Target, reference, references};
use crate::datatypes::cwe::Table;
use crate::datatypes::cx::ei_key;
use crate::datatypes::xcn::{Person, practitioner_target};
use crate::ids::is_oid;
use crate::json::Writer;
use crate::messages::common::{encounter_entry, required};
use crate::segments::msh::MSH_MAPPED;
use crate::segments::obx::plain_text;
use crate::segments::pid::{patient_body, patient_target};
use crate::segments::pv1::Visit;
use crate::segments::write_items;
use hl7v2::message::{Segment, Value};

/// The TXA fields the TXA[DocumentReference] map writes (with TXA-4, TXA-5 and TXA-22, see [`txa_body`]).
const TXA_MAPPED: &[usize] = &[2, 3, 4, 5, 6, 9, 10, 12, 16, 17, 18, 19, 22, 25];

/// One attachment of the document.
#[derive(Debug)]
enum Content {
    /// Base64 data and its MIME type.
    Data { content_type: String, data: String },
    /// ED with no data: the type alone.
    Typed { content_type: String },
    /// A reference pointer.
    Url {
        url: String,
        content_type: Option<String>,
    },
}

pub(crate) fn convert(cx: &mut Ctx<'_, '_>, kind: &str, out: &mut Vec<u8>) -> Converted {
    let msg = cx.msg;
    let pid = required(cx, kind, "PID")?;
    let txa = required(cx, kind, "TXA")?;
    let key = cx.message_key();
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();

    // The content, in message order: ED/RP each an attachment, the text lines one.
    let mut contents: Vec<Content> = Vec::new();
    let mut text: Vec<String> = Vec::new();
    let mut text_at: Option<usize> = None;
    let mut evn = None;
    let mut after_obx = false;
    // The first PID, PV1 and TXA are the document's; a second one is reported.
    let (mut pid_seen, mut pv1_seen, mut txa_seen) = (false, false, false);
    for seg in msg.segments() {
        match seg.name() {
            b"MSH" => cx.note_unmapped(&seg, MSH_MAPPED),
            b"PID" if !pid_seen => pid_seen = true,
            b"PV1" if !pv1_seen => pv1_seen = true,
            b"TXA" if !txa_seen => txa_seen = true,
            b"EVN" => evn = Some(seg),
            b"OBX" => {
                after_obx = true;
                let mut mapped = vec![2];
                match obx_content(cx, &seg) {
                    Some(Ok(c)) => {
                        contents.push(c);
                        mapped.push(5);
                    }
                    Some(Err(lines)) => {
                        if text_at.is_none() {
                            text_at = Some(contents.len());
                        }
                        text.extend(lines);
                        mapped.push(5);
                    }
                    None => {}
                }
                cx.note_unmapped(&seg, &mapped);
            }
            b"NTE" if after_obx => {
                let lines: Vec<String> = cx
                    .reps(&seg, 3)
                    .into_iter()
                    .filter_map(|r| cx.text(Some(r)).map(|t| t.into_owned()))
                    .collect();
                if lines.is_empty() {
                    cx.note_unmapped(&seg, &[]);
                } else {
                    contents.push(Content::Data {
                        content_type: "text/plain; charset=utf-8".to_owned(),
                        data: base64(lines.join("\n").as_bytes()),
                    });
                    cx.note_unmapped(&seg, &[1, 3]);
                }
            }
            // ORC, OBR, TQ1 and their NTE (the IG's ServiceRequest of the document), CON...
            _ => cx.note_unmapped_segment(&seg),
        }
    }
    if let Some(at) = text_at {
        contents.insert(
            at,
            Content::Data {
                content_type: "text/plain; charset=utf-8".to_owned(),
                data: base64(text.join("\n").as_bytes()),
            },
        );
    }
    if contents.is_empty() {
        // DocumentReference.content (1..*): a document notification without its document.
        return Err(FhirError::Required("OBX-5 (the document's content)"));
    }

    let patient = patient_target(cx, &pid, &msg_key);
    // The MDM map has no PV2: a PV2 is reported with the other segments.
    let (visit, mut practitioners) = Visit::of(cx, msg.segment("PV1", 1), None, Some(&patient));
    for n in [9, 5, 10, 22] {
        practitioners.add_xcn_field(cx, &txa, n);
    }
    let doc = document_target(cx, &txa, &msg_key);

    let mut b = Entries::open(cx, out, &key, || vec![&patient, &doc])?;
    b.segment(cx, &patient, &pid, |cx, w| patient_body(cx, w, &pid));
    practitioners.write(cx, &mut b);
    encounter_entry(cx, &mut b, None, &visit, &patient);
    b.segment(cx, &doc, &txa, |cx, w| {
        txa_body(cx, w, &txa, &patient, visit.encounter.as_ref(), &contents);
        TXA_MAPPED
    });
    Ok(b.finish(cx, &msg_key, evn.as_ref()))
}

/// The DocumentReference: by TXA-12, else TXA-16, else the message.
fn document_target(cx: &Ctx<'_, '_>, txa: &Segment<'_>, msg_key: &[&str]) -> Target {
    match document_number(cx, txa).or_else(|| file_name(cx, txa)) {
        Some((s, v)) => cx.target("DocumentReference", &[&s, &v], Some((s.clone(), v.clone()))),
        None => cx.target("DocumentReference", msg_key, None),
    }
}

/// TXA-12 (EI) as (system, value): an OID with no authority is itself the identifier (`urn:ietf:rfc:3986`).
fn document_number(cx: &Ctx<'_, '_>, txa: &Segment<'_>) -> Option<(String, String)> {
    let ei = txa.field(12).and_then(|f| f.repetition(1))?;
    let value = cx.comp(ei, 1)?;
    let authority = [2, 3].iter().any(|&n| cx.comp(ei, n).is_some());
    if !authority && is_oid(&value) {
        return Some(("urn:ietf:rfc:3986".to_owned(), format!("urn:oid:{value}")));
    }
    ei_key(cx, ei, false)
}

/// TXA-16 (ST) as an identifier of the sender's application.
fn file_name(cx: &Ctx<'_, '_>, txa: &Segment<'_>) -> Option<(String, String)> {
    let name = cx.field(txa, 16)?;
    let system = cx
        .hd_system(cx.msh(3), false)
        .map(|s| format!("{s}:document-file"))
        .unwrap_or_else(|| "urn:hl7gw:id:document-file".to_owned());
    Some((system, name.into_owned()))
}

/// OBX-5 of an MDM by OBX-2: an attachment (ED, RP), text lines (`Err`: TX, ST, FT), or nothing (another
/// type, or no value: OBX-5 is then reported).
fn obx_content(cx: &Ctx<'_, '_>, obx: &Segment<'_>) -> Option<Result<Content, Vec<String>>> {
    let ty = cx.field(obx, 2)?;
    let value = obx.field(5)?;
    let reps: Vec<Value<'_>> = value.repetitions().filter(|r| !r.is_empty()).collect();
    let first = *reps.first()?;
    match ty.as_ref() {
        "ED" => ed_content(cx, first).map(Ok),
        "RP" => {
            let url = cx
                .comp(first, 1)
                .filter(|u| !u.contains(char::is_whitespace))?;
            Some(Ok(Content::Url {
                url: url.into_owned(),
                content_type: mime(cx.comp(first, 3).as_deref(), cx.comp(first, 4).as_deref()),
            }))
        }
        "TX" | "ST" | "FT" => {
            let esc = char::from(cx.msg.delimiters().escape);
            let lines: Vec<String> = reps
                .iter()
                .filter_map(|r| cx.text(Some(*r)))
                .map(|t| match ty.as_ref() {
                    "ST" => t.into_owned(),
                    _ => plain_text(&t, esc),
                })
                .collect();
            (!lines.is_empty()).then_some(Err(lines))
        }
        _ => None,
    }
}

/// ED (source, type, subtype, encoding, data) → an attachment.
fn ed_content(cx: &Ctx<'_, '_>, ed: Value<'_>) -> Option<Content> {
    let content_type = mime(cx.comp(ed, 2).as_deref(), cx.comp(ed, 3).as_deref());
    let data = cx.comp(ed, 5);
    let encoding = cx.comp(ed, 4).unwrap_or_default();
    let Some(data) = data else {
        return content_type.map(|content_type| Content::Typed { content_type });
    };
    let data = match encoding.to_ascii_uppercase().as_str() {
        "BASE64" => {
            let d: String = data.chars().filter(|c| !c.is_whitespace()).collect();
            is_base64(&d).then_some(d)?
        }
        "HEX" => base64(&hex(&data)?),
        // A (ASCII) or none: the text itself.
        _ => base64(data.as_bytes()),
    };
    Some(Content::Data {
        content_type: content_type.unwrap_or_else(|| "application/octet-stream".to_owned()),
        data,
    })
}

/// A MIME type from v2's type of data (HL7 table 0191) and subtype (table 0291, or a MIME subtype).
fn mime(ty: Option<&str>, subtype: Option<&str>) -> Option<String> {
    let ty = ty?.trim();
    if ty.contains('/') {
        return valid_mime(&ty.to_ascii_lowercase());
    }
    let major = match ty.to_ascii_uppercase().as_str() {
        "AP" | "APPLICATION" => "application",
        "IM" | "IMAGE" => "image",
        "AU" | "AUDIO" => "audio",
        "TEXT" | "TX" | "FT" => "text",
        "VIDEO" => "video",
        "MULTIPART" => "multipart",
        _ => return None,
    };
    let sub = match subtype.map(str::trim).map(str::to_ascii_lowercase) {
        Some(s) if !s.is_empty() => match s.as_str() {
            "octet-stream" | "octet_stream" => "octet-stream".to_owned(),
            "tiff" | "tif" => "tiff".to_owned(),
            "jpg" => "jpeg".to_owned(),
            "x-hl7-cda-level-one" => "x-hl7-cda-level-one+xml".to_owned(),
            _ => s,
        },
        _ if major == "text" => "plain".to_owned(),
        _ => "octet-stream".to_owned(),
    };
    valid_mime(&format!("{major}/{sub}"))
}

/// The type when it has the form of a MIME type (`major/sub`, token characters).
fn valid_mime(m: &str) -> Option<String> {
    let (a, b) = m.split_once('/')?;
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&c))
    };
    (token(a) && token(b)).then(|| m.to_owned())
}

fn is_base64(s: &str) -> bool {
    !s.is_empty()
        && s.len().is_multiple_of(4)
        && s.trim_end_matches('=')
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
        && s.len() - s.trim_end_matches('=').len() <= 2
}

fn hex(s: &str) -> Option<Vec<u8>> {
    let s: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|p| {
            let d = |c: u8| char::from(c).to_digit(16);
            Some((d(p[0])? * 16 + d(p[1])?) as u8)
        })
        .collect()
}

/// Standard base64 with padding.
pub(crate) fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// TXA-17 (HL7 table 0271) → DocumentReference.docStatus: the IG gives no concept map; ours: authenticated
/// and legally authenticated are final, the stages before them preliminary.
fn doc_status(code: &str) -> Option<&'static str> {
    Some(match code {
        "AU" | "LA" => "final",
        "DI" | "DO" | "IN" | "IP" | "PA" => "preliminary",
        _ => return None,
    })
}

/// TXA-19 (HL7 table 0273) → DocumentReference.status (1..1): AV current (the IG), OB superseded, CA
/// entered-in-error, UN current; empty → current (the document was just sent).
fn availability(code: Option<&str>) -> Option<&'static str> {
    Some(match code {
        None | Some("AV") | Some("UN") => "current",
        Some("OB") => "superseded",
        Some("CA") => "entered-in-error",
        Some(_) => return None,
    })
}

/// The TXA[DocumentReference] map and the content.
fn txa_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    txa: &Segment<'_>,
    patient: &Target,
    encounter: Option<&Target>,
    contents: &[Content],
) {
    if let Some((s, v)) = document_number(cx, txa) {
        w.object("masterIdentifier");
        w.string("system", &s);
        w.string("value", &v);
        w.end_object();
    }
    if let Some((s, v)) = file_name(cx, txa) {
        w.array("identifier");
        w.begin_object();
        w.string("system", &s);
        w.string("value", &v);
        w.end_object();
        w.end_array();
    }
    let id = |n: usize| {
        txa.field(n)
            .and_then(|f| f.repetition(1))
            .and_then(|v| cx.comp(v, 1))
    };
    let avail = id(19);
    let status = match availability(avail.as_deref()) {
        Some(s) => s,
        None => {
            cx.dropped(txa, 19);
            "current"
        }
    };
    w.string("status", status);
    match id(17).as_deref().map(doc_status) {
        Some(Some(s)) => w.string("docStatus", s),
        Some(None) => cx.dropped(txa, 17),
        None => {}
    }
    cx.codeable_concept(w, "type", txa.field(2).and_then(|f| f.repetition(1)), None);
    reference(w, "subject", patient);
    // date (instant): TXA-6 (origination), else TXA-4 (activity).
    let origination = cx.field(txa, 6).and_then(|d| cx.instant(&d));
    let activity = cx.field(txa, 4).and_then(|d| cx.instant(&d));
    match (&origination, &activity) {
        (Some(d), _) => {
            w.string("date", d);
            cx.dropped(txa, 4);
        }
        (None, Some(d)) => {
            w.string("date", d);
            cx.dropped(txa, 6);
        }
        (None, None) => {
            cx.dropped(txa, 6);
            cx.dropped(txa, 4);
        }
    }
    // author: TXA-9 (originator), TXA-5 (primary activity provider).
    let mut authors: Vec<Target> = Vec::new();
    let mut author_ids = std::collections::HashSet::new();
    for n in [9, 5] {
        for x in cx.reps(txa, n) {
            match practitioner_target(cx, Person::Xcn(x)) {
                Some(t) if author_ids.insert(t.id) => authors.push(t),
                Some(_) => {}
                None => cx.dropped(txa, n),
            }
        }
    }
    references(w, "author", &authors.iter().collect::<Vec<_>>());
    // authenticator (0..1): TXA-10, else the first of TXA-22 (authentication person).
    let authenticators: Vec<(usize, Target)> = [10, 22]
        .iter()
        .flat_map(|&n| cx.reps(txa, n).into_iter().map(move |x| (n, x)))
        .filter_map(|(n, x)| practitioner_target(cx, Person::Xcn(x)).map(|t| (n, t)))
        .collect();
    if let Some((n, t)) = authenticators.first() {
        reference(w, "authenticator", t);
        for (m, _) in authenticators.iter().skip(1) {
            if m != n || *m == 10 {
                cx.dropped(txa, *m);
            }
        }
    } else {
        cx.dropped(txa, 10);
        cx.dropped(txa, 22);
    }
    if let Some(d) = cx.field(txa, 25) {
        w.string("description", &d);
    }
    let labels = cx.reps(txa, 18);
    write_items(w, "securityLabel", &labels, |w, v| {
        cx.codeable_concept_item(
            w,
            *v,
            Some(Table::new("DocumentConfidentialityStatus", "HL70272")),
        )
    });
    // TXA-3: how the content is presented; the text content says it in its MIME type.
    if let Some(p) = id(3)
        && !matches!(p.as_ref(), "TX" | "FT" | "ST" | "AP" | "multipart")
    {
        cx.dropped(txa, 3);
    }
    w.array("content");
    for c in contents {
        w.begin_object();
        w.object("attachment");
        match c {
            Content::Data { content_type, data } => {
                w.string("contentType", content_type);
                w.string("data", data);
            }
            Content::Typed { content_type } => w.string("contentType", content_type),
            Content::Url { url, content_type } => {
                if let Some(t) = content_type {
                    w.string("contentType", t);
                }
                w.string("url", url);
            }
        }
        w.end_object();
        w.end_object();
    }
    w.end_array();
    if let Some(e) = encounter {
        w.object("context");
        w.array("encounter");
        w.begin_object();
        w.string_parts("reference", &["urn:uuid:", &e.id]);
        w.end_object();
        w.end_array();
        w.end_object();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_mime_types() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(
            mime(Some("application"), Some("pdf")).as_deref(),
            Some("application/pdf")
        );
        assert_eq!(
            mime(Some("AP"), Some("PDF")).as_deref(),
            Some("application/pdf")
        );
        assert_eq!(mime(Some("TEXT"), None).as_deref(), Some("text/plain"));
        assert_eq!(mime(Some("XX"), Some("pdf")), None);
        assert!(is_base64("JVBERi0xLjQK"));
        assert!(!is_base64("JVBERi0xLjQ"));
        assert_eq!(hex("4142").as_deref(), Some(&b"AB"[..]));
    }
}
