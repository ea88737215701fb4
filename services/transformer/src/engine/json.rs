//! The canonical JSON form of an envelope and its message (`toJson`; proto/hl7gw/v1/canonical.schema.json).

use hl7gw_runtime::proto::v1::Envelope;
use hl7v2::{Charset, Message};
use serde::Serialize;

/// The canonical JSON form: the header essentials and every non-empty value under its flat key, decoded as
/// text in the message's charset (docs/consuming.md).
pub fn to_json(
    env: &Envelope,
    msg: &Message<'_>,
    charset: Charset,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Canonical<'a> {
        format: &'static str,
        id: &'a str,
        received_at: Option<String>,
        message_type: String,
        trigger_event: String,
        control_id: String,
        version: String,
        sending_application: String,
        sending_facility: String,
        charset: &'static str,
        segments: Vec<String>,
        flat: Flat,
    }
    struct Flat(Vec<(String, String)>);
    impl Serialize for Flat {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
        }
    }
    let h = msg.header();
    let t = |b: &[u8]| hl7gw_runtime::envelope::text(b, charset);
    let flat = msg
        .flat()
        .into_iter()
        .map(|e| (e.key(), t(&e.value)))
        .collect();
    let c = Canonical {
        format: "hl7gw.canonical.v1",
        id: &env.id,
        received_at: env.received_at.as_ref().map(|ts| ts.to_string()),
        message_type: t(h.message_type),
        trigger_event: t(h.trigger_event),
        control_id: t(h.control_id),
        version: t(h.version),
        sending_application: t(h.sending_application),
        sending_facility: t(h.sending_facility),
        charset: charset.name(),
        segments: msg.segments().map(|s| t(s.name())).collect(),
        flat: Flat(flat),
    };
    serde_json::to_vec(&c)
}
