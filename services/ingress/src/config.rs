//! The ingress configuration: one YAML file (`--config`), every key overridable by `HL7GW_...` variables and
//! the main ones by flags. Read and validated before any port is bound.

use hl7gw_runtime::config::{ConfigError, ServiceSettings};
use hl7gw_runtime::kafka::KafkaSettings;
use hl7gw_runtime::service::validate_common;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Room for the envelope around the largest message (header copy, ids, source, trace, stage).
pub const ENVELOPE_HEADROOM: usize = 64 * 1024;

/// When the sender gets its accept ACK.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AckMode {
    /// AA/CA only after Kafka confirmed the write (acks=all). The default.
    Durable,
    /// AA/CA after parsing; the publish happens behind it (a crash or a Kafka outage can lose ACKed messages).
    Fast,
}

/// What a sender gets when Kafka does not confirm a write within `ack_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// AR/CR with ERR 207 ("system unavailable"): the sender may resend.
    Nak,
    /// No answer; the connection is closed, so the sender resends.
    Close,
}

/// Whether the MLLP listener sends an enhanced-mode (MSH-15/16 valued) message its accept ACK (CA/CE/CR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AcceptAck {
    /// As MSH-15 asks (AL, NE, ER, SU; empty or unknown counts as AL): the standard. The default.
    Msh15,
    /// Always, whatever MSH-15 says: for senders (HAPI's client among them) that wait for an answer to every
    /// message even when they send `NE`.
    Always,
}

/// Whether the MLLP listener answers an enhanced-mode message's MSH-16 with an application ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApplicationAck {
    /// Never: the gateway only commits (accept ACK); the application behind it does not answer. The default.
    None,
    /// The gateway acts as the application once Kafka confirmed the write: after the accept ACK (if any), a
    /// second message on the same connection, MSA-1 AA (AE/AR with the ERR when refused) as MSH-16 asks
    /// (AL, ER, SU; empty, unknown or NE: none), its own MSH-10, MSA-2 the message's MSH-10, MSH-15/16 empty.
    OnStore,
}

/// TLS for the MLLP listener (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Server certificate chain.
    pub cert: PathBuf,
    /// Server private key.
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (mutual TLS).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// A sender named in the config (`senders:`): its messages are counted in the per-sender metrics
/// (`hl7gw_ingress_sender_*{sender="<name>"}`), which only named senders get, so the label stays bounded.
/// Matched on the first component (HD-1) of MSH-3 and MSH-4 as received, case-sensitively.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NamedSender {
    /// The `sender` label: 1 to 64 letters, digits, `_`, `-` or `.`; unique.
    pub name: String,
    /// MSH-3's first component (namespace id), e.g. `LAB`.
    pub sending_application: String,
    /// MSH-4's first component; absent: any facility.
    #[serde(default)]
    pub sending_facility: Option<String>,
}

/// Longest `senders[].name` (a metric label value).
pub const MAX_SENDER_NAME: usize = 64;

