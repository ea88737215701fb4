//! The egress configuration: one YAML file (`--config`), every key overridable by `HL7GW_...` variables.

use hl7gw_runtime::config::{ConfigError, ServiceSettings};
use hl7gw_runtime::kafka::KafkaSettings;
use hl7gw_runtime::service::validate_common;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// TLS towards a receiver (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// The CA that signed the receiver's certificate (the only one trusted).
    pub ca: PathBuf,
    /// Client certificate chain and key, for receivers that require mutual TLS.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of `cert`.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name checked against the receiver's certificate (default: the address's host).
    #[serde(default)]
    pub server_name: Option<String>,
}

/// When and how often a delivery is tried again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts before giving up (DLQ) on transport errors (no connection, no answer); 0: forever, which
    /// keeps each patient's order through a receiver outage.
    pub max_attempts: u32,
    /// The wait before the second attempt; each further wait is `multiplier` times the one before.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub initial_backoff: Duration,
    /// The longest wait between attempts.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub max_backoff: Duration,
    /// Backoff growth per attempt.
    pub multiplier: f64,
    /// Random spread of each wait, as a fraction (0.2: +-20%).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 0,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1` (attempt counts from 1), with jitter from `unit` in [0, 1).
    pub fn backoff(&self, attempt: u32, unit: f64) -> Duration {
        let base = self.initial_backoff.as_secs_f64()
            * self
                .multiplier
                .powi(attempt.saturating_sub(1).min(64) as i32);
        let capped = base.min(self.max_backoff.as_secs_f64());
        let spread = 1.0 + self.jitter * (2.0 * unit - 1.0);
        Duration::from_secs_f64((capped * spread).max(0.0))
    }
}

/// What a receiver's negative answer gets (HL7 table 0008): AR/CR mean "rejected for a reason unrelated to
/// the content" (the receiver is busy or down: send it again), AE/CE mean "the content is in error" (sending
/// it again cannot help: DLQ). Retrying in place keeps the patient's later messages behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AckPolicy {
    /// MSA-1 codes retried with the destination's backoff; the other negative codes go to the DLQ at once.
    pub retry: Vec<String>,
    /// ERR-3 codes (table 0357) that make a negative answer final whatever its MSA-1: the message as sent can
    /// never be accepted (unsupported type, version, a data error, ...). 206 and 207 are not among them.
    pub permanent_errors: Vec<u16>,
    /// Negative answers retried per message before it goes to the DLQ as `gave_up` (0: no limit).
    pub max_retries: u32,
    /// HTTP destinations: refused credentials (a 401/403, a token endpoint refusing the client, a discovered
    /// token endpoint that may not be used) retried per message before it goes to the DLQ as `unauthorized`,
    /// replayable once they are fixed (0: no limit: the patient's later messages wait behind it for good).
    pub max_auth_retries: u32,
    /// Send MSH-15 as `AL` when the message asks for no accept ACK (`NE`, `ER`, `SU`): the egress commits
    /// only on an answer, so a compliant receiver's silence would make it resend forever.
    pub rewrite_msh15: bool,
}

impl Default for AckPolicy {
    fn default() -> Self {
        Self {
            retry: vec!["AR".into(), "CR".into()],
            permanent_errors: vec![100, 101, 102, 103, 104, 200, 201, 202, 203, 204, 205],
            max_retries: 10,
            max_auth_retries: 10,
            rewrite_msh15: true,
        }
    }
}

impl AckPolicy {
    /// True when a negative answer `code` with ERR-3 `error` (if any) is sent again.
    pub fn retries(&self, code: hl7v2::AckCode, error: Option<u16>) -> bool {
        self.retry.iter().any(|c| c == code.as_str())
            && !error.is_some_and(|e| self.permanent_errors.contains(&e))
    }
}

/// The HTTP method of an HTTP(S) destination.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum HttpMethod {
    /// POST to `url` (a FHIR server's base takes transaction and batch Bundles this way).
    #[default]
    Post,
    /// PUT to `url`.
    Put,
}

