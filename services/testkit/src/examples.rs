//! The example configs (`examples/config/*.yaml`) checked by the services' own `--check-config`: the files they
//! name under `/etc/hl7gw/` (the chart's mount paths) are made in a temporary folder and the paths moved there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's `examples/` folder.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Runs `bin --check-config` on `examples/config/<name>` with every `/etc/hl7gw/...` path it names moved
/// into a temporary folder that holds such a file: certificates and keys from a test CA, a password, a tokens
/// file, a salt, the `make run` routes. No `HL7GW_` variable of the caller's environment reaches it.
pub fn check_example_config(bin: &Path, name: &str) -> Output {
    const PREFIX: &str = "/etc/hl7gw/";
    let pki = crate::pki::pki();
    let dir = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(examples_dir().join("config").join(name))
        .unwrap_or_else(|e| panic!("examples/config/{name}: {e}"));
    for word in text.split_whitespace() {
        let Some(rel) = word.strip_prefix(PREFIX) else {
            continue;
        };
        let path = dir.path().join(rel);
        let file = Path::new(rel)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        let content = match file {
            "tls.crt" => std::fs::read(pki.path("server.pem")),
            "tls.key" => std::fs::read(pki.path("server.key")),
            "ca.crt" => std::fs::read(pki.path("ca.pem")),
            "smart.key" => std::fs::read(pki.path("smart-client.key")),
            "password" => Ok(b"example-password\n".to_vec()),
            "tokens" => Ok(
                b"ops 0123456789abcdef0123456789abcdef\nviewer fedcba9876543210fedcba9876543210\n"
                    .to_vec(),
            ),
            "salt" => Ok(b"an example salt of 32 bytes long".to_vec()),
            "routes.yaml" => std::fs::read(examples_dir().join("pipeline/routes.yaml")),
            other => panic!("examples/config/{name}: no test content for a file named {other:?}"),
        }
        .expect("test file content");
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, content).expect("write test file");
    }
    let moved = text.replace(PREFIX, &format!("{}/", dir.path().display()));
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, moved).expect("write config");
    let mut cmd = Command::new(bin);
    cmd.arg("--check-config").arg("--config").arg(&config);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("HL7GW_") {
            cmd.env_remove(key);
        }
    }
    cmd.output().expect("run the service binary")
}

/// Asserts that `examples/config/<service>.yaml` passes `bin --check-config` (see [`check_example_config`]).
pub fn assert_example_passes_check_config(bin: &Path, service: &str) {
    let out = check_example_config(bin, &format!("{service}.yaml"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("configuration is valid"), "{stdout}");
}

/// Asserts that `bin --print-schema` prints `docs/config/<service>.schema.json` as checked in.
pub fn assert_print_schema_is_checked_in(bin: &Path, service: &str) {
    let out = Command::new(bin)
        .arg("--print-schema")
        .output()
        .expect("run the service binary");
    assert!(out.status.success());
    let path = examples_dir().join(format!("../docs/config/{service}.schema.json"));
    let checked_in =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(String::from_utf8_lossy(&out.stdout), checked_in);
}
