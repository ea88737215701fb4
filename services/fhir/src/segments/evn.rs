//! EVN → the Provenance of the transformation (and of the event).

use crate::context::Ctx;
use crate::datatypes::cwe::Table;
use crate::ids::Uuid;
use crate::json::Writer;
use hl7v2::message::Segment;

/// EVN fields the Provenance maps (EVN-1, EVN-2, EVN-4, EVN-6); the others are reported unmapped.
pub(crate) const EVN_MAPPED: &[usize] = &[1, 2, 4, 6];

pub(crate) fn provenance_body(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    targets: &[Uuid],
    evn: Option<&Segment<'_>>,
    timestamp: Option<&str>,
) {
    w.array("target");
    for t in targets {
        w.begin_object();
        w.string_parts("reference", &["urn:uuid:", t]);
        w.end_object();
    }
    w.end_array();
    if let Some(evn) = evn {
        let occurred = cx
            .field(evn, 6)
            .or_else(|| cx.field(evn, 2))
            .and_then(|d| cx.date_time(&d));
        if let Some(o) = occurred {
            w.string("occurredDateTime", &o);
        }
    }
    // recorded (1..1, instant): when the message was written (MSH-7 with an offset) or received.
    let recorded = evn
        .and_then(|e| cx.field(e, 2))
        .and_then(|d| cx.instant(&d))
        .or_else(|| timestamp.map(str::to_owned))
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_owned());
    w.string("recorded", &recorded);
    if let Some(reason) = evn.and_then(|e| cx.rep1(e, 4))
        && cx.cwe_valued(reason)
    {
        w.array("reason");
        cx.codeable_concept_item(w, reason, Some(Table::new("EventReason", "HL70062")));
        w.end_array();
    }
    w.object("activity");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/v3-DataOperation",
    );
    w.string("code", "UPDATE");
    w.end_object();
    w.end_array();
    w.string(
        "text",
        "HL7 v2 message converted to FHIR by hl7gw (v2-to-FHIR IG maps)",
    );
    w.end_object();
    w.array("agent");
    w.begin_object();
    w.object("type");
    w.array("coding");
    w.begin_object();
    w.string(
        "system",
        "http://terminology.hl7.org/CodeSystem/provenance-participant-type",
    );
    w.string("code", "assembler");
    w.end_object();
    w.end_array();
    w.end_object();
    w.object("who");
    w.string("display", "hl7gw");
    w.end_object();
    w.end_object();
    w.end_array();
}
