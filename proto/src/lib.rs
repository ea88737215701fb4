//! hl7gw-proto: the code generated from `proto/hl7gw/v1` (the Kafka envelope and the Ingest, Transform and
//! Egress gRPC services, clients and servers) and its descriptor set. The services reach it through
//! `hl7gw_runtime::proto`; the load harness, which has no other use for the runtime, depends on it alone.
#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

pub mod v1 {
    tonic::include_proto!("hl7gw.v1");
}

/// The encoded `FileDescriptorSet` of proto/hl7gw/v1 (served by gRPC reflection).
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hl7gw_descriptor.bin"));
