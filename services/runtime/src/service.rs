//! What every service has around its own work: the addresses it prints once bound, the admin server, the
//! readiness loop, `--check-config`'s shared checks and the end of its gRPC task. Each service's `run` wires
//! these and keeps only what it alone does.

use crate::admin::{BindError, Health};
use crate::grpc::{GrpcError, GrpcServeError, GrpcSettings};
use crate::kafka::{ClientConfigError, KafkaSettings};
use crate::metrics::Registry;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The addresses a service listens on (the ones the OS gave where the config asked for port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The ingress's MLLP listener; the workers have none.
    pub mllp: Option<SocketAddr>,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
}

impl Bound {
    /// The one stdout line a service prints once bound, which tests and scripts wait for:
    /// `<service> listening [mllp=ADDR] grpc=ADDR admin=ADDR`.
    pub fn listening_line(&self, service: &str) -> String {
        let mllp = self.mllp.map(|a| format!(" mllp={a}")).unwrap_or_default();
        format!(
            "{service} listening{mllp} grpc={} admin={}",
            self.grpc, self.admin
        )
    }

    /// Prints [`Bound::listening_line`] to stdout.
    pub fn print(&self, service: &str) {
        crate::shutdown::print_listening(format_args!("{}", self.listening_line(service)));
    }
}

/// A service as its binary runs it: built from its validated config (clients made, ports bound), then run
/// until the token is cancelled. [`main`] is every service binary's `main` over it; tests start one in-process
/// the same way (`hl7gw_testkit::InProcess::service`).
pub trait Service: Sized + Send + 'static {
    type Config: ServiceConfig;
    type Error: std::error::Error + Send + Sync + 'static;
    /// Makes the clients and binds every port; serves nothing yet. `cfg` has passed
    /// [`ServiceConfig::validate`].
    fn build(cfg: Arc<Self::Config>) -> impl Future<Output = Result<Self, Self::Error>> + Send;
    /// The addresses bound.
    fn bound(&self) -> Bound;
    /// Serves until `stop` is cancelled, then drains; errors from every task are returned.
    fn run(self, stop: CancellationToken) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `--check-config`'s checks of what only this service has (secret files, route files), before the
    /// shared ones.
    fn check(_cfg: &Self::Config) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// What the scaffold reads of a service's config: its validation and the sections every service has.
/// [`service_config`](crate::service_config) implements it for a config with `service`, `kafka` and `grpc`
/// fields and a `validate` method.
pub trait ServiceConfig:
    serde::de::DeserializeOwned
    + serde::Serialize
    + schemars::JsonSchema
    + Default
    + Send
    + Sync
    + 'static
{
    fn validate(&self) -> Result<(), crate::config::ConfigError>;
    fn service(&self) -> &crate::config::ServiceSettings;
    fn kafka(&self) -> &KafkaSettings;
    fn grpc(&self) -> &GrpcSettings;
}

/// Implements [`ServiceConfig`] for a service's `Config`.
#[macro_export]
macro_rules! service_config {
    ($t:ty) => {
        impl $crate::service::ServiceConfig for $t {
            fn validate(&self) -> Result<(), $crate::config::ConfigError> {
                <$t>::validate(self)
            }
            fn service(&self) -> &$crate::config::ServiceSettings {
                &self.service
            }
            fn kafka(&self) -> &$crate::kafka::KafkaSettings {
                &self.kafka
            }
            fn grpc(&self) -> &$crate::grpc::GrpcSettings {
                &self.grpc
            }
        }
    };
}

/// Why a service binary stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum MainError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Check(#[from] CheckError),
    #[error(transparent)]
    Run(#[from] crate::shutdown::RunError<E>),
}

