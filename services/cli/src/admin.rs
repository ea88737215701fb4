//! The operators' side of the gRPC admin API: `hl7gw deadletters`, `hl7gw replay`, `hl7gw dry-run`, over TLS or
//! mutual TLS, with a bearer token (a static token or a Kubernetes ServiceAccount token).

use anyhow::{Context, bail};
use hl7gw_proto::v1::egress_client::EgressClient;
use hl7gw_proto::v1::transform_client::TransformClient;
use hl7gw_proto::v1::{ListDeadLettersRequest, ReplayRequest, TransformRequest};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How to reach a service's gRPC listener.
#[derive(Debug, clap::Args)]
pub struct Conn {
    /// gRPC address: `https://host:50051` (TLS) or `http://host:50051` (plaintext). Over plaintext a token
    /// is sent only to a loopback address (127.0.0.1, ::1, localhost): what `kubectl port-forward` gives, e.g.
    /// `kubectl port-forward svc/hl7gw-egress 50051` then `--to http://127.0.0.1:50051 --token-file ops.token`
    #[arg(long, value_name = "URL", verbatim_doc_comment)]
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
    /// HL7GW_TOKEN_FILE. The token itself is never taken from the command line (shell history, ps). Sent over
    /// https, or over plaintext to a loopback address only (a `kubectl port-forward`); refused for any other
    /// plaintext address.
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
        if !https && self.token_file.is_some() && !is_loopback(ep.uri()) {
            bail!(
                "refusing to send a token over plaintext to another machine: use an https:// address, or \
                 `kubectl port-forward` and http://127.0.0.1:<port>"
            );
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

/// Whether `uri` names this machine ([`hl7gw_tls::is_loopback_host`]), where a token sent over plaintext does
/// not cross the network (a `kubectl port-forward` listens there).
fn is_loopback(uri: &tonic::codegen::http::Uri) -> bool {
    uri.host().is_some_and(hl7gw_tls::is_loopback_host)
}

pub(crate) fn status_error(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

/// A time as operators write it: RFC 3339 (`2026-11-23T10:00:00Z`), a time ago (`1h`, `30m`, `2d 4h`), or `now`.
pub(crate) fn parse_time(
    t: &str,
    now: std::time::SystemTime,
) -> anyhow::Result<std::time::SystemTime> {
    let t = t.trim();
    if t == "now" {
        return Ok(now);
    }
    if let Ok(ago) = humantime::parse_duration(t.trim_end_matches(" ago")) {
        return now
            .checked_sub(ago)
            .with_context(|| format!("{t:?} is too long ago"));
    }
    humantime::parse_rfc3339_weak(t).with_context(|| {
        format!("{t:?} is not a time like 2026-11-23T10:00:00Z, nor a time ago like 1h or 30m")
    })
}

pub(crate) fn timestamp(s: &Option<String>) -> anyhow::Result<Option<prost_types::Timestamp>> {
    let now = std::time::SystemTime::now();
    s.as_deref()
        .map(|t| parse_time(t, now).map(prost_types::Timestamp::from))
        .transpose()
}

pub(crate) fn rfc3339(t: Option<&prost_types::Timestamp>) -> String {
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
    /// Of this stage: egress (a receiver refused it or it could not be delivered) or transformer (no route
    /// took it, or a route failed). The ingress's rejects are not dead letters here: their senders were NAKed
    /// and resend (docs/runbook.md)
    #[arg(long)]
    stage: Option<String>,
    /// Of this reason (e.g. rejected, gave_up, unmatched)
    #[arg(long)]
    reason: Option<String>,
    /// From this time: RFC 3339, or a time ago (1h, 30m, 2d)
    #[arg(long)]
    since: Option<String>,
    /// Until this time: RFC 3339, or a time ago
    #[arg(long)]
    until: Option<String>,
    /// Go on where an earlier page stopped (the cursor it printed); --since is then not used
    #[arg(long)]
    cursor: Option<String>,
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
    /// Also print each message (patient data). Needs the ReadMessages permission on top of ListDeadLetters:
    /// `grpc.allow` ReadMessages, or RBAC `get messages.hl7gw.io` (the chart's operator role, not the viewer)
    #[arg(long)]
    with_message: bool,
    /// Every page, not only the first (each page asked with the previous one's cursor)
    #[arg(long)]
    all: bool,
}

/// `hl7gw replay`: send dead letters back, each whole (a letter whose message was dropped to fit Kafka's record
/// limit is sent with the message re-read from the topic it came from); a letter that cannot be is refused,
/// named with why and where its original was, and the command exits 1.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    conn: Conn,
    /// Envelope ids to replay (from `hl7gw deadletters`); or everything the selection matches
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    select: Selection,
    /// List what would be replayed (one JSON line each); replay nothing
    #[arg(long)]
    dry_run: bool,
    /// Also replay letters that were replayed before (without it they are skipped)
    #[arg(long)]
    force: bool,
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

fn dead_letter_line(d: &hl7gw_proto::v1::DeadLetter) -> serde_json::Value {
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
        "dlq": format!("{}/{}", d.partition, d.offset),
    });
    if d.http_status != 0 {
        line["http_status"] = json!(d.http_status);
    }
    if !d.replayed_by.is_empty() {
        line["replayed_by"] = json!(d.replayed_by);
        line["replayed_at"] = json!(rfc3339(d.replayed_at.as_ref()));
    }
    line
}

/// Prints one JSON line per dead letter (no message unless `--with-message`), page after page with `--all`;
/// the last page's cursor goes to stderr.
pub fn deadletters(a: DeadLettersArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let mut client = EgressClient::new(ch);
        let mut cursor = a.select.cursor.clone().unwrap_or_default();
        let mut total = 0usize;
        loop {
            let r = client
                .list_dead_letters(ListDeadLettersRequest {
                    destination: a.select.destination.clone().unwrap_or_default(),
                    stage: a.select.stage.clone().unwrap_or_default(),
                    reason: a.select.reason.clone().unwrap_or_default(),
                    since: timestamp(&a.select.since)?,
                    until: timestamp(&a.select.until)?,
                    limit: a.limit,
                    include_envelope: a.with_message,
                    cursor: cursor.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            for d in &r.dead_letters {
                let mut line = dead_letter_line(d);
                if let Some(env) = &d.envelope {
                    line["message"] = json!(String::from_utf8_lossy(&env.raw));
                }
                println!("{line}");
            }
            total += r.dead_letters.len();
            let stuck = r.next_cursor == cursor;
            cursor = r.next_cursor;
            if !(r.truncated && a.all) || stuck {
                eprintln!(
                    "hl7gw deadletters: {total} dead letter(s){}",
                    if r.truncated {
                        format!("; more match: continue with --cursor {cursor}")
                    } else {
                        format!("; next time, --cursor {cursor} lists only newer ones")
                    }
                );
                return Ok(ExitCode::SUCCESS);
            }
        }
    })
}

/// Replays what the selection matches, page after page (each page one Kafka transaction: a cut run can be run
/// again, letters already replayed are skipped unless `--force`), printing the ids sent back; with
/// `--dry-run`, the letters that would be, one JSON line each.
pub fn replay(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    if a.ids.is_empty() && a.select.destination.is_none() && a.select.stage.is_none() {
        bail!("name --id, or --destination or --stage (with --since/--until, --reason)");
    }
    runtime()?.block_on(async {
        let (ch, _) = a.conn.channel().await?;
        let mut client = EgressClient::new(ch);
        let mut cursor = a.select.cursor.clone().unwrap_or_default();
        let (mut replayed, mut skipped, mut refused) = (0u64, 0u64, 0u64);
        loop {
            let r = client
                .replay(ReplayRequest {
                    ids: a.ids.clone(),
                    destination: a.select.destination.clone().unwrap_or_default(),
                    stage: a.select.stage.clone().unwrap_or_default(),
                    reason: a.select.reason.clone().unwrap_or_default(),
                    since: timestamp(&a.select.since)?,
                    until: timestamp(&a.select.until)?,
                    cursor: cursor.clone(),
                    dry_run: a.dry_run,
                    force: a.force,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if a.dry_run {
                for d in &r.letters {
                    println!("{}", dead_letter_line(d));
                }
            } else {
                for id in &r.ids {
                    println!("{id}");
                }
            }
            // Never sent without its message: why, and where the original was read.
            for f in &r.refused {
                eprintln!(
                    "hl7gw replay: not replayed {} (control id {}): {}; the original was read at {}",
                    f.id,
                    f.control_id,
                    f.why,
                    if f.origin.is_empty() {
                        "an unrecorded place"
                    } else {
                        f.origin.as_str()
                    }
                );
            }
            replayed += u64::from(r.replayed);
            skipped += u64::from(r.skipped);
            refused += r.refused.len() as u64;
            // A page that moved nothing ends it (the server's cursor did not advance).
            let stuck = r.next_cursor == cursor;
            cursor = r.next_cursor;
            if !r.truncated || stuck {
                break;
            }
        }
        eprintln!(
            "hl7gw replay: {replayed} {}{}",
            if a.dry_run {
                "would be replayed"
            } else {
                "replayed"
            },
            if skipped > 0 {
                format!("; {skipped} skipped: replayed before (--force sends them again)")
            } else {
                String::new()
            }
        );
        if refused > 0 {
            eprintln!(
                "hl7gw replay: {refused} refused: their message is neither in the dead letter nor still in the topic it was read from"
            );
            return Ok(ExitCode::FAILURE);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36, item 7: a token goes over plaintext to a loopback address (what `kubectl port-forward`
    /// gives), never to any other plaintext address.
    #[test]
    fn a_token_goes_over_plaintext_to_loopback_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "ops-token-0123456789abcdef\n").expect("write");
        let rt = runtime().expect("runtime");
        let refused = |to: &str| {
            let conn = Conn {
                to: to.to_owned(),
                ca: None,
                cert: None,
                key: None,
                server_name: None,
                token_file: Some(token.clone()),
                timeout: 2,
            };
            // Nothing listens on port 1: a loopback address gets as far as connecting, and fails there.
            match rt.block_on(conn.channel()) {
                Ok(_) => false,
                Err(e) => format!("{e:#}").contains("refusing to send a token"),
            }
        };
        for to in [
            "http://127.0.0.1:1",
            "http://127.3.4.5:1",
            "http://localhost:1",
            "http://LOCALHOST:1",
            "http://[::1]:1",
        ] {
            assert!(
                !refused(to),
                "{to}: a token to a loopback address was refused"
            );
        }
        for to in [
            "http://10.0.0.1:1",
            "http://192.0.2.1:1",
            "http://hl7gw-egress:1",
            "http://localhost.example.org:1",
            "http://127.0.0.1.nip.io:1",
            "http://[::ffff:10.0.0.1]:1",
            "http://0.0.0.0:1",
        ] {
            assert!(
                refused(to),
                "{to}: a token over plaintext to another machine"
            );
        }
    }
}
