//! XPN → HumanName.

use crate::context::Ctx;
use crate::datatypes::components;
use crate::json::Writer;
use hl7v2::message::Value;

impl<'a, 'm> Ctx<'a, 'm> {
    /// XPN → HumanName (array item).
    pub fn human_name(&self, w: &mut Writer<'_>, xpn: Value<'a>) -> bool {
        let c = components::<7>(xpn);
        let family = self.text(c[0].and_then(|c| c.subcomponent(1)));
        let given = self.text(c[1]);
        let middle = self.text(c[2]);
        let suffix = self.text(c[3]);
        let prefix = self.text(c[4]);
        let degree = self.text(c[5]);
        if family.is_none() && given.is_none() && middle.is_none() {
            return false;
        }
        let use_ = self
            .text(c[6])
            .and_then(|c| self.lookup("NameType", &c))
            .map(|u| u.code);
        write_name(
            w,
            use_,
            family.as_deref(),
            &[given.as_deref(), middle.as_deref()],
            &[prefix.as_deref()],
            &[suffix.as_deref(), degree.as_deref()],
        );
        true
    }
}

/// A HumanName object (an array item): `use`, `family`, and the `given`, `prefix` and `suffix` parts that
/// have a value.
pub(crate) fn write_name(
    w: &mut Writer<'_>,
    use_: Option<&str>,
    family: Option<&str>,
    given: &[Option<&str>],
    prefix: &[Option<&str>],
    suffix: &[Option<&str>],
) {
    w.begin_object();
    if let Some(u) = use_ {
        w.string("use", u);
    }
    if let Some(f) = family {
        w.string("family", f);
    }
    for (key, parts) in [("given", given), ("prefix", prefix), ("suffix", suffix)] {
        if parts.iter().any(Option::is_some) {
            w.array(key);
            for p in parts.iter().flatten() {
                w.item_string(p);
            }
            w.end_array();
        }
    }
    w.end_object();
}