/// The whole ingress configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// MLLP listener address.
    pub mllp_addr: SocketAddr,
    /// Listeners, drain and logs: the section every service has.
    pub service: ServiceSettings,
    /// Topic for accepted messages.
    pub inbound_topic: String,
    /// Topic for rejected input, with the reason.
    pub dlq_topic: String,
    /// `durable` (default) or `fast`.
    pub ack_mode: AckMode,
    /// How long a message may wait for Kafka's confirmation before the sender gets `on_timeout`.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub ack_timeout: Duration,
    /// `nak` (AR/CR with ERR 207) or `close` (no answer, connection closed).
    pub on_timeout: OnTimeout,
    /// Terser paths whose values, joined by `|`, make the Kafka key (keeps one patient in one partition).
    pub key_paths: Vec<String>,
    /// When set, the Kafka key is the hex SHA-256 of this file's content (a salt in a mounted Secret) and the
    /// `key_paths` value: the same patient still lands in the same partition, but the key, which Kafka tools
    /// show without reading the payload, no longer reads as a medical record number.
    pub key_salt_file: Option<PathBuf>,
    /// Largest MLLP payload accepted, in bytes.
    pub max_frame_bytes: usize,
    /// Most simultaneous MLLP connections; at the limit a new one closes a stale one (`evict_after`) or is
    /// refused (`hl7gw_ingress_connections_refused_total{reason="max_connections"}`).
    pub max_connections: usize,
    /// Most simultaneous MLLP connections from one client address (the PROXY protocol header's with
    /// `proxy_protocol`, else the TCP peer's); at the bound a new one closes a stale one of the same address or
    /// is refused (`reason="max_connections_per_address"`), so one address cannot take every slot. 0: no bound.
    /// Behind a load balancer or a Service that rewrites source addresses (SNAT) without PROXY protocol, every
    /// sender has the same address: raise this to `max_connections` or set 0.
    pub max_connections_per_address: usize,
    /// A connection that completes no frame for this long (since it opened, or since its last complete frame)
    /// is closed, whatever bytes it trickles in between (counted in `hl7gw_ingress_idle_closes_total`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub idle_timeout: Duration,
    /// At `max_connections`, a new connection closes one doing nothing for anyone: the oldest that never
    /// completed a frame, else the one with no complete frame for longest if longer than this and nothing of it
    /// is unanswered, else one whose answers went unread for this long. Idle, slow and never-reading clients
    /// cannot keep real senders out (counted in `hl7gw_ingress_connections_evicted_total`; 0s: never, new
    /// connections are refused instead).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub evict_after: Duration,
    /// A frame not complete this long after its start block is dropped and the connection closed, however
    /// often bytes arrive (framing error `frame_timeout`): a deadline for the whole frame, not between reads.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub frame_timeout: Duration,
    /// Messages of one connection that may wait for Kafka at once (frames beyond wait, in order).
    pub max_in_flight_per_connection: usize,
    /// Bytes of messages one connection (or gRPC stream) may have waiting for Kafka or for their ACK to be
    /// written; beyond it the ingress stops reading that connection (TCP backpressure).
    pub max_in_flight_bytes_per_connection: usize,
    /// Bytes of messages all connections and gRPC streams together may have waiting (one budget for the
    /// process, drawn from by every connection within its own bound; each message is charged its bytes plus
    /// a fixed overhead); 0 sizes it from the memory limit (a quarter, 32 MiB to 1 GiB; 256 MiB without a
    /// limit). When it is spent, connections wait before reading more (`hl7gw_ingress_in_flight_bytes`).
    pub max_in_flight_bytes: usize,
    /// Most messages one FHS/BHS batch may hold; a larger batch is refused whole with one answer (AE,
    /// `batch_too_large`) and dead-lettered once, not cut into tens of thousands of records.
    pub max_batch_messages: usize,
    /// A sender that does not read its ACKs for this long is disconnected (its unanswered messages are
    /// resent by it, and counted in `hl7gw_ingress_write_timeouts_total`); a gRPC `SendStream` that does not
    /// read its answers for this long is ended with RESOURCE_EXHAUSTED, counted the same way.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub write_timeout: Duration,
    /// Most concurrent gRPC streams (SendStream and unary calls) per gRPC connection.
    pub grpc_max_concurrent_streams: u32,
    /// Most gRPC connections open at once; at the limit a new one closes the stalest idle one (no call for
    /// 5 s, or none ever) or waits up to 5 s for a slot, then is closed.
    pub grpc_max_connections: usize,
    /// Most gRPC connections open at once from one client address (open streams count); at the bound a new
    /// one closes an idle one of the same address or is refused. 0: no bound.
    pub grpc_max_connections_per_address: usize,
    /// Messages per second one connection may send (0: unlimited); faster senders are slowed, not refused.
    pub rate_limit_per_connection: f64,
    /// A resend (the same sending application, sending facility and MSH-10, with the same bytes) within this
    /// window gets the first ACK again and is not published twice (0s: off). A reused control id with other
    /// content is a new message (counted in `hl7gw_ingress_control_id_reused_total`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub duplicate_window: Duration,
    /// Most remembered messages for duplicate detection.
    pub duplicate_capacity: usize,
    /// Most bytes the duplicate window may hold (each remembered message costs its ACK plus ~96 bytes); the
    /// oldest are forgotten first.
    pub duplicate_max_bytes: usize,
    /// Enhanced mode on the MLLP listener: `msh15` (default) sends the accept ACK (CA/CE/CR) as MSH-15 asks;
    /// `always` sends it whatever MSH-15 says. Original mode (MSH-15/16 empty) always gets its AA/AE/AR.
    pub accept_ack: AcceptAck,
    /// Enhanced mode on the MLLP listener: `none` (default) or `on_store` (an application ACK, AA/AE/AR, as
    /// MSH-16 asks, once Kafka confirmed the write or the message was refused). Needs `ack_mode: durable` and
    /// no `mllp2_commit_acks`.
    pub application_ack: ApplicationAck,
    /// MLLP release 2: answer each frame with a commit acknowledgement block (0x06 / 0x15) instead of an
    /// HL7 ACK message.
    pub mllp2_commit_acks: bool,
    /// Expect a PROXY protocol v1/v2 header on each connection (behind a load balancer that sends one).
    pub proxy_protocol: bool,
    /// TLS for the MLLP listener; absent means plain TCP.
    pub tls: Option<TlsConfig>,
    /// Character set of messages without MSH-18 (a table 0211 value).
    pub charset_fallback: String,
    /// MSH-12 versions accepted (prefix match: "2.5" accepts "2.5.1").
    pub versions: Vec<String>,
    /// MSH-11.1 processing ids accepted (empty: any).
    pub processing_ids: Vec<String>,
    /// Name of the MLLP listener in envelopes and metrics.
    pub listener_name: String,
    /// The brokers, how to reach them, and the client tuning.
    pub kafka: KafkaSettings,
    /// The gRPC listener's TLS and who may call which method (admin methods: nobody unless allowed).
    pub grpc: hl7gw_runtime::grpc::GrpcSettings,
    /// Senders that get their own metrics (`hl7gw_ingress_sender_*{sender}`), e.g. for a "sender silent"
    /// alert. Every sender is in the sender view (`Senders`, `hl7gw senders`) whether named or not.
    pub senders: Vec<NamedSender>,
    /// Most distinct (MSH-3, MSH-4) pairs the sender view tracks; at the bound a new pair replaces the least
    /// recent unnamed one, whose counts move to the view's `other` entry
    /// (`hl7gw_ingress_senders_evicted_total`).
    pub max_senders: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            mllp_addr: ([0, 0, 0, 0], 2575).into(),
            service: ServiceSettings::default(),
            inbound_topic: "hl7.inbound".into(),
            dlq_topic: "hl7.dlq".into(),
            ack_mode: AckMode::Durable,
            ack_timeout: Duration::from_secs(5),
            on_timeout: OnTimeout::Nak,
            key_paths: vec!["MSH-4".into(), "PID-3-1".into()],
            key_salt_file: None,
            max_frame_bytes: hl7v2::mllp::DEFAULT_MAX_FRAME,
            max_connections: 1024,
            max_connections_per_address: 256,
            idle_timeout: Duration::from_secs(300),
            frame_timeout: Duration::from_secs(30),
            evict_after: Duration::from_secs(10),
            max_in_flight_per_connection: 256,
            max_in_flight_bytes_per_connection: 16 * 1024 * 1024,
            max_in_flight_bytes: 0,
            max_batch_messages: 1000,
            write_timeout: Duration::from_secs(30),
            grpc_max_concurrent_streams: 64,
            grpc_max_connections: 1024,
            grpc_max_connections_per_address: hl7gw_runtime::grpc::MAX_CONNECTIONS_PER_ADDRESS,
            rate_limit_per_connection: 0.0,
            duplicate_window: Duration::from_secs(600),
            duplicate_capacity: 200_000,
            duplicate_max_bytes: 64 * 1024 * 1024,
            mllp2_commit_acks: false,
            accept_ack: AcceptAck::Msh15,
            application_ack: ApplicationAck::None,
            proxy_protocol: false,
            tls: None,
            charset_fallback: "UNICODE UTF-8".into(),
            versions: [
                "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9",
            ]
            .map(String::from)
            .to_vec(),
            processing_ids: vec!["P".into(), "D".into(), "T".into()],
            listener_name: "mllp".into(),
            kafka: KafkaSettings::default(),
            grpc: hl7gw_runtime::grpc::GrpcSettings::default(),
            senders: Vec::new(),
            max_senders: 1000,
        }
    }
}

