//! The IG's concept maps (`ig/codesystems/`, compiled by `build.rs`) and the code systems of v2 tables and
//! well-known coding system names.

/// A concept map row: v2 code, FHIR code, display, system.
pub type Row = (&'static str, &'static str, &'static str, &'static str);

include!(concat!(env!("OUT_DIR"), "/concept_maps.rs"));

/// One row of a concept map: the FHIR code, its display and its code system (the IG's, `'static`, or a site's
/// own, borrowed from the route's options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concept<'s> {
    pub code: &'s str,
    pub display: &'s str,
    pub system: &'s str,
}

/// The IG's translation of `code` in the concept map `map` (its name in the IG: `AdministrativeSex`,
/// `PatientClass[EncounterClass]`...), if the map has an unconditional row for it.
pub fn lookup(map: &str, code: &str) -> Option<Concept<'static>> {
    let rows = map_rows(map)?;
    let i = rows.binary_search_by(|r| r.0.cmp(code)).ok()?;
    let (_, code, display, system) = rows[i];
    if code.is_empty() {
        return None;
    }
    Some(Concept {
        code,
        display,
        system,
    })
}

/// True when `code` is one of the v2 codes of the map's table (mapped to FHIR or not).
pub fn has_code(map: &str, code: &str) -> bool {
    map_rows(map).is_some_and(|rows| rows.binary_search_by(|r| r.0.cmp(code)).is_ok())
}

/// True when the IG has a concept map named `map`.
pub fn has_map(map: &str) -> bool {
    map_rows(map).is_some()
}

/// The FHIR code system of a v2 table (`HL70203` or `0203`): `http://terminology.hl7.org/CodeSystem/v2-0203`.
pub fn v2_table_system(table: &str) -> Option<String> {
    let digits = table.strip_prefix("HL7").unwrap_or(table);
    (digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("http://terminology.hl7.org/CodeSystem/v2-{digits}"))
}

/// The URI of a well-known v2 name of coding system (HL7 table 0396), as the IG and terminology.hl7.org
/// give them.
pub fn coding_system(name: &str) -> Option<&'static str> {
    Some(match name {
        "LN" | "LOINC" => "http://loinc.org",
        "SCT" | "SNM" | "SNOMEDCT" | "SNOMED-CT" => "http://snomed.info/sct",
        "I10" | "ICD10" | "ICD-10" => "http://hl7.org/fhir/sid/icd-10",
        "I10C" | "ICD10CM" | "ICD-10-CM" => "http://hl7.org/fhir/sid/icd-10-cm",
        "I9" | "I9C" | "ICD9" | "ICD9CM" => "http://hl7.org/fhir/sid/icd-9-cm",
        "UCUM" | "ANS+" => "http://unitsofmeasure.org",
        "CVX" => "http://hl7.org/fhir/sid/cvx",
        "MVX" => "http://terminology.hl7.org/CodeSystem/MVX",
        "NDC" => "http://hl7.org/fhir/sid/ndc",
        "RXNORM" | "RXN" => "http://www.nlm.nih.gov/research/umls/rxnorm",
        "CPT" | "C4" => "http://www.ama-assn.org/go/cpt",
        "NUCC" => "http://nucc.org/provider-taxonomy",
        "ISO3166_1" | "ISO3166-1" => "urn:iso:std:iso:3166",
        "ISO+" | "ISO639" => "urn:ietf:bcp:47",
        "CDCREC" => "urn:oid:2.16.840.1.113883.6.238",
        // The same systems named by their OIDs (public health messages do).
        "2.16.840.1.113883.6.1" => "http://loinc.org",
        "2.16.840.1.113883.6.96" => "http://snomed.info/sct",
        "2.16.840.1.113883.6.8" => "http://unitsofmeasure.org",
        "2.16.840.1.113883.6.3" => "http://hl7.org/fhir/sid/icd-10",
        "2.16.840.1.113883.6.90" => "http://hl7.org/fhir/sid/icd-10-cm",
        "2.16.840.1.113883.6.103" => "http://hl7.org/fhir/sid/icd-9-cm",
        "2.16.840.1.113883.6.88" => "http://www.nlm.nih.gov/research/umls/rxnorm",
        "2.16.840.1.113883.6.12" => "http://www.ama-assn.org/go/cpt",
        "2.16.840.1.113883.12.292" => "http://hl7.org/fhir/sid/cvx",
        "2.16.840.1.113883.6.238" => "urn:oid:2.16.840.1.113883.6.238",
        "2.16.840.1.113883.5.1008" => "http://terminology.hl7.org/CodeSystem/v3-NullFlavor",
        "1.0.3166.1" | "1.0.3166.1.2.3" => "urn:iso:std:iso:3166",
        _ => return None,
    })
}

/// The system of a coding system named by an OID that [`coding_system`] does not know: an HL7 v2 table
/// (`2.16.840.1.113883.12.<n>`) as its terminology.hl7.org code system, any other as `urn:oid:`.
pub fn oid_system(oid: &str) -> Option<String> {
    if !crate::ids::is_oid(oid) {
        return None;
    }
    if let Some(n) = oid.strip_prefix("2.16.840.1.113883.12.")
        && n.len() <= 4
        && n.bytes().all(|b| b.is_ascii_digit())
    {
        return v2_table_system(&format!("{n:0>4}"));
    }
    Some(format!("urn:oid:{oid}"))
}

/// False when `code` cannot be a code of `system` (as far as its form, or the IG's list of it, tells): ISO
/// 3166 country codes are two letters, three letters (table 0399, listed by the IG's CountryCode map) or
/// three digits.
pub fn fits(system: &str, code: &str) -> bool {
    match system {
        "urn:iso:std:iso:3166" => match code.len() {
            2 => code.bytes().all(|b| b.is_ascii_uppercase()),
            3 if code.bytes().all(|b| b.is_ascii_digit()) => true,
            3 => has_code("CountryCode", code),
            _ => false,
        },
        _ => true,
    }
}

/// The resource types [`crate::convert`] writes (the keys [`crate::Options::write`] takes).
pub const RESOURCE_TYPES: &[&str] = &[
    "AllergyIntolerance",
    "Appointment",
    "Condition",
    "Coverage",
    "Device",
    "DiagnosticReport",
    "DocumentReference",
    "Encounter",
    "Immunization",
    "Location",
    "Observation",
    "Organization",
    "Patient",
    "Practitioner",
    "Provenance",
    "RelatedPerson",
    "ServiceRequest",
    "Specimen",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_igs_concept_maps_are_compiled() {
        let f = lookup("AdministrativeSex", "F").expect("F");
        assert_eq!(f.code, "female");
        assert_eq!(f.system, "http://hl7.org/fhir/administrative-gender");
        assert_eq!(
            lookup("AdministrativeSex", "A").map(|c| c.code),
            Some("other")
        );
        assert!(lookup("AdministrativeSex", "nope").is_none());
        assert!(has_map("PatientClass[EncounterClass]"));
        assert!(CONCEPT_MAPS.len() > 90, "{}", CONCEPT_MAPS.len());
        assert_eq!(
            v2_table_system("HL70203").as_deref(),
            Some("http://terminology.hl7.org/CodeSystem/v2-0203")
        );
    }
}
