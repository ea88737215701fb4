//! Who a call comes from: the caller as authentication named it, and what the connection says (peer, client
//! certificate).

use std::net::SocketAddr;

/// Who made a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Anonymous,
    /// A static token's name.
    Token(String),
    /// A client certificate's CN.
    Cert(String),
    /// A Kubernetes user (a ServiceAccount: `system:serviceaccount:<ns>:<name>`), authorised by RBAC.
    Kubernetes(String),
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Anonymous => f.write_str("anonymous"),
            Self::Token(n) => write!(f, "token:{n}"),
            Self::Cert(n) => write!(f, "cert:{n}"),
            Self::Kubernetes(u) => write!(f, "k8s:{u}"),
        }
    }
}

/// What a handler learns about the connection of a call (request extensions).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// The client certificate's CN (mutual TLS).
    pub client_cn: Option<String>,
    /// The client certificate's subject (mutual TLS).
    pub client_subject: Option<String>,
}
