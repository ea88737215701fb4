//! The Bundle's frame: its opening (id, identifier, type, timestamp, and the MessageHeader of a message
//! Bundle), the entry writer every message map shares ([`Entries`]), references between its entries,
//! conditional updates kept unique, and its end with the Provenance.

use crate::context::{Ctx, Target};
use crate::ids::{Uuid, uuid_of};
use crate::json::Writer;
use crate::segments::evn::{EVN_MAPPED, provenance_body};
use crate::segments::msh::message_header;
use crate::{BundleType, FhirError, Outcome, Unmapped};
use hl7v2::message::Segment;
use std::collections::HashSet;

/// An open Bundle: its timestamp, and where its `entry` array starts (dropped if it stays empty).
#[derive(Debug)]
struct Frame {
    timestamp: Option<String>,
    entries_at: usize,
}

/// Opens the Bundle: its id and identifier (the message's), type, timestamp (MSH-7 with an offset, else when
/// the gateway received the message), and the `entry` array.
fn begin_bundle(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, key: &[String; 3]) -> Frame {
    let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();
    w.begin_object();
    w.string("resourceType", "Bundle");
    let bundle_id = uuid_of("Bundle", &msg_key);
    w.string("id", &bundle_id);
    w.object("identifier");
    if let Some(system) = cx.hd_system(cx.msh(3), false) {
        w.string("system", &system);
    }
    w.string("value", &key[2]);
    w.end_object();
    w.string(
        "type",
        match cx.opts.bundle_type {
            BundleType::Transaction => "transaction",
            BundleType::Message => "message",
        },
    );
    let msh7 = cx.text(cx.msh(7));
    let timestamp = msh7
        .as_deref()
        .and_then(|t| cx.instant(t))
        .or_else(|| cx.received_at.map(str::to_owned));
    if let Some(ts) = &timestamp {
        w.string("timestamp", ts);
    }
    let entries_at = w.len();
    w.array("entry");
    Frame {
        timestamp,
        entries_at,
    }
}

/// The entry writer every message map shares: an open Bundle, and the fullUrl of every entry written into
/// it (the Provenance's targets), so each entry is opened, closed and counted alike.
#[derive(Debug)]
pub(crate) struct Entries<'o> {
    pub w: Writer<'o>,
    pub targets: Vec<Uuid>,
    frame: Frame,
}

impl<'o> Entries<'o> {
    /// Opens the Bundle in `out` ([`begin_bundle`]) and, in a message Bundle, writes the MessageHeader about
    /// `focus` (worked out only then) as its first entry.
    pub fn open<'t>(
        cx: &mut Ctx<'_, '_>,
        out: &'o mut Vec<u8>,
        key: &[String; 3],
        focus: impl FnOnce() -> Vec<&'t Target>,
    ) -> Result<Self, FhirError> {
        let mut w = Writer::new(out);
        let frame = begin_bundle(cx, &mut w, key);
        if cx.opts.bundle_type == BundleType::Message {
            let msg_key: Vec<&str> = key.iter().map(String::as_str).collect();
            message_header(cx, &mut w, &msg_key, &focus())?;
        }
        Ok(Self {
            w,
            targets: Vec::new(),
            frame,
        })
    }

    /// Writes `t` as an entry, its elements by `body`, and counts it among the Provenance's targets. Returns
    /// what `body` returns.
    pub fn entry<'a, 'm, R>(
        &mut self,
        cx: &mut Ctx<'a, 'm>,
        t: &Target,
        body: impl FnOnce(&Ctx<'a, 'm>, &mut Writer<'o>) -> R,
    ) -> R {
        cx.begin_entry(&mut self.w, t);
        let r = body(cx, &mut self.w);
        cx.end_entry(&mut self.w, t);
        self.targets.push(t.id);
        r
    }

    /// [`Entries::entry`] for the resource of a segment `seg`: `body` returns the fields of `seg` it mapped,
    /// and the others are reported.
    pub fn segment<'a, 'm, M: std::ops::Deref<Target = [usize]>>(
        &mut self,
        cx: &mut Ctx<'a, 'm>,
        t: &Target,
        seg: &Segment<'a>,
        body: impl FnOnce(&Ctx<'a, 'm>, &mut Writer<'o>) -> M,
    ) {
        let mapped = self.entry(cx, t, body);
        cx.note_unmapped(seg, &mapped);
    }

    /// The Bundle's last entry, the Provenance of this conversion (its targets: the resources written, and
    /// the event of EVN when there is one; none when nothing was written), then the Bundle's end.
    pub fn finish<'a>(
        mut self,
        cx: &mut Ctx<'a, '_>,
        msg_key: &[&str],
        evn: Option<&Segment<'a>>,
    ) -> Outcome {
        if !self.targets.is_empty() {
            let prov = cx.target("Provenance", msg_key, None);
            cx.begin_entry(&mut self.w, &prov);
            provenance_body(
                cx,
                &mut self.w,
                &self.targets,
                evn,
                self.frame.timestamp.as_deref(),
            );
            cx.end_entry(&mut self.w, &prov);
        }
        if let Some(evn) = evn {
            cx.note_unmapped(evn, EVN_MAPPED);
        }
        end_bundle(cx, &mut self.w, &self.frame)
    }
}

