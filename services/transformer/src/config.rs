//! The transformer configuration: one YAML file (`--config`), every key overridable by `HL7GW_...` variables.

use hl7gw_runtime::config::{ConfigError, ServiceSettings};
use hl7gw_runtime::kafka::KafkaSettings;
use hl7gw_runtime::service::validate_common;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Where routes come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RoutesConfig {
    /// A YAML file of `HL7Route` documents, re-read when it changes.
    pub file: Option<PathBuf>,
    /// Watch `HL7Route` resources through the Kubernetes API (in-cluster config or `KUBECONFIG`).
    pub kubernetes: bool,
    /// Namespace to watch (default: the pod's namespace from `POD_NAMESPACE`, else the kubeconfig's).
    pub namespace: Option<String>,
    /// How often the routes file, and the files routes read (`toFhir` code maps), are checked for changes.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub reload_interval: Duration,
}

impl Default for RoutesConfig {
    fn default() -> Self {
        Self {
            file: None,
            kubernetes: false,
            namespace: None,
            reload_interval: Duration::from_secs(2),
        }
    }
}

/// TLS for `https://` plugin endpoints (`http://` endpoints are plain gRPC).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginTls {
    /// PEM file of the CA certificate(s) the plugins' server certificates are checked against; required for
    /// `https://` plugins (the system trust store is not used: point this at the system bundle, e.g.
    /// `/etc/ssl/certs/ca-certificates.crt`, to trust it). Without it an `https://` plugin call fails
    /// (`plugin_failed`, DLQ) and the transformer logs why.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for plugins that require mutual TLS; set with `key`.
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of `cert`.
    pub key: Option<PathBuf>,
}

/// What happens to a message no route matches (see [`Config::unmatched`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Unmatched {
    /// To the DLQ with reason `unmatched` (replayable once a route takes it).
    #[default]
    DeadLetter,
    /// Counted and skipped.
    Drop,
}

/// The whole transformer configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listeners, drain and logs: the section every service has.
    pub service: ServiceSettings,
    /// Topic consumed.
    pub inbound_topic: String,
    /// Topic for messages a transform could not handle.
    pub dlq_topic: String,
    /// Output topics are `<prefix><destination>`.
    pub out_topic_prefix: String,
    /// Consumer group.
    pub group_id: String,
    /// Transactional id of this instance; must be unique per pod and stable across its restarts. Default
    /// `hl7gw-transformer-<POD_NAME or HOSTNAME>`; with neither set, an id unique to the process (logged), so
    /// two instances never fence each other but a restart does not fence its predecessor.
    pub transactional_id: Option<String>,
    /// Where the routes come from: a file, HL7Route resources, or both.
    pub routes: RoutesConfig,
    /// TLS for `https://` plugin endpoints.
    pub plugin_tls: PluginTls,
    /// Destination for messages no route matches; when set it takes precedence over `unmatched`.
    pub default_destination: Option<String>,
    /// What a message no route matches gets when `default_destination` is not set: `dead_letter` (the
    /// default: it goes to `dlq_topic` with rejection reason `unmatched`, counted in
    /// `hl7gw_transformer_dlq_writes_total{reason="unmatched"}`, so a route missing for a while loses nothing)
    /// or `drop` (counted in `hl7gw_transformer_messages_total{outcome="unmatched"}` and skipped; its offset
    /// is committed, so the message is gone). Messages are never routed before the first complete route list
    /// is loaded: until then the transformer consumes nothing and is not ready.
    pub unmatched: Unmatched,
    /// Most messages per Kafka transaction.
    pub batch_max: usize,
    /// Most input bytes per Kafka transaction (the record that crosses it still joins the batch, so a batch
    /// holds at most this plus one `kafka.max_message_bytes`). Inputs and their outputs stay in memory until
    /// the transaction commits, so this, not `batch_max`, bounds memory when messages are large.
    pub batch_max_bytes: usize,
    /// How long a batch waits for more messages once it has one.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub batch_linger: Duration,
    /// The shortest time from one transaction's start to the next one's: a batch whose linger is over sooner
    /// goes on gathering until then (or until it is full). Each transaction costs the broker about ten requests
    /// whatever its size, so this bounds them to 1/interval a second; it adds latency only when messages come
    /// faster than that (a message alone still waits only `batch_linger`). 0 turns it off.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub batch_interval: Duration,
    /// Bound on each transaction call (begin/commit/abort, offsets), and the producer's
    /// `transaction.timeout.ms`. It also bounds a batch: routing a batch (plugin calls included) stops after half
    /// of it, what was routed is committed and the rest is read again (`hl7gw_transformer_batches_cut_total`);
    /// the first message of a batch is always routed whole, each plugin call bounded by its own `timeoutMs`.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub transaction_timeout: Duration,
    /// The brokers, how to reach them, and the tuning of the consumer and the transactional producer.
    pub kafka: KafkaSettings,
    /// The delivery ledger: the events topic (`hl7.events`; empty: off) and its retention when created.
    pub ledger: hl7gw_runtime::ledger::LedgerSettings,
    /// The gRPC listener's TLS and who may call the Transform dry run (nobody unless allowed).
    pub grpc: hl7gw_runtime::grpc::GrpcSettings,
}

