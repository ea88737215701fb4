//! How every Kafka client of a service encrypts and authenticates: `kafka.security`, applied once by the client
//! builders in [`super`]. Secrets are read from files (mounted Secrets) when a client is built, never kept in the
//! config, never printed.

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `security.protocol`: how the connection to the brokers is made.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum Protocol {
    /// No TLS, no authentication (a local broker only: messages cross the network in clear).
    #[default]
    #[serde(rename = "PLAINTEXT", alias = "plaintext")]
    Plaintext,
    /// TLS; with `cert_file`/`key_file`, mutual TLS (the client certificate is the identity).
    #[serde(rename = "SSL", alias = "ssl")]
    Ssl,
    /// SASL without TLS (credentials protected by the mechanism only; not for PLAIN).
    #[serde(rename = "SASL_PLAINTEXT", alias = "sasl_plaintext")]
    SaslPlaintext,
    /// SASL over TLS: managed Kafka (MSK, Confluent Cloud), Strimzi SCRAM listeners.
    #[serde(rename = "SASL_SSL", alias = "sasl_ssl")]
    SaslSsl,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }
    fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
    fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// `sasl.mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Mechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
    /// OAuth 2 client credentials (OIDC): a token fetched from `oauth_token_endpoint`.
    #[serde(rename = "OAUTHBEARER")]
    OAuthBearer,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::OAuthBearer => "OAUTHBEARER",
        }
    }
}

/// `kafka.security`: TLS and SASL for every Kafka client of the service (producers, consumers, admin, the DLQ
/// reader). Secrets come from files so a Kubernetes Secret can be mounted; they are read when a client is
/// built (at start and when a producer is recreated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSecurity {
    /// PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL.
    pub protocol: Protocol,
    /// PEM bundle of the CAs that sign the brokers' certificates (absent: the system's CA store).
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS.
    pub key_file: Option<PathBuf>,
    /// File holding the password of an encrypted `key_file`.
    pub key_password_file: Option<PathBuf>,
    /// Check that a broker's certificate names the host connected to (default true; off only for brokers
    /// reached through addresses their certificates do not list).
    pub verify_hostname: bool,
    /// PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with a SASL protocol).
    pub sasl_mechanism: Option<Mechanism>,
    /// SASL user name (PLAIN, SCRAM).
    pub username: Option<String>,
    /// File holding the SASL password (PLAIN, SCRAM); trailing newlines are ignored.
    pub password_file: Option<PathBuf>,
    /// OAUTHBEARER: the OIDC token endpoint (`https://...`).
    pub oauth_token_endpoint: Option<String>,
    /// OAUTHBEARER: the client id.
    pub oauth_client_id: Option<String>,
    /// OAUTHBEARER: file holding the client secret.
    pub oauth_client_secret_file: Option<PathBuf>,
    /// OAUTHBEARER: the scope requested (optional).
    pub oauth_scope: Option<String>,
}

impl Default for KafkaSecurity {
    fn default() -> Self {
        Self {
            protocol: Protocol::Plaintext,
            ca_file: None,
            cert_file: None,
            key_file: None,
            key_password_file: None,
            verify_hostname: true,
            sasl_mechanism: None,
            username: None,
            password_file: None,
            oauth_token_endpoint: None,
            oauth_client_id: None,
            oauth_client_secret_file: None,
            oauth_scope: None,
        }
    }
}

/// librdkafka properties `kafka.security` sets; `kafka.properties` may not set them (a password there would
/// sit in a ConfigMap, and two places for one setting drift).
pub const SECURITY_PROPERTIES: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl.key.password",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "ssl.certificate.verify_cb",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.config",
];

/// True for librdkafka properties whose value is a secret (never printed).
pub fn is_secret_property(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "passphrase",
        "keytab",
        "jaas",
        "extensions",
        "oauthbearer.config",
    ]
    .iter()
    .any(|w| k.contains(w))
        || k.ends_with(".pem")
}

