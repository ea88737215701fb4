//! TLS settings for `send` and `receive`: the shared hl7gw TLS setup. A client trusts only the CA file it is
//! given (no system store); a receiver asks for client certificates only when given a client CA, and then
//! requires one.

pub use hl7gw_tls::server_config;