/// The HTTP versions an HTTP(S) destination may speak.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum HttpVersion {
    /// HTTP/2 when the server offers it in the TLS handshake (ALPN), else HTTP/1.1 with keep-alive; plain
    /// `http://` is HTTP/1.1.
    #[default]
    Auto,
    /// HTTP/1.1 only (keep-alive).
    Http1,
    /// HTTP/2 only (over plain `http://`: prior knowledge, h2c).
    Http2,
}

/// SMART Backend Services (OAuth2 client credentials with a signed JWT assertion), the way FHIR servers
/// authorise a system rather than a user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SmartBackend {
    /// The client id registered with the authorisation server (the assertion's `iss` and `sub`).
    pub client_id: String,
    /// The client's private key, PKCS#8 PEM: RSA (assertions signed RS384) or EC P-384 (ES384).
    pub private_key: PathBuf,
    /// `kid` of the assertion's header: the key's id in the JWK set registered for the client.
    #[serde(default)]
    pub key_id: Option<String>,
    /// The token endpoint. Absent: read from `<url>/.well-known/smart-configuration` on first use, and used
    /// only when it is https on the FHIR server's host or on one of `token_hosts`.
    #[serde(default)]
    pub token_url: Option<String>,
    /// Hosts other than the FHIR server's that a discovered token endpoint may be on (an authorisation server
    /// of its own): the server's answer decides where the signed assertion goes, so it is not trusted alone.
    #[serde(default)]
    pub token_hosts: Vec<String>,
    /// The scopes asked for.
    #[serde(default = "default_scope")]
    pub scope: String,
}

fn default_scope() -> String {
    "system/*.write".into()
}

/// How an HTTP(S) destination sends and authenticates (ignored by MLLP destinations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    pub method: HttpMethod,
    /// The request's `Content-Type`. Absent: from what the route made (`application/fhir+json` for `toFhir`,
    /// `application/json` for `toJson`, `application/hl7-v2` for an HL7 message).
    pub content_type: Option<String>,
    /// Extra request headers (not for secrets: `bearer_token_file` and `oauth2` are; `Authorization`,
    /// `Content-Type` and `Host` are refused here).
    pub headers: BTreeMap<String, String>,
    pub version: HttpVersion,
    /// A file holding a bearer token sent as `Authorization: Bearer ...` (read again every minute and after a
    /// 401, so a rotated secret is picked up).
    pub bearer_token_file: Option<PathBuf>,
    /// SMART Backend Services authorisation (instead of `bearer_token_file`).
    pub oauth2: Option<SmartBackend>,
    /// Most bytes of a response body kept (for a dead letter's answer); the rest is not read.
    pub max_response_bytes: usize,
    /// The longest `Retry-After` honoured: a longer one waits this long.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub max_retry_after: Duration,
    /// How long an idle pooled connection is kept open.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub pool_idle_timeout: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            method: HttpMethod::Post,
            content_type: None,
            headers: BTreeMap::new(),
            version: HttpVersion::Auto,
            bearer_token_file: None,
            oauth2: None,
            max_response_bytes: 64 << 10,
            max_retry_after: Duration::from_secs(300),
            pool_idle_timeout: Duration::from_secs(90),
        }
    }
}

/// The largest `max_in_flight` a destination may set (a partition's worker holds at most 256 records).
pub const MAX_IN_FLIGHT: usize = 256;

/// The largest `connections` an MLLP destination may set (per partition).
pub const MAX_CONNECTIONS: usize = 64;

