//! CWE/CE/CNE → CodeableConcept and Coding: through the IG's concept maps and the site's code maps, with the
//! systems of v2 tables and coding system names.

use crate::context::Ctx;
use crate::datatypes::components;
use crate::json::Writer;
use crate::vocab;
use hl7v2::message::Value;
use std::borrow::Cow;

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

impl<'a, 'm> Ctx<'a, 'm> {
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
}

/// The first coding a CodeableConcept of `cwe` (without a table) writes: (system, if it has one, code). What a
/// conditional update names beside the identifier (`&code=`), so it is the coding the resource carries.
pub(crate) fn primary_coding(
    cx: &Ctx<'_, '_>,
    cwe: Option<Value<'_>>,
) -> Option<(Option<String>, String)> {
    let cwe = cwe?;
    [(1, 3), (4, 6), (10, 12)].into_iter().find_map(|(c, s)| {
        let code = cx.comp(cwe, c)?;
        let system = cx
            .comp(cwe, s)
            .and_then(|n| cx.coding_system_ref(&n))
            .filter(|sys| vocab::fits(sys, &code))
            .map(|sys| sys.into_owned());
        Some((system, code.into_owned()))
    })
}

/// A CodeableConcept under `key` with one coding (system, code, display).
pub(crate) fn coded(
    w: &mut Writer<'_>,
    key: &str,
    system: &str,
    code: &str,
    display: Option<&str>,
) {
    w.object(key);
    w.array("coding");
    coding_item(w, system, code, display);
    w.end_array();
    w.end_object();
}

/// A Coding array item.
pub(crate) fn coding_item(w: &mut Writer<'_>, system: &str, code: &str, display: Option<&str>) {
    w.begin_object();
    w.string("system", system);
    w.string("code", code);
    if let Some(d) = display {
        w.string("display", d);
    }
    w.end_object();
}
