//! One request and its answer over hyper's pooled client: the status, `Retry-After` and a bounded body; the
//! errors a request ends in; the TLS server name for one host.

use bytes::{Bytes, BytesMut};
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{DefaultServerNameResolver, HttpsConnector, ResolveServerName};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use std::time::{Duration, SystemTime};

pub(super) type Pool = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Why an attempt got no answer. `kind()` is a bounded label.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("connect: {0}")]
    Connect(String),
    #[error("no answer within the response timeout")]
    Timeout,
    #[error("request: {0}")]
    Request(String),
    /// No token could be had for now (the token endpoint is away, busy, or answered nonsense; the key cannot
    /// sign): retried like a receiver that is down.
    #[error("authorisation: {0}")]
    Auth(String),
    /// The credentials were refused until someone fixes them: the token endpoint refused the client, or the
    /// server refused its discovery document (a 4xx other than 408/429: `status`), or the discovered token
    /// endpoint is not one an assertion may be sent to (`status` 0). Counted toward
    /// `ack_policy.max_auth_retries`, like a 401/403.
    #[error("authorisation refused: {detail}")]
    Refused { status: u16, detail: String },
}

impl HttpError {
    /// The label for metrics and status.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect_failed",
            Self::Timeout => "response_timeout",
            Self::Request(_) => "io_error",
            Self::Auth(_) => "auth_failed",
            Self::Refused { .. } => "auth_refused",
        }
    }
}

/// Why a destination's HTTP client could not be built (at start: a configuration error).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Tls(#[from] hl7gw_tls::TlsError),
    #[error("url: {0}")]
    Url(String),
    #[error("oauth2.private_key: {0}")]
    Key(String),
}

/// The receiver's answer to one request.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// `Retry-After` (seconds or an HTTP date), when the answer had one.
    pub retry_after: Option<Duration>,
    /// The body's first `max_response_bytes`.
    pub body: Bytes,
    pub content_type: String,
}

/// Sends one request and reads its answer (at most `max_body` bytes of the body) within `timeout`.
pub(super) async fn exchange(
    pool: &Pool,
    req: Request<Full<Bytes>>,
    max_body: usize,
    timeout: Duration,
) -> Result<Answer, HttpError> {
    let run = async {
        let resp = pool.request(req).await.map_err(|e| {
            let chain = error_chain(&e);
            if e.is_connect() {
                HttpError::Connect(chain)
            } else {
                HttpError::Request(chain)
            }
        })?;
        let (parts, mut body) = resp.into_parts();
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| HttpError::Request(error_chain(&e)))?;
            if let Ok(data) = frame.into_data() {
                let room = max_body.saturating_sub(buf.len());
                if data.len() >= room {
                    // The rest is not read: the connection is dropped rather than returned to the pool.
                    buf.extend_from_slice(&data[..room]);
                    break;
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(Answer {
            status: parts.status,
            retry_after: parts
                .headers
                .get(header::RETRY_AFTER)
                .and_then(|v| retry_after(v.as_bytes(), SystemTime::now())),
            body: buf.freeze(),
            content_type: parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        })
    };
    tokio::time::timeout(timeout, run)
        .await
        .unwrap_or(Err(HttpError::Timeout))
}

/// An error and its sources, one line (hyper's own text is terse: "client error (Connect)").
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// `Retry-After` as a wait from `now`: delta-seconds or an HTTP date (a past date is no wait).
pub fn retry_after(v: &[u8], now: SystemTime) -> Option<Duration> {
    let s = std::str::from_utf8(v).ok()?.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(s).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `tls.server_name` for the destination's own host only: another host reached through the same client (a
/// token endpoint elsewhere) is checked against its own name, not the FHIR server's.
pub(super) struct HostServerName {
    pub(super) host: String,
    pub(super) name: rustls_pki_types::ServerName<'static>,
}

impl ResolveServerName for HostServerName {
    fn resolve(
        &self,
        uri: &Uri,
    ) -> Result<rustls_pki_types::ServerName<'static>, Box<dyn std::error::Error + Sync + Send>>
    {
        if uri.host() == Some(self.host.as_str()) {
            Ok(self.name.clone())
        } else {
            DefaultServerNameResolver::default().resolve(uri)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after(b" 7 ", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(later.as_bytes(), now),
            Some(Duration::from_secs(30))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after(past.as_bytes(), now), Some(Duration::ZERO));
        assert_eq!(retry_after(b"soon", now), None);
        assert_eq!(retry_after(b"-1", now), None);
    }

    /// Issue 36, item 4: `tls.server_name` names the FHIR server's host only; the token host keeps its own.
    #[test]
    fn the_fixed_server_name_is_for_its_own_host() {
        let r = HostServerName {
            host: "10.0.0.5".into(),
            name: hl7gw_tls::server_name("fhir.internal").unwrap(),
        };
        let name = |u: &'static str| format!("{:?}", r.resolve(&Uri::from_static(u)).unwrap());
        assert!(name("https://10.0.0.5:8443/fhir").contains("fhir.internal"));
        assert!(name("https://auth.example/token").contains("auth.example"));
    }
}