/// One receiving system: an MLLP listener (`address`) or an HTTP(S) endpoint (`url`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// `host:port` of the receiver's MLLP listener (empty for an HTTP(S) destination).
    #[serde(default)]
    pub address: String,
    /// The `http://` or `https://` URL each message is sent to: a FHIR server's base (transaction Bundles
    /// from `toFhir`) or any web service. Answers decide like ACKs: 2xx delivered; 408, 429 and 5xx retried
    /// (honouring `Retry-After`) as `ack_policy.max_retries` allows; 401/403 retried as
    /// `ack_policy.max_auth_retries` allows, then a dead letter `unauthorized`; any other status is a dead
    /// letter with the status and the response body.
    #[serde(default)]
    pub url: Option<String>,
    /// For `https://` URLs: the CA to trust (required), and a client certificate for mutual TLS.
    #[serde(default)]
    pub tls: Option<ClientTls>,
    #[serde(default)]
    pub http: HttpSettings,
    /// How long the TCP connect to the receiver may take (and the TLS handshake after it, again as long).
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub connect_timeout: Duration,
    /// How long to wait for the receiver's ACK.
    #[serde(default = "default_response_timeout", with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub response_timeout: Duration,
    #[serde(default)]
    pub retry: RetryPolicy,
    /// What negative answers get.
    #[serde(default)]
    pub ack_policy: AckPolicy,
    /// Most deliveries in the air at once per partition (an egress pod owns a share of the destination topic's
    /// partitions): messages of different keys (patients) go at once, a key's messages one at a time in order;
    /// 1: one message at a time per partition, as before issue 38. Their bytes count against
    /// `queue_bytes_per_partition` with the records read ahead. An MLLP destination has at most `connections`
    /// in the air per partition. A crash redelivers at most what was in the air or waiting behind it (see
    /// docs/reliability.md).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// MLLP only: connections each partition's worker keeps to the receiver, one message in flight on each
    /// (keys are spread over them, a key's messages still one at a time). 1 keeps one connection per partition
    /// and pod; raise it for a receiver that answers slowly and takes several connections (a receiver that takes
    /// only one connection in all needs one partition, one egress pod and 1 here).
    #[serde(default = "default_connections")]
    pub connections: usize,
}

impl Default for Destination {
    /// An MLLP destination with no address yet: every setting at its default.
    fn default() -> Self {
        Self {
            address: String::new(),
            url: None,
            tls: None,
            http: HttpSettings::default(),
            connect_timeout: default_connect_timeout(),
            response_timeout: default_response_timeout(),
            retry: RetryPolicy::default(),
            ack_policy: AckPolicy::default(),
            max_in_flight: default_max_in_flight(),
            connections: default_connections(),
        }
    }
}

fn default_max_in_flight() -> usize {
    16
}

fn default_connections() -> usize {
    1
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_response_timeout() -> Duration {
    Duration::from_secs(30)
}

/// The whole egress configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listeners, drain and logs: the section every service has.
    pub service: ServiceSettings,
    /// Destination topics are `<prefix><destination>`.
    pub out_topic_prefix: String,
    /// Where rejected and given-up deliveries go.
    pub dlq_topic: String,
    /// Where `Replay` sends the transformer's dead letters (messages no route took or a transform failed
    /// on): back to the transformer's input.
    pub inbound_topic: String,
    /// Consumer groups are `<prefix>.<destination>`.
    pub group_prefix: String,
    /// The receivers, by destination name (the names routes use).
    pub destinations: BTreeMap<String, Destination>,
    /// An output (envelope id and route) delivered within this window is not sent again when Kafka gives it
    /// to this pod once more after a crash or rebalance (0s: off).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "hl7gw_runtime::config::duration_schema")]
    pub duplicate_window: Duration,
    /// Most outputs remembered for the duplicate window (about 96 bytes each).
    pub duplicate_capacity: usize,
    /// Messages read ahead per partition while the one before is being delivered.
    pub queue_per_partition: usize,
    /// Most bytes read ahead per partition (the first message always goes, whatever its size), and most held
    /// back before the partition's fetching is paused: with large messages this, not `queue_per_partition`,
    /// bounds the egress's memory (partitions x twice this per destination, plus the consumer's
    /// `kafka.consumer_prefetch_bytes`).
    pub queue_bytes_per_partition: usize,
    /// The brokers, how to reach them, and the tuning of the consumers and the DLQ producer.
    pub kafka: KafkaSettings,
    /// The delivery ledger: the events topic (`hl7.events`; empty: off) and its retention when created.
    pub ledger: hl7gw_runtime::ledger::LedgerSettings,
    /// The gRPC listener's TLS and who may call Status, ListDeadLetters, Replay and Trace (nobody unless allowed).
    pub grpc: hl7gw_runtime::grpc::GrpcSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            out_topic_prefix: "hl7.out.".into(),
            dlq_topic: "hl7.dlq".into(),
            inbound_topic: "hl7.inbound".into(),
            group_prefix: "hl7gw-egress".into(),
            destinations: BTreeMap::new(),
            duplicate_window: Duration::from_secs(600),
            duplicate_capacity: 200_000,
            queue_per_partition: 64,
            queue_bytes_per_partition: 4 << 20,
            service: ServiceSettings::default(),
            ledger: hl7gw_runtime::ledger::LedgerSettings::default(),
            kafka: KafkaSettings::default(),
            grpc: hl7gw_runtime::grpc::GrpcSettings::default(),
        }
    }
}

