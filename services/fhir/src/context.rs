//! The state of one conversion (`Ctx`): the message, its fields split once, the route's options, what was not
//! mapped, refusals; resource targets and their Bundle entries (write modes); field maps; identifier scoping.

use crate::datatypes::nm::{is_decimal, normalise_decimal};
use crate::ids::{Uuid, token_encode, uuid_of};
use crate::json::Writer;
use crate::location::{PlLocation, location_body};
pub(crate) use crate::target::{Target, reference, references};
use crate::vocab;
use crate::{BundleType, FhirError, IdentifierRule, Options, TimeZone, Unmapped, Write};
use hl7v2::message::{Segment, Value};
use hl7v2::{Charset, Message};
use std::borrow::Cow;

/// The state of one conversion.
pub(crate) struct Ctx<'a, 'm> {
    pub msg: &'m Message<'a>,
    pub charset: Charset,
    pub opts: &'m Options,
    /// Field and segment ids with values no map covers, in message order.
    pub unmapped: Vec<String>,
    /// Their values, kept when `Unmapped::Extension`.
    pub unmapped_values: Vec<(String, String)>,
    pub resources: usize,
    /// When the gateway received the message (the caller's, else `Options::received_at`).
    pub received_at: Option<&'m str>,
    /// Fields a map meant to write but could not (a date that is not one, a code with no row, a person with
    /// neither id nor name): reported like unmapped ones, by [`Ctx::dropped`], which needs only `&self`.
    dropped: std::cell::RefCell<Vec<(String, String)>>,
    /// Every segment's fields, split once: the maps ask for fields by number many times over.
    index: FieldIndex<'a>,
    /// The message's escape character.
    escape: u8,
    /// The time zone of times without an offset: the sender's, else the route's.
    pub tz: Option<&'m TimeZone>,
    /// The sender's settings in the route, when it names this sender.
    sender: Option<&'m crate::Sender>,
    /// The system of identifiers that name no authority of their own: the sender's authority in the route,
    /// else MSH-4's (worked out once, when first needed).
    fallback_system: std::cell::OnceCell<Option<String>>,
    /// Why the message is refused, found while writing (the first reason).
    refusal: std::cell::RefCell<Option<FhirError>>,
    /// Where the open entry starts, and whether the entry array had members then.
    entry_mark: (usize, bool),
    /// The field maps ([`Options::field_maps`]) written into some resource, by index: their fields count as
    /// mapped.
    field_maps_written: std::cell::RefCell<Vec<usize>>,
    /// Locations an Encounter named (PV1-3/6/11/42), written as entries right after it, each once.
    pub pending_locations: std::cell::RefCell<Vec<PlLocation>>,
    locations_written: std::collections::HashSet<Uuid>,
    /// Resources referenced by a condition instead of an entry ([`Write::Reference`]): their derived id and
    /// the conditional reference that replaces `urn:uuid:<id>` in the Bundle.
    pub conditional_refs: Vec<(Uuid, String)>,
}

/// The fields of each segment of the message, split once per conversion ([`Segment::field`] splits the
/// segment again on every call, which cost a fifth of a conversion).
struct FieldIndex<'a> {
    /// Per segment in wire order: the address of its first byte, its length, where its fields start in
    /// `fields`.
    segs: Vec<(usize, usize, usize)>,
    /// The fields of all segments, field 1 first (for MSH, the field separator, as [`Segment::field`] has it).
    fields: Vec<Value<'a>>,
    /// The segment looked up last (the maps read one segment at a time).
    last: std::cell::Cell<usize>,
}

impl<'a> FieldIndex<'a> {
    fn new(msg: &Message<'a>) -> Self {
        let mut segs = Vec::with_capacity(msg.segment_count());
        let mut fields = Vec::with_capacity(msg.as_bytes().len() / 8 + 16);
        for seg in msg.segments() {
            let raw = seg.raw();
            segs.push((raw.as_ptr() as usize, raw.len(), fields.len()));
            fields.extend(seg.fields().map(|(_, v)| v));
        }
        Self {
            segs,
            fields,
            last: std::cell::Cell::new(0),
        }
    }