hl7gw_runtime::service_config!(Config);

impl Config {
    /// `key_salt_file`'s content (at least 16 bytes: a short salt makes identifiers guessable).
    pub fn read_key_salt(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        let Some(path) = &self.key_salt_file else {
            return Ok(None);
        };
        let salt = std::fs::read(path).map_err(|source| ConfigError::File {
            path: path.display().to_string(),
            source,
        })?;
        let salt = salt.trim_ascii_end().to_vec();
        if salt.len() < 16 {
            return Err(ConfigError::Rule(format!(
                "key_salt_file {}: at least 16 bytes of salt",
                path.display()
            )));
        }
        Ok(Some(salt))
    }

    /// [`Config::max_in_flight_bytes`], or sized from `limit` (the process's memory limit) when it is 0: a
    /// quarter of the limit, 32 MiB to 1 GiB, and never below one connection's bound.
    pub fn in_flight_budget(&self, limit: Option<u64>) -> usize {
        const MIB: u64 = 1 << 20;
        let sized = match (self.max_in_flight_bytes, limit) {
            (0, Some(l)) => (l / 4).clamp(32 * MIB, 1024 * MIB) as usize,
            (0, None) => (256 * MIB) as usize,
            (n, _) => n,
        };
        sized.max(self.max_in_flight_bytes_per_connection)
    }

