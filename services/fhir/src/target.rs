//! A resource's place in the Bundle (its derived id, the business identifier a transaction updates by, how it
//! is written), and a Reference to it.

use crate::Write;
use crate::ids::Uuid;
use crate::json::Writer;

/// A resource's place in the Bundle: its id and how a transaction writes it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub rtype: &'static str,
    /// A UUID derived from the business key: the same message always gives the same one.
    pub id: Uuid,
    /// The business identifier (system, value) a transaction updates by, when there is one.
    pub by: Option<(String, String)>,
    /// With `by`: the code (system, if the coding has one, and code) the condition also names, for resources
    /// one identifier does not single out (several tests under one order number, several observations under
    /// one instance id).
    pub code: Option<(Option<String>, String)>,
    /// True when an earlier entry of the Bundle updates by the same condition: this one is updated by its
    /// derived id and does not carry that business identifier (the field is reported as unmapped), so the
    /// condition never matches more than one resource.
    pub repeat: bool,
    /// How a transaction writes it.
    pub write: Write,
}

/// A Reference under `key` to the entry of `t` (its `urn:uuid:` fullUrl).
pub(crate) fn reference(w: &mut Writer<'_>, key: &str, t: &Target) {
    w.object(key);
    w.string_parts("reference", &["urn:uuid:", &t.id]);
    w.end_object();
}

/// An array of References under `key` to the entries of `targets`; nothing when there are none.
pub(crate) fn references(w: &mut Writer<'_>, key: &str, targets: &[&Target]) {
    if targets.is_empty() {
        return;
    }
    w.array(key);
    for t in targets {
        w.begin_object();
        w.string_parts("reference", &["urn:uuid:", &t.id]);
        w.end_object();
    }
    w.end_array();
}
