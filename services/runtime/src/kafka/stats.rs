//! librdkafka's own statistics as metrics: requests per broker and API and the produce batches, so the broker's
//! share of a message's cost can be explained (how many Produce/Fetch/... requests each message costs).
//! Every client of the process reports its JSON every `kafka.statistics_interval` (librdkafka's
//! `statistics.interval.ms`); the last report of each client is kept and rendered at each scrape.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// What one client's last report said.
#[derive(Debug, Clone, PartialEq)]
struct Report {
    /// When it came: a client gone (a recreated producer, a finished DLQ listing) stops reporting and its last
    /// report is dropped after [`STALE`].
    at: std::time::Instant,
    /// `client.id`#`type` of the client (e.g. `hl7gw-ingress` `producer`).
    client: String,
    kind: String,
    /// (broker node id, API name) → requests sent since the client started.
    requests: BTreeMap<(String, String), u64>,
    /// Messages per produce batch, mean over the report's window (`topics.*.batchcnt.avg`), per topic.
    batch_messages: BTreeMap<String, i64>,
}

/// Last report per librdkafka client instance (`name`).
static REPORTS: Mutex<BTreeMap<String, Report>> = Mutex::new(BTreeMap::new());

/// Keeps a client's statistics JSON (called from the clients' `stats_raw` callback). Malformed JSON is ignored.
pub fn record(json: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(json) else {
        return;
    };
    let Some(name) = v["name"].as_str() else {
        return;
    };
    let mut r = Report {
        at: std::time::Instant::now(),
        client: v["client_id"].as_str().unwrap_or_default().to_owned(),
        kind: v["type"].as_str().unwrap_or_default().to_owned(),
        requests: BTreeMap::new(),
        batch_messages: BTreeMap::new(),
    };
    if let Some(brokers) = v["brokers"].as_object() {
        for b in brokers.values() {
            let node = b["nodeid"].as_i64().unwrap_or(-1);
            // -1: the bootstrap connection, counted under its own node once known.
            if node < 0 {
                continue;
            }
            if let Some(req) = b["req"].as_object() {
                for (api, n) in req {
                    let n = n.as_u64().unwrap_or(0);
                    if n > 0 {
                        r.requests.insert((node.to_string(), api.clone()), n);
                    }
                }
            }
        }
    }
    if let Some(topics) = v["topics"].as_object() {
        for (t, tv) in topics {
            if let Some(avg) = tv["batchcnt"]["avg"].as_i64() {
                r.batch_messages.insert(t.clone(), avg);
            }
        }
    }
    let mut reports = REPORTS.lock().unwrap_or_else(|p| p.into_inner());
    reports.retain(|_, r| r.at.elapsed() < STALE);
    reports.insert(name.to_owned(), r);
}

/// A client that has not reported for this long is gone (the default interval is 15 s).
const STALE: std::time::Duration = std::time::Duration::from_secs(300);

/// Renders the kept reports at each scrape (registered by [`crate::metrics::registry`]).
#[derive(Debug, Default)]
pub struct StatsCollector;

impl prometheus_client::collector::Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let reports: Vec<Report> = REPORTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.at.elapsed() < STALE)
            .cloned()
            .collect();
        if reports.is_empty() {
            return Ok(());
        }
        // Summed over the process's live clients of the same id and type (a recreated producer starts at 0;
        // its predecessor's count leaves the sum once stale, which reads as a counter reset).
        let mut requests: BTreeMap<Vec<(String, String)>, u64> = BTreeMap::new();
        let mut batches: BTreeMap<Vec<(String, String)>, i64> = BTreeMap::new();
        for r in &reports {
            for ((broker, api), n) in &r.requests {
                let labels = vec![
                    ("client".to_owned(), r.client.clone()),
                    ("type".to_owned(), r.kind.clone()),
                    ("broker".to_owned(), broker.clone()),
                    ("api".to_owned(), api.clone()),
                ];
                *requests.entry(labels).or_default() += n;
            }
            for (topic, avg) in &r.batch_messages {
                let labels = vec![
                    ("client".to_owned(), r.client.clone()),
                    ("topic".to_owned(), topic.clone()),
                ];
                let e = batches.entry(labels).or_default();
                *e = (*e).max(*avg);
            }
        }
        encode_family(
            &mut encoder,
            "kafka_requests",
            "Requests the Kafka clients sent, per broker and API (librdkafka statistics)",
            &requests,
            ConstCounter::new,
        )?;
        encode_family(
            &mut encoder,
            "kafka_produce_batch_messages",
            "Mean messages per produce batch over the last statistics window, per topic (librdkafka statistics)",
            &batches,
            ConstGauge::new,
        )
    }
}

/// One metric family of constant values, one series per label set.
fn encode_family<V: Copy + Default, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    values: &BTreeMap<Vec<(String, String)>, V>,
    metric: impl Fn(V) -> M,
) -> Result<(), std::fmt::Error> {
    let kind = metric(V::default()).metric_type();
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in values {
        metric(*v).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_becomes_request_counts_and_batch_sizes() {
        let json = br#"{"name": "hl7gw-ingress#producer-9", "client_id": "hl7gw-ingress", "type": "producer",
            "brokers": {
              "127.0.0.1:9092/bootstrap": {"nodeid": -1, "req": {"Metadata": 3}},
              "127.0.0.1:9092/1": {"nodeid": 1, "req": {"Produce": 120, "Metadata": 2, "Fetch": 0}}},
            "topics": {"hl7.inbound": {"batchcnt": {"avg": 4}}}}"#;
        record(json);
        record(b"not json");
        let reports = REPORTS.lock().expect("lock");
        let r = &reports["hl7gw-ingress#producer-9"];
        assert_eq!(r.requests[&("1".to_owned(), "Produce".to_owned())], 120);
        assert_eq!(
            r.requests.len(),
            2,
            "zero counts and the bootstrap connection are left out"
        );
        assert_eq!(r.batch_messages["hl7.inbound"], 4);
        drop(reports);
        let registry = crate::metrics::registry();
        let text = crate::metrics::render(&registry);
        assert!(
            text.contains(
                r#"hl7gw_kafka_requests_total{client="hl7gw-ingress",type="producer",broker="1",api="Produce"} 120"#
            ),
            "{text}"
        );
        assert!(
            text.contains("hl7gw_kafka_produce_batch_messages{"),
            "{text}"
        );
    }
}
