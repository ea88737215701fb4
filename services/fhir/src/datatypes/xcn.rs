//! XCN (and the CNN of an NDL) → Practitioner: its target, its body, and the Practitioners of a Bundle, each
//! written once.

use crate::bundle::Entries;
use crate::context::{Ctx, Target};
use crate::datatypes::xpn::write_name;
use crate::ids::Uuid;
use crate::json::Writer;
use hl7v2::message::{Segment, Value};

/// A person named by an XCN (ORC-12, OBR-16, OBX-16, NTE-5, PV1-7...) or by the CNN of an NDL (OBR-32..35;
/// before v2.5 a CN, written like an XCN).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Person<'a> {
    Xcn(Value<'a>),
    /// NDL-1: the CNN's parts are subcomponents.
    Cnn(Value<'a>),
}

impl<'a> Person<'a> {
    /// The person of an NDL repetition: a CNN in its first component, or (before v2.5, or written so) a CN
    /// whose parts are the components.
    pub fn of_ndl(cx: &Ctx<'a, '_>, ndl: Value<'a>) -> Self {
        let version = cx.msg.header().version;
        let old = matches!(version, b"2.1" | b"2.2" | b"2.3" | b"2.3.1" | b"2.4");
        let first = ndl.component(1).unwrap_or(ndl);
        if old && !first.raw().contains(&cx.msg.delimiters().subcomponent) {
            Person::Xcn(ndl)
        } else {
            Person::Cnn(first)
        }
    }

    /// Part `n` of the XCN layout: 1 id, 2 family name, 3 given, 4 further given, 5 suffix, 6 prefix.
    fn part(&self, cx: &Ctx<'a, '_>, n: usize) -> Option<std::borrow::Cow<'a, str>> {
        match self {
            Person::Xcn(x) if n == 2 => cx.text(x.component(2).and_then(|c| c.subcomponent(1))),
            Person::Xcn(x) => cx.comp(*x, n),
            Person::Cnn(c) => cx.text(c.subcomponent(n)),
        }
    }

    /// The identifier's system: XCN-9 (an HD in subcomponents), or CNN-9..11.
    fn system(&self, cx: &Ctx<'a, '_>) -> String {
        match self {
            Person::Xcn(x) => cx.hd_system(x.component(9), true),
            Person::Cnn(c) => cx.hd_system_of(
                cx.text(c.subcomponent(9)),
                cx.text(c.subcomponent(10)),
                cx.text(c.subcomponent(11)),
            ),
        }
        .unwrap_or_else(|| "urn:hl7gw:id:practitioner".to_owned())
    }
}

/// A practitioner: by its id (XCN-1, authority XCN-9), else by its name.
pub(crate) fn practitioner_target(cx: &Ctx<'_, '_>, p: Person<'_>) -> Option<Target> {
    let id = p.part(cx, 1);
    let family = p.part(cx, 2);
    let given = p.part(cx, 3);
    match id {
        Some(id) => {
            let system = p.system(cx);
            let id = id.into_owned();
            Some(cx.target(
                "Practitioner",
                &[&system, &id],
                Some((system.clone(), id.clone())),
            ))
        }
        None if family.is_some() || given.is_some() => Some(cx.target(
            "Practitioner",
            &[
                family.as_deref().unwrap_or_default(),
                given.as_deref().unwrap_or_default(),
            ],
            None,
        )),
        None => None,
    }
}

pub(crate) fn practitioner_body(cx: &Ctx<'_, '_>, w: &mut Writer<'_>, p: Person<'_>) {
    if let Some(id) = p.part(cx, 1) {
        let system = p.system(cx);
        w.array("identifier");
        w.begin_object();
        w.string("system", &system);
        w.string("value", &id);
        w.end_object();
        w.end_array();
    }
    let family = p.part(cx, 2);
    let given = [p.part(cx, 3), p.part(cx, 4)];
    let suffix = p.part(cx, 5);
    let prefix = p.part(cx, 6);
    if family.is_some() || given.iter().any(Option::is_some) {
        w.array("name");
        write_name(
            w,
            None,
            family.as_deref(),
            &[given[0].as_deref(), given[1].as_deref()],
            &[prefix.as_deref()],
            &[suffix.as_deref()],
        );
        w.end_array();
    }
}

/// The Practitioners of a Bundle, each written once (a transaction may not hold the same conditional update
/// twice), in the order they are first named.
#[derive(Debug, Default)]
pub(crate) struct Practitioners<'a> {
    list: Vec<(Target, Person<'a>)>,
    seen: std::collections::HashSet<Uuid>,
}

impl<'a> Practitioners<'a> {
    /// Adds the practitioner `p` names (if it names one) and returns its target.
    pub fn add(&mut self, cx: &Ctx<'a, '_>, p: Person<'a>) -> Option<Target> {
        let t = practitioner_target(cx, p)?;
        self.add_target(&t, p);
        Some(t)
    }

    /// Adds `p` by the target [`practitioner_target`] made of it already (PV1's participants have theirs):
    /// no second id derived.
    pub fn add_target(&mut self, t: &Target, p: Person<'a>) {
        // A set beside the list: a message naming thousands of people costs linear time, not quadratic.
        if self.seen.insert(t.id) {
            self.list.push((t.clone(), p));
        }
    }

    /// Adds each repetition of an XCN field.
    pub fn add_xcn_field(&mut self, cx: &Ctx<'a, '_>, seg: &Segment<'a>, n: usize) {
        for x in cx.reps(seg, n) {
            self.add(cx, Person::Xcn(x));
        }
    }

    /// Writes them, each as an entry.
    pub fn write(&self, cx: &mut Ctx<'_, '_>, b: &mut Entries<'_>) {
        for (t, p) in &self.list {
            b.entry(cx, t, |cx, w| practitioner_body(cx, w, *p));
        }
    }
}

/// References to the practitioners of an XCN field, as an array under `key`.
pub(crate) fn practitioner_refs(
    cx: &Ctx<'_, '_>,
    w: &mut Writer<'_>,
    key: &str,
    people: &[Person<'_>],
) {
    let targets: Vec<Target> = people
        .iter()
        .filter_map(|p| practitioner_target(cx, *p))
        .collect();
    if targets.is_empty() {
        return;
    }
    w.array(key);
    for t in &targets {
        w.begin_object();
        w.string_parts("reference", &["urn:uuid:", &t.id]);
        w.end_object();
    }
    w.end_array();
}
