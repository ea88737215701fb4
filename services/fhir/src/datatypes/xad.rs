//! XAD → Address (an array item, or a single object).

use crate::context::Ctx;
use crate::datatypes::components;
use crate::json::Writer;
use hl7v2::message::Value;

impl<'a, 'm> Ctx<'a, 'm> {
    /// XAD → Address (array item).
    pub fn address(&self, w: &mut Writer<'_>, xad: Value<'a>) -> bool {
        let c = components::<9>(xad);
        let street = self.text(c[0].and_then(|c| c.subcomponent(1)));
        let other = self.text(c[1]);
        let city = self.text(c[2]);
        let state = self.text(c[3]);
        let zip = self.text(c[4]);
        let country = self.text(c[5]);
        let district = self.text(c[8]);
        if [&street, &other, &city, &state, &zip, &country, &district]
            .iter()
            .all(|x| x.is_none())
        {
            return false;
        }
        w.begin_object();
        if let Some(kind) = self.text(c[6]) {
            if let Some(u) = self.lookup("AddressType[Use]", &kind) {
                w.string("use", u.code);
            }
            if let Some(t) = self.lookup("AddressType[Type]", &kind) {
                w.string("type", t.code);
            }
        }
        if street.is_some() || other.is_some() {
            w.array("line");
            for l in [&street, &other].into_iter().flatten() {
                w.item_string(l);
            }
            w.end_array();
        }
        for (k, v) in [
            ("city", &city),
            ("district", &district),
            ("state", &state),
            ("postalCode", &zip),
            ("country", &country),
        ] {
            if let Some(v) = v {
                w.string(k, v);
            }
        }
        w.end_object();
        true
    }
}

/// XAD → an Address object under `key` (for elements of cardinality 0..1, as Location.address). False when
/// the XAD has nothing to write.
pub(crate) fn address_object(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    key: &str,
    xad: Value<'_>,
) -> bool {
    let street = cx.text(xad.component(1).and_then(|c| c.subcomponent(1)));
    let other = cx.comp(xad, 2);
    let parts = [
        ("city", cx.comp(xad, 3)),
        ("district", cx.comp(xad, 9)),
        ("state", cx.comp(xad, 4)),
        ("postalCode", cx.comp(xad, 5)),
        ("country", cx.comp(xad, 6)),
    ];
    if street.is_none() && other.is_none() && parts.iter().all(|(_, v)| v.is_none()) {
        return false;
    }
    w.object(key);
    if street.is_some() || other.is_some() {
        w.array("line");
        for l in [&street, &other].into_iter().flatten() {
            w.item_string(l);
        }
        w.end_array();
    }
    for (k, v) in &parts {
        if let Some(v) = v {
            w.string(k, v);
        }
    }
    w.end_object();
    true
}
