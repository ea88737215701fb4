//! MSH → MessageHeader (the first entry of a message Bundle).

use crate::FhirError;
use crate::context::{Ctx, Target};
use crate::ids::percent_encode;
use crate::json::Writer;

/// The MSH fields the maps use (the rest, when valued, are reported as unmapped).
pub(crate) const MSH_MAPPED: &[usize] = &[3, 4, 5, 6, 7, 9, 10, 11, 12, 18];

/// The MessageHeader (first entry of a message Bundle): the event, source and destination from MSH, and the
/// resources the message is about (`focus`).
pub(crate) fn message_header(
    cx: &mut Ctx<'_, '_>,
    w: &mut Writer<'_>,
    msg_key: &[&str],
    focus: &[&Target],
) -> Result<(), FhirError> {
    let t = cx.target("MessageHeader", msg_key, None);
    cx.begin_entry(w, &t);
    let trigger = cx
        .text(cx.msh(9).and_then(|f| f.component(2)))
        .ok_or(FhirError::Required("MSH-9.2"))?;
    w.object("eventCoding");
    w.string("system", "http://terminology.hl7.org/CodeSystem/v2-0003");
    w.string("code", &trigger);
    w.end_object();
    let dest_app = cx.text(cx.msh(5).and_then(|f| f.component(1)));
    if let Some(d) = &dest_app {
        w.array("destination");
        w.begin_object();
        w.string("name", d);
        let mut endpoint = "urn:hl7gw:application:".to_owned();
        percent_encode(&mut endpoint, d);
        w.string("endpoint", &endpoint);
        w.end_object();
        w.end_array();
    }
    let src = cx
        .text(cx.msh(3).and_then(|f| f.component(1)))
        .unwrap_or(std::borrow::Cow::Borrowed("unknown"));
    w.object("source");
    w.string("name", &src);
    let endpoint = cx
        .hd_system(cx.msh(3), false)
        .filter(|s| s.starts_with("urn:oid:") || s.contains("://"))
        .unwrap_or_else(|| {
            let mut e = "urn:hl7gw:application:".to_owned();
            percent_encode(&mut e, &src);
            e
        });
    w.string("endpoint", &endpoint);
    w.end_object();
    if !focus.is_empty() {
        w.array("focus");
        for f in focus {
            w.begin_object();
            w.string_parts("reference", &["urn:uuid:", &f.id]);
            w.end_object();
        }
        w.end_array();
    }
    cx.end_entry(w, &t);
    Ok(())
}
