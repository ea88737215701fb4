//! Why the gRPC settings are refused.

/// Why the gRPC settings are refused.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("grpc.{0}")]
    Rule(String),
    #[error("grpc.tls: {0}")]
    Tls(#[from] hl7gw_tls::TlsError),
    #[error("grpc.tokens_file {path}: {reason}")]
    Tokens { path: String, reason: String },
}
