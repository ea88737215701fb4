//! `Authorization` for a destination: a bearer token file (re-read when it changes) or a SMART backend services
//! token endpoint (a JWT assertion signed with the client's key; the endpoint discovered from the server's
//! `.well-known` must be https on a trusted host), tokens kept for a clamped lifetime.

use super::wire::HttpError;
use super::wire::Pool;
use super::wire::SetupError;
use super::wire::exchange;
use crate::config::SmartBackend;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderValue, Request, Uri, header};
use http_body_util::Full;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// How long a bearer token read from its file is used before the file is read again.
pub(super) const TOKEN_FILE_REREAD: Duration = Duration::from_secs(60);

/// How long a SMART assertion is valid (the specification allows at most five minutes).
pub(super) const ASSERTION_LIFETIME: Duration = Duration::from_secs(300);

/// Most bytes read of a token endpoint's or discovery document's answer.
pub(super) const MAX_AUTH_RESPONSE: usize = 64 << 10;

/// The longest a token is kept, whatever its `expires_in` says (a huge one overflowed `Instant + keep` and
/// panicked the worker); a token revoked early costs a 401 and a new token anyway.
pub(super) const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

pub(super) enum Auth {
    None,
    Bearer(BearerFile),
    Smart(Box<Smart>),
}

/// A bearer token read from a file (a mounted secret), read again every minute and after a 401.
pub(super) struct BearerFile {
    pub(super) path: PathBuf,
    pub(super) cached: Mutex<Option<(HeaderValue, Instant)>>,
}

impl BearerFile {
    pub(super) async fn header(&self, fresh: bool) -> Result<HeaderValue, HttpError> {
        if !fresh
            && let Ok(c) = self.cached.lock()
            && let Some((v, at)) = c.as_ref()
            && at.elapsed() < TOKEN_FILE_REREAD
        {
            return Ok(v.clone());
        }
        // Read on tokio's blocking pool, not in the worker's task (a slow volume must not stall the runtime).
        let token = tokio::fs::read_to_string(&self.path).await.map_err(|e| {
            HttpError::Auth(format!(
                "bearer_token_file {}: {}",
                self.path.display(),
                e.kind()
            ))
        })?;
        let v = bearer(token.trim())?;
        if let Ok(mut c) = self.cached.lock() {
            *c = Some((v.clone(), Instant::now()));
        }
        Ok(v)
    }
}

/// `Bearer <token>`, marked sensitive (never printed by hyper's debug output).
pub(super) fn bearer(token: &str) -> Result<HeaderValue, HttpError> {
    if token.is_empty() {
        return Err(HttpError::Auth("the token is empty".into()));
    }
    let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| HttpError::Auth("the token is not a header value".into()))?;
    v.set_sensitive(true);
    Ok(v)
}

/// The key that signs SMART client assertions: RS384 for RSA keys, ES384 for EC P-384 keys.
pub(super) enum Signer {
    Rsa(ring::signature::RsaKeyPair),
    Ec(ring::signature::EcdsaKeyPair),
}

impl Signer {
    /// Reads a PKCS#8 (or, for RSA, PKCS#1) PEM private key.
    pub(super) fn load(path: &std::path::Path) -> Result<Self, SetupError> {
        use rustls_pki_types::PrivateKeyDer;
        use rustls_pki_types::pem::PemObject as _;
        let key = PrivateKeyDer::from_pem_file(path)
            .map_err(|e| SetupError::Key(format!("{}: {e}", path.display())))?;
        let rng = ring::rand::SystemRandom::new();
        match &key {
            PrivateKeyDer::Pkcs8(der) => {
                let der = der.secret_pkcs8_der();
                if let Ok(k) = ring::signature::RsaKeyPair::from_pkcs8(der) {
                    return Ok(Self::Rsa(k));
                }
                ring::signature::EcdsaKeyPair::from_pkcs8(
                    &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING,
                    der,
                    &rng,
                )
                .map(Self::Ec)
                .map_err(|_| {
                    SetupError::Key(format!(
                        "{}: neither an RSA nor an EC P-384 key",
                        path.display()
                    ))
                })
            }
            PrivateKeyDer::Pkcs1(der) => {
                ring::signature::RsaKeyPair::from_der(der.secret_pkcs1_der())
                    .map(Self::Rsa)
                    .map_err(|e| SetupError::Key(format!("{}: {e}", path.display())))
            }
            _ => Err(SetupError::Key(format!(
                "{}: an EC key must be PKCS#8 (openssl pkcs8 -topk8 -nocrypt)",
                path.display()
            ))),
        }
    }

