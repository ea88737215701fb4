//! Compiles proto/hl7gw/v1/*.proto with protox (pure Rust: no system protoc) and tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = [
        "hl7gw/v1/envelope.proto",
        "hl7gw/v1/ingest.proto",
        "hl7gw/v1/transform.proto",
        "hl7gw/v1/egress.proto",
        "hl7gw/v1/events.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [root])?;
    // The descriptor set the gRPC listeners serve through reflection (grpcurl works without the protos).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("hl7gw_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        // `bytes` fields as `bytes::Bytes`: the envelope carries the MLLP frame without copying it.
        .bytes(".")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
