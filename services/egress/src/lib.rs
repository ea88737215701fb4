//! hl7gw-egress: delivers `hl7.out.<destination>` to each destination's receiver over MLLP (TCP or TLS) or
//! HTTP(S) (FHIR servers), many patients at once and each patient's messages in order ([`deliver`]), an offset
//! stored for commit only once every record before it was answered or dead-lettered; refused and given-up
//! messages go to `hl7.dlq`, each outcome to the `hl7.events` ledger; dead letters, replay, status and trace
//! over gRPC.

pub mod config;
pub mod deadletters;
pub mod deliver;
pub mod events;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod mllp_client;
pub mod trace;

use config::Config;
use hl7gw_runtime::admin::Health;
use hl7gw_runtime::dedup::Dedup;
use hl7gw_runtime::kafka::{Commit, consumer_config, consumer_lag, ensure_topics};
use hl7gw_runtime::service::{Bound, Listening};
use rdkafka::consumer::Consumer;
use rdkafka::producer::Producer;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why the egress could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error(transparent)]
    Common(hl7gw_runtime::service::CommonError),
    #[error("destination {destination}: {source}")]
    Tls {
        destination: String,
        #[source]
        source: hl7gw_tls::TlsError,
    },
    #[error("destination {destination}: {source}")]
    Http {
        destination: String,
        #[source]
        source: http::SetupError,
    },
    /// A delivery worker died; the process exits so its messages are read again from committed offsets.
    #[error("a delivery worker failed; see the log")]
    WorkerFailed,
}
hl7gw_runtime::common_error_from!(EgressError);

/// The egress, its Kafka clients made and its ports bound, not yet delivering.
#[derive(Debug)]
pub struct App {
    cfg: Arc<Config>,
    dests: Vec<Arc<deliver::DestCtx>>,
    producer: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
    metrics: metrics::EgressMetrics,
    listening: Listening,
}

impl hl7gw_runtime::service::Service for App {
    type Config = Config;
    type Error = EgressError;

