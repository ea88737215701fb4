//! The operators' side of the gRPC admin API: `hl7gw deadletters`, `hl7gw replay`, `hl7gw dry-run`, over TLS or
//! mutual TLS, with a bearer token (a static token or a Kubernetes ServiceAccount token).

use anyhow::{Context, bail};
use hl7gw_runtime::proto::v1::egress_client::EgressClient;
use hl7gw_runtime::proto::v1::transform_client::TransformClient;
use hl7gw_runtime::proto::v1::{ListDeadLettersRequest, ReplayRequest, TransformRequest};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How to reach a service's gRPC listener.
#[derive(Debug, clap::Args)]
pub struct Conn {
    /// gRPC address: `https://host:50051` (TLS) or `http://host:50051` (plaintext)
    #[arg(long, value_name = "URL")]
    to: String,
    /// PEM CA the server's certificate must chain to (https; default: the public CAs built in)
    #[arg(long, value_name = "PEM")]
    ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS
    #[arg(long, value_name = "PEM", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM private key of --cert
    #[arg(long, value_name = "PEM", requires = "cert")]
    key: Option<PathBuf>,
    /// Name the server certificate is checked against (default: the host of --to)
    #[arg(long, value_name = "NAME")]
    server_name: Option<String>,
    /// File holding the bearer token (a static token, or `kubectl create token <sa> --audience hl7gw`); also
    /// HL7GW_TOKEN_FILE. The token itself is never taken from the command line (shell history, ps).
    #[arg(long, value_name = "FILE", env = "HL7GW_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Seconds to wait for the connection and for the answer
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    timeout: u64,
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Authed = InterceptedService<Channel, Bearer>;

impl Conn {
    pub(crate) async fn channel(&self) -> anyhow::Result<(Authed, Duration)> {
        let timeout = Duration::from_secs(self.timeout);
        let mut ep = Endpoint::from_shared(self.to.clone())
            .with_context(|| format!("--to {}", self.to))?
            .connect_timeout(timeout)
            .timeout(timeout);
        let https = self.to.to_ascii_lowercase().starts_with("https://");
        if !https && self.token_file.is_some() {
            bail!("refusing to send a token over plaintext: use an https:// address");
        }
        if https {
            let mut tls = ClientTlsConfig::new();
            tls = match &self.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(crate::read(ca)?)),
                None => tls.with_webpki_roots(),
            };
            if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                tls = tls.identity(Identity::from_pem(crate::read(cert)?, crate::read(key)?));
            }
            if let Some(name) = &self.server_name {
                tls = tls.domain_name(name.clone());
            }
            ep = ep.tls_config(tls).context("TLS settings")?;
        } else if self.ca.is_some() || self.cert.is_some() {
            bail!("--ca/--cert need an https:// address");
        }
        let token = match &self.token_file {
            Some(f) => {
                let t = String::from_utf8(crate::read(f)?).context("the token file is not text")?;
                let v = format!("Bearer {}", t.trim()).parse().map_err(|_| {
                    anyhow::anyhow!("the token file holds characters a header cannot")
                })?;
                Some(v)
            }
            None => None,
        };
        let ch = ep
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.to))?;
        Ok((InterceptedService::new(ch, Bearer(token)), timeout))
    }
}

pub(crate) fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

fn timestamp(s: &Option<String>) -> anyhow::Result<Option<prost_types::Timestamp>> {
    s.as_deref()
        .map(|t| {
            humantime::parse_rfc3339_weak(t)
                .map(prost_types::Timestamp::from)
                .with_context(|| format!("{t:?} is not a time like 2026-11-23T10:00:00Z"))
        })
        .transpose()
}

fn rfc3339(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| std::time::SystemTime::try_from(*t).ok())
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_default()
}

/// Which dead letters: of a destination, of a stage, within a time range.
#[derive(Debug, clap::Args)]
pub struct Selection {
    /// Of this destination
    #[arg(long)]
    destination: Option<String>,
    /// Of this stage: egress or transformer
    #[arg(long)]
    stage: Option<String>,
    /// From this time (RFC 3339)
    #[arg(long)]
    since: Option<String>,
    /// Until this time (RFC 3339)
    #[arg(long)]
    until: Option<String>,
}

