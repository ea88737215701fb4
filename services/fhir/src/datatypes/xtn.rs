//! XTN → ContactPoint.

use crate::context::Ctx;
use crate::datatypes::components;
use crate::json::Writer;
use hl7v2::message::Value;
use std::borrow::Cow;

impl<'a, 'm> Ctx<'a, 'm> {
    /// XTN → ContactPoint (array item); `default_use` when XTN-2 is empty (PID-14 is work).
    pub fn contact_point(
        &self,
        w: &mut Writer<'_>,
        xtn: Value<'a>,
        default_use: Option<&str>,
    ) -> bool {
        let c = components::<12>(xtn);
        let equipment = self.text(c[2]);
        let email = matches!(equipment.as_deref(), Some("Internet" | "X.400"));
        let value = if email {
            self.text(c[3])
        } else {
            self.text(c[11]).or_else(|| {
                let parts: Vec<Cow<'_, str>> = [5, 6, 7]
                    .iter()
                    .filter_map(|&n| self.text(c[n - 1]))
                    .collect();
                if parts.is_empty() {
                    self.text(c[0])
                } else {
                    let mut s = parts.join(" ");
                    if let Some(ext) = self.text(c[7]) {
                        s.push_str(" ext. ");
                        s.push_str(&ext);
                    }
                    Some(Cow::Owned(s))
                }
            })
        };
        let Some(value) = value else {
            return false;
        };
        w.begin_object();
        // The IG maps most equipment types to ContactPoint.system, and CP (cellular) to ContactPoint.use.
        let equipment = equipment
            .as_deref()
            .and_then(|e| self.lookup("TelecommunicationEquipmentType", e));
        let (system, equipment_use) = match equipment {
            Some(c) if c.system.ends_with("contact-point-use") => ("phone", Some(c.code)),
            Some(c) => (c.code, None),
            None if email => ("email", None),
            None => ("phone", None),
        };
        w.string("system", system);
        w.string("value", &value);
        let use_ = self
            .text(c[1])
            .and_then(|u| self.lookup("TelecommunicationUseCode", &u).map(|c| c.code))
            .filter(|u| matches!(*u, "home" | "work" | "temp" | "old" | "mobile"))
            .or(equipment_use)
            .or(default_use);
        if let Some(u) = use_ {
            w.string("use", u);
        }
        w.end_object();
        true
    }
}