hl7gw_runtime::service_config!(Config);

/// Checks an HTTP(S) destination: a URL with a scheme and host, TLS exactly for `https`, one way to
/// authenticate, and no credential sent in clear to anything but this machine.
fn check_http(name: &str, url: &str, d: &Destination) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("destinations.{name}.url: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(format!(
                "destinations.{name}.url: expected http:// or https://"
            ));
        }
    };
    let Some(host) = uri.host() else {
        return Err(format!("destinations.{name}.url: no host"));
    };
    if https != d.tls.is_some() {
        return Err(if https {
            format!(
                "destinations.{name}: an https:// url needs tls.ca (the CA or CA bundle to trust)"
            )
        } else {
            format!("destinations.{name}: tls is for https:// urls")
        });
    }
    let h = &d.http;
    if h.bearer_token_file.is_some() && h.oauth2.is_some() {
        return Err(format!(
            "destinations.{name}.http: bearer_token_file or oauth2, not both"
        ));
    }
    let loopback = hl7gw_tls::is_loopback_host(host);
    if !https && !loopback && (h.bearer_token_file.is_some() || h.oauth2.is_some()) {
        return Err(format!(
            "destinations.{name}: credentials are sent over https only (or to this machine)"
        ));
    }
    if let Some(f) = &h.bearer_token_file
        && !f.is_file()
    {
        return Err(format!(
            "destinations.{name}.http.bearer_token_file: {} is not a file",
            f.display()
        ));
    }
    if let Some(o) = &h.oauth2 {
        if o.client_id.is_empty() {
            return Err(format!(
                "destinations.{name}.http.oauth2.client_id is empty"
            ));
        }
        if !o.private_key.is_file() {
            return Err(format!(
                "destinations.{name}.http.oauth2.private_key: {} is not a file",
                o.private_key.display()
            ));
        }
        if let Some(h) = o
            .token_hosts
            .iter()
            .find(|h| h.is_empty() || h.contains(['/', ':', ' ']))
        {
            return Err(format!(
                "destinations.{name}.http.oauth2.token_hosts: {h:?} is not a host name"
            ));
        }
        if let Some(t) = &o.token_url {
            let t: http::Uri = t
                .parse()
                .map_err(|e| format!("destinations.{name}.http.oauth2.token_url: {e}"))?;
            let local = t.host().is_some_and(hl7gw_tls::is_loopback_host);
            if t.scheme_str() != Some("https") && !(t.scheme_str() == Some("http") && local) {
                return Err(format!(
                    "destinations.{name}.http.oauth2.token_url: expected https:// (or http:// to this machine)"
                ));
            }
        }
    }
    for (k, v) in &h.headers {
        let n = http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("destinations.{name}.http.headers: {k:?} is not a header name"))?;
        if matches!(
            n,
            http::header::AUTHORIZATION | http::header::CONTENT_TYPE | http::header::HOST
        ) {
            return Err(format!(
                "destinations.{name}.http.headers: {k} is set by the egress"
            ));
        }
        http::HeaderValue::from_str(v)
            .map_err(|_| format!("destinations.{name}.http.headers.{k}: not a header value"))?;
    }
    if let Some(c) = &h.content_type {
        http::HeaderValue::from_str(c)
            .map_err(|_| format!("destinations.{name}.http.content_type: not a header value"))?;
    }
    if h.max_response_bytes == 0 {
        return Err(format!(
            "destinations.{name}.http.max_response_bytes must be at least 1"
        ));
    }
    Ok(())
}

