//! The operator's lines on stderr, each named after its command (`hl7gw send: ...`; the `log!` macro).

use std::io::Write;

/// Writes `args` to stderr as `hl7gw <command>: ...`, the command being the module under `commands` that
/// `module` is in (`hl7gw::commands::receive::http` logs as `hl7gw receive: ...`).
pub(crate) fn line(module: &str, args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "hl7gw {}: {args}", command_of(module));
}

/// The command a module path belongs to: the part after `commands`, `_` written `-` (`dry_run` is `dry-run`).
fn command_of(module: &str) -> String {
    let mut parts = module.split("::");
    let command = match parts.by_ref().position(|p| p == "commands") {
        Some(_) => parts.next(),
        None => None,
    };
    command
        .unwrap_or_else(|| module.rsplit("::").next().unwrap_or(module))
        .replace('_', "-")
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_lines_are_named_after_their_command() {
        assert_eq!(super::command_of("hl7gw::commands::send"), "send");
        assert_eq!(
            super::command_of("hl7gw::commands::receive::http"),
            "receive"
        );
        assert_eq!(super::command_of("hl7gw::commands::dry_run"), "dry-run");
        assert_eq!(super::command_of("hl7gw::connect"), "connect");
    }
}
