//! HD (hierarchic designator) → an identifier system URI: OID, UUID, URI, or a namespace id through the
//! route's `identifier_systems`.

use crate::context::Ctx;
use crate::datatypes::first_n;
use crate::ids::{is_oid, percent_encode};
use hl7v2::message::Value;
use std::borrow::Cow;

impl<'a, 'm> Ctx<'a, 'm> {
    /// The system of an assigning authority (HD): an OID or UUID as a URN, a URI as itself, a namespace id
    /// through `identifier_systems`, else the configured prefix and the namespace id.
    pub fn hd_system(&self, hd: Option<Value<'a>>, sub: bool) -> Option<String> {
        let hd = hd?;
        let p: [Option<Value<'a>>; 3] = if sub {
            first_n(hd.subcomponents())
        } else {
            first_n(hd.components())
        };
        self.hd_system_of(self.text(p[0]), self.text(p[1]), self.text(p[2]))
    }

    /// The system of an assigning authority given as its parts: namespace id, universal id and its type (HD,
    /// or CNN-9..11 and EI-2..4, which spell an HD out).
    pub fn hd_system_of(
        &self,
        ns: Option<Cow<'a, str>>,
        uid: Option<Cow<'a, str>>,
        kind: Option<Cow<'a, str>>,
    ) -> Option<String> {
        if let (Some(uid), Some(kind)) = (&uid, &kind) {
            match kind.as_ref() {
                "ISO" if is_oid(uid) => return Some(format!("urn:oid:{uid}")),
                "UUID" => return Some(format!("urn:uuid:{uid}")),
                "URI" | "URL" => return Some(uid.to_string()),
                _ => {}
            }
        }
        let ns = ns.or(uid)?;
        if let Some(s) = self.opts.identifier_systems.get(ns.as_ref()) {
            return Some(s.clone());
        }
        let prefix = self
            .opts
            .identifier_system_prefix
            .as_deref()
            .unwrap_or("urn:hl7gw:id:");
        let mut s = String::with_capacity(prefix.len() + ns.len() + 8);
        s.push_str(prefix);
        percent_encode(&mut s, &ns);
        Some(s)
    }
}
