//! An HTTP(S) client for one destination: hyper's pooled client (keep-alive; HTTP/2 when the server offers it
//! over TLS), TLS from the destination's PEM files, and `Authorization` from a bearer token file or a SMART
//! backend services token endpoint (a JWT assertion signed with the client's key). An answer is the status,
//! `Retry-After` and at most `http.max_response_bytes` of the body; following redirects is not done (a 3xx is an
//! answer like any other).
//!
//! The files: `client` (the destination's client), `auth` (tokens), `wire` (one request and its answer).

mod auth;
mod client;
mod wire;

pub use client::HttpClient;
pub use wire::{Answer, HttpError, SetupError};
