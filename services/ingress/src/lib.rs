//! hl7gw-ingress: takes HL7 v2 messages over MLLP (TCP or TLS) and gRPC, publishes them to Kafka keyed by
//! patient, and acknowledges them only once Kafka holds them (durable mode).
//!
//! [`App`] is a [`Service`](hl7gw_runtime::service::Service): `build` makes the Kafka producer and binds every
//! listener; `run` serves until the shutdown token is cancelled, then drains: readiness goes false, the
//! listeners stop, every message already read is answered, the producer flushes.

pub mod budget;
pub mod config;
pub mod connection;
pub mod grpc;
pub mod listener;
pub mod metrics;
pub mod origin;
pub mod pipeline;
pub mod senders;
pub mod tls;

use config::Config;
use hl7gw_runtime::admin::{self, Health};
use hl7gw_runtime::kafka::ensure_topics;
use hl7gw_runtime::service::{Bound, Listening};
use rdkafka::producer::Producer;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the ingress could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum IngressError {
    #[error(transparent)]
    Common(hl7gw_runtime::service::CommonError),
    #[error(transparent)]
    Tls(#[from] hl7gw_tls::TlsError),
}
hl7gw_runtime::common_error_from!(IngressError);

/// The ingress, its producer made and every port bound, not yet serving.
pub struct App {
    cfg: Arc<Config>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    key_salt: Option<Vec<u8>>,
    metrics: metrics::IngressMetrics,
    producer: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
    mllp: tokio::net::TcpListener,
    listening: Listening,
    bound: Bound,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

impl hl7gw_runtime::service::Service for App {
    type Config = Config;
    type Error = IngressError;

    /// Reads the key salt and the TLS files, makes the producer and binds MLLP, gRPC and the admin server.
    async fn build(cfg: Arc<Config>) -> Result<Self, IngressError> {
        let key_salt = cfg.read_key_salt()?;
        let tls = cfg.tls.as_ref().map(tls::acceptor).transpose()?;
        let (registry, metrics) = metrics::IngressMetrics::registered();
        let producer = Arc::new(hl7gw_runtime::kafka::producer::ProducerSlot::from_config(
            "hl7gw-ingress",
            cfg.kafka.clone(),
            cfg.ack_timeout,
            metrics.producer_recoveries.clone(),
        )?);

        // No port is bound before the gRPC TLS is checked; MLLP is bound before the port-0 listeners, which could
        // otherwise take a port that was free a moment ago and given for MLLP.
        cfg.grpc.check_start()?;
        let mllp = admin::bind("MLLP", cfg.mllp_addr).await?;
        let listening = Listening::bind(&cfg.service, cfg.grpc.clone(), registry).await?;
        let mut bound = listening.bound;
        bound.mllp = Some(mllp.local_addr().unwrap_or(cfg.mllp_addr));
        tracing::info!(mllp = %mllp_addr(&bound), grpc = %bound.grpc, admin = %bound.admin, ack_mode = ?cfg.ack_mode, "ingress listening");
        Ok(App {
            cfg,
            tls,
            key_salt,
            metrics,
            producer,
            mllp,
            listening,
            bound,
        })
    }

    /// Where each listener is bound.
    fn bound(&self) -> Bound {
        self.bound
    }

    /// The key salt file is read.
    fn check(cfg: &Config) -> Result<(), IngressError> {
        cfg.read_key_salt()?;
        Ok(())
    }

    /// Serves until `stop` is cancelled, then drains within `service.drain_timeout`.
    async fn run(self, stop: CancellationToken) -> Result<(), IngressError> {
        let cfg = self.cfg;
        let producer = self.producer;
        let listening = self.listening;
        let health = listening.health.clone();
        let probe_stop = CancellationToken::new();
        tokio::spawn(probe_kafka(
            producer.clone(),
            cfg.clone(),
            health.clone(),
            probe_stop.clone(),
        ));

        let pipe = Arc::new(pipeline::Pipeline::new(
            cfg.clone(),
            producer.clone(),
            self.metrics,
            self.key_salt,
        ));
        let tracker = TaskTracker::new();
        let mllp_task = tokio::spawn(listener::serve(
            self.mllp,
            self.tls,
            pipe.clone(),
            cfg.clone(),
            stop.clone(),
            tracker.clone(),
        ));
        let grpc_server = listening
            .grpc
            .limits(hl7gw_runtime::grpc::Limits {
                max_concurrent_streams: Some(cfg.grpc_max_concurrent_streams),
                max_connections: cfg.grpc_max_connections,
                max_connections_per_address: cfg.grpc_max_connections_per_address,
            })
            .serve(grpc::service(pipe.clone(), cfg.clone()));

        stop.cancelled().await;
        grpc_server.cancel();
        let deadline = tokio::time::Instant::now() + cfg.service.drain_timeout;
        health.set_draining();
        tracing::info!("draining: listener closed, answering messages in flight");
        if let Err(e) = mllp_task.await {
            tracing::error!(error = %e, "the MLLP listener task failed");
        }
        tracker.close();
        if tokio::time::timeout_at(deadline, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("drain timeout: closing connections with messages still in flight");
        }
        let grpc_result = match tokio::time::timeout_at(deadline, grpc_server.stop()).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!("drain timeout: gRPC streams still open");
                Ok(())
            }
        };
        probe_stop.cancel();
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_millis(100));
        let p = producer.get();
        let flushed = tokio::task::spawn_blocking(move || p.flush(left)).await;
        if !matches!(flushed, Ok(Ok(()))) {
            tracing::warn!("producer flush incomplete at shutdown");
        }
        listening.admin.stop().await;
        tracing::info!("ingress stopped");
        grpc_result.map_err(IngressError::from)
    }
}