    /// The fields of `seg`, when it is one of the message's segments.
    fn of(&self, seg: &Segment<'a>) -> Option<&[Value<'a>]> {
        let raw = seg.raw();
        let addr = raw.as_ptr() as usize;
        let last = self.last.get();
        let i = match self.segs.get(last) {
            Some(s) if s.0 == addr => last,
            _ => self.segs.binary_search_by_key(&addr, |s| s.0).ok()?,
        };
        let (_, len, start) = self.segs[i];
        if len != raw.len() {
            return None;
        }
        self.last.set(i);
        let end = self.segs.get(i + 1).map_or(self.fields.len(), |s| s.2);
        self.fields.get(start..end)
    }

    /// Field `n` of the segment at wire position `i`.
    fn at(&self, i: usize, n: usize) -> Option<Value<'a>> {
        let (_, _, start) = *self.segs.get(i)?;
        let end = self.segs.get(i + 1).map_or(self.fields.len(), |s| s.2);
        self.fields.get(start..end)?.get(n.checked_sub(1)?).copied()
    }
}

impl std::fmt::Debug for Ctx<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("resources", &self.resources)
            .finish()
    }
}

impl<'a, 'm> Ctx<'a, 'm> {
    pub fn new(msg: &'m Message<'a>, charset: Charset, opts: &'m Options) -> Self {
        let sender = sender_of(msg, charset, opts);
        Self {
            msg,
            charset,
            opts,
            unmapped: Vec::new(),
            unmapped_values: Vec::new(),
            resources: 0,
            received_at: opts.received_at.as_deref(),
            dropped: std::cell::RefCell::new(Vec::new()),
            index: FieldIndex::new(msg),
            escape: msg.delimiters().escape,
            tz: sender
                .and_then(|s| s.timezone.as_ref())
                .or(opts.timezone.as_ref()),
            sender,
            fallback_system: std::cell::OnceCell::new(),
            refusal: std::cell::RefCell::new(None),
            entry_mark: (0, false),
            conditional_refs: Vec::new(),
            field_maps_written: std::cell::RefCell::new(Vec::new()),
            pending_locations: std::cell::RefCell::new(Vec::new()),
            locations_written: std::collections::HashSet::new(),
        }
    }

    /// Writes the route's field maps for a resource of `rtype` as items of the open `extension` array: one
    /// extension per repetition of the field of the message's first segment of that name. A value its type
    /// cannot take is reported. True when one was written.
    pub fn field_map_extensions(&self, w: &mut Writer<'_>, rtype: &str) -> bool {
        let mut any = false;
        if !self.field_maps_apply() {
            return false;
        }
        for (i, fm) in self.opts.field_maps.iter().enumerate() {
            if fm.resource != rtype {
                continue;
            }
            let Some(seg) = self.msg.segment(&fm.segment, 1) else {
                continue;
            };
            for rep in self.reps(&seg, fm.field) {
                let v = match fm.component {
                    Some(c) => rep.component(c),
                    None => Some(rep),
                };
                let Some(v) = v.filter(|v| !v.is_empty()) else {
                    continue;
                };
                let mark = (w.len(), w.has_members());
                w.begin_object();
                w.string("url", &fm.url);
                if self.field_map_value(w, fm.value, v) {
                    w.end_object();
                    any = true;
                    self.field_maps_written.borrow_mut().push(i);
                } else {
                    w.end_object();
                    w.truncate(mark.0, mark.1);
                    self.dropped(&seg, fm.field);
                }
            }
        }
        any
    }

