//! `hl7gw man [command]`: the man page (roff) of hl7gw or of one command.

use clap::CommandFactory;
use std::io::Write;
use std::process::ExitCode;

/// `hl7gw man [command]`: the man page of hl7gw (`hl7gw(1)`) or of one command (`hl7gw-tail(1)`).
pub fn run(command: Option<&str>) -> anyhow::Result<ExitCode> {
    let mut cmd = crate::cli::Cli::command();
    cmd.build();
    let page = match command {
        None => clap_mangen::Man::new(cmd),
        Some(name) => {
            let sub = cmd
                .find_subcommand(name)
                .ok_or_else(|| anyhow::anyhow!("no command {name:?}: see hl7gw --help"))?;
            let title = format!("hl7gw-{}", sub.get_name());
            let sub = sub
                .clone()
                .display_name(title.clone())
                .bin_name(format!("hl7gw {}", sub.get_name()));
            clap_mangen::Man::new(sub).title(title)
        }
    };
    let mut out = Vec::new();
    page.render(&mut out)?;
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}