    pub(super) fn alg(&self) -> &'static str {
        match self {
            Self::Rsa(_) => "RS384",
            Self::Ec(_) => "ES384",
        }
    }

    /// The JWS signature of `msg` (ES384: r || s, as JWS wants).
    pub(super) fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, HttpError> {
        let rng = ring::rand::SystemRandom::new();
        match self {
            Self::Rsa(k) => {
                let mut sig = vec![0; k.public().modulus_len()];
                k.sign(&ring::signature::RSA_PKCS1_SHA384, &rng, msg, &mut sig)
                    .map_err(|_| HttpError::Auth("signing the assertion failed".into()))?;
                Ok(sig)
            }
            Self::Ec(k) => k
                .sign(&rng, msg)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| HttpError::Auth("signing the assertion failed".into())),
        }
    }
}

/// SMART backend services: an access token got with a signed client assertion, kept until shortly before it
/// expires; one fetch at a time for all the destination's workers.
pub(super) struct Smart {
    pub(super) client_id: String,
    pub(super) key_id: Option<String>,
    pub(super) scope: String,
    pub(super) signer: Signer,
    /// The token endpoint: configured, or discovered from `<base>/.well-known/smart-configuration`.
    pub(super) token_url: tokio::sync::OnceCell<Uri>,
    pub(super) configured_token_url: Option<String>,
    pub(super) base: String,
    /// The FHIR server's URL: a discovered token endpoint must be on its host (or in `token_hosts`).
    pub(super) fhir: Uri,
    pub(super) token_hosts: Vec<String>,
    pub(super) token: tokio::sync::Mutex<Option<(HeaderValue, Instant)>>,
}

impl Smart {
    pub(super) fn new(o: &SmartBackend, url: &Uri) -> Result<Self, SetupError> {
        Ok(Self {
            client_id: o.client_id.clone(),
            key_id: o.key_id.clone(),
            scope: o.scope.clone(),
            signer: Signer::load(&o.private_key)?,
            token_url: tokio::sync::OnceCell::new(),
            configured_token_url: o.token_url.clone(),
            base: url.to_string().trim_end_matches('/').to_owned(),
            fhir: url.clone(),
            token_hosts: o.token_hosts.clone(),
            token: tokio::sync::Mutex::new(None),
        })
    }

    pub(super) async fn header(
        &self,
        pool: &Pool,
        fresh: bool,
        timeout: Duration,
    ) -> Result<HeaderValue, HttpError> {
        let mut token = self.token.lock().await;
        if !fresh
            && let Some((v, until)) = token.as_ref()
            && Instant::now() < *until
        {
            return Ok(v.clone());
        }
        let token_url = self
            .token_url
            .get_or_try_init(|| self.discover(pool, timeout))
            .await?;
        let (v, lifetime) = self.fetch(pool, token_url, timeout).await?;
        let now = Instant::now();
        *token = Some((
            v.clone(),
            now.checked_add(token_keep(lifetime)).unwrap_or(now),
        ));
        Ok(v)
    }

