//! `examples/config/ingress.yaml` passes hl7gw-ingress's own `--check-config` (the files it names made in a
//! temporary folder), and `--print-schema` prints the checked-in schema.

use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw-ingress");

#[test]
fn the_example_config_passes_check_config() {
    hl7gw_testkit::examples::assert_example_passes_check_config(Path::new(BIN), "ingress");
}

#[test]
fn print_schema_prints_the_checked_in_schema() {
    hl7gw_testkit::examples::assert_print_schema_is_checked_in(Path::new(BIN), "ingress");
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