/// The service binary `name`'s `main` once its flags are parsed: the config from the defaults, the file,
/// `HL7GW_` variables and `flags` (each over the one before), validated (`--print-schema` prints the schema
/// instead, `--print-config` the result, secrets masked, before validating it); with `--check-config`
/// [`Service::check`] and the shared checks (which print their warnings), then `configuration is valid`;
/// otherwise telemetry named `name`, [`Service::build`], the listening line and [`Service::run`] until SIGTERM
/// or SIGINT.
pub fn main<S: Service, F: clap::Args + serde::Serialize>(
    name: &'static str,
    flags: &crate::config::Flags<F>,
) -> Result<(), MainError<S::Error>> {
    let common = &flags.common;
    if common.print_schema {
        print!("{}", crate::config::reference::schema_json::<S::Config>());
        return Ok(());
    }
    let cfg: S::Config = crate::config::load(common.config.as_deref(), flags)?;
    if common.print_config {
        print!("{}", crate::config::masked_yaml(&cfg)?);
    }
    cfg.validate()?;
    if common.print_config {
        return Ok(());
    }
    if common.check_config {
        S::check(&cfg).map_err(crate::shutdown::RunError::Service)?;
        check_config(cfg.kafka(), cfg.grpc())?;
        println!("configuration is valid");
        return Ok(());
    }
    let log_json = cfg.service().log_json;
    crate::shutdown::block_on(name, log_json, |stop| async move {
        let app = S::build(Arc::new(cfg)).await?;
        app.bound().print(name);
        app.run(stop).await
    })?;
    Ok(())
}

/// A service binary's whole `main`: its flags (the shared ones and `F`), then [`main`], and the exit code.
pub fn binary<S: Service, F: clap::Args + serde::Serialize>(
    name: &'static str,
    about: &'static str,
) -> std::process::ExitCode {
    let flags = crate::config::Flags::<F>::parse_as(name, about);
    crate::exit(main::<S, F>(name, &flags))
}

/// The admin HTTP server (`/healthz`, `/readyz`, `/metrics`), serving until [`AdminServer::stop`], which a
/// service calls last so that probes and scrapes see the whole drain.
#[derive(Debug)]
pub struct AdminServer {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl AdminServer {
    /// Binds `addr` and serves `health` and `registry`.
    pub async fn start(
        addr: SocketAddr,
        health: Arc<Health>,
        registry: Registry,
    ) -> Result<Self, BindError> {
        let stop = CancellationToken::new();
        let (addr, task) =
            crate::admin::serve(addr, health, Arc::new(registry), stop.clone()).await?;
        Ok(Self { addr, stop, task })
    }

