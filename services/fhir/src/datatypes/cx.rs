//! CX and EI → Identifier: system (the assigning authority, scoped by the context) and value, the patient's
//! match key, and the v2-0203 identifier type.

use crate::IdentifierRule;
use crate::context::Ctx;
use crate::datatypes::components;
use crate::datatypes::dtm::period;
use crate::ids::is_oid;
use crate::json::Writer;
use crate::vocab;
use hl7v2::message::Value;

impl<'a, 'm> Ctx<'a, 'm> {
    /// CX → Identifier (system and value), if CX-1 has a value.
    pub fn cx_key(&self, cx: Value<'a>) -> Option<(String, String)> {
        // Six components: the system may come from CX-6 (the assigning facility), as `identifier()` writes it.
        self.cx_key_of(&components::<6>(cx))
    }

    /// [`Ctx::cx_key`] of a CX's components.
    fn cx_key_of(&self, c: &[Option<Value<'a>>]) -> Option<(String, String)> {
        let value = self.text(c[0])?;
        let system = self
            .cx_system(c)
            .unwrap_or_else(|| UNSCOPED_SYSTEM.to_owned());
        Some((system, value.into_owned()))
    }

    /// The patient's key from a PID-3/2/4 repetition, with whether it names an authority somewhere.
    pub fn patient_key(&self, cx: Value<'a>) -> Option<((String, String), bool)> {
        let c = components::<6>(cx);
        let value = self.text(c[0])?;
        let system = self.cx_system(&c);
        let scoped = system.is_some();
        Some((
            (
                system.unwrap_or_else(|| UNSCOPED_SYSTEM.to_owned()),
                value.into_owned(),
            ),
            scoped,
        ))
    }

    /// Whether a PID-3 repetition is the one `rule` names (its CX-5 type, its CX-4 or CX-6 namespace id).
    pub fn is_match_key(&self, cx: Value<'a>, rule: &IdentifierRule) -> bool {
        let c = components::<6>(cx);
        let type_ok = rule
            .type_code
            .as_deref()
            .is_none_or(|t| self.text(c[4]).as_deref() == Some(t));
        let ns = |v: Option<Value<'a>>| self.text(v.and_then(|v| v.subcomponent(1)));
        let authority_ok = rule
            .authority
            .as_deref()
            .is_none_or(|a| ns(c[3]).as_deref() == Some(a) || ns(c[5]).as_deref() == Some(a));
        type_ok && authority_ok && self.text(c[0]).is_some()
    }

    /// CX → Identifier, written as an array item. `type_code` is the v2-0203 code when CX-5 is empty.
    pub fn identifier(&self, w: &mut Writer<'_>, cx: Value<'a>, type_code: Option<&str>) -> bool {
        let c = components::<8>(cx);
        let Some((system, value)) = self.cx_key_of(&c) else {
            return false;
        };
        w.begin_object();
        let ty = self.text(c[4]);
        match (ty.as_deref(), type_code) {
            (Some(sent), _) => identifier_type(w, sent, false),
            (None, Some(ours)) => identifier_type(w, ours, true),
            (None, None) => {}
        }
        w.string("system", &system);
        w.string("value", &value);
        let start = self.text(c[6]).and_then(|d| self.date_time(&d));
        let end = self.text(c[7]).and_then(|d| self.date_time(&d));
        period(w, "period", start.as_deref(), end.as_deref());
        w.end_object();
        true
    }
}

/// The system of an identifier that names no authority anywhere (only with
/// [`Options::unscoped_identifiers_global`] for a patient's).
const UNSCOPED_SYSTEM: &str = "urn:hl7gw:id:unknown";

/// A v2-0203 identifier type as a CodeableConcept under `type`: a coding for one of the converter's own
/// (`ours`: VN, PLAC, FILL...) or a code of the IG's IdentifierType map, text for anything else a sender put there.
pub(crate) fn identifier_type(w: &mut Writer<'_>, code: &str, ours: bool) {
    w.object("type");
    if ours || vocab::has_code("IdentifierType", code) {
        w.array("coding");
        w.begin_object();
        w.string("system", "http://terminology.hl7.org/CodeSystem/v2-0203");
        w.string("code", code);
        if let Some(c) = vocab::lookup("IdentifierType", code) {
            w.string("display", c.display);
        }
        w.end_object();
        w.end_array();
    } else {
        w.string("text", code);
    }
    w.end_object();
}

/// The system of an EI that names no namespace: order numbers share it across senders on purpose (placer and
/// filler name one order); a DG1-20 takes the sender's instead (`segments::dg1`).
pub(crate) const UNSCOPED_EI_SYSTEM: &str = "urn:hl7gw:id:unknown";

/// EI → (system, value): EI-1 with the authority of EI-2..4 (components, or subcomponents when `sub`: an EI
/// inside an EIP or a CX).
pub(crate) fn ei_key(cx: &Ctx<'_, '_>, ei: Value<'_>, sub: bool) -> Option<(String, String)> {
    let part = |n: usize| {
        if sub {
            cx.text(ei.subcomponent(n))
        } else {
            cx.comp(ei, n)
        }
    };
    let value = part(1)?;
    let ns = part(2);
    let system = match (part(3), part(4).as_deref()) {
        (Some(uid), Some("ISO")) if is_oid(&uid) => format!("urn:oid:{uid}"),
        (Some(uid), Some("URI" | "URL")) => uid.into_owned(),
        // A namespace id through `identifierSystems`, else the prefix: as an HD's ([`Ctx::hd_system_of`]).
        _ => match ns {
            Some(ns) => cx.hd_system_of(Some(ns), None, None).unwrap_or_default(),
            None => UNSCOPED_EI_SYSTEM.to_owned(),
        },
    };
    Some((system, value.into_owned()))
}

/// An Identifier array item: `system`, `value`, and a v2-0203 `type` (PLAC, FILL...).
pub(crate) fn identifier_item(w: &mut Writer<'_>, key: &(String, String), type_code: Option<&str>) {
    w.begin_object();
    if let Some(code) = type_code {
        identifier_type(w, code, true);
    }
    w.string("system", &key.0);
    w.string("value", &key.1);
    w.end_object();
}
