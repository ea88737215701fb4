//! Compiles the IG's concept maps (`ig/codesystems/*.csv`) into sorted lookup tables: for each map, the v2
//! code and the FHIR code, display and code system of its unconditional rows (the FHIR code empty where the
//! IG maps the v2 code to nothing: the v2 code is still one of the table's).

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new("ig/codesystems");
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rerun-if-changed=build.rs");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("ig/codesystems")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    let mut out = String::from(
        "/// The IG's concept maps by name: (v2 code, FHIR code, display, system), sorted by v2 code.\n\
         pub static CONCEPT_MAPS: &[(&str, &[Row])] = &[\n",
    );
    let mut names = Vec::new();
    for path in &files {
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        let Some(name) = file
            .strip_prefix("HL7 Concept Map_ ")
            .and_then(|n| n.split(" - ").next())
        else {
            continue;
        };
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_path(path)
            .expect("csv");
        let mut rows: Vec<(String, String, String, String)> = Vec::new();
        for (i, rec) in reader.records().enumerate() {
            let Ok(rec) = rec else { continue };
            if i < 2 {
                continue;
            }
            let col = |n: usize| rec.get(n).unwrap_or("").trim().to_owned();
            let conditional = (3..=5).any(|n| !col(n).is_empty());
            let (code, fhir) = (col(0), col(6));
            if conditional || code.is_empty() {
                continue;
            }
            if rows.iter().any(|r| r.0 == code) {
                continue;
            }
            rows.push((code, fhir, col(8), col(9)));
        }
        rows.sort();
        names.push(name.to_owned());
        let _ = writeln!(out, "    ({name:?}, &[");
        for (code, fhir, display, system) in rows {
            let _ = writeln!(
                out,
                "        ({code:?}, {fhir:?}, {display:?}, {system:?}),"
            );
        }
        out.push_str("    ]),\n");
    }
    out.push_str("];\n\n");
    // A match on the name: compiled to comparisons by length and bytes, no scan of the whole list.
    out.push_str(
        "/// The rows of the concept map `name`.\npub fn map_rows(name: &str) -> Option<&'static [Row]> {\n    \
         let i = match name {\n",
    );
    for (i, name) in names.iter().enumerate() {
        let _ = writeln!(out, "        {name:?} => {i},");
    }
    out.push_str("        _ => return None,\n    };\n    Some(CONCEPT_MAPS[i].1)\n}\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("concept_maps.rs");
    std::fs::write(dest, out).expect("write concept_maps.rs");
}
