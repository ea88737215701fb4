//! The topics the routes need: created when they do not exist yet (inbound, DLQ, every destination's, the
//! ledger's), at start and as routes change.

use crate::config::Config;
use crate::source::LiveRoutes;
use hl7gw_runtime::kafka::ensure_topics;
use std::collections::BTreeSet;

/// Creates the inbound, DLQ and destination topics that do not exist yet.
pub(crate) async fn ensure_destinations(
    cfg: &Config,
    live: &LiveRoutes,
    known: &mut BTreeSet<String>,
) -> bool {
    let mut topics: BTreeSet<String> = [cfg.inbound_topic.clone(), cfg.dlq_topic.clone()].into();
    for r in &live.get().routes {
        topics.extend(r.destinations.iter().map(|d| cfg.out_topic(d)));
    }
    if let Some(d) = &cfg.default_destination {
        topics.insert(cfg.out_topic(d));
    }
    let new: Vec<&str> = topics
        .iter()
        .filter(|t| !known.contains(*t))
        .map(String::as_str)
        .collect();
    if new.is_empty() {
        return true;
    }
    let created = match ensure_topics(&cfg.kafka, &new).await {
        Ok(()) => cfg.ledger.ensure_topic(&cfg.kafka).await,
        Err(e) => Err(e),
    };
    match created {
        Ok(()) => {
            known.extend(new.iter().map(|t| (*t).to_owned()));
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot create topics yet");
            false
        }
    }
}
