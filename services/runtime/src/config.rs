//! Config loading: defaults, then the YAML file (`--config`), then `HL7GW_...` environment variables, then
//! command-line flags. Unknown keys and bad values are rejected before any port is bound.

use figment::Figment;
use figment::providers::{Env, Format, Serialized};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_saphyr::figment::Yaml;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub mod reference;

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is missing or unreadable.
    #[error("config file {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A key is unknown, a value has the wrong type, or a YAML document is malformed.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// The values are well-typed but do not make sense together.
    #[error("invalid configuration: {0}")]
    Rule(String),
}

/// The `service:` section every service's config has: where it listens, how long it may drain, how it logs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceSettings {
    /// gRPC listener: the service's API and the gRPC health service.
    pub grpc_addr: SocketAddr,
    /// Admin HTTP listener: `/healthz`, `/readyz`, `/metrics`.
    pub admin_addr: SocketAddr,
    /// Longest a SIGTERM drain may take.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::duration_schema")]
    pub drain_timeout: Duration,
    /// Logs as JSON lines instead of text.
    pub log_json: bool,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        Self {
            grpc_addr: ([0, 0, 0, 0], 50051).into(),
            admin_addr: ([0, 0, 0, 0], 9464).into(),
            drain_timeout: Duration::from_secs(20),
            log_json: false,
        }
    }
}

/// The JSON Schema of a `humantime` duration field (`500ms`, `30s`, `1h 30m`).
pub fn duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "pattern": reference::DURATION_PATTERN,
    })
}

/// What `--print-config` shows of a value whose key names a secret: never the value itself.
pub const MASKED: &str = "<masked>";

/// `cfg` as YAML for `--print-config`: every key with its effective value, except secrets: a value under a
/// key naming a password, secret or token (not a `*_file` path) and the password of a URL's user info are
/// [`MASKED`]. The services take secrets from files, so this masks only what `kafka.properties` or a URL
/// carries.
pub fn masked_yaml<T: Serialize>(cfg: &T) -> Result<String, ConfigError> {
    let mut value = serde_json::to_value(cfg).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    mask(&mut value, false);
    serde_saphyr::to_string(&value).map_err(|e| ConfigError::Invalid(e.to_string()))
}

/// Masks secrets in `value` (`secret`: `value` sits under a key naming one).
fn mask(value: &mut serde_json::Value, secret: bool) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                mask(v, secret || is_secret_key(k));
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| mask(v, secret)),
        serde_json::Value::String(s) if secret => *s = MASKED.to_owned(),
        serde_json::Value::String(s) => {
            if let Some(masked) = mask_url_password(s) {
                *s = masked;
            }
        }
        _ => {}
    }
}

/// True for a key that names a secret value: `sasl.password`, `ssl.key.password`, `client_secret`, `token`...
/// but not a file holding one (`password_file`, `tokens_file`) or an address (`oauth_token_endpoint`).
fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    let not_a_value = ["_file", ".location", "_path", "_endpoint", "_url", ".url"]
        .iter()
        .any(|s| k.ends_with(s));
    !not_a_value
        && ["password", "secret", "token", "credential", "private"]
            .iter()
            .any(|w| k.contains(w))
}

/// `scheme://user:password@host...` with the password masked; `None` when `s` has no such user info.
fn mask_url_password(s: &str) -> Option<String> {
    let (scheme, rest) = s.split_once("://")?;
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    let colon = rest[..at].find(':')?;
    Some(format!(
        "{scheme}://{}:{MASKED}{}",
        &rest[..colon],
        &rest[at..]
    ))
}

/// Longest destination name: it becomes a topic name after a prefix (`hl7.out.`), and Kafka's limit is 249.
pub const MAX_DESTINATION_NAME: usize = 200;

