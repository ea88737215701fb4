//! What a site adapts without a rebuild: its own concept maps (overriding or extending one of the IG's, or
//! translating a local coding system's codes) and field maps (a v2 field, a Z-segment's above all, into an
//! extension of a resource, through the data type writers). Loaded from files by the route that names them.

use std::collections::BTreeMap;
use std::path::Path;

/// A site's concept map: v2 code → FHIR coding. Named in [`crate::Options::code_maps`] by the IG map it
/// overrides and extends (`AdministrativeSex`, `PatientClass[EncounterClass]`: its rows win over the IG's), or
/// by a v2 coding system name (CWE-3, `99LAB`): codes of that system get its translation as their first coding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeMap {
    rows: BTreeMap<String, LocalConcept>,
}

/// One row of a [`CodeMap`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalConcept {
    pub code: String,
    pub display: String,
    pub system: String,
}

impl CodeMap {
    /// Reads a map file: FHIR ConceptMap JSON (`.json`) or the IG's CSV layout (any other name).
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("code map {}: {e}", path.display()))?;
        let map = if path.extension().is_some_and(|x| x == "json") {
            Self::from_concept_map_json(&text)
        } else {
            Self::from_ig_csv(&text)
        };
        map.map_err(|e| format!("code map {}: {e}", path.display()))
    }

    /// The IG's concept map layout (as in `ig/codesystems/`): two header rows, then per row the v2 code
    /// (column 1), conditions (4-6: a row with one is skipped, as the IG's own are), the FHIR code (7), its
    /// display (9) and code system (10).
    pub fn from_ig_csv(text: &str) -> Result<Self, String> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(text.as_bytes());
        let mut rows = BTreeMap::new();
        for (i, rec) in reader.records().enumerate() {
            let rec = rec.map_err(|e| format!("row {}: {e}", i + 1))?;
            if i < 2 {
                continue;
            }
            let col = |n: usize| rec.get(n).unwrap_or("").trim().to_owned();
            if (3..=5).any(|n| !col(n).is_empty()) || col(0).is_empty() || col(6).is_empty() {
                continue;
            }
            rows.entry(col(0)).or_insert(LocalConcept {
                code: col(6),
                display: col(8),
                system: col(9),
            });
        }
        if rows.is_empty() {
            return Err("no rows (the IG's layout: two header rows, v2 code in column 1, FHIR code in 7, display in 9, system in 10)".into());
        }
        Ok(Self { rows })
    }

    /// A FHIR ConceptMap (R4): every `group[].element[].target[]` whose `equivalence` is not `unmatched` or
    /// `disjoint` (the first such target of each source code), with the group's `target` as the system.
    pub fn from_concept_map_json(text: &str) -> Result<Self, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if v["resourceType"] != "ConceptMap" {
            return Err("not a ConceptMap (resourceType)".into());
        }
        let mut rows = BTreeMap::new();
        for group in v["group"].as_array().into_iter().flatten() {
            let system = group["target"].as_str().unwrap_or_default();
            for element in group["element"].as_array().into_iter().flatten() {
                let Some(code) = element["code"].as_str() else {
                    continue;
                };
                let target = element["target"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|t| {
                        !matches!(t["equivalence"].as_str(), Some("unmatched" | "disjoint"))
                            && t["code"].as_str().is_some_and(|c| !c.trim().is_empty())
                    });
                if let Some(t) = target {
                    rows.entry(code.to_owned()).or_insert(LocalConcept {
                        code: t["code"].as_str().unwrap_or_default().to_owned(),
                        display: t["display"].as_str().unwrap_or_default().to_owned(),
                        system: system.to_owned(),
                    });
                }
            }
        }
        if rows.is_empty() {
            return Err("no mapped element (group[].element[].target[].code)".into());
        }
        Ok(Self { rows })
    }

    /// The row of a v2 code.
    pub fn get(&self, code: &str) -> Option<&LocalConcept> {
        self.rows.get(code)
    }

    /// How many codes it maps.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when it maps nothing.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A v2 field written into a resource as an extension: `ZPI-3` → `Patient.extension[<url>].valueString`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldMap {
    /// The segment (`ZPI`, `PID`): the first one of the message.
    pub segment: String,
    /// The field number.
    pub field: usize,
    /// The component, when only one is taken (`ZPI-3-2`).
    pub component: Option<usize>,
    /// The resource type every resource of which gets the extension.
    pub resource: String,
    pub url: String,
    pub value: ValueType,
}

/// The extension's value type, and so the data type writer that makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// ST/TX/FT/any text: `valueString`.
    String,
    /// ID/IS: `valueCode`.
    Code,
    /// `Y`/`N`: `valueBoolean`.
    Boolean,
    /// NM without a fraction: `valueInteger`.
    Integer,
    /// NM: `valueDecimal`.
    Decimal,
    /// DTM/DT: `valueDateTime` (with the route's time zone).
    DateTime,
    /// CWE/CE/CNE: `valueCodeableConcept`.
    CodeableConcept,
    /// CX: `valueIdentifier`.
    Identifier,
}

impl FieldMap {
    /// `from` a v2 path (`ZPI-3`, `PID-10-2`), `to` an extension
    /// (`Patient.extension[https://hospital.example/fhir/StructureDefinition/x].valueString`).
    pub fn parse(from: &str, to: &str) -> Result<Self, String> {
        let bad_from =
            || format!("field map from {from:?}: expected SEG-n or SEG-n-c (ZPI-3, PID-10-2)");
        let mut parts = from.split('-');
        let segment = parts.next().unwrap_or_default();
        if segment.len() != 3 || !segment.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(bad_from());
        }
        let num = |p: Option<&str>| -> Result<Option<usize>, String> {
            p.map(|p| {
                p.parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(bad_from)
            })
            .transpose()
        };
        let field = num(parts.next())?.ok_or_else(bad_from)?;
        let component = num(parts.next())?;
        if parts.next().is_some() {
            return Err(bad_from());
        }
        let bad_to = || {
            format!(
                "field map to {to:?}: expected <ResourceType>.extension[<url>].value<Type> \
                 (String, Code, Boolean, Integer, Decimal, DateTime, CodeableConcept, Identifier)"
            )
        };
        let (resource, rest) = to.split_once(".extension[").ok_or_else(bad_to)?;
        let (url, value) = rest.rsplit_once("].").ok_or_else(bad_to)?;
        let value = match value {
            "valueString" => ValueType::String,
            "valueCode" => ValueType::Code,
            "valueBoolean" => ValueType::Boolean,
            "valueInteger" => ValueType::Integer,
            "valueDecimal" => ValueType::Decimal,
            "valueDateTime" => ValueType::DateTime,
            "valueCodeableConcept" => ValueType::CodeableConcept,
            "valueIdentifier" => ValueType::Identifier,
            _ => return Err(bad_to()),
        };
        if !crate::vocab::RESOURCE_TYPES.contains(&resource) {
            return Err(format!(
                "field map to {to:?}: {resource} is not a resource type the converter writes"
            ));
        }
        if !(url.starts_with("http://") || url.starts_with("https://") || url.starts_with("urn:"))
            || url.contains(['"', '\\', ' '])
        {
            return Err(format!(
                "field map to {to:?}: the extension's url must be an absolute URI"
            ));
        }
        Ok(Self {
            segment: segment.to_owned(),
            field,
            component,
            resource: resource.to_owned(),
            url: url.to_owned(),
            value,
        })
    }
}
