//! `examples/config/transformer.yaml` passes hl7gw-transformer's own `--check-config` (the files it names made in a
//! temporary folder), and `--print-schema` prints the checked-in schema.

use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_hl7gw-transformer");

#[test]
fn the_example_config_passes_check_config() {
    hl7gw_testkit::examples::assert_example_passes_check_config(Path::new(BIN), "transformer");
}

#[test]
fn print_schema_prints_the_checked_in_schema() {
    hl7gw_testkit::examples::assert_print_schema_is_checked_in(Path::new(BIN), "transformer");
}