/// The one rule for destination names (egress `destinations`, routes, `default_destination`): 1 to
/// [`MAX_DESTINATION_NAME`] letters, digits, `.`, `_` or `-`, as they become part of a topic name.
pub fn check_destination_name(name: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if name.is_empty() || name.len() > MAX_DESTINATION_NAME || !name.bytes().all(allowed) {
        return Err(format!(
            "destination {name:?}: 1 to {MAX_DESTINATION_NAME} letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(())
}

/// Loads a service config: `T::default()`, overlaid by the YAML file, by `HL7GW_` environment variables
/// (`HL7GW_MLLP_ADDR` sets `mllp_addr`, `HL7GW_TLS__CERT` sets `tls.cert`), and by `flags` (a flag left out,
/// `None`, overrides nothing).
pub fn load<T, F>(file: Option<&Path>, flags: &F) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
    F: Serialize,
{
    load_with_env(file, flags, env())
}

/// The environment layer of [`load`]: `HL7GW_` variables, `__` for nesting. Left out: `HL7GW_CONFIG` (the
/// `--config` flag's variable) and the service-link variables Kubernetes injects for Services named `hl7gw-*`
/// (`HL7GW_INGRESS_SERVICE_HOST`, `HL7GW_INGRESS_PORT_50051_TCP_ADDR`, ...), which no config key looks like:
/// without this a pod with service links on would refuse to start on "unknown key".
pub fn env() -> Env {
    Env::prefixed("HL7GW_")
        .filter(|k| !ignored_env_key(k.as_str()))
        .split("__")
}

/// True for `CONFIG` and the shapes of Kubernetes service-link variables (the prefix already stripped):
/// `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORTNAME>]`, `<NAME>_PORT`,
/// `<NAME>_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR]`.
fn ignored_env_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    if k == "config" || k.contains("_service_host") || k.contains("_service_port") {
        return true;
    }
    let parts: Vec<&str> = k.split('_').collect();
    let Some(i) = parts.iter().rposition(|p| *p == "port") else {
        return false;
    };
    let rest = &parts[i + 1..];
    let numbered = rest.len() >= 2
        && rest[0].bytes().all(|b| b.is_ascii_digit())
        && matches!(rest[1], "tcp" | "udp" | "sctp")
        && (rest.len() == 2 || (rest.len() == 3 && matches!(rest[2], "proto" | "port" | "addr")));
    i > 0 && (rest.is_empty() || numbered)
}

/// [`load`] with an explicit environment provider (tests use this to avoid process-global state).
pub fn load_with_env<T, F>(file: Option<&Path>, flags: &F, env: Env) -> Result<T, ConfigError>
where
    T: DeserializeOwned + Serialize + Default,
    F: Serialize,
{
    let mut fig = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::File {
            path: path.display().to_string(),
            source,
        })?;
        fig = fig.merge(Yaml::string(&text));
    }
    let flags = serde_json::to_value(flags).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    fig.merge(env)
        .merge(Serialized::defaults(without_nulls(flags)))
        .extract()
        .map_err(|e| ConfigError::Invalid(e.to_string()))
}

/// `value` without its null members (the flags not given), at every depth.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => map
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k, without_nulls(v)))
            .collect(),
        other => other,
    }
}

/// Flags for the `service:` section.
#[derive(Debug, Clone, Default, clap::Args, Serialize)]
pub struct ServiceFlags {
    /// gRPC listener address (service.grpc_addr).
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,
    /// Admin HTTP (/healthz, /readyz, /metrics) address (service.admin_addr).
    #[arg(long)]
    pub admin_addr: Option<SocketAddr>,
}

/// Flags for the `kafka:` section.
#[derive(Debug, Clone, Default, clap::Args, Serialize)]
pub struct KafkaFlags {
    /// Kafka bootstrap servers (kafka.brokers).
    #[arg(long = "kafka-brokers")]
    pub brokers: Option<String>,
}

