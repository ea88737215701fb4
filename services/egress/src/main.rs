//! `hl7gw-egress`: reads the config, starts telemetry, runs the egress until SIGTERM.

fn main() -> std::process::ExitCode {
    let about = "hl7gw egress: delivers hl7.out.<destination> to receivers over MLLP or HTTP (FHIR), dead letters and replay";
    hl7gw_runtime::service::binary::<hl7gw_egress::App, hl7gw_runtime::config::NoFlags>(
        "hl7gw-egress",
        about,
    )
}