    /// The token endpoint from the configuration, or from the server's SMART configuration document.
    pub(super) async fn discover(&self, pool: &Pool, timeout: Duration) -> Result<Uri, HttpError> {
        let url = match &self.configured_token_url {
            Some(u) => u.clone(),
            None => {
                let doc = format!("{}/.well-known/smart-configuration", self.base);
                let req = Request::get(doc.as_str())
                    .header(header::ACCEPT, "application/json")
                    .body(Full::new(Bytes::new()))
                    .map_err(|e| HttpError::Auth(format!("{doc}: {e}")))?;
                let a = exchange(pool, req, MAX_AUTH_RESPONSE, timeout).await?;
                if !a.status.is_success() {
                    let status = a.status.as_u16();
                    return Err(auth_answer(status, format!("{doc}: HTTP {status}")));
                }
                let v: serde_json::Value = serde_json::from_slice(&a.body)
                    .map_err(|e| HttpError::Auth(format!("{doc}: {e}")))?;
                v.get("token_endpoint")
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| HttpError::Auth(format!("{doc}: no token_endpoint")))?
                    .to_owned()
            }
        };
        let uri: Uri = url
            .parse()
            .map_err(|e| HttpError::Auth(format!("token endpoint {url}: {e}")))?;
        if self.configured_token_url.is_none() {
            trusted_token_endpoint(&uri, &self.fhir, &self.token_hosts).map_err(|why| {
                HttpError::Refused {
                    status: 0,
                    detail: format!("discovered token endpoint {url}: {why}"),
                }
            })?;
        } else {
            let local = is_loopback(uri.host());
            if uri.scheme_str() != Some("https") && !(uri.scheme_str() == Some("http") && local) {
                return Err(HttpError::Auth(format!(
                    "token endpoint {url}: not https (an assertion is sent there)"
                )));
            }
        }
        Ok(uri)
    }

    /// Asks the token endpoint for an access token with a new signed assertion.
    pub(super) async fn fetch(
        &self,
        pool: &Pool,
        token_url: &Uri,
        timeout: Duration,
    ) -> Result<(HeaderValue, Duration), HttpError> {
        let assertion = self.assertion(&token_url.to_string(), SystemTime::now())?;
        let form = format!(
            "grant_type=client_credentials&scope={}&client_assertion_type={}&client_assertion={}",
            form_encode(&self.scope),
            form_encode("urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
            assertion
        );
        let req = Request::post(token_url.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| HttpError::Auth(e.to_string()))?;
        let a = exchange(pool, req, MAX_AUTH_RESPONSE, timeout).await?;
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
        if !a.status.is_success() {
            // The OAuth2 error code and description: about the client, never a secret.
            let error = v.get("error").and_then(|e| e.as_str()).unwrap_or("");
            let description = v
                .get("error_description")
                .and_then(|e| e.as_str())
                .unwrap_or("");
            let status = a.status.as_u16();
            return Err(auth_answer(
                status,
                format!("token endpoint answered HTTP {status} {error} {description}"),
            ));
        }
        let token = v
            .get("access_token")
            .and_then(|t| t.as_str())
            .ok_or_else(|| HttpError::Auth("token endpoint: no access_token".into()))?;
        let lifetime = v
            .get("expires_in")
            .and_then(serde_json::Value::as_u64)
            .map_or(Duration::from_secs(300), Duration::from_secs);
        Ok((bearer(token)?, lifetime))
    }

    /// A signed client assertion for `aud` (the token endpoint) made at `now`.
    pub(super) fn assertion(&self, aud: &str, now: SystemTime) -> Result<String, HttpError> {
        let iat = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut header = serde_json::json!({"alg": self.signer.alg(), "typ": "JWT"});
        if let Some(kid) = &self.key_id {
            header["kid"] = kid.as_str().into();
        }
        let claims = serde_json::json!({
            "iss": self.client_id,
            "sub": self.client_id,
            "aud": aud,
            "exp": iat + ASSERTION_LIFETIME.as_secs(),
            "iat": iat,
            "jti": hl7gw_runtime::envelope::new_id(),
        });
        let mut jwt = URL_SAFE_NO_PAD.encode(header.to_string());
        jwt.push('.');
        jwt.push_str(&URL_SAFE_NO_PAD.encode(claims.to_string()));
        let sig = self.signer.sign(jwt.as_bytes())?;
        jwt.push('.');
        jwt.push_str(&URL_SAFE_NO_PAD.encode(sig));
        Ok(jwt)
    }
}

/// A token endpoint's (or the discovery document's) answer that gave no token: a 4xx other than 408/429 is a
/// refusal (the client, its key, its scope or the server's SMART set-up must be fixed first), the rest is a
/// server that is busy or away.
pub(super) fn auth_answer(status: u16, detail: String) -> HttpError {
    if (400..500).contains(&status) && !matches!(status, 408 | 429) {
        HttpError::Refused { status, detail }
    } else {
        HttpError::Auth(detail)
    }
}

/// How long a token that `lifetime` says is valid is kept: at most [`MAX_TOKEN_LIFETIME`], renewed a tenth
/// before it runs out (a token that runs out in flight costs a 401 and a second try), at least a second.
pub(super) fn token_keep(lifetime: Duration) -> Duration {
    let lifetime = lifetime.min(MAX_TOKEN_LIFETIME);
    lifetime
        .saturating_sub(lifetime / 10)
        .max(Duration::from_secs(1))
}

pub(super) fn is_loopback(host: Option<&str>) -> bool {
    host.is_some_and(hl7gw_tls::is_loopback_host)
}

/// Whether a token endpoint a server's `.well-known/smart-configuration` named may get our assertion: over
/// https, on the FHIR server's own host or one of `allowed` (`oauth2.token_hosts`). A FHIR server on this
/// machine over plain http may name plain http on that same host. Anything else (another host, plain http to
/// the pod's loopback, where sidecars listen) would let the server's answer aim our requests anywhere.
pub(super) fn trusted_token_endpoint(
    endpoint: &Uri,
    fhir: &Uri,
    allowed: &[String],
) -> Result<(), String> {
    let Some(host) = endpoint.host() else {
        return Err("no host".into());
    };
    let same_host = fhir.host().is_some_and(|h| h.eq_ignore_ascii_case(host));
    match endpoint.scheme_str() {
        Some("https") => {}
        Some("http")
            if same_host && fhir.scheme_str() == Some("http") && is_loopback(Some(host)) =>
        {
            return if endpoint.port_u16() == fhir.port_u16() {
                Ok(())
            } else {
                Err("plain http to another port of this machine".into())
            };
        }
        _ => return Err("not https (an assertion is sent there)".into()),
    }
    if same_host || allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
        Ok(())
    } else {
        Err(format!(
            "{host} is neither the FHIR server's host nor in oauth2.token_hosts"
        ))
    }
}