/// The longest `batch_linger` or `batch_interval`: a message waits for them before its transaction starts.
const MAX_BATCH_WAIT: Duration = Duration::from_secs(1);

impl Default for Config {
    fn default() -> Self {
        Self {
            inbound_topic: "hl7.inbound".into(),
            dlq_topic: "hl7.dlq".into(),
            out_topic_prefix: "hl7.out.".into(),
            group_id: "hl7gw-transformer".into(),
            transactional_id: None,
            routes: RoutesConfig::default(),
            plugin_tls: PluginTls::default(),
            default_destination: None,
            unmatched: Unmatched::default(),
            batch_max: 500,
            batch_max_bytes: 16 << 20,
            batch_linger: Duration::from_millis(5),
            batch_interval: Duration::from_millis(20),
            transaction_timeout: Duration::from_secs(10),
            service: ServiceSettings::default(),
            ledger: hl7gw_runtime::ledger::LedgerSettings::default(),
            kafka: KafkaSettings::default(),
            grpc: hl7gw_runtime::grpc::GrpcSettings::default(),
        }
    }
}

hl7gw_runtime::service_config!(Config);

impl Config {
    /// The gRPC methods of this service, as named in `grpc.allow`.
    pub const GRPC_METHODS: &'static [&'static str] = &["Transform"];

    /// Checks the rules serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rule = |m: &str| Err(ConfigError::Rule(m.to_owned()));
        validate_common(&self.kafka, &self.grpc, Self::GRPC_METHODS)?;
        self.ledger.validate()?;
        if self.inbound_topic.is_empty() || self.dlq_topic.is_empty() || self.group_id.is_empty() {
            return rule("inbound_topic, dlq_topic and group_id must be set");
        }
        if self.routes.file.is_none() && !self.routes.kubernetes {
            return rule("routes: set routes.file or routes.kubernetes");
        }
        if self.routes.file.is_some() && self.routes.kubernetes {
            return rule("routes: use routes.file or routes.kubernetes, not both");
        }
        if self.plugin_tls.cert.is_some() != self.plugin_tls.key.is_some() {
            return rule("plugin_tls: set cert and key together");
        }
        if self.plugin_tls.cert.is_some() && self.plugin_tls.ca.is_none() {
            return rule("plugin_tls: a client certificate needs ca (the plugins' CA) too");
        }
        if self.batch_max == 0 {
            return rule("batch_max must be at least 1");
        }
        if self.batch_max_bytes == 0 {
            return rule("batch_max_bytes must be at least 1");
        }
        if self.transaction_timeout < Duration::from_secs(1) {
            return rule("transaction_timeout must be at least 1s");
        }
        // Every message of a batch waits up to these before its transaction even starts.
        if self.batch_linger > MAX_BATCH_WAIT || self.batch_interval > MAX_BATCH_WAIT {
            return rule(
                "batch_linger and batch_interval must be at most 1s (each message waits for them)",
            );
        }
        if self.routes.reload_interval.is_zero() {
            return rule("routes.reload_interval must be more than 0");
        }
        if let Some(d) = &self.default_destination {
            hl7gw_runtime::config::check_destination_name(d)
                .map_err(|e| ConfigError::Rule(format!("default_destination: {e}")))?;
        }
        Ok(())
    }

    /// How long routing one batch may take before what is done is committed: half the transaction timeout.
    pub fn batch_time_budget(&self) -> Duration {
        self.transaction_timeout / 2
    }

    /// The output topic for a destination.
    pub fn out_topic(&self, destination: &str) -> String {
        format!("{}{destination}", self.out_topic_prefix)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn schema_and_reference_are_current() {
        let schema = hl7gw_runtime::config::reference::schema_json::<Config>();
        if let Err(e) = hl7gw_runtime::config::reference::check_current("transformer", &schema) {
            panic!("{e}");
        }
    }
    use super::*;

    #[test]
    fn defaults_need_a_route_source() {
        assert!(Config::default().validate().is_err());
        let c = Config {
            routes: RoutesConfig {
                file: Some("/etc/hl7gw/routes.yaml".into()),
                ..RoutesConfig::default()
            },
            ..Config::default()
        };
        c.validate().unwrap();
        let half_tls = Config {
            plugin_tls: PluginTls {
                cert: Some("/tls/client.pem".into()),
                ..PluginTls::default()
            },
            ..c.clone()
        };
        assert!(half_tls.validate().is_err(), "cert without key");
        for (linger, interval) in [(2000, 20), (5, 1500)] {
            let slow = Config {
                batch_linger: Duration::from_millis(linger),
                batch_interval: Duration::from_millis(interval),
                ..c.clone()
            };
            assert!(
                slow.validate().is_err(),
                "batch waits over 1s: {linger} / {interval} ms"
            );
        }
        assert_eq!(c.out_topic("lab"), "hl7.out.lab");
        assert_eq!(c.service.grpc_addr.port(), 50051);
    }
}