/// The flags every service takes (see [`Flags`]). Flags override the file and the environment.
#[derive(Debug, Clone, Default, clap::Args, Serialize)]
pub struct CommonFlags {
    /// YAML config file (every key also settable as HL7GW_<KEY>, nested keys with __).
    #[arg(long, env = "HL7GW_CONFIG")]
    #[serde(skip)]
    pub config: Option<std::path::PathBuf>,
    /// Validate the configuration and exit.
    #[arg(long)]
    #[serde(skip)]
    pub check_config: bool,
    /// Print the effective configuration (defaults, file, HL7GW_ variables and flags merged) as YAML, secrets
    /// masked, and exit.
    #[arg(long, conflicts_with = "check_config")]
    #[serde(skip)]
    pub print_config: bool,
    /// Print the JSON Schema of the configuration file and exit (docs/config/<service>.schema.json).
    #[arg(long, conflicts_with_all = ["check_config", "print_config"])]
    #[serde(skip)]
    pub print_schema: bool,
    #[command(flatten)]
    pub service: ServiceFlags,
    #[command(flatten)]
    pub kafka: KafkaFlags,
    /// Topic for rejected or undeliverable messages.
    #[arg(long)]
    pub dlq_topic: Option<String>,
}

/// A service binary's command line: the flags every service takes, then the service's own (`S`, [`NoFlags`]
/// for none).
#[derive(Debug, clap::Parser, Serialize)]
#[command(version)]
pub struct Flags<S: clap::Args> {
    #[command(flatten)]
    #[serde(flatten)]
    pub common: CommonFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub own: S,
}

