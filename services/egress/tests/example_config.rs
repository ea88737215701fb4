//! `examples/config/egress.yaml` passes hl7gw-egress's own `--check-config` (the files it names made in a
//! temporary folder), and `--print-schema` prints the checked-in schema.

use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw-egress");

#[test]
fn the_example_config_passes_check_config() {
    let out = hl7gw_testkit::examples::check_example_config(Path::new(BIN), "egress.yaml");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("configuration is valid"), "{stdout}");
}

#[test]
fn print_schema_prints_the_checked_in_schema() {
    let out = std::process::Command::new(BIN)
        .arg("--print-schema")
        .output()
        .expect("run");
    assert!(out.status.success());
    let checked_in = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config/egress.schema.json"),
    )
    .expect("docs/config/egress.schema.json");
    assert_eq!(String::from_utf8_lossy(&out.stdout), checked_in);
}
