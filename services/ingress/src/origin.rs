//! Where a message comes from: the connection or stream (`Origin`), and the sender it names (`Who`: MSH-3, MSH-4,
//! peer, listener), for the sender view, the log lines and the dead letters. No patient data.

use hl7v2::Header;
use hl7v2::ack::MAX_HD;
use std::sync::Arc;

/// Where messages come from: one per connection or gRPC stream.
#[derive(Debug, Clone)]
pub struct Origin {
    pub listener: Arc<str>,
    pub protocol: &'static str,
    pub peer: Arc<str>,
    pub connection_id: String,
    pub tls_client: String,
}

/// The first component of an HD field, cut to [`MAX_HD`] bytes.
pub(crate) fn hd1(field: &[u8], component: u8) -> &[u8] {
    let first = field
        .iter()
        .position(|b| *b == component)
        .map_or(field, |i| &field[..i]);
    &first[..first.len().min(MAX_HD)]
}

/// Who sent a message, for reject and NAK log lines: MSH-3 and MSH-4 (their first component, as the sender
/// view names senders, cut short), peer address and listener. No patient data.
#[derive(Clone, Copy)]
pub(crate) struct Who<'a> {
    pub sending_application: &'a [u8],
    pub sending_facility: &'a [u8],
    pub peer: &'a str,
    pub listener: &'a str,
}

impl<'a> Who<'a> {
    /// `h`'s sender on `origin` (unknown for a record Kafka refused after the publish: empty peer and listener).
    pub(crate) fn new(h: &'a Header<'a>, peer: &'a str, listener: &'a str) -> Self {
        let c = h.delimiters.component;
        let clip = |v: &'a [u8]| {
            let v = hd1(v, c);
            &v[..v.len().min(64)]
        };
        Self {
            sending_application: clip(h.sending_application),
            sending_facility: clip(h.sending_facility),
            peer,
            listener,
        }
    }

    pub(crate) fn app(&self) -> std::borrow::Cow<'a, str> {
        String::from_utf8_lossy(self.sending_application)
    }

    pub(crate) fn fac(&self) -> std::borrow::Cow<'a, str> {
        String::from_utf8_lossy(self.sending_facility)
    }
}
