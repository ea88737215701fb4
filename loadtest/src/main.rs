//! hl7gw-load: parse the command line, run on a multi-thread runtime, map the outcome to the exit status.

use clap::Parser;
use hl7gw_load::cli::Args;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Usage errors exit with status 2 here (clap's convention, and ours).
    let args = Args::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        builder.worker_threads(usize::from(n));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hl7gw-load: starting the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(hl7gw_load::run::main(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hl7gw-load: {e:#}");
            ExitCode::from(2)
        }
    }
}