    /// Stops serving and waits for the server to close.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// What every service binds from its `service:` section: the gRPC listener (served once the service has
/// built its gRPC service), the admin server (serving at once: `/readyz` answers "not ready" until the
/// readiness loop says otherwise), and the health both report.
#[derive(Debug)]
pub struct Listening {
    pub grpc: GrpcListener,
    pub admin: AdminServer,
    pub health: Arc<Health>,
    pub bound: Bound,
}

impl Listening {
    /// Reads the gRPC TLS files and tokens (a bad certificate stops the service before it binds anything),
    /// binds `service.grpc_addr` (to be served with `grpc`'s TLS and callers) and starts the admin server on
    /// `service.admin_addr` with `registry`.
    pub async fn bind(
        service: &crate::config::ServiceSettings,
        grpc: GrpcSettings,
        registry: Registry,
    ) -> Result<Self, CommonError> {
        grpc.check_start()?;
        let listener = crate::admin::bind("gRPC", service.grpc_addr).await?;
        let mut registry = registry;
        let metrics = crate::grpc::GrpcMetrics::register(&mut registry);
        crate::loglimit::register(&mut registry);
        let health = Arc::new(Health::default());
        let admin = AdminServer::start(service.admin_addr, health.clone(), registry).await?;
        let bound = Bound {
            mllp: None,
            grpc: listener.local_addr().unwrap_or(service.grpc_addr),
            admin: admin.addr,
        };
        let grpc = GrpcListener {
            listener,
            settings: grpc,
            limits: crate::grpc::Limits::default(),
            metrics,
            health: health.clone(),
        };
        Ok(Self {
            grpc,
            admin,
            health,
            bound,
        })
    }
}

/// A bound gRPC listener, not yet serving.
#[derive(Debug)]
pub struct GrpcListener {
    listener: tokio::net::TcpListener,
    settings: GrpcSettings,
    limits: crate::grpc::Limits,
    metrics: crate::grpc::GrpcMetrics,
    health: Arc<Health>,
}

impl GrpcListener {
    /// Serves with `limits` instead of the defaults.
    pub fn limits(mut self, limits: crate::grpc::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Serves one generated tonic service the way every hl7gw gRPC listener does: TLS and callers per the
    /// `grpc:` settings, the gRPC health service under the service's name (serving while ready),
    /// reflection, the limits.
    pub fn serve<S>(self, svc: S) -> GrpcServer
    where
        S: tonic::codegen::Service<
                axum::http::Request<tonic::body::Body>,
                Error = std::convert::Infallible,
            > + tonic::server::NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Response: axum::response::IntoResponse,
        S::Future: Send + 'static,
    {
        let Self {
            listener,
            settings,
            limits,
            metrics,
            health,
        } = self;
        GrpcServer::spawn(move |stop| async move {
            let routes =
                tonic::service::Routes::new(crate::grpc::health(health, S::NAME, stop.clone()))
                    .add_service(svc);
            crate::grpc::serve(routes, listener, &settings, limits, metrics, stop).await
        })
    }
}

/// Probes a service's dependencies every 2 s (every second while not ready) until `stop`, recording each
/// verdict in `health` and logging each change (`ready`, `not ready` with the reason).
pub async fn readiness_loop<F, Fut>(health: Arc<Health>, stop: CancellationToken, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    loop {
        let status = probe().await;
        let ok = status.is_ok();
        if ok != health.is_ready() && !health.is_draining() {
            match &status {
                Ok(()) => tracing::info!("ready"),
                Err(reason) => tracing::warn!(reason = %reason, "not ready"),
            }
        }
        health.set_dependency(status);
        let period = Duration::from_secs(if ok { 2 } else { 1 });
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// The rules every service's config shares: the Kafka settings sound (brokers set), the gRPC settings sound
/// for the service's `grpc_methods`.
pub fn validate_common(
    kafka: &KafkaSettings,
    grpc: &GrpcSettings,
    grpc_methods: &[&str],
) -> Result<(), crate::config::ConfigError> {
    grpc.validate(grpc_methods)
        .map_err(|e| crate::config::ConfigError::Rule(e.to_string()))?;
    kafka.validate()
}

/// Why `--check-config` refused a configuration.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Grpc(#[from] GrpcError),
    #[error(transparent)]
    Kafka(#[from] ClientConfigError),
}

/// `--check-config`'s checks every service shares: the gRPC TLS files are read and every Kafka client role's
/// settings are built (secret files read, nothing connected). Prints the warnings of both to stderr.
pub fn check_config(kafka: &KafkaSettings, grpc: &GrpcSettings) -> Result<(), CheckError> {
    grpc.check_files()?;
    let kafka = crate::kafka::check_config(kafka)?;
    for w in kafka.iter().chain(&grpc.warnings()) {
        eprintln!("warning: {w}");
    }
    Ok(())
}

/// What can stop any service from starting or end it with an error: the causes every service shares. Each
/// service's error type wraps it as `Common` (see [`common_error_from`](crate::common_error_from)) and adds
/// what is its own.
#[derive(Debug, thiserror::Error)]
pub enum CommonError {
    #[error(transparent)]
    Grpc(#[from] GrpcError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    KafkaConfig(#[from] ClientConfigError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Task(#[from] TaskError),
}

/// Implements `From` for each of [`CommonError`]'s causes on a service's error type that has a
/// `Common(CommonError)` variant, so that `?` works on them in the service's code.
#[macro_export]
macro_rules! common_error_from {
    ($t:ty) => {
        $crate::common_error_from!(@one $t, $crate::grpc::GrpcError);
        $crate::common_error_from!(@one $t, $crate::config::ConfigError);
        $crate::common_error_from!(@one $t, rdkafka::error::KafkaError);
        $crate::common_error_from!(@one $t, $crate::kafka::ClientConfigError);
        $crate::common_error_from!(@one $t, $crate::admin::BindError);
        $crate::common_error_from!(@one $t, $crate::service::TaskError);
        impl From<$crate::service::CommonError> for $t {
            fn from(e: $crate::service::CommonError) -> Self {
                Self::Common(e)
            }
        }
    };
    (@one $t:ty, $source:ty) => {
        impl From<$source> for $t {
            fn from(e: $source) -> Self {
                Self::Common(e.into())
            }
        }
    };
}

/// How a service's gRPC task ended, when it did not end well.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Grpc(#[from] GrpcServeError),
    #[error("the gRPC server task failed: {0}")]
    Panicked(String),
}

/// A service's gRPC server task and the token that stops it.
#[derive(Debug)]
pub struct GrpcServer {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), GrpcServeError>>,
}

impl GrpcServer {
    /// Spawns `serve`, handing it the token that [`GrpcServer::cancel`] and [`GrpcServer::stop`] cancel.
    fn spawn<Fut>(serve: impl FnOnce(CancellationToken) -> Fut) -> Self
    where
        Fut: Future<Output = Result<(), GrpcServeError>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(stop.clone()));
        Self { stop, task }
    }

