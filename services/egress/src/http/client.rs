//! The HTTP(S) client of one destination: the pooled connections, TLS from its PEM files, the request for one
//! output with its `Authorization`.

use super::auth::Auth;
use super::auth::BearerFile;
use super::auth::Smart;
use super::wire::Answer;
use super::wire::HostServerName;
use super::wire::HttpError;
use super::wire::Pool;
use super::wire::SetupError;
use super::wire::exchange;
use crate::config::{Destination, HttpMethod, HttpVersion};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_rustls::rustls;

/// One HTTP(S) destination's client, shared by its partition workers (one connection pool).
pub struct HttpClient {
    pub(super) pool: Pool,
    pub(super) url: Uri,
    pub(super) method: Method,
    pub(super) content_type: Option<HeaderValue>,
    pub(super) headers: HeaderMap,
    pub(super) auth: Auth,
    pub(super) response_timeout: Duration,
    pub(super) max_body: usize,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("url", &self.url)
            .field("method", &self.method)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// The client of destination `name` (whose `url` is set), built once at start.
    pub fn new(name: &str, d: &Destination) -> Result<Option<Self>, SetupError> {
        let Some(url) = &d.url else { return Ok(None) };
        let url: Uri = url.parse().map_err(|e| SetupError::Url(format!("{e}")))?;
        let h = &d.http;
        let tls = match &d.tls {
            Some(t) => {
                let identity = t.cert.as_deref().zip(t.key.as_deref());
                if let Some(cert) = &t.cert {
                    hl7gw_runtime::certs::record("http-client", Some(name), cert);
                }
                Arc::unwrap_or_clone(hl7gw_tls::client_config(&t.ca, identity)?)
            }
            // Plain http://: the connector wants a TLS config all the same; this one trusts nothing.
            None => rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| SetupError::Tls(hl7gw_tls::TlsError::Rustls(e)))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(d.connect_timeout));
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let builder = match d.tls.as_ref().and_then(|t| t.server_name.as_deref()) {
            Some(n) => builder.with_server_name_resolver(HostServerName {
                host: url.host().unwrap_or_default().to_owned(),
                name: hl7gw_tls::server_name(n)?,
            }),
            None => builder,
        };
        let connector = match h.version {
            HttpVersion::Auto => builder.enable_http1().enable_http2().wrap_connector(http),
            HttpVersion::Http1 => builder.enable_http1().wrap_connector(http),
            HttpVersion::Http2 => builder.enable_http2().wrap_connector(http),
        };
        let pool = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(h.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // Auto over plain HTTP is HTTP/1.1: h2c needs prior knowledge (`version: http2`).
            .http2_only(h.version == HttpVersion::Http2)
            .build(connector);
        let mut headers = HeaderMap::new();
        for (k, v) in &h.headers {
            // Checked by the config's validation; a bad one here is skipped rather than sent.
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                headers.insert(k, v);
            }
        }
        let auth = match (&h.bearer_token_file, &h.oauth2) {
            (Some(path), _) => Auth::Bearer(BearerFile {
                path: path.clone(),
                cached: Mutex::new(None),
            }),
            (None, Some(o)) => Auth::Smart(Box::new(Smart::new(o, &url)?)),
            (None, None) => Auth::None,
        };
        Ok(Some(Self {
            pool,
            url,
            method: match h.method {
                HttpMethod::Post => Method::POST,
                HttpMethod::Put => Method::PUT,
            },
            content_type: h
                .content_type
                .as_deref()
                .and_then(|c| HeaderValue::from_str(c).ok()),
            headers,
            auth,
            response_timeout: d.response_timeout,
            max_body: h.max_response_bytes,
        }))
    }

    /// Sends `body` (of `content_type`, unless the destination sets one) and reads the answer, within the
    /// response timeout. A 401 makes the token be fetched (or its file read) again and the request sent once
    /// more.
    pub async fn send(
        &self,
        body: Bytes,
        content_type: &str,
        traceparent: &str,
    ) -> Result<Answer, HttpError> {
        let mut fresh = false;
        loop {
            let authorization = match &self.auth {
                Auth::None => None,
                Auth::Bearer(b) => Some(b.header(fresh).await?),
                Auth::Smart(s) => Some(s.header(&self.pool, fresh, self.response_timeout).await?),
            };
            let ct = self.content_type.clone().unwrap_or_else(|| {
                HeaderValue::from_str(content_type)
                    .unwrap_or(HeaderValue::from_static("application/octet-stream"))
            });
            let accept = if content_type.starts_with("application/fhir+json") {
                HeaderValue::from_static("application/fhir+json")
            } else {
                HeaderValue::from_static("*/*")
            };
            let mut req = Request::builder()
                .method(self.method.clone())
                .uri(self.url.clone())
                .body(Full::new(body.clone()))
                .map_err(|e| HttpError::Request(e.to_string()))?;
            let hs = req.headers_mut();
            // The configured headers, each name and value a reference-counted copy (no map built per request).
            for (name, value) in &self.headers {
                hs.append(name.clone(), value.clone());
            }
            hs.insert(header::CONTENT_TYPE, ct);
            hs.insert(header::ACCEPT, accept);
            if let Ok(tp) = HeaderValue::from_str(traceparent)
                && !traceparent.is_empty()
            {
                hs.insert(HeaderName::from_static("traceparent"), tp);
            }
            if let Some(a) = authorization.clone() {
                hs.insert(header::AUTHORIZATION, a);
            }
            let answer = exchange(&self.pool, req, self.max_body, self.response_timeout).await?;
            if answer.status == StatusCode::UNAUTHORIZED && authorization.is_some() && !fresh {
                fresh = true;
                continue;
            }
            return Ok(answer);
        }
    }
}