/// Why a Kafka client's settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A rule of `kafka.security` is broken.
    #[error("kafka.security: {0}")]
    Rule(String),
    /// A file named in `kafka.security` cannot be read.
    #[error("kafka.security.{key} {path}: {source}")]
    File {
        key: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl KafkaSecurity {
    /// The rules serde cannot check (files are checked by [`KafkaSecurity::check_files`]).
    pub fn validate(&self) -> Result<(), SecurityError> {
        let rule = |m: &str| Err(SecurityError::Rule(m.to_owned()));
        let p = self.protocol;
        let tls_files =
            self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some();
        if tls_files && !p.tls() {
            return rule("ca_file, cert_file and key_file need protocol SSL or SASL_SSL");
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return rule("cert_file and key_file go together (mutual TLS)");
        }
        if self.key_password_file.is_some() && self.key_file.is_none() {
            return rule("key_password_file without key_file");
        }
        match (p.sasl(), self.sasl_mechanism) {
            (true, None) => return rule("protocol SASL_* needs sasl_mechanism"),
            (false, Some(_)) => {
                return rule("sasl_mechanism needs protocol SASL_PLAINTEXT or SASL_SSL");
            }
            _ => {}
        }
        match self.sasl_mechanism {
            Some(Mechanism::Plain | Mechanism::ScramSha256 | Mechanism::ScramSha512) => {
                if self.username.as_deref().is_none_or(str::is_empty)
                    || self.password_file.is_none()
                {
                    return rule("sasl_mechanism PLAIN/SCRAM needs username and password_file");
                }
                if self.sasl_mechanism == Some(Mechanism::Plain) && !p.tls() {
                    return rule("PLAIN without TLS sends the password in clear: use SASL_SSL");
                }
            }
            Some(Mechanism::OAuthBearer)
                if self.oauth_token_endpoint.is_none()
                    || self.oauth_client_id.is_none()
                    || self.oauth_client_secret_file.is_none() =>
            {
                return rule(
                    "OAUTHBEARER needs oauth_token_endpoint, oauth_client_id and oauth_client_secret_file",
                );
            }
            Some(Mechanism::OAuthBearer) if !oidc_built_in() => {
                return rule(
                    "OAUTHBEARER (OIDC) is not available in this build: librdkafka was built without libcurl; \
                     use SCRAM-SHA-512 or mutual TLS",
                );
            }
            _ => {}
        }
        if (self.username.is_some() || self.password_file.is_some())
            && !matches!(
                self.sasl_mechanism,
                Some(Mechanism::Plain | Mechanism::ScramSha256 | Mechanism::ScramSha512)
            )
        {
            return rule("username and password_file need sasl_mechanism PLAIN or SCRAM-*");
        }
        Ok(())
    }

    /// Reads every file named here once (for `--check-config`): a missing Secret mount fails before a pod
    /// starts.
    pub fn check_files(&self) -> Result<(), SecurityError> {
        let files = [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
            ("key_password_file", &self.key_password_file),
            ("password_file", &self.password_file),
            ("oauth_client_secret_file", &self.oauth_client_secret_file),
        ];
        for (key, path) in files {
            if let Some(path) = path {
                read(key, path)?;
            }
        }
        Ok(())
    }

    /// Warnings for `--check-config`.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if !self.protocol.tls() {
            w.push(format!(
                "kafka.security.protocol is {}: messages (patient data) reach Kafka unencrypted",
                self.protocol.name()
            ));
        }
        if self.protocol.tls() && !self.verify_hostname {
            w.push(
                "kafka.security.verify_hostname is off: any certificate of the CA is accepted"
                    .into(),
            );
        }
        w
    }

    /// Sets the librdkafka properties, reading the secrets from their files now.
    pub fn apply(&self, c: &mut ClientConfig) -> Result<(), SecurityError> {
        c.set("security.protocol", self.protocol.name());
        if self.protocol.tls() {
            if let Some(ca) = &self.ca_file {
                c.set("ssl.ca.location", path_str(ca));
            }
            if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
                c.set("ssl.certificate.location", path_str(cert))
                    .set("ssl.key.location", path_str(key));
                // Each client made (a recreated producer too) reads the file again: so does the gauge.
                crate::certs::record("kafka-client", None, cert);
            }
            if let Some(f) = &self.key_password_file {
                c.set("ssl.key.password", read("key_password_file", f)?);
            }
            c.set(
                "ssl.endpoint.identification.algorithm",
                if self.verify_hostname {
                    "https"
                } else {
                    "none"
                },
            );
        }
        if let Some(m) = self.sasl_mechanism {
            c.set("sasl.mechanism", m.name());
            match m {
                Mechanism::OAuthBearer => {
                    c.set("sasl.oauthbearer.method", "oidc");
                    if let Some(u) = &self.oauth_token_endpoint {
                        c.set("sasl.oauthbearer.token.endpoint.url", u);
                    }
                    if let Some(id) = &self.oauth_client_id {
                        c.set("sasl.oauthbearer.client.id", id);
                    }
                    if let Some(f) = &self.oauth_client_secret_file {
                        c.set(
                            "sasl.oauthbearer.client.secret",
                            read("oauth_client_secret_file", f)?,
                        );
                    }
                    if let Some(s) = &self.oauth_scope {
                        c.set("sasl.oauthbearer.scope", s);
                    }
                }
                _ => {
                    if let Some(u) = &self.username {
                        c.set("sasl.username", u);
                    }
                    if let Some(f) = &self.password_file {
                        c.set("sasl.password", read("password_file", f)?);
                    }
                }
            }
        }
        Ok(())
    }
}