/// `application/x-www-form-urlencoded` for a value (unreserved characters kept, the rest percent-encoded).
pub(super) fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36, item 4: an `expires_in` of 2^64-1 s is kept an hour at most (it panicked the worker), a short
    /// one is renewed early, a zero one kept a second.
    #[test]
    fn token_lifetimes_are_clamped() {
        assert_eq!(
            token_keep(Duration::from_secs(u64::MAX)),
            Duration::from_secs(3240)
        );
        assert_eq!(
            token_keep(Duration::from_secs(300)),
            Duration::from_secs(270)
        );
        assert_eq!(token_keep(Duration::ZERO), Duration::from_secs(1));
        let now = Instant::now();
        assert!(now.checked_add(token_keep(Duration::MAX)).is_some());
    }

    /// Issue 36, item 4: a discovered token endpoint is https on the FHIR server's host or an allowed one;
    /// plain http only to the same loopback server a plain-http FHIR URL names.
    #[test]
    fn discovered_token_endpoints_must_be_https_on_a_trusted_host() {
        let fhir = Uri::from_static("https://fhir.example:8443/fhir");
        let allowed = vec!["auth.example".to_owned()];
        let ok =
            |e: &'static str, f: &Uri| trusted_token_endpoint(&Uri::from_static(e), f, &allowed);
        assert!(ok("https://fhir.example/token", &fhir).is_ok());
        assert!(ok("https://FHIR.example:9443/auth/token", &fhir).is_ok());
        assert!(ok("https://auth.example/token", &fhir).is_ok());
        for bad in [
            "http://127.0.0.1:15000/token",
            "http://fhir.example/token",
            "https://127.0.0.1:15000/token",
            "https://elsewhere.example/token",
        ] {
            assert!(ok(bad, &fhir).is_err(), "{bad}");
        }
        let local = Uri::from_static("http://127.0.0.1:8080/fhir");
        assert!(ok("http://127.0.0.1:8080/auth/token", &local).is_ok());
        assert!(ok("http://127.0.0.1:15000/token", &local).is_err());
        assert!(ok("http://localhost:8080/token", &local).is_err());
    }

    /// Issue 36, item 4: a token endpoint's 4xx counts as refused credentials; 408, 429 and 5xx are retried
    /// like a server that is down.
    #[test]
    fn token_endpoint_refusals_are_told_from_outages() {
        for status in [400, 401, 403, 404] {
            assert!(
                matches!(auth_answer(status, String::new()), HttpError::Refused { status: s, .. } if s == status),
                "{status}"
            );
        }
        for status in [408, 429, 500, 503, 302] {
            assert!(
                matches!(auth_answer(status, String::new()), HttpError::Auth(_)),
                "{status}"
            );
        }
    }

    #[test]
    fn form_values_are_percent_encoded() {
        assert_eq!(form_encode("system/*.write a"), "system%2F%2A.write%20a");
        assert_eq!(form_encode("urn:ietf:params"), "urn%3Aietf%3Aparams");
    }

    /// An ES384 assertion verifies with the key's public half and carries the claims SMART asks for.
    #[test]
    fn assertions_are_signed_jwts_with_the_smart_claims() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING,
            &rng,
        )
        .unwrap();
        let kp = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        let public = ring::signature::KeyPair::public_key(&kp).as_ref().to_vec();
        let s = Smart {
            client_id: "hl7gw".into(),
            key_id: Some("k1".into()),
            scope: "system/*.write".into(),
            signer: Signer::Ec(kp),
            token_url: tokio::sync::OnceCell::new(),
            configured_token_url: None,
            base: String::new(),
            fhir: Uri::from_static("https://fhir.example/fhir"),
            token_hosts: Vec::new(),
            token: tokio::sync::Mutex::new(None),
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let jwt = s.assertion("https://auth.example/token", now).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["alg"], "ES384");
        assert_eq!(header["kid"], "k1");
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], "hl7gw");
        assert_eq!(claims["sub"], "hl7gw");
        assert_eq!(claims["aud"], "https://auth.example/token");
        assert_eq!(claims["exp"], 1_700_000_300u64);
        assert!(claims["jti"].as_str().is_some_and(|j| !j.is_empty()));
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        assert_eq!(sig.len(), 96, "r || s");
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P384_SHA384_FIXED, public)
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
            .unwrap();
    }
}