impl<S: clap::Args> Flags<S> {
    /// Parses the process's arguments as the binary `name`, which `about` describes in `--help`; a usage
    /// error, `--help` and `--version` exit here, as clap's `parse` does.
    pub fn parse_as(name: &'static str, about: &'static str) -> Self {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Self::command().name(name).about(about).get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// The own flags of a service that has none.
#[derive(Debug, clap::Args, Serialize)]
pub struct NoFlags {}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn one_rule_for_destination_names() {
        for ok in [
            "lab",
            "a",
            "ris-2.main_x",
            &"d".repeat(MAX_DESTINATION_NAME),
        ] {
            assert!(check_destination_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "lab/x",
            "läb",
            &"d".repeat(MAX_DESTINATION_NAME + 1),
        ] {
            assert!(check_destination_name(bad).is_err(), "{bad}");
        }
    }

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Cfg {
        addr: String,
        port: u16,
        tls: Tls,
    }

    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Tls {
        cert: Option<String>,
    }

    #[derive(Serialize)]
    struct Flags {
        port: Option<u16>,
    }

    #[test]
    fn layers_override_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, "addr: from-file\nport: 1\ntls:\n  cert: a.pem\n").unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("T_PORT", "2");
            jail.set_env("T_TLS__CERT", "b.pem");
            let env = Env::prefixed("T_").split("__");
            let c: Cfg = load_with_env(Some(&file), &Flags { port: None }, env.clone()).unwrap();
            assert_eq!(c.addr, "from-file");
            assert_eq!(c.port, 2);
            assert_eq!(c.tls.cert.as_deref(), Some("b.pem"));
            let c: Cfg = load_with_env(Some(&file), &Flags { port: Some(3) }, env).unwrap();
            assert_eq!(c.port, 3);
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, "adr: typo\n").unwrap();
        let none = Flags { port: None };
        let env = || Env::prefixed("NOTHING_SET_");
        assert!(load_with_env::<Cfg, _>(Some(&file), &none, env()).is_err());
        std::fs::write(&file, "port: not-a-number\n").unwrap();
        assert!(load_with_env::<Cfg, _>(Some(&file), &none, env()).is_err());
        let missing = dir.path().join("missing.yaml");
        assert!(matches!(
            load_with_env::<Cfg, _>(Some(&missing), &none, env()),
            Err(ConfigError::File { .. })
        ));
        figment::Jail::expect_with(|jail| {
            jail.set_env("T_PROT", "1");
            assert!(load_with_env::<Cfg, _>(None, &none, Env::prefixed("T_")).is_err());
            Ok(())
        });
    }

    #[test]
    fn shared_flags_land_in_their_sections_and_keep_the_rest() {
        #[derive(Debug, Default, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        struct Svc {
            service: ServiceSettings,
            kafka: crate::kafka::KafkaSettings,
            dlq_topic: String,
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(
            &file,
            "service:\n  log_json: true\nkafka:\n  brokers: file:9092\n  linger_ms: 3\n",
        )
        .unwrap();
        let mut flags = CommonFlags::default();
        flags.kafka.brokers = Some("flag:9092".into());
        flags.service.admin_addr = Some(([127, 0, 0, 1], 0).into());
        let c: Svc = load_with_env(Some(&file), &flags, Env::prefixed("NOTHING_SET_")).unwrap();
        assert_eq!(c.kafka.brokers, "flag:9092");
        assert_eq!(c.kafka.linger_ms, 3);
        assert!(c.service.log_json);
        assert_eq!(c.service.admin_addr, ([127, 0, 0, 1], 0).into());
        assert_eq!(c.service.grpc_addr, ServiceSettings::default().grpc_addr);
        let none: Svc = load_with_env(
            Some(&file),
            &CommonFlags::default(),
            Env::prefixed("NOTHING_SET_"),
        )
        .unwrap();
        assert_eq!(none.kafka.brokers, "file:9092");
    }

    #[test]
    fn kubernetes_service_links_and_the_config_path_are_not_config_keys() {
        for k in [
            "CONFIG",
            "INGRESS_SERVICE_HOST",
            "INGRESS_SERVICE_PORT",
            "INGRESS_SERVICE_PORT_MLLP",
            "INGRESS_PORT",
            "INGRESS_PORT_2575_TCP",
            "INGRESS_PORT_2575_TCP_ADDR",
            "EGRESS_PORT_9464_TCP_PROTO",
        ] {
            assert!(ignored_env_key(k), "{k}");
        }
        for k in [
            "MLLP_ADDR",
            "KAFKA__LINGER_MS",
            "PORT",
            "TLS__CERT",
            "REPORT",
            "PORT_X",
        ] {
            assert!(!ignored_env_key(k), "{k}");
        }
        figment::Jail::expect_with(|jail| {
            jail.set_env("HL7GW_PORT", "7");
            jail.set_env("HL7GW_INGRESS_PORT_2575_TCP_ADDR", "10.0.0.1");
            jail.set_env("HL7GW_INGRESS_SERVICE_HOST", "10.0.0.1");
            jail.set_env("HL7GW_CONFIG", "/etc/hl7gw/config.yaml");
            let c: Cfg = load_with_env(None, &Flags { port: None }, env()).unwrap();
            assert_eq!(c.port, 7);
            Ok(())
        });
    }

    #[test]
    fn print_config_masks_secrets_not_paths() {
        let mut kafka = crate::kafka::KafkaSettings::default();
        kafka.security.password_file = Some("/etc/hl7gw/kafka/password".into());
        kafka.security.oauth_token_endpoint = Some("https://svc:hunter2@idp.example/token".into());
        kafka
            .properties
            .insert("sasl.oauthbearer.client.secret".into(), "hunter2".into());
        kafka
            .properties
            .insert("ssl.truststore.location".into(), "/etc/ca.pem".into());
        let yaml = masked_yaml(&kafka).expect("yaml");
        assert!(!yaml.contains("hunter2"), "{yaml}");
        assert!(
            yaml.contains("password_file: /etc/hl7gw/kafka/password"),
            "{yaml}"
        );
        assert!(
            yaml.contains("https://svc:<masked>@idp.example/token"),
            "{yaml}"
        );
        assert!(
            yaml.contains("sasl.oauthbearer.client.secret: <masked>"),
            "{yaml}"
        );
        assert!(
            yaml.contains("ssl.truststore.location: /etc/ca.pem"),
            "{yaml}"
        );
    }
}
