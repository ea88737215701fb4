//! The IG's segment maps shared by the message maps, one file per segment (PID, PV1/PV2, NK1, AL1, DG1, IN1,
//! OBX, NTE, MSH, EVN), and what they share: writing arrays, the fields a map wrote, coded targets.

pub(crate) mod al1;
pub(crate) mod dg1;
pub(crate) mod evn;
pub(crate) mod in1;
pub(crate) mod msh;
pub(crate) mod nk1;
pub(crate) mod nte;
pub(crate) mod obx;
pub(crate) mod pid;
pub(crate) mod pv1;

use crate::context::{Ctx, Target};
use crate::json::Writer;
use hl7v2::message::Segment;

/// A repeating segment's key within the patient: its set id (field 1), else its position.
pub(crate) fn n_key(cx: &Ctx<'_, '_>, seg: &Segment<'_>, position: &str) -> String {
    cx.field(seg, 1)
        .map(|s| s.into_owned())
        .unwrap_or_else(|| position.to_owned())
}

/// A ServiceRequest, DiagnosticReport or Observation with a business identifier: updated by the identifier
/// and the code, `<Type>?identifier=...&code=...` (its id derived from both, so two resources of a message
/// that differ only by their code differ). Without a code it has nothing to tell it from the other tests
/// under its number: it is updated by an id derived from the identifier (a redelivery, or a later message
/// naming the number without a code, updates it) and keeps its identifiers, which no condition of these
/// types matches (each names a code, and it has none).
pub(crate) fn coded_target(
    cx: &Ctx<'_, '_>,
    rtype: &'static str,
    key: (String, String),
    code: Option<(Option<String>, String)>,
) -> Target {
    match code {
        Some((system, c)) => {
            let mut t = cx.target(
                rtype,
                &[&key.0, &key.1, system.as_deref().unwrap_or_default(), &c],
                None,
            );
            t.by = Some(key);
            t.code = Some((system, c));
            t
        }
        None => cx.target(rtype, &[&key.0, &key.1], None),
    }
}

/// Writes `items` as an array under `key`, or nothing when none of them writes anything (a slice, or an
/// iterator of field repetitions with no Vec in between).
pub(crate) fn write_items<I: IntoIterator>(
    w: &mut Writer<'_>,
    key: &str,
    items: I,
    mut one: impl FnMut(&mut Writer<'_>, I::Item) -> bool,
) {
    let (mark, had) = (w.len(), w.has_members());
    let mut open = false;
    let mut any = false;
    for it in items {
        if !open {
            w.array(key);
            open = true;
        }
        any |= one(w, it);
    }
    if open {
        w.end_array();
        if !any {
            w.truncate(mark, had);
        }
    }
}

/// The numbers of the fields a map wrote (for [`Ctx::note_unmapped`]), kept in place: up to 16, which no
/// segment map here exceeds (more panics in tests, never in a release build: the rest are then reported
/// unmapped).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields {
    n: [usize; 16],
    len: usize,
}

impl Fields {
    pub fn of(fields: &[usize]) -> Self {
        let mut f = Self { n: [0; 16], len: 0 };
        for &n in fields {
            f.push(n);
        }
        f
    }

    pub fn push(&mut self, n: usize) {
        debug_assert!(self.len < self.n.len(), "more than 16 mapped fields");
        if let Some(slot) = self.n.get_mut(self.len) {
            *slot = n;
            self.len += 1;
        }
    }
}

impl std::ops::Deref for Fields {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.n[..self.len]
    }
}