    /// The gRPC methods of this service, as named in `grpc.allow`.
    pub const GRPC_METHODS: &'static [&'static str] = &["Ingest", "Senders"];

    /// Checks the rules serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rule = |m: &str| Err(ConfigError::Rule(m.to_owned()));
        validate_common(&self.kafka, &self.grpc, Self::GRPC_METHODS)?;
        if self.inbound_topic.is_empty() || self.dlq_topic.is_empty() {
            return rule("inbound_topic and dlq_topic must be set");
        }
        if self.ack_timeout.is_zero() {
            return rule("ack_timeout must be more than 0");
        }
        if self.max_frame_bytes < 64 {
            return rule("max_frame_bytes must be at least 64");
        }
        if self.max_frame_bytes + ENVELOPE_HEADROOM > self.kafka.max_message_bytes {
            return Err(ConfigError::Rule(format!(
                "max_frame_bytes ({}) plus {ENVELOPE_HEADROOM} bytes of envelope must fit kafka.max_message_bytes ({}): \
                 raise kafka.max_message_bytes (and the topics' max.message.bytes) or lower max_frame_bytes",
                self.max_frame_bytes, self.kafka.max_message_bytes
            )));
        }
        if self.max_connections == 0 || self.max_in_flight_per_connection == 0 {
            return rule("max_connections and max_in_flight_per_connection must be at least 1");
        }
        if self.idle_timeout.is_zero()
            || self.frame_timeout.is_zero()
            || self.write_timeout.is_zero()
        {
            return rule("idle_timeout, frame_timeout and write_timeout must be more than 0");
        }
        if !(64 * 1024..=1 << 30).contains(&self.max_in_flight_bytes_per_connection) {
            return rule("max_in_flight_bytes_per_connection must be between 64 KiB and 1 GiB");
        }
        if self.max_in_flight_bytes != 0
            && !(self.max_in_flight_bytes_per_connection..=1 << 32)
                .contains(&self.max_in_flight_bytes)
        {
            return rule(
                "max_in_flight_bytes must be 0 (sized from the memory limit) or between \
                 max_in_flight_bytes_per_connection and 4 GiB",
            );
        }
        if !(1..=100_000).contains(&self.max_batch_messages) {
            return rule("max_batch_messages must be between 1 and 100000");
        }
        if self.application_ack == ApplicationAck::OnStore {
            if self.ack_mode != AckMode::Durable {
                return rule(
                    "application_ack: on_store needs ack_mode: durable (it answers once Kafka stored the message)",
                );
            }
            if self.mllp2_commit_acks {
                return rule(
                    "application_ack: on_store cannot be used with mllp2_commit_acks (commit blocks are the only answer)",
                );
            }
        }
        if self.grpc_max_concurrent_streams == 0 || self.grpc_max_connections == 0 {
            return rule("grpc_max_concurrent_streams and grpc_max_connections must be at least 1");
        }
        if !(self.rate_limit_per_connection >= 0.0 && self.rate_limit_per_connection.is_finite()) {
            return rule("rate_limit_per_connection must be 0 or a positive number");
        }
        if self.key_paths.is_empty() {
            return rule("key_paths needs at least one terser path");
        }
        for p in &self.key_paths {
            if let Err(e) = hl7v2::Path::parse(p) {
                return Err(ConfigError::Rule(format!("key_paths: {e}")));
            }
        }
        if let Err(e) = hl7v2::Charset::from_msh18(self.charset_fallback.as_bytes()) {
            return Err(ConfigError::Rule(format!(
                "charset_fallback {:?}: {e}",
                self.charset_fallback
            )));
        }
        if self.versions.is_empty() {
            return rule("versions must list at least one HL7 version");
        }
        self.validate_senders()?;
        if let Some(tls) = &self.tls {
            for (what, p) in [("tls.cert", Some(&tls.cert)), ("tls.key", Some(&tls.key))]
                .into_iter()
                .chain([("tls.client_ca", tls.client_ca.as_ref())])
            {
                if let Some(p) = p
                    && !p.is_file()
                {
                    return Err(ConfigError::Rule(format!(
                        "{what}: {} is not a file",
                        p.display()
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Config {
    /// `senders` and `max_senders`: names label-safe and unique, each (application, facility) named once,
    /// values a single HD component.
    fn validate_senders(&self) -> Result<(), ConfigError> {
        let rule = |m: String| Err(ConfigError::Rule(m));
        // The whole view is one gRPC answer: 10,000 senders of the longest MSH-3/MSH-4 stay within a few MiB.
        if !(1..=10_000).contains(&self.max_senders) {
            return rule("max_senders must be between 1 and 10000".into());
        }
        if self.senders.len() > 1000 {
            return rule(
                "senders: at most 1000 named senders (each one is a metric label value)".into(),
            );
        }
        let mut names = std::collections::HashSet::new();
        let mut pairs = std::collections::HashSet::new();
        for (i, s) in self.senders.iter().enumerate() {
            let safe = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
            if s.name.is_empty() || s.name.len() > MAX_SENDER_NAME || !s.name.bytes().all(safe) {
                return rule(format!(
                    "senders[{i}].name {:?}: 1 to {MAX_SENDER_NAME} letters, digits, '_', '-' or '.'",
                    s.name
                ));
            }
            if !names.insert(s.name.as_str()) {
                return rule(format!("senders[{i}].name {:?} is used twice", s.name));
            }
            let hd1 = |what: &str, v: &str| {
                let bad = |c: char| matches!(c, '|' | '^' | '~' | '\\' | '&') || c.is_control();
                if v.is_empty() || v.len() > hl7v2::ack::MAX_HD || v.contains(bad) {
                    Err(ConfigError::Rule(format!(
                        "senders[{i}].{what} {v:?}: the first component of the field as sent (1 to {} \
                         characters, no delimiters)",
                        hl7v2::ack::MAX_HD
                    )))
                } else {
                    Ok(())
                }
            };
            hd1("sending_application", &s.sending_application)?;
            if let Some(f) = &s.sending_facility {
                hd1("sending_facility", f)?;
            }
            if !pairs.insert((
                s.sending_application.as_str(),
                s.sending_facility.as_deref(),
            )) {
                return rule(format!(
                    "senders[{i}] ({}): this sending application and facility are named twice",
                    s.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn schema_and_reference_are_current() {
        let schema = hl7gw_runtime::config::reference::schema_json::<Config>();
        if let Err(e) = hl7gw_runtime::config::reference::check_current("ingress", &schema) {
            panic!("{e}");
        }
    }
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_design() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.mllp_addr.port(), 2575);
        assert_eq!(c.service.grpc_addr.port(), 50051);
        assert_eq!(c.service.admin_addr.port(), 9464);
        assert_eq!(c.ack_mode, AckMode::Durable);
        assert_eq!(c.inbound_topic, "hl7.inbound");
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = [
            Config {
                ack_timeout: Duration::ZERO,
                ..Config::default()
            },
            Config {
                key_paths: vec!["PID".into()],
                ..Config::default()
            },
            Config {
                charset_fallback: "EBCDIC".into(),
                ..Config::default()
            },
            Config {
                max_frame_bytes: 1,
                ..Config::default()
            },
            Config {
                rate_limit_per_connection: -1.0,
                ..Config::default()
            },
            Config {
                application_ack: ApplicationAck::OnStore,
                ack_mode: AckMode::Fast,
                ..Config::default()
            },
            Config {
                application_ack: ApplicationAck::OnStore,
                mllp2_commit_acks: true,
                ..Config::default()
            },
            Config {
                tls: Some(TlsConfig {
                    cert: "/nonexistent.pem".into(),
                    key: "/nonexistent.key".into(),
                    client_ca: None,
                }),
                ..Config::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    /// Issue 26, item 3: named senders are label-safe, unique, and name one HD component; unknown keys of an
    /// entry are refused.
    #[test]
    fn named_senders_are_checked() {
        let sender = |name: &str, app: &str, fac: Option<&str>| NamedSender {
            name: name.into(),
            sending_application: app.into(),
            sending_facility: fac.map(Into::into),
        };
        let with = |senders: Vec<NamedSender>| Config {
            senders,
            ..Config::default()
        };
        let ok = with(vec![
            sender("lab", "LAB", None),
            sender("lab-north", "LAB", Some("NORTH")),
        ]);
        ok.validate().unwrap();
        let bad = [
            with(vec![sender("lab", "LAB", None), sender("lab", "RAD", None)]),
            with(vec![sender("a", "LAB", None), sender("b", "LAB", None)]),
            with(vec![sender("has space", "LAB", None)]),
            with(vec![sender("quote\"", "LAB", None)]),
            with(vec![sender(&"x".repeat(65), "LAB", None)]),
            with(vec![sender("lab", "", None)]),
            with(vec![sender("lab", "LAB^1.2^ISO", None)]),
            with(vec![sender("lab", "LAB", Some("A|B"))]),
            Config {
                max_senders: 0,
                ..Config::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{:?}", c.senders);
        }
        let typo: Result<NamedSender, _> = serde_json::from_str(
            r#"{"name": "lab", "sending_application": "LAB", "sending_facilty": "NORTH"}"#,
        );
        assert!(typo.is_err(), "an unknown key is refused");
    }
}
