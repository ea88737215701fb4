//! Static bearer tokens: the file of `<name> <token>` lines, re-read when it changes, compared in constant time.

use super::error::GrpcError;
use std::path::PathBuf;

/// The file's modification time and size when last read, and its (name, token) pairs.
type TokensState = (Option<(std::time::SystemTime, u64)>, Vec<(String, String)>);

/// The static tokens, re-read when the file's modification time or size changes.
pub(super) struct Tokens {
    path: PathBuf,
    state: std::sync::Mutex<TokensState>,
}

impl Tokens {
    /// The tokens of the file at `path`, read at the first call.
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            state: std::sync::Mutex::new((None, Vec::new())),
        }
    }

    pub(super) fn read(path: &std::path::Path) -> Result<Vec<(String, String)>, GrpcError> {
        let err = |reason: String| GrpcError::Tokens {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(char::is_whitespace) {
                Some((name, token)) if token.trim().len() >= 16 => {
                    out.push((name.to_owned(), token.trim().to_owned()))
                }
                // The line itself may hold a token: never in the error.
                _ => {
                    return Err(err(format!(
                        "line {}: expected `<name> <token>` with a token of at least 16 characters",
                        i + 1
                    )));
                }
            }
        }
        Ok(out)
    }

    /// The name of `token`, reloading the file first when it changed. A file that is missing or does not
    /// parse accepts no token (logged).
    pub(super) fn name_of(&self, token: &str) -> Option<String> {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.modified().unwrap_or(std::time::UNIX_EPOCH), m.len()));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if stamp != state.0 || stamp.is_none() {
            // Fails closed: a file that is gone or no longer parses revokes every token (a revocation that
            // left a typo must not keep the revoked token alive).
            let tokens = match stamp.map(|_| Self::read(&self.path)) {
                Some(Ok(tokens)) => {
                    tracing::info!(path = %self.path.display(), tokens = tokens.len(), "gRPC tokens loaded");
                    tokens
                }
                Some(Err(e)) => {
                    tracing::error!(error = %e, "gRPC tokens file refused: no token is accepted until it is fixed");
                    Vec::new()
                }
                None => {
                    if state.0.is_some() || !state.1.is_empty() {
                        tracing::error!(path = %self.path.display(), "gRPC tokens file missing: no token is accepted");
                    }
                    Vec::new()
                }
            };
            *state = (stamp, tokens);
        }
        state
            .1
            .iter()
            .find(|(_, t)| constant_time_eq(t.as_bytes(), token.as_bytes()))
            .map(|(n, _)| n.clone())
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
