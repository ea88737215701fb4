//! PL (person location) → Locations, as the IG's PL[Location] map says: one Location per level the PL names
//! (facility, building, floor, point of care, room, bed), each `partOf` the next level above it, the most
//! specific one the place the Encounter references; and the PL's display text.

use crate::context::Ctx;
use crate::datatypes::components;
use crate::location::{PhysicalType, PlLocation};
use hl7v2::message::Value;
use std::borrow::Cow;

impl<'a, 'm> Ctx<'a, 'm> {
    /// PL → a location's display text: point of care, room, bed, facility, building, floor.
    pub fn location_text(&self, pl: Value<'a>) -> Option<String> {
        let c = components::<8>(pl);
        let mut parts: Vec<Cow<'_, str>> = [1, 2, 3]
            .iter()
            .filter_map(|&n| self.text(c[n - 1]))
            .collect();
        parts.extend(self.text(c[3].and_then(|c| c.subcomponent(1))));
        parts.extend([7, 8].iter().filter_map(|&n| self.text(c[n - 1])));
        (!parts.is_empty()).then(|| parts.join(" "))
    }
}

/// A level of a PL: its component (and that number as text, a part of the derived ids), the R4
/// location-physical-type code and display (none for a point of care: the IG leaves it open).
const LEVELS: &[(usize, &str, Option<PhysicalType>)] = &[
    (4, "4", Some(("si", "Site"))),
    (7, "7", Some(("bu", "Building"))),
    (8, "8", Some(("lvl", "Level"))),
    (1, "1", None),
    (2, "2", Some(("ro", "Room"))),
    (3, "3", Some(("bd", "Bed"))),
];

/// The Locations of a PL, the facility first and the most specific last. Each level's id derives from the
/// levels above it and itself (room `101` of ward `W4` is not room `101` of ward `W5`), and, without a facility,
/// the sender's namespace, so the same place is one Location in every message of a sender.
pub(crate) fn pl_locations<'a>(cx: &Ctx<'a, '_>, pl: Value<'a>) -> Vec<PlLocation> {
    let comps = components::<9>(pl);
    let names: [Option<Cow<'a, str>>; 6] = std::array::from_fn(|i| {
        let n = LEVELS[i].0;
        cx.text(comps[n - 1].and_then(|c| c.subcomponent(1)))
    });
    // The derived id's key: each level above and this one, as (component number, name) pairs; under the
    // sender's namespace when the PL names no facility (two hospitals' ward `W5` are two places).
    let scope = if names[0].is_none() {
        cx.sender_scope()
    } else {
        None
    };
    let mut key: [&str; 14] = [""; 14];
    let mut at = 0;
    if let Some(scope) = scope {
        key[0] = "scope";
        key[1] = scope;
        at = 2;
    }
    let mut out: Vec<PlLocation> = Vec::with_capacity(LEVELS.len());
    for (&(_, label, physical_type), name) in LEVELS.iter().zip(&names) {
        let Some(name) = name else {
            continue;
        };
        key[at] = label;
        key[at + 1] = name;
        at += 2;
        let target = cx.target("Location", &key[..at], None);
        let part_of = out.last().map(|p| p.target.id);
        out.push(PlLocation {
            target,
            name: name.to_string(),
            physical_type,
            part_of,
            description: None,
        });
    }
    if let Some(last) = out.last_mut() {
        last.description = cx.text(comps[8]).map(Cow::into_owned);
    }
    out
}
