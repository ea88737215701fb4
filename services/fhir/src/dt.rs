//! The data type maps (CX, XPN, XAD, XTN, CWE, DTM, XCN, PL, HD) and what every segment map shares: text in
//! the message's charset, derived ids, the Bundle's entries, the record of what was not mapped.

use crate::json::Writer;
use crate::time::LocalOffset;
use crate::vocab;
use crate::{BundleType, FhirError, IdentifierRule, Options, TimeZone, Unmapped, Write};
use hl7v2::message::{Segment, Value};
use hl7v2::{Charset, Message};
use sha2::{Digest, Sha256};
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
    pub pending_locations: std::cell::RefCell<Vec<crate::pl::PlLocation>>,
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

/// A coded field's v2 table and the IG concept map of that field (which also lists the table's codes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    /// The IG's concept map (`MaritalStatus`, `Relationship`...).
    pub map: &'static str,
    /// The v2 table (`HL70002`).
    pub id: &'static str,
    /// Write only the FHIR translation when there is one (a binding that admits no other system, as
    /// `Patient.communication.language` to BCP 47).
    pub fhir_only: bool,
}

impl Table {
    pub const fn new(map: &'static str, id: &'static str) -> Self {
        Self {
            map,
            id,
            fhir_only: false,
        }
    }
}

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
        self.opts
            .field_maps
            .iter()
            .any(|fm| fm.resource == rtype && self.msg.segment(&fm.segment, 1).is_some())
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
                    T::Decimal if crate::common::is_decimal(&text) => {
                        w.number("valueDecimal", &crate::common::normalise_decimal(&text))
                    }
                    T::DateTime => return self.write_date_time(w, "valueDateTime", &text),
                    _ => return false,
                }
                true
            }
        }
    }

    /// Whether field `n` of segment `name` is written by a field map (so it is not reported as unmapped).
    fn field_mapped(&self, name: &str, n: usize) -> bool {
        if self.opts.field_maps.is_empty() {
            return false;
        }
        let written = self.field_maps_written.borrow();
        self.opts
            .field_maps
            .iter()
            .enumerate()
            .any(|(i, fm)| fm.segment == name && fm.field == n && written.contains(&i))
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
        for (id, value) in self.dropped.take() {
            if self.unmapped.contains(&id) {
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
            crate::pl::location_body(w, &l);
            self.end_entry(w, &l.target);
        }
    }

    // ---- data types ----

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

    /// CX → Identifier (system and value), if CX-1 has a value.
    pub fn cx_key(&self, cx: Value<'a>) -> Option<(String, String)> {
        self.cx_key_of(&components::<4>(cx))
    }

    /// [`Ctx::cx_key`] of a CX's components.
    fn cx_key_of(&self, c: &[Option<Value<'a>>]) -> Option<(String, String)> {
        let value = self.text(c[0])?;
        let system = self
            .cx_system(c)
            .unwrap_or_else(|| UNSCOPED_SYSTEM.to_owned());
        Some((system, value.into_owned()))
    }

    /// A CX's identifier system: its assigning authority (CX-4), else its assigning facility (CX-6), else the
    /// sender's authority in the route, else the sending facility (MSH-4). `None` when none of these is given.
    fn cx_system(&self, c: &[Option<Value<'a>>]) -> Option<String> {
        self.hd_system(c[3], true)
            .or_else(|| self.hd_system(c.get(5).copied().flatten(), true))
            .or_else(|| {
                self.fallback_system
                    .get_or_init(|| match self.sender.and_then(|s| s.authority.as_deref()) {
                        Some(a) => self.hd_system_of(Some(Cow::Borrowed(a)), None, None),
                        None => self.hd_system(self.msh(4), false),
                    })
                    .clone()
            })
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

    /// The URI of a v2 coding system name (CWE-3): an HL7 table, a well-known system, or the route's own.
    pub fn coding_system(&self, name: &str) -> Option<String> {
        self.coding_system_ref(name).map(Cow::into_owned)
    }

    /// [`Ctx::coding_system`], borrowed when the URI is the route's or a well-known one (most of them).
    pub fn coding_system_ref(&self, name: &str) -> Option<Cow<'m, str>> {
        if let Some(s) = self.opts.code_systems.get(name) {
            return Some(Cow::Borrowed(s.as_str()));
        }
        if let Some(s) = vocab::coding_system(name) {
            return Some(Cow::Borrowed(s));
        }
        vocab::v2_table_system(name)
            .or_else(|| vocab::oid_system(name))
            .map(Cow::Owned)
    }

    /// CWE/CE/CNE → CodeableConcept written under `key`, through `table`'s IG concept map when the field has
    /// one. False (nothing written) when the value has no code and no text.
    pub fn codeable_concept(
        &self,
        w: &mut Writer<'_>,
        key: &str,
        cwe: Option<Value<'a>>,
        table: Option<Table>,
    ) -> bool {
        let Some(cwe) = cwe.filter(|c| self.cwe_valued(*c)) else {
            return false;
        };
        w.object(key);
        self.codeable_concept_body(w, cwe, table);
        w.end_object();
        true
    }

    /// True when a CWE has a code or a text to write.
    pub fn cwe_valued(&self, cwe: Value<'a>) -> bool {
        let c = components::<10>(cwe);
        [1, 2, 4, 9, 10]
            .iter()
            .any(|&n| self.text(c[n - 1]).is_some())
    }

    /// CWE → CodeableConcept as an array item.
    pub fn codeable_concept_item(
        &self,
        w: &mut Writer<'_>,
        cwe: Value<'a>,
        table: Option<Table>,
    ) -> bool {
        if !self.cwe_valued(cwe) {
            return false;
        }
        w.begin_object();
        self.codeable_concept_body(w, cwe, table);
        w.end_object();
        true
    }

    /// The codings: the IG's FHIR translation of the first code (when `table` has a concept map with a row for
    /// it), then the v2 codes themselves. A code is given an HL7 table's system only when it is one of that
    /// table's codes (the IG's map lists them); a local code keeps its code and display, and the system the
    /// sender named (CWE-3) or the route configured, if any.
    fn codeable_concept_body(
        &self,
        w: &mut Writer<'_>,
        cwe: Value<'a>,
        table: Option<Table>,
    ) -> bool {
        let triples = [(1, 2, 3), (4, 5, 6), (10, 11, 12)];
        let comps = components::<12>(cwe);
        let comp = |n: usize| self.text(comps[n - 1]);
        let mut any = false;
        let mut first_display = None;
        for (i, (c, d, s)) in triples.into_iter().enumerate() {
            let code = comp(c);
            let display = comp(d);
            let Some(code) = code else {
                if i == 0 {
                    first_display = display;
                }
                continue;
            };
            let named = comp(s);
            let in_table = |t: &Table| vocab::has_code(t.map, &code);
            let fhir_only = table.is_some_and(|t| t.fhir_only);
            let mapped = if i == 0 || fhir_only {
                table.and_then(|t| self.lookup(t.map, &code))
            } else {
                None
            };
            // A site's map of this coding system (CWE-3): its translation first, the local code after it.
            let mapped =
                mapped.or_else(|| named.as_deref().and_then(|n| self.local_lookup(n, &code)));
            if let Some(c) = &mapped {
                if !any {
                    w.array("coding");
                    any = true;
                }
                w.begin_object();
                if !c.system.is_empty() {
                    w.string("system", c.system);
                }
                w.string("code", c.code);
                if !c.display.is_empty() {
                    w.string("display", c.display);
                }
                w.end_object();
                if table.is_some_and(|t| t.fhir_only) {
                    continue;
                }
            } else if fhir_only {
                // No translation into the only system the element admits: the first code as text.
                if i == 0 && first_display.is_none() {
                    first_display = display.or(Some(code));
                }
                continue;
            }
            // The v2 coding's system: the one named, unless it is this field's table and the code is not one
            // of its codes; else the field's table when the code is one of its codes.
            let system = match named.as_deref() {
                Some(n) => match table {
                    Some(t) if i == 0 && (n == t.id || n == &t.id[3..]) && !in_table(&t) => self
                        .opts
                        .code_systems
                        .get(n)
                        .map(|s| Cow::Borrowed(s.as_str())),
                    _ => self.coding_system_ref(n),
                },
                None if i == 0 => table
                    .filter(in_table)
                    .and_then(|t| vocab::v2_table_system(t.id))
                    .map(Cow::Owned),
                None => None,
            };
            let system = system.filter(|s| vocab::fits(s, &code));
            // The IG's translation may be the table's own code (SpecimenType, AdmissionType...): once is
            // enough, unless the sender's display says something else.
            if let (Some(c), Some(sys)) = (&mapped, &system)
                && c.system == sys
                && c.code == code
                && display
                    .as_deref()
                    .is_none_or(|d| d.eq_ignore_ascii_case(c.display))
            {
                continue;
            }
            if !any {
                w.array("coding");
                any = true;
            }
            w.begin_object();
            if let Some(sys) = system {
                w.string("system", &sys);
            }
            w.string("code", &code);
            if let Some(d) = &display {
                w.string("display", d);
            }
            w.end_object();
        }
        if any {
            w.end_array();
        }
        let text = comp(9).or(first_display);
        if let Some(t) = &text {
            w.string("text", t);
        }
        any || text.is_some()
    }

    /// A code through one of the IG's concept maps, as a Coding array item (the v2 code kept as is when the
    /// map has no row for it, with the v2 table's system when it is one of the table's codes).
    pub fn mapped_coding(&self, w: &mut Writer<'_>, map: &str, code: &str, table: &str) {
        w.begin_object();
        match self.lookup(map, code) {
            Some(c) => {
                if !c.system.is_empty() {
                    w.string("system", c.system);
                }
                w.string("code", c.code);
                if !c.display.is_empty() {
                    w.string("display", c.display);
                }
            }
            None => {
                if vocab::has_code(map, code)
                    && let Some(s) = vocab::v2_table_system(table)
                {
                    w.string("system", &s);
                }
                w.string("code", code);
            }
        }
        w.end_object();
    }

    /// DTM/TS → FHIR `dateTime`: `YYYY`, `YYYY-MM`, `YYYY-MM-DD`, or with a time of day and an offset (the
    /// message's, else the route's `timezone`; without either, the date alone).
    pub fn date_time(&self, v2: &str) -> Option<String> {
        dtm(v2, self.tz, false)
    }

    /// [`Ctx::date_time`] written as `"key":"<dateTime>"` straight into the output, when there is one.
    pub fn write_date_time(&self, w: &mut Writer<'_>, key: &str, v2: &str) -> bool {
        // Digits, `-`, `:`, `T`, `.` and an offset checked to be `Z` or `±hh:mm`: nothing to escape.
        w.string_with(key, |out| dtm_into(out, v2, self.tz, false))
    }

    /// DTM → FHIR `date` (the date part).
    pub fn date(&self, v2: &str) -> Option<String> {
        let mut d = dtm(v2, None, false)?;
        d.truncate(10);
        Some(d)
    }

    /// DTM → FHIR `instant` (to the second, with an offset), when the value allows it.
    pub fn instant(&self, v2: &str) -> Option<String> {
        dtm(v2, self.tz, true)
    }

    /// PL → a location's display text: point of care, room, bed, facility, building, floor.
    pub fn location_text(&self, pl: Value<'a>) -> Option<String> {
        let c = components::<8>(pl);
        let mut parts: Vec<Cow<'_, str>> = [1, 2, 3]
            .iter()
            .filter_map(|&n| self.text(c[n - 1]))
            .collect();
        parts.extend(self.text(c[3].and_then(|c| c.subcomponent(1))));
        parts.extend([7, 8].iter().filter_map(|&n| self.text(c[n - 1])));
        (!parts.is_empty()).then(|| parts.join(" "))
    }
}

/// The system of an identifier that names no authority anywhere (only with
/// [`Options::unscoped_identifiers_global`] for a patient's).
const UNSCOPED_SYSTEM: &str = "urn:hl7gw:id:unknown";

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

/// The first `N` components of a value, split once ([`Value::component`] splits it again on every call).
fn components<const N: usize>(v: Value<'_>) -> [Option<Value<'_>>; N] {
    first_n(v.components())
}

/// The first `N` items of `parts` (components or subcomponents), the rest `None`.
fn first_n<'v, const N: usize>(parts: impl Iterator<Item = Value<'v>>) -> [Option<Value<'v>>; N] {
    let mut out = [None; N];
    for (slot, c) in out.iter_mut().zip(parts) {
        *slot = Some(c);
    }
    out
}

/// Bytes as text in `charset` (each byte as its Latin-1 character when they are not valid in it).
fn charset_text(charset: Charset, b: &[u8]) -> String {
    match charset.decode(b) {
        Ok(s) => s.into_owned(),
        Err(_) => b.iter().map(|&c| char::from(c)).collect(),
    }
}

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

/// A Period under `key`, when either end is known.
pub(crate) fn period(w: &mut Writer<'_>, key: &str, start: Option<&str>, end: Option<&str>) {
    if start.is_none() && end.is_none() {
        return;
    }
    w.object(key);
    if let Some(s) = start {
        w.string("start", s);
    }
    if let Some(e) = end {
        w.string("end", e);
    }
    w.end_object();
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

/// A time under `single` (`effectiveDateTime`) when only the start is known, else a Period under `period`.
pub(crate) fn date_or_period(
    w: &mut Writer<'_>,
    single: &str,
    period_key: &str,
    start: Option<&str>,
    end: Option<&str>,
) {
    match (start, end) {
        (Some(s), None) => w.string(single, s),
        _ => period(w, period_key, start, end),
    }
}

/// True for an OID FHIR accepts: `[0-2]` and at least two more arcs, each a number without leading zeros.
pub(crate) fn is_oid(s: &str) -> bool {
    let arcs: Vec<&str> = s.split('.').collect();
    arcs.len() >= 3
        && matches!(arcs[0], "0" | "1" | "2")
        && arcs.iter().all(|a| {
            !a.is_empty()
                && a.bytes().all(|b| b.is_ascii_digit())
                && (a.len() == 1 || !a.starts_with('0'))
        })
}

/// v2 DTM (`YYYY[MM[DD[HH[MM[SS[.S+]]]]]][+/-ZZZZ]`) as FHIR dateTime (or instant: seconds and offset required).
pub(crate) fn dtm(v2: &str, default_tz: Option<&TimeZone>, instant: bool) -> Option<String> {
    let mut s = Vec::with_capacity(32);
    if !dtm_into(&mut s, v2, default_tz, instant) {
        return None;
    }
    // Pieces of `v2` and the zone's offset, cut at ASCII characters: UTF-8.
    String::from_utf8(s).ok()
}

/// [`dtm`] appended to `s` (nothing appended when it gives `None`), without a String of its own. A date or
/// time that does not exist (month 13, 29 February 2023, 25:00, an offset of +2500, a local time that daylight
/// saving skips) gives `None`: the caller reports the field, nothing is written. A local time that happened
/// twice (the hour after daylight saving ends) keeps only its date.
pub(crate) fn dtm_into(
    s: &mut Vec<u8>,
    v2: &str,
    default_tz: Option<&TimeZone>,
    instant: bool,
) -> bool {
    let (body, tz) = match v2.find(['+', '-']) {
        Some(i) if i >= 4 => (&v2[..i], Some(&v2[i..])),
        _ => (v2, None),
    };
    let (digits, frac) = match body.find('.') {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let n = digits.len();
    if !matches!(n, 4 | 6 | 8 | 10 | 12 | 14) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let d = digits;
    let num = |r: std::ops::Range<usize>| -> u32 {
        d.as_bytes()[r]
            .iter()
            .fold(0, |n, b| n * 10 + u32::from(b - b'0'))
    };
    let (y, mo, day) = (
        num(0..4),
        if n >= 6 { num(4..6) } else { 1 },
        if n >= 8 { num(6..8) } else { 1 },
    );
    let (h, mi, sec) = (
        if n >= 10 { num(8..10) } else { 0 },
        if n >= 12 { num(10..12) } else { 0 },
        if n >= 14 { num(12..14) } else { 0 },
    );
    if y == 0
        || !(1..=12).contains(&mo)
        || day == 0
        || day > crate::time::days_in_month(y as i32, mo)
        || h > 23
        || mi > 59
        || sec > 59
    {
        return false;
    }
    // The message's offset (`+HHMM`), else the route's time zone.
    let own = match tz {
        Some(z) => {
            let b = z.as_bytes();
            if b.len() != 5 || !b[1..].iter().all(u8::is_ascii_digit) {
                // Not an offset: the time is read without one, as before.
                None
            } else if &z[1..3] > "14" || &z[3..5] > "59" {
                return false;
            } else {
                Some(z)
            }
        }
        None => None,
    };
    let local = match (own, default_tz) {
        (None, Some(zone)) if n > 8 => {
            Some(zone.offset_of(y as i16, mo as i8, day as i8, h as i8, mi as i8, sec as i8))
        }
        _ => None,
    };
    if local == Some(LocalOffset::Skipped) {
        return false;
    }
    if n <= 8 || (own.is_none() && local.is_none()) || local == Some(LocalOffset::Ambiguous) {
        if instant {
            return false;
        }
        s.extend_from_slice(&d.as_bytes()[..4]);
        if n >= 6 {
            s.push(b'-');
            s.extend_from_slice(&d.as_bytes()[4..6]);
        }
        if n >= 8 {
            s.push(b'-');
            s.extend_from_slice(&d.as_bytes()[6..8]);
        }
        return true;
    }
    s.extend_from_slice(&d.as_bytes()[..4]);
    s.push(b'-');
    s.extend_from_slice(&d.as_bytes()[4..6]);
    s.push(b'-');
    s.extend_from_slice(&d.as_bytes()[6..8]);
    s.push(b'T');
    s.extend_from_slice(&d.as_bytes()[8..10]);
    s.push(b':');
    s.extend_from_slice((if n >= 12 { &d[10..12] } else { "00" }).as_bytes());
    s.push(b':');
    s.extend_from_slice((if n >= 14 { &d[12..14] } else { "00" }).as_bytes());
    if let Some(f) = frac.filter(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit())) {
        s.push(b'.');
        s.extend_from_slice(f.as_bytes());
    }
    match (own, local) {
        (Some(z), _) => {
            s.extend_from_slice(&z.as_bytes()[..3]);
            s.push(b':');
            s.extend_from_slice(&z.as_bytes()[3..5]);
        }
        (None, Some(LocalOffset::Fixed(z))) => s.extend_from_slice(z.as_bytes()),
        (None, Some(LocalOffset::Found(offset))) => crate::time::write_offset(s, offset),
        _ => {}
    }
    true
}

/// A UUID (version 5 layout) from the SHA-256 of the resource type and key: stable across conversions.
pub(crate) fn uuid_of(rtype: &str, key: &[&str]) -> Uuid {
    let mut h = Sha256::new();
    h.update(rtype.as_bytes());
    for k in key {
        h.update([0x1f]);
        h.update(k.as_bytes());
    }
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.finalize()[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = [0u8; 36];
    let mut at = 0;
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s[at] = b'-';
            at += 1;
        }
        s[at] = HEX[(byte >> 4) as usize];
        s[at + 1] = HEX[(byte & 0xf) as usize];
        at += 2;
    }
    Uuid(s)
}

/// A resource id made by [`uuid_of`]: its 36 characters in place (a Bundle has dozens; none is a `String`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Uuid([u8; 36]);

impl Uuid {
    pub fn as_str(&self) -> &str {
        // Hex digits and hyphens only (see `uuid_of`): always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::ops::Deref for Uuid {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One side of a search token (`system|code`), escaped as FHIR search says (`\` before `\`, `|`, `,` and `$`,
/// which would otherwise split it or make it an OR) and percent-encoded.
fn token_encode(out: &mut String, s: &str) {
    if !s.contains(['\\', '|', ',', '$']) {
        percent_encode(out, s);
        return;
    }
    let mut escaped = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        if matches!(c, '\\' | '|' | ',' | '$') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    percent_encode(out, &escaped);
}

/// Appends `s` percent-encoded for a URL query value (unreserved characters kept).
pub(crate) fn percent_encode(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let keep =
        |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'/');
    let mut rest = s;
    while !rest.is_empty() {
        // A run of kept characters (ASCII, so a char boundary where it ends) in one piece.
        let run = rest.bytes().position(|b| !keep(b)).unwrap_or(rest.len());
        out.push_str(&rest[..run]);
        let Some(&b) = rest.as_bytes().get(run) else {
            break;
        };
        out.push('%');
        out.push(char::from(HEX[(b >> 4) as usize]));
        out.push(char::from(HEX[(b & 0xf) as usize]));
        // Past the one byte (a multi-byte character's bytes are encoded one by one).
        rest = match rest.get(run + 1..) {
            Some(r) => r,
            None => {
                // Inside a multi-byte character: its remaining bytes, each encoded.
                for &b in &rest.as_bytes()[run + 1..] {
                    if keep(b) {
                        out.push(char::from(b));
                    } else {
                        out.push('%');
                        out.push(char::from(HEX[(b >> 4) as usize]));
                        out.push(char::from(HEX[(b & 0xf) as usize]));
                    }
                }
                break;
            }
        };
    }
}