    /// Each destination's TLS files and (HTTP) credentials are read: a missing Secret mount or a key that
    /// cannot sign fails here, not at the first delivery.
    fn check(cfg: &Config) -> Result<(), EgressError> {
        for (name, d) in &cfg.destinations {
            if d.url.is_some() {
                http::HttpClient::new(name, d).map_err(|source| EgressError::Http {
                    destination: name.clone(),
                    source,
                })?;
            } else {
                mllp_client::Tls::from_config(name, d).map_err(|source| EgressError::Tls {
                    destination: name.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Makes the producer and each destination's consumer and TLS settings, binds gRPC and the admin server.
    async fn build(cfg: Arc<Config>) -> Result<Self, EgressError> {
        let (registry, metrics) = metrics::EgressMetrics::registered();
        let producer = Arc::new(hl7gw_runtime::kafka::producer::ProducerSlot::from_config(
            "hl7gw-egress",
            cfg.kafka.clone(),
            Duration::from_secs(30),
            metrics.producer_recoveries.clone(),
        )?);

        // The ledger's events on a producer of their own, lingering (`ledger.linger`): an event delays only the
        // commit of its offset, so batching them costs no delivery any time.
        let ledger = Arc::new(hl7gw_runtime::kafka::producer::ProducerSlot::from_config(
            "hl7gw-egress-ledger",
            cfg.ledger.producer_settings(&cfg.kafka),
            Duration::from_secs(30),
            metrics.producer_recoveries.clone(),
        )?);
        let mut dests = Vec::new();
        for (name, d) in &cfg.destinations {
            // An HTTP destination's TLS is its client's (below); MLLP's is a connector per destination.
            let tls = if d.url.is_some() {
                None
            } else {
                mllp_client::Tls::from_config(name, d).map_err(|source| EgressError::Tls {
                    destination: name.clone(),
                    source,
                })?
            };
            // Offsets are stored after each ACK and committed in the background every 500 ms and on close.
            let consumer: deliver::DestConsumer = consumer_config(
                &cfg.group(name),
                "hl7gw-egress",
                &cfg.kafka,
                Commit::StoredEvery(Duration::from_millis(500)),
            )?
            .create_with_context(hl7gw_runtime::kafka::Assignment::default())?;
            let http = http::HttpClient::new(name, d)
                .map_err(|source| EgressError::Http {
                    destination: name.clone(),
                    source,
                })?
                .map(Arc::new);
            dests.push(Arc::new(deliver::DestCtx {
                name: name.clone(),
                topic: cfg.topic(name),
                dest: Arc::new(d.clone()),
                tls,
                http,
                cfg: cfg.clone(),
                consumer: Arc::new(consumer),
                producer: producer.clone(),
                ledger: ledger.clone(),
                metrics: metrics.clone(),
                m: metrics.destination(name),
                // Entries hold no ACK: the count bounds the bytes.
                dedup: Dedup::new(
                    cfg.duplicate_window,
                    cfg.duplicate_capacity,
                    cfg.duplicate_capacity
                        .saturating_mul(hl7gw_runtime::dedup::ENTRY_OVERHEAD_BYTES),
                ),
                state: deliver::DestState::default(),
            }));
        }

        let listening = Listening::bind(&cfg.service, cfg.grpc.clone(), registry).await?;
        let bound = listening.bound;
        tracing::info!(grpc = %bound.grpc, admin = %bound.admin, destinations = dests.len(), "egress listening");
        Ok(App {
            cfg,
            dests,
            producer,
            metrics,
            listening,
        })
    }

    /// Where each listener is bound.
    fn bound(&self) -> Bound {
        self.listening.bound
    }

    /// Delivers until `stop` is cancelled, then drains: deliveries in hand finish (or are left for the next
    /// owner), stored offsets are committed and the consumer groups are left.
    async fn run(self, stop: CancellationToken) -> Result<(), EgressError> {
        let App {
            cfg,
            dests,
            producer,
            metrics,
            listening,
        } = self;
        let health = listening.health.clone();

        let topics_created = create_topics(&cfg).await;
        for d in &dests {
            d.consumer.subscribe(&[&d.topic])?;
        }

        let side_stop = CancellationToken::new();
        tokio::spawn(housekeeping(
            cfg.clone(),
            topics_created,
            dests.clone(),
            producer.clone(),
            health.clone(),
            metrics.clone(),
            side_stop.clone(),
        ));
        let grpc_server = listening.grpc.serve(grpc::EgressService::server(
            cfg.clone(),
            dests.clone(),
            producer.clone(),
            metrics.clone(),
        ));

        let deliver_stop = CancellationToken::new();
        let failed = CancellationToken::new();
        let tasks: Vec<_> = dests
            .iter()
            .map(|d| tokio::spawn(d.clone().run(deliver_stop.clone(), failed.clone())))
            .collect();

        tokio::select! {
            _ = stop.cancelled() => {}
            _ = failed.cancelled() => {}
        }
        health.set_draining();
        tracing::info!("draining: finishing deliveries in hand");
        deliver_stop.cancel();
        let all = futures_util::future::join_all(tasks);
        if tokio::time::timeout(cfg.service.drain_timeout, all)
            .await
            .is_err()
        {
            tracing::warn!(
                "drain timeout: undelivered messages stay uncommitted for the next owner"
            );
        }
        side_stop.cancel();
        let grpc_result = grpc_server.stop().await;
        for d in &dests {
            let c = d.consumer.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let _ = c.commit_consumer_state(rdkafka::consumer::CommitMode::Sync);
                c.unsubscribe();
            })
            .await;
        }
        drop(dests);
        let p = producer.get();
        let _ = tokio::task::spawn_blocking(move || p.flush(Duration::from_secs(5))).await;
        listening.admin.stop().await;
        tracing::info!("egress stopped");
        if failed.is_cancelled() {
            return Err(EgressError::WorkerFailed);
        }
        grpc_result.map_err(EgressError::from)
    }
}

/// Readiness (Kafka answers, the producer is not being recreated, dead letters can be written, every
/// destination topic can be read) and consumer lag per destination.
async fn housekeeping(
    cfg: Arc<Config>,
    created: bool,
    dests: Vec<Arc<deliver::DestCtx>>,
    producer: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
    health: Arc<Health>,
    metrics: metrics::EgressMetrics,
    stop: CancellationToken,
) {
    let created = std::sync::atomic::AtomicBool::new(created);
    hl7gw_runtime::service::readiness_loop(health, stop, || async {
        producer.recover_if_fatal();
        let broken = producer.is_broken();
        let p = producer.get();
        // Kafka answers: every topic's metadata until the topics are created (a producer asking for a missing
        // topic by name has the broker create it with its defaults), then the DLQ topic's alone, the one this
        // producer writes (every topic's every 2 s from every pod is heavy on a cluster with many topics).
        let named = created
            .load(Ordering::Relaxed)
            .then(|| cfg.dlq_topic.clone());
        let topic = named.clone();
        let ok = tokio::task::spawn_blocking(move || {
            hl7gw_runtime::kafka::metadata_ok(
                p.client()
                    .fetch_metadata(topic.as_deref(), Duration::from_secs(2)),
                topic.as_deref(),
            )
        })
        .await
        .unwrap_or(None);
        if ok.is_some() && !created.load(Ordering::Relaxed) && create_topics(&cfg).await {
            created.store(true, Ordering::Relaxed);
        }
        for d in &dests {
            // The age of the oldest message each destination holds (0 when none): the alert compares it with
            // the topic's retention.
            d.m.oldest_undelivered_age
                .set(d.state.oldest_undelivered_age().as_secs_f64());
            let c = d.consumer.clone();
            let lag = tokio::task::spawn_blocking(move || {
                consumer_lag(c.as_ref(), Duration::from_secs(2)).ok()
            })
            .await
            .ok()
            .flatten();
            if let Some(lag) = lag {
                d.state.lag.store(lag, Ordering::Relaxed);
                metrics
                    .consumer_lag
                    .get_or_create(&metrics::DestLabels {
                        destination: d.name.clone(),
                    })
                    .set(lag);
            }
        }
        let unready = dests.iter().find_map(|d| {
            d.state
                .unready_reason(d.consumer.context().generation())
                .map(|r| format!("destination {}: {r}", d.name))
        });
        if broken {
            Err("kafka producer failed for good and is being recreated".to_owned())
        } else if let Some(reason) = hl7gw_runtime::kafka::metadata_failure(ok, named.as_deref()) {
            Err(reason)
        } else if let Some(reason) = unready {
            Err(reason)
        } else {
            Ok(())
        }
    })
    .await;
}

/// Creates the destination and DLQ topics that do not exist yet; false when Kafka did not let it.
async fn create_topics(cfg: &Config) -> bool {
    let mut topics: Vec<String> = cfg.destinations.keys().map(|d| cfg.topic(d)).collect();
    topics.push(cfg.dlq_topic.clone());
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let created = match ensure_topics(&cfg.kafka, &refs).await {
        Ok(()) => cfg.ledger.ensure_topic(&cfg.kafka).await,
        Err(e) => Err(e),
    };
    match created {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot create topics yet; the subscriptions will wait for them");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use hl7gw_runtime::service::Service as _;

    /// `--check-config` reads what a destination names: a SMART key that is not a key, or a CA file without a
    /// certificate, fails there (before this, only at start or at the first delivery).
    #[test]
    fn check_reads_each_destinations_tls_files_and_keys() {
        let pki = hl7gw_testkit::pki();
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a PEM\n").unwrap();
        let config = |tls_ca: &str, key: &str| -> crate::Config {
            hl7gw_testkit::config(&format!(
                "destinations: {{fhir: {{url: 'https://fhir.example/fhir', tls: {{ca: {tls_ca}}}, \
                 http: {{oauth2: {{client_id: a, private_key: {key}}}}}}}}}"
            ))
        };
        let (ca, key, junk) = (
            pki.file("ca.pem"),
            pki.file("smart-client.key"),
            junk.display().to_string(),
        );
        crate::App::check(&config(&ca, &key)).unwrap();
        assert!(
            crate::App::check(&config(&ca, &junk)).is_err(),
            "a junk key"
        );
        assert!(
            crate::App::check(&config(&junk, &key)).is_err(),
            "a CA file without a certificate"
        );
    }
}