/// True when librdkafka was built with OIDC token retrieval (`sasl.oauthbearer.method=oidc`).
fn oidc_built_in() -> bool {
    let mut c = ClientConfig::new();
    c.set("sasl.oauthbearer.method", "oidc");
    c.create_native_config().is_ok()
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// A secret file's content without trailing newlines (`kubectl create secret --from-file` keeps them).
fn read(key: &'static str, path: &Path) -> Result<String, SecurityError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
        .map_err(|source| SecurityError::File {
            key,
            path: path.display().to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sec(yaml: &str) -> KafkaSecurity {
        use figment::providers::Format;
        figment::Figment::from(serde_saphyr::figment::Yaml::string(yaml))
            .extract()
            .expect("parses")
    }

    #[test]
    fn rules_name_what_is_missing() {
        assert!(KafkaSecurity::default().validate().is_ok());
        for (yaml, want) in [
            ("protocol: SASL_SSL", "needs sasl_mechanism"),
            (
                "{protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-512}",
                "username and password_file",
            ),
            (
                "{protocol: SASL_PLAINTEXT, sasl_mechanism: PLAIN, username: u, password_file: /p}",
                "in clear",
            ),
            ("{protocol: SSL, cert_file: /c}", "go together"),
            ("{ca_file: /c}", "need protocol SSL"),
            (
                "{protocol: SSL, sasl_mechanism: PLAIN}",
                "needs protocol SASL",
            ),
            (
                "{protocol: SASL_SSL, sasl_mechanism: OAUTHBEARER}",
                "oauth_token_endpoint",
            ),
        ] {
            let e = sec(yaml).validate().expect_err(yaml).to_string();
            assert!(e.contains(want), "{yaml}: {e}");
        }
        let ok = sec(
            "{protocol: sasl_ssl, sasl_mechanism: SCRAM-SHA-512, username: u, password_file: /p, ca_file: /ca}",
        );
        assert!(ok.validate().is_ok());
        assert!(ok.warnings().is_empty());
        assert_eq!(KafkaSecurity::default().warnings().len(), 1);
    }

    #[test]
    fn secrets_are_read_from_files_and_never_in_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pw = dir.path().join("password");
        std::fs::write(&pw, "s3cret\n").expect("write");
        let mut s = sec("{protocol: SASL_SSL, sasl_mechanism: SCRAM-SHA-256, username: u}");
        s.password_file = Some(pw.clone());
        let mut c = ClientConfig::new();
        s.apply(&mut c).expect("applies");
        assert_eq!(c.get("sasl.password"), Some("s3cret"));
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(
            c.get("ssl.endpoint.identification.algorithm"),
            Some("https")
        );
        s.password_file = Some(dir.path().join("missing"));
        let e = s.apply(&mut ClientConfig::new()).expect_err("missing file");
        assert!(
            e.to_string().starts_with("kafka.security.password_file "),
            "{e}"
        );
        assert!(s.check_files().is_err());
        assert!(is_secret_property("sasl.password"));
        assert!(is_secret_property("sasl.oauthbearer.client.secret"));
        assert!(!is_secret_property("sasl.username"));
    }
}
