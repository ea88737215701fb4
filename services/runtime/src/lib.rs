//! hl7gw-runtime: what every hl7gw service shares — config loading, telemetry, metrics, Kafka client setup,
//! the envelope contract, shutdown, and the admin HTTP server.

/// The wire contracts' generated code (`hl7gw-proto`).
pub use hl7gw_proto as proto;

pub mod admin;
pub mod certs;
pub mod config;
pub mod dedup;
pub mod envelope;
pub mod failpoint;
pub mod grpc;
pub mod kafka;
pub mod ledger;
pub mod loglimit;
pub mod memory;
pub mod metrics;
pub mod service;
pub mod shutdown;
pub mod slots;
pub mod telemetry;

/// This process's pod name: `POD_NAME` (set by the chart from the downward API), else `HOSTNAME`.
pub fn pod_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "local".to_owned())
}

/// A binary's end: `Ok` exits 0; an error prints one line, `error: ` and [`error_line`] (no backtrace, whatever
/// `RUST_BACKTRACE` says), and exits 1.
pub fn exit<E: std::error::Error>(result: Result<(), E>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line (for a log), as [`error_chain`] joins them.
pub fn error_line(e: &dyn std::error::Error) -> String {
    error_chain(e).replace('\n', " ")
}

/// An error and its causes joined by `: `, line breaks kept (a parser's snippet with its caret, for a terminal).
/// A cause whose text is already there (an error that writes its source into its own message, as `config file
/// {path}: {source}` does) is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_line_names_each_cause_once() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        // The config error writes its source into its message and also returns it from `source()`.
        let e = config::ConfigError::File {
            path: "/etc/x.yaml".into(),
            source: missing,
        };
        assert_eq!(error_line(&e), "config file /etc/x.yaml: no such file");
        // A wrapper that does not: the cause is appended.
        #[derive(Debug, thiserror::Error)]
        #[error("starting")]
        struct Outer(#[source] config::ConfigError);
        let e = Outer(config::ConfigError::Rule("two\nlines".into()));
        assert_eq!(error_line(&e), "starting: invalid configuration: two lines");
        // For a terminal, the line break stays (a parser's snippet and its caret).
        assert_eq!(
            error_chain(&e),
            "starting: invalid configuration: two\nlines"
        );
    }
}
