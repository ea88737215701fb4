//! Differential test: the flat view of every corpus file against the reference parser's
//! (`../shared/testdata/hl7/expected-flat.jsonl`). Skips, saying so, when the corpus is not there.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Files where we are sure the expected view is wrong: (file, what we do instead: parses?, why). Keep it short.
const KNOWN_DIFFERENCES: &[(&str, bool, &str)] = &[];

fn corpus_dir() -> PathBuf {
    std::env::var_os("TESTDATA_HL7").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/hl7"),
        PathBuf::from,
    )
}

fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| char::from(c)).collect()
}

#[test]
fn corpus_flat_view_matches_reference() {
    let dir = corpus_dir();
    let expected = dir.join("expected-flat.jsonl");
    let Ok(text) = std::fs::read_to_string(&expected) else {
        println!("corpus test skipped: {} not found", expected.display());
        return;
    };
    let mut checked = 0;
    let mut failures = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let file = v["file"].as_str().unwrap();
        let bytes = std::fs::read(dir.join(file)).unwrap();
        if let Some((_, ours, why)) = KNOWN_DIFFERENCES.iter().find(|(f, _, _)| *f == file) {
            assert_eq!(hl7v2::flat_file(&bytes).is_ok(), *ours, "{file}: {why}");
            continue;
        }
        let want_ok = v["ok"].as_bool().unwrap();
        checked += 1;
        match (hl7v2::flat_file(&bytes), want_ok) {
            (Ok(_), false) => {
                failures.push(format!("{file}: parsed, reference fails ({})", v["error"]))
            }
            (Err(e), true) => failures.push(format!("{file}: failed ({e}), reference parses")),
            (Err(_), false) => {}
            (Ok(flat), true) => {
                let got: BTreeMap<String, String> =
                    flat.iter().map(|e| (e.key(), latin1(&e.value))).collect();
                let want: BTreeMap<String, String> = v["flat"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect();
                if got.len() != flat.len() {
                    failures.push(format!("{file}: duplicate keys in flat view"));
                }
                if got != want {
                    let mut diff = Vec::new();
                    for (k, w) in &want {
                        match got.get(k) {
                            Some(g) if g == w => {}
                            g => diff.push(format!("  {k}: want {w:?} got {g:?}")),
                        }
                    }
                    for (k, g) in &got {
                        if !want.contains_key(k) {
                            diff.push(format!("  {k}: want nothing, got {g:?}"));
                        }
                    }
                    diff.truncate(8);
                    failures.push(format!("{file}:\n{}", diff.join("\n")));
                }
            }
        }
    }
    assert!(checked > 200, "only {checked} corpus files checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} files disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("corpus: {checked} files agree with the reference");
}
