//! Compiles proto/hl7gw/v1/ingest.proto (the ingress's gRPC API, for `--grpc`) with protox (no system protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let file = "hl7gw/v1/ingest.proto";
    println!("cargo:rerun-if-changed={}", root.join(file).display());
    let fds = protox::compile([file], [&root])?;
    tonic_prost_build::configure()
        .bytes(".")
        .build_client(true)
        // The harness tests serve it in-process.
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