    /// Whether a field map targets `rtype` and its segment is in the message.
    pub fn has_field_maps(&self, rtype: &str) -> bool {
        self.field_maps_apply()
            && self
                .opts
                .field_maps
                .iter()
                .any(|fm| fm.resource == rtype && self.msg.segment(&fm.segment, 1).is_some())
    }

    /// Field maps take the first segment of their name: in a message about one patient only. With several
    /// PIDs (an A17, an ORU of several patients) that segment may be another patient's, so none is applied and
    /// the fields are reported ([`Ctx::report_unwritten_field_maps`]).
    fn field_maps_apply(&self) -> bool {
        !self.opts.field_maps.is_empty() && self.msg.segment("PID", 2).is_none()
    }

    /// The field maps no resource took (none of their type in the Bundle, several patients in the message, a
    /// value their type cannot take): their fields are reported, as any field not written.
    pub fn report_unwritten_field_maps(&self) {
        let written = self.field_maps_written.borrow().clone();
        for (i, fm) in self.opts.field_maps.iter().enumerate() {
            if written.contains(&i) {
                continue;
            }
            if let Some(seg) = self.msg.segment(&fm.segment, 1) {
                self.dropped(&seg, fm.field);
            }
        }
    }

    /// An extension's `value[x]` of a field-mapped value, through the data type writers.
    fn field_map_value(&self, w: &mut Writer<'_>, ty: crate::ValueType, v: Value<'a>) -> bool {
        use crate::ValueType as T;
        match ty {
            T::CodeableConcept => self.codeable_concept(w, "valueCodeableConcept", Some(v), None),
            T::Identifier => match self.cx_key(v) {
                Some((system, value)) => {
                    w.object("valueIdentifier");
                    w.string("system", &system);
                    w.string("value", &value);
                    w.end_object();
                    true
                }
                None => false,
            },
            _ => {
                let Some(text) = self.text(Some(v)) else {
                    return false;
                };
                match ty {
                    T::String => w.string("valueString", &text),
                    T::Code if !text.trim().is_empty() && !text.contains(char::is_whitespace) => {
                        w.string("valueCode", &text)
                    }
                    T::Boolean if matches!(&*text, "Y" | "N") => {
                        w.bool("valueBoolean", &*text == "Y")
                    }
                    T::Integer if text.parse::<i32>().is_ok() => w.number(
                        "valueInteger",
                        &text.parse::<i32>().unwrap_or_default().to_string(),
                    ),
                    T::Decimal if is_decimal(&text) => {
                        w.number("valueDecimal", &normalise_decimal(&text))
                    }
                    T::DateTime => return self.write_date_time(w, "valueDateTime", &text),
                    _ => return false,
                }
                true
            }
        }
    }

    /// Whether field `n` of segment `name` is a field map's (so it is not reported as unmapped here).
    fn field_mapped(&self, name: &str, n: usize) -> bool {
        if self.opts.field_maps.is_empty() {
            return false;
        }
        // Written or not: the ones not written are reported once the Bundle is made
        // (`report_unwritten_field_maps`), when it is known which were.
        self.opts
            .field_maps
            .iter()
            .any(|fm| fm.segment == name && fm.field == n)
    }