impl Config {
    /// The gRPC methods of this service, as named in `grpc.allow`, and `ReadMessages`: the permission to
    /// receive message bodies (`ListDeadLetters` with `include_envelope`; see `hl7gw_runtime::grpc::READ_MESSAGES`).
    pub const GRPC_METHODS: &'static [&'static str] = &[
        "Status",
        "ListDeadLetters",
        hl7gw_runtime::grpc::READ_MESSAGES,
        "Replay",
        "Trace",
    ];

    /// Checks the rules serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rule = |m: String| Err(ConfigError::Rule(m));
        validate_common(&self.kafka, &self.grpc, Self::GRPC_METHODS)?;
        self.ledger.validate()?;
        if self.destinations.is_empty() {
            return rule("destinations: configure at least one receiver".into());
        }
        if self.queue_per_partition == 0 {
            return rule("queue_per_partition must be at least 1".into());
        }
        if self.queue_bytes_per_partition == 0 {
            return rule("queue_bytes_per_partition must be at least 1".into());
        }
        for (name, d) in &self.destinations {
            hl7gw_runtime::config::check_destination_name(name).map_err(ConfigError::Rule)?;
            match &d.url {
                Some(url) => {
                    if !d.address.is_empty() {
                        return rule(format!(
                            "destinations.{name}: set address (MLLP) or url (HTTP), not both"
                        ));
                    }
                    check_http(name, url, d).map_err(ConfigError::Rule)?;
                }
                None if !d.address.contains(':') => {
                    return rule(format!(
                        "destinations.{name}: expected address (host:port, MLLP) or url (HTTP)"
                    ));
                }
                None => {}
            }
            if d.connect_timeout.is_zero() || d.response_timeout.is_zero() {
                return rule(format!("destinations.{name}: timeouts must be more than 0"));
            }
            if d.max_in_flight == 0 || d.max_in_flight > MAX_IN_FLIGHT {
                return rule(format!(
                    "destinations.{name}.max_in_flight must be 1 to {MAX_IN_FLIGHT}"
                ));
            }
            if d.connections == 0 || d.connections > MAX_CONNECTIONS {
                return rule(format!(
                    "destinations.{name}.connections must be 1 to {MAX_CONNECTIONS}"
                ));
            }
            if d.url.is_some() && d.connections != 1 {
                return rule(format!(
                    "destinations.{name}.connections is for MLLP destinations: an HTTP destination's deliveries share its connection pool (max_in_flight bounds them)"
                ));
            }
            let r = &d.retry;
            if r.initial_backoff.is_zero()
                || r.max_backoff < r.initial_backoff
                || !(r.multiplier >= 1.0 && r.multiplier.is_finite())
                || !(0.0..=1.0).contains(&r.jitter)
            {
                return rule(format!(
                    "destinations.{name}.retry: initial_backoff > 0, max_backoff >= initial_backoff, multiplier >= 1, jitter in 0..1"
                ));
            }
            if let Some(c) = d
                .ack_policy
                .retry
                .iter()
                .find(|c| !matches!(c.as_str(), "AE" | "AR" | "CE" | "CR"))
            {
                return rule(format!(
                    "destinations.{name}.ack_policy.retry: {c:?} is not a negative MSA-1 code (AE, AR, CE, CR)"
                ));
            }
            if let Some(t) = &d.tls {
                for p in [Some(&t.ca), t.cert.as_ref(), t.key.as_ref()]
                    .into_iter()
                    .flatten()
                {
                    if !p.is_file() {
                        return rule(format!(
                            "destinations.{name}.tls: {} is not a file",
                            p.display()
                        ));
                    }
                }
                if t.cert.is_some() != t.key.is_some() {
                    return rule(format!("destinations.{name}.tls: cert and key go together"));
                }
            }
        }
        Ok(())
    }

    /// The topic a destination's messages are read from.
    pub fn topic(&self, destination: &str) -> String {
        format!("{}{destination}", self.out_topic_prefix)
    }

    /// The consumer group of a destination.
    pub fn group(&self, destination: &str) -> String {
        format!("{}.{destination}", self.group_prefix)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn schema_and_reference_are_current() {
        let schema = hl7gw_runtime::config::reference::schema_json::<Config>();
        if let Err(e) = hl7gw_runtime::config::reference::check_current("egress", &schema) {
            panic!("{e}");
        }
    }
    use super::*;

    #[test]
    fn the_default_ack_policy_follows_table_0008() {
        use hl7v2::AckCode::*;
        let p = AckPolicy::default();
        assert!(p.retries(AR, None) && p.retries(CR, Some(207)) && p.retries(AR, Some(206)));
        assert!(!p.retries(AE, None) && !p.retries(CE, Some(207)));
        assert!(
            !p.retries(AR, Some(203)),
            "an unsupported version never passes"
        );
    }

    #[test]
    fn backoff_grows_caps_and_spreads() {
        let r = RetryPolicy::default();
        assert_eq!(r.backoff(1, 0.5), Duration::from_millis(500));
        assert_eq!(r.backoff(2, 0.5), Duration::from_secs(1));
        assert_eq!(r.backoff(30, 0.5), Duration::from_secs(30));
        assert!(r.backoff(1, 0.0) < r.backoff(1, 0.99));
        assert_eq!(r.backoff(1, 0.0), Duration::from_millis(400));
    }

    #[test]
    fn a_destination_is_required_and_checked() {
        assert!(Config::default().validate().is_err());
        let mut c = Config::default();
        c.destinations.insert(
            "lab".into(),
            Destination {
                address: "127.0.0.1:2576".into(),
                ..Destination::default()
            },
        );
        c.validate().unwrap();
        assert_eq!(c.topic("lab"), "hl7.out.lab");
        assert_eq!(c.group("lab"), "hl7gw-egress.lab");
        c.destinations.get_mut("lab").unwrap().retry.jitter = 3.0;
        assert!(c.validate().is_err());
    }

    /// An HTTP destination: a URL, TLS exactly for https, credentials never in clear to another machine.
    #[test]
    fn http_destinations_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let check = |yaml: String| -> Result<(), String> {
            let c: Config = hl7gw_testkit::config(&yaml);
            c.validate().map_err(|e| e.to_string())
        };
        let f = file.display();
        let ok = [
            "{url: 'http://127.0.0.1:8080/fhir'}".to_owned(),
            format!("{{url: 'https://fhir.example/fhir', tls: {{ca: {f}}}, http: {{bearer_token_file: {f}}}}}"),
            format!("{{url: 'http://localhost:8080/fhir', http: {{oauth2: {{client_id: a, private_key: {f}}}}}}}"),
            "{url: 'http://fhir.example/fhir', http: {method: put, version: http2, headers: {X-Source: hl7gw}}}".to_owned(),
        ];
        for d in ok {
            check(format!("destinations: {{fhir: {d}}}")).unwrap_or_else(|e| panic!("{d}: {e}"));
        }
        let refused = [
            ("{url: 'http://a/fhir', address: 'a:1'}", "not both"),
            ("{url: 'ftp://a/fhir'}", "http:// or https://"),
            ("{url: 'https://a/fhir'}", "needs tls.ca"),
            (
                &*format!("{{url: 'http://a/fhir', tls: {{ca: {f}}}}}"),
                "tls is for https",
            ),
            (
                &*format!("{{url: 'http://fhir.example/fhir', http: {{bearer_token_file: {f}}}}}"),
                "over https only",
            ),
            (
                &*format!(
                    "{{url: 'https://a/fhir', tls: {{ca: {f}}}, http: {{bearer_token_file: {f}, oauth2: {{client_id: a, private_key: {f}}}}}}}"
                ),
                "not both",
            ),
            (
                &*format!(
                    "{{url: 'https://a/fhir', tls: {{ca: {f}}}, http: {{oauth2: {{client_id: a, private_key: {f}, token_url: 'http://auth.example/t'}}}}}}"
                ),
                "token_url",
            ),
            (
                "{url: 'http://a/fhir', http: {headers: {Authorization: x}}}",
                "set by the egress",
            ),
            (
                "{url: 'http://127.0.0.1/fhir', http: {bearer_token_file: /nonexistent/t}}",
                "is not a file",
            ),
        ];
        for (d, why) in refused {
            let e = check(format!("destinations: {{fhir: {d}}}")).expect_err(d);
            assert!(e.contains(why), "{d}: {e}");
        }
    }
}