/// `hl7gw deadletters`: list dead letters of the egress.
#[derive(Debug, clap::Args)]
pub struct DeadLettersArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(flatten)]
    select: Selection,
    /// At most this many (0: the server's page size)
    #[arg(long, default_value_t = 0)]
    limit: u32,
    /// Also print each message (patient data: only where you may see it)
    #[arg(long)]
    with_message: bool,
}

/// `hl7gw replay`: send dead letters back.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    conn: Conn,
    /// Envelope ids to replay (from `hl7gw deadletters`); or everything the selection matches
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    select: Selection,
}

/// `hl7gw dry-run`: what the transformer's live routes would do with a message.
#[derive(Debug, clap::Args)]
pub struct DryRunArgs {
    #[command(flatten)]
    conn: Conn,
    /// Message file (ER7)
    file: PathBuf,
    /// Only this route
    #[arg(long)]
    route: Option<String>,
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// Prints one JSON line per dead letter (no message unless `--with-message`).
pub fn deadletters(a: DeadLettersArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let r = EgressClient::new(ch)
            .list_dead_letters(ListDeadLettersRequest {
                destination: a.select.destination.unwrap_or_default(),
                stage: a.select.stage.unwrap_or_default(),
                since: timestamp(&a.select.since)?,
                until: timestamp(&a.select.until)?,
                limit: a.limit,
                include_envelope: a.with_message,
            })
            .await
            .map_err(status_error)?
            .into_inner();
        for d in &r.dead_letters {
            let mut line = json!({
                "id": d.id,
                "at": rfc3339(d.at.as_ref()),
                "stage": d.stage,
                "destination": d.destination,
                "reason": d.reason,
                "ack_code": d.ack_code,
                "attempts": d.attempts,
                "message_type": d.message_type,
                "control_id": d.control_id,
            });
            if let Some(env) = &d.envelope {
                line["message"] = json!(String::from_utf8_lossy(&env.raw));
            }
            println!("{line}");
        }
        eprintln!(
            "hl7gw deadletters: {} dead letter(s){}",
            r.dead_letters.len(),
            if r.truncated {
                "; more match: ask again with --since the last one's time"
            } else {
                ""
            }
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// Replays and prints the ids sent back.
pub fn replay(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    if a.ids.is_empty() && a.select.destination.is_none() && a.select.stage.is_none() {
        bail!("name --id, or --destination or --stage (with --since/--until)");
    }
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let r = EgressClient::new(ch)
            .replay(ReplayRequest {
                ids: a.ids,
                destination: a.select.destination.unwrap_or_default(),
                stage: a.select.stage.unwrap_or_default(),
                since: timestamp(&a.select.since)?,
                until: timestamp(&a.select.until)?,
            })
            .await
            .map_err(status_error)?
            .into_inner();
        for id in &r.ids {
            println!("{id}");
        }
        eprintln!(
            "hl7gw replay: {} replayed{}",
            r.replayed,
            if r.truncated {
                "; more match: run it again"
            } else {
                ""
            }
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// Prints one JSON line per output and per route that did not match.
pub fn dry_run(a: DryRunArgs) -> anyhow::Result<ExitCode> {
    let message = crate::read(&a.file)?;
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let r = TransformClient::new(ch)
            .transform(TransformRequest {
                message: message.into(),
                route: a.route.unwrap_or_default(),
                ..TransformRequest::default()
            })
            .await
            .map_err(status_error)?
            .into_inner();
        for o in &r.outputs {
            println!(
                "{}",
                json!({
                    "route": o.route,
                    "destination": o.destination,
                    "topic": o.topic,
                    "content_type": o.content_type,
                    "error": o.error,
                    "message": String::from_utf8_lossy(&o.message),
                })
            );
        }
        for m in &r.misses {
            println!("{}", json!({"route": m.route, "no_match": m.reason}));
        }
        Ok(ExitCode::SUCCESS)
    })
}