    /// Stops taking new calls and connections; calls in progress go on.
    pub fn cancel(&self) {
        self.stop.cancel();
    }

    /// Cancels and waits for the server to end; its error, if any, is logged and returned (the service has
    /// drained by then: an error here changes only the exit status).
    pub async fn stop(self) -> Result<(), TaskError> {
        self.stop.cancel();
        let result = match self.task.await {
            Ok(r) => r.map_err(TaskError::from),
            Err(e) => Err(TaskError::Panicked(e.to_string())),
        };
        if let Err(e) = &result {
            tracing::error!(error = %e, "the gRPC server stopped with an error");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_names_every_address() {
        let b = Bound {
            mllp: Some(([127, 0, 0, 1], 2575).into()),
            grpc: ([127, 0, 0, 1], 50051).into(),
            admin: ([127, 0, 0, 1], 9464).into(),
        };
        assert_eq!(
            b.listening_line("hl7gw-ingress"),
            "hl7gw-ingress listening mllp=127.0.0.1:2575 grpc=127.0.0.1:50051 admin=127.0.0.1:9464"
        );
        let w = Bound { mllp: None, ..b };
        assert_eq!(
            w.listening_line("hl7gw-egress"),
            "hl7gw-egress listening grpc=127.0.0.1:50051 admin=127.0.0.1:9464"
        );
    }

    #[tokio::test]
    async fn the_readiness_loop_records_each_verdict() {
        let health = Arc::new(Health::default());
        let stop = CancellationToken::new();
        let verdicts = std::sync::Mutex::new(vec![Ok(()), Err("kafka down".to_owned())]);
        let task = tokio::spawn(readiness_loop(health.clone(), stop.clone(), move || {
            let next = verdicts.lock().unwrap().pop().unwrap_or(Ok(()));
            async move { next }
        }));
        // The first verdict (not ready), then, a second later, the next (ready).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while health.reason() != "kafka down" {
            assert!(tokio::time::Instant::now() < deadline, "no first verdict");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!health.is_ready());
        while !health.is_ready() {
            assert!(tokio::time::Instant::now() < deadline, "no second verdict");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        task.await.unwrap();
    }
}
