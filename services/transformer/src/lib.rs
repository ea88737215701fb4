//! hl7gw-transformer: consumes `hl7.inbound`, applies the matching `HL7Route`s and produces each destination's
//! copy to `hl7.out.<destination>` (failures to `hl7.dlq`), in Kafka transactions with the consumer offsets.
//!
//! [`App`] is a [`Service`](hl7gw_runtime::service::Service): `build` loads the routes (file or Kubernetes),
//! makes the Kafka clients and binds gRPC (the dry run) and admin HTTP; `run` starts the worker and on
//! shutdown finishes the batch in hand, commits it and leaves the consumer group.

pub mod config;
pub mod engine;
pub mod events;
pub mod grpc;
pub mod metrics;
pub mod plugin;
pub mod route;
pub mod source;
mod topics;
pub mod worker;

use config::Config;
use hl7gw_runtime::admin::Health;
use hl7gw_runtime::kafka::{
    Commit, KafkaContext, consumer_config, consumer_lag, transactional_producer_config,
};
use hl7gw_runtime::service::{Bound, Listening};
use rdkafka::consumer::Consumer;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why the transformer could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TransformerError {
    #[error(transparent)]
    Common(hl7gw_runtime::service::CommonError),
    #[error(transparent)]
    Routes(#[from] source::SourceError),
    #[error(transparent)]
    Worker(#[from] worker::WorkerError),
    /// The worker task panicked: the process exits with an error so the pod restarts (its batch was not
    /// committed and is read again).
    #[error("the worker task failed: {0}")]
    WorkerPanicked(String),
    #[error(transparent)]
    PluginTls(#[from] plugin::PluginTlsError),
    /// `--check-config`: route documents of the routes file were refused.
    #[error("{0} route(s) refused")]
    RoutesRefused(usize),
}
hl7gw_runtime::common_error_from!(TransformerError);

/// Where the routes come from: a file (and what it held at start) or the cluster's HL7Routes.
enum Routes {
    File {
        path: std::path::PathBuf,
        loaded: Option<Vec<u8>>,
    },
    Kubernetes(Box<kube::Api<route::HL7Route>>),
}

/// The transformer, its routes loaded (from a file) or their source reached, its Kafka clients made and its
/// ports bound, not yet consuming.
pub struct App {
    cfg: Arc<Config>,
    metrics: metrics::TransformerMetrics,
    live: Arc<source::LiveRoutes>,
    plugins: Arc<plugin::GrpcPlugins>,
    routes: Routes,
    make_producer: worker::ProducerFactory,
    producer: hl7gw_runtime::kafka::TransactionalProducer,
    consumer: Arc<worker::Consumer_>,
    listening: Listening,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let routes = match &self.routes {
            Routes::File { path, .. } => path.display().to_string(),
            Routes::Kubernetes(_) => "HL7Routes".to_owned(),
        };
        f.debug_struct("App")
            .field("bound", &self.listening.bound)
            .field("routes", &routes)
            .finish_non_exhaustive()
    }
}

impl hl7gw_runtime::service::Service for App {
    type Config = Config;
    type Error = TransformerError;

    /// Reads the plugin TLS files and the routes file (or reaches the API server), makes the
    /// transactional producer and the consumer, binds gRPC and the admin server.
    async fn build(cfg: Arc<Config>) -> Result<Self, TransformerError> {
        let (registry, metrics) = metrics::TransformerMetrics::registered();
        let live = Arc::new(source::LiveRoutes::default());
        // Plugin TLS files are read before any port is bound.
        let plugins = Arc::new(plugin::GrpcPlugins::new(&cfg.plugin_tls)?);

        let routes = if let Some(path) = &cfg.routes.file {
            // Missing or bad at start: not fatal; the worker consumes nothing until a route list is loaded.
            let loaded = source::load_file_at_start(path, &live, &metrics);
            Routes::File {
                path: path.clone(),
                loaded,
            }
        } else {
            let client = kube::Client::try_default()
                .await
                .map_err(source::SourceError::Kube)?;
            let ns = cfg
                .routes
                .namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_else(|| client.default_namespace().to_owned());
            tracing::info!(namespace = %ns, "watching HL7Routes");
            Routes::Kubernetes(Box::new(kube::Api::<route::HL7Route>::namespaced(
                client, &ns,
            )))
        };

        let txn_id = transactional_id(&cfg);
        let pc = transactional_producer_config(
            "hl7gw-transformer",
            &cfg.kafka,
            &txn_id,
            cfg.transaction_timeout,
        )?;
        let make_producer: worker::ProducerFactory =
            Arc::new(move || pc.create_with_context(KafkaContext));
        let producer = make_producer()?;
        let consumer: Arc<worker::Consumer_> = Arc::new(
            consumer_config(
                &cfg.group_id,
                "hl7gw-transformer",
                &cfg.kafka,
                Commit::Manual,
            )?
            .create_with_context(hl7gw_runtime::kafka::Assignment::default())?,
        );

        let listening = Listening::bind(&cfg.service, cfg.grpc.clone(), registry).await?;
        let bound = listening.bound;
        tracing::info!(grpc = %bound.grpc, admin = %bound.admin, transactional_id = %txn_id, "transformer listening");
        Ok(App {
            cfg,
            metrics,
            live,
            plugins,
            routes,
            make_producer,
            producer,
            consumer,
            listening,
        })
    }

    /// Where each listener is bound.
    fn bound(&self) -> Bound {
        self.listening.bound
    }

    /// Each route of the routes file (when routes come from one), accepted or refused and why, on stdout.
    fn check(cfg: &Config) -> Result<(), TransformerError> {
        let Some(path) = &cfg.routes.file else {
            return Ok(());
        };
        let (_r, m) = metrics::TransformerMetrics::registered();
        let verdicts = source::load_file(path, &source::LiveRoutes::default(), &m)?;
        let mut refused = 0;
        for v in verdicts {
            match v.refused {
                None => println!("route {}: accepted", v.name),
                Some(r) => {
                    refused += 1;
                    println!("route {}: refused: {r}", v.name);
                }
            }
        }
        match refused {
            0 => Ok(()),
            n => Err(TransformerError::RoutesRefused(n)),
        }
    }

    /// Watches the routes and transforms until `stop` is cancelled, then finishes the batch in hand.
    async fn run(self, stop: CancellationToken) -> Result<(), TransformerError> {
        let (cfg, metrics, live, consumer) = (self.cfg, self.metrics, self.live, self.consumer);
        let listening = self.listening;
        let health = listening.health.clone();
        let side_stop = CancellationToken::new();
        match self.routes {
            Routes::File { path, loaded } => tokio::spawn(source::watch_file(
                path,
                loaded,
                cfg.routes.reload_interval,
                live.clone(),
                metrics.clone(),
                side_stop.clone(),
            )),
            Routes::Kubernetes(api) => tokio::spawn(source::watch_kubernetes(
                *api,
                live.clone(),
                cfg.routes.reload_interval,
                metrics.clone(),
                side_stop.clone(),
            )),
        };

        // Topics first (inbound, DLQ, every destination's); the worker subscribes once the routes are loaded.
        topics::ensure_destinations(&cfg, &live, &mut BTreeSet::new()).await;
        let worker_health = Arc::new(worker::WorkerHealth::default());
        tokio::spawn(housekeeping(
            cfg.clone(),
            consumer.clone(),
            live.clone(),
            health.clone(),
            worker_health.clone(),
            metrics.clone(),
            side_stop.clone(),
        ));

        let grpc_server = listening.grpc.serve(grpc::DryRun::server(
            cfg.clone(),
            live.clone(),
            self.plugins.clone(),
        ));

        let worker_stop = CancellationToken::new();
        let mut worker_task = tokio::spawn(
            worker::Worker {
                cfg: cfg.clone(),
                consumer: consumer.clone(),
                producer: self.producer,
                make_producer: self.make_producer,
                live: live.clone(),
                plugins: self.plugins,
                metrics,
                readiness: health.clone(),
                health: worker_health,
            }
            .run(worker_stop.clone()),
        );

        let result = tokio::select! {
            _ = stop.cancelled() => {
                health.set_draining();
                tracing::info!("draining: finishing the batch in hand");
                worker_stop.cancel();
                match tokio::time::timeout(cfg.service.drain_timeout, &mut worker_task).await {
                    Ok(Ok(r)) => r.map_err(TransformerError::from),
                    Ok(Err(e)) => Err(TransformerError::WorkerPanicked(e.to_string())),
                    Err(_) => {
                        tracing::warn!("drain timeout: the open batch will be read again by another pod");
                        Ok(())
                    }
                }
            }
            r = &mut worker_task => {
                tracing::error!("the worker stopped");
                match r {
                    Ok(r) => r.map_err(TransformerError::from),
                    Err(e) => Err(TransformerError::WorkerPanicked(e.to_string())),
                }
            }
        };
        health.set_draining();
        side_stop.cancel();
        let grpc_result = grpc_server.stop().await;
        let c = consumer.clone();
        let _ = tokio::task::spawn_blocking(move || c.unsubscribe()).await;
        drop(consumer);
        listening.admin.stop().await;
        tracing::info!("transformer stopped");
        result.and(grpc_result.map_err(TransformerError::from))
    }
}

/// The producer's `transactional.id`: the configured one, else `hl7gw-transformer-<POD_NAME or HOSTNAME>` (stable
/// across restarts of a StatefulSet pod or a Deployment pod's container). With neither, an id unique to this
/// process: two instances never share (and fence each other with) one, but a restarted process does not fence
/// its predecessor's open transaction (it is aborted by the broker after `transaction_timeout`), so
/// exactly-once across restarts needs POD_NAME (or `transactional_id`).
fn transactional_id(cfg: &Config) -> String {
    if let Some(id) = &cfg.transactional_id {
        return id.clone();
    }
    let stable = ["POD_NAME", "HOSTNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.trim().is_empty());
    match stable {
        Some(pod) => format!("hl7gw-transformer-{pod}"),
        None => {
            let id = format!(
                "hl7gw-transformer-local-{}",
                hl7gw_runtime::envelope::new_id()
            );
            tracing::warn!(
                transactional_id = %id,
                "neither POD_NAME nor HOSTNAME is set: this process has a transactional.id of its own; \
                 exactly-once across restarts needs POD_NAME (or transactional_id)"
            );
            id
        }
    }
}

/// Readiness (Kafka answers, routes are loaded, the worker is not recovering), new destination topics,
/// consumer lag.
async fn housekeeping(
    cfg: Arc<Config>,
    consumer: Arc<worker::Consumer_>,
    live: Arc<source::LiveRoutes>,
    health: Arc<Health>,
    worker_health: Arc<worker::WorkerHealth>,
    metrics: metrics::TransformerMetrics,
    stop: CancellationToken,
) {
    let known = tokio::sync::Mutex::new(BTreeSet::new());
    hl7gw_runtime::service::readiness_loop(health, stop, || async {
        let mut known = known.lock().await;
        let topics_ok = topics::ensure_destinations(&cfg, &live, &mut known).await;
        // Kafka answers: every topic's metadata until the inbound topic is created, then the inbound topic's
        // alone (every topic's every 2 s from every pod is heavy on a cluster with many topics).
        let named = known
            .contains(&cfg.inbound_topic)
            .then(|| cfg.inbound_topic.clone());
        drop(known);
        let (c, topic) = (consumer.clone(), named.clone());
        let (kafka_ok, lag) = tokio::task::spawn_blocking(move || {
            let ok = hl7gw_runtime::kafka::metadata_ok(
                c.fetch_metadata(topic.as_deref(), Duration::from_secs(2)),
                topic.as_deref(),
            );
            let lag = consumer_lag(c.as_ref(), Duration::from_secs(2)).ok();
            (ok, lag)
        })
        .await
        .unwrap_or((None, None));
        if let Some(lag) = lag {
            metrics.consumer_lag.set(lag);
        }
        if let Some(reason) = hl7gw_runtime::kafka::metadata_failure(kafka_ok, named.as_deref()) {
            Err(reason)
        } else if !live.is_loaded() {
            Err("routes not loaded".to_owned())
        } else if let Some(reason) = worker::abandoned_reason(metrics.abandoned_calls.get()) {
            Err(reason)
        } else if let Some(reason) = worker_health.failure(consumer.context().generation()) {
            Err(reason)
        } else if !topics_ok {
            Err("destination topics not created yet".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
}