/// The MLLP address in the listening log line.
fn mllp_addr(b: &Bound) -> String {
    b.mllp.map(|a| a.to_string()).unwrap_or_default()
}

/// Creates the topics when missing and keeps readiness in step with Kafka's answers.
async fn probe_kafka(
    producer: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
    cfg: Arc<Config>,
    health: Arc<Health>,
    stop: CancellationToken,
) {
    let topics_ready = std::sync::atomic::AtomicBool::new(false);
    hl7gw_runtime::service::readiness_loop(health, stop, || async {
        // A producer broken for good is replaced here too, should no message come to notice it.
        producer.recover_if_fatal();
        let broken = producer.is_broken();
        let p = producer.get();
        let topic = cfg.inbound_topic.clone();
        // (a broker answered, the inbound topic has partitions). Until `ensure_topics` has created the topics,
        // all topics are asked for, not the inbound one by name: a producer's metadata request for a missing
        // topic has the broker create it with its own default partition count. Once they exist, only the
        // inbound topic: every topic's metadata every 2 s from every pod is heavy on a cluster with many topics
        // (it ran a small test broker holding 1,855 topics out of heap).
        let named = topics_ready
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| topic.clone());
        let (answered, ok) = tokio::task::spawn_blocking(move || {
            match p
                .client()
                .fetch_metadata(named.as_deref(), Duration::from_secs(2))
            {
                Ok(m) => (
                    true,
                    m.topics().iter().any(|t| {
                        t.name() == topic && t.error().is_none() && !t.partitions().is_empty()
                    }),
                ),
                Err(_) => (false, false),
            }
        })
        .await
        .unwrap_or((false, false));
        // Topics are created once a broker answers (an admin request to no broker only waits).
        if answered && !topics_ready.load(std::sync::atomic::Ordering::Relaxed) {
            match ensure_topics(&cfg.kafka, &[&cfg.inbound_topic, &cfg.dlq_topic]).await {
                Ok(()) => topics_ready.store(true, std::sync::atomic::Ordering::Relaxed),
                Err(e) => tracing::warn!(error = %e, "cannot create topics yet"),
            }
        }
        if broken {
            Err("kafka producer failed for good and is being recreated".to_owned())
        } else if !answered {
            Err(hl7gw_runtime::kafka::unreachable_reason())
        } else if !ok || !topics_ready.load(std::sync::atomic::Ordering::Relaxed) {
            Err(format!(
                "topics {} / {} not created yet",
                cfg.inbound_topic, cfg.dlq_topic
            ))
        } else {
            Ok(())
        }
    })
    .await;
}
