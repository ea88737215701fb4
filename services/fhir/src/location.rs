//! A Location of a PL (one level: facility, building, ward, room, bed), kept until the end of the Bundle and
//! written there once.

use crate::ids::Uuid;
use crate::json::Writer;
use crate::target::Target;

/// A location-physical-type code and its display.
pub(crate) type PhysicalType = (&'static str, &'static str);

/// One Location of a PL.
#[derive(Debug, Clone)]
pub(crate) struct PlLocation {
    pub target: Target,
    pub name: String,
    pub physical_type: Option<PhysicalType>,
    pub part_of: Option<Uuid>,
    /// PL-9, on the most specific level.
    pub description: Option<String>,
}

/// The Location's elements.
pub(crate) fn location_body(w: &mut Writer<'_>, l: &PlLocation) {
    w.string("name", &l.name);
    if let Some(d) = &l.description {
        w.string("description", d);
    }
    w.string("mode", "instance");
    if let Some((code, display)) = l.physical_type {
        w.object("physicalType");
        w.array("coding");
        w.begin_object();
        w.string(
            "system",
            "http://terminology.hl7.org/CodeSystem/location-physical-type",
        );
        w.string("code", code);
        w.string("display", display);
        w.end_object();
        w.end_array();
        w.end_object();
    }
    if let Some(p) = &l.part_of {
        w.object("partOf");
        w.string_parts("reference", &["urn:uuid:", p]);
        w.end_object();
    }
}