    /// A concept map row: the sender's code map of that name, else the route's, else the IG's map.
    pub fn lookup(&self, map: &str, code: &str) -> Option<vocab::Concept<'m>> {
        self.local_lookup(map, code)
            .or_else(|| vocab::lookup(map, code))
    }

    /// A row of the site's own code map `map` (the sender's, else the route's), if it has one.
    pub fn local_lookup(&self, map: &str, code: &str) -> Option<vocab::Concept<'m>> {
        if self.opts.code_maps.is_empty() && self.sender.is_none_or(|s| s.code_maps.is_empty()) {
            return None;
        }
        self.sender
            .map(|s| &s.code_maps)
            .into_iter()
            .chain([&self.opts.code_maps])
            .find_map(|maps| maps.get(map)?.get(code))
            .map(|r| vocab::Concept {
                code: &r.code,
                display: &r.display,
                system: &r.system,
            })
    }

    /// Refuses the message (the first reason found wins): [`crate::convert`] then returns it, no Bundle.
    pub fn refuse(&self, e: FhirError) {
        self.refusal.borrow_mut().get_or_insert(e);
    }

    /// The refusal, if any.
    pub fn take_refusal(&mut self) -> Option<FhirError> {
        self.refusal.get_mut().take()
    }

    /// The patient's match key among PID-3's repetitions: the sender's rule, else the route's.
    pub fn patient_rule(&self) -> Option<&'m IdentifierRule> {
        self.sender
            .and_then(|s| s.patient_identifier.as_ref())
            .or(self.opts.patient_identifier.as_ref())
    }

    /// How a transaction writes a resource of `rtype` from this message: the route's choice, else the
    /// default (docs/fhir.md, "Write semantics"): the messages that own a resource update it, the others
    /// create it only when the server has none.
    pub fn write_of(&self, rtype: &str) -> Write {
        if let Some(w) = self.opts.write.get(rtype) {
            return *w;
        }
        let h = self.msg.header();
        let owns = match (rtype, h.message_type) {
            ("Patient", b"ADT") => matches!(
                h.trigger_event,
                b"A01" | b"A04" | b"A05" | b"A08" | b"A28" | b"A31"
            ),
            ("Encounter", t) => t == b"ADT",
            ("Patient" | "Practitioner", _) => false,
            ("ServiceRequest", t) => matches!(t, b"ORM" | b"OML"),
            ("RelatedPerson" | "AllergyIntolerance" | "Coverage" | "Condition", t) => t == b"ADT",
            _ => true,
        };
        if owns {
            Write::Update
        } else {
            Write::CreateIfAbsent
        }
    }

    /// A value as text: escapes resolved, decoded from the message's charset; `None` when empty or the v2
    /// null `""`.
    pub fn text(&self, v: Option<Value<'a>>) -> Option<Cow<'a, str>> {
        let v = v?;
        if v.is_empty() || v.raw() == b"\"\"" {
            return None;
        }
        let raw = v.raw();
        // Without the escape character, in UTF-8 (no BOM) or ASCII text in ASCII or Latin-1 (nearly every
        // value): the text is the bytes, borrowed as they are.
        let plain = match self.charset {
            Charset::Utf8 => !raw.starts_with(b"\xEF\xBB\xBF"),
            Charset::Ascii | Charset::Latin1 => raw.is_ascii(),
            _ => false,
        };
        if plain
            && !raw.contains(&self.escape)
            && let Ok(s) = std::str::from_utf8(raw)
        {
            return trimmed(s).map(Cow::Borrowed);
        }
        let s: Cow<'a, str> = match v.decoded() {
            Cow::Borrowed(b) => match self.charset.decode(b) {
                Ok(s) => s,
                Err(_) => Cow::Owned(b.iter().map(|&c| char::from(c)).collect()),
            },
            Cow::Owned(b) => Cow::Owned(match self.charset.decode(&b) {
                Ok(s) => s.into_owned(),
                Err(_) => b.iter().map(|&c| char::from(c)).collect(),
            }),
        };
        match s {
            Cow::Borrowed(b) => trimmed(b).map(Cow::Borrowed),
            Cow::Owned(o) => {
                let t = o.trim();
                if t.is_empty() {
                    None
                } else if t.len() == o.len() {
                    Some(Cow::Owned(o))
                } else {
                    Some(Cow::Owned(t.to_owned()))
                }
            }
        }
    }

    /// Field `n` of the MSH segment.
    pub fn msh(&self, n: usize) -> Option<Value<'a>> {
        self.index.at(0, n)
    }

    /// Field `n` of a segment (as [`Segment::field`], from the fields split once per message).
    pub fn seg_field(&self, seg: &Segment<'a>, n: usize) -> Option<Value<'a>> {
        match self.index.of(seg) {
            Some(fields) => fields.get(n.checked_sub(1)?).copied(),
            None => seg.field(n),
        }
    }

    /// The first repetition of field `n` of a segment.
    pub fn rep1(&self, seg: &Segment<'a>, n: usize) -> Option<Value<'a>> {
        self.seg_field(seg, n).and_then(|f| f.repetition(1))
    }

    /// Component `n` of a field repetition as text.
    pub fn comp(&self, v: Value<'a>, n: usize) -> Option<Cow<'a, str>> {
        self.text(v.component(n))
    }

    /// Field `n` of a segment as text (the whole field, first repetition).
    pub fn field(&self, seg: &Segment<'a>, n: usize) -> Option<Cow<'a, str>> {
        self.text(self.rep1(seg, n))
    }

    /// The repetitions of field `n` that have a value.
    pub fn reps(&self, seg: &Segment<'a>, n: usize) -> Vec<Value<'a>> {
        self.seg_field(seg, n)
            .map(|f| f.repetitions().filter(|r| !r.is_empty()).collect())
            .unwrap_or_default()
    }

    /// Records the fields of `seg` with a value that are not in `mapped` (and, for `Extension`, their values).
    pub fn note_unmapped(&mut self, seg: &Segment<'a>, mapped: &[usize]) {
        let name = String::from_utf8_lossy(seg.name());
        let header = seg.is_header();
        let (charset, keep) = (self.charset, self.opts.unmapped == Unmapped::Extension);
        let fallback: Vec<Value<'a>>;
        let fields = match self.index.of(seg) {
            Some(f) => f,
            None => {
                fallback = seg.fields().map(|(_, v)| v).collect();
                &fallback
            }
        };
        for (i, v) in fields.iter().enumerate() {
            let n = i + 1;
            if v.is_empty()
                || mapped.contains(&n)
                || (header && n <= 2)
                || self.field_mapped(&name, n)
            {
                continue;
            }
            let mut id = String::with_capacity(name.len() + 4);
            id.push_str(&name);
            id.push('-');
            id.push_str(itoa::Buffer::new().format(n));
            if keep {
                self.unmapped_values
                    .push((id.clone(), charset_text(charset, v.raw())));
            }
            self.unmapped.push(id);
        }
    }

    /// Field `n` of `seg` had a value the map could not write: it is reported as unmapped (with its value when
    /// the route keeps them), never dropped silently.
    pub fn dropped(&self, seg: &Segment<'a>, n: usize) {
        let Some(v) = self.seg_field(seg, n).filter(|v| !v.is_empty()) else {
            return;
        };
        let id = format!("{}-{n}", String::from_utf8_lossy(seg.name()));
        let value = if self.opts.unmapped == Unmapped::Extension {
            self.charset_text(v.raw())
        } else {
            String::new()
        };
        self.dropped.borrow_mut().push((id, value));
    }

    /// Moves what [`Ctx::dropped`] collected into the unmapped lists (once each).
    pub fn take_dropped(&mut self) {
        let dropped = self.dropped.take();
        if dropped.is_empty() {
            return;
        }
        // Once per conversion (the Bundle's end): a set of what is listed, not a search per dropped field.
        let mut listed: std::collections::HashSet<String> = self.unmapped.iter().cloned().collect();
        for (id, value) in dropped {
            if !listed.insert(id.clone()) {
                continue;
            }
            if self.opts.unmapped == Unmapped::Extension {
                self.unmapped_values.push((id.clone(), value));
            }
            self.unmapped.push(id);
        }
    }

    /// A whole segment no map covers.
    pub fn note_unmapped_segment(&mut self, seg: &Segment<'a>) {
        if self
            .opts
            .field_maps
            .iter()
            .any(|fm| fm.segment.as_bytes() == seg.name())
        {
            // A segment some of whose fields a field map writes: its other fields, one by one.
            return self.note_unmapped(seg, &[]);
        }
        let name = String::from_utf8_lossy(seg.name()).into_owned();
        if self.opts.unmapped == Unmapped::Extension {
            let raw = self.charset_text(seg.raw());
            self.unmapped_values.push((name.clone(), raw));
        }
        self.unmapped.push(name);
    }

    fn charset_text(&self, b: &[u8]) -> String {
        charset_text(self.charset, b)
    }

    /// A target whose id derives from `key` (the resource type is part of it).
    pub fn target(
        &self,
        rtype: &'static str,
        key: &[&str],
        by: Option<(String, String)>,
    ) -> Target {
        Target {
            rtype,
            id: uuid_of(rtype, key),
            by,
            code: None,
            repeat: false,
            write: self.write_of(rtype),
        }
    }

    /// What identifies this message: sending application, facility and control id.
    pub fn message_key(&self) -> [String; 3] {
        let h = self.msg.header();
        let t = |b: &[u8]| self.charset_text(b);
        [
            t(h.sending_application),
            t(h.sending_facility),
            t(h.control_id),
        ]
    }

    /// Opens a Bundle entry for `t`: `fullUrl`, then `resource` with its type (and id when a transaction
    /// updates by id, or in a message Bundle). The caller writes the resource's elements, then calls
    /// [`Ctx::end_entry`].
    pub fn begin_entry(&mut self, w: &mut Writer<'_>, t: &Target) {
        self.resources += 1;
        self.entry_mark = (w.len(), w.has_members());
        w.begin_object();
        w.string_parts("fullUrl", &["urn:uuid:", &t.id]);
        w.object("resource");
        w.string("resourceType", t.rtype);
        // Written by a condition (PUT or POST), the server keeps its own id.
        if t.by.is_none() || self.opts.bundle_type == BundleType::Message {
            w.string("id", &t.id);
        }
        // The site's field maps (Patient and Observation write them into their own extension arrays).
        if !matches!(t.rtype, "Patient" | "Observation") && self.has_field_maps(t.rtype) {
            let mark = (w.len(), w.has_members());
            w.array("extension");
            let any = self.field_map_extensions(w, t.rtype);
            w.end_array();
            if !any {
                w.truncate(mark.0, mark.1);
            }
        }
    }

    /// Closes the resource and, in a transaction, writes the entry's request: an update (`PUT`) by the
    /// business identifier (and the code, when the target names one: `&code=<system>|<code>`, `|<code>` for a
    /// coding without a system) or by id; or a create-if-absent (`POST` with `ifNoneExist` on the identifier);
    /// or, for a resource only referenced, no entry at all (its references become the condition).
    pub fn end_entry(&mut self, w: &mut Writer<'_>, t: &Target) {
        w.end_object();
        if self.opts.bundle_type == BundleType::Transaction {
            let condition = t.by.as_ref().map(|(system, value)| {
                let mut q = String::with_capacity(64);
                q.push_str("identifier=");
                token_encode(&mut q, system);
                q.push_str("%7C");
                token_encode(&mut q, value);
                if let Some((system, code)) = &t.code {
                    q.push_str("&code=");
                    if let Some(system) = system {
                        token_encode(&mut q, system);
                    }
                    q.push_str("%7C");
                    token_encode(&mut q, code);
                }
                q
            });
            match (condition, t.write) {
                (Some(q), Write::Reference) => {
                    // Not written: the entry goes, and every reference to it names the condition.
                    w.end_object();
                    let (mark, had) = self.entry_mark;
                    w.truncate(mark, had);
                    self.resources -= 1;
                    self.conditional_refs
                        .push((t.id, format!("{}?{q}", t.rtype)));
                    // Its Locations go with it.
                    self.pending_locations.get_mut().clear();
                    return;
                }
                (Some(q), Write::CreateIfAbsent) => {
                    w.object("request");
                    w.string("method", "POST");
                    w.string("url", t.rtype);
                    w.string("ifNoneExist", &q);
                    w.end_object();
                }
                (Some(q), Write::Update) => {
                    w.object("request");
                    w.string("method", "PUT");
                    w.string_parts("url", &[t.rtype, "?", &q]);
                    w.end_object();
                }
                (None, _) => {
                    w.object("request");
                    w.string("method", "PUT");
                    w.string_parts("url", &[t.rtype, "/", &t.id]);
                    w.end_object();
                }
            }
        }
        w.end_object();
        self.write_pending_locations(w);
    }

    /// The Locations the entry just closed named, each once per Bundle.
    fn write_pending_locations(&mut self, w: &mut Writer<'_>) {
        let pending = std::mem::take(self.pending_locations.get_mut());
        for l in pending {
            if !self.locations_written.insert(l.target.id) {
                continue;
            }
            self.begin_entry(w, &l.target);
            location_body(w, &l);
            self.end_entry(w, &l.target);
        }
    }

    /// A CX's identifier system: its assigning authority (CX-4), else its assigning facility (CX-6), else the
    /// sender's authority in the route, else the sending facility (MSH-4). `None` when none of these is given.
    pub fn cx_system(&self, c: &[Option<Value<'a>>]) -> Option<String> {
        self.hd_system(c[3], true)
            .or_else(|| self.hd_system(c.get(5).copied().flatten(), true))
            .or_else(|| self.sender_scope().map(str::to_owned))
    }

    /// The sender's namespace: its authority in the route, else its sending facility (MSH-4), as a system.
    /// What scopes the values of this message that name no authority of their own (identifiers, places).
    pub fn sender_scope(&self) -> Option<&str> {
        self.fallback_system
            .get_or_init(|| match self.sender.and_then(|s| s.authority.as_deref()) {
                Some(a) => self.hd_system_of(Some(Cow::Borrowed(a)), None, None),
                None => self.hd_system(self.msh(4), false),
            })
            .as_deref()
    }
}

/// The route's settings for this message's sender: `APP^FAC` (MSH-3 and MSH-4 namespace ids), else `FAC`,
/// else `APP`.
fn sender_of<'m>(
    msg: &Message<'_>,
    charset: Charset,
    opts: &'m Options,
) -> Option<&'m crate::Sender> {
    if opts.senders.is_empty() {
        return None;
    }
    let h = msg.header();
    let ns = |b: &[u8]| {
        let first = b
            .split(|&c| c == msg.delimiters().component)
            .next()
            .unwrap_or(b);
        charset_text(charset, first).trim().to_owned()
    };
    let (app, fac) = (ns(h.sending_application), ns(h.sending_facility));
    opts.senders
        .get(&format!("{app}^{fac}"))
        .or_else(|| (!fac.is_empty()).then(|| opts.senders.get(&fac)).flatten())
        .or_else(|| (!app.is_empty()).then(|| opts.senders.get(&app)).flatten())
}

/// `s` without leading and trailing whitespace, `None` when nothing is left. Most values start and end with a
/// printable ASCII character and need no look at their characters (Unicode's other spaces are not ASCII).
#[inline]
fn trimmed(s: &str) -> Option<&str> {
    let b = s.as_bytes();
    let printable = |c: &u8| (0x21..0x7f).contains(c);
    if b.first().is_some_and(printable) && b.last().is_some_and(printable) {
        return Some(s);
    }
    Some(s.trim()).filter(|t| !t.is_empty())
}

/// Bytes as text in `charset` (each byte as its Latin-1 character when they are not valid in it).
fn charset_text(charset: Charset, b: &[u8]) -> String {
    match charset.decode(b) {
        Ok(s) => s.into_owned(),
        Err(_) => b.iter().map(|&c| char::from(c)).collect(),
    }
}
