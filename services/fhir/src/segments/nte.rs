//! NTE → Annotation (`note`), and the practitioner who wrote it.

use crate::context::{Ctx, reference};
use crate::datatypes::xcn::{Person, Practitioners, practitioner_target};
use crate::json::Writer;
use crate::segments::write_items;
use hl7v2::message::Segment;

/// The practitioner who wrote an NTE (NTE-5), when the NTE has a comment to write.
pub(crate) fn note_author<'a>(
    cx: &Ctx<'a, '_>,
    practitioners: &mut Practitioners<'a>,
    nte: &Segment<'a>,
) {
    if cx
        .reps(nte, 3)
        .into_iter()
        .any(|r| cx.text(Some(r)).is_some())
        && let Some(x) = cx.rep1(nte, 5)
    {
        practitioners.add(cx, Person::Xcn(x));
    }
}

/// The fields of an NTE the NTE[Observation] and NTE[ServiceRequest] maps write.
pub(crate) const NTE_MAPPED: &[usize] = &[1, 3, 5, 6];

/// NTE segments as `note` (Annotation): the comment (NTE-3, its repetitions as lines), the author (NTE-5) and
/// the time (NTE-6). An NTE without a comment writes nothing.
pub(crate) fn notes_items(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, notes: &[Segment<'_>]) {
    write_items(w, "note", notes, |w, nte| {
        let lines: Vec<String> = cx
            .reps(nte, 3)
            .into_iter()
            .filter_map(|r| cx.text(Some(r)).map(|t| t.into_owned()))
            .collect();
        if lines.is_empty() {
            return false;
        }
        w.begin_object();
        if let Some(t) = cx
            .rep1(nte, 5)
            .and_then(|x| practitioner_target(cx, Person::Xcn(x)))
        {
            reference(w, "authorReference", &t);
        }
        if let Some(d) = cx.field(nte, 6) {
            cx.write_date_time(w, "time", &d);
        }
        w.string("text", &lines.join("\n"));
        w.end_object();
        true
    });
}
