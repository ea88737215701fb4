//! What the VXU and SIU maps share beyond `common`: Organizations named by a CWE, and conditional updates
//! kept unique within a Bundle.

use crate::context::{Ctx, Target};
use crate::ids::Uuid;
use crate::json::Writer;
use hl7v2::message::Value;
use std::collections::HashSet;

/// A CWE naming an organization (RXA-17, a manufacturer): its identifier (CWE-1 in the coding system
/// CWE-3 names, as `MVX`) and its name (CWE-2, else CWE-1).
#[derive(Debug, Clone)]
pub(crate) struct Org {
    pub target: Target,
    pub identifier: Option<(String, String)>,
    pub name: Option<String>,
}

/// The Organization of a CWE, if it has a code or a text.
pub(crate) fn organization(cx: &Ctx<'_, '_>, cwe: Value<'_>) -> Option<Org> {
    let code = cx.comp(cwe, 1);
    let name = cx
        .comp(cwe, 2)
        .or_else(|| code.clone())
        .map(|n| n.into_owned());
    let system = cx.comp(cwe, 3).and_then(|s| cx.coding_system(&s));
    let identifier = match (&system, &code) {
        (Some(s), Some(c)) => Some((s.clone(), c.to_string())),
        _ => None,
    };
    let target = match &identifier {
        Some((s, v)) => cx.target("Organization", &[s, v], Some((s.clone(), v.clone()))),
        None => cx.target(
            "Organization",
            &[code.as_deref().unwrap_or_default(), name.as_deref()?],
            None,
        ),
    };
    Some(Org {
        target,
        identifier,
        name,
    })
}

/// Writes an Organization entry.
pub(crate) fn organization_entry(cx: &mut Ctx<'_, '_>, w: &mut Writer<'_>, org: &Org) {
    cx.begin_entry(w, &org.target);
    if let Some((system, value)) = &org.identifier {
        w.array("identifier");
        w.begin_object();
        w.string("system", system);
        w.string("value", value);
        w.end_object();
        w.end_array();
    }
    if let Some(n) = &org.name {
        w.string("name", n);
    }
    cx.end_entry(w, &org.target);
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
