//! `hl7gw completions <shell>`: the shell completion script of every command.

use clap::CommandFactory;
use std::io::Write;
use std::process::ExitCode;

/// `hl7gw completions <shell>`: the completion script on stdout.
pub fn run(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut cmd = crate::cli::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "hl7gw", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}
