//! `examples/config/ingress.yaml` passes hl7gw-ingress's own `--check-config` (the files it names made in a
//! temporary folder), and `--print-schema` prints the checked-in schema.

use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw-ingress");

#[test]
fn the_example_config_passes_check_config() {
    let out = hl7gw_testkit::examples::check_example_config(Path::new(BIN), "ingress.yaml");
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
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config/ingress.schema.json"),
    )
    .expect("docs/config/ingress.schema.json");
    assert_eq!(String::from_utf8_lossy(&out.stdout), checked_in);
}

#[test]
fn print_config_shows_every_layer_and_masks_secrets() {
    let out = std::process::Command::new(BIN)
        .args(["--print-config", "--mllp-addr", "127.0.0.1:2999"])
        .env(
            "HL7GW_KAFKA__PROPERTIES",
            r#"{"custom.password"="hunter2"}"#,
        )
        .env("HL7GW_MAX_SENDERS", "7")
        .output()
        .expect("run");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // Secrets belong in files (librdkafka's own secret properties are refused), yet any key naming one is masked.
    assert!(
        !stdout.contains("hunter2") && !stderr.contains("hunter2"),
        "{stdout}{stderr}"
    );
    assert!(stdout.contains("custom.password: <masked>"), "{stdout}");
    assert!(stdout.contains("mllp_addr: 127.0.0.1:2999"), "{stdout}");
    assert!(stdout.contains("max_senders: 7"), "{stdout}");
    assert!(stdout.contains("drain_timeout: 20s"), "{stdout}");
}
