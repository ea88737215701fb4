//! The audit log of admin calls (who, method, what, result; never content) and the clipping that keeps every
//! line bounded whatever a caller sends.

use super::caller::{Caller, ConnInfo};
use std::net::SocketAddr;
use tonic::Status;

/// Longest caller-supplied value (a destination, a stage, an id, a route name) kept in an audit or error line,
/// in bytes: these are logged before the caller is authorised, so a line must not grow with them.
pub const MAX_LOGGED_VALUE: usize = 128;

/// Longest `what` (the request's description) and `result` of one audit line, in bytes. A replay's result
/// lists the ids it made (ours, at most a page of them), so `result` gets more room.
const MAX_AUDIT_WHAT: usize = 2048;
const MAX_AUDIT_RESULT: usize = 64 * 1024;

/// `value` cut to [`MAX_LOGGED_VALUE`] bytes at a character boundary, with its full length, for a log line or
/// an error message that names a caller-supplied value.
pub fn clip(value: &str) -> std::borrow::Cow<'_, str> {
    clip_to(value, MAX_LOGGED_VALUE)
}

/// `value` cut to `max` bytes at a character boundary, followed by `…[<n> bytes]` when it was longer.
pub fn clip_to(value: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if value.len() <= max {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…[{} bytes]", &value[..end], value.len()))
}

/// The audit line of an admin call: who, from where, which method, on what (ids, destinations, a time range;
/// never message content), and the result. Target `hl7gw::audit`, so it can be routed apart. Every field is
/// bounded ([`clip_to`]), whatever the caller sent.
pub fn audit(who: &str, peer: Option<SocketAddr>, method: &str, what: &str, result: &str) {
    tracing::info!(
        target: "hl7gw::audit",
        caller = &*clip(who),
        peer = %peer.map(|p| p.to_string()).unwrap_or_default(),
        method = &*clip(method),
        what = &*clip_to(what, MAX_AUDIT_WHAT),
        result = &*clip_to(result, MAX_AUDIT_RESULT),
        "admin call"
    );
}

/// [`audit`] once an admin call finished: `ok` says what an answer held (counts, ids), an error its code.
pub fn audit_result<T>(
    caller: &Caller,
    peer: Option<SocketAddr>,
    method: &str,
    what: &str,
    result: &Result<tonic::Response<T>, Status>,
    ok: impl FnOnce(&T) -> String,
) {
    let outcome = match result {
        Ok(r) => format!("ok: {}", ok(r.get_ref())),
        Err(s) => format!("error: {:?}", s.code()),
    };
    audit(&caller.to_string(), peer, method, what, &outcome);
}

/// The peer address of a call on a listener built here.
pub fn peer<T>(req: &tonic::Request<T>) -> Option<SocketAddr> {
    req.extensions().get::<ConnInfo>().and_then(|c| c.remote)
}

/// The client certificate subject of a call made over mutual TLS.
pub fn client_subject<T>(req: &tonic::Request<T>) -> Option<String> {
    req.extensions()
        .get::<ConnInfo>()
        .and_then(|c| c.client_subject.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A log sink for a test subscriber.
    #[derive(Clone, Default)]
    struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn audit_lines_are_bounded_whatever_the_caller_sends() {
        let sink = Sink::default();
        let w = sink.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .finish();
        let big = "d".repeat(4 << 20);
        tracing::subscriber::with_default(sub, || {
            audit(
                "anonymous",
                None,
                "Status",
                &format!("destination={big:?}"),
                "refused: Unauthenticated",
            );
            audit(&big, None, &big, &big, &big);
        });
        let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{}", clip_to(&text, 1000));
        for line in lines {
            assert!(
                line.len() < 80 * 1024,
                "an audit line of {} bytes: {}",
                line.len(),
                clip_to(line, 300)
            );
            assert!(line.contains(" bytes]"), "{}", clip_to(line, 300));
        }
        // Cut at a character boundary, with the full length.
        assert_eq!(clip_to("ééé", 3), "é…[6 bytes]");
        assert_eq!(clip("short"), "short");
    }
}