/// Closes the `entry` array and the Bundle (with what no map covered, and its values, in `meta` when the
/// route keeps them), and says what was converted.
fn end_bundle(cx: &mut Ctx<'_, '_>, w: &mut Writer<'_>, frame: &Frame) -> Outcome {
    cx.report_unwritten_field_maps();
    cx.take_dropped();
    w.end_array();
    // Resources only referenced (write: reference): their references name the condition.
    for (id, condition) in std::mem::take(&mut cx.conditional_refs) {
        w.replace_references(frame.entries_at, &format!("urn:uuid:{id}"), &condition);
    }
    if cx.resources == 0 {
        // FHIR has no empty arrays.
        w.truncate(frame.entries_at, true);
    }
    if cx.opts.unmapped == Unmapped::Extension && !cx.unmapped_values.is_empty() {
        w.object("meta");
        w.array("extension");
        for (id, value) in &cx.unmapped_values {
            w.begin_object();
            w.string("url", "https://hl7gw.io/fhir/StructureDefinition/unmapped");
            w.string_parts("valueString", &[id, "=", value]);
            w.end_object();
        }
        w.end_array();
        w.end_object();
    }
    w.end_object();
    Outcome {
        resources: cx.resources,
        unmapped: std::mem::take(&mut cx.unmapped),
    }
}

/// The conditional updates of one Bundle: a condition (business identifier, and code when it names one) two
/// resources of the message share is used for the first only; the others get an id derived from it and their
/// position (a transaction may not hold the same conditional update twice) and are marked
/// [`Target::repeat`]: they do not carry the identifier, so the first one's condition matches it alone, in
/// this message and in later ones.
#[derive(Debug, Default)]
pub(crate) struct Unique {
    seen: HashSet<String>,
    ids: HashSet<Uuid>,
}

impl Unique {
    /// `t`, or (its condition already used) a target by id derived from it and `position`; a target by id
    /// whose id an earlier one has (a code-less order number, see `coded_target`) gets one derived from it
    /// and `position`.
    pub fn check(&mut self, cx: &Ctx<'_, '_>, t: Target, position: &str) -> Target {
        let Some((s, v)) = &t.by else {
            if self.ids.insert(t.id) {
                return t;
            }
            let mut r = cx.target(t.rtype, &[&t.id, position], None);
            self.ids.insert(r.id);
            r.repeat = t.repeat;
            return r;
        };
        let (cs, cc) = t.code.as_ref().map_or(("", ""), |(cs, cc)| {
            (cs.as_deref().unwrap_or_default(), cc.as_str())
        });
        // Unit separators: no system, value or code holds one.
        if self
            .seen
            .insert(format!("{}\u{1f}{s}\u{1f}{v}\u{1f}{cs}\u{1f}{cc}", t.rtype))
        {
            return t;
        }
        let mut r = match &t.code {
            Some(_) => cx.target(t.rtype, &[s, v, cs, cc, position], None),
            None => cx.target(t.rtype, &[s, v, position], None),
        };
        r.repeat = true;
        r
    }
}
